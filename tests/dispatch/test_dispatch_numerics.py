"""The tuned callable computes what flashtune.attention computes with the chosen configs,
and what torch SDPA computes."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from dispatch_samples import BWD_A, BWD_B, FWD_A, FWD_B, qkv

import flashtune
from flashtune import dispatch
from flashtune.dispatch import get_tuned_attention


@pytest.fixture
def fn(write, db_path):
    """A tuned callable whose table covers fp32 and fp16, D=16, causal and not, at 16 and 64, and
    fp32 grouped heads (group 2, 4 query heads) at 16."""
    for dtype in ("float32", "float16"):
        for causal in (False, True):
            write(16, "fwd", FWD_A, dtype=dtype, causal=causal)
            write(64, "fwd", FWD_B, dtype=dtype, causal=causal)
            write(16, "bwd", BWD_A, dtype=dtype, causal=causal)
            write(64, "bwd", BWD_B, dtype=dtype, causal=causal)
    write(16, "fwd", FWD_B, group=2, batch_heads=4)
    write(16, "bwd", BWD_B, group=2, batch_heads=4)
    return get_tuned_attention(db_path)


def _run(attend, inputs, **kwargs):
    """Output and the gradients of (query, key, value) for a fixed upstream gradient."""
    q, k, v = (t.detach().clone().requires_grad_() for t in inputs)
    out = attend(q, k, v, **kwargs)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out) + torch.arange(out.shape[-1]) / 7)
    return (out, *grads)


CASES = [
    pytest.param(dict(n_q=16), dict(), id="exact"),
    pytest.param(dict(n_q=17), dict(), id="nearest"),
    pytest.param(dict(n_q=40), dict(is_causal=True), id="nearest causal"),
    pytest.param(dict(n_q=9, n_k=30), dict(is_causal=True), id="seq_q < seq_k"),
    pytest.param(dict(n_q=30, n_k=9), dict(), id="seq_q > seq_k"),
    pytest.param(dict(n_q=17, heads=4, kv_heads=2), dict(enable_gqa=True), id="gqa"),
    pytest.param(dict(n_q=17, heads=4, kv_heads=1), dict(), id="one kv head"),
    pytest.param(dict(n_q=16, batch=2), dict(scale=0.3), id="scale"),
    pytest.param(dict(n_q=20, dtype=torch.float16), dict(is_causal=True), id="fp16"),
]


@pytest.mark.parametrize(("shape", "kwargs"), CASES)
def test_outputs_and_grads_equal_flashtune_attention_with_the_chosen_configs(fn, shape, kwargs):
    inputs = qkv(**shape)
    choice = fn.explain(*inputs, **kwargs)
    assert choice.fwd_source.startswith("tuned") and choice.bwd_source.startswith("tuned"), choice
    got = _run(fn, inputs, **kwargs)
    want = _run(flashtune.attention, inputs, causal=kwargs.get("is_causal", False), sm_scale=kwargs.get("scale"),
                fwd_config=choice.fwd_config, bwd_config=choice.bwd_config, fp32_precision="ieee")
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert torch.equal(g, w), name


@pytest.mark.parametrize(("n", "causal"), [(17, False), (40, True)])
def test_these_shapes_tell_the_tuned_configs_from_the_defaults(fn, n, causal):
    """Guards the equality test above: a dispatcher that ran other configs would fail it."""
    inputs = qkv(n)
    choice = fn.explain(*inputs, is_causal=causal)
    tuned = _run(flashtune.attention, inputs, causal=causal, fwd_config=choice.fwd_config,
                 bwd_config=choice.bwd_config, fp32_precision="ieee")
    default = _run(flashtune.attention, inputs, causal=causal, fp32_precision="ieee")
    assert not any(torch.equal(t, d) for t, d in zip(tuned, default, strict=True))


def test_the_heuristic_path_equals_flashtune_attention_with_its_defaults(fn):
    inputs = qkv(16, head_dim=24)
    assert fn.explain(*inputs).fwd_source == "heuristic"
    for g, w in zip(_run(fn, inputs), _run(flashtune.attention, inputs, fp32_precision="ieee"), strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize(("shape", "kwargs"), [c for c in CASES if c.id != "fp16"])
def test_matches_torch_sdpa(fn, shape, kwargs):
    inputs = qkv(**shape)
    for name, g, w in zip(("out", "dq", "dk", "dv"), _run(fn, inputs, **kwargs),
                          _run(F.scaled_dot_product_attention, inputs, **kwargs), strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(("shape", "kwargs"), CASES)
def test_without_grad_the_output_equals_flashtune_attention(fn, shape, kwargs):
    inputs = qkv(**shape)
    choice = fn.explain(*inputs, **kwargs)
    want = flashtune.attention(*inputs, causal=kwargs.get("is_causal", False), sm_scale=kwargs.get("scale"),
                               fwd_config=choice.fwd_config, fp32_precision="ieee")
    with torch.no_grad():
        assert torch.equal(fn(*inputs, **kwargs), want)
    assert torch.equal(fn(*inputs, **kwargs), want)  # inputs that need no grad


def test_fp32_follows_torchs_matmul_precision(fn, monkeypatch):
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("fp32_precision") or args[7])  # apply(q, k, v, causal, scale, fwd, bwd, precision, ..)
        return (args[0], None)

    monkeypatch.setattr(dispatch, "FlashAttentionFunction", types.SimpleNamespace(apply=spy))
    monkeypatch.setattr(dispatch, "attention_forward", spy)
    q, k, v = qkv(16)
    qg = q.clone().requires_grad_()
    before = torch.get_float32_matmul_precision()
    try:
        fn(q, k, v)
        fn(qg, k, v)
        torch.set_float32_matmul_precision("high")
        fn(q, k, v)
        fn(qg, k, v)
        fn(q.half(), k.half(), v.half())
    finally:
        torch.set_float32_matmul_precision(before)
    # "highest" (torch's default): fp32-accurate dots; fp16 ignores the setting
    assert seen == ["ieee", "ieee", "tf32", "tf32", "tf32"]
