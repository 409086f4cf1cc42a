"""Sample GPUs, keys, provenance and results for the store tests (plain functions, so
that worker processes can use them too)."""

from __future__ import annotations

from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig
from flashtune.keys import GpuInfo, TuningKey
from flashtune.provenance import Provenance
from flashtune.store import StoredResult

H200 = GpuInfo("NVIDIA H200", (9, 0), 132, 150_754_820_096)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0), 108, 85_899_345_920)


def provenance(gpu: GpuInfo = H200, kernel_hash: str = "0123456789abcdef") -> Provenance:
    return Provenance(
        flashtune_version="0.1.0", kernel_hash=kernel_hash, triton_version="3.6.0", torch_version="2.13.0",
        cuda_version="12.8", driver_version="cuda-driver-api 13.0", gpu_name=gpu.name,
        capability=f"{gpu.capability[0]}.{gpu.capability[1]}", sm_count=gpu.sm_count,
    )


def key(seq_len: int = 1024, *, gpu: GpuInfo = H200, dtype: str = "bfloat16", head_dim: int = 64,
        causal: bool = True, pass_: str = "fwd") -> TuningKey:
    return TuningKey(gpu.key, dtype, head_dim, seq_len, causal, pass_)


def config_for(pass_: str, block: int = 64):
    return FwdConfig(block, 32, 4, 3) if pass_ == "fwd" else BwdConfig(32, block, block, 32, 4, 2)


def result(k: TuningKey, time_ms: float = 1.0, *, gpu: GpuInfo = H200, block: int = 64,
           kernel_hash: str = "0123456789abcdef") -> StoredResult:
    return StoredResult(
        key=k, config=config_for(k.pass_, block), time_ms=time_ms, tflops=123.5, default_time_ms=2.0 * time_ms,
        error=1e-3, n_trials=40, gpu=gpu, provenance=provenance(gpu, kernel_hash),
    )
