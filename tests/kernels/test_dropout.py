"""Dropout on the attention probabilities (FlashAttention's): o = (mask * P / (1 - p)) V,
the log-sum-exp of the undropped scores, the mask regenerated in the backward from
(seed, offset) and never stored (kernels.common.Dropout).

- Exactness: outputs and every gradient against a float64 reference that applies the mask
  built by philox_reference (Philox4x32-10 in numpy from Random123's definition, itself
  checked against Random123's known answers), under FlashAttention's rule
  (kernel_checks.check_attention); also the mask read back from the kernel with V = I.
- Statistics: the keep rate (and that of key pairs sharing a Philox counter) within a
  binomial bound; the mean over independent masks approaches the output and gradients
  without dropout.
- Determinism and independence from the configs; dropout_p=0 is the kernel without it;
  bad arguments are named; the drop-in serves dropout with the kernels.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from kernel_checks import Case, VarlenCase, case_inputs, check_varlen, run_case
from philox_reference import dropout_mask, philox4x32_10

from flashtune.dispatch import get_tuned_attention
from flashtune.kernels import BwdConfig, FwdConfig, attention, reference_attention
from flashtune.kernels.triton import backward, forward

F, B = FwdConfig, BwdConfig
CONFIGS = [
    (F(16, 16, 4, 1), B(16, 16, 16, 16, 4, 1)),
    (F(32, 16, 4, 2), B(16, 32, 32, 16, 4, 1, atomic_dq=1)),
    (F(16, 32, 4, 1, tma=1), B(32, 16, 16, 32, 4, 1, tma=1, dkdv_split=2)),  # 16-bit inputs only
]
FP32_CONFIGS = CONFIGS[:2] + [(F(16, 32, 4, 1), B(32, 16, 16, 32, 4, 1, dkdv_split=2))]


def test_the_philox_reference_gives_random123s_known_answers():
    """Random123's kat_vectors for philox4x32_10: the reference mask's generator is Philox."""
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for counter, key, expected in cases:
        assert tuple(int(w) for w in philox4x32_10(counter, key)) == expected


# ----------------------------------------------------------------------------------
# Against the reference with the same mask
# ----------------------------------------------------------------------------------
def _cases() -> list[Case]:
    rows = [  # dtype, causal, align, (n_q, n_k), d, heads, p
        ("fp32-ieee", False, "top_left", (33, 47), 16, (2, 2), 0.3),
        ("fp32-ieee", True, "top_left", (47, 47), 32, (4, 2), 0.5),
        ("fp16", True, "bottom_right", (33, 69), 40, (2, 1), 0.2),
        ("fp16", False, "top_left", (37, 21), 16, (4, 2), 0.7),
        ("fp32-ieee", True, "bottom_right", (50, 30), 16, (4, 1), 0.1),  # the first 20 queries see no key
        ("fp32-tf32", False, "top_left", (17, 70), 64, (2, 2), 0.4),
    ]
    cases = []
    for i, (dtype, causal, align, (n_q, n_k), d, heads, p) in enumerate(rows):
        fwd, bwd = (CONFIGS if dtype == "fp16" else FP32_CONFIGS)[i % 3]
        cases.append(Case(dtype, causal, n_q, n_k, d, heads=heads, fwd=fwd, bwd=bwd, causal_align=align, dropout=p,
                          batch=1 + i % 2))
    cases.append(Case("fp32-ieee", False, 3, 40, 16, heads=(4, 2), dropout=0.25))  # decode-sized: the plain kernel
    cases.append(Case("fp32-ieee", True, 40, 40, 16, heads=(2, 1), dropout=0.3, softcap=4.0, window=(7, -1),
                      fwd=CONFIGS[0][0], bwd=CONFIGS[1][1]))
    return cases


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_dropout_matches_the_reference_with_the_same_mask(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", [
    VarlenCase("fp32-ieee", True, (5, 0, 19, 12), (9, 4, 19, 30), 16, configs=CONFIGS[0], dropout=0.3),
    VarlenCase("fp16", False, (13, 7), (8, 21), 32, heads=(2, 1), configs=CONFIGS[1], dropout=0.6),
], ids=str)
def test_varlen_dropout_matches_the_reference(case, kernel_device):
    check_varlen(case, kernel_device)


def _kernel_mask(kernel_device, p, seed, *, batch=1, heads=2, n_q=40, n_k=48, fwd=None, causal=False):
    """The kernel's own mask, read back: with V = I, o = mask * P / (1 - p) (P > 0 where visible)."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(batch, heads, n_q, n_k, generator=gen).to(kernel_device)
    k = torch.randn(batch, heads, n_k, n_k, generator=gen).to(kernel_device)
    v = torch.eye(n_k, device=kernel_device).expand(batch, heads, n_k, n_k)
    o = attention(q, k, v, dropout_p=p, dropout_seed=seed, fwd_config=fwd, causal=causal, fp32_precision="ieee")
    p_ref = reference_attention(q, k, torch.eye(n_k, device=kernel_device).expand_as(k), causal=causal,
                                dtype=torch.float64)[0]
    torch.testing.assert_close(o.double()[o != 0], (p_ref / (1 - p))[o != 0], rtol=1e-4, atol=1e-6)
    return o != 0


