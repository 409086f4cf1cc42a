"""Recording: get_tuned_attention(record=True) notes each call signature without a tuned key of
its own once, counts its calls in memory, writes off the calling thread, and `flashtune search
--recorded` tunes exactly those keys."""

from __future__ import annotations

import json
import threading
import time

import torch
from click.testing import CliRunner
from dispatch_samples import FWD_A, qkv

from flashtune.cli import cli
from flashtune import dispatch, recording
from flashtune.dispatch import get_tuned_attention
from flashtune.store import Store
from flashtune.store import repository


def _recorded(db_path):
    with Store(db_path) as store:
        return {(c.key.pass_, c.key.seq_q, c.key.seq_k, c.batch, c.heads_q, c.heads_kv): c.calls
                for c in store.recorded_calls()}


def test_each_untuned_signature_is_noted_once_with_its_calls(write, db_path):
    write(16, "fwd", FWD_A)  # tuned exact for (16, 16): never recorded
    fn = get_tuned_attention(db_path, record=True)
    with torch.no_grad():
        for n_q, n_k, times in ((16, 16, 2), (8, 24, 3), (1, 40, 4)):
            q, k, v = qkv(n_q, n_k)
            for _ in range(times):
                fn(q, k, v)
    q, k, v = qkv(8, 24, grad=True)
    fn(q, k, v).sum().backward()  # another call of (8, 24), now with gradients: its bwd key too
    fn.flush_recorded()
    # noted under their buckets: 8 x 24 as 8 x 32, 1 x 40 as 1 x 32
    assert _recorded(db_path) == {("fwd", 8, 32, 1, 2, 2): 4, ("fwd", 1, 32, 1, 2, 2): 4}
    assert fn.explain(q, k, v).fwd_source != "tuned exact"


def test_a_signature_first_seen_with_gradients_notes_both_passes(db_path):
    fn = get_tuned_attention(db_path, record=True)
    q, k, v = qkv(12, grad=True)
    fn(q, k, v).sum().backward()
    fn.flush_recorded()
    assert _recorded(db_path) == {("fwd", 16, 16, 1, 2, 2): 1, ("bwd", 16, 16, 1, 2, 2): 1}


def test_eight_threads_record_each_signature_once_and_calls_touch_no_database(db_path, monkeypatch):
    fn = get_tuned_attention(db_path, record=True)
    shapes = [(16, 16), (8, 32), (4, 64), (1, 128)]
    inputs = [qkv(*s) for s in shapes]
    with torch.no_grad():
        for q, k, v in inputs:  # first sight of each signature
            fn(q, k, v)
    fn.flush_recorded()
    opened = []
    real_init = repository.Store.__init__

    def spy(self, *args, **kwargs):
        opened.append(threading.current_thread().name)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(repository.Store, "__init__", spy)
    # the Triton interpreter is not thread-safe: the threads' launches are stubbed (what is
    # under test is the dispatcher's per-call path and the recorder)
    monkeypatch.setattr(dispatch, "attention_forward", lambda q, k, v, *args, **kwargs: (q, None))

    def work():
        with torch.no_grad():
            for _ in range(5):
                for q, k, v in inputs:
                    fn(q, k, v)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert opened == []  # no call after a signature's first opened the store
    fn.flush_recorded()
    assert opened == ["flashtune-recorder"]  # the flush wrote, off the calling threads
    calls = _recorded(db_path)
    assert len(calls) == len(shapes) and all(n == 1 + 8 * 5 for n in calls.values())


def test_recording_is_off_by_default_and_on_with_the_environment(db_path, monkeypatch):
    with torch.no_grad():
        get_tuned_attention(db_path)(*qkv(16))
    monkeypatch.setenv("FLASHTUNE_RECORD", "1")
    fn = get_tuned_attention(db_path)
    with torch.no_grad():
        fn(*qkv(20))
    fn.flush_recorded()
    assert _recorded(db_path) == {("fwd", 16, 16, 1, 2, 2): 1}


