"""Interrupting a search loses nothing that finished, and running it again resumes it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from autotuner_helpers import (
    FAULT_SPIN,
    Spy,
    child_pids,
    cid,
    journal_study,
    key,
    process_exists,
    rows_per_config,
    store_id,
    stored_result,
    tiny_space,
    trials_of,
)

from flashtune.autotuner import search, study_name
from flashtune.protocol import flops, trial_shape
from flashtune.configs.forward import FwdConfig
from flashtune.heuristics.defaults import default_config
from flashtune.configs.space import default_neighbours
from flashtune.provenance import kernel_source_hash
from flashtune.store import Store

REPO = Path(__file__).resolve().parents[2]


def test_an_interrupted_search_resumes_without_measuring_a_config_twice(tmp_path, monkeypatch):
    k = key("fwd", "float16", seq_len=32, causal=False)
    db, trials = tmp_path / "t.db", 5
    run = dict(db=db, trials=trials, device="cpu", trial_timeout=120, finalists=2, rounds=1)
    default = default_config("fwd", 16, __import__("torch").float16, "cpu")
    sigterm = signal.getsignal(signal.SIGTERM)

    # 1. Ctrl-C while the first trial (the heuristic default) runs: nothing finished
    def interrupt(worker, n, *args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        Spy(m, "run", before=interrupt)
        with pytest.raises(KeyboardInterrupt):
            search([k], **run)
    assert trials_of(db, k) == []
    assert signal.getsignal(signal.SIGTERM) is sigterm  # the SIGTERM handler is put back
    # what the first run left waiting in the study's queue: the rest of its warm start (the
    # default's neighbours, then the heuristic portfolio's entries), not the default itself
    study = journal_study(tmp_path / "optuna-journal.log", study_name(k, kernel_source_hash(), store_id(db)))
    waiting = [cid(FwdConfig(**t.system_attrs["fixed_params"])) for t in study.trials
               if t.state == optuna.trial.TrialState.WAITING]
    neighbours = [cid(c) for c in default_neighbours(default)]
    assert waiting[:len(neighbours)] == neighbours and cid(default) not in waiting
    assert len(waiting) < 3, "the default would not be among the three trials of the next run: the test shows nothing"

    # 2. Interrupted after the third trial reached the store, before the study heard of it
    with monkeypatch.context() as m:
        recorded = []
        original = Store.record_trial

        def record_then_interrupt(store, *args, **kwargs):
            recorded.append(original(store, *args, **kwargs))
            if len(recorded) == 3:
                raise KeyboardInterrupt

        m.setattr(Store, "record_trial", record_then_interrupt)
        runs = Spy(m, "run")
        with pytest.raises(KeyboardInterrupt):
            search([k], **run)
    assert len(runs.calls) == 3
    assert sum(rows_per_config(db, k).values()) == 3
    # the default was re-queued although its first trial failed (interrupted), and measured
    # right after what the first run had left waiting in the queue (the rest of its warm start)
    assert [cid(c[1]) for c in runs.calls] == [*waiting, cid(default)][:3]

    # 3. Run again to the end
    with monkeypatch.context() as m:
        runs = Spy(m, "run")
        summary = search([k], **run)
    (r,) = summary.results
    assert r.status == "tuned"
    assert len(runs.calls) == trials - 3  # only what had not finished
    counts = rows_per_config(db, k)
    assert max(counts.values()) == 1, counts  # no config measured twice
    assert sum(counts.values()) == r.n_trials == trials
    assert cid(default) in counts and r.default_time_ms is not None
    study = journal_study(tmp_path / "optuna-journal.log", study_name(k, kernel_source_hash(), store_id(db)))
    told = [t for t in study.trials if "status" in t.user_attrs]
    assert sorted(cid(FwdConfig(**t.params)) for t in told) == sorted(counts)
    assert study.user_attrs["finalized_trials"] == trials

    # 4. ... and once more: nothing to do
    again = search([k], **run)
    assert again.results[0].status == "already_tuned"
    assert sum(rows_per_config(db, k).values()) == trials


def test_a_key_whose_retiming_crashed_is_finished_by_the_next_run(tmp_path, monkeypatch):
    a, b = key("fwd", "float32", seq_len=16, causal=True), key("fwd", "float32", seq_len=16, causal=False)
    db, trials = tmp_path / "t.db", 3
    run = dict(db=db, trials=trials, device="cpu", trial_timeout=120, finalists=2, rounds=1)

    def crash_on_a(worker, n, k, *args):
        if k == a:
            worker._ensure(k)
            import os

            os.kill(worker.pid, signal.SIGKILL)  # the child dies during the re-timing

    with monkeypatch.context() as m:
        Spy(m, "retime", before=crash_on_a)
        first = search([a, b], **run)
    ra, rb = first.results
    assert ra.status == "failed: crashed" and "died" in ra.message
    assert rb.status == "tuned"  # the search went on with the next key
    assert stored_result(db, a) is None
    assert sum(rows_per_config(db, a).values()) == ra.n_trials == trials  # its trials are kept

    with monkeypatch.context() as m:
        runs = Spy(m, "run")
        second = search([a, b], **run)
    ra, rb = second.results
    assert (ra.status, rb.status) == ("tuned", "already_tuned")
    assert runs.calls == []  # every trial had finished: only the re-timing ran
    stored = stored_result(db, a)
    assert cid(stored.config) == cid(ra.winner)
    # flops and the timer come from this key's inputs, although no trial ran in this process
    assert stored.tflops == pytest.approx(flops(a, *trial_shape(a, True)[:2]) / stored.time_ms * 1e-9)
    assert ra.timer == "interpreter-wall-clock"
    assert max(rows_per_config(db, a).values()) == 1


SCRIPT = textwrap.dedent('''
    import sys

    from flashtune.autotuner import search
    from flashtune.keys import GpuInfo, TuningKey
    from flashtune.configs import space
    from flashtune.configs import FwdConfig

    SPACE = {"BLOCK_M": [16, 32], "BLOCK_N": [32], "num_warps": [4], "num_stages": [1, 2]}

    if __name__ == "__main__":
        space.SPACES["fwd"] = (FwdConfig, SPACE)
        key = TuningKey(GpuInfo.interpreter().key, "float32", 16, 16, True, "fwd")
        # the default (32, 32, 4, 2) is measured first, then the space in order: the third spins
        faults = {FwdConfig(16, 32, 4, 2): %d}
        try:
            search([key], db=sys.argv[1], trials=4, device="cpu", trial_timeout=300, faults=faults)
        except KeyboardInterrupt:
            sys.exit(42)
        sys.exit(0)
''' % FAULT_SPIN)


def _worker_of(pid: int) -> list[int]:
    out = []
    for child in child_pids(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
        except OSError:
            pass
    return out


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT to the process group", "SIGKILL"])
def test_a_search_stopped_by_a_signal_during_a_hanging_trial(tmp_path, monkeypatch, how):
    """The search process stops promptly, its worker goes with it, and a rerun resumes."""
    db = tmp_path / "t.db"
    script = tmp_path / "search_script.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(db)], cwd=REPO, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    k = key("fwd", "float32", seq_len=16, causal=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists() and sum(rows_per_config(db, k).values()) >= 2:
                break
            time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        time.sleep(1.0)  # the third trial is spinning now
        workers = _worker_of(proc.pid)
        assert len(workers) == 1
        sent = time.monotonic()
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        elif how == "SIGKILL":
            proc.kill()
        else:
            import os

            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: parent and worker get it
        out = proc.communicate(timeout=60)[0].decode()
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    expected = -signal.SIGKILL if how == "SIGKILL" else 42
    assert proc.returncode == expected, out[-3000:]
    # the worker busy with the hanging trial is killed at once, not asked to exit
    assert took < 8, f"{how}: the search took {took:.1f} s to stop (the trial timeout is 300 s)"
    deadline = time.monotonic() + 10
    while process_exists(workers[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_exists(workers[0]), "the hanging worker outlived its search"
    if how != "SIGKILL":
        assert "Traceback" not in out, out[-3000:]  # the worker did not die noisily on Ctrl-C
    assert sum(rows_per_config(db, k).values()) == 2  # the two finished trials, nothing else
    if how.startswith("SIGINT"):
        return  # resuming after SIGINT is resuming after SIGTERM: the same KeyboardInterrupt

    # resume in this process, without the fault
    tiny_space(monkeypatch, "fwd", {"BLOCK_M": [16, 32], "BLOCK_N": [32], "num_warps": [4], "num_stages": [1, 2]})
    summary = search([k], db=db, trials=4, device="cpu", trial_timeout=120, finalists=2, rounds=1)
    (r,) = summary.results
    assert r.status == "tuned" and r.n_trials == 4
    counts = rows_per_config(db, k)
    assert len(counts) == 4 and max(counts.values()) == 1, counts
