"""Where the store lives, how it connects, and its transactions.

- ``resolve_url``: a SQLAlchemy URL from a URL, a file path, or nothing (``FLASHTUNE_DB``,
  else ``<user data dir>/flashtune/tuned.db``).
- ``create_store_engine``: an engine; on SQLite every connection gets a busy timeout
  and foreign keys, and flashtune emits BEGIN itself (IMMEDIATE for writes), so two
  writers queue on the lock instead of failing half-way. ``lock_timeout_s`` bounds how
  long a reader that must not stall (the dispatcher at model start-up) waits for a lock,
  on both engines; ``read_only`` opens a SQLite file that cannot be written (a store
  baked into a container image) with ``mode=ro`` (and ``immutable=1`` where its
  directory cannot be written either, so no WAL index can be made; a private copy where
  it also has a WAL file, whose rows ``immutable`` would leave out).
- ``ensure_directory``: the missing directories of a SQLite file, made where a store is
  created at the default location or by ``flashtune db upgrade`` (never by what only
  reads a store; a path given to a search must exist, so a typo makes no directories).
- ``use_wal``: WAL mode for a SQLite file once it is known to be a flashtune store.
- ``transaction``: one session, one transaction; commits, rolls back and closes, and
  turns driver errors into ``StoreError`` with the cause chained.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from flashtune.store.errors import StoreError

ENV_VAR = "FLASHTUNE_DB"
BUSY_TIMEOUT_MS = 30_000
# how long opening a store retries switching it to WAL while another process does the same
WAL_SWITCH_S = 5.0
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
_WRITE = "flashtune_write"  # execution option: this transaction writes

# Driver messages that deserve a remedy, and the remedy.
_HINTS = {
    "file is not a database": "the file is not a SQLite database or it is corrupt; restore it from a backup "
    f"or point {ENV_VAR} / --db at another file",
    "database disk image is malformed": "the database file is corrupt; restore it from a backup "
    f"or point {ENV_VAR} / --db at another file",
    "unable to open database file": "cannot open the file: check that its directory exists and is writable",
    "readonly database": "the database is read-only: check the file's and its directory's permissions",
    # SQLite's word for a write refused by a full disk where it cannot grow the WAL index, or by a
    # file size limit (where a full disk hit at a page write says "database or disk is full")
    "disk I/O error": "a read or write of the file failed: check that its disk is not full, no file size limit "
    "is reached and the disk is healthy",
    "database is locked": "another process held the database lock for longer than the busy timeout",
    "lock timeout": "another connection holds a lock on the store's tables (a migration or a long transaction)",
    "statement timeout": "the database did not answer in time",
}


def default_path() -> Path:
    """``<user data dir>/flashtune/tuned.db`` (platformdirs)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("flashtune", appauthor=False)) / "tuned.db"


def resolve_url(url: str | os.PathLike | sa.URL | None = None) -> sa.URL:
    """The store's URL from a SQLAlchemy URL, a file path (SQLite), or None (the default).

    None means ``FLASHTUNE_DB`` (a path or a URL) if set, else ``default_path()`` (its
    directory is made by ``ensure_directory`` when a store is created, never here, so
    reading commands leave the disk as it was). ``postgresql://`` means psycopg 3
    (``postgresql+psycopg://``), the driver of flashtune's ``postgres`` extra.
    """
    if url is None:
        url = os.environ.get(ENV_VAR)
    if not url:
        url = default_path()
    if not isinstance(url, (str, os.PathLike, sa.URL)):
        raise StoreError(f"not a database URL or a file path: {url!r} ({type(url).__name__}); give a file path "
                         "or a URL such as sqlite:///PATH")
    if isinstance(url, sa.URL):
        parsed = url
    elif isinstance(url, os.PathLike) or "://" not in url:
        parsed = sa.URL.create("sqlite", database=str(Path(url).expanduser().absolute()))
    else:
        try:
            parsed = sa.make_url(url)
        except sa.exc.ArgumentError as e:
            raise StoreError(f"not a database URL: {url!r}; give a file path or a URL such as sqlite:///PATH") from e
        except ValueError as e:  # SQLAlchemy's int() of the port
            raise _bad_port(_port_text(url), _hide_password(url)) from e
        if parsed.port is not None and not 1 <= parsed.port <= 65535:
            raise _bad_port(str(parsed.port), show_url(parsed))
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise StoreError(
            f"unsupported database URL scheme {parsed.drivername!r} in {show_url(parsed)!r}: the store takes a file "
            "path, sqlite:///PATH or postgresql+psycopg://USER@HOST/DATABASE"
        )
    return parsed


def _bad_port(port: str | None, shown: str) -> StoreError:
    return StoreError(f"port: expected a number from 1 to 65535 in the database URL {shown!r}, got {port!r}")


