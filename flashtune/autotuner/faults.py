"""Test-only faults for the autotuner's isolation tests, injected around a trial's launch.

Loaded by the trial (in the worker process) only when ``search(faults=...)`` asks for a
fault: production kernels carry no test hooks, and none of this is in the kernel hash.
Each fault runs after the real launch:

- ``FAULT_OOB_WRITE``: a kernel writes far outside its buffer (an illegal address; under
  the interpreter a segfault): the worker dies, the trial is ``crashed``;
- ``FAULT_TRAP``: a kernel executes ``trap`` (inline asm, which the interpreter cannot
  run: there the launch fails, ``compile_error``);
- ``FAULT_SPIN``: a kernel waits for a flag that never comes: the trial times out;
- ``FAULT_WRONG``: the output is scaled by 1.25, a plausible but wrong answer: ``incorrect``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FAULT_NONE, FAULT_OOB_WRITE, FAULT_TRAP, FAULT_SPIN, FAULT_WRONG = 0, 1, 2, 3, 4


@triton.jit
def _fault_kernel(Out, Flag, FAULT: tl.constexpr):
    ptrs = Out + tl.arange(0, 16)
    if FAULT == 1:
        ptrs += 1 << 40  # write far outside the buffer: an illegal address
    if FAULT == 2:
        tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    if FAULT == 3:
        while tl.load(Flag, volatile=True) == 0:
            pass
    tl.store(ptrs, tl.zeros([16], dtype=tl.float32))


def inject(launch, fault: int, device: torch.device):
    """``launch`` (a no-argument callable returning the pass's outputs) with ``fault`` after it."""
    if fault == FAULT_NONE:
        return launch
    if fault == FAULT_WRONG:
        def wrong():
            first, *rest = launch()
            return (first * 1.25, *rest)
        return wrong
    if fault not in (FAULT_OOB_WRITE, FAULT_TRAP, FAULT_SPIN):
        raise ValueError(f"fault: expected one of 0-4, got {fault!r}")
    out = torch.zeros(16, device=device, dtype=torch.float32)
    flag = torch.zeros(1, device=device, dtype=torch.int32)

    def faulty():
        result = launch()
        _fault_kernel[(1,)](out, flag, FAULT=fault)
        return result
    return faulty
