"""What runs a call: flashtune's Triton kernels, or one of torch SDPA's backends.

The job is the fastest correct attention for the call. A search times, for each key, the
SDPA backends that run it beside the Triton winner, under the same correctness gate
(``KeyBench.race``), and stores the one ``choose`` picks as the key's ``runner``:

- an inference key (pass "fwd") by the forward alone;
- a training key (pass "bwd") by forward + backward of one runner (SDPA's backward needs
  SDPA's forward): the Triton side is the key's fwd winner (else the heuristic default)
  with its bwd winner, through autograd, as a training step runs.

Each runner is timed two ways (``RunnerTime``): its GPU time (the call's launches replayed
from a CUDA graph, as trials are timed) and its eager time (plain calls back to back, the
host's work included). ``choose`` says which of the two decides, and why.

The dispatcher runs a call that needs no gradient with its fwd key's runner and a call that
does with its bwd key's runner. The Triton config and time stay stored beside the runner, so
the kernels' own gap to SDPA stays visible (``flashtune list`` shows both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

TRITON = "triton"
# runner name -> the SDPA backends enabled while it runs, as torch's switches name them
# (flash, memory-efficient, math, cuDNN): exactly one (the math backend is never the fastest)
SDPA_BACKENDS: dict[str, tuple[bool, bool, bool, bool]] = {
    "sdpa-cudnn": (False, False, False, True),
    "sdpa-flash": (True, False, False, False),
    "sdpa-efficient": (False, True, False, False),
}
RUNNERS: tuple[str, ...] = (TRITON, *SDPA_BACKENDS)


def check_runner(runner) -> str:
    if runner not in RUNNERS:
        raise ValueError(f"runner: expected one of {', '.join(RUNNERS)}, got {runner!r}")
    return runner


def fastest(times: Mapping[str, float | None]) -> str:
    """The runner of the smallest time (None: it did not run or was not correct); Triton
    on a tie and when nothing else ran."""
    valid = {name: t for name, t in times.items() if t is not None and t > 0}
    if not valid or valid.get(TRITON) == min(valid.values()):
        return TRITON
    return min(valid, key=valid.__getitem__)


@dataclasses.dataclass(frozen=True)
class RunnerTime:
    """One runner's time for a key, in ms, measured in one race: ``gpu_ms`` its launches'
    GPU time (CUDA-graph replay; eager where the call cannot be captured), ``eager_ms`` plain
    calls back to back with the host's work (None: not measured, a row of a search before
    runners had both; its one figure is read as ``gpu_ms``). Under the interpreter both are the
    same wall-clock figure."""

    gpu_ms: float
    eager_ms: float | None = None

    def as_dict(self) -> dict:
        return {"gpu_ms": self.gpu_ms, "eager_ms": self.eager_ms}


def runner_time(value: Any) -> Any:
    """A stored runner's time as a ``RunnerTime``: one already, {"gpu_ms", "eager_ms"}, or a plain
    number (an older row or export: its GPU time, eager unknown). Anything else comes back as it
    is, for ``records.check_runners`` to name."""
    if isinstance(value, RunnerTime):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return RunnerTime(value, None)
    if isinstance(value, Mapping) and set(value) in ({"gpu_ms"}, {"gpu_ms", "eager_ms"}):
        return RunnerTime(value["gpu_ms"], value.get("eager_ms"))
    return value


def runner_times(times: Mapping | None) -> dict | None:
    """Each runner's ``runner_time``; None stays None (nothing but the kernels was timed)."""
    if times is None or not isinstance(times, Mapping):
        return times
    return {name: runner_time(t) for name, t in times.items()}


def times_as_dicts(times: Mapping[str, RunnerTime] | None) -> dict | None:
    """``runner_times`` as JSON: {runner: {"gpu_ms": ..., "eager_ms": ...}}."""
    return None if times is None else {name: t.as_dict() for name, t in times.items()}


# What chose a key's runner (``choose``): its GPU time, its eager time because the call is
# host-bound, or its eager time because the search was told so (``flashtune search --host-bound``).
BY_GPU, BY_HOST_BOUND, BY_FLAG = "gpu", "host-bound", "forced"
CHOSEN_BY: tuple[str, ...] = (BY_GPU, BY_HOST_BOUND, BY_FLAG)

