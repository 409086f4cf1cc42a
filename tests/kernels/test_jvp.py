"""Forward-mode JVP of attention (kernels/jvp.py; issue 19 item 6).

The tangent t_o of flashtune's JVP kernel, reached through ``torch.func.jvp`` and
``torch.autograd.forward_ad`` of ``flashtune.attention`` and through
``flashtune.attention_jvp``, against an independent truth: ``torch.func.jvp`` of the
project's dense ``reference_attention`` in float64 (torch's own derivative rules, no code
shared with the kernel). The rule is kernel_checks' (FlashAttention's): the error against
float64 at most ``factor`` times the error of the same jvp computed in the input's dtype,
plus the dtype's slack. Odd shapes (Nq, Nk not multiples of the blocks, Nq != Nk), both
causal alignments, grouped heads, padded head dims, strided inputs and tangents, missing
tangents (zero). bfloat16 is refused by the interpreter (test_bf16_interpreter.py): it
runs in the GPU test at the end.
"""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from kernel_checks import DTYPES, MIXED, assert_close_to_reference, make_tensor, tolerance

from flashtune.kernels import FwdConfig, attention, attention_jvp, attention_varlen, reference_attention
from flashtune.kernels.triton import jvp as jvp_module
from flashtune.configs.base import ConfigError
from flashtune.tolerance import baseline_dtype, uses_tf32

F = FwdConfig


def _inputs(dtype_name, n_q, n_k, d, heads=(2, 2), batch=1, layout="bhnd", tangent_layout=None, device="cpu",
            tangents="qkv", scale=1.0):
    """q, k, v and their tangents (None where ``tangents`` lacks the letter), seeded by the arguments."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype_name, n_q, n_k, d, heads, batch, layout,
                                                         tangent_layout, tangents, scale)).encode()))
    dtype = DTYPES[dtype_name][0]
    hq, hkv = heads
    shapes = {"q": (batch, hq, n_q, d), "k": (batch, hkv, n_k, d), "v": (batch, hkv, n_k, d)}
    layouts = MIXED if layout == "mixed" else dict.fromkeys("qkv", layout)
    primal = [make_tensor(shapes[n], layout=layouts[n], dtype=dtype, device=device, gen=gen) * scale for n in "qkv"]
    tl = tangent_layout or layout
    tangent = [make_tensor(shapes[n], layout=tl, dtype=dtype, device=device, gen=gen) if n in tangents else None
               for n in "qkv"]
    return primal, tangent


def _reference_jvp(primal, tangent, *, dtype, causal, causal_align="top_left", sm_scale=None):
    """(o, t_o, lse) of torch.func.jvp over reference_attention computed in ``dtype`` (a
    missing tangent: zeros)."""
    p = tuple(x.detach().to(dtype) for x in primal)
    t = tuple(torch.zeros_like(x) if tx is None else tx.detach().to(dtype) for x, tx in zip(p, tangent))

    def f(q, k, v):
        return reference_attention(q, k, v, causal=causal, causal_align=causal_align, sm_scale=sm_scale,
                                   dtype=dtype)

    (o, lse), (t_o, _) = torch.func.jvp(f, p, t)
    return o, t_o, lse


def _check(dtype_name, primal, tangent, o, t_o, lse=None, *, causal, causal_align="top_left", sm_scale=None):
    """o, t_o (and lse, natural log) against the float64 truth by kernel_checks' rule."""
    dtype, precision = DTYPES[dtype_name]
    device = primal[0].device
    tol = tolerance(dtype_name, device)
    kw = dict(causal=causal, causal_align=causal_align, sm_scale=sm_scale)
    truth = _reference_jvp(primal, tangent, dtype=torch.float64, **kw)
    low = _reference_jvp(primal, tangent, dtype=baseline_dtype(dtype, tf32=uses_tf32(dtype, device, precision)), **kw)
    assert o.shape == primal[0].shape and o.dtype == dtype
    assert t_o.shape == primal[0].shape and t_o.dtype == dtype
    errors = {"o": assert_close_to_reference("o", o, truth[0], low[0], tol=tol),
              "t_o": assert_close_to_reference("t_o", t_o, truth[1], low[1], tol=tol)}
    assert truth[1].abs().max().item() > 0.1, "a tangent this test cannot tell from zero"
    if lse is not None:
        empty = torch.isneginf(truth[2])
        assert torch.equal(torch.isneginf(lse), empty), "lse: -inf exactly on the rows that see no key"
        lse32 = _reference_jvp(primal, tangent, dtype=torch.float32, **kw)[2]
        errors["lse"] = assert_close_to_reference("lse", *(x.masked_fill(empty, 0.0) for x in (lse, truth[2], lse32)),
                                                  tol=tol, lse=True)
    return errors


