"""Logit softcapping (Gemma-2): scores capped at softcap * tanh(scores / softcap) before the
softmax, in the forward (plain and split kernels) and the backward (dK/dV, dQ and atomic
dQ), checked against reference_attention with the same cap under FlashAttention's rule
(kernel_checks.check_attention), on odd shapes, grouped heads, both masks and alignments."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import Case, run_case

from flashtune.kernels import BwdConfig, FwdConfig, attention

F, B = FwdConfig, BwdConfig
# inputs scaled so that many scores pass the cap: the capped and uncapped results differ
CONFIGS = [
    (F(16, 16, 4, 1), B(16, 16, 16, 16, 4, 1)),
    (F(32, 16, 4, 2), B(16, 32, 32, 16, 4, 1, atomic_dq=1)),
    (F(16, 32, 4, 1, tma=1), B(32, 16, 16, 32, 4, 1, tma=1, dkdv_split=2)),
]


def _cases() -> list[Case]:
    cases = []
    for i, (dtype, causal, (n_q, n_k), heads) in enumerate([
            ("fp32-ieee", False, (33, 47), (2, 2)), ("fp32-ieee", True, (47, 47), (4, 2)),
            ("fp16", True, (33, 69), (2, 1)), ("fp16", False, (1, 69), (4, 1)),  # decode: the split kernel
            ("fp32-tf32", True, (69, 33), (2, 2))]):
        fwd, bwd = CONFIGS[i % len(CONFIGS)]
        cases.append(Case(dtype, causal, n_q, n_k, (16, 32, 40, 64, 48)[i], heads=heads, fwd=fwd, bwd=bwd,
                          softcap=(5.0, 2.5, 30.0, 5.0, 1.0)[i]))
    cases.append(Case("fp32-ieee", True, 33, 47, 32, heads=(2, 1), causal_align="bottom_right", softcap=4.0))
    cases.append(Case("fp16", False, 1, 70, 64, heads=(4, 2), fwd=F(16, 16, 4, 1, num_splits=3, pack_gqa=1),
                      softcap=3.0))
    return cases


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_softcap_matches_the_reference(case, kernel_device):
    run_case(case, kernel_device)


def test_softcap_changes_the_result_and_none_is_off(kernel_device):
    gen = torch.Generator(device=kernel_device).manual_seed(0)
    q, k, v = (4 * torch.randn(1, 2, 24, 16, device=kernel_device, generator=gen) for _ in range(3))
    plain = attention(q, k, v)
    assert torch.equal(attention(q, k, v, softcap=None), plain)
    assert (attention(q, k, v, softcap=2.0) - plain).abs().max() > 0.1
    # a cap far above every score is no cap at all
    torch.testing.assert_close(attention(q, k, v, softcap=1e6), plain, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("softcap", "error", "message"), [
    (0.0, ValueError, "softcap: expected a positive finite number or None, got 0.0"),
    (-1, ValueError, "got -1"),
    (float("nan"), ValueError, "got nan"),
    (float("inf"), ValueError, "got inf"),
    (True, TypeError, "softcap: expected a positive number or None, got bool"),
    ("5", TypeError, "got str"),
])
def test_a_bad_softcap_is_named(softcap, error, message, kernel_device):
    q = torch.randn(1, 1, 8, 16, device=kernel_device)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        attention(q, q, q, softcap=softcap)
