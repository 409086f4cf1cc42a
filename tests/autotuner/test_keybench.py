"""The correctness rule of a trial (KeyBench), in this process under the interpreter.

The reference is fp64 attention written plainly (flashtune.kernels.reference); the
allowance is flashtune.tolerance's: the plain reference's error in the key's precision times a factor, plus a slack.
"""

from __future__ import annotations

import dataclasses

import math

import pytest
import torch
from autotuner_helpers import FAULT_TRAP, FAULT_WRONG, key

from flashtune.autotuner import trial
from flashtune.autotuner.trial import KeyBench
from flashtune.protocol import trial_shape
from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig

CPU = torch.device("cpu")

# Triton 3.6's interpreter on numpy 1.25+ (not ours)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


@pytest.fixture(scope="module")
def fwd_bench():
    return KeyBench(key("fwd", "float32", seq_len=24, causal=True), CPU)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_correct_forward_config_passes(dtype, causal):
    bench = KeyBench(key("fwd", dtype, seq_len=24, causal=causal), CPU)
    out = bench.run(FwdConfig(16, 16, 4, 1))
    assert out.status == "ok", out
    assert 0 <= out.error <= 1
    assert out.time_ms > 0


def test_a_correct_backward_config_passes():
    bench = KeyBench(key("bwd", "float16", seq_len=24, causal=True), CPU)
    out = bench.run(BwdConfig(16, 32, 32, 16, 4, 1))
    assert out.status == "ok", out
    assert 0 <= out.error <= 1
    # its dQ kernel, timed alone, is a part of the whole
    assert out.dq_ms is not None and 0 < out.dq_ms
    atomic = bench.run(BwdConfig(16, 32, 32, 16, 4, 1, atomic_dq=1))
    assert atomic.status == "ok" and atomic.dq_ms is None  # no dQ kernel


def test_the_dq_kernel_alone_computes_what_the_whole_backward_does():
    from flashtune.kernels.passes import attention_backward
    from flashtune.kernels.triton.backward import dq_kernel_alone

    bench = KeyBench(key("bwd", "float32", seq_len=24, causal=True), CPU)
    cfg = BwdConfig(16, 32, 32, 16, 4, 1)
    args = (bench.do, bench.q, bench.k, bench.v, bench.o_in, bench.lse2_in)
    dq, _, _ = attention_backward(*args, cfg, causal=True, sm_scale=bench.sm_scale)
    launch = dq_kernel_alone(*args, cfg, causal=True, sm_scale=bench.sm_scale)
    assert torch.equal(launch(), dq)
    assert dq_kernel_alone(*args, BwdConfig(16, 32, 32, 16, 4, 1, atomic_dq=1), causal=True,
                           sm_scale=bench.sm_scale) is None


def test_the_wrong_result_fault_fails_with_its_error(fwd_bench):
    out = fwd_bench.run(FwdConfig(16, 16, 4, 1), FAULT_WRONG)
    assert out.status == "incorrect"
    assert out.error > 1 and math.isfinite(out.error)
    assert out.time_ms is None  # a wrong config is never timed
    assert "allowance" in out.message


def test_the_trap_fault_under_the_interpreter_is_a_failed_launch(fwd_bench):
    # inline asm does not exist in the interpreter: the launch raises, never "ok"
    out = fwd_bench.run(FwdConfig(16, 16, 4, 1), FAULT_TRAP)
    assert out.status == "compile_error", out
    assert "inline_asm" in out.message


def test_the_reference_itself_passes_with_zero_error(fwd_bench):
    passed, worst, _ = fwd_bench.check((fwd_bench.o_ref.clone(), fwd_bench.lse_ref / trial.LN2))
    assert passed and worst == pytest.approx(0, abs=1e-9)  # errors in float64: the lse round trip through LN2


def test_the_rule_is_the_allowance_exactly(fwd_bench):
    """An error just under the allowance passes; just over fails, and names the output."""
    lse2 = fwd_bench.lse_ref / trial.LN2
    allow = fwd_bench.allowance["o"]
    for factor, expected in ((0.98, True), (1.02, False)):
        o = fwd_bench.o_ref.clone()
        o[0, 0, 3, 5] += factor * allow
        passed, worst, name = fwd_bench.check((o, lse2))
        assert passed is expected
        assert worst == pytest.approx(factor, rel=1e-3)
        assert name == "o"
    lse_bad = lse2.clone()
    lse_bad[0, 1, 2] += 1.02 * fwd_bench.allowance["lse"] / trial.LN2
    passed, _, name = fwd_bench.check((fwd_bench.o_ref.clone(), lse_bad))
    assert not passed and name == "lse"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", ["o", "lse"])
