"""Where the store lives, how SQLite connections are set up, and bad input: each gives a
clear StoreError and leaves the database as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from store_samples import H200, config_for, key, provenance, result

from flashtune.outcome import Outcome
from flashtune.store import NoStoreError, Store, StoreError, current_revision, head_revision, resolve_url, upgrade
from flashtune.store import engine as store_engine
from flashtune.store.engine import create_store_engine, transaction

# -- locations ------------------------------------------------------------------------------


def test_default_location_is_the_user_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHTUNE_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "flashtune" / "tuned.db"
    assert resolve_url(None).database == str(expected)
    with Store() as store:
        store.save_result(result(key()))
    assert expected.is_file() and current_revision(expected) == head_revision()


def test_an_unusable_default_location_says_to_set_flashtune_db(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHTUNE_DB")
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "a-file" / "data"))
    with pytest.raises(StoreError, match="cannot create the store's directory .*set FLASHTUNE_DB"):
        Store()


def test_flashtune_db_takes_a_path_or_a_url(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTUNE_DB", str(tmp_path / "from-env.db"))
    with Store() as store:
        store.upsert_gpu(H200)
    assert (tmp_path / "from-env.db").is_file()
    monkeypatch.setenv("FLASHTUNE_DB", f"sqlite:///{tmp_path / 'from-url.db'}")
    assert resolve_url(None).database == str(tmp_path / "from-url.db")


def test_plain_postgresql_urls_use_psycopg():
    assert resolve_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert resolve_url("postgresql+psycopg://u@h/db").drivername == "postgresql+psycopg"


def test_a_percent_sign_in_the_path_survives_alembic(tmp_path):
    folder = tmp_path / "100%done"
    folder.mkdir()
    assert upgrade(folder / "new.db") == head_revision()
    assert current_revision(folder / "new.db") == head_revision()


# -- SQLite connections ---------------------------------------------------------------------


def test_sqlite_connections_get_foreign_keys_and_busy_timeout_and_stores_wal(tmp_path):
    engine = create_store_engine(resolve_url(tmp_path / "x.db"))
    with engine.connect() as connection:
        values = [connection.exec_driver_sql(f"PRAGMA {name}").scalar() for name in ("foreign_keys", "busy_timeout")]
        assert values == [1, store_engine.BUSY_TIMEOUT_MS]
    engine.dispose()
    Store(tmp_path / "opened.db").close()  # a new store, created on open
    upgrade(tmp_path / "upgraded.db")  # a new store, created by `flashtune db upgrade`
    for path in (tmp_path / "opened.db", tmp_path / "upgraded.db"):
        with sqlite3.connect(path) as connection:
            assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


class _RacedEngine:
    """Stands in for a SQLite engine in use_wal(): its switch to WAL fails with ``error``
    the first ``times`` times, as when another process opening the new store switches it at
    the same moment."""

    dialect = type("Dialect", (), {"name": "sqlite"})()

    def __init__(self, path, times, error="database is locked"):
        self.path, self.times, self.error = path, times, error

    def raw_connection(self):
        raw, engine = sqlite3.connect(self.path, isolation_level=None), self

        class Cursor:
            def __init__(self):
                self.real = raw.cursor()

            def execute(self, sql, *args):
                if sql.replace(" ", "") == "PRAGMAjournal_mode=WAL" and engine.times > 0:
                    engine.times -= 1
                    raise sqlite3.OperationalError(engine.error)
                return self.real.execute(sql, *args)

            def close(self):
                self.real.close()

        class Connection:
            def cursor(self):
                return Cursor()

            def close(self):
                raw.close()

        return Connection()


def _journal_mode(path) -> str:
    with sqlite3.connect(path) as connection:
        return connection.execute("PRAGMA journal_mode").fetchone()[0]


@pytest.mark.parametrize("times, expected", [(2, "wal"), (10**6, "delete")], ids=["briefly", "for good"])
def test_a_store_opens_while_another_process_switches_it_to_wal(tmp_path, monkeypatch, times, expected):
    """Two processes opening a new store at once both switch it to WAL, and SQLite refuses
    one of them at once. The switch is retried briefly; if it still fails the store stays in
    its rollback journal (it works either way) and the next open switches it."""
    path = tmp_path / "t.db"
    Store(path).close()
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA journal_mode = DELETE")
    monkeypatch.setattr(store_engine, "WAL_SWITCH_S", 0.3)
    store_engine.use_wal(_RacedEngine(path, times))  # no error either way
    assert _journal_mode(path) == expected
    with Store(path) as store:
        store.save_result(result(key()))
    assert _journal_mode(path) == "wal"


def test_other_errors_of_the_wal_switch_are_raised(tmp_path):
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE t (x)")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        store_engine.use_wal(_RacedEngine(path, 1, "disk I/O error"))


def test_a_foreign_sqlite_file_keeps_its_journal_mode(tmp_path):
    """Pointing flashtune at some other SQLite database by mistake changes nothing in it."""
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="holds no flashtune store"):
        Store(path, create=False)
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert path.read_bytes() == before


def test_an_empty_database_is_no_store_yet_and_stays_empty(tmp_path):
    """Opened to read, an empty SQLite file is no store (yet), not another program's database."""
    path = tmp_path / "new.db"
    path.touch()
    with pytest.raises(NoStoreError, match="no flashtune store at .* yet: the database is empty"):
        Store(path, create=False)
    assert path.read_bytes() == b""
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    with pytest.raises(StoreError, match="holds no flashtune store") as raised:
        Store(path, create=False)
    assert not isinstance(raised.value, NoStoreError)


