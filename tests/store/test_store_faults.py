"""Fault injection on the store (issue 17): a read-only directory, a lock held by another
process (SQLite) or connection (PostgreSQL), a damaged row. The dispatcher answers
within 2 s with its warning (or, read-only, without one), and the CLI names the cause."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import time
import warnings

import pytest
import sqlalchemy as sa
from store_samples import key, result

from flashtune.keys import GpuInfo
from flashtune.store import Store, StoreError

HERE = GpuInfo.from_device(None)  # the dispatcher's GPU here: the interpreter's without CUDA


@pytest.fixture(autouse=True)
def _fresh_dispatcher(monkeypatch):
    import torch  # noqa: F401  (TRITON_INTERPRET is set by tests/conftest.py)

    from flashtune import dispatch

    monkeypatch.setattr(dispatch, "_TABLES", {})
    monkeypatch.setattr(dispatch, "_WARNED", set())


def _served(url) -> tuple[list[str], float, str]:
    """(the dispatcher's warnings, seconds to answer, the forward source of a call)."""
    import torch

    from flashtune import get_tuned_attention
    from flashtune.dispatch import DispatchWarning

    q = torch.randn(1, 2, 16, 16)  # the interpreter demo shape: batch x heads of its grid keys
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = get_tuned_attention(url, device="cpu")
        source = fn.explain(q, q, q).fwd_source
    return [str(w.message) for w in record if issubclass(w.category, DispatchWarning)], \
        time.monotonic() - started, source


def _fill(url) -> None:
    """Two results of this machine's GPU (16 fwd, 32 fwd; float32 d16 full), tuned by this flashtune."""
    from flashtune.provenance import current_provenance

    with Store(url) as store:
        for n in (16, 32):
            tuned = result(key(n, gpu=HERE, dtype="float32", head_dim=16, causal=False), gpu=HERE)
            store.save_result(dataclasses.replace(tuned, provenance=dataclasses.replace(
                current_provenance(), gpu_name=HERE.name, sm_count=HERE.sm_count, capability="0.0")))


def _cli(*args):
    from click.testing import CliRunner

    from flashtune.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="flashtune")


# -- a read-only directory (a store baked into a container image) ---------------------------

@contextlib.contextmanager
def _read_only_directory(path):
    """No file can be created in ``path`` (root ignores permissions: the immutable flag)."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("running as root where chattr +i is not available")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)


def test_a_wal_store_in_a_read_only_directory_is_read(tmp_path):
    folder = tmp_path / "image"
    folder.mkdir()
    db = folder / "tuned.db"
    _fill(db)
    with contextlib.closing(sqlite3.connect(db)) as connection:  # closed: an open one keeps -wal and -shm there
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    before = sorted(p.name for p in folder.iterdir())
    assert before == ["tuned.db"]  # as baked into an image: no WAL index that a reader could use
    with _read_only_directory(folder):
        messages, seconds, source = _served(db)
        listed = _cli("list", "--db", db, "--csv")
        info = _cli("info", "--db", db, "--json")
    # on 3a7812e: "cannot read tuned configs ... unable to open database file", heuristic configs
    assert (messages, source) == ([], "tuned exact") and seconds < 2
    assert listed.exit_code == 0, listed.output
    assert [line.split(",")[3] for line in listed.stdout.splitlines()] == ["seq_q", "16", "32"]
    assert info.exit_code == 0 and '"tuned_results": 2' in info.stdout, info.output
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_read_only_wal_store_with_its_wal_file_but_no_index_serves_every_row(tmp_path):
    """A store copied into an image while a connection had rows in its WAL file: the WAL
    (``-wal``) came along, the index (``-shm``) did not. Every row is served, the WAL's too."""
    import shutil

    source, folder = tmp_path / "source", tmp_path / "image"
    source.mkdir(), folder.mkdir()
    db = source / "tuned.db"
    _fill(db)
    with contextlib.closing(sqlite3.connect(db)) as reader:  # open: the WAL is not folded back
        reader.execute("PRAGMA wal_autocheckpoint = 0")
        reader.execute("SELECT count(*) FROM flashtune_tuned_results").fetchone()
        with reader:
            reader.execute("UPDATE flashtune_tuned_results SET time_ms = 0.125 WHERE seq_q = 32")
        shutil.copyfile(db, folder / "tuned.db")
        shutil.copyfile(f"{db}-wal", folder / "tuned.db-wal")
    baked = folder / "tuned.db"
    before = sorted(p.name for p in folder.iterdir())
    assert before == ["tuned.db", "tuned.db-wal"]
    with _read_only_directory(folder):
        messages, seconds, source_of_call = _served(baked)
        listed = _cli("list", "--db", baked, "--json")
    # before: "unable to open database file" and the heuristic configs
    assert (messages, source_of_call) == ([], "tuned exact") and seconds < 2
    assert listed.exit_code == 0, listed.output
    times = {row["seq_q"]: row["time_ms"] for row in json.loads(listed.stdout)}
    assert times[32] == 0.125  # the row the WAL holds, not the main file's
    assert sorted(p.name for p in folder.iterdir()) == before


