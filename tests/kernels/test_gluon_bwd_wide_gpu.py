"""On an H100/H200: the D=256 Gluon dK/dV kernel (kernels/gluon/backward_wide.py, with its fused
dQ or the Triton dQ kernel) against the references, through backward_launch.gluon_attention_backward.

Marked ``gpu``; skipped without CUDA and on any GPU but compute capability 9.0. The forward is the
Gluon forward at D=256 (o and the base-2 log-sum-exp the backward reads); dQ, dK and dV are
checked by kernel_checks.py's rule (error vs the float64 reference <= factor x the error of
torch's own attention in the input dtype + slack), on odd lengths, Nq != Nk with both causal
alignments, GQA groups 1, 2 and 4, split and unsplit key blocks, strided layouts, both 16-bit dtypes.

Run: ``python -m pytest -m gpu tests/kernels/test_gluon_bwd_wide_gpu.py -q``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kernel_checks import smoke_in_subprocess
from test_gluon_bwd_gpu import DTYPES, assert_gradients_match_the_reference, assert_the_same_gradients

gluon_backward = pytest.importorskip("flashtune.kernels.gluon.backward_launch", reason="this triton has no Gluon")
from flashtune.configs.gluon import default_gluon_config, default_wide_config  # noqa: E402
from flashtune.kernels.gluon import forward_launch as gluon_forward  # noqa: E402
from kernel_checks import make_tensor  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="the Gluon backward runs on compute capability 9.0 (H100/H200) only"),
]

SMOKE = """
import torch
from flashtune.configs.gluon import default_gluon_config, default_wide_config
from flashtune.kernels.gluon import backward_launch as g, forward_launch as f
q, k, v, do = (torch.randn(1, 2, 200, 256, device="cuda", dtype=torch.bfloat16) for _ in range(4))
o, lse2 = f.gluon_attention_forward(q, k, v, default_gluon_config(256), causal=True)
g.gluon_attention_backward(do, q, k, v, o, lse2, default_wide_config(), causal=True)
torch.cuda.synchronize()
"""


@pytest.fixture(scope="module", autouse=True)
def _the_kernel_comes_back():
    smoke_in_subprocess(SMOKE, what="the D=256 Gluon backward", hang_hint="a hang in an exchange or the ring on a "
                        "1x2x200x256 call")


W = default_wide_config()
# name -> (config, dkdv_split: 0 chosen from the shape, which on these small shapes splits the key blocks' work)
CONFIGS = {"b3-fused": (W, 0), "b3-fused-unsplit": (W, 1), "b2-fused": (dataclasses.replace(W, NUM_BUFFERS=2), 0),
           "b3-triton-dq": (dataclasses.replace(W, DQ_FUSED=0), 0),
           "b2-triton-dq-unsplit": (dataclasses.replace(W, NUM_BUFFERS=2, DQ_FUSED=0), 1)}


def check_wide(n_q, n_k, *, dtype_name="bf16", causal=True, heads=(4, 2), batch=2, config="b3-fused",
               causal_align="top_left", layout="bhnd", seed=0):
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(seed * 1000003 + n_q * 7919 + n_k * 31 + 256)
    hq, hkv = heads
    q = make_tensor((batch, hq, n_q, 256), layout=layout, dtype=dtype, device="cuda", gen=gen)
    k = make_tensor((batch, hkv, n_k, 256), layout=layout, dtype=dtype, device="cuda", gen=gen)
    v = make_tensor((batch, hkv, n_k, 256), layout=layout, dtype=dtype, device="cuda", gen=gen)
    do = make_tensor((batch, hq, n_q, 256), layout=layout, dtype=dtype, device="cuda", gen=gen)
    o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, default_gluon_config(256), causal=causal,
                                                    causal_align=causal_align)
    cfg, split = CONFIGS[config]
    grads = gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, cfg, causal=causal,
                                                    causal_align=causal_align, dkdv_split=split)
    torch.cuda.synchronize()
    dq, dk, dv = grads
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dq.dtype == dk.dtype == dv.dtype == dtype
    assert_gradients_match_the_reference(q, k, v, do, grads, causal=causal, causal_align=causal_align,
                                         dtype_name=dtype_name)
    return (q, k, v, do, o, lse2), grads


LENGTHS = [(n, n) for n in (1, 17, 130, 1000, 1024)] + [(1000, 2048), (2048, 1000), (64, 257)]


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q,n_k", LENGTHS, ids=[f"{a}x{b}" for a, b in LENGTHS])
def test_the_wide_backward_matches_the_reference(n_q, n_k, causal, config):
    if config != "b3-fused" and (n_q, n_k) not in ((130, 130), (1000, 1000), (2048, 1000), (64, 257)):
        pytest.skip("this config on four lengths only")
    check_wide(n_q, n_k, causal=causal, config=config)


@pytest.mark.parametrize("causal_align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("n_q,n_k", [(1000, 2048), (2048, 1000), (77, 300)], ids=["1000x2048", "2048x1000", "77x300"])
def test_the_wide_backward_both_causal_alignments(n_q, n_k, causal_align):
    check_wide(n_q, n_k, causal=True, causal_align=causal_align)


@pytest.mark.parametrize("heads", [(2, 2), (4, 1), (8, 2)], ids=["mha", "mqa4", "gqa4"])
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
def test_the_wide_backward_groups_and_dtypes(heads, dtype_name):
    check_wide(777, 777, heads=heads, dtype_name=dtype_name, causal=True)
    check_wide(513, 513, heads=heads, dtype_name=dtype_name, causal=False, config="b3-triton-dq")


@pytest.mark.parametrize("layout", ["bnhd", "bhdn"])
def test_the_wide_backward_strided_layouts(layout):
    check_wide(600, 600, layout=layout, causal=True)


def test_the_wide_backward_is_repeatable_and_deterministic_where_asked():
    """Two runs: dK and dV bit for bit (dQ's fused reduce-adds land in any order: within 1e-2); under
    torch.use_deterministic_algorithms the Triton dQ kernel runs instead, so dQ is bit for bit too."""
    (q, k, v, do, o, lse2), first = check_wide(1024, 1024, causal=True, heads=(4, 2))
    second = gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, W, causal=True)
    assert_the_same_gradients(W, first, second)
    torch.use_deterministic_algorithms(True)
    try:
        a = gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, W, causal=True)
        b = gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, W, causal=True)
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert_gradients_match_the_reference(q, k, v, do, a, causal=True)


def test_a_realistic_gemma2_step():
    """gemma2-d256-train-4k's heads at 1024 queries (16 query heads, 8 K/V heads, causal)."""
    check_wide(1024, 1024, heads=(16, 8), batch=1, causal=True, config="b3-fused-unsplit")
