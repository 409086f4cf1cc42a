"""The repository API on SQLite and PostgreSQL: results, trials, GPUs, filters, validation."""

from __future__ import annotations

import dataclasses
import math
from datetime import timezone

import pytest
import sqlalchemy as sa
from store_samples import A100, H200, config_for, key, provenance, result

from flashtune.outcome import Outcome
from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig
from flashtune.runners import RunnerTime
from flashtune.store import ImportSummary, ResultFilter, Store, StoreError


def _count(url: str, table: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
    finally:
        engine.dispose()


def _execute(url: str, sql: str, **params) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text(sql), params)
    finally:
        engine.dispose()


# -- tuned results ------------------------------------------------------------------------


def test_save_result_round_trips_every_field(store):
    saved = result(key(pass_="bwd"), 0.75)
    assert store.save_result(saved) is True
    [loaded] = store.list_results()
    assert dataclasses.replace(loaded, created_at=None, updated_at=None) == saved
    assert isinstance(loaded.config, BwdConfig)
    assert loaded.created_at.tzinfo == timezone.utc and loaded.updated_at >= loaded.created_at
    assert loaded.speedup == pytest.approx(2.0)


def test_a_raced_result_keeps_both_times_and_what_chose_its_runner(store, db_url):
    raced = dataclasses.replace(result(key(512)), runner="sdpa-cudnn", chosen_by="host-bound",
                                runner_times={"triton": RunnerTime(0.25, 0.34), "sdpa-cudnn": RunnerTime(0.3, 0.2)})
    store.save_result(raced)
    [loaded] = store.list_results()
    assert dataclasses.replace(loaded, created_at=None, updated_at=None) == raced
    # a row written before runners had both times holds {runner: ms}: read as GPU times
    _execute(db_url, "UPDATE flashtune_tuned_results SET runner_times = :times",
             times='{"triton": 0.25, "sdpa-cudnn": 0.125}')
    [old] = store.list_results()
    assert (old.runner, old.chosen_by) == ("sdpa-cudnn", None)
    assert old.runner_times == {"triton": RunnerTime(0.25, None), "sdpa-cudnn": RunnerTime(0.125, None)}
    _execute(db_url, "UPDATE flashtune_tuned_results SET runner_times = :times",
             times='{"triton": 0.25, "sdpa-cudnn": {"gpu_ms": 0.2, "eager": 0.3}}')
    with pytest.raises(StoreError, match=r"runner_times\[sdpa-cudnn\]: expected milliseconds or"):
        store.list_results()


def test_a_gluon_config_is_stored_whatever_the_host(store):
    """A Gluon forward config (family=1) runs on sm_90 only; the store checks it against
    sm_90's limits, not the host's device (a CPU-only host imports an H200's table)."""
    saved = dataclasses.replace(result(key(head_dim=128)), config=FwdConfig(64, 128, 4, 2, num_splits=1, pack_gqa=0,
                                                                            family=1))
    assert store.save_result(saved) is True
    [loaded] = store.list_results()
    assert loaded.config == saved.config and loaded.config.family == 1


@pytest.mark.parametrize("family", [1, 2])
def test_a_gluon_bwd_config_is_stored_whatever_the_host(store, family):
    """The Gluon backward's families (BwdConfig family 1 and 2) likewise: checked against
    sm_90's limits, stored, loaded as they were; one that sm_90 cannot run is refused."""
    cfg = BwdConfig(64, 64, 128, 64, 4, 3, 8, 3, family=family)
    saved = dataclasses.replace(result(key(head_dim=128, pass_="bwd")), config=cfg)
    assert store.save_result(saved) is True
    [loaded] = store.list_results()
    assert loaded.config == cfg and loaded.config.family == family
    with pytest.raises(ValueError, match="BLOCK_N"):  # 2 x 64 keys a CTA: BLOCK_N1 64 only
        store.save_result(dataclasses.replace(saved, config=BwdConfig(64, 128, 128, 64, 4, 3, family=family)),
                          replace=True)
    assert [r.config for r in store.list_results()] == [cfg]