@pytest.mark.parametrize("kind", ["directory", "FIFO", "character device"])
def test_a_store_path_that_is_no_regular_file_is_refused_before_sqlite_opens_it(kind, tmp_path):
    """Was: a FIFO "disk I/O error"; a link to /dev/zero taken for an empty database, its
    tables written to the device ("upgrade ...: disk I/O error")."""
    path = tmp_path / "tuned.db"
    if kind == "directory":
        path.mkdir()
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    message = f"the store {path} is a {kind}, not a SQLite file: point FLASHTUNE_DB or --db at a file"
    for create in (False, True):
        with pytest.raises(StoreError) as refused:
            Store(path, create=create)
        assert str(refused.value).startswith(message)
    messages, seconds, source = _served(path)
    assert source == "heuristic" and seconds < 2 and len(messages) == 1 and message in messages[0]
    done = _cli("search", "--interpreter", "--db", path, "--trials", "1", "--seq-len", "16")
    assert done.exit_code == 1 and done.output.endswith(f"Error: {message} (a new path makes a new store)\n")


# -- a full disk ----------------------------------------------------------------------------

def test_a_revalidation_on_a_full_disk_says_so_in_one_line_and_leaves_the_store(tmp_path):
    """A file size limit (RLIMIT_FSIZE) makes SQLite's writes fail as a full disk does where it
    cannot grow the WAL index: "disk I/O error", which alone names no cause."""
    import resource

    db = tmp_path / "tuned.db"
    _fill(db)
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:  # stale: revalidate has work
        connection.execute("UPDATE flashtune_tuned_results SET kernel_hash = '00000000deadbeef'")
    before = db.read_bytes()

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    done = subprocess.run([sys.executable, "-m", "flashtune", "revalidate", "--interpreter", "--no-progress",
                           "--db", str(db)], capture_output=True, text=True, timeout=120, preexec_fn=limited,
                          env=dict(os.environ, TRITON_INTERPRET="1"))
    assert done.returncode == 1, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert error.endswith("disk I/O error (a read or write of the file failed: check that its disk is not full, "
                          "no file size limit is reached and the disk is healthy)"), done.stderr
    assert "Traceback" not in done.stderr
    assert db.read_bytes() == before


# -- a lock held by another process ---------------------------------------------------------

