"""What runs a call: flashtune's Triton kernels, or one of torch SDPA's backends.

The job is the fastest correct attention for the call. A search times, for each key, the
SDPA backends that run it beside the Triton winner, under the same correctness gate and the
same timer (``KeyBench.race``), and stores the fastest as the key's ``runner``:

- an inference key (pass "fwd") by the forward alone;
- a training key (pass "bwd") by forward + backward of one runner (SDPA's backward needs
  SDPA's forward): the Triton side is the key's fwd winner (else the heuristic default)
  with its bwd winner, through autograd, as a training step runs.

The dispatcher runs a call that needs no gradient with its fwd key's runner and a call that
does with its bwd key's runner. The Triton config and time stay stored beside the runner, so
the kernels' own gap to SDPA stays visible (``flashtune list`` shows both).
"""

from __future__ import annotations

from collections.abc import Mapping

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