def test_nan_or_inf_fails(fwd_bench, bad, where):
    o, lse2 = fwd_bench.o_ref.clone(), fwd_bench.lse_ref / trial.LN2
    (o if where == "o" else lse2).view(-1)[7] = bad
    passed, worst, name = fwd_bench.check((o, lse2))
    assert not passed
    assert worst == math.inf
    assert name == where


def test_backward_check_catches_each_gradient():
    bench = KeyBench(key("bwd", "float32", seq_len=16, causal=False), CPU)
    grads = [g.clone() for g in bench.grads_ref]
    assert bench.check(grads)[0]
    for i, name in enumerate(("dq", "dk", "dv")):
        bad = [g.clone() for g in bench.grads_ref]
        bad[i] = bad[i] * 1.25 + 0.1
        passed, worst, got = bench.check(bad)
        assert not passed and worst > 1 and got == name
        bad[i].view(-1)[0] = float("nan")
        assert not bench.check(bad)[0]


def test_inputs_are_fixed_per_key_and_differ_between_keys():
    a1 = KeyBench(key("fwd", "float32", seq_len=16), CPU)
    a2 = KeyBench(key("fwd", "float32", seq_len=16), CPU)
    b = KeyBench(key("fwd", "float32", seq_len=16, causal=False), CPU)
    assert torch.equal(a1.q, a2.q) and torch.equal(a1.allowance["o"] * torch.ones(1), a2.allowance["o"] * torch.ones(1))
    assert not torch.equal(a1.q, b.q)
    assert a1.describe()["timer"] == "interpreter-wall-clock"
    assert (a1.batch, a1.heads, a1.heads_kv) == trial_shape(a1.key, interpreter=True)


# -- the reference against torch SDPA (issue 17: KeyBench's reference had no cross-check) -----

def _sdpa(q, k, v, do, causal):
    """torch SDPA in float64 (the math backend on the CPU): o, its natural-log lse, dq, dk, dv."""
    import torch.nn.functional as F

    qs, ks, vs = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=group > 1)
    grads = torch.autograd.grad(o, (qs, ks, vs), do.double())
    s = qs.detach() @ ks.detach().repeat_interleave(group, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return (o.detach(), torch.logsumexp(s, dim=-1), *grads)


@pytest.mark.parametrize("pass_, dtype, causal, group", [("fwd", "float32", True, 1), ("fwd", "float16", False, 1),
                                                         ("bwd", "float16", True, 1), ("bwd", "float32", False, 1),
                                                         ("fwd", "float32", False, 4), ("bwd", "float32", True, 2)])
def test_the_keybench_reference_is_torch_sdpa(pass_, dtype, causal, group):
    k = dataclasses.replace(key(pass_, dtype, seq_len=24, causal=causal), group=group, batch_heads=4)
    bench = KeyBench(k, CPU)
    assert bench.heads == bench.heads_kv * group
    want = _sdpa(bench.q, bench.k, bench.v, bench.do, causal)
    got = (bench.o_ref, bench.lse_ref, *bench.grads_ref)
    for name, g, w in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert g.dtype == torch.float64 and g.shape == w.shape, name
        assert (g - w).abs().max().item() < 1e-10, name
    assert bench.heads > 1 and bench.batch >= 1  # several heads: a head mixed up with another shows


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("max_bytes", [1 << 31, 1], ids=["whole", "a key head at a time"])
def test_the_reference_of_grouped_heads_in_chunks_is_torch_sdpa(causal, max_bytes):
    """Grouped-query heads (8 query heads on 2 key heads, batch 2), whole and one key head
    per step (what a GPU key's score matrices over 2 GiB take)."""
    from flashtune.kernels import reference_with_grads

    gen = torch.Generator().manual_seed(17)
    q, do = (torch.randn(2, 8, 20, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, 2, 20, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    got = reference_with_grads(q, k, v, do, causal=causal, dtype=torch.float64, max_bytes=max_bytes)
    for name, g, w in zip(("o", "lse", "dq", "dk", "dv"), got, _sdpa(q, k, v, do, causal)):
        assert g.shape == w.shape and (g - w).abs().max().item() < 1e-10, name
