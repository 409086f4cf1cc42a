"""A trial's outcome, and turning a failed launch into one."""

from __future__ import annotations

import dataclasses

@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one trial measured. ``status`` is one of the store's TRIAL_STATUSES."""

    status: str
    time_ms: float | None = None
    error: float | None = None  # the worst error as a multiple of its allowance (<= 1 passes)
    message: str = ""
    # backward configs with a dQ kernel: that kernel's time alone (the rest of time_ms is
    # the dK/dV half's), so the search can pair the fastest dK/dV half with the fastest dQ half
    dq_ms: float | None = None


# Errors after which the CUDA context cannot be trusted: the worker must exit.
_FATAL_MARKERS = ("illegal memory access", "illegal instruction", "device-side assert", "unspecified launch failure",
                  "an illegal", "misaligned address", "CUDA error")


def classify(exc: BaseException):
    """The Outcome of a launch that raised ``exc``."""
    from triton.runtime.errors import OutOfResources

    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500]
    if isinstance(exc, OutOfResources):
        return Outcome("out_of_resources", message=message)
    if is_fatal(exc):
        return Outcome("crashed", message=message)
    return Outcome("compile_error", message=message)


def is_fatal(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in _FATAL_MARKERS)