def test_the_kernels_mask_is_the_documented_one(kernel_device):
    """Read back through V = I, for a seed and offset past 2^32 (both Philox words used)."""
    seed = 2**62 + 12345
    kept = _kernel_mask(kernel_device, 0.4, seed, batch=2)
    assert torch.equal(kept.cpu(), dropout_mask(seed, 0.4, 2, 2, 40, 48))
    rng = torch.tensor([seed, 2**33 + 5], device=kernel_device)
    q, k = torch.randn(1, 2, 9, 12, device=kernel_device), torch.randn(1, 2, 12, 12, device=kernel_device)
    o = attention(q, k, torch.eye(12, device=kernel_device).expand(1, 2, 12, 12), dropout_p=0.4, dropout_seed=rng,
                  fp32_precision="ieee")
    assert torch.equal((o != 0).cpu(), dropout_mask(seed, 0.4, 1, 2, 9, 12, offset=2**33 + 5))


# ----------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------
def test_the_keep_rate_is_1_minus_p_within_a_binomial_bound(kernel_device):
    """Over 2 x 4 x 64 x 64 elements per p: the keep rate within 5 standard deviations of
    1 - p, and pairs of keys sharing a Philox counter (lanes 0 and 1) kept together at rate
    (1 - p)^2, i.e. uncorrelated, within 5 of theirs."""
    for p in (0.1, 0.5, 0.9):
        kept = _kernel_mask(kernel_device, p, 1000 + int(p * 10), batch=2, heads=4, n_q=64, n_k=64).double()
        n = kept.numel()
        assert abs(kept.mean().item() - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / n), (p, kept.mean().item())
        both = (kept[..., 0::4] * kept[..., 1::4])
        q2 = (1 - p) ** 2
        assert abs(both.mean().item() - q2) <= 5 * math.sqrt(q2 * (1 - q2) / both.numel()), (p, both.mean().item())


def test_the_mean_over_masks_is_attention_without_dropout(kernel_device):
    """One batch of 64 copies of the same inputs: 64 independent masks (the batch index is
    part of each element's counter). Their mean output and gradients are within 6 standard
    errors of the ones without dropout, elementwise; without the 1 / (1 - p) scale the
    output's mean would be off by many."""
    copies, p = 64, 0.5
    gen = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(1, 1, n, 16, generator=gen).to(kernel_device) for n in (12, 20, 20, 12))
    q, k, v, do = (x.expand(copies, -1, -1, -1).contiguous() for x in (q, k, v, do))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = attention(*leaves, dropout_p=p, dropout_seed=99, fp32_precision="ieee")
    grads = torch.autograd.grad(o, leaves, do)
    plain = [x.clone().requires_grad_() for x in (q, k, v)]
    o0 = attention(*plain, fp32_precision="ieee")
    grads0 = torch.autograd.grad(o0, plain, do)
    for name, ours, truth in zip(("o", "dq", "dk", "dv"), (o, *grads), (o0, *grads0)):
        samples = ours.detach().double()
        mean, err = samples.mean(0), samples.std(0) / math.sqrt(copies)
        z = (mean - truth[0].double()).abs() / (err + 1e-12)
        assert z.max() < 6, (name, z.max().item())
    unscaled = (o.detach().double() * (1 - p)).mean(0)
    z_unscaled = (unscaled - o0[0].double()).abs() / (o.detach().double().std(0) / math.sqrt(copies))
    assert z_unscaled.max() > 6  # the check can fail


