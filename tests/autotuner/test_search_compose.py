"""The backward's last trial pairs the fastest dK/dV half with the fastest dQ half.

A backward config is two kernels' configs; its time is the dK/dV half's plus the dQ
half's, and each trial also times the dQ kernel alone (Outcome.dq_ms). Here the worker is
replaced by additive fake timings, so what the search should compose is known.
"""

from __future__ import annotations

import optuna
import pytest
from autotuner_helpers import Spy, cid, key, stored_result, tiny_space

from flashtune.autotuner import search
from flashtune.autotuner.outcome import Outcome
from flashtune.autotuner.worker import TrialWorker
from flashtune.configs.backward import BwdConfig

FAST = dict(device="cpu", trial_timeout=120, finalists=2, rounds=1)
SPACE = {"BLOCK_M1": [16, 32], "BLOCK_N1": [16, 64], "BLOCK_M2": [16, 64], "BLOCK_N2": [16], "num_warps": [4],
         "num_stages": [1], "dq_num_warps": [4], "dq_num_stages": [1], "atomic_dq": [0], "tma": [0]}
# ms per dK/dV half (BLOCK_M1, BLOCK_N1) and per dQ half (BLOCK_M2)
DKDV_MS = {(16, 16): 5.0, (16, 64): 3.0, (32, 16): 4.0, (32, 64): 1.0}
DQ_MS = {16: 2.0, 64: 0.5}


def _ms(cfg: BwdConfig) -> float:
    return DKDV_MS[cfg.BLOCK_M1, cfg.BLOCK_N1] + DQ_MS[cfg.BLOCK_M2]


class _Fixed(optuna.samplers.BaseSampler):
    """Proposes the given configs in order, then repeats the last."""

    def __init__(self, proposals):
        self.proposals = proposals

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return getattr(self.proposals[min(trial.number, len(self.proposals) - 1)], param_name)


@pytest.fixture
def fake_worker(monkeypatch):
    monkeypatch.setattr(TrialWorker, "run", lambda w, key, cfg, timeout, fault=0: Outcome(
        "ok", time_ms=_ms(cfg), error=0.1, dq_ms=DQ_MS[cfg.BLOCK_M2]))
    monkeypatch.setattr(TrialWorker, "precompile", lambda w, *a, **kw: None)
    monkeypatch.setattr(TrialWorker, "retime", lambda w, key, cfgs, rounds, timeout: [[_ms(c)] * rounds for c in cfgs])
    monkeypatch.setattr(TrialWorker, "info_for", lambda w, key: {"timer": "fake", "flops": 1.0})


def _cfg(m1, n1, m2) -> BwdConfig:
    return BwdConfig(m1, n1, m2, 16, 4, 1, 4, 1)


def test_the_last_trial_is_the_pair_of_the_fastest_halves(tmp_path, monkeypatch, fake_worker):
    tiny_space(monkeypatch, "bwd", SPACE)
    # the fastest dK/dV half comes with a slow dQ half, and the other way round
    proposals = [_cfg(32, 64, 16), _cfg(16, 16, 64), _cfg(16, 64, 16)]
    monkeypatch.setattr(optuna.samplers, "TPESampler", lambda **kwargs: _Fixed(proposals))
    runs = Spy(monkeypatch, "run")
    k, db = key("bwd", "float32", seq_len=16, causal=True), tmp_path / "t.db"
    reports = []
    (r,) = search([k], db=db, trials=4, progress=reports.append, **FAST).results
    # the progress callback: the key's start, each trial, its end (the library prints nothing)
    assert [p.n_measured for p in reports] == [0, 1, 2, 3, 4, 4] and reports[-1].done
    assert reports[-1].completed == 4 and reports[-1].describe() == f"{k.label()}: done"
    assert reports[-2].best_ms == _ms(_cfg(32, 64, 64)) and "best" in reports[-2].describe()
    measured = [cid(cfg) for (_, cfg, *_) in runs.calls]
    best_pair = _cfg(32, 64, 64)
    assert measured == [cid(c) for c in proposals] + [cid(best_pair)]
    assert r.status == "tuned" and r.n_trials == 4
    assert cid(r.winner) == cid(best_pair) and r.time_ms == _ms(best_pair)
    assert cid(stored_result(db, k).config) == cid(best_pair)


def test_no_pair_to_try_leaves_the_last_trial_to_the_sampler(tmp_path, monkeypatch, fake_worker):
    tiny_space(monkeypatch, "bwd", SPACE)
    # the first config already has both fastest halves: nothing to compose
    proposals = [_cfg(32, 64, 64), _cfg(16, 16, 16), _cfg(16, 64, 16), _cfg(32, 16, 16)]
    monkeypatch.setattr(optuna.samplers, "TPESampler", lambda **kwargs: _Fixed(proposals))
    runs = Spy(monkeypatch, "run")
    (r,) = search([key("bwd", "float32", seq_len=16, causal=True)], db=tmp_path / "t.db", trials=4, **FAST).results
    assert [cid(cfg) for (_, cfg, *_) in runs.calls] == [cid(c) for c in proposals]
    assert r.n_trials == 4 and cid(r.winner) == cid(proposals[0])


def test_a_resumed_search_still_knows_the_halves(tmp_path, monkeypatch, fake_worker):
    """dq_ms lives in the study (its journal), so a search resumed after three trials
    composes the same pair."""
    tiny_space(monkeypatch, "bwd", SPACE)
    proposals = [_cfg(32, 64, 16), _cfg(16, 16, 64), _cfg(16, 64, 16)]
    monkeypatch.setattr(optuna.samplers, "TPESampler", lambda **kwargs: _Fixed(proposals))
    k, db = key("bwd", "float32", seq_len=16, causal=True), tmp_path / "t.db"
    search([k], db=db, trials=3, **FAST)
    runs = Spy(monkeypatch, "run")
    (r,) = search([k], db=db, trials=4, **FAST).results
    assert [cid(cfg) for (_, cfg, *_) in runs.calls] == [cid(_cfg(32, 64, 64))]
    assert r.n_trials == 4 and cid(r.winner) == cid(_cfg(32, 64, 64))
