"""Who holds the lock a store's reader timed out on: named in the error, so a user
knows what to wait for or stop (a migration, a long transaction, another process).

Best effort: PostgreSQL says which sessions hold locks on the store's tables
(``pg_locks``); for a SQLite file, the processes that have it open (Linux ``/proc``).
"""

from __future__ import annotations

import os
from pathlib import Path

import sqlalchemy as sa

from flashtune.store.engine import sqlite_path

_TABLES = ("flashtune_tuned_results", "flashtune_trials", "flashtune_gpus", "flashtune_alembic_version")


def is_lock_error(error: BaseException | None) -> bool:
    """Whether a driver error is a lock (or busy) timeout."""
    text = str(getattr(error, "orig", None) or error or "")
    return any(needle in text for needle in ("database is locked", "lock timeout", "statement timeout"))


def lock_holders(url: sa.URL) -> str:
    """"held by ..." naming the sessions or processes holding the store, or ""."""
    try:
        holders = _sqlite_holders(url) if sqlite_path(url) is not None else _postgresql_holders(url)
    except Exception:  # noqa: BLE001 - a hint, never a second failure
        return ""
    return f"held by {'; '.join(holders)}" if holders else ""


def _sqlite_holders(url: sa.URL) -> list[str]:
    path = sqlite_path(url).resolve()
    names = {str(path), f"{path}-wal", f"{path}-journal"}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            opened = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
            if opened & names:
                command = " ".join((entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split())
                found.append(f"pid {entry.name} ({command[:80]})")
        except OSError:
            continue
    return found


def _postgresql_holders(url: sa.URL) -> list[str]:
    engine = sa.create_engine(url, connect_args={"connect_timeout": 2})
    query = sa.text(
        "SELECT a.pid, l.mode, a.state, a.application_name, left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', "
        "'g'), 80) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.granted AND l.relation = ANY(:tables) AND a.pid <> pg_backend_pid() ORDER BY a.pid")
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SET statement_timeout = 2000"))
            oids = [connection.execute(sa.text("SELECT to_regclass(:t)::oid"), {"t": t}).scalar() for t in _TABLES]
            rows = connection.execute(query, {"tables": [o for o in oids if o is not None]}).all()
    finally:
        engine.dispose()
    seen, found = set(), []
    for pid, mode, state, app, text in rows:
        if pid in seen:
            continue
        seen.add(pid)
        found.append(f"PostgreSQL session pid {pid} ({mode}, {state}{', ' + app if app else ''}: {text})")
    return found
