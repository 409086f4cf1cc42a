"""What the search measures: pruning by validate(), the exhaustive mode, duplicates,
the sampler steering, and arguments refused before anything is written."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest
import torch
from autotuner_helpers import Spy, cid, journal_study, key, rows_per_config, store_id, tiny_space, trials_of

from flashtune.autotuner import key_search, search, study_name
from flashtune.autotuner.worker import TrialWorker
from flashtune.configs import base as configs_base
from flashtune.heuristics import tables as config_mod
from flashtune.configs.base import ConfigError
from flashtune.configs.forward import FwdConfig
from flashtune.heuristics.defaults import default_config
from flashtune.configs.space import candidates, default_neighbours
from flashtune.keys import TuningKey
from flashtune.provenance import kernel_source_hash
from flashtune.store import Store

FAST = dict(device="cpu", trial_timeout=120, finalists=2, rounds=1)


def _valid(cfg, head_dim=16, dtype=torch.float32) -> bool:
    try:
        cfg.validate(head_dim, dtype, "cpu")
        return True
    except ConfigError:
        return False


def _starts(monkeypatch) -> list:
    started, original = [], TrialWorker._start
    monkeypatch.setattr(TrialWorker, "_start", lambda w: started.append(1) or original(w))
    return started


def test_nothing_valid_means_no_compile_and_no_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: 1)
    started = _starts(monkeypatch)
    k = key("bwd", "float32")
    (r,) = search([k], db=tmp_path / "t.db", trials=3, **FAST).results
    assert r.status == "no_valid_config" and r.n_trials == 0 and r.winner is None
    assert started == [] and trials_of(tmp_path / "t.db", k) == []


def test_configs_validate_rejects_never_reach_the_worker(tmp_path, monkeypatch):
    """A small shared-memory limit (in this process, where validate() runs) rejects most of
    the space; the sampler still proposes rejected configs, which cost no trial."""
    limit = 64 * (32 + 2 * 2 * 32)  # exactly the default's estimate (fwd, fp32, d16)
    monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: limit)
    space = candidates("fwd")
    valid = {cid(c) for c in space if _valid(c)}
    assert 3 < len(valid) < len(space) // 2
    runs = Spy(monkeypatch, "run")
    k, db, trials = key("fwd", "float32"), tmp_path / "t.db", 3
    (r,) = search([k], db=db, trials=trials, seed=1, **FAST).results
    assert r.status == "tuned" and r.n_trials == trials
    assert len(runs.calls) == trials  # the budget counts measured configs only
    assert all(cid(cfg) in valid for (_, cfg, *_) in runs.calls)
    assert set(rows_per_config(db, k)) <= valid
    study = journal_study(tmp_path / "optuna-journal.log", study_name(k, kernel_source_hash(), store_id(db)))
    skipped = [t for t in study.trials if t.user_attrs.get("skipped") == "invalid"]
    assert skipped, "the sampler never proposed a rejected config: the test shows nothing"
    assert all(t.state == optuna.trial.TrialState.PRUNED for t in skipped)
    assert not {tuple(sorted(t.params.items())) for t in skipped} & valid


def test_a_space_within_the_budget_is_measured_exhaustively(tmp_path, monkeypatch):
    k = key("bwd", "float32", seq_len=16, causal=False)
    default = default_config("bwd", 16, torch.float32, "cpu")
    configs = tiny_space(monkeypatch, "bwd", {"BLOCK_M1": [16], "BLOCK_N1": [32], "BLOCK_M2": [32],
                                              "BLOCK_N2": [16, 32], "num_warps": [4], "num_stages": [1, 2]})
    assert default in configs and len(configs) == 4
    runs = Spy(monkeypatch, "run")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    journal = tmp_path / "home" / "not" / "yet" / "journal.log"
    db = tmp_path / "t.db"
    run = dict(db=db, trials=6, storage="~/not/yet/journal.log", **FAST)  # the journal's folders are created
    (r,) = search([k], **run).results
    assert r.status == "tuned" and r.n_trials == 4 and r.outcomes == {"ok": 4}
    assert sorted(cid(cfg) for (_, cfg, *_) in runs.calls) == sorted(cid(c) for c in configs)
    assert cid(runs.calls[0][1]) == cid(default)  # the default goes first
    assert rows_per_config(db, k) == {cid(c): 1 for c in configs}
    study = journal_study(journal, study_name(k, kernel_source_hash(), store_id(db)))
    assert all(t.state != optuna.trial.TrialState.PRUNED for t in study.trials)  # no proposal was wasted
    # the whole space is measured, so the key is done although the budget was larger
    (again,) = search([k], **run).results
    assert again.status == "already_tuned" and len(runs.calls) == 4


def test_the_default_and_its_other_dq_mode_are_measured_first(tmp_path, monkeypatch):
    """Whether atomic dQ beats the dQ kernel depends on the key: the backward's warm start
    measures the default, then the default with dQ computed the other way."""
    runs = Spy(monkeypatch, "run")
    k = key("bwd", "float32", seq_len=16, causal=True)
    default = default_config("bwd", 16, torch.float32, "cpu")
    (r,) = search([k], db=tmp_path / "t.db", trials=3, seed=3, **FAST).results
    assert r.status == "tuned" and r.n_trials == 3
    flipped = dataclasses.replace(default, atomic_dq=1 - default.atomic_dq)
    assert [cid(cfg) for (_, cfg, *_) in runs.calls[:2]] == [cid(default), cid(flipped)]
    assert {t.config.atomic_dq for t in trials_of(tmp_path / "t.db", k)} == {0, 1}


def test_a_fresh_search_measures_the_heuristic_portfolio_right_after_the_default(tmp_path, monkeypatch):
    """The architecture's heuristic entries for other shapes (heuristics.defaults.portfolio) are
    queued right after the default and its neighbours: only those that validate for the
    key, nearest head dim first, at most a quarter of the budget."""
    monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: 16384)  # in this process
    bf16, fp16 = torch.bfloat16, torch.float16
    fwd, bwd = config_mod.HEURISTICS[(0, 0)]  # the interpreter's table; fp16 keys read bf16's entries
    table = {k: v for k, v in fwd.items() if k[0] != bf16}
    table.update({
        (bf16, 16): fwd[(bf16, 16)],  # the key's default
        (bf16, 16, False): FwdConfig(128, 128, 8, 4),  # 36 KiB of shared memory at D=16: never measured
        (bf16, 32): FwdConfig(16, 32, 4, 1),
        (bf16, 64, "decode"): FwdConfig(64, 16, 8, 2),
        (bf16, 128): FwdConfig(16, 64, 4, 3),  # valid, but past a quarter of the budget
    })
    monkeypatch.setitem(config_mod.HEURISTICS, (0, 0), (table, bwd))
    k = key("fwd", "float16", seq_len=32, causal=True)  # above DECODE_MAX_Q: the plain default
    default = default_config("fwd", 16, fp16, "cpu", causal=True, seq_q=32)
    assert default == fwd[(bf16, 16)]
    neighbours = default_neighbours(default)
    portfolio = [table[(bf16, 32)], table[(bf16, 64, "decode")], table[(bf16, 128)]]
    assert all(_valid(c, dtype=fp16) for c in (default, *neighbours, *portfolio))
    assert not _valid(table[(bf16, 16, False)], dtype=fp16)
    runs = Spy(monkeypatch, "run")
    db, trials = tmp_path / "t.db", 8
    (r,) = search([k], db=db, trials=trials, seed=5, **FAST).results
    assert r.status == "tuned" and r.n_trials == trials
    warm = [cid(c) for c in (default, *neighbours, *portfolio[:trials // 4])]
    # exactly these were queued (the rest came from the sampler), and measured first, in order
    study = journal_study(tmp_path / "optuna-journal.log", study_name(k, kernel_source_hash(), store_id(db)))
    queued = [cid(FwdConfig(**t.system_attrs["fixed_params"])) for t in study.trials
              if "fixed_params" in t.system_attrs]
    assert queued == warm
    measured = [cid(cfg) for (_, cfg, *_) in runs.calls]
    assert measured[:len(warm)] == warm and len(measured) == len(set(measured)) == trials
    assert cid(table[(bf16, 16, False)]) not in measured


@pytest.mark.parametrize("decode", [False, True])
def test_guesses_with_fixed_split_chunks_are_for_decode_keys_only(tmp_path, monkeypatch, decode):
    """A portfolio entry (or another key's winner) with a fixed number of split-KV chunks is a
    decode-sized key's guess: a key of more queries leaves it out of its warm start."""
    split, plain = FwdConfig(16, 16, 4, 1, num_splits=4), FwdConfig(16, 32, 4, 1)
    assert _valid(split, dtype=torch.float16) and _valid(plain, dtype=torch.float16)
    monkeypatch.setattr(key_search, "portfolio", lambda *args, **kwargs: [split, plain])
    k = TuningKey.for_call(key().gpu, "float16", batch=1, heads_q=2, heads_kv=2, seq_q=1 if decode else 32,
                           seq_k=32, head_dim=16, causal=False, pass_="fwd")
    db = tmp_path / "t.db"
    (r,) = search([k], db=db, trials=8, seed=5, **FAST).results
    assert r.status == "tuned"
    study = journal_study(tmp_path / "optuna-journal.log", study_name(k, kernel_source_hash(), store_id(db)))
    queued = [cid(FwdConfig(**t.system_attrs["fixed_params"])) for t in study.trials
              if "fixed_params" in t.system_attrs]
    assert cid(plain) in queued
    assert (cid(split) in queued) == decode


def test_a_time_budget_ends_the_key_early_and_a_rerun_goes_on(tmp_path, monkeypatch):
    runs = Spy(monkeypatch, "run")
    k, db = key("fwd", "float32", seq_len=16, causal=False), tmp_path / "t.db"
    # the first trial alone (a fresh worker builds the key's inputs) takes longer than this
    (r,) = search([k], db=db, trials=50, timeout=0.5, **FAST).results
    assert r.status == "tuned" and r.n_trials == len(runs.calls) == 1
    (r2,) = search([k], db=db, trials=50, timeout=0.5, **FAST).results
    assert r2.status == "tuned" and r2.n_trials == 2  # not "already_tuned": the budget is not spent
    assert max(rows_per_config(db, k).values()) == 1


class _Repeating(optuna.samplers.BaseSampler):
    """Proposes the same few configs over and over (an enqueued trial bypasses it)."""

    def __init__(self, proposals):
        self.proposals = proposals
        self.asked = 0

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        self.asked += 1
        return getattr(self.proposals[trial.number % len(self.proposals)], param_name)


@pytest.mark.parametrize("proposals", ["duplicates", "rejected only"])
def test_repeated_or_rejected_proposals_are_never_measured_and_the_search_still_ends(tmp_path, monkeypatch,
                                                                                   proposals):
    k = key("fwd", "float16", seq_len=32, causal=False)  # above DECODE_MAX_Q: the plain default
    default = default_config("fwd", 16, torch.float16, "cpu", seq_q=32)  # the search's default for the key
    if proposals == "duplicates":
        repeated = [default, *default_neighbours(default)]  # all of them measured by the warm start
    else:
        monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: 2 * 16 * (64 + 2 * 3 * 32))
        repeated = [FwdConfig(256, 128, 8, 4)]
        assert not _valid(repeated[0], dtype=torch.float16) and _valid(default, dtype=torch.float16)
    # no heuristic portfolio in the warm start: with it (the other table entries) the queue
    # alone fills this budget and the sampler is never asked (this test is about the sampler)
    monkeypatch.setattr(key_search, "portfolio", lambda *args, **kwargs: [])
    sampler = _Repeating(repeated)
    monkeypatch.setattr(optuna.samplers, "TPESampler", lambda **kwargs: sampler)
    runs = Spy(monkeypatch, "run")
    db, trials = tmp_path / "t.db", 3
    # the study in an RDB storage this time (any Optuna storage URL works)
    (r,) = search([k], db=db, trials=trials, storage=f"sqlite:///{tmp_path / 'optuna.db'}", **FAST).results
    assert r.status == "tuned" and r.n_trials == trials
    measured = [cid(cfg) for (_, cfg, *_) in runs.calls]
    assert len(measured) == len(set(measured)) == trials  # a config proposed twice is measured once
    assert max(rows_per_config(db, k).values()) == 1
    study = optuna.load_study(study_name=study_name(k, kernel_source_hash(), store_id(db)),
                              storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    reason = "duplicate" if proposals == "duplicates" else "invalid"
    pruned = [t for t in study.trials if t.user_attrs.get("skipped") == reason]
    assert len(pruned) >= 20  # the sampler was stuck, and the search steered it
    assert sampler.asked > 0


def _bad_calls():
    k = key("fwd", "float32")
    other_gpu = TuningKey("NVIDIA H200@sm90", "float32", 16, 16, True, "fwd")
    cases = [
        ("trials", dict(trials=0)), ("trials", dict(trials=-2)), ("trials", dict(trials=2.0)),
        ("trials", dict(trials=True)), ("timeout", dict(timeout=-1)), ("timeout", dict(timeout=0)),
        ("timeout", dict(timeout=math.nan)), ("trial_timeout", dict(trial_timeout=0)),
        ("trial_timeout", dict(trial_timeout=math.inf)), ("rounds", dict(rounds=0)),
        ("finalists", dict(finalists=0)), ("keys", dict(keys=[other_gpu])), ("keys", dict(keys=["fwd"])),
        ("device", dict(device="nonsense")), ("device", dict(device="meta")),
        ("faults", dict(faults=[1])),
    ]
    if not torch.cuda.is_available():
        cases.append(("device", dict(device="cuda")))
        cases.append(("device", dict(device="cuda:0")))
    return [pytest.param(name, dict(dict(keys=[k], trials=3, device="cpu"), **kwargs),
                         id=f"{name}={str(list(kwargs.values())[0])[:24]}") for name, kwargs in cases]


@pytest.mark.parametrize("name, kwargs", _bad_calls())
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, monkeypatch, name, kwargs):
    started = _starts(monkeypatch)
    fresh = tmp_path / "fresh" / "t.db"
    keys = kwargs.pop("keys")
    with pytest.raises(ValueError, match=rf"^{name}: "):
        search(keys, db=fresh, **kwargs)
    assert not fresh.parent.exists()  # no store, no journal

    existing = tmp_path / "existing.db"
    with Store(existing) as store:
        before = store.list_gpus()
    with pytest.raises(ValueError, match=rf"^{name}: "):
        search(keys, db=existing, **kwargs)
    with Store(existing) as store:
        assert store.list_gpus() == before == [] and store.list_results() == []
    assert not (tmp_path / "optuna-journal.log").exists()
    assert started == []