def test_save_result_keeps_the_faster_unless_replace(store):
    k = key()
    assert store.save_result(result(k, 1.0, block=64))
    assert store.save_result(result(k, 1.5, block=128)) is False  # slower: the stored one stays
    assert store.load_table(H200)[k].config == FwdConfig(64, 32, 4, 3)
    assert store.save_result(result(k, 0.5, block=128)) is True  # faster: replaces
    first = store.load_table(H200)[k]
    assert (first.time_ms, first.config.BLOCK_M) == (0.5, 128)
    assert store.save_result(result(k, 3.0, block=16), replace=True) is True  # forced
    last = store.load_table(H200)[k]
    assert (last.time_ms, last.config.BLOCK_M) == (3.0, 16)
    assert last.created_at == first.created_at and last.updated_at > first.updated_at
    assert len(store.list_results()) == 1


def test_load_table_is_one_gpu_by_key(store):
    keys = [key(n) for n in (512, 1024)] + [key(1024, pass_="bwd")]
    for i, k in enumerate(keys):
        store.save_result(result(k, 1.0 + i))
    store.save_result(result(key(1024, gpu=A100), 9.0, gpu=A100))
    table = store.load_table(H200.key)
    assert sorted(table) == sorted(keys)
    assert all(table[k].key == k for k in keys)
    assert store.load_table(H200) == table
    assert list(store.load_table(A100)) == [key(1024, gpu=A100)]
    assert store.load_table("unknown GPU@sm00") == {}


def test_list_and_delete_filter_on_every_key_field(store):
    keys = [key(n, dtype=d, head_dim=h, causal=c, pass_=p)
            for n in (256, 2048) for d in ("float16", "bfloat16") for h in (64, 128)
            for c in (False, True) for p in ("fwd", "bwd")]
    store.import_results(result(k) for k in keys)
    store.save_result(result(key(gpu=A100), gpu=A100))
    assert len(store.list_results()) == len(keys) + 1
    assert [r.key for r in store.list_results(ResultFilter(gpu=A100.key))] == [key(gpu=A100)]
    chosen = ResultFilter(gpu=H200.key, dtype="float16", head_dim=128, seq_q=2048, causal=True, pass_="bwd")
    assert [r.key for r in store.list_results(chosen)] == [key(2048, dtype="float16", head_dim=128, pass_="bwd")]
    listed = store.list_results(ResultFilter(causal=False, pass_="fwd"))
    assert {(r.key.causal, r.key.pass_) for r in listed} == {(False, "fwd")} and len(listed) == len(keys) // 4

    assert store.delete_results(ResultFilter(dtype="float16", seq_q=256)) == len(keys) // 4
    left = store.list_results()
    assert len(left) == len(keys) - len(keys) // 4 + 1
    assert not [r for r in left if r.key.dtype == "float16" and r.key.seq_q == 256]
    assert store.delete_results(ResultFilter(gpu="no such GPU@sm00")) == 0
    assert store.delete_results(ResultFilter()) == len(left)
    assert store.list_results() == []


def test_filter_rejects_unknown_dtype_and_pass():
    with pytest.raises(ValueError, match="dtype"):
        ResultFilter(dtype="fp16")
    with pytest.raises(ValueError, match="pass"):
        ResultFilter(pass_="forward")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"time_ms": 0.0}, "time_ms"),
        ({"time_ms": math.nan}, "time_ms"),
        ({"tflops": -1.0}, "tflops"),
        ({"default_time_ms": -2.0}, "default_time_ms"),
        ({"error": math.inf}, "error"),
        ({"n_trials": -1}, "n_trials"),
        ({"config": BwdConfig(32, 64, 64, 32, 4, 2)}, "config"),  # a bwd config on a fwd key
        ({"config": FwdConfig(64, 48, 4, 2)}, "BLOCK_N"),
        ({"config": FwdConfig(32, 128, 4, 2, family=1)}, "BLOCK_M"),  # the Gluon kernel: 64 or 128 rows
        ({"config": FwdConfig(64, 128, 4, 2, family=1), "key": key(dtype="float32")}, "dtype"),
        ({"gpu": A100}, "gpu"),
    ],
)
def test_save_result_rejects_bad_values_and_writes_nothing(store, db_url, change, field):
    bad = dataclasses.replace(result(key()), **change)
    with pytest.raises(ValueError, match=field):
        store.save_result(bad)
    assert store.list_results() == [] and store.list_gpus() == []


