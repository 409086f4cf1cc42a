"""torch.nn.attention.bias's causal_upper_left / causal_lower_right masks run flashtune's
kernels (the causal mask aligned top-left or bottom-right) instead of falling back to SDPA."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from dispatch_samples import qkv
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import flashtune
from flashtune import dispatch
from flashtune.dispatch import DispatchWarning, get_tuned_attention


def _run(attend, inputs, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_() for t in inputs)
    out = attend(q, k, v, **kwargs)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out) + torch.arange(out.shape[-1]) / 7)
    return (out, *grads)


@pytest.mark.parametrize(("n_q", "n_k"), [(9, 30), (30, 30), (30, 9)])
@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
def test_causal_bias_runs_the_kernels(db_path, tuned_elsewhere, n_q, n_k, variant):
    fn = get_tuned_attention(db_path)
    inputs = qkv(n_q, n_k, heads=4, kv_heads=2)
    mask = (causal_upper_left if variant == "upper_left" else causal_lower_right)(n_q, n_k)
    align = "top_left" if variant == "upper_left" else "bottom_right"
    choice = fn.explain(*inputs, attn_mask=mask, enable_gqa=True)
    assert not choice.fwd_source.startswith("sdpa"), choice
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)  # no fallback warning
        warnings.filterwarnings("ignore", message="Lower right causal bias will produce NaNs")
        got = _run(fn, inputs, attn_mask=mask, enable_gqa=True)
    want = _run(flashtune.attention, inputs, causal=True, causal_align=align, fwd_config=choice.fwd_config,
                bwd_config=choice.bwd_config, fp32_precision="ieee")
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert torch.equal(g, w), name
    # and it is what SDPA computes with the mask (rows that see no key: 0, as SDPA gives)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Lower right causal bias will produce NaNs")
        sdpa = _run(F.scaled_dot_product_attention, inputs, attn_mask=mask, enable_gqa=True)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, sdpa, strict=True):
        torch.testing.assert_close(g, w.nan_to_num(0.0), atol=2e-5, rtol=2e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_a_causal_bias_of_other_lengths_or_with_is_causal_goes_to_sdpa(db_path, tuned_elsewhere):
    fn = get_tuned_attention(db_path)
    q, k, v = qkv(8, 12)
    assert fn.explain(q, k, v, attn_mask=causal_lower_right(8, 13)).fwd_source.startswith("sdpa fallback")
    assert fn.explain(q, k, v, attn_mask=causal_lower_right(8, 12), is_causal=True).fwd_source.startswith("sdpa")
    assert not fn.explain(q, k, v, attn_mask=causal_lower_right(8, 12)).fwd_source.startswith("sdpa")
    assert dispatch._causal_bias_align(torch.ones(8, 12, dtype=torch.bool), q, k, False) is None
