"""Injected faults: crash, hang, wrong result, trap; and failures while setting up a key.

Faults go in around a forward trial's launch (flashtune.autotuner.faults, test-only), so
these tests tune forward keys. A tiny search space (patched in this process, where
the search runs) makes the search exhaustive, so every config is tried exactly once.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

import optuna
import torch
from autotuner_helpers import (
    FAULT_OOB_WRITE,
    FAULT_SPIN,
    FAULT_TRAP,
    FAULT_WRONG,
    Spy,
    cid,
    journal_study,
    key,
    store_id,
    stored_result,
    tiny_space,
    trials_of,
)

from flashtune.autotuner import search, study_name
from flashtune.autotuner.worker import TrialWorker
from flashtune.configs.forward import FwdConfig
from flashtune.heuristics.defaults import default_config
from flashtune.keys import GpuInfo
from flashtune.provenance import current_provenance, kernel_source_hash
from flashtune.store import Store, StoredResult

SPACE = {"BLOCK_M": [16, 32, 64], "BLOCK_N": [32], "num_warps": [4], "num_stages": [1, 2]}
K = key("fwd", "float32", seq_len=16, causal=True)
DEFAULT = default_config("fwd", 16, torch.float32, "cpu")


def test_each_fault_is_recorded_and_never_wins(tmp_path, monkeypatch):
    configs = tiny_space(monkeypatch, "fwd", SPACE)
    assert DEFAULT in configs
    faults = {
        cid(DEFAULT): FAULT_WRONG,  # the default, measured first, computes a wrong answer
        cid(FwdConfig(16, 32, 4, 1)): FAULT_OOB_WRITE,  # segfaults the interpreter: the worker dies
        cid(FwdConfig(16, 32, 4, 2)): FAULT_SPIN,  # never ends: killed at the trial timeout
        cid(FwdConfig(32, 32, 4, 1)): FAULT_TRAP,  # inline asm: the interpreter cannot run it
    }
    good = {cid(c) for c in configs} - set(faults)
    assert len(good) == 2
    retimed, workers = Spy(monkeypatch, "retime"), []
    original_close = TrialWorker.close
    monkeypatch.setattr(TrialWorker, "close", lambda w: workers.append(w.restarts) or original_close(w))
    db = tmp_path / "t.db"
    summary = search([K], db=db, trials=len(configs), device="cpu", trial_timeout=8, finalists=3, rounds=1,
                     faults=faults)
    (r,) = summary.results
    assert r.status == "tuned"
    assert r.outcomes == {"incorrect": 1, "crashed": 1, "timeout": 1, "compile_error": 1, "ok": 2}
    assert r.n_trials == len(configs)
    assert workers == [3]  # started once, again after the crash, again after the timeout

    by_config = {cid(t.config): t for t in trials_of(db, K)}
    assert set(by_config) == {cid(c) for c in configs}  # every config once, the good ones intact
    wrong = by_config[cid(DEFAULT)]
    assert wrong.status == "incorrect" and wrong.error > 1 and wrong.time_ms is None
    assert "allowance" in wrong.message
    crashed = by_config[cid(FwdConfig(16, 32, 4, 1))]
    assert crashed.status == "crashed" and "died" in crashed.message
    timeout = by_config[cid(FwdConfig(16, 32, 4, 2))]
    assert timeout.status == "timeout" and "no answer within 8 s" in timeout.message
    trap = by_config[cid(FwdConfig(32, 32, 4, 1))]
    assert trap.status == "compile_error" and "inline_asm" in trap.message
    for c in good:
        assert by_config[c].status == "ok" and by_config[c].time_ms > 0 and by_config[c].error <= 1

    # only correct configs are re-timed, and one of them wins
    assert {cid(c) for (_, cfgs, *_) in retimed.calls for c in cfgs} <= good
    assert cid(r.winner) in good
    stored = stored_result(db, K)
    assert cid(stored.config) in good
    assert stored.default_time_ms is None and r.speedup is None  # the default could not run correctly


def _store_winner(db, config, k=K):
    with Store(db) as store:
        gpu = GpuInfo.interpreter()
        store.upsert_gpu(gpu)
        store.save_result(StoredResult(key=k, config=config, time_ms=0.001, tflops=1.0, default_time_ms=None,
                                       error=0.0, n_trials=1, gpu=gpu, provenance=current_provenance(None)))


def test_a_stored_winner_that_is_now_wrong_is_replaced(tmp_path, monkeypatch):
    """A winner stored earlier (another kernel version, an import) is re-checked, not trusted."""
    tiny_space(monkeypatch, "fwd", {"BLOCK_M": [32, 64], "BLOCK_N": [32], "num_warps": [4], "num_stages": [2]})
    db, stale = tmp_path / "t.db", FwdConfig(64, 32, 4, 2)
    _store_winner(db, stale)
    retimed = Spy(monkeypatch, "retime")
    summary = search([K], db=db, trials=2, device="cpu", trial_timeout=120, rounds=1,
                     faults={cid(stale): FAULT_WRONG})
    (r,) = summary.results
    assert r.status == "tuned" and r.outcomes == {"ok": 1, "incorrect": 1}
    assert all(cid(c) != cid(stale) for (_, cfgs, *_) in retimed.calls for c in cfgs)
    assert cid(r.winner) == cid(DEFAULT) == cid(stored_result(db, K).config)


def test_revalidate_checks_the_finalists_again_and_drops_one_that_became_wrong(tmp_path, monkeypatch):
    """After an upgrade the old trials prove nothing: --revalidate measures the finalists again."""
    configs = tiny_space(monkeypatch, "fwd", {"BLOCK_M": [16, 32], "BLOCK_N": [16], "num_warps": [4],
                                              "num_stages": [1]})
    db = tmp_path / "t.db"
    run = dict(db=db, trials=2, device="cpu", trial_timeout=120, rounds=1)
    (first,) = search([K], **run).results
    assert first.status == "tuned" and first.n_trials == 2
    winner = first.winner
    runs = Spy(monkeypatch, "run")
    # the same versions, but the winner now computes a wrong answer (as a new triton might)
    (again,) = search([K], revalidate=True, faults={cid(winner): FAULT_WRONG}, **run).results
    assert again.status == "revalidated" and cid(again.winner) != cid(winner)
    # the winner, its runner-up (the space's other config) and the default checked again, nothing searched
    assert sorted(cid(cfg) for (_, cfg, *_) in runs.calls) == sorted(cid(c) for c in [*configs, DEFAULT])
    statuses = {cid(t.config): [x.status for x in trials_of(db, K) if cid(x.config) == cid(t.config)]
                for t in trials_of(db, K)}
    assert statuses[cid(winner)] == ["ok", "incorrect"]
    assert cid(stored_result(db, K).config) == cid(again.winner)


def test_a_stored_winner_not_measured_in_this_run_is_not_a_finalist(tmp_path, monkeypatch):
    db, stale = tmp_path / "t.db", FwdConfig(128, 64, 8, 1)
    _store_winner(db, stale)
    retimed = Spy(monkeypatch, "retime")
    (r,) = search([K], db=db, trials=1, device="cpu", trial_timeout=120, rounds=1).results
    assert r.status == "tuned" and r.n_trials == 1  # the budget was spent on the default
    assert [[cid(c) for c in cfgs] for (_, cfgs, *_) in retimed.calls] == [[cid(DEFAULT)]]
    assert cid(stored_result(db, K).config) == cid(DEFAULT)


class _DieWhenUnpickled:
    """Sent as a key, it kills the worker while it reads the setup request: a crash in setup."""

    def __reduce__(self):
        return (os._exit, (9,))


def test_a_key_whose_setup_fails_or_crashes_fails_alone(tmp_path, monkeypatch):
    bad, dead, fine = (key("fwd", "float32", 16, causal=c, head_dim=d) for c, d in
                       ((True, 32), (False, 32), (True, 16)))
    original = TrialWorker.setup

    def setup(worker, k):
        if k == bad:
            k = None  # the child cannot build inputs for it: an exception in the child
        elif k == dead:
            k = _DieWhenUnpickled()
        return original(worker, k)

    monkeypatch.setattr(TrialWorker, "setup", setup)
    db = tmp_path / "t.db"
    summary = search([bad, dead, fine], db=db, trials=2, device="cpu", trial_timeout=120, rounds=1)
    rb, rd, rf = summary.results
    assert rb.status == "failed: error" and "AttributeError" in rb.message
    assert rd.status == "failed: crashed" and "died" in rd.message
    assert rf.status == "tuned" and rf.n_trials == 2
    assert trials_of(db, bad) == [] and trials_of(db, dead) == []
    for k in (bad, dead):  # the trial that was asked for is closed, not left running
        study = journal_study(tmp_path / "optuna-journal.log", study_name(k, kernel_source_hash(), store_id(db)))
        states = [t.state for t in study.trials]
        assert optuna.trial.TrialState.RUNNING not in states
        assert optuna.trial.TrialState.FAIL in states
    with Store(db) as store:  # a failed key's claim is given back (another search may try it), a tuned one is done
        now = datetime.now(timezone.utc)
        claims = {k: store.claims.get(k) for k in (bad, dead, fine)}
    assert all(claims[k].state == "claimed" and claims[k].lease_expires_at <= now for k in (bad, dead))
    assert claims[fine].state == "done"


def test_a_script_without_a_main_guard_gets_told_why_its_worker_died(tmp_path):
    """The worker starts by spawn, which imports the calling script again: unguarded, the
    script's own search() call runs again in the child, which dies. The key fails with a
    message that says what to do, and nothing else breaks on the way out."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        from flashtune.autotuner import build_keys, search
        from flashtune.keys import GpuInfo

        keys = build_keys(GpuInfo.interpreter().key, head_dims=[16], dtypes=["float32"], seq_lens=[16],
                          causal=[False], passes=["fwd"])
        (r,) = search(keys, db={str(tmp_path / 't.db')!r}, trials=1, device="cpu").results
        print("RESULT", r.status, "|", r.message)
    """))
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
    assert "failed: crashed" in line and "if __name__ == '__main__':" in line
    assert "can only join a started process" not in done.stderr


def test_winners_of_related_keys_are_tried_early(tmp_path, monkeypatch):
    """The other masking's winner (same GPU, dtype, pass and head dim) is measured right after
    the default and its neighbours (which are not in this space)."""
    configs = tiny_space(monkeypatch, "fwd", {"BLOCK_M": [16, 64], "BLOCK_N": [32], "num_warps": [4],
                                              "num_stages": [1, 2]})
    assert cid(DEFAULT) not in {cid(c) for c in configs}
    db = tmp_path / "t.db"
    other_masking = FwdConfig(64, 32, 4, 2)
    _store_winner(db, other_masking, k=key("fwd", "float32", seq_len=64, causal=False))
    runs = Spy(monkeypatch, "run")
    (r,) = search([K], db=db, trials=3, device="cpu", trial_timeout=120, rounds=1).results
    assert r.status == "tuned"
    measured = [cid(cfg) for (_, cfg, *_) in runs.calls]
    assert measured[0] == cid(other_masking)
