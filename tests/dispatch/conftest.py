"""Dispatcher tests: a real store in a temporary directory, a clean dispatcher per test.

Without CUDA the kernels run under Triton's interpreter on CPU tensors (tests/conftest.py
turns it on before triton is imported; the line below covers a run started here), and
the CPU's tuning key is the interpreter's, "triton-interpreter@sm00".
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from flashtune import dispatch  # noqa: E402  (imports triton: after the env set-up)
from flashtune.keys import GpuInfo, TuningKey  # noqa: E402
from flashtune.provenance import current_provenance  # noqa: E402
from flashtune.store import Store, StoredResult  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dispatcher(tmp_path, monkeypatch):
    """No test touches the user's store, and each starts with no cached table or warning."""
    monkeypatch.setenv("FLASHTUNE_DB", str(tmp_path / "default-store" / "tuned.db"))
    monkeypatch.setattr(dispatch, "_TABLES", {})
    monkeypatch.setattr(dispatch, "_WARNED", set())
    torch.manual_seed(20261129)


@pytest.fixture
def gpu() -> GpuInfo:
    """The GPU of this machine's tensors: the interpreter's without CUDA."""
    return GpuInfo.from_device(None)


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "tuned.db"


@pytest.fixture
def write(db_path, gpu):
    """``write(seq_len, pass_, config, dtype=..., head_dim=..., causal=..., kernel_hash=..., on=GPU,
    seq_k=..., group=..., batch_heads=..., runner=..., runner_times=..., chosen_by=...)`` stores one
    winner (for this machine's GPU by default; a grid key unless seq_k, group or batch_heads say
    otherwise), replacing any stored for its key.
    The store stays open between writes; ``write.close()`` closes it."""
    stores = []

    def write(seq_len: int, pass_: str, config, *, dtype: str = "float32", head_dim: int = 16,
              causal: bool = False, kernel_hash: str | None = None, on: GpuInfo | None = None,
              runner: str = "triton", runner_times=None, chosen_by: str | None = None, seq_k: int = 0,
              group: int = 1, batch_heads: int = 0) -> StoredResult:
        on = on or gpu
        provenance = dataclasses.replace(current_provenance(), gpu_name=on.name, sm_count=on.sm_count,
                                         capability=f"{on.capability[0]}.{on.capability[1]}")
        if kernel_hash is not None:
            provenance = dataclasses.replace(provenance, kernel_hash=kernel_hash)
        key = TuningKey(on.key, dtype, head_dim, seq_len, causal, pass_, seq_k=seq_k, group=group,
                        batch_heads=batch_heads)
        result = StoredResult(key=key, config=config,
                              time_ms=1.0, tflops=1.0, default_time_ms=2.0, error=0.0, n_trials=3, gpu=on,
                              provenance=provenance, runner=runner,
                              runner_times=runner_times if runner_times is not None or runner == "triton"
                              else {"triton": 1.0, runner: 0.5}, chosen_by=chosen_by)
        if not stores:
            stores.append(Store(db_path))
        stores[0].save_result(result, replace=True)
        return result

    def close() -> None:
        while stores:
            stores.pop().close()

    write.close = close
    yield write
    close()


@pytest.fixture
def tuned_elsewhere(write):
    """A store whose only row (head_dim 128) no test shape uses: it loads without a warning."""
    from flashtune.kernels import FwdConfig

    write(1024, "fwd", FwdConfig(64, 64, 4, 2), head_dim=128)