# A call whose eager time is more than this many times its GPU time is host-bound. A call the GPU
# bounds times eagerly a little above its graph replay (launch gaps, the loop's syncs); by 1.5x
# the host's work is half the GPU's again, more than a model's other layers reliably hide at the
# short shapes where it happens (benchmarks/race_timing.py times the runners inside a model to
# check this rule).
HOST_BOUND_FACTOR = 1.5


def choose(times: Mapping[str, RunnerTime], *, host_bound: bool = False) -> tuple[str, str]:
    """(runner, what chose it: one of ``CHOSEN_BY``) of a key's race.

    The rule: the runner of the smallest GPU time (Triton on a tie), since in a model the
    other layers' GPU work usually hides the host's cost of a call, which an eager timing of
    the call alone counts in full (flashtune's host work per eager forward + backward is about
    twice SDPA's). Unless that runner's call is host-bound, its eager time over
    ``HOST_BOUND_FACTOR`` times its GPU time: then the runner of the smallest eager time
    ("host-bound"), as the host's cost is then what the call costs. ``host_bound=True``
    (``flashtune search --host-bound``, for a model whose host is known to be the bottleneck:
    small batches, decode loops run eagerly) always chooses by eager time ("forced"). A runner
    without an eager time (an older row) takes no part in an eager choice."""
    gpu = {name: t.gpu_ms for name, t in times.items()}
    eager = {name: t.eager_ms for name, t in times.items()}
    if host_bound:
        return fastest(eager), BY_FLAG
    best = fastest(gpu)
    picked = times.get(best)
    if picked is not None and picked.eager_ms is not None and picked.eager_ms > HOST_BOUND_FACTOR * picked.gpu_ms:
        return fastest(eager), BY_HOST_BOUND
    return best, BY_GPU


def describe_choice(times: Mapping[str, RunnerTime] | None, chosen_by: str | None) -> str:
    """What chose a key's runner, in words: "by GPU time", "by eager time (host-bound: eager 2.1x its
    GPU time)", "by eager time (searched with --host-bound)"; for a row of a search before runners
    had both times, what its one figure was."""
    if not times:
        return "not raced (no SDPA backend was timed)"
    if chosen_by == BY_GPU:
        return "by GPU time (CUDA-graph replay)"
    if chosen_by == BY_FLAG:
        return "by eager time (searched with --host-bound)"
    if chosen_by == BY_HOST_BOUND:
        best = fastest({name: t.gpu_ms for name, t in times.items()})
        t = times.get(best)
        ratio = f": {best}'s eager time {t.eager_ms / t.gpu_ms:.2f}x its GPU time" if t and t.eager_ms else ""
        return f"by eager time (host-bound{ratio}, over {HOST_BOUND_FACTOR:g}x)"
    return "by one timing per runner (a search before runners had GPU and eager times)"


def _backend_flags() -> tuple[bool, bool, bool, bool]:
    import torch

    c = torch.backends.cuda
    return c.flash_sdp_enabled(), c.mem_efficient_sdp_enabled(), c.math_sdp_enabled(), c.cudnn_sdp_enabled()


def _set_backend_flags(flags: tuple[bool, bool, bool, bool]) -> None:
    import torch

    c = torch.backends.cuda
    c.enable_flash_sdp(flags[0])
    c.enable_mem_efficient_sdp(flags[1])
    c.enable_math_sdp(flags[2])
    c.enable_cudnn_sdp(flags[3])


def sdpa(runner: str, query, key, value, *, is_causal: bool = False, scale=None, enable_gqa: bool = False,
         attn_mask=None):
    """torch SDPA with exactly the backend of ``runner`` (RuntimeError where it cannot run).

    The backend is chosen by torch's own switches (``torch.backends.cuda.enable_*_sdp``), set
    for the call and restored after it, as ``torch.nn.attention.sdpa_kernel`` does; set
    directly because that context manager costs about 12 us of host time per call (measured
    on the CPU of the build machine, 20 against 8 us), which a decode step cannot spare."""
    import torch.nn.functional as F

    want, saved = SDPA_BACKENDS[runner], _backend_flags()
    extra = {"enable_gqa": True} if enable_gqa else {}
    if saved != want:
        _set_backend_flags(want)
    try:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal,
                                              scale=scale, **extra)
    finally:
        if saved != want:
            _set_backend_flags(saved)
