"""On an H100/H200: the Gluon backward (kernels/gluon/: the Gluon dK/dV kernel with the Triton
preprocess and dQ kernel, the Gluon dQ kernel, or dQ fused) against the references.

Marked ``gpu``; skipped without CUDA and on any GPU but compute capability 9.0. The forward
is the Gluon forward (o and the base-2 log-sum-exp the backward reads); dQ, dK and dV are
checked by kernel_checks.py's rule (error vs the float64 reference <= factor x the error of
torch's own attention in the input dtype + slack), with GQA groups 1/4/8, odd lengths,
Nq != Nk, both causal alignments and strided layouts.

Run: ``python -m pytest -m gpu tests/kernels/test_gluon_bwd_gpu.py -q``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kernel_checks import (assert_close_to_reference, make_tensor, reference_outputs, sdpa_outputs,
                           smoke_in_subprocess, tolerance)

gluon_backward = pytest.importorskip("flashtune.kernels.gluon.backward_launch", reason="this triton has no Gluon")
from flashtune.configs.gluon import GluonBwdConfig, default_gluon_config  # noqa: E402
from flashtune.kernels.gluon import forward_launch as gluon_forward  # noqa: E402  (after the skip: it needs Gluon)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="the Gluon backward runs on compute capability 9.0 (H100/H200) only"),
]

# One small call of each kernel first, in a process of its own (kernel_checks.smoke_in_subprocess).
SMOKE = """
import torch
from flashtune.configs.gluon import GluonBwdConfig, default_gluon_config
from flashtune.kernels.gluon import backward_launch as g, forward_launch as f
q, k, v, do = (torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
o, lse2 = f.gluon_attention_forward(q, k, v, default_gluon_config(64), causal=True)
for cfg in (GluonBwdConfig(BLOCK_M=32), GluonBwdConfig(BLOCK_M=64, NUM_BUFFERS=3)):
    g.gluon_attention_backward(do, q, k, v, o, lse2, cfg, causal=True)
torch.cuda.synchronize()
"""


@pytest.fixture(scope="module", autouse=True)
def _the_kernel_comes_back():
    smoke_in_subprocess(SMOKE, what="the Gluon backward", hang_hint="a hang in a ring on a 1x2x200x64 call")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# name -> (the dK/dV kernel's config with the dQ kernel's fields, whether dQ is the Gluon kernel's,
# dkdv_split: 0 chosen from the shape, which on these small shapes splits the key blocks' work)
CONFIGS = {"m32": (GluonBwdConfig(BLOCK_M=32), False, 0), "m64": (GluonBwdConfig(BLOCK_M=64), False, 0),
           "m64-unsplit": (GluonBwdConfig(BLOCK_M=64), False, 1),
           "m64-gdq": (GluonBwdConfig(BLOCK_M=64), True, 0),
           "m64b3": (GluonBwdConfig(BLOCK_M=64, NUM_BUFFERS=3), False, 0),
           "m32-gdqb3": (GluonBwdConfig(BLOCK_M=32, DQ_BUFFERS=3), True, 1),
           "m64-fused": (GluonBwdConfig(BLOCK_M=64, DQ_FUSED=1), False, 0),
           "m64-fused-late": (GluonBwdConfig(BLOCK_M=64, DQ_FUSED=2), False, 0),
           "m64b3-fused-unsplit": (GluonBwdConfig(BLOCK_M=64, NUM_BUFFERS=3, DQ_FUSED=1), False, 1),
           # the fused dQ share's wgmmas ahead of dV's and dK's (DQ_FIRST)
           "m64-fused-first": (GluonBwdConfig(BLOCK_M=64, DQ_FUSED=1, DQ_FIRST=1), False, 0),
           "m64-fused-late-first": (GluonBwdConfig(BLOCK_M=64, DQ_FUSED=2, DQ_FIRST=1), False, 0)}
SOME_LENGTHS_ONLY = ("m64b3", "m32-gdqb3", "m64b3-fused-unsplit", "m64-fused-first")


def check_gluon_backward(n_q, n_k, d, *, dtype_name="bf16", causal=True, heads=(8, 2), batch=2, config="m64",
                         causal_align="top_left", layout="bhnd", seed=0, split=None) -> dict:
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(seed * 1000003 + n_q * 7919 + n_k * 31 + d)
    hq, hkv = heads
    q = make_tensor((batch, hq, n_q, d), layout=layout, dtype=dtype, device="cuda", gen=gen)
    k = make_tensor((batch, hkv, n_k, d), layout=layout, dtype=dtype, device="cuda", gen=gen)
    v = make_tensor((batch, hkv, n_k, d), layout=layout, dtype=dtype, device="cuda", gen=gen)
    do = make_tensor((batch, hq, n_q, d), layout=layout, dtype=dtype, device="cuda", gen=gen)
    o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, default_gluon_config(d), causal=causal,
                                                    causal_align=causal_align)
    cfg, gluon_dq, config_split = CONFIGS[config]
    dq, dk, dv = gluon_backward.gluon_attention_backward(
        do, q, k, v, o, lse2, cfg, causal=causal, causal_align=causal_align, gluon_dq=gluon_dq,
        dkdv_split=config_split if split is None else split)
    torch.cuda.synchronize()
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dq.dtype == dk.dtype == dv.dtype == dtype
    return assert_gradients_match_the_reference(q, k, v, do, (dq, dk, dv), causal=causal, causal_align=causal_align,
                                                dtype_name=dtype_name)


def assert_gradients_match_the_reference(q, k, v, do, grads, *, causal, causal_align="top_left", dtype_name="bf16"):
    """(dq, dk, dv) ``grads`` against the float64 reference, by kernel_checks.py's rule (torch's
    own attention in the input dtype the measure of the error allowed)."""
    truth = reference_outputs(q, k, v, do, causal=causal, sm_scale=None, causal_align=causal_align)
    base = sdpa_outputs(q, k, v, do, causal=causal, sm_scale=None, dtype=DTYPES[dtype_name],
                        causal_align=causal_align)
    tol = tolerance(dtype_name, q.device)
    return {name: assert_close_to_reference(name, got, getattr(truth, name), getattr(base, name), tol=tol)
            for name, got in zip(("dq", "dk", "dv"), grads)}


def assert_the_same_gradients(cfg, first, second, where=None):
    """Two runs' (dq, dk, dv) of ``cfg``: dK and dV bit for bit, dQ too but for the fused dQ's
    reduce-adds, which land in any order (then within 1e-2)."""
    (dq0, dk0, dv0), (dq1, dk1, dv1) = first, second
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1), where
    if cfg.DQ_FUSED:
        torch.testing.assert_close(dq0, dq1, rtol=0, atol=1e-2)
    else:
        assert torch.equal(dq0, dq1), where


LENGTHS = [(n, n) for n in (1, 17, 130, 1000, 1024, 2048)] + [(1000, 2048), (2048, 1000), (64, 257)]


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n_q,n_k", LENGTHS, ids=[f"{a}x{b}" for a, b in LENGTHS])
def test_gluon_backward_matches_the_reference(n_q, n_k, d, causal, config):
    if config in SOME_LENGTHS_ONLY and (n_q, n_k) not in ((1000, 1000), (2048, 1000), (64, 257)):
        pytest.skip("this config on three lengths only")
    check_gluon_backward(n_q, n_k, d, causal=causal, config=config)


@pytest.mark.parametrize("config", ["m64", "m64-gdq", "m64-fused"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 1), (16, 2)], ids=["mha", "mqa", "gqa8"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_backward_grouped_heads(heads, causal, config):
    check_gluon_backward(1000, 1000, 128, heads=heads, causal=causal, batch=1, config=config)


# (Hq, Hkv, N, dkdv_split): head splits (2, 4, 8 of a group of 8; 7 of 7), query chunks (3 on
# a group of 8 is 1 x 3; 16 on a group of 4 is 4 x 4, more chunks than 3 blocks: empty ones)
SPLITS = [(8, 1, 1000, 2), (8, 1, 1000, 4), (8, 1, 777, 8), (16, 2, 2048, 3), (28, 4, 1000, 7),
          (8, 2, 130, 16), (8, 1, 4096, 0)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hq,hkv,n,split", SPLITS, ids=[f"{a}-{b}-n{c}-s{d}" for a, b, c, d in SPLITS])
@pytest.mark.parametrize("config", ["m64", "m64-fused", "m64-fused-late", "m64-fused-late-first"])
def test_gluon_backward_split_key_blocks(hq, hkv, n, split, causal, config):
    """dkdv_split: a key block's dK/dV spread over CTAs (the group's query heads, then its
    query blocks), the fp32 partials summed afterwards; the fused dQ adds from every CTA."""
    check_gluon_backward(n, n, 128, heads=(hq, hkv), causal=causal, batch=1, split=split, config=config)


def causal_inputs(batch, hq, hkv, n, *, seed):
    """bf16 D=128 q, k, v, dO (contiguous) and the Gluon forward's causal o and lse2."""
    gen = torch.Generator().manual_seed(seed)
    q, do = (make_tensor((batch, hq, n, 128), layout="bhnd", dtype=torch.bfloat16, device="cuda", gen=gen)
             for _ in range(2))
    k, v = (make_tensor((batch, hkv, n, 128), layout="bhnd", dtype=torch.bfloat16, device="cuda", gen=gen)
            for _ in range(2))
    o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, default_gluon_config(128), causal=True)
    return q, k, v, do, o, lse2


