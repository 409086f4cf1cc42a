"""search() under the interpreter: trials and winners in a fresh SQLite store."""

from __future__ import annotations

import io
import itertools

import pytest
import torch
from autotuner_helpers import GPU, cid, journal_study, key, store_id, trials_of
from rich.console import Console

from flashtune.autotuner import build_keys, search, study_name
from flashtune.autotuner.study import default_storage_path
from flashtune.cli._progress import ProgressBar
from flashtune.protocol import flops, trial_shape
from flashtune.heuristics.defaults import default_config
from flashtune.configs.space import SPACES
from flashtune.keys import TuningKey
from flashtune.provenance import kernel_source_hash
from flashtune.store import TRIAL_STATUSES, Store

TRIALS = 4
KEYS = build_keys(GPU, head_dims=[16], dtypes=["float32"], seq_lens=[16], causal=[False, True],
                  passes=["fwd", "bwd"])


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One search over fwd/bwd x causal both, with the progress bar on a non-terminal console."""
    root = tmp_path_factory.mktemp("e2e")
    db = root / "store" / "tuned.db"
    db.parent.mkdir()
    out = io.StringIO()
    with ProgressBar(Console(file=out, force_terminal=False, width=200)) as bar:
        summary = search(KEYS, db=db, trials=TRIALS, device="cpu", trial_timeout=120, finalists=2, rounds=2,
                         progress=bar)
    return db, summary, out.getvalue()


def test_build_keys_is_the_full_product():
    keys = build_keys(GPU, head_dims=[16, 64], dtypes=["float16", "float32"], seq_lens=[16, 32, 64],
                      causal=[False, True], passes=["fwd", "bwd"])
    assert len(keys) == 2 * 2 * 3 * 2 * 2 == len(set(keys))
    assert set(keys) == {TuningKey(GPU, dt, d, n, c, p) for d, dt, n, c, p in
                         itertools.product([16, 64], ["float16", "float32"], [16, 32, 64], [False, True],
                                           ["fwd", "bwd"])}
    assert build_keys(GPU, head_dims=[16], dtypes=["float16"], seq_lens=[16]) == [
        key(p, "float16", 16, c) for p in ("fwd", "bwd") for c in (False, True)]  # defaults: both passes and modes
    with pytest.raises(ValueError, match="dtype"):
        build_keys(GPU, head_dims=[16], dtypes=["float8"], seq_lens=[16])


def test_every_key_is_tuned_with_its_trials(searched):
    db, summary, _ = searched
    assert summary.interpreter
    assert [r.key for r in summary.results] == KEYS
    for r in summary.results:
        assert r.status == "tuned", r
        assert r.n_trials == TRIALS
        assert sum(r.outcomes.values()) == TRIALS
        assert r.timer == "interpreter-wall-clock"
        assert r.shape == trial_shape(r.key, interpreter=True)
        rows = trials_of(db, r.key)
        assert len(rows) == TRIALS
        assert len({cid(t.config) for t in rows}) == TRIALS  # no config measured twice
        assert all(t.status in TRIAL_STATUSES for t in rows)
        assert {t.status for t in rows} == set(r.outcomes)
        for t in rows:
            assert t.kernel_hash == kernel_source_hash()
            assert (t.time_ms is not None and t.time_ms > 0) == (t.status == "ok")


def test_the_winner_is_an_ok_trial_and_carries_the_default_time(searched):
    db, summary, _ = searched
    with Store(db) as store:
        table = store.load_table(GPU)
    assert set(table) == set(KEYS)
    for r in summary.results:
        stored = table[r.key]
        ok = {cid(t.config) for t in trials_of(db, r.key) if t.status == "ok"}
        assert cid(stored.config) in ok
        assert cid(r.winner) == cid(stored.config)
        assert stored.time_ms == r.time_ms > 0
        # the default config is always measured first, so the speed-up exists, from one run
        assert stored.default_time_ms is not None and stored.default_time_ms == r.default_time_ms
        assert r.speedup == pytest.approx(stored.default_time_ms / stored.time_ms) == stored.speedup
        assert r.speedup >= 1.0  # the default was a finalist, and the winner has the best median
        b, h, _ = trial_shape(r.key, interpreter=True)
        assert stored.tflops == pytest.approx(flops(r.key, b, h) / stored.time_ms * 1e-9)
        assert stored.n_trials == TRIALS
        assert 0 <= stored.error <= 1
        assert stored.gpu.key == GPU


def test_study_names_are_stable_and_live_in_the_journal_next_to_the_store(searched):
    db, summary, _ = searched
    journal = db.parent / "optuna-journal.log"
    with Store(db) as store:
        assert summary.storage == str(journal) == str(default_storage_path(store.url))
    import optuna

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    sid = store_id(db)
    names = {study_name(k, kernel_source_hash(), sid) for k in KEYS}
    assert set(optuna.get_all_study_names(storage)) == names
    assert len(names) == len(KEYS)
    for k in KEYS:
        name = study_name(k, kernel_source_hash(), sid)
        assert name == study_name(TuningKey(*[getattr(k, f) for f in ("gpu", "dtype", "head_dim", "seq_q",
                                                                          "causal", "pass_")]), kernel_source_hash(),
                                  sid)
        assert {t.study for t in trials_of(db, k)} == {name}
        study = journal_study(journal, name)
        assert study.user_attrs["finalized_trials"] == TRIALS
        told = [t for t in study.trials if "status" in t.user_attrs]
        assert len(told) == TRIALS
        cls = SPACES[k.pass_][0]
        assert {cid(t.config) for t in trials_of(db, k)} == {cid(cls(**t.params)) for t in told}
    assert study_name(KEYS[0], "a") != study_name(KEYS[0], "b")  # a kernel change starts a new study
    assert study_name(KEYS[0], "a", sid) != study_name(KEYS[0], "a", "0" * 32)  # so does another store


def test_the_progress_bar_reports_on_a_plain_console(searched):
    _, _, text = searched
    assert "done" in text
    assert KEYS[-1].label() in text


def test_a_finished_search_is_skipped_when_run_again(searched, monkeypatch, capsys):
    from flashtune.autotuner import worker as worker_mod

    db, first, _ = searched
    started = []
    original = worker_mod.TrialWorker._start
    monkeypatch.setattr(worker_mod.TrialWorker, "_start", lambda self: started.append(1) or original(self))
    before = {k: len(trials_of(db, k)) for k in KEYS}
    again = search(KEYS, db=db, trials=TRIALS, device="cpu")
    assert [r.status for r in again.results] == ["already_tuned"] * len(KEYS)
    assert not started  # no worker, no trial
    assert {k: len(trials_of(db, k)) for k in KEYS} == before
    for r, f in zip(again.results, first.results):
        assert r.n_trials == TRIALS
        assert cid(r.winner) == cid(f.winner) and r.time_ms == f.time_ms
        assert r.default_time_ms == f.default_time_ms
    assert capsys.readouterr().out == ""  # without a progress callback the library prints nothing
    # a terminal console with the bar on works as well
    out = io.StringIO()
    with ProgressBar(Console(file=out, force_terminal=True, width=80)) as bar:
        search(KEYS[:1], db=db, trials=TRIALS, device="cpu", progress=bar)
    assert "done" in out.getvalue()


def test_a_timeout_that_runs_out_at_once_still_measures_the_keys_first_config(tmp_path):
    """--timeout running out before the first config was measured (a cold compile) must not
    leave a key with nothing: its first config (the default) is measured and stored, the key
    is not done for the budget, and the next run measures the rest."""
    db = tmp_path / "tuned.db"
    first = search(KEYS[:1], db=db, trials=3, device="cpu", timeout=1e-9, finalists=1, rounds=1)
    (r,) = first.results
    assert (r.status, r.n_trials) == ("tuned", 1)
    with Store(db) as store:
        (stored,) = store.load_table(GPU).values()
    assert stored.config.canonical() == default_config(KEYS[0].pass_, KEYS[0].head_dim, torch.float32, "cpu",
                                                       causal=KEYS[0].causal, seq_q=KEYS[0].seq_q).canonical()
    (again,) = search(KEYS[:1], db=db, trials=3, device="cpu", finalists=1, rounds=1).results
    assert again.status == "tuned" and again.n_trials == 3


def test_a_timeout_that_runs_out_at_once_still_measures_the_keys_first_batch(tmp_path):
    """The configs of a key's first batch are compiled together (in parallel on a GPU): a cold
    compile can eat the whole timeout, after which each compiled config costs its timing alone,
    so the whole first batch is measured; no second batch starts."""
    (r,) = search(KEYS[:1], db=tmp_path / "tuned.db", trials=6, device="cpu", timeout=1e-9, finalists=1,
                  rounds=1, batch=3).results
    assert (r.status, r.n_trials) == ("tuned", 3)


def test_a_keys_call_shape_is_what_its_trials_run_and_a_foreign_one_is_refused(tmp_path):
    k = TuningKey.for_call(GPU, "float32", batch=3, heads_q=2, heads_kv=1, seq_q=16, seq_k=16, head_dim=16,
                           causal=False, pass_="fwd")
    assert k.trial_shape(interpreter=True) != (3, 2, 1)
    (r,) = search([k], db=tmp_path / "t.db", trials=1, device="cpu", finalists=1, rounds=1,
                  shapes={k: (3, 2, 1)}).results
    assert (r.status, r.shape) == ("tuned", (3, 2, 1))
    for bad, message in (({k: (1, 2, 1)}, "is not of this key"), ({k: (3, 2)}, "expected \\(batch, heads_q"),
                         ({KEYS[0]: (1, 2, 2)}, "not one of the keys searched"), ([k], "expected a mapping")):
        with pytest.raises(ValueError, match=f"shapes.*{message}"):
            search([k], db=tmp_path / "bad.db", trials=1, device="cpu", shapes=bad)
    assert not (tmp_path / "bad.db").exists()  # refused before the store was touched