def _port_text(url: str) -> str | None:
    """The port as written in a URL string (None where it has none)."""
    from urllib.parse import urlsplit

    host = urlsplit(url).netloc.rpartition("@")[2]
    if host.startswith("["):  # an IPv6 address: [::1]:5432
        host = host.partition("]")[2]
    return host.rpartition(":")[2] if ":" in host else None


def _hide_password(url: str) -> str:
    """A URL string as messages show it: its password, if any, as ``***`` (as show_url)."""
    import re

    return re.sub(r"^([^:/]+://[^:/@]*):[^@/]*@", r"\1:***@", url)


def show_url(url: sa.URL) -> str:
    """The URL as it may appear in messages (password hidden)."""
    return url.render_as_string(hide_password=True)


def sqlite_path(url: sa.URL) -> Path | None:
    """The file of a SQLite URL; None for other backends and in-memory databases."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def ensure_directory(url: sa.URL) -> None:
    """Make the missing directories of a SQLite store's file (a store is about to be created)."""
    path = sqlite_path(url)
    if path is None or path.parent.is_dir():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot create the store's directory {path.parent}: {e.strerror or e}; set {ENV_VAR} "
                         "(or --db) to a writable path or a database URL") from e


def cannot_write(url: sa.URL) -> bool:
    """Whether a SQLite store's file exists but this process cannot write it or its directory."""
    path = sqlite_path(url)
    if path is None or not path.is_file():
        return False
    return not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


# SQLite's URI parameters: given in a store URL (sqlite:///PATH?mode=ro), they reach
# SQLite only through a file: URI opened with uri=true.
_URI_PARAMS = ("mode", "immutable", "cache", "nolock", "psow", "vfs", "modeof")


def asks_read_only(url: sa.URL) -> bool:
    """Whether a SQLite URL asks for a read-only store (``?mode=ro`` or ``?immutable=1``)."""
    return url.query.get("mode") == "ro" or url.query.get("immutable") == "1"


def _sqlite_uri_url(url: sa.URL, read_only: bool) -> tuple[sa.URL, Path | None]:
    """The file: URI form of a SQLite URL, with its URI parameters, and the private copy it
    opens (None: the file itself). Read-only adds ``mode=ro``; where the directory cannot be
    written, where there is no WAL file also ``immutable=1`` (the WAL index, ``-shm``, cannot
    be made there, so SQLite could not open the file otherwise), and where there is a WAL file
    but no WAL index the store and its WAL are read from a private copy: ``immutable`` would
    leave out the rows the WAL holds, and SQLite opens no WAL without its index. (A WAL
    without an index has no process attached: every open WAL connection keeps the index.)"""
    from urllib.parse import quote

    path = sqlite_path(url)
    query = {name: value for name, value in url.query.items() if name in _URI_PARAMS}
    copy = None
    if read_only:
        query["mode"] = "ro"
        if not os.access(path.parent, os.W_OK):
            wal, index = Path(f"{path}-wal"), Path(f"{path}-shm")
            if not wal.exists():
                query["immutable"] = "1"
            elif not index.exists():
                copy = _private_copy(path, wal)
    target = copy / path.name if copy is not None else path
    return sa.URL.create("sqlite", database=f"file:{quote(str(target))}", query={**query, "uri": "true"}), copy


