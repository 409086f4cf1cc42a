"""Provenance recorded on every stored row and every export file, and what makes a row stale.

A stored config is only as good as the code it was checked and timed with. The kernel
source hash covers every source that decides what a config computes or which config
serves a call (``HASHED_PATHS``); a row whose kernel hash or triton version differs from
this installation's is *stale* (``staleness``): the dispatcher does not serve it until
``flashtune revalidate`` has passed it through the correctness check again here.

Each release records its kernel hash in ``flashtune._version.KERNEL_HASHES``, so a change
to those sources changes the version (a test holds the two together).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

from flashtune._version import KERNEL_HASHES, __version__
from flashtune.keys import GpuInfo

# The package whose sources are hashed: this one (tests point it at a changed copy, as an upgrade would).
_PACKAGE = Path(__file__).resolve().parent
# The sources (paths inside the flashtune package: a directory means every file under it)
# whose change can change what a stored config computes, how fast it runs, or which config
# a call is served: the kernels, their launchers, config rules and heuristic defaults. One
# list, so a module that joins them (device facts, heuristic tables) is added here.
HASHED_PATHS: tuple[str, ...] = ("kernels", "configs", "heuristics", "device.py")
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


def hashed_files(root: Path | None = None) -> list[Path]:
    """The files ``HASHED_PATHS`` name under ``root`` (this package), in a fixed order (caches left out)."""
    root = _PACKAGE if root is None else root
    files: list[Path] = []
    for name in HASHED_PATHS:
        path = root / name
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in found if "__pycache__" not in p.parts and not p.name.startswith(".")
                  and p.suffix not in _SKIPPED_SUFFIXES]
    return files


@functools.lru_cache(maxsize=1)
def kernel_source_hash() -> str:
    """sha256 (first 16 hex digits) over the hashed sources: their paths and bytes."""
    h = hashlib.sha256()
    for path in hashed_files():
        h.update(path.relative_to(_PACKAGE).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def release_of(kernel_hash: str) -> str | None:
    """The flashtune release whose kernel sources have ``kernel_hash`` (None: unknown, e.g. a
    development tree)."""
    return next((version for version, h in KERNEL_HASHES.items() if h == kernel_hash), None)


@functools.lru_cache(maxsize=1)
def installed_triton_version() -> str:
    """Read from the installed metadata (no triton import), once: it scans site-packages."""
    from flashtune.compat import installed_version

    return installed_version("triton") or ""


def stale_versions(provenance: "Provenance") -> str | None:
    """What a stale row was tuned with that this installation differs in ("kernel sources X
    (flashtune 0.1.0) and triton 3.5.0"); None for a current row."""
    reasons = []
    if provenance.kernel_hash != kernel_source_hash():
        release = release_of(provenance.kernel_hash)
        reasons.append(f"kernel sources {provenance.kernel_hash or '(none)'}"
                       + (f" (flashtune {release})" if release else ""))
    if provenance.triton_version != installed_triton_version():
        reasons.append(f"triton {provenance.triton_version or '(none)'}")
    return " and ".join(reasons) or None


def staleness(provenance: "Provenance") -> str | None:
    """Why a row may not be served unchecked here (None: it was tuned under this installation's
    kernel sources and triton)."""
    versions = stale_versions(provenance)
    return None if versions is None else f"tuned with {versions}; this flashtune has {current_versions()}"


def current_versions() -> str:
    """This installation's kernel sources and triton, as staleness messages name them."""
    return f"kernel sources {kernel_source_hash()} and triton {installed_triton_version() or '(none)'}"


def is_current(provenance: "Provenance") -> bool:
    """Whether a row was tuned with this flashtune's kernel sources and this triton."""
    return staleness(provenance) is None


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
