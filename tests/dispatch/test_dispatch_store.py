"""The table behind the callable: read once, re-read on demand, and a database that
cannot be read (missing, corrupt, locked, another schema) never breaks the model."""

from __future__ import annotations

import re
import sqlite3
import warnings

import pytest
import torch
from dispatch_samples import BWD_A, FWD_A, FWD_B, qkv

from flashtune import dispatch
from flashtune.dispatch import DispatchWarning, get_tuned_attention
from flashtune.kernels import default_config
from flashtune.store import Store, StoreError


def _dispatch_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DispatchWarning)]


def _fwd_source(fn, n=16) -> str:
    return fn.explain(*qkv(n)).fwd_source


def test_calls_never_read_the_database_and_reload_sees_new_rows(write, db_path, gpu, monkeypatch):
    write(16, "fwd", FWD_A)
    fn = get_tuned_attention(db_path)
    assert _fwd_source(fn) == "tuned exact"
    write(32, "fwd", FWD_B)
    write(16, "fwd", FWD_B)  # replaces the row fn serves

    reads = []
    real_load_table = Store.load_table
    monkeypatch.setattr(Store, "load_table",
                        lambda self, gpu, **kw: (reads.append(gpu), real_load_table(self, gpu, **kw))[1])
    q, k, v = qkv(17)
    fn(q, k, v)
    assert fn.explain(*qkv(32)).fwd_source == "tuned nearest (fwd float32 d16 n16 full)"  # still the table read at creation
    assert fn.explain(q, k, v).fwd_config == FWD_A
    assert reads == []

    fn.reload()
    assert reads == [gpu.key]
    assert fn.explain(*qkv(32)).fwd_source == "tuned exact"
    assert fn.explain(q, k, v).fwd_config == FWD_B
    again = get_tuned_attention(db_path)  # a new callable reads the table again
    assert len(reads) == 2 and again.explain(q, k, v).fwd_config == FWD_B


def test_a_missing_database_warns_once_and_is_not_created(tmp_path, monkeypatch):
    db = tmp_path / "nowhere" / "tuned.db"
    # no store is no error (a fresh install): nothing tuned is what it says
    with pytest.warns(DispatchWarning, match=r"no tuned configs for .* in sqlite:///.*nowhere.*heuristic default configs"):
        fn = get_tuned_attention(db)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        get_tuned_attention(db).reload()
    assert _fwd_source(fn) == "heuristic"
    fn(*qkv(8))
    assert not (tmp_path / "nowhere").exists()
    # the default store (FLASHTUNE_DB here) is not created either, nor its directory
    with pytest.warns(DispatchWarning, match="no tuned configs for .* in sqlite:///.*default-store"):
        assert _fwd_source(get_tuned_attention()) == "heuristic"
    assert not (tmp_path / "default-store").exists()


def _garbage(path):
    path.write_bytes(b"this is not a database\n" * 100)


def _truncated_store(path):
    Store(path).close()
    path.write_bytes(path.read_bytes()[:1500])


def _foreign_sqlite(path):
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")


def _newer_schema(path):
    Store(path).close()
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE flashtune_alembic_version SET version_num = 'f00dfeedbeef'")


