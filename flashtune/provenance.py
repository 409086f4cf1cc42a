"""Provenance recorded on every stored row and every export file."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

from flashtune._version import __version__
from flashtune.keys import GpuInfo

_PACKAGE = Path(__file__).parent
# The sources whose code runs on the GPU or decides how a stored config maps to a launch: the
# kernels of both families, their shared pieces, the one module that picks a family, and the
# config types. The heuristic tables, search space, input checks and reference may change without
# making stored results stale. The forward-mode JVP kernel is left out: no stored result configures it.
KERNEL_SOURCES = ("kernels/common.py", "kernels/schedule.py", "kernels/passes.py", "kernels/triton/*.py",
                  "kernels/gluon/*.py", "configs/base.py", "configs/forward.py", "configs/backward.py",
                  "configs/gluon.py")
UNTUNED_KERNEL_SOURCES = ("kernels/triton/jvp.py",)


def kernel_files() -> list[Path]:
    """The files kernel_source_hash reads, in a fixed order."""
    files = {f for pattern in KERNEL_SOURCES for f in _PACKAGE.glob(pattern)}
    files -= {_PACKAGE / name for name in UNTUNED_KERNEL_SOURCES}
    return sorted(files)


@functools.lru_cache(maxsize=1)
def kernel_source_hash() -> str:
    """sha256 (first 16 hex digits) over the kernel sources: changes when a kernel does."""
    h = hashlib.sha256()
    for path in kernel_files():
        h.update(path.relative_to(_PACKAGE).as_posix().encode())
        h.update(path.read_bytes())
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