# ----------------------------------------------------------------------------------
# Determinism, configs, p = 0
# ----------------------------------------------------------------------------------
def _run(q, k, v, do, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = attention(*leaves, **kwargs)
    return (o.detach(), *torch.autograd.grad(o, leaves, do))


def test_the_same_seed_gives_bitwise_the_same_results_and_another_seed_others(kernel_device):
    q, k, v, do = case_inputs(Case("fp16", True, 33, 41, 32, heads=(4, 2)), kernel_device)
    one = _run(q, k, v, do, dropout_p=0.3, dropout_seed=5, causal=True)
    again = _run(q, k, v, do, dropout_p=0.3, dropout_seed=5, causal=True)
    other = _run(q, k, v, do, dropout_p=0.3, dropout_seed=6, causal=True)
    for a, b, c in zip(one, again, other):
        assert torch.equal(a, b)
        assert not torch.equal(a, c)
    # no seed: a fresh draw from torch's generator per call, repeated by torch.manual_seed
    torch.manual_seed(1)
    drawn = _run(q, k, v, do, dropout_p=0.3, causal=True)
    assert not torch.equal(drawn[0], _run(q, k, v, do, dropout_p=0.3, causal=True)[0])
    torch.manual_seed(1)
    assert all(torch.equal(a, b) for a, b in zip(drawn, _run(q, k, v, do, dropout_p=0.3, causal=True)))


def test_the_mask_does_not_depend_on_the_configs(kernel_device):
    """The forward's mask (read back) under three block shapes; the gradients under configs
    with other blocks, atomic dQ and a split dK/dV agree to rounding."""
    masks = [_kernel_mask(kernel_device, 0.5, 77, n_q=37, n_k=52, fwd=fwd, causal=True) for fwd in
             (F(16, 16, 4, 1), F(32, 64, 4, 1), F(64, 16, 4, 1))]
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2])
    q, k, v, do = case_inputs(Case("fp32-ieee", False, 37, 52, 16, heads=(4, 2)), kernel_device)
    results = [_run(q, k, v, do, dropout_p=0.5, dropout_seed=77, fwd_config=fwd, bwd_config=bwd, fp32_precision="ieee")
               for fwd, bwd in FP32_CONFIGS + [(F(64, 32, 4, 1), B(64, 16, 16, 64, 4, 1, dkdv_split=4))]]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_dropout_p_0_is_the_kernel_without_dropout(kernel_device, monkeypatch):
    # a config and shape that run the plain forward without dropout too (not the split one)
    q, k, v, do = case_inputs(Case("fp32-ieee", True, 20, 30, 16, heads=(4, 2), batch=2), kernel_device)
    seen = []
    for kernel in (forward._attn_fwd_kernel, backward._bwd_dkdv_kernel, backward._bwd_dq_kernel):
        def spy(*args, _real=kernel.run, **kwargs):
            seen.append(kwargs["DROPOUT"])
            return _real(*args, **kwargs)
        monkeypatch.setattr(kernel, "run", spy)
    configs = dict(fwd_config=F(16, 16, 4, 1, pack_gqa=0), bwd_config=B(16, 16, 16, 16, 4, 1))  # the dQ kernel runs
    plain = _run(q, k, v, do, causal=True, **configs)
    assert seen == [False] * 3
    for kwargs in ({"dropout_p": 0.0}, {"dropout_p": 0, "dropout_seed": 3}):
        assert all(torch.equal(a, b) for a, b in zip(plain, _run(q, k, v, do, causal=True, **configs, **kwargs)))
    seen.clear()
    _run(q, k, v, do, causal=True, dropout_p=0.1, **configs)
    assert seen == [True] * 3


def test_dropout_runs_the_plain_forward_for_decode_sized_calls(kernel_device, monkeypatch):
    from flashtune.kernels.triton import decode

    calls = []
    monkeypatch.setattr(decode._split_fwd_kernel, "run", lambda *a, **kw: calls.append(1))
    q = torch.randn(2, 4, 1, 16, device=kernel_device)
    k = torch.randn(2, 2, 64, 16, device=kernel_device)
    o = attention(q, k, k, dropout_p=0.2, dropout_seed=1, fwd_config=F(16, 16, 4, 1, num_splits=4, pack_gqa=1))
    assert not calls and torch.isfinite(o).all()


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"dropout_p": 1.0}, ValueError, "dropout_p: expected a probability in [0, 1), got 1.0"),
    ({"dropout_p": -0.1}, ValueError, "dropout_p: expected a probability in [0, 1), got -0.1"),
    ({"dropout_p": float("nan")}, ValueError, "got nan"),
    ({"dropout_p": True}, TypeError, "dropout_p: expected a number in [0, 1), got bool"),
    ({"dropout_p": "0.1"}, TypeError, "got str"),
    ({"dropout_p": 0.1, "dropout_seed": -1}, ValueError, "dropout_seed: expected an int in [0, 2**63), got -1"),
    ({"dropout_p": 0.1, "dropout_seed": 1.5}, TypeError, "dropout_seed: expected an int, an int64 tensor"),
    ({"dropout_p": 0.1, "dropout_seed": torch.tensor([1, 2, 3])}, ValueError,
     "dropout_seed: expected an int64 tensor of shape (2,)"),
])
def test_bad_dropout_arguments_are_named(kwargs, error, message, kernel_device):
    q = torch.randn(1, 1, 8, 16, device=kernel_device)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("*", r"\*")):
        attention(q, q, q, **kwargs)


