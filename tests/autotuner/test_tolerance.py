"""The correctness rule (flashtune.tolerance) as the autotuner's gate applies it: a wrong
kernel just outside the allowance fails, one just inside passes.

The allowance is recomputed here with FlashAttention's factor written out (2 for 16-bit
inputs), so raising the factor in flashtune.tolerance (to 200, say) lets the planted
kernel "just outside" through and fails these tests.
"""

from __future__ import annotations

import pytest
import torch
from autotuner_helpers import key

from flashtune.autotuner.trial import KeyBench
from flashtune.kernels.common import LN2
from flashtune.configs.forward import FwdConfig
from flashtune.tolerance import max_error, tolerance

CPU = torch.device("cpu")
FACTOR = 2.0  # FlashAttention's, for float16 and bfloat16

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _expected_allowance(bench: KeyBench, dtype: torch.dtype) -> float:
    """2 x the error of the plain reference in ``dtype`` + the slack, computed here."""
    from flashtune.kernels import reference_with_grads

    low = reference_with_grads(bench.q, bench.k, bench.v, bench.do, causal=bench.key.causal, dtype=dtype)
    return FACTOR * max_error(low[0], bench.o_ref) + tolerance(dtype, tf32=False).atol


def _planted(bench: KeyBench, o: torch.Tensor, lse2: torch.Tensor, shift: float):
    """A wrong kernel: ``o`` (in float32) with one element set to the truth + ``shift``."""
    o = o.float().clone()
    idx = (0, 1, 5, 3)
    o[idx] = bench.o_ref[idx].float() + shift
    return lambda: (o, lse2)


@pytest.mark.parametrize("scale, status", [(0.98, "ok"), (1.02, "incorrect")])
def test_fp16_a_kernel_just_inside_passes_and_just_outside_fails(scale, status, monkeypatch):
    bench = KeyBench(key("fwd", "float16", seq_len=24, causal=True), CPU)
    allow = _expected_allowance(bench, torch.float16)
    assert bench.allowance["o"] == pytest.approx(allow, rel=1e-9)
    o, lse2 = bench.launcher(FwdConfig(16, 16, 4, 1))()  # the real kernel, under the interpreter
    assert max_error(o, bench.o_ref) < 0.5 * allow  # the kernel's own error leaves room for the planted one
    monkeypatch.setattr(bench, "launcher", lambda config, fault=0, **kw: _planted(bench, o, lse2, scale * allow))
    out = bench.run(FwdConfig(16, 16, 4, 1))
    assert out.status == status, out
    assert out.error == pytest.approx(scale, rel=1e-3)


@pytest.mark.parametrize("scale, passes", [(0.98, True), (1.02, False)])
def test_bf16_keyed_gate_just_inside_passes_and_just_outside_fails(scale, passes):
    """bfloat16 kernels compute garbage under the interpreter: the planted output is the
    reference's, shifted; the allowance is the bf16 key's."""
    bench = KeyBench(key("fwd", "bfloat16", seq_len=24, causal=False), CPU)
    allow = _expected_allowance(bench, torch.bfloat16)
    assert FACTOR * max_error(bench.o_ref.to(torch.bfloat16), bench.o_ref) > 0  # a baseline error to scale
    assert bench.allowance["o"] == pytest.approx(allow, rel=1e-9)
    passed, worst, name = bench.check(_planted(bench, bench.o_ref, bench.lse_ref / LN2, scale * allow)())
    assert passed is passes and name == "o"
    assert worst == pytest.approx(scale, rel=1e-3)


def test_the_gate_and_the_test_suite_share_one_rule():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "kernels"))
    try:
        import kernel_checks
    finally:
        sys.path.pop(0)
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32-ieee", torch.float32)):
        assert kernel_checks.tolerance(name, CPU) == tolerance(dtype, tf32=False)
    assert kernel_checks.tolerance("fp32-tf32", torch.device("cuda")) == tolerance(torch.float32, tf32=True)
    assert KeyBench(key("fwd", "float16", seq_len=16), CPU).tolerance == tolerance(torch.float16, tf32=False)
    assert tolerance(torch.float16, tf32=False).factor == tolerance(torch.bfloat16, tf32=False).factor == FACTOR
