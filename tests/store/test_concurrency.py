"""Several processes write one store at once; writers are killed (SIGKILL) mid-way.

Workers are forked: they inherit the imported modules, so they start at once.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
import traceback

import pytest
from store_samples import H200, config_for, key, provenance, result

from flashtune.outcome import Outcome
from flashtune.store import Store, repository, resolve_url

FORK = multiprocessing.get_context("fork")
WORKERS = 4
ROUNDS = 24
SHARED_SEQ_LENS = (256, 512, 1024, 2048)  # every worker saves results for these keys


def _time_ms(worker: int, round_: int) -> float:
    """Distinct times, so the fastest result of each key is known in advance."""
    return 1.0 + ((worker * 7 + round_ * 13) % 97) / 10


def _writer(url: str, worker: int, barrier) -> None:
    try:
        barrier.wait()
        with Store(url) as store:  # all open a new database at once: its schema is made once
            store.upsert_gpu(H200)
            for round_ in range(ROUNDS):
                store.record_trial(key(), config_for("fwd"), Outcome("ok", time_ms=_time_ms(worker, round_),
                                   message=f"worker {worker} round {round_}"), provenance=provenance())
                seq_len = SHARED_SEQ_LENS[round_ % len(SHARED_SEQ_LENS)]
                store.save_result(result(key(seq_len), _time_ms(worker, round_)))
            store.save_result(result(key(1 << (16 + worker)), 5.0))  # a key of its own
    except BaseException:  # noqa: BLE001 - the parent sees the exit code and the trace
        traceback.print_exc()
        os._exit(1)


def _integrity(url: str) -> str:
    connection = sqlite3.connect(resolve_url(url).database)
    try:
        return connection.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        connection.close()


def test_concurrent_writers_lose_nothing_and_keep_the_fastest(db_url):
    barrier = FORK.Barrier(WORKERS)
    workers = [FORK.Process(target=_writer, args=(db_url, w, barrier)) for w in range(WORKERS)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
    assert [p.exitcode for p in workers] == [0] * WORKERS

    with Store(db_url) as store:
        messages = [t.message for t in store.trials_for(key())]
        assert sorted(messages) == sorted(f"worker {w} round {r}" for w in range(WORKERS) for r in range(ROUNDS))
        table = store.load_table(H200)
        for i, seq_len in enumerate(SHARED_SEQ_LENS):
            fastest = min(_time_ms(w, r) for w in range(WORKERS) for r in range(i, ROUNDS, len(SHARED_SEQ_LENS)))
            assert table[key(seq_len)].time_ms == fastest, seq_len
        assert sorted(k.seq_q for k in table) == sorted([*SHARED_SEQ_LENS, *(1 << (16 + w) for w in range(WORKERS))])
        assert store.list_gpus() == [H200]
    if db_url.startswith("sqlite"):
        assert _integrity(db_url) == "ok"


# -- crash safety -------------------------------------------------------------------------------

COMMITTED = 20
IMPORTED = 40


def _start_writer(target, url: str):
    """Start ``target(url, reports)`` in a child; return the reports' read end and a
    function that SIGKILLs the child, then checks the SQLite file's integrity."""
    Store(url).close()  # the schema exists before the writer starts
    reports, child_end = FORK.Pipe(duplex=False)
    child = FORK.Process(target=target, args=(url, child_end))
    child.start()
    child_end.close()  # so that a child that dies early is an EOF here, not a wait

    def kill() -> None:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        if url.startswith("sqlite"):
            assert _integrity(url) == "ok"

    return reports, kill


def _doomed_writer(url: str, reports) -> None:
    """Commit trials one by one (reporting each id), then stall half-way through an import."""
    store = Store(url)
    store.upsert_gpu(H200)
    for i in range(COMMITTED):
        reports.send(store.record_trial(key(), config_for("fwd"), Outcome("crashed", message=f"committed {i}"),
                                        provenance=provenance()))
    write_one = repository._write_result

    def write_then_stall(session, *args, written=[0]):  # noqa: B006 - a counter
        outcome = write_one(session, *args)
        written[0] += 1
        if written[0] == IMPORTED // 2:
            session.flush()
            reports.send("mid-transaction")
            time.sleep(600)
        return outcome

    repository._write_result = write_then_stall
    store.import_results(result(key(100 + i)) for i in range(IMPORTED))
    os._exit(2)  # never reached: the parent kills us first


def test_a_writer_killed_mid_transaction_leaves_the_committed_rows_and_nothing_else(db_url):
    reports, kill = _start_writer(_doomed_writer, db_url)
    committed = [reports.recv() for _ in range(COMMITTED)]
    assert reports.poll(60) and reports.recv() == "mid-transaction"
    kill()
    with Store(db_url) as store:
        trials = store.trials_for(key())
        assert [t.id for t in trials] == committed
        assert [t.message for t in trials] == [f"committed {i}" for i in range(COMMITTED)]
        assert store.list_results() == []  # the half-done import is gone as a whole
        # the dead writer's locks are gone too: its keys can be written now
        assert store.import_results(result(key(100 + i)) for i in range(IMPORTED)).inserted == IMPORTED


def _busy_writer(url: str, reports) -> None:
    with Store(url) as store:
        store.upsert_gpu(H200)
        for i in range(100_000):
            reports.send(store.record_trial(key(), config_for("fwd"), Outcome("timeout", message=str(i)),
                                            provenance=provenance()))
            store.save_result(result(key(1 << (8 + i % 8)), 10.0 / (i + 1)))


def _saved(n: int) -> dict[int, float]:
    """seq_len -> time_ms the store holds after _busy_writer's first ``n`` saves."""
    return {1 << (8 + i % 8): 10.0 / (i + 1) for i in range(n)}


@pytest.mark.parametrize("kill_after", [7, 31])
def test_a_writer_killed_at_any_moment_keeps_every_commit(db_url, kill_after):
    reports, kill = _start_writer(_busy_writer, db_url)
    reported = [reports.recv() for _ in range(kill_after)]
    kill()  # wherever the writer is: between, inside or committing a write
    with Store(db_url) as store:
        ids = [t.id for t in store.trials_for(key())]
        assert ids[:kill_after] == reported and len(ids) <= kill_after + 1  # the last one may be committed unreported
        # save i follows trial i and precedes trial i + 1: every save before the last trial
        # committed, the last one may have; each key holds its last (fastest) committed save
        held = {r.key.seq_q: r.time_ms for r in store.list_results()}
        assert held in (_saved(len(ids) - 1), _saved(len(ids))), held
        store.upsert_gpu(H200)  # and it takes writes