def test_a_directory_as_the_journal_is_refused(tmp_path):
    with pytest.raises(ValueError, match="^storage: .* is a directory"):
        search([key()], db=tmp_path / "t.db", trials=1, device="cpu", storage=tmp_path)
    assert not (tmp_path / "t.db").exists()


def test_batched_proposals_are_precompiled_together_and_measured_once(tmp_path, monkeypatch):
    # Three proposals at a time: each batch goes to the worker's precompile (a no-op under
    # the interpreter), then every config of it is measured once; the budget still holds.
    k = key("fwd", "float32", seq_len=16, causal=True)
    runs = Spy(monkeypatch, "run")
    precompiles = Spy(monkeypatch, "precompile")
    db = tmp_path / "t.db"
    (r,) = search([k], db=db, trials=5, batch=3, **FAST).results
    assert r.status == "tuned" and r.n_trials == 5
    assert len(runs.calls) == 5 and len({cid(cfg) for (_, cfg, *_) in runs.calls}) == 5
    batches = [[cid(c) for c in cfgs] for (_, cfgs, *_) in precompiles.calls]
    assert [len(b) for b in batches] == [3, 2]
    assert [c for b in batches for c in b] == [cid(cfg) for (_, cfg, *_) in runs.calls]
    assert rows_per_config(db, k) == {cid(cfg): 1 for (_, cfg, *_) in runs.calls}