def test_list_and_search_recorded(db_path, tmp_path):
    fn = get_tuned_attention(db_path, record=True)
    with torch.no_grad():
        fn(*qkv(8, 24))
        fn(*qkv(8, 24))
        fn(*qkv(6, 40))  # another signature of the same bucket (8 x 32)
    fn.flush_recorded()
    runner = CliRunner()
    listed = runner.invoke(cli, ["list", "--recorded", "--db", str(db_path), "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)
    assert (row["pass"], row["seq_q"], row["seq_k"], row["calls"], row["signatures"], row["tuned"]) == \
        ("fwd", 8, 32, 3, 1, False)
    out = runner.invoke(cli, ["search", "--recorded", "--interpreter", "--trials", "1", "--db", str(db_path),
                              "--storage", str(tmp_path / "journal.log"), "--json", "--no-progress"])
    assert out.exit_code == 0, out.output
    [tuned] = json.loads(out.stdout)["keys"]
    assert (tuned["seq_q"], tuned["seq_k"], tuned["status"], tuned["trial_shape"]) == (8, 32, "tuned", [1, 2, 2])
    listed = runner.invoke(cli, ["list", "--recorded", "--db", str(db_path), "--json"])
    assert json.loads(listed.stdout)[0]["tuned"] is True
    after = get_tuned_attention(db_path, record=True)
    assert after.explain(*qkv(8, 32)).fwd_source == "tuned exact"
    assert after.explain(*qkv(8, 24)).fwd_source == "tuned nearest (fwd float32 d16 q8 k32 full g1 bh2)"
    with torch.no_grad():
        after(*qkv(7, 24))  # of the tuned bucket: not noted again
    after.flush_recorded()
    assert _recorded(db_path) == {("fwd", 8, 32, 1, 2, 2): 3}
    table = runner.invoke(cli, ["list", "--recorded", "--db", str(db_path)])
    assert table.exit_code == 0 and table.stdout.splitlines()[2].split()[-7:] == ["full", "1", "2", "2", "3", "1",
                                                                                  "yes"]


def test_a_decode_loop_makes_one_key_per_factor_of_two_of_its_cache(db_path, monkeypatch):
    """Cache lengths 17 to 516 (a 500-token decode after a 16-token prompt): six buckets, their calls summed."""
    monkeypatch.setattr(dispatch, "attention_forward", lambda q, k, v, *args, **kwargs: (q, None))  # the launch
    fn = get_tuned_attention(db_path, record=True)
    q = qkv(1, 1)[0]
    with torch.no_grad():
        for length in range(17, 517):
            k, v = qkv(1, length)[1:]
            fn(q, k, v)
    fn.flush_recorded()
    recorded = _recorded(db_path)
    assert recorded == {("fwd", 1, n, 1, 2, 2): calls
                        for n, calls in ((16, 6), (32, 23), (64, 45), (128, 91), (256, 181), (512, 154))}
    assert sum(recorded.values()) == 500


def _hold_write_lock(db_path):
    """Another connection holding the SQLite store's write lock (as a search's transaction does)."""
    import sqlite3

    with Store(db_path):
        pass  # created at the current schema
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def _quick_lock_retries(monkeypatch, *, retry_s: tuple) -> None:
    """The recorder's lock wait cut to 50 ms and its retries to ``retry_s``; the launch stubbed."""
    monkeypatch.setattr(recording, "LOCK_TIMEOUT_S", 0.05)
    monkeypatch.setattr(recording, "RETRY_S", retry_s)
    monkeypatch.setattr(dispatch, "attention_forward", lambda q, k, v, *args, **kwargs: (q, None))


def test_a_signature_whose_write_met_a_lock_is_written_once_the_lock_is_gone(db_path, monkeypatch, recwarn):
    """A write that meets a lock held past the recorder's timeout is tried again in the background:
    the signature is stored before any flush or exit, with no warning for a lock that went away."""
    _quick_lock_retries(monkeypatch, retry_s=(1.0,))
    holder = _hold_write_lock(db_path)
    fn = get_tuned_attention(db_path, record=True)
    with torch.no_grad():
        fn(*qkv(8, 32))
    time.sleep(0.5)  # the first write meets the lock
    holder.execute("ROLLBACK")
    with torch.no_grad():
        fn(*qkv(4, 64))  # a later signature: its write carries the earlier one too
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(_recorded(db_path)) < 2:
        time.sleep(0.05)
    assert set(_recorded(db_path)) == {("fwd", 8, 32, 1, 2, 2), ("fwd", 4, 64, 1, 2, 2)}
    assert not [w for w in recwarn if "cannot record" in str(w.message)]
    fn.flush_recorded()
    assert _recorded(db_path) == {("fwd", 8, 32, 1, 2, 2): 1, ("fwd", 4, 64, 1, 2, 2): 1}


def test_a_store_locked_for_long_warns_once_and_keeps_the_calls(db_path, monkeypatch, recwarn):
    _quick_lock_retries(monkeypatch, retry_s=(0.05,))
    holder = _hold_write_lock(db_path)
    fn = get_tuned_attention(db_path, record=True)
    with torch.no_grad():
        for n_k in (32, 64, 128):
            fn(*qkv(8, n_k))
            fn(*qkv(8, n_k))
    time.sleep(1.0)  # every try meets the lock
    warned = [w for w in recwarn if "cannot record" in str(w.message)]
    assert len(warned) == 1 and "database is locked" in str(warned[0].message)
    holder.execute("ROLLBACK")
    fn.flush_recorded()
    assert _recorded(db_path) == {("fwd", 8, n, 1, 2, 2): 2 for n in (32, 64, 128)}
    assert len([w for w in recwarn if "cannot record" in str(w.message)]) == 1


def test_a_flush_waits_out_a_lock_shorter_than_its_timeout(db_path, monkeypatch, recwarn):
    """The flush at exit is the counts' last chance: it keeps trying until its timeout, not one
    lock timeout, and a flush that still cannot write says so (once)."""
    _quick_lock_retries(monkeypatch, retry_s=(30.0,))  # no background retry during the test
    fn = get_tuned_attention(db_path, record=True)
    with torch.no_grad():
        fn(*qkv(8, 32))
    fn.flush_recorded()
    holder = _hold_write_lock(db_path)
    with torch.no_grad():
        fn(*qkv(8, 32))
    release = threading.Timer(0.5, holder.execute, ("ROLLBACK",))
    release.start()
    started = time.monotonic()
    fn.flush_recorded()
    release.join()
    assert _recorded(db_path) == {("fwd", 8, 32, 1, 2, 2): 2} and time.monotonic() - started < 5
    assert not [w for w in recwarn if "cannot record" in str(w.message)]

    holder.execute("BEGIN IMMEDIATE")  # now held past the flush's timeout
    with torch.no_grad():
        fn(*qkv(8, 32))
    fn._recorder.flush(timeout=0.5)
    fn._recorder.flush(timeout=0.5)
    warned = [w for w in recwarn if "cannot record" in str(w.message)]
    assert len(warned) == 1 and "database is locked" in str(warned[0].message)
    holder.execute("ROLLBACK")
    fn.flush_recorded()
    assert _recorded(db_path) == {("fwd", 8, 32, 1, 2, 2): 3}


def test_a_store_that_cannot_be_made_costs_a_flush_no_wait(tmp_path, monkeypatch, recwarn):
    """Only a lock is waited out: a missing directory (given by hand) fails the flush at once, warned of once."""
    monkeypatch.setattr(dispatch, "attention_forward", lambda q, k, v, *args, **kwargs: (q, None))
    fn = get_tuned_attention(tmp_path / "missing" / "tuned.db", record=True)
    with torch.no_grad():
        fn(*qkv(8, 32))
    started = time.monotonic()
    fn.flush_recorded()
    assert time.monotonic() - started < 2
    assert len([w for w in recwarn if "cannot record" in str(w.message)]) == 1
    assert not (tmp_path / "missing").exists()
