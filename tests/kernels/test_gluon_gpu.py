"""On an H100/H200: the Gluon forward (kernels/gluon/forward.py) against the references.

Marked ``gpu``; skipped without CUDA and on any GPU but compute capability 9.0 (the
kernel is sm_90 only). Forward only: o and the base-2 log-sum-exp, checked by
kernel_checks.py's rule (error vs float64 <= factor x the error of torch in the input
dtype + slack: fp16 2x + 1e-3, bf16 2x + 1e-2; LSE 2x the fp32 reference's + 1e-3).
The float64 truth is ``reference_attention``; the baseline for o is SDPA's math backend
in the input dtype, for the LSE ``reference_attention`` in float32.

Run: ``python -m pytest -m gpu tests/kernels/test_gluon_gpu.py -q``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import assert_close_to_reference, make_tensor, smoke_in_subprocess, tolerance, torch_precision

from flashtune.kernels import reference_attention
from flashtune.kernels.common import LN2

gluon_forward = pytest.importorskip("flashtune.kernels.gluon.forward_launch", reason="this triton has no Gluon")
from flashtune.configs.gluon import GluonFwdConfig, default_gluon_config  # noqa: E402
from flashtune.kernels import passes  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="the Gluon forward runs on compute capability 9.0 (H100/H200) only"),
]

# A kernel with mbarrier rings that has never run can hang rather than fail: one small call
# runs first in a process of its own, under a timeout, and if it does not come back every test
# here fails at once with that said, instead of holding the GPU run until its limit.
SMOKE = """
import torch
from flashtune.configs.gluon import GluonFwdConfig
from flashtune.kernels.gluon import forward_launch as g
for pingpong in (0, 1):
    q, k, v = (torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g.gluon_attention_forward(q, k, v, GluonFwdConfig(PINGPONG=pingpong), causal=True, sm_scale=None)
    torch.cuda.synchronize()
"""


@pytest.fixture(scope="module", autouse=True)
def _the_kernel_comes_back():
    smoke_in_subprocess(SMOKE, what="the Gluon forward", hang_hint="a hang on a 1x2x200x64 call: docs/gluon.md "
                        "says how to tell the ring from the ping-pong")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LENGTHS = [(n, n) for n in (1, 17, 1000, 1024, 4096)] + [(1000, 4096), (4096, 1000)]


def _inputs(n_q, n_k, d, dtype, *, heads=(8, 2), batch=2, layout="bhnd", seed=0):
    gen = torch.Generator().manual_seed(seed * 1000003 + n_q * 7919 + n_k * 31 + d)
    hq, hkv = heads
    q = make_tensor((batch, hq, n_q, d), layout=layout, dtype=dtype, device="cuda", gen=gen)
    k = make_tensor((batch, hkv, n_k, d), layout=layout, dtype=dtype, device="cuda", gen=gen)
    v = make_tensor((batch, hkv, n_k, d), layout=layout, dtype=dtype, device="cuda", gen=gen)
    return q, k, v


def check_gluon_forward(q, k, v, *, dtype_name, causal, config=None, sm_scale=None, same_strides=True):
    """Run the Gluon forward and check o and lse against the float64 reference; returns errors."""
    B, H, n_q, d = q.shape
    config = config or default_gluon_config(d)
    o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, config, causal=causal, sm_scale=sm_scale)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse2.shape == (B, H, n_q) and lse2.dtype == torch.float32
    if same_strides:  # dense q that the descriptors address as it is: o in its layout
        assert o.stride() == q.stride(), (o.stride(), q.stride())
    tol = tolerance(dtype_name, q.device)
    errors = {}
    for b in range(B):  # one batch entry at a time: the float64 scores of 4096 x 4096 x 8 heads are 1 GiB
        qb, kb, vb = q[b:b + 1], k[b:b + 1], v[b:b + 1]
        o_true, lse_true = reference_attention(qb, kb, vb, causal=causal, sm_scale=sm_scale, dtype=torch.float64)
        with torch_precision(q.dtype, False):
            o_base = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=sm_scale,
                                                    enable_gqa=q.shape[1] != k.shape[1])
        lse_base = reference_attention(qb, kb, vb, causal=causal, sm_scale=sm_scale, dtype=torch.float32)[1]
        errors[f"o[{b}]"] = assert_close_to_reference(f"o[{b}]", o[b:b + 1], o_true, o_base, tol=tol)
        errors[f"lse[{b}]"] = assert_close_to_reference(f"lse[{b}]", lse2[b:b + 1].double() * LN2, lse_true,
                                                        lse_base, tol=tol, lse=True)
    return errors


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_q, n_k", LENGTHS, ids=[f"q{a}k{b}" for a, b in LENGTHS])
def test_matrix(n_q, n_k, head_dim, causal, dtype_name):
    """B=2, 8 query heads on 2 key heads (GQA), odd lengths, Nq != Nk both ways."""
    q, k, v = _inputs(n_q, n_k, head_dim, DTYPES[dtype_name])
    check_gluon_forward(q, k, v, dtype_name=dtype_name, causal=causal)


@pytest.mark.parametrize("layout", ["bnhd", "bhdn", "shifted", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_layouts(layout, causal):
    """(B, N, H, D) storage goes through the TMA descriptors as it is; a head dim that is
    not unit-stride or a base that is not 16-byte aligned is made contiguous first."""
    q, k, v = _inputs(1000, 1000, 128, torch.bfloat16, layout=layout)
    check_gluon_forward(q, k, v, dtype_name="bf16", causal=causal, same_strides=layout == "bnhd")


CONFIGS = [
    GluonFwdConfig(),
    GluonFwdConfig(NUM_BUFFERS=3),
    GluonFwdConfig(BLOCK_N=64),
    GluonFwdConfig(PINGPONG=0),
    GluonFwdConfig(PRODUCER_REGS=32, CONSUMER_REGS=232),
    GluonFwdConfig(OVERLAP=0),
    GluonFwdConfig(OVERLAP=0, PINGPONG=0),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.short())
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_configs(config, head_dim, causal):
    q, k, v = _inputs(1000, 1000, head_dim, torch.float16, heads=(4, 4), seed=1)
    check_gluon_forward(q, k, v, dtype_name="fp16", causal=causal, config=config)


D256_CONFIGS = [GluonFwdConfig(BLOCK_N=64, NUM_BUFFERS=n, PERSISTENT=p, OVERLAP=o, PINGPONG=pp)  # 3: V's ring 2
                for n, p, o, pp in ((2, 0, 1, 1), (2, 1, 1, 1), (2, 0, 0, 1), (2, 1, 0, 1), (2, 0, 1, 0), (3, 0, 1, 1),
                                    (3, 1, 1, 1), (3, 1, 0, 1))]


@pytest.mark.parametrize("config", D256_CONFIGS, ids=lambda c: c.short())
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (129, 77), (1000, 1000), (777, 2048), (2048, 1000)],
                         ids=lambda n: str(n))
def test_d256(n_q, n_k, causal, dtype_name, config):
    """Head dim 256 (64-key blocks in 2 or 3 slots: configs.gluon.GLUON_FWD_HEAD_DIMS): GQA, odd lengths, Nq != Nk
    both ways, the grid and the persistent kernel, with and without the overlap and the ping-pong."""
    q, k, v = _inputs(n_q, n_k, 256, DTYPES[dtype_name], heads=(4, 2), seed=n_q + n_k)
    check_gluon_forward(q, k, v, dtype_name=dtype_name, causal=causal, config=config.validate(256, q.dtype))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_d256_trains_through_attention(causal, monkeypatch):
    """The drop-in at D=256 with each Gluon forward family_defaults offers (the Triton backward on
    its output and LSE): the output, LSE and every gradient against the reference."""
    from kernel_checks import check_attention

    from flashtune.heuristics.defaults import family_defaults

    q, k, v = (t.requires_grad_() for t in _inputs(777, 1000, 256, torch.bfloat16, heads=(4, 2), seed=9))
    do = torch.randn_like(q)
    configs = family_defaults("fwd", 256, q.dtype, q.device)
    assert len(configs) == 8 and all(c.family == 1 for c in configs)
    seen = []
    real = gluon_forward.gluon_attention_forward
    monkeypatch.setattr(passes, "gluon_attention_forward", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    for cfg in configs:
        check_attention(q, k, v, do, dtype_name="bf16", causal=causal, fwd_config=cfg)
    assert seen == [1] * len(configs)


def test_d64_128_row_tiles():
    cfg = GluonFwdConfig(BLOCK_M=128, BLOCK_N=64, NUM_BUFFERS=3)
    for causal in (False, True):
        q, k, v = _inputs(1000, 777, 64, torch.bfloat16, seed=2)
        check_gluon_forward(q, k, v, dtype_name="bf16", causal=causal, config=cfg)


@pytest.mark.parametrize("causal_align", ["top_left", "bottom_right"])
def test_heaviest_first_order_across_heads_gives_the_grid_order_bits(causal_align, monkeypatch):
    """The forward's 1-D heaviest-first grid (schedule.query_lpt_units): each CTA computes the same
    rows whatever the order, so o and the LSE are bitwise those of the 3-D grid, for groups of 1, 5
    (a short last group) and every unit."""
    q, k, v = _inputs(1000, 1300, 128, torch.bfloat16, heads=(6, 2), batch=2, seed=5)
    outs = {}
    for units in (0, 1, 5, 12):
        monkeypatch.setattr(gluon_forward, "query_lpt_units", lambda *a, units=units, **kw: units)
        outs[units] = gluon_forward.gluon_attention_forward(q, k, v, GluonFwdConfig(), causal=True, sm_scale=None,
                                                            causal_align=causal_align)
    for units in (1, 5, 12):
        for a, b in zip(outs[units], outs[0]):
            assert torch.equal(a, b), units


def test_sm_scale_and_bottom_right_rows_without_keys():
    q, k, v = _inputs(300, 200, 64, torch.bfloat16, seed=3)
    check_gluon_forward(q, k, v, dtype_name="bf16", causal=True, sm_scale=0.3)
    # bottom-right with Nq > Nk: the first 100 queries see no key (o 0, lse -inf)
    o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, GluonFwdConfig(), causal=True, sm_scale=None,
                                                    causal_align="bottom_right")
    torch.cuda.synchronize()
    assert (o[:, :, :100] == 0).all() and torch.isneginf(lse2[:, :, :100]).all()
    o_true, lse_true = reference_attention(q, k, v, causal=True, dtype=torch.float64, causal_align="bottom_right")
    torch.testing.assert_close(o[:, :, 100:].double(), o_true[:, :, 100:], atol=2e-2, rtol=0)
    torch.testing.assert_close(lse2[:, :, 100:].double() * LN2, lse_true[:, :, 100:], atol=2e-3, rtol=0)


FMA_CASES = [(1, 1, 64), (17, 17, 128), (1000, 1000, 128), (1000, 4096, 64), (4096, 1000, 128)]


@pytest.mark.parametrize("overlap", [0, 1])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q,n_k,d", FMA_CASES, ids=[f"{a}x{b}-d{c}" for a, b, c in FMA_CASES])
def test_the_fma_softmax_matches_the_reference(n_q, n_k, d, causal, overlap):
    """A positive sm_scale: the row max of the raw scores scaled once, one multiply-add a score;
    against float64."""
    q, k, v = _inputs(n_q, n_k, d, torch.bfloat16, seed=6)
    cfg = GluonFwdConfig(NUM_BUFFERS=3 if d == 128 else 2, OVERLAP=overlap)
    check_gluon_forward(q, k, v, dtype_name="bf16", causal=causal, config=cfg)


# the output through its Q tile and one TMA bulk store a consumer (16-bit, an addressable o): rows
# that end inside a tile (the descriptor clips them), Nq != Nk both ways, grouped heads, the
# (B, N, H, D) layout, bottom-right rows that see no key, fp16
TMA_STORE_CASES = [  # n_q, n_k, d, heads, layout, causal_align
    (777, 1000, 128, (8, 2), "bhnd", "top_left"),
    (1000, 333, 64, (4, 4), "bnhd", "bottom_right"),
    (129, 4096, 128, (8, 1), "bnhd", "top_left"),
    (2048, 2048, 64, (8, 8), "bhnd", "top_left"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", [GluonFwdConfig(NUM_BUFFERS=3), GluonFwdConfig(OVERLAP=0),
                                    GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1)], ids=lambda c: c.short())
@pytest.mark.parametrize("case", TMA_STORE_CASES, ids=lambda c: f"q{c[0]}k{c[1]}d{c[2]}h{c[3][0]}-{c[3][1]}{c[4]}")
def test_the_tma_store_of_o_gives_the_register_stores_bits(case, config, causal, monkeypatch):
    """The TMA store: o and the LSE bit for bit the register store's (the same values, stored
    another way; the register store is what an output the copy engine cannot address takes, forced
    here), and nothing written past the rows: o is compared whole, padding rows included where q's
    storage has them (the (B, N, H, D) layout interleaves heads)."""
    n_q, n_k, d, heads, layout, align = case
    dtype = torch.float16 if d == 64 else torch.bfloat16
    q, k, v = _inputs(n_q, n_k, d, dtype, heads=heads, layout=layout, seed=9)
    kw = dict(causal=causal, causal_align=align)
    o_tma, lse_tma = gluon_forward.gluon_attention_forward(q, k, v, config, **kw)
    monkeypatch.setattr(gluon_forward, "_tma_store", lambda dtype: False)
    o_reg, lse_reg = gluon_forward.gluon_attention_forward(q, k, v, config, **kw)
    torch.cuda.synchronize()
    assert o_tma.stride() == o_reg.stride() == q.stride()
    assert torch.equal(o_tma, o_reg)
    assert torch.equal(lse_tma, lse_reg)


# causal calls whose tiles straddle the diagonal at odd offsets: Nq != Nk both ways, both alignments
# (bottom-right with Nq > Nk: rows that see no key), lengths that end inside a block
ROW_LIMIT_CASES = [(1000, 1000, 128, "top_left"), (777, 1100, 128, "bottom_right"), (1100, 777, 64, "bottom_right"),
                   (300, 2000, 64, "top_left"), (130, 130, 128, "top_left")]


@pytest.mark.parametrize("config", [GluonFwdConfig(NUM_BUFFERS=3), GluonFwdConfig(OVERLAP=0),
                                    GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1),
                                    GluonFwdConfig(BLOCK_N=64, NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1)],
                         ids=lambda c: c.short())
@pytest.mark.parametrize("case", ROW_LIMIT_CASES, ids=lambda c: f"q{c[0]}k{c[1]}d{c[2]}-{c[3]}")
def test_the_diagonal_blocks_causal_mask_matches_the_reference(case, config):
    """A diagonal block's causal mask (one compare a score against its row's limit): o and the LSE
    against float64 (rows that see no key: o exactly 0, lse -inf)."""
    n_q, n_k, d, align = case
    q, k, v = _inputs(n_q, n_k, d, torch.bfloat16, seed=12)
    o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, config, causal=True, causal_align=align)
    torch.cuda.synchronize()
    o_true, lse_true = reference_attention(q, k, v, causal=True, causal_align=align, dtype=torch.float64)
    rows = torch.isfinite(lse_true)
    assert (o[~rows[..., None].expand_as(o)] == 0).all() and torch.isneginf(lse2[~rows]).all()
    torch.testing.assert_close(o.double(), o_true, atol=2e-2, rtol=0)
    torch.testing.assert_close((lse2.double() * LN2)[rows], lse_true[rows], atol=2e-3, rtol=0)


def test_the_tma_store_of_o_matches_the_reference():
    for d, causal in ((128, True), (64, False)):
        q, k, v = _inputs(1000, 1100, d, torch.bfloat16, seed=10)
        check_gluon_forward(q, k, v, dtype_name="bf16", causal=causal)


@pytest.mark.parametrize("overlap", [0, 1])
def test_a_negative_sm_scale_takes_the_row_max_of_the_scaled_scores(overlap):
    # a positive scale commutes with the row max (SCALE_POSITIVE: raw max, scaled once, one
    # multiply-add a score); a negative one does not, and runs the other way
    q, k, v = _inputs(300, 500, 64, torch.bfloat16, seed=4)
    for causal in (False, True):
        check_gluon_forward(q, k, v, dtype_name="bf16", causal=causal, sm_scale=-0.2,
                            config=GluonFwdConfig(OVERLAP=overlap))


def test_lse_feeds_flashtune_backward():
    """The base-2 LSE is the one flashtune's forward returns (the backward reads it)."""
    from flashtune.kernels import attention_forward, default_config
    q, k, v = _inputs(1024, 1024, 128, torch.bfloat16, seed=4)
    for causal in (False, True):
        sm_scale = 128 ** -0.5
        _, lse_gluon = gluon_forward.gluon_attention_forward(q, k, v, GluonFwdConfig(), causal=causal,
                                                             sm_scale=sm_scale)
        _, lse_triton = attention_forward(q, k, v, default_config("fwd", 128, q.dtype, q.device), causal=causal,
                                          sm_scale=sm_scale)
        torch.testing.assert_close(lse_gluon, lse_triton, atol=2e-3, rtol=0)