def _func_jvp(primal, tangent, **kw):
    """torch.func.jvp of flashtune.attention over the inputs that have a tangent."""
    which = [i for i, t in enumerate(tangent) if t is not None]

    def f(*diff):
        args = list(primal)
        for i, x in zip(which, diff):
            args[i] = x
        return attention(*args, **kw)

    return torch.func.jvp(f, tuple(primal[i] for i in which), tuple(tangent[i] for i in which))


# (dtype, causal, align, Nq, Nk, D, (Hq, Hkv), batch): every causal mode meets Nq < Nk and
# Nq > Nk, groups 1/2/4, D 40 (padded) and 64, fp32 and fp16
CASES = [
    ("fp32-ieee", False, "top_left", 33, 47, 40, (2, 2), 1),
    ("fp32-ieee", True, "top_left", 70, 37, 64, (4, 2), 1),
    ("fp32-ieee", True, "bottom_right", 37, 70, 40, (4, 1), 1),
    ("fp32-ieee", True, "bottom_right", 70, 37, 64, (2, 2), 1),  # 33 queries see no key
    ("fp16", False, "top_left", 70, 37, 64, (4, 1), 1),
    ("fp16", True, "top_left", 37, 70, 40, (2, 2), 2),
    ("fp16", True, "bottom_right", 70, 37, 40, (4, 2), 1),
    ("fp16", True, "bottom_right", 37, 70, 64, (4, 1), 1),
]


def _id(case):
    dtype, causal, align, n_q, n_k, d, (hq, hkv), b = case
    mask = ("causal-" + ("tl" if align == "top_left" else "br")) if causal else "full"
    return f"{dtype}-{mask}-q{n_q}k{n_k}-d{d}-h{hq}kv{hkv}-b{b}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_torch_func_jvp_of_attention(case, kernel_device):
    """torch.func.jvp through flashtune.attention: the tangent against the float64 truth, and
    the primal exactly attention()'s own output (the forward kernel's, not the JVP's)."""
    dtype_name, causal, align, n_q, n_k, d, heads, batch = case
    primal, tangent = _inputs(dtype_name, n_q, n_k, d, heads, batch, device=kernel_device)
    kw = dict(causal=causal, causal_align=align, fp32_precision=DTYPES[dtype_name][1])
    o, t_o = _func_jvp(primal, tangent, **kw)
    assert torch.equal(o, attention(*primal, **kw))
    _check(dtype_name, primal, tangent, o, t_o, causal=causal, causal_align=align)
    if causal and align == "bottom_right" and n_q > n_k:  # rows without keys: zero tangent exactly
        assert t_o[:, :, :n_q - n_k].abs().max().item() == 0.0


# explicit blocks: smaller and larger than the sequences, BLOCK_M != BLOCK_N both ways, so
# the causal diagonal straddles blocks differently; through attention_jvp, with the lse
CONFIG_CASES = [
    ("fp32-ieee", True, "top_left", 69, 33, 40, (4, 2), 1, F(16, 16, 4, 1)),
    ("fp32-ieee", True, "bottom_right", 33, 69, 64, (2, 2), 2, F(32, 16, 4, 1)),
    ("fp32-ieee", True, "bottom_right", 69, 33, 40, (4, 1), 1, F(16, 32, 4, 1)),
    ("fp32-ieee", False, "top_left", 17, 69, 64, (2, 1), 1, F(64, 16, 4, 2)),
    ("fp16", True, "top_left", 33, 69, 40, (4, 2), 1, F(16, 32, 4, 1)),
    ("fp16", True, "bottom_right", 69, 33, 64, (2, 2), 1, F(32, 16, 4, 1)),
    ("fp32-ieee", True, "top_left", 1, 17, 40, (2, 2), 1, F(16, 16, 4, 1)),  # a single query
    ("fp32-ieee", False, "top_left", 17, 1, 64, (4, 1), 1, F(16, 16, 4, 1)),  # a single key
]