def test_import_is_all_or_nothing(store):
    store.save_result(result(key(512), 1.0))
    batch = [result(key(n), 0.5) for n in (256, 512, 1024)]
    with pytest.raises(StoreError, match="already has a result"):
        store.import_results(batch)  # on_conflict="error": the 512 row exists
    assert [r.key.seq_q for r in store.list_results()] == [512]
    with pytest.raises(ValueError, match="appears twice"):
        store.import_results([result(key(256)), result(key(256))])
    with pytest.raises(ValueError, match=r"results\[1\].*time_ms"):
        store.import_results([result(key(256)), result(key(2048), -1.0)])
    with pytest.raises(ValueError, match="on_conflict"):
        store.import_results(batch, on_conflict="merge")
    assert [r.key.seq_q for r in store.list_results()] == [512]


@pytest.mark.parametrize(
    "on_conflict, summary, stored_512",
    [
        ("skip", ImportSummary(inserted=2, kept=2), 1.0),
        ("replace", ImportSummary(inserted=2, replaced=2), 2.0),
        ("keep_faster", ImportSummary(inserted=2, replaced=1, kept=1), 0.25),
    ],
)
def test_import_conflict_policies(store, on_conflict, summary, stored_512):
    store.import_results([result(key(512), 1.0), result(key(2048), 0.5)])
    batch = [result(key(256), 1.0), result(key(512), 2.0 if on_conflict != "keep_faster" else 0.25),
             result(key(1024), 1.0), result(key(2048), 2.0)]
    assert store.import_results(batch, on_conflict=on_conflict) == summary
    table = store.load_table(H200)
    assert len(table) == 4 and table[key(512)].time_ms == stored_512
    assert table[key(2048)].time_ms == (2.0 if on_conflict == "replace" else 0.5)


def test_import_records_new_gpus(store):
    store.import_results([result(key(gpu=A100), gpu=A100)])
    assert store.list_gpus() == [A100]


# -- GPUs ---------------------------------------------------------------------------------


def test_upsert_gpu_updates_in_place(store):
    store.upsert_gpu(H200)
    store.upsert_gpu(A100)
    changed = dataclasses.replace(H200, sm_count=66)
    store.upsert_gpu(changed)
    assert store.list_gpus() == [A100, changed]


# -- trials -------------------------------------------------------------------------------


def test_record_trial_round_trips_and_filters_by_kernel_hash(store):
    store.upsert_gpu(H200)
    k = key(pass_="bwd")
    ok = store.record_trial(k, config_for("bwd", 64), Outcome("ok", time_ms=0.8, error=2e-3), provenance=provenance(),
                            study="search-1")
    failed = store.record_trial(k, config_for("bwd", 128),
                                Outcome("out_of_resources", message="shared memory 300000 > 232448"),
                                provenance=provenance())
    nan = store.record_trial(k, config_for("bwd", 32), Outcome("incorrect", time_ms=0.5, error=math.nan),
                             provenance=provenance(kernel_hash="fedcba"))
    store.record_trial(key(pass_="fwd"), config_for("fwd"), Outcome("timeout"), provenance=provenance())
    trials = store.trials_for(k)
    assert [t.id for t in trials] == [ok, failed, nan]
    first = trials[0]
    assert (first.key, first.config, first.status, first.time_ms, first.error, first.study, first.kernel_hash) == (
        k, config_for("bwd", 64), "ok", 0.8, 2e-3, "search-1", "0123456789abcdef")
    assert first.triton_version == "3.6.0" and first.created_at.tzinfo == timezone.utc
    assert trials[1].message == "shared memory 300000 > 232448" and trials[1].time_ms is None
    assert trials[2].error == math.inf  # NaN in the output is stored as an infinite error
    assert [t.id for t in store.trials_for(k, kernel_hash="fedcba")] == [nan]
    assert store.trials_for(key(4096)) == []