def test_the_fused_dq_gives_way_to_a_dq_kernel_under_deterministic_algorithms():
    """The fused dQ's reduce-adds land in any order; with torch.use_deterministic_algorithms
    dQ comes from the Triton dQ kernel: two runs agree bitwise (and match the reference)."""
    q, k, v, do, o, lse2 = causal_inputs(2, 8, 2, 1000, seed=3)
    cfg = CONFIGS["m64-fused"][0]
    fused = gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, cfg, causal=True)
    torch.use_deterministic_algorithms(True)
    try:
        runs = [gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, cfg, causal=True) for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    # the same gradients as the fused run, within bf16 rounding (dK and dV: the same kernel)
    for a, b in zip(runs[0], fused):
        assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max()


def test_the_heaviest_first_order_changes_no_bit():
    """LPT_UNITS only reorders the CTAs (each computes the same thing): dK and dV agree
    exactly with the grid order, in groups of 1, 3 and 64 units, split and not."""
    q, k, v, do, o, lse2 = causal_inputs(3, 8, 2, 1500, seed=5)
    delta = (o.float() * do.float()).sum(-1)
    cfg = GluonBwdConfig(BLOCK_M=64)
    for split in ((1, 1), (2, 2)):
        runs = [gluon_backward.gluon_dkdv(q, k, v, do, lse2, delta, cfg, causal=True, sm_scale=128 ** -0.5,
                                          split=split, lpt=lpt) for lpt in (0, 1, 3, 64)]
        for dk, dv in runs[1:]:
            assert torch.equal(dk, runs[0][0]) and torch.equal(dv, runs[0][1])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", ["m64-fused", "m64-fused-late"])
