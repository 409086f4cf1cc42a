"""What flashtune needs to know of a device, in one place: which device a call runs on, its
compute capability, its SMs, and its shared-memory and register limits.

Off the GPU the kernels run under Triton's interpreter; the stand-ins below let CPU runs take
the decisions a GPU would (or, for the split schedule, keep small test shapes on the plain
kernel)."""

from __future__ import annotations

import functools
import os

import torch

# Triton decides at decoration time whether @triton.jit functions are interpreted.
INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") == "1"

# sm_90 (H100, H200): the Gluon kernels' one architecture
SM90 = (9, 0)
SM90_SHARED_MEMORY = 232448  # bytes per block, opt-in maximum (227 KiB)
SM90_SM_SHARED_MEMORY = 233472  # bytes per SM (228 KiB), shared by the CTAs it holds
SM90_SHARED_RESERVED_PER_CTA = 1024  # what the driver keeps of an SM's shared memory per resident CTA
SM90_REGISTERS = 65536  # 32-bit registers per SM (and per block)

# Shared memory per block (opt-in maximum) by compute capability, used when torch cannot tell.
SHARED_MEMORY_BY_CAPABILITY = {(9, 0): SM90_SHARED_MEMORY, (8, 0): 166912, (8, 6): 101376, (8, 9): 101376,
                               (7, 5): 65536}
INTERPRETER_SHARED_MEMORY = 1 << 30  # the interpreter has no shared-memory limit

# SMs the interpreter stands for: the H200's, so CPU runs take the launch orders a GPU would ...
INTERPRETER_SMS = 132
# ... but few for the split-KV schedule and the decode bands, so that small test shapes keep the
# plain kernel unless they are decode-sized or tiny
INTERPRETER_SCHEDULE_SMS = 4


def resolve_device(device=None) -> torch.device:
    """The device flashtune runs on: ``device`` with a CUDA device's index filled in, or
    (None) the current CUDA device, else the CPU, where kernels run under the Triton
    interpreter. Raises ValueError for anything but a CUDA device or the CPU, and for a
    CUDA device when torch sees no GPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {device!r} is not a device: {e}") from e
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected a CUDA device ('cuda', 'cuda:N') or 'cpu' (the interpreter), "
                         f"got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asks for CUDA, but no CUDA GPU is available; use device='cpu' for "
                         "the Triton interpreter")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())  # a worker process must name its device
    return dev


def device_capability(device) -> tuple[int, int]:
    """(major, minor) of a CUDA ``device`` (None: the current one where there is a GPU); (0, 0) for
    the CPU, which the heuristic tables' generic entries serve."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_capability(dev)
    if dev is None and torch.cuda.is_available():
        return torch.cuda.get_device_capability()
    return (0, 0)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (the interpreter: INTERPRETER_SMS)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _cuda_sm_count(_index(device))


def schedule_sm_count(device: torch.device) -> int:
    """The SMs the split-KV schedule and the decode bands plan for (the interpreter:
    INTERPRETER_SCHEDULE_SMS)."""
    if device.type != "cuda":
        return INTERPRETER_SCHEDULE_SMS
    return _cuda_sm_count(_index(device))


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _cuda_major(index: int) -> int:
    # asked on every launch of a TMA config: once per device is enough
    return torch.cuda.get_device_capability(index)[0]


def tma_capable(device: torch.device) -> bool:
    """Whether tile loads through TMA descriptors run on ``device``: Hopper (sm_90) and
    newer, or the interpreter (CPU tensors)."""
    if device.type != "cuda":
        return INTERPRETER
    return _cuda_major(_index(device)) >= 9


def shared_memory_limit(device: torch.device | str | None) -> int:
    """Bytes of shared memory one program may use on ``device``."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return INTERPRETER_SHARED_MEMORY
    props = torch.cuda.get_device_properties(dev)
    limit = getattr(props, "shared_memory_per_block_optin", 0)
    return int(limit) or SHARED_MEMORY_BY_CAPABILITY.get((props.major, props.minor), 49152)
