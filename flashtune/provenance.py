"""Provenance recorded on every stored row and every export file."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

from flashtune._version import __version__
from flashtune.keys import GpuInfo

_KERNEL_DIR = Path(__file__).parent / "kernels"
# The files whose code runs on the GPU (the @triton.jit functions and their launchers). The
# heuristic tables, search space, input checks and reference live beside them and may
# change without making stored results stale. (A change to how a stored config maps to
# a launch, e.g. a config field's default in config.py, shows in the launchers too.)
KERNEL_FILES = ("common.py", "forward.py", "backward.py", "decode.py", "gluon_forward.py", "gluon_backward.py",
                "gluon_backward_wide.py")
# GPU code that no stored result configures, so a change to it makes nothing stale: the
# forward-mode JVP kernel (never tuned; it runs its own defaults or a config given per call).
# A file moves to KERNEL_FILES once the search tunes its kernel (gluon_backward_wide.py did when
# gluon_backward.WIDE_HEAD_DIM opened it to BwdConfig's families, 2026-12-06).
UNTUNED_KERNEL_FILES = ("jvp.py",)


@functools.lru_cache(maxsize=1)
def kernel_source_hash() -> str:
    """sha256 (first 16 hex digits) over the kernel sources: changes when a kernel does."""
    h = hashlib.sha256()
    for name in KERNEL_FILES:
        h.update(name.encode())
        h.update((_KERNEL_DIR / name).read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _installed_triton_version() -> str:
    """Read from the installed metadata (no triton import), once: it scans site-packages."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return ""


def is_current(provenance: "Provenance") -> bool:
    """Whether a row was tuned with this flashtune's kernel sources and this triton."""
    return provenance.kernel_hash == kernel_source_hash() and provenance.triton_version == _installed_triton_version()


def _driver_version() -> str:
    try:
        import torch

        if not torch.cuda.is_available():
            return ""
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        lib.cuDriverGetVersion(ctypes.byref(v))
        # the kernel-mode driver version (e.g. 580.159) is what nvidia-smi shows; the
        # CUDA driver API version is what we can read without it.
        return f"cuda-driver-api {v.value // 1000}.{(v.value % 1000) // 10}"
    except Exception:  # noqa: BLE001 - provenance is best effort
        return ""


@dataclasses.dataclass(frozen=True)
class Provenance:
    flashtune_version: str
    kernel_hash: str
    triton_version: str
    torch_version: str
    cuda_version: str
    driver_version: str
    gpu_name: str
    capability: str
    sm_count: int


def current_provenance(device=None) -> Provenance:
    import torch
    import triton

    gpu = GpuInfo.from_device(device)
    return Provenance(
        flashtune_version=__version__,
        kernel_hash=kernel_source_hash(),
        triton_version=triton.__version__,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda or "",
        driver_version=_driver_version(),
        gpu_name=gpu.name,
        capability=f"{gpu.capability[0]}.{gpu.capability[1]}",
        sm_count=gpu.sm_count,
    )