def test_sqlite_writes_take_the_lock_at_begin_and_reads_do_not(tmp_path):
    path = tmp_path / "x.db"
    Store(path).close()
    engine = create_store_engine(resolve_url(path))
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with transaction(engine, "read") as session:
        session.execute(sa.text("SELECT count(*) FROM flashtune_gpus"))
        other.execute("BEGIN IMMEDIATE")  # a reader does not block a writer
        other.execute("ROLLBACK")
    with transaction(engine, "write", write=True) as session:
        session.execute(sa.text("SELECT count(*) FROM flashtune_gpus"))  # no write yet, the lock is taken
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    other.close()
    engine.dispose()


def test_driver_errors_become_store_errors_with_the_cause(tmp_path, monkeypatch):
    path = tmp_path / "x.db"
    with Store(path) as store:
        store.upsert_gpu(H200)
    monkeypatch.setattr(store_engine, "BUSY_TIMEOUT_MS", 50)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Store(path) as store:
            with pytest.raises(StoreError, match=r"record a trial of fwd bfloat16 d64 n1024 causal on "
                                                 r"NVIDIA H200@sm90: database is locked") as caught:
                store.record_trial(key(), config_for("fwd"), Outcome("ok", time_ms=1.0), provenance=provenance())
            assert isinstance(caught.value.__cause__, sa.exc.OperationalError)
    finally:
        holder.close()


# -- bad input --------------------------------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _corrupt_copy(tmp_path: Path) -> Path:
    path = tmp_path / "corrupt.db"
    with Store(path) as store:
        store.import_results(result(key(n)) for n in (256, 512, 1024))
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xa5" * (len(data) - 4096)  # every page after the first
    path.write_bytes(bytes(data))
    return path


def _text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    return path


@pytest.mark.parametrize("make, reason", [(_corrupt_copy, "malformed"), (_text_file, "not a database")])
def test_a_corrupt_or_foreign_file_is_refused_and_left_alone(tmp_path, make, reason):
    path = make(tmp_path)
    before = _digest(path)
    with pytest.raises(StoreError, match=rf"{reason} \(.*restore it from a backup"):
        Store(path)
    with pytest.raises(StoreError, match=reason):
        upgrade(path)
    assert _digest(path) == before


def test_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(StoreError, match="check that its directory exists"):
        Store(tmp_path / "no" / "such" / "dir" / "tuned.db")
    assert not (tmp_path / "no").exists()


def test_create_false_refuses_a_missing_store(tmp_path):
    with pytest.raises(StoreError, match="no flashtune store"):
        Store(tmp_path / "absent.db", create=False)
    assert not (tmp_path / "absent.db").exists()


@pytest.mark.parametrize("url", ["foo://bar/baz", "mysql://root@localhost/test"])
def test_an_unknown_url_scheme_is_refused(url):
    with pytest.raises(StoreError, match=r"unsupported database URL scheme '(foo|mysql)'.*sqlite:///PATH"):
        Store(url)


@pytest.mark.postgres
def test_a_missing_postgresql_database_is_refused(postgres_server):
    url = postgres_server.url.set(database="flashtune_no_such_database")
    with pytest.raises(StoreError, match='database "flashtune_no_such_database" does not exist'):
        Store(url)


def _in_unprivileged_child(action) -> str:
    """Run ``action()`` in a forked child that cannot write where its parent made the
    directory read-only (as root, the child drops to nobody); return what it reports."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            report = action()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            report = f"{type(e).__name__}: {e}"
        os.write(write_end, report.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read().decode()
    os.waitpid(pid, 0)
    return report


@pytest.fixture
def read_only_dir():
    # Not under tmp_path: pytest's base directory is private to its owner, and the
    # unprivileged child must be able to look inside.
    folder = Path(tempfile.mkdtemp(prefix="flashtune-ro-"))
    yield folder
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)
    shutil.rmtree(folder)


def test_a_read_only_directory_is_refused(read_only_dir):
    read_only_dir.chmod(0o555)
    report = _in_unprivileged_child(lambda: repr(Store(read_only_dir / "tuned.db")))
    assert report.startswith("StoreError: open the store at sqlite:///") and "writable" in report, report
    assert list(read_only_dir.iterdir()) == []


def test_a_read_only_store_refuses_writes_and_stays_as_it_was(read_only_dir):
    path = read_only_dir / "tuned.db"
    with Store(path) as store:
        store.save_result(result(key(512)))
    path.chmod(0o444)
    read_only_dir.chmod(0o555)
    before = _digest(path)

    def write() -> str:
        with Store(path) as store:
            store.save_result(result(key(1024)))
        return "saved"

    report = _in_unprivileged_child(write)
    assert report.startswith("StoreError: ") and "read-only" in report, report
    assert _digest(path) == before
    read_only_dir.chmod(0o755)
    path.chmod(0o644)
    with Store(path) as store:
        assert [r.key for r in store.list_results()] == [key(512)]
