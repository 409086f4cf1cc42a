"""Sample tuned results for the exchange and CLI tests (plain functions).

The results carry this flashtune's kernel source hash and the installed triton's version unless
told otherwise, so they are current (served, not stale). Times are exact binary fractions, so any
formatting of them is stable.
"""

from __future__ import annotations

import dataclasses

from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig
from flashtune.keys import GpuInfo, TuningKey
from flashtune.provenance import Provenance, installed_triton_version, kernel_source_hash
from flashtune.store import StoredResult

H200 = GpuInfo("NVIDIA H200", (9, 0), 132, 150_754_820_096)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0), 108, 85_899_345_920)
TRITON = installed_triton_version()


def provenance(gpu: GpuInfo = H200, kernel_hash: str | None = None, triton: str = TRITON) -> Provenance:
    return Provenance(
        flashtune_version="0.1.0", kernel_hash=kernel_source_hash() if kernel_hash is None else kernel_hash,
        triton_version=triton, torch_version="2.11.0+cu130", cuda_version="13.0",
        driver_version="cuda-driver-api 13.0", gpu_name=gpu.name,
        capability=f"{gpu.capability[0]}.{gpu.capability[1]}", sm_count=gpu.sm_count,
    )


def key(seq_len: int = 1024, *, gpu: GpuInfo = H200, dtype: str = "bfloat16", head_dim: int = 64,
        causal: bool = True, pass_: str = "fwd") -> TuningKey:
    return TuningKey(gpu.key, dtype, head_dim, seq_len, causal, pass_)


def result(k: TuningKey, time_ms: float = 0.25, *, gpu: GpuInfo | None = None, block: int = 64,
           kernel_hash: str | None = None, default_time_ms: float | None = -1.0, triton: str = TRITON) -> StoredResult:
    gpu = gpu or (A100 if k.gpu == A100.key else H200)
    config = FwdConfig(block, 32, 4, 3) if k.pass_ == "fwd" else BwdConfig(32, block, block, 32, 8, 2)
    return StoredResult(
        key=k, config=config, time_ms=time_ms, tflops=512.5,
        default_time_ms=2.0 * time_ms if default_time_ms == -1.0 else default_time_ms,
        error=0.125, n_trials=16, gpu=gpu, provenance=provenance(gpu, kernel_hash, triton),
    )


def table() -> list[StoredResult]:
    """Six results over two GPUs: both passes, two seq lens, causal and full, one without a default time."""
    return [
        result(key(1024), 0.25),
        result(key(2048), 0.75, block=128),
        result(key(1024, pass_="bwd"), 0.5),
        result(key(1024, causal=False, head_dim=128, dtype="float16"), 0.375, default_time_ms=None),
        result(key(512, gpu=A100), 0.125),
        result(key(512, gpu=A100, pass_="bwd"), 0.625, block=32),
    ]


def without_timestamps(results) -> list[StoredResult]:
    return [dataclasses.replace(r, created_at=None, updated_at=None) for r in results]


def snapshot(store) -> tuple:
    """Everything an import may change, comparable with ==."""
    return tuple(without_timestamps(store.list_results())), tuple(store.list_gpus())