@pytest.mark.parametrize(
    "status, kwargs, field",
    [
        ("fast", {}, "status"),
        ("ok", {}, "time_ms"),
        ("ok", {"time_ms": -1.0}, "time_ms"),
        ("incorrect", {"time_ms": 1.0, "error": -0.5}, "error"),
        ("ok", {"time_ms": 1.0, "config": BwdConfig(32, 64, 64, 32, 4, 2)}, "config"),
    ],
)
def test_record_trial_rejects_bad_values(store, db_url, status, kwargs, field):
    store.upsert_gpu(H200)
    kwargs = dict(kwargs)  # the parameters are shared by both backends' runs
    config = kwargs.pop("config", config_for("fwd"))
    with pytest.raises(ValueError, match=field):
        store.record_trial(key(), config, Outcome(status, **kwargs), provenance=provenance())
    assert _count(db_url, "flashtune_trials") == 0


def test_record_trial_needs_a_recorded_gpu(store, db_url):
    with pytest.raises(StoreError, match=r"upsert_gpu"):
        store.record_trial(key(), config_for("fwd"), Outcome("ok", time_ms=1.0), provenance=provenance())
    assert _count(db_url, "flashtune_trials") == 0


# -- what the database itself enforces ------------------------------------------------------


def test_a_row_with_a_bad_config_is_rejected_on_load(store, db_url):
    store.save_result(result(key(512)))
    store.save_result(result(key(1024)))
    _execute(db_url, "UPDATE flashtune_tuned_results SET config = :config WHERE seq_q = 1024",
             config='{"BLOCK_M": 48, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3}')
    with pytest.raises(StoreError, match=r"tuned result #\d+ \(fwd bfloat16 d64 n1024 causal on NVIDIA H200@sm90\) "
                                         r"has an invalid config .*BLOCK_M"):
        store.load_table(H200)
    store.upsert_gpu(H200)
    store.record_trial(key(), config_for("fwd"), Outcome("crashed"), provenance=provenance())
    _execute(db_url, "UPDATE flashtune_trials SET config = :config", config='{"BLOCK_M": 64}')
    with pytest.raises(StoreError, match=r"trial #\d+ .* has an invalid config .*missing fields"):
        store.trials_for(key())


@pytest.mark.parametrize(
    "table, column, value",
    [
        ("flashtune_tuned_results", "dtype", "fp8"),
        ("flashtune_tuned_results", '"pass"', "both"),
        ("flashtune_tuned_results", "time_ms", -1.0),
        ("flashtune_trials", "status", "great"),
        ("flashtune_trials", "time_ms", None),  # an ok trial without a time
    ],
)
def test_check_constraints_hold_in_the_database(store, db_url, table, column, value):
    store.save_result(result(key()))
    store.upsert_gpu(H200)
    store.record_trial(key(), config_for("fwd"), Outcome("ok", time_ms=1.0), provenance=provenance())
    with pytest.raises(sa.exc.IntegrityError):
        _execute(db_url, f"UPDATE {table} SET {column} = :value", value=value)


def test_store_shares_a_database_with_optuna(db_url):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=db_url, study_name="fwd-search")
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    with Store(db_url) as store:
        store.save_result(result(key()))
        assert list(store.load_table(H200)) == [key()]
    assert len(optuna.load_study(study_name="fwd-search", storage=db_url).trials) == 2