def test_the_dq_share_first_changes_no_bit(causal, config):
    """The config's DQ_FIRST (the fused dQ share's wgmmas ahead of dV's and dK's) only orders the
    same work: dK and dV agree exactly with it off, dQ too but for the fused dQ's reduce-adds (any
    order), on grouped heads, a split and lengths that end inside a block (and Nq != Nk, with a CTA
    of no query block under causal masking), and against the reference."""
    cfg, _gdq, split = CONFIGS[config]
    for hq, hkv, n_q, n_k, dkdv_split in ((8, 2, 1000, 1000, split), (4, 1, 333, 1000, 4), (8, 8, 130, 130, split)):
        q, k, v, do, o, lse2 = causal_inputs(2, hq, hkv, n_q, seed=11)
        if n_k != n_q:
            k, v = (torch.randn(2, hkv, n_k, 128, device="cuda", dtype=q.dtype) for _ in range(2))
        o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, default_gluon_config(128), causal=causal)
        runs = [gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, dataclasses.replace(cfg, DQ_FIRST=on),
                                                        causal=causal, dkdv_split=dkdv_split) for on in (0, 1)]
        torch.cuda.synchronize()
        assert_the_same_gradients(cfg, *runs, where=(hq, hkv, n_q, n_k))
    check_gluon_backward(1000, 1000, 128, causal=causal, config=config + "-first")
    check_gluon_backward(777, 777, 64, causal=causal, config=config + "-first", heads=(4, 1))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", ["m64", "m64-fused", "m64-fused-late", "m64-fused-first", "m64-fused-late-first"])
