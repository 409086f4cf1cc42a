"""``Store.save_result(replace=True, replacing=FOUND)``, what a search's final save does: the
result it found (and re-checked) is replaced, even by a slower one; a result written since it
was found (an import, another search) stays where it is faster (SQLite and PostgreSQL)."""

from __future__ import annotations

from flashtune.configs.forward import FwdConfig
from flashtune.keys import GpuInfo, TuningKey
from flashtune.provenance import current_provenance
from flashtune.store import StoredResult

K = TuningKey(GpuInfo.interpreter().key, "float32", 16, 16, True, "fwd")
A, B = FwdConfig(16, 16, 4, 1), FwdConfig(32, 16, 4, 1)


def _result(config, time_ms: float) -> StoredResult:
    return StoredResult(key=K, config=config, time_ms=time_ms, tflops=1.0, default_time_ms=None, error=0.0,
                        n_trials=1, gpu=GpuInfo.interpreter(), provenance=current_provenance(None))


def _held(store) -> tuple:
    (r,) = store.list_results()
    return r.config, r.time_ms


def test_only_the_result_found_is_replaced(store):
    store.upsert_gpu(GpuInfo.interpreter())
    assert store.save_result(_result(A, 2.0), replace=True, replacing=None)  # none found, none there
    found = store.list_results()[0]
    assert store.save_result(_result(B, 5.0), replace=True, replacing=found)  # the row it found: slower goes in
    assert _held(store) == (B, 5.0)
    found = store.list_results()[0]
    store.import_results([_result(A, 1.0)], on_conflict="replace")  # written after it was found
    assert not store.save_result(_result(B, 3.0), replace=True, replacing=found)
    assert _held(store) == (A, 1.0)
    assert store.save_result(_result(B, 0.5), replace=True, replacing=found)  # faster than it: it goes in
    assert _held(store) == (B, 0.5)
    assert not store.save_result(_result(A, 9.0), replace=True, replacing=None)  # one came meanwhile
    assert _held(store) == (B, 0.5)
    assert store.save_result(_result(A, 9.0), replace=True)  # without ``replacing``: whatever is stored
    assert _held(store) == (A, 9.0)