def _private_copy(path: Path, wal: Path) -> Path:
    """A new temporary directory holding copies of the store ``path`` and its WAL file."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="flashtune-store-"))
    try:
        shutil.copyfile(path, folder / path.name)
        shutil.copyfile(wal, folder / wal.name)
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise StoreError(f"cannot read the store {path} with its WAL file: {e.strerror or e}") from e
    return folder


def create_store_engine(url: sa.URL, *, lock_timeout_s: float | None = None, read_only: bool = False) -> sa.Engine:
    """An engine for the store; SQLite connections are configured as the module says.

    ``lock_timeout_s``: the longest a statement waits for a lock (SQLite's busy timeout,
    PostgreSQL's lock_timeout; PostgreSQL also gets a statement_timeout of a few times
    that and a connect timeout), default ``BUSY_TIMEOUT_MS`` on SQLite and none on
    PostgreSQL. ``read_only``: a SQLite file opened without writing (see the module)."""
    _check_regular_file(url)
    uri_params = any(name in url.query for name in _URI_PARAMS) and "uri" not in url.query
    target, copy = url, None
    if sqlite_path(url) is not None and (read_only or uri_params):
        target, copy = _sqlite_uri_url(url, read_only)
    connect_args = {}
    if lock_timeout_s is not None and url.get_backend_name() == "postgresql" and "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = max(1, math.ceil(lock_timeout_s))
    try:
        engine = sa.create_engine(target, connect_args=connect_args)
    except (ImportError, sa.exc.ArgumentError) as e:
        raise StoreError(f"cannot use {show_url(url)}: {e}") from e
    if copy is not None:  # the private copy goes with the engine
        import shutil
        import weakref

        weakref.finalize(engine, shutil.rmtree, copy, True)
    if url.get_backend_name() == "sqlite":
        busy_ms = None if lock_timeout_s is None else max(1, int(lock_timeout_s * 1000))
        sa.event.listen(engine, "connect", functools.partial(_configure_sqlite_connection, busy_ms=busy_ms))
        sa.event.listen(engine, "begin", _begin_sqlite_transaction)
    elif lock_timeout_s is not None:
        sa.event.listen(engine, "connect", functools.partial(_configure_postgresql_timeouts,
                                                             lock_ms=max(1, int(lock_timeout_s * 1000))))
    return engine


def _check_regular_file(url: sa.URL) -> None:
    """A SQLite store's path that exists must be a regular file (through any symlinks): SQLite
    would read a FIFO's nothing as an I/O error, and take a device that reads zeros (/dev/zero,
    a blank disk) for an empty database and write a store's tables to it."""
    import stat

    path = sqlite_path(url)
    try:
        mode = path.stat().st_mode if path is not None else None
    except OSError:  # missing (a store to create) or unreadable: SQLite says which
        return
    if mode is None or stat.S_ISREG(mode):
        return
    kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
             (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))
    kind = next((name for test, name in kinds if test(mode)), "special file")
    raise StoreError(f"the store {path} is a {kind}, not a SQLite file: point {ENV_VAR} or --db at a file "
                     "(a new path makes a new store)")


def _configure_sqlite_connection(dbapi_connection, _record, busy_ms: int | None = None) -> None:
    # The driver would open transactions lazily and only before DML; we emit BEGIN
    # ourselves (see _begin_sqlite_transaction), so DDL is transactional too.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS if busy_ms is None else busy_ms}")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _configure_postgresql_timeouts(dbapi_connection, _record, lock_ms: int) -> None:
    # A migration's ACCESS EXCLUSIVE lock would block a read for as long as it runs.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"SET lock_timeout = {lock_ms}")
        cursor.execute(f"SET statement_timeout = {4 * lock_ms}")
    finally:
        cursor.close()
    dbapi_connection.commit()  # session settings outlive the transaction they were set in


def use_wal(engine: sa.Engine) -> None:
    """Put a SQLite store in WAL mode (readers never wait for the writer).

    journal_mode is stored in the file, so this runs once the file is known to be a
    flashtune store: opening some other SQLite file by mistake leaves it as it was."""
    if engine.dialect.name != "sqlite":
        return
    deadline = time.monotonic() + WAL_SWITCH_S
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        while cursor.execute("PRAGMA journal_mode").fetchone()[0] not in ("wal", "memory"):
            try:
                cursor.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as e:
                # Another process opening the new store switches it at the same moment:
                # SQLite refuses one of the two at once ("database is locked") rather than
                # deadlock. Look again (the other one may have switched it); past the
                # deadline leave it: the store works without WAL, and the next open switches it.
                if "locked" not in str(e):
                    raise
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        cursor.close()
    finally:
        raw.close()


def _begin_sqlite_transaction(connection: sa.Connection) -> None:
    # A write takes the lock at BEGIN: two writers then wait for each other (busy
    # timeout) rather than one failing when it upgrades a read lock mid-transaction.
    write = connection.get_execution_options().get(_WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def write_engine(engine: sa.Engine) -> sa.Engine:
    """The same engine, for transactions that write."""
    return engine.execution_options(**{_WRITE: True})


def describe_error(error: BaseException) -> str:
    """The driver's message, with a remedy where one is known."""
    cause = getattr(error, "orig", None) or error
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    hint = next((h for needle, h in _HINTS.items() if needle in text), None)
    return f"{text} ({hint})" if hint else text


@contextlib.contextmanager
def wrap_errors(action: str) -> Iterator[None]:
    """Turn database errors raised inside into ``StoreError("<action>: <reason>")``."""
    try:
        yield
    except (sa.exc.SQLAlchemyError, sqlite3.Error) as e:
        raise StoreError(f"{action}: {describe_error(e)}") from e


@contextlib.contextmanager
def transaction(engine: sa.Engine, action: str, *, write: bool = False) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on any error.

    ``action`` names the operation in error messages ("save result fwd ... on H200").
    """
    with wrap_errors(action), Session(write_engine(engine) if write else engine) as session, session.begin():
        yield session


def upsert_insert(session: Session, table: sa.Table):
    """INSERT with ON CONFLICT support: the dialect's own construct."""
    dialect = session.get_bind().dialect.name
    return (sqlite if dialect == "sqlite" else postgresql).insert(table)
