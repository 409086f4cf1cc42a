"""Turning a failed launch into an ``Outcome`` (flashtune.outcome)."""

from __future__ import annotations

from flashtune.outcome import Outcome

# Errors after which the CUDA context cannot be trusted: the worker must exit.
_FATAL_MARKERS = ("illegal memory access", "illegal instruction", "device-side assert", "unspecified launch failure",
                  "an illegal", "misaligned address", "CUDA error")


def classify(exc: BaseException) -> Outcome:
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
