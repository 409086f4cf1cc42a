"""Test-only faults for the autotuner's isolation tests, injected around a trial's launch.

Loaded by the trial (in the worker process) only when ``search(faults=...)`` asks for a
fault: production kernels carry no test hooks, and none of this is in the kernel hash.
Each fault runs after the real launch:

- ``FAULT_OOB_WRITE``: a kernel writes far outside its buffer (an illegal address; under
  the interpreter a segfault): the worker dies, the trial is ``crashed``;
- ``FAULT_TRAP``: a kernel executes ``trap`` (inline asm, which the interpreter cannot
  run: there the launch fails, ``compile_error``);
- ``FAULT_SPIN``: a kernel waits for a flag that never comes: the trial times out;
- ``FAULT_WRONG``: the first output (o; dQ for the backward) is scaled by 1.25, a plausible
  but wrong answer: ``incorrect``; ``FAULT_WRONG_SECOND`` and ``FAULT_WRONG_THIRD`` scale the
  second (the log-sum-exp; dK) and the third (dV) instead;
- ``FAULT_NAN``: the first output's last element is NaN (a boundary element left unwritten):
  ``incorrect``.

The wrong results are made here, after the launch, so the gate is tried on every kernel
family and schedule alike: what differs between configs is the launch, not the check.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FAULT_NONE, FAULT_OOB_WRITE, FAULT_TRAP, FAULT_SPIN, FAULT_WRONG = 0, 1, 2, 3, 4
FAULT_WRONG_SECOND, FAULT_WRONG_THIRD, FAULT_NAN = 5, 6, 7
# fault -> the output it scales by 1.25
_SCALED_OUTPUT = {FAULT_WRONG: 0, FAULT_WRONG_SECOND: 1, FAULT_WRONG_THIRD: 2}


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
    if fault in _SCALED_OUTPUT:
        def wrong():
            outputs = list(launch())
            outputs[_SCALED_OUTPUT[fault]] = outputs[_SCALED_OUTPUT[fault]] * 1.25
            return tuple(outputs)
        return wrong
    if fault == FAULT_NAN:
        def nan():
            first, *rest = launch()
            first = first.clone(memory_format=torch.contiguous_format)
            first.view(-1)[-1] = float("nan")
            return (first, *rest)
        return nan
    if fault not in (FAULT_OOB_WRITE, FAULT_TRAP, FAULT_SPIN):
        raise ValueError(f"fault: expected one of 0-7, got {fault!r}")
    out = torch.zeros(16, device=device, dtype=torch.float32)
    flag = torch.zeros(1, device=device, dtype=torch.int32)

    def faulty():
        result = launch()
        _fault_kernel[(1,)](out, flag, FAULT=fault)
        return result
    return faulty