def test_the_tma_store_of_dk_dv_gives_the_register_stores_bits(causal, config, monkeypatch):
    """dK and dV out through the groups' K and V tiles and TMA bulk stores (rows past Nk clipped by
    the descriptors) give the register stores' bits (what a split launch and outputs the copy engine
    cannot address take; forced here), dQ too but for the fused dQ's reduce-adds (any order):
    grouped heads, lengths that end inside a block, Nq != Nk (a CTA of no query block under causal
    masking), a split (the register stores either way), fp16; and against the reference."""
    cfg = CONFIGS[config][0]
    # unsplit (1) where the TMA store is taken; a split (4) keeps the register stores
    for hq, hkv, n_q, n_k, dkdv_split, dtype in ((8, 2, 1000, 1000, 1, torch.bfloat16),
                                                 (4, 1, 333, 1000, 4, torch.bfloat16),
                                                 (4, 4, 700, 190, 1, torch.float16),
                                                 (8, 8, 130, 130, 1, torch.bfloat16)):
        q, k, v, do, o, lse2 = causal_inputs(2, hq, hkv, n_q, seed=13)
        q, do = q.to(dtype), do.to(dtype)
        k, v = (torch.randn(2, hkv, n_k, 128, device="cuda", dtype=dtype) for _ in range(2))
        o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, default_gluon_config(128),
                                                        causal=causal)
        runs = []
        for on in (False, True):
            with monkeypatch.context() as patch:
                if not on:
                    patch.setattr(gluon_backward, "_tma_dkdv", lambda *a, **kw: False)
                runs.append(gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, cfg, causal=causal,
                                                                    dkdv_split=dkdv_split))
        torch.cuda.synchronize()
        assert_the_same_gradients(cfg, *runs, where=(hq, hkv, n_q, n_k, dtype))
    check_gluon_backward(1000, 1000, 128, causal=causal, config=config, split=1)
    check_gluon_backward(777, 777, 64, causal=causal, config=config, heads=(4, 1), split=1)


@pytest.mark.parametrize("config", ["m64", "m64-gdq", "m64-fused"])
@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
@pytest.mark.parametrize("n_q,n_k", [(1000, 300), (300, 1000), (511, 511)])
def test_gluon_backward_bottom_right_and_fp16(dtype_name, n_q, n_k, config):
    check_gluon_backward(n_q, n_k, 64, dtype_name=dtype_name, causal=True, causal_align="bottom_right",
                         config=config)


@pytest.mark.parametrize("config", ["m64", "m64-gdq", "m64-fused"])
@pytest.mark.parametrize("layout", ["bnhd", "bhdn", "shifted", "padded"])
def test_gluon_backward_strided_layouts(layout, config):
    check_gluon_backward(777, 777, 128, causal=True, layout=layout, config=config)


@pytest.mark.parametrize("family", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n,d,heads", [(1000, 128, (8, 2)), (4096, 64, (4, 4)), (333, 128, (4, 1))])
def test_attention_trains_through_a_gluon_bwd_config(n, d, heads, causal, family):
    """flashtune.attention with a BwdConfig of family 1 or 2: autograd's backward runs the
    Gluon kernels (the forward its default), checked as every backward is (check_attention:
    o, lse, every gradient, the gradients' layouts)."""
    from kernel_checks import check_attention

    from flashtune.configs.backward import BwdConfig

    gen = torch.Generator().manual_seed(n * 31 + d + family)
    hq, hkv = heads
    q = make_tensor((2, hq, n, d), layout="bhnd", dtype=torch.bfloat16, device="cuda", gen=gen)
    k, v = (make_tensor((2, hkv, n, d), layout="bhnd", dtype=torch.bfloat16, device="cuda", gen=gen)
            for _ in range(2))
    do = make_tensor((2, hq, n, d), layout="bhnd", dtype=torch.bfloat16, device="cuda", gen=gen)
    cfg = BwdConfig(64, 64, 128, 64, 4, 2, 8, 3, family=family).canonical()
    check_attention(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do, dtype_name="bf16",
                    causal=causal, bwd_config=cfg)
