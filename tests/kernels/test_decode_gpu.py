"""On the GPU: the split-KV forward, grouped-query packing, bottom-right causal and the
fp32 precision at real sizes (bf16 mostly), forward and every gradient against float64
(kernel_checks.py's rule). Marked ``gpu``; skipped without CUDA."""

from __future__ import annotations

import itertools

import pytest
import torch
from kernel_checks import Case, case_inputs, check_attention, reference_outputs, sdpa_outputs

from flashtune.kernels import BwdConfig, FwdConfig, attention

pytestmark = pytest.mark.gpu

F = FwdConfig
DEVICE = torch.device("cuda") if torch.cuda.is_available() else None


def _cases() -> list[Case]:
    # SHAPES.md's decode rows (batch cut where the float64 reference would be large) with
    # the default config, and two with explicit schedules (splits + TMA, the plain kernel)
    cases = [Case("bf16", False, 1, n_k, d, heads=(hq, hkv), batch=b)
             for b, hq, hkv, n_k, d in [(1, 32, 8, 65536, 128), (8, 32, 8, 4096, 128), (4, 64, 8, 2048, 128),
                                        (4, 8, 1, 8192, 256)]]
    cases += [Case("bf16", False, 1, 4096, 128, heads=(32, 8), batch=8, fwd=F(64, 128, 4, 2, num_splits=7, pack_gqa=1,
                                                                                tma=1)),
              Case("bf16", False, 1, 8192, 256, heads=(8, 1), batch=4, fwd=F(64, 64, 4, 2, num_splits=1, pack_gqa=0))]
    # decode Nq 2..16 (speculative steps) causal bottom-right, Nk not a block multiple,
    # TMA K/V loads, GQA groups 1..8
    for n_q, heads, d, tma in ((5, (16, 2), 64, 1), (16, (8, 8), 128, 0), (9, (8, 1), 40, 0)):
        cases.append(Case("bf16", True, n_q, 3001, d, heads=heads, batch=3, causal_align="bottom_right",
                          fwd=F(64, 128, 4, 3, tma=tma)))
    # chunked prefill (Nq < Nk) bottom-right, plain and split kernels
    cases += [Case("bf16", True, 1000, 4096, 128, heads=(8, 2), batch=1, causal_align="bottom_right", fwd=fwd,
                   bwd=BwdConfig(64, 128, 128, 64, 8, 3, 8, 3))
              for fwd in (None, F(64, 64, 4, 2, num_splits=3, pack_gqa=1))]
    # strided layouts through the split kernel; fp16 and fp32 too
    cases += [Case("bf16", False, 3, 2000, 128, heads=(16, 4), batch=2, layout=layout,
                   fwd=F(64, 128, 4, 2, num_splits=5, pack_gqa=1, tma=1)) for layout in ("bnhd", "shifted")]
    cases += [Case("fp16", False, 1, 5000, 64, heads=(8, 2), batch=2),
              Case("fp32-ieee", True, 1, 5000, 64, heads=(8, 2), batch=2, causal_align="bottom_right")]
    # cross-attention and ViT shapes: short keys, odd lengths
    cases += [Case("bf16", False, 4096, 77, 40, heads=(8, 8), batch=2), Case("bf16", False, 257, 257, 64,
                                                                                heads=(16, 16), batch=4)]
    return cases


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_realistic_decode_and_bottom_right(case):
    q, k, v, do = case_inputs(case, DEVICE)
    errors = check_attention(q, k, v, do, dtype_name=case.dtype, causal=case.causal, fwd_config=case.fwd,
                             bwd_config=case.bwd, check_strides=True, causal_align=case.causal_align,
                             cross_check_reference=case.n_q * case.n_k <= 1 << 20)
    print(case, {name: f"{e:.2e}" for name, e in errors.items()})


@pytest.mark.parametrize("splits", [16, 100])
def test_split_lse_equals_unsplit(splits):
    case = Case("bf16", False, 1, 8191, 128, heads=(32, 8), batch=2)
    q, k, v, _ = case_inputs(case, DEVICE)
    o1, lse1 = attention(q, k, v, return_lse=True, fwd_config=F(64, 64, 4, 2, num_splits=1, pack_gqa=0))
    o2, lse2 = attention(q, k, v, return_lse=True, fwd_config=F(64, 64, 4, 2, num_splits=splits, pack_gqa=1))
    torch.testing.assert_close(lse2, lse1, rtol=4e-6, atol=4e-6)
    torch.testing.assert_close(o2, o1, rtol=1e-2, atol=1e-2)  # bf16 rounding of O


def test_bottom_right_rows_without_keys_match_sdpa():
    from torch.nn.attention.bias import causal_lower_right

    case = Case("bf16", True, 300, 100, 64, heads=(8, 2), batch=2)
    q, k, v, do = case_inputs(case, DEVICE)
    o = attention(q, k, v, causal=True, causal_align="bottom_right")
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=causal_lower_right(300, 100), enable_gqa=True)
    assert (o[:, :, :200] == 0).all()
    torch.testing.assert_close(o.float()[:, :, 200:], want[:, :, 200:], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("causal", [True])
def test_fp32_default_is_within_twice_an_fp32_attention(causal):
    """torch's default matmul precision ("highest"): fp32 outputs and gradients within 2x
    the error of SDPA's math backend in fp32 (plus 1e-6), against float64; and tf32x3 too."""
    assert torch.get_float32_matmul_precision() == "highest"
    case = Case("fp32-ieee", causal, 1000, 1000, 128, heads=(8, 2), batch=2)
    q, k, v, do = case_inputs(case, DEVICE)
    truth = reference_outputs(q, k, v, do, causal=causal, sm_scale=None)
    fp32 = sdpa_outputs(q, k, v, do, causal=causal, sm_scale=None, dtype=torch.float32)
    for precision in (None, "tf32x3"):
        o = attention(q, k, v, causal=causal, fp32_precision=precision)
        grads = torch.autograd.grad(o, (q, k, v), do)
        ratios = {}
        for name, ours in zip(("o", "dq", "dk", "dv"), (o, *grads)):
            err = (ours.double() - getattr(truth, name)).abs().max().item()
            base = (getattr(fp32, name).double() - getattr(truth, name)).abs().max().item()
            ratios[name] = err / base
            assert err <= 2 * base + 1e-6, (precision, name, err, base)
        print(precision or "default", "error / SDPA fp32 error:", {n: f"{r:.2f}" for n, r in ratios.items()})