@pytest.mark.parametrize("case", CONFIG_CASES, ids=lambda c: f"{_id(c[:8])}-{c[8].BLOCK_M}x{c[8].BLOCK_N}")
def test_attention_jvp_configs(case, kernel_device):
    dtype_name, causal, align, n_q, n_k, d, heads, batch, config = case
    primal, tangent = _inputs(dtype_name, n_q, n_k, d, heads, batch, device=kernel_device)
    o, t_o, lse = attention_jvp(*primal, *tangent, causal=causal, causal_align=align, fwd_config=config,
                                fp32_precision=DTYPES[dtype_name][1], return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == o.shape[:3]
    _check(dtype_name, primal, tangent, o, t_o, lse, causal=causal, causal_align=align)
    # the same log-sum-exp convention as attention(return_lse=True)
    _, lse_fwd = attention(*primal, causal=causal, causal_align=align, fp32_precision=DTYPES[dtype_name][1],
                           return_lse=True)
    empty = torch.isneginf(lse_fwd)
    assert torch.equal(torch.isneginf(lse), empty)
    torch.testing.assert_close(lse.masked_fill(empty, 0), lse_fwd.masked_fill(empty, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout,tangent_layout", [("bnhd", "bnhd"), ("mixed", "bhdn"), ("padded", "expanded")])
def test_strided_inputs_and_tangents(layout, tangent_layout, kernel_device):
    """(B, N, H, D) storage seen transposed, a head dim that is not unit-stride, each input
    its own layout, NaN-padded rows; tangents in another layout than their primals, also
    stride 0 (expanded). Outputs come back in q's layout."""
    primal, tangent = _inputs("fp32-ieee", 37, 50, 40, (4, 2), 1, layout=layout, tangent_layout=tangent_layout,
                              device=kernel_device)
    o, t_o = _func_jvp(primal, tangent, causal=True, fp32_precision="ieee")
    _check("fp32-ieee", primal, tangent, o, t_o, causal=True)
    if layout != "padded":
        assert t_o.stride() == primal[0].stride()


@pytest.mark.parametrize("tangents", ["q", "k", "v", "qv", "kv"])
def test_missing_tangents_are_zero(tangents, kernel_device):
    """Dual tensors (torch.autograd.forward_ad) on some inputs only: the others' tangents
    are zero (the kernel's HAS_TQ/HAS_TK/HAS_TV flags)."""
    primal, tangent = _inputs("fp32-ieee", 45, 33, 64, (4, 2), 1, tangents=tangents, device=kernel_device)
    with fwAD.dual_level():
        duals = [x if t is None else fwAD.make_dual(x, t) for x, t in zip(primal, tangent)]
        out = attention(*duals, causal=True, causal_align="bottom_right", fp32_precision="ieee")
        o, t_o = fwAD.unpack_dual(out)
    assert t_o is not None
    _check("fp32-ieee", primal, tangent, o, t_o, causal=True, causal_align="bottom_right")
    o2, t_o2 = attention_jvp(*primal, *tangent, causal=True, causal_align="bottom_right", fp32_precision="ieee")
    _check("fp32-ieee", primal, tangent, o2, t_o2, causal=True, causal_align="bottom_right")


@pytest.mark.parametrize("sm_scale", [0.05, 2.0, -0.5])
def test_sm_scale(sm_scale, kernel_device):
    primal, tangent = _inputs("fp32-ieee", 33, 40, 40, device=kernel_device)
    o, t_o = _func_jvp(primal, tangent, causal=True, sm_scale=sm_scale, fp32_precision="ieee")
    _check("fp32-ieee", primal, tangent, o, t_o, causal=True, sm_scale=sm_scale)


def test_large_scores_need_the_running_max(kernel_device):
    """Scores with a spread near 100: exp overflows in fp32 unless the running max is
    subtracted, from the tangent's accumulators as from the output's."""
    primal, tangent = _inputs("fp32-ieee", 40, 70, 64, device=kernel_device, scale=4.0)
    o, t_o, lse = attention_jvp(*primal, *tangent, fwd_config=F(16, 16, 4, 1), fp32_precision="ieee",
                                return_lse=True)
    _check("fp32-ieee", primal, tangent, o, t_o, lse, causal=False)


def test_reverse_mode_through_the_primal(kernel_device):
    """The primal of torch.func.jvp is differentiable: its gradients equal attention()'s
    outside forward-mode AD (the same backward kernels on the same saved tensors)."""
    primal, tangent = _inputs("fp32-ieee", 20, 24, 40, (4, 2), device=kernel_device)
    q, k, v = (x.detach().clone().requires_grad_() for x in primal)
    o, _ = torch.func.jvp(lambda a, b, c: attention(a, b, c, causal=True, fp32_precision="ieee"), (q, k, v),
                          tuple(tangent))
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in primal)
    o2 = attention(q2, k2, v2, causal=True, fp32_precision="ieee")
    assert type(o2.grad_fn).__name__ == "FlashAttentionFunctionBackward"  # outside a dual level: as before
    assert torch.equal(o, o2)
    for a, b in zip(grads, torch.autograd.grad(o2, (q2, k2, v2), do)):
        assert torch.equal(a, b)


def test_without_a_dual_level_nothing_changes(kernel_device, monkeypatch):
    """Outside forward-mode AD attention() never reaches the JVP function or kernel, on
    its checked-signature fast path either."""
    def refuse(*args, **kwargs):
        raise AssertionError("the JVP path ran outside a dual level")

    monkeypatch.setattr(jvp_module, "_jvp", refuse)
    monkeypatch.setattr("flashtune.kernels.api.FlashAttentionJvpFunction.apply", refuse)
    primal, _ = _inputs("fp32-ieee", 20, 20, 16, device=kernel_device)
    for _ in range(2):  # the second call takes the _CHECKED fast path
        attention(*primal, causal=True)
        q = primal[0].detach().clone().requires_grad_()
        attention(q, *primal[1:], causal=True).sum().backward()


def test_plans_replay_bit_identical(kernel_device):
    """A signature's second JVP call replays its launch plan (kernels/launch.py), with the
    same outputs bit for bit; another tangent set is another signature."""
    primal, tangent = _inputs("fp32-ieee", 20, 20, 40, (2, 1), device=kernel_device)
    jvp_module._JVP_PLANS.clear()
    first = attention_jvp(*primal, *tangent, causal=True, fwd_config=F(16, 16, 4, 1), return_lse=True)
    plans = [p for p in jvp_module._JVP_PLANS.values() if p]
    assert len(plans) == 1
    second = attention_jvp(*primal, *tangent, causal=True, fwd_config=F(16, 16, 4, 1), return_lse=True)
    assert plans[0].replays == 1
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    attention_jvp(*primal, tangent[0], None, None, causal=True, fwd_config=F(16, 16, 4, 1))
    assert len(jvp_module._JVP_PLANS) == 2


def _dual_q(primal, tangent):
    return fwAD.make_dual(primal[0], tangent[0])


@pytest.mark.parametrize("option,value", [("softcap", 20.0), ("window_size", (8, 0)), ("dropout_p", 0.1)])
def test_unsupported_options_with_tangents_are_refused(option, value, kernel_device):
    primal, tangent = _inputs("fp32-ieee", 20, 20, 16, device=kernel_device)
    with fwAD.dual_level():
        with pytest.raises(ValueError, match=f"^{option}: not supported with forward-mode tangents"):
            attention(_dual_q(primal, tangent), *primal[1:], causal=True, **{option: value})
        # without a tangent the option runs as before, also inside a dual level
        o = attention(*primal, causal=True, **{option: value})
        assert fwAD.unpack_dual(o).tangent is None


def test_packed_sequences_with_tangents_are_refused(kernel_device):
    q, k, v = (torch.randn(12, 2, 16, device=kernel_device) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=kernel_device)
    with fwAD.dual_level():
        with pytest.raises(ValueError, match="^varlen: not supported with forward-mode tangents"):
            attention_varlen(fwAD.make_dual(q, torch.randn_like(q)), k, v, cu, cu, 7, 7, causal=True)


def test_nested_jvp_is_refused(kernel_device):
    """A jvp of the jvp would need the kernel's own derivative: refused, not answered with a
    zero second-order term."""
    primal, tangent = _inputs("fp32-ieee", 16, 16, 16, device=kernel_device)
    q, k, v = primal

    def tangent_of_q(x):
        return torch.func.jvp(lambda a: attention(a, k, v), (x,), (tangent[0],))[1]

    with pytest.raises(NotImplementedError, match="nested forward-mode AD"):
        torch.func.jvp(tangent_of_q, (q,), (tangent[0],))


def test_attention_jvp_argument_errors(kernel_device):
    primal, tangent = _inputs("fp32-ieee", 20, 24, 16, (4, 2), device=kernel_device)
    q, k, v = primal
    tq, tk, tv = tangent
    with pytest.raises(ValueError, match=r"^tk: expected the shape of k \(1, 2, 24, 16\)"):
        attention_jvp(q, k, v, tq, tq, tv)
    with pytest.raises(TypeError, match="^tv: expected a torch.Tensor or None"):
        attention_jvp(q, k, v, tq, tk, 1.0)
    with pytest.raises(ValueError, match="^q: requires grad, but attention_jvp has no autograd"):
        attention_jvp(q.detach().requires_grad_(), k, v, tq, tk, tv)
    with pytest.raises(ConfigError, match="^BLOCK_M"):
        attention_jvp(q, k, v, tq, tk, tv, fwd_config=F(24, 16, 4, 1))
    with pytest.raises(TypeError, match="^fwd_config: expected a FwdConfig"):
        attention_jvp(q, k, v, tq, tk, tv, fwd_config=(16, 16, 4, 1))
    with pytest.raises(ValueError, match="^causal_align"):  # attention()'s own checks
        attention_jvp(q, k, v, tq, tk, tv, causal=True, causal_align="middle")
    with torch.no_grad():  # no autograd wanted: fine
        attention_jvp(q.detach().requires_grad_(), k, v, tq, tk, tv)


def test_configs_and_defaults(monkeypatch):
    """Defaults fit the device they are asked for; a config whose tiles do not fit is
    refused naming fwd_config; a Gluon config runs the default instead."""
    for d in (16, 40, 64, 96, 128, 256):
        for dtype in (torch.float16, torch.float32):
            cfg = jvp_module.default_jvp_config(d, dtype, "cpu")
            assert jvp_module.validate_jvp_config(cfg, d, dtype, "cpu") is cfg
    gluon = F(64, 64, 4, 2, family=1)
    assert jvp_module.validate_jvp_config(gluon, 64, torch.float16, "cpu") == \
        jvp_module.default_jvp_config(64, torch.float16, "cpu")
    # the interpreter has no shared-memory limit: an sm_86's
    monkeypatch.setattr(jvp_module, "shared_memory_limit", lambda device: 101376)
    with pytest.raises(ConfigError, match="^fwd_config: the JVP kernel needs about"):
        jvp_module.validate_jvp_config(F(128, 128, 4, 3), 128, torch.float32, "cpu")
    jvp_module.default_jvp_config.cache_clear()
    try:
        for d in (64, 128):  # the default shrinks to fit
            cfg = jvp_module.default_jvp_config(d, torch.float16, "cpu")
            assert jvp_module.jvp_shared_memory(cfg, d, torch.float16) <= 101376
    finally:
        jvp_module.default_jvp_config.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
def test_gpu_bf16_real_size(causal, align):
    """bf16 at a training size on the GPU: B=2, 16 query heads over 4 K/V heads, D=128,
    1024 queries over 1536 keys, through torch.func.jvp of attention (default configs)."""
    primal, tangent = _inputs("bf16", 1024, 1536, 128, (16, 4), 2, layout="bnhd", device="cuda")
    o, t_o = _func_jvp(primal, tangent, causal=causal, causal_align=align)
    _check("bf16", primal, tangent, o, t_o, causal=causal, causal_align=align)
    o2, t_o2 = attention_jvp(*primal, *tangent, causal=causal, causal_align=align)
    assert torch.equal(t_o, t_o2)