def test_a_config_whose_dropout_kernel_does_not_fit_is_refused_or_replaced(monkeypatch, kernel_device):
    """The mask's layout conversion takes BLOCK_M * BLOCK_N bytes more shared memory
    (FwdConfig.shared_memory, as compiled for sm_90): validate(dropout=True) counts them; a
    config given for the call is refused, a tuned one replaced by the default."""
    from flashtune import device as config_mod
    from flashtune.configs.base import ConfigError
    from flashtune.kernels.passes import dropout_fwd_config

    tight = F(128, 64, 8, 3, tma=1)  # compiled for sm_90: 132096 bytes, 140288 with dropout
    assert tight.shared_memory(128, torch.bfloat16) == 132096
    assert tight.shared_memory(128, torch.bfloat16, dropout=True) == 132096 + 128 * 64
    if kernel_device.type == "cuda":
        pytest.skip("the limit is the interpreter's, patched to the H200's")
    monkeypatch.setattr(config_mod, "INTERPRETER_SHARED_MEMORY", 232448)
    edge = F(128, 128, 8, 3)  # 229376 bytes at D=128 16-bit; with dropout 245760
    edge.validate(128, torch.float16, kernel_device)
    with pytest.raises(ConfigError, match="FwdConfig: needs about 245760 bytes"):
        edge.validate(128, torch.float16, kernel_device, dropout=True)
    q = torch.randn(1, 1, 8, 128, device=kernel_device, dtype=torch.float16)
    with pytest.raises(ConfigError, match="245760"):
        attention(q, q, q, dropout_p=0.1, fwd_config=edge)
    replaced = dropout_fwd_config(edge, 128, torch.float16, kernel_device, False)
    assert replaced != edge and replaced.shared_memory(128, torch.float16, dropout=True) <= 232448


# ----------------------------------------------------------------------------------
# The drop-in
# ----------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::flashtune.dispatch.DispatchWarning")  # the empty store's
def test_the_drop_in_serves_dropout_with_the_kernels(tmp_path, kernel_device):
    """No SDPA fallback (strict=True runs it); the numbers are flashtune.attention's with the
    seed drawn the same way, gradients included; a directional derivative of a loss
    (mask fixed by the seed) matches the gradient, as gradcheck would check in float64."""
    fn = get_tuned_attention(tmp_path / "store.db", strict=True)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, n, 16, generator=gen).to(kernel_device).requires_grad_() for n in (19, 27, 27))
    k2, v2 = (x.detach()[:, :2].clone().requires_grad_() for x in (k, v))
    torch.manual_seed(4)
    out = fn(q, k2, v2, dropout_p=0.3, is_causal=True, enable_gqa=True)
    torch.manual_seed(4)
    ref = attention(q, k2, v2, dropout_p=0.3, causal=True)  # the same default configs, the same draw
    assert torch.equal(out, ref)
    do = torch.randn_like(out)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(out, (q, k2, v2), do),
                                                  torch.autograd.grad(ref, (q, k2, v2), do)))
    # directional derivative, the mask fixed: torch.manual_seed before each call
    def loss(qq, kk, vv):
        torch.manual_seed(4)
        return (fn(qq, kk, vv, dropout_p=0.3, is_causal=True, enable_gqa=True).double() * do.double()).sum()
    directions = [torch.randn_like(x) for x in (q, k2, v2)]
    grads = torch.autograd.grad(loss(q, k2, v2), (q, k2, v2))
    eps = 1e-2
    with torch.no_grad():
        plus = loss(*(x + eps * d for x, d in zip((q, k2, v2), directions)))
        minus = loss(*(x - eps * d for x, d in zip((q, k2, v2), directions)))
    numeric = (plus - minus).item() / (2 * eps)
    analytic = sum((g.double() * d.double()).sum().item() for g, d in zip(grads, directions))
    assert abs(numeric - analytic) <= 1e-3 * max(1.0, abs(analytic)), (numeric, analytic)
    # explain() names the kernels
    assert fn.explain(q, k2, v2, dropout_p=0.3, is_causal=True, enable_gqa=True).runner == "triton"


@pytest.mark.filterwarnings("ignore::flashtune.dispatch.DispatchWarning")
def test_the_drop_in_draws_a_fresh_mask_per_call(tmp_path, kernel_device):
    fn = get_tuned_attention(tmp_path / "store.db")
    q = torch.randn(1, 2, 16, 16, device=kernel_device)
    a = fn(q, q, q, dropout_p=0.5)
    b = fn(q, q, q, dropout_p=0.5)
    assert not torch.equal(a, b)
    assert np.isfinite(a.cpu().numpy()).all()