@pytest.mark.parametrize("persistent", [0, 1], ids=["grid", "persistent"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_gluon_fwd_config_trains_through_attention(causal, head_dim, persistent, monkeypatch):
    """FwdConfig(family=1) through flashtune.attention: the Gluon forward (``persistent``: its
    persistent grid, as the search may choose it), then flashtune's backward on its output and
    LSE; the output, LSE and every gradient against the reference."""
    from kernel_checks import check_attention

    from flashtune.heuristics.defaults import family_defaults

    q, k, v = (t.requires_grad_() for t in _inputs(777, 1000, head_dim, torch.bfloat16, seed=5))
    do = torch.randn_like(q)
    cfg = family_defaults("fwd", head_dim, q.dtype, q.device)[persistent]  # the grid's, then the persistent
    assert cfg.family == 1 and cfg.gluon() == dataclasses.replace(default_gluon_config(head_dim),
                                                                  PERSISTENT=persistent)
    seen = []
    real = gluon_forward.gluon_attention_forward
    monkeypatch.setattr(passes, "gluon_attention_forward", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    check_attention(q, k, v, do, dtype_name="bf16", causal=causal, fwd_config=cfg)
    assert seen == [1]


# ----------------------------------------------------------------------------------
# Sliding window (WINDOW): the CTA's key blocks start at its first row's first key
# ----------------------------------------------------------------------------------
WINDOW_CASES = [  # n_q, n_k, head_dim, causal, causal_align, window_size
    (4096, 4096, 128, True, "top_left", (1000, 0)),  # Mistral's kind: an edge inside a block
    (1000, 1000, 64, False, "top_left", (300, 200)),
    (1000, 4096, 128, True, "bottom_right", (500, -1)),
    (777, 1000, 128, False, "top_left", (-1, 100)),
    (2000, 700, 64, False, "top_left", (64, 64)),  # queries past 764 see no key (o 0, lse -inf)
]


@pytest.mark.parametrize("overlap", [1, 0], ids=["overlap", "sequential"])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: f"q{c[0]}k{c[1]}d{c[2]}{'c' if c[3] else ''}w{c[5]}")
def test_window_trains_through_attention(case, overlap, monkeypatch):
    """A Gluon config with window_size through flashtune.attention: the Gluon forward's
    WINDOW variant, then the Triton backward on its output and LSE; o, the LSE and every
    gradient against the float64 reference with the same window (kernel_checks)."""
    from kernel_checks import check_attention

    from flashtune.kernels import FwdConfig

    n_q, n_k, d, causal, align, window = case
    q, k, v = (t.requires_grad_() for t in _inputs(n_q, n_k, d, torch.bfloat16, batch=1, seed=6))
    do = torch.randn_like(q)
    cfg = FwdConfig(64, 128, 4, 3 if d == 128 and overlap else 2, family=1, overlap=overlap)
    seen = []
    real = gluon_forward.gluon_attention_forward
    monkeypatch.setattr(passes, "gluon_attention_forward", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    check_attention(q, k, v, do, dtype_name="bf16", causal=causal, fwd_config=cfg, causal_align=align,
                    window=window)
    assert [kw["window_size"] for kw in seen] == [window]


@pytest.mark.parametrize("overlap", [1, 0], ids=["overlap", "sequential"])
def test_window_never_loads_keys_outside_it(overlap):
    """Keys no query of the call sees hold NaN: a kernel that loaded and masked them would
    spread it (0 x NaN is NaN in P V); the window's CTAs must skip them."""
    q, k, v = _inputs(1000, 4096, 128, torch.bfloat16, batch=1, seed=7)
    cfg = GluonFwdConfig(NUM_BUFFERS=3 if overlap else 2, OVERLAP=overlap)
    for causal, align, window, outside in (
            # bottom-right, (200, 0): query 0's first key is 3096 - 200, every CTA starts at block 22 or later
            (True, "bottom_right", (200, 0), slice(0, 22 * 128)),
            # top-left, right side 100: the last query's last key is 999 + 100, no CTA reaches block 9
            (False, "top_left", (-1, 100), slice(9 * 128, None))):
        kn, vn = k.clone(), v.clone()
        kn[:, :, outside], vn[:, :, outside] = float("nan"), float("nan")
        o, lse2 = gluon_forward.gluon_attention_forward(q, kn, vn, cfg, causal=causal, causal_align=align,
                                                        window_size=window)
        torch.cuda.synchronize()
        assert torch.isfinite(o).all() and not torch.isnan(lse2).any(), (causal, window)
        o_true, lse_true = reference_attention(q, k, v, causal=causal, causal_align=align, window_size=window,
                                               dtype=torch.float64)
        torch.testing.assert_close(o.double(), o_true, atol=2e-2, rtol=0)
        torch.testing.assert_close(lse2.double() * LN2, lse_true, atol=2e-3, rtol=0)


@pytest.mark.parametrize("config", [GluonFwdConfig(BLOCK_N=64, NUM_BUFFERS=3, PERSISTENT=1),
                                    GluonFwdConfig(BLOCK_N=64, OVERLAP=0)], ids=lambda c: c.short())
def test_d256_window(config):
    """The WINDOW variant at head dim 256: o and the LSE against float64."""
    q, k, v = _inputs(1000, 2048, 256, torch.bfloat16, heads=(4, 2), seed=12)
    for causal, align, window in ((True, "top_left", (300, 0)), (True, "bottom_right", (500, -1)),
                                  (False, "top_left", (-1, 100)), (False, "top_left", (64, 64))):
        o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, config, causal=causal, causal_align=align,
                                                        window_size=window)
        torch.cuda.synchronize()
        o_true, lse_true = reference_attention(q, k, v, causal=causal, causal_align=align, window_size=window,
                                               dtype=torch.float64)
        rows = torch.isfinite(lse_true)  # rows that see no key: o 0 and lse -inf both ways
        torch.testing.assert_close(o.double(), o_true, atol=2e-2, rtol=0)
        torch.testing.assert_close((lse2.double() * LN2)[rows], lse_true[rows], atol=2e-3, rtol=0)


# ----------------------------------------------------------------------------------
# fp8 (FP8): attention_fp8 with a Gluon config, against the dequantized float64 reference
# ----------------------------------------------------------------------------------
def _fp8_cases():
    from test_fp8 import E4M3, E5M2, Fp8Case

    from flashtune.kernels import FwdConfig

    def g(d, overlap):
        return FwdConfig(64, 128, 4, 3 if overlap else 2, family=1, overlap=overlap)
    return [
        Fp8Case(E4M3, False, 1000, 1000, 128, heads=(4, 2), config=g(128, 1)),  # 1000 keys: V^T padded to 1008
        Fp8Case(E4M3, True, 1000, 1000, 128, heads=(4, 2), config=g(128, 0), out_dtype=torch.bfloat16),
        Fp8Case(E4M3, True, 777, 1000, 64, heads=(4, 1), config=g(64, 1), causal_align="bottom_right", q_gain=3.0),
        Fp8Case(E4M3, False, 300, 777, 64, batch=2, config=g(64, 0), v_layout="bhdn"),  # V given keys-contiguous
        Fp8Case(E4M3, True, 2048, 2048, 128, heads=(2, 1), config=g(128, 1), window=(300, 0)),
        Fp8Case(E5M2, True, 1000, 700, 128, heads=(2, 2), config=g(128, 1), causal_align="bottom_right"),
    ]


@pytest.mark.parametrize("case", _fp8_cases(), ids=str)
def test_fp8_gluon_matches_the_dequantized_reference(case, monkeypatch):
    """The FP8 variant (fp8 wgmma; V^T tiles; P in registers, or through shared memory with
    the overlap) under test_fp8.py's derived error bound, forward only; the Gluon kernel must
    be the one that ran."""
    from test_fp8 import check_fp8

    seen = []
    real = gluon_forward.gluon_attention_forward
    monkeypatch.setattr(passes, "gluon_attention_forward", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    check_fp8(case, "cuda")
    assert seen == [1]