@pytest.mark.parametrize(("spoil", "reason"), [
    (_garbage, "file is not a database"),
    (_truncated_store, "database disk image is malformed|file is not a database"),
    (_foreign_sqlite, "holds no flashtune store"),
    (_newer_schema, "written by a newer flashtune"),
])
def test_an_unreadable_database_warns_once_and_serves_the_heuristic(db_path, spoil, reason):
    spoil(db_path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = get_tuned_attention(db_path)
        get_tuned_attention(db_path)
    assert len(_dispatch_warnings(record)) == 1
    assert _dispatch_warnings(record)[0].startswith(f"flashtune cannot read tuned configs from sqlite:///{db_path}")
    assert re.search(reason, _dispatch_warnings(record)[0])
    assert _fwd_source(fn) == "heuristic"
    fn(*qkv(8))


def test_an_empty_database_is_no_store_yet(db_path):
    """An empty file (what a search that is creating the store leaves for a moment) is served as a
    fresh install is: the no-tuned-configs warning, not an unreadable store."""
    db_path.touch()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = get_tuned_attention(db_path)
    assert [w for w in _dispatch_warnings(record) if "cannot read" in w] == []
    assert any("no tuned configs for" in w for w in _dispatch_warnings(record))
    assert _fwd_source(fn) == "heuristic"
    fn(*qkv(8))
    assert db_path.read_bytes() == b""


def test_a_garbage_file_is_left_as_it_was(db_path):
    _garbage(db_path)
    before = db_path.read_bytes()
    with pytest.warns(DispatchWarning):
        get_tuned_attention(db_path)
    assert db_path.read_bytes() == before


def test_a_database_locked_past_the_busy_timeout_warns_and_serves_the_heuristic(write, db_path, monkeypatch):
    from flashtune.store import engine

    write(16, "fwd", FWD_A)
    write.close()
    monkeypatch.setattr(engine, "BUSY_TIMEOUT_MS", 50)  # the store waits 30 s by default
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("PRAGMA journal_mode = DELETE")  # in WAL mode readers are never blocked (next test)
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.warns(DispatchWarning, match="database is locked"):
            fn = get_tuned_attention(db_path)
        assert _fwd_source(fn) == "heuristic"
        fn(*qkv(8))
    finally:
        holder.rollback()
        holder.close()
    assert _fwd_source(get_tuned_attention(db_path)) == "tuned exact"


def test_a_writer_holding_the_lock_does_not_stop_the_read_in_wal_mode(write, db_path):
    write(16, "fwd", FWD_A)
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("DELETE FROM flashtune_tuned_results")  # uncommitted: readers still see the row
        with warnings.catch_warnings():
            warnings.simplefilter("error", DispatchWarning)
            assert _fwd_source(get_tuned_attention(db_path)) == "tuned exact"
    finally:
        holder.rollback()
        holder.close()


def test_rows_of_another_kernel_are_never_served_and_one_warning_names_revalidate(write, db_path, gpu):
    write(16, "fwd", FWD_A, kernel_hash="00000000deadbeef")
    write(16, "bwd", BWD_A)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = get_tuned_attention(db_path)
        fn.reload()
        get_tuned_attention(db_path)
    [message] = _dispatch_warnings(record)
    assert message.startswith(f"1 of 2 tuned configs for {gpu.key} (sqlite:///{db_path}) are "
                              "stale (tuned with kernel sources 00000000deadbeef; this flashtune has kernel sources ")
    assert message.endswith(f"they are not served until `flashtune revalidate --db sqlite:///{db_path}` checks them "
                            "again here")
    choice = fn.explain(*qkv(16))
    assert (choice.bwd_config, choice.bwd_source) == (BWD_A, "tuned exact")
    assert choice.fwd_config == default_config("fwd", 16, torch.float32, qkv(16)[0].device) != FWD_A
    assert choice.fwd_source.startswith("heuristic (the tuned fwd config of fwd float32 d16 n16 full is stale, tuned "
                                        "with kernel sources 00000000deadbeef; this flashtune has ")
    assert choice.fwd_source.endswith("`flashtune revalidate` checks it again)")


def test_a_stale_exact_row_is_passed_over_for_a_current_neighbour(write, db_path):
    write(16, "fwd", FWD_A, kernel_hash="00000000deadbeef")
    write(32, "fwd", FWD_B)
    choice = get_tuned_attention(db_path).explain(*qkv(16))
    assert choice.fwd_config == FWD_B
    assert choice.fwd_source.startswith("tuned nearest (fwd float32 d16 n32 full); the tuned fwd config of fwd "
                                        "float32 d16 n16 full is stale")


def test_a_db_that_is_no_url_raises_at_creation():
    with pytest.raises(StoreError, match="unsupported database URL scheme"):
        get_tuned_attention("mysql://nobody@nowhere/db")