_HOLD_SQLITE = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA locking_mode = EXCLUSIVE")  # in WAL mode, the one way to keep readers out
c.execute("BEGIN EXCLUSIVE")
c.execute("DELETE FROM flashtune_trials")
print("locked", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _lock_held(db_url):
    if db_url.startswith("sqlite"):
        path = sa.make_url(db_url).database
        holder = subprocess.Popen([sys.executable, "-c", _HOLD_SQLITE, path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked"
            yield f"pid {holder.pid}"
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
        return
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as connection:
            pid = connection.execute(sa.text("SELECT pg_backend_pid()")).scalar()
            connection.execute(sa.text("LOCK TABLE flashtune_tuned_results IN ACCESS EXCLUSIVE MODE"))
            yield f"PostgreSQL session pid {pid} (AccessExclusiveLock"
            connection.rollback()
    finally:
        engine.dispose()


def test_a_lock_held_elsewhere_costs_the_dispatcher_at_most_a_second(db_url, monkeypatch):
    from flashtune.cli import _common

    _fill(db_url)
    monkeypatch.setattr(_common, "LOCK_TIMEOUT_S", 0.5)  # the CLI's own (10 s), shortened here
    with _lock_held(db_url) as holder:
        messages, seconds, source = _served(db_url)
        listed = _cli("list", "--db", db_url)
    # on 3a7812e: 30 s on SQLite, no answer at all on PostgreSQL
    assert seconds < 2 and source == "heuristic"
    [message] = messages
    assert message.startswith(f"flashtune cannot read tuned configs from {sa.make_url(db_url).render_as_string()}")
    assert ("database is locked" if db_url.startswith("sqlite") else "lock timeout") in message
    assert holder in message and message.endswith("; using the shipped table or the heuristic default configs")
    assert listed.exit_code == 1 and listed.stdout == ""
    cause = "database is locked" if db_url.startswith("sqlite") else "canceling statement due to lock timeout"
    assert listed.stderr.startswith("Error: ") and cause in listed.stderr
    assert f"the lock is held by {holder}" in listed.stderr
    assert _served(db_url)[2] in ("heuristic", "tuned exact")  # nothing cached from the failed read


# -- a damaged row --------------------------------------------------------------------------

def test_a_damaged_row_is_skipped_and_named_and_the_rest_served(db_url):
    _fill(db_url)
    engine = sa.create_engine(db_url)
    damaged = '{"BLOCK_M": 16, "BLOCK_N" 16}' if db_url.startswith("sqlite") else '{"BLOCK_M": "sixteen"}'
    with engine.begin() as connection:  # PostgreSQL's JSON type refuses text that is not JSON
        row = connection.execute(sa.text("SELECT id FROM flashtune_tuned_results WHERE seq_q = 32")).scalar()
        connection.execute(sa.text("UPDATE flashtune_tuned_results SET config = :c WHERE id = :i"),
                           {"c": damaged, "i": row})
    engine.dispose()
    messages, seconds, source = _served(db_url)
    # on 3a7812e: the whole table dropped ("Expecting ':' delimiter"), heuristic configs
    assert source == "tuned exact" and seconds < 2
    [message] = messages
    assert message.startswith(f"flashtune skips a damaged row in {sa.make_url(db_url).render_as_string()}: "
                              f"tuned result #{row} (fwd float32 d16 n32 full on {HERE.key}) has ")
    listed = _cli("list", "--db", db_url, "--csv")
    assert listed.exit_code == 0, listed.output
    assert [line.split(",")[3] for line in listed.stdout.splitlines()] == ["seq_q", "16"]
    assert listed.stderr.startswith(f"warning: skipped tuned result #{row} (fwd float32 d16 n32 full on {HERE.key})")
    assert "`flashtune delete`" in listed.stderr


def test_a_stored_value_that_would_break_output_is_a_damaged_row(db_url):
    """A row written before the bounds (or around the store) whose speed-up overflows:
    skipped and named like a damaged one, so `list --json` still prints the rest (issue 17,
    item 6: on 3a7812e, and at 08c9c77 for rows already stored, `Out of range float values
    are not JSON compliant` for the whole store)."""
    _fill(db_url)
    engine = sa.create_engine(db_url)
    with engine.begin() as connection:
        row = connection.execute(sa.text("SELECT id FROM flashtune_tuned_results WHERE seq_q = 32")).scalar()
        connection.execute(sa.text("UPDATE flashtune_tuned_results SET time_ms = 1e-6, default_time_ms = 1e308 "
                                   "WHERE id = :i"), {"i": row})
    engine.dispose()
    where = f"tuned result #{row} (fwd float32 d16 n32 full on {HERE.key})"
    because = ("holds a value flashtune cannot show or serve (default_time_ms: expected a finite number >= 1e-06 "
               "and <= 1e+07, got 1e+308); delete it with `flashtune delete` or tune that key again")
    messages, seconds, source = _served(db_url)
    assert source == "tuned exact" and seconds < 2
    assert messages == [f"flashtune skips a damaged row in {sa.make_url(db_url).render_as_string()}: {where} "
                        f"{because}"]
    listed = _cli("list", "--db", db_url, "--json")
    assert listed.exit_code == 0, listed.output
    assert [r["seq_q"] for r in json.loads(listed.stdout)] == [16]
    assert listed.stderr.startswith(f"warning: skipped {where} {because}\n")
    shown = _cli("show", "--db", db_url, "--seq-len", "16", "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["result"]["seq_q"] == 16, shown.output


def test_a_url_that_asks_for_read_only_gets_it(tmp_path):
    from flashtune.store import ResultFilter, StoreError

    db = tmp_path / "tuned.db"
    _fill(db)
    for query in ("mode=ro", "immutable=1"):
        url = f"sqlite:///{db}?{query}"
        with Store(url, create=False) as store:  # 3a7812e: the parameter was ignored, the delete went through
            assert len(store.list_results()) == 2
            with pytest.raises(StoreError, match="readonly database"):
                store.delete_results(ResultFilter())
        assert _served(url)[::2] == ([], "tuned exact")


# -- a torn Optuna journal next to the store ------------------------------------------------

def test_a_torn_journal_next_to_the_store_costs_the_dispatcher_and_list_nothing(tmp_path):
    """The journal is the search's alone (tests/autotuner/test_storage_faults.py repairs it
    and the search names it): the dispatcher and the reading commands never open it."""
    db = tmp_path / "tuned.db"
    _fill(db)
    journal = tmp_path / "optuna-journal.log"
    journal.write_bytes(b'{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}\n{"op_code": 4, "wor')
    torn = journal.read_bytes()
    messages, seconds, source = _served(db)
    assert (messages, source) == ([], "tuned exact") and seconds < 2
    listed = _cli("list", "--db", db, "--csv")
    assert (listed.exit_code, listed.stderr) == (0, "")
    assert [line.split(",")[3] for line in listed.stdout.splitlines()] == ["seq_q", "16", "32"]
    assert journal.read_bytes() == torn and sorted(p.name for p in tmp_path.iterdir()) == [
        "optuna-journal.log", "tuned.db"]
