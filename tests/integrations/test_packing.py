"""flashtune.integrations.packing: a plan is made only for a mask it computes exactly, and
running it equals torch SDPA with that mask at every row it keeps (0 at the others)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashtune
from flashtune.integrations import packing

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu] if CUDA else []  # the same tests in the GPU run
DEVICE = "cuda" if CUDA else "cpu"
B, N = 3, 9


def causal_padding_mask(valid: torch.Tensor, causal: bool = True, window: int | None = None) -> torch.Tensor:
    """transformers' sdpa mask: (causal, windowed) intersected with the valid keys, (B, 1, N, N)."""
    i, j = torch.arange(N, device=DEVICE).view(-1, 1), torch.arange(N, device=DEVICE).view(1, -1)
    keep = (j <= i) if causal else torch.ones(N, N, dtype=torch.bool, device=DEVICE)
    if window is not None:
        keep = keep & (j > i - window)
    return (keep.unsqueeze(0) & valid.unsqueeze(1)).unsqueeze(1)


def padding(*spans) -> torch.Tensor:
    """(B, N) valid tokens: row b is valid in [start, end) of spans[b]."""
    valid = torch.zeros(len(spans), N, dtype=torch.bool, device=DEVICE)
    for row, (start, end) in enumerate(spans):
        valid[row, start:end] = True
    return valid


def sdpa_rows(mask, plan, dtype=torch.float32):
    """flashtune via the plan and SDPA with the mask, on random GQA inputs: both (B, N, Hq, D)
    at the rows the plan keeps, and the plan's output at the others."""
    torch.manual_seed(0)
    q = torch.randn(B, 4, N, 16, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(B, 2, N, 16, device=DEVICE, dtype=dtype) for _ in range(2))
    got = plan.run(flashtune.attention_varlen, q, k, v, causal=True)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    kept = torch.zeros(B * N, dtype=torch.bool, device=DEVICE)
    kept[plan.q_rows] = True
    kept = kept.view(B, N)
    return got[kept], want[kept], got[~kept]


@pytest.mark.parametrize("spans", [((0, 9), (0, 5), (0, 1)), ((0, 9), (4, 9), (8, 9))], ids=["right", "left"])
def test_a_padded_causal_mask_runs_as_sdpa_at_the_valid_rows(spans):
    valid = padding(*spans)
    mask = causal_padding_mask(valid)
    plan = packing.plan_from_mask(mask, valid, causal=True)
    assert plan is not None and plan.sequences == B
    lengths = [end - start for start, end in spans]
    assert plan.cu_seqlens_q.tolist() == plan.cu_seqlens_k.tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    got, want, rest = sdpa_rows(mask, plan)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert not rest.any()  # the padding rows: 0


def test_right_padding_without_the_query_padding_is_no_plan():
    """Causal right padding's padding queries see the valid keys: only the 2-D padding can say
    that they are padding; from the 4-D mask alone it is not varlen's causal mask."""
    mask = causal_padding_mask(padding((0, 9), (0, 5), (0, 3)))
    assert packing.plan_from_mask(mask, None, causal=True) is None


def test_rows_without_a_key_are_left_out_and_give_zero():
    valid = padding((0, 9), (4, 9), (8, 9))
    mask = causal_padding_mask(valid)  # left padding: the padding rows see no key
    plan = packing.plan_from_mask(mask, None, causal=True)
    assert plan is not None and plan.q_rows.numel() == int(valid.sum())
    got, want, rest = sdpa_rows(mask, plan)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert not rest.any()


def test_a_float_mask_of_zeros_and_the_lowest_value_plans_as_its_boolean():
    valid = padding((0, 9), (2, 9), (0, 6))
    keep = causal_padding_mask(valid)
    additive = torch.zeros(keep.shape, device=DEVICE).masked_fill(~keep, torch.finfo(torch.float32).min)
    plan, boolean = (packing.plan_from_mask(m, valid, causal=True) for m in (additive, keep))
    assert plan is not None and torch.equal(plan.q_rows, boolean.q_rows) and torch.equal(plan.k_rows, boolean.k_rows)
    biased = additive.masked_fill(keep, 0.5)  # a score bias: no plan
    assert packing.plan_from_mask(biased, valid, causal=True) is None


def test_a_mask_that_differs_per_head_or_by_one_entry_is_no_plan():
    valid = padding((0, 9), (2, 9), (0, 6))
    keep = causal_padding_mask(valid).expand(B, 2, N, N).clone()
    assert packing.plan_from_mask(keep, valid, causal=True) is not None
    keep[0, 1, 5, 2] = False
    assert packing.plan_from_mask(keep, valid, causal=True) is None
    one_off = causal_padding_mask(valid).clone()
    one_off[1, 0, 6, 7] = True  # a query sees a key after it
    assert packing.plan_from_mask(one_off, valid, causal=True) is None
    assert packing.plan_from_mask(causal_padding_mask(valid), valid, causal=False) is None  # not full


def test_a_sliding_window_is_one_sequence_per_row_with_its_window():
    valid = padding((0, 9), (3, 9), (0, 7))
    mask = causal_padding_mask(valid, window=3)
    assert packing.plan_from_mask(mask, valid, causal=True) is None  # without the window: not this mask
    plan = packing.plan_from_mask(mask, valid, causal=True, window_left=2)
    assert plan is not None and plan.sequences == B
    assert packing.plan_from_mask(mask, valid, causal=True, window_left=3) is None


def test_a_bidirectional_padding_mask_plans_full_attention():
    valid = padding((0, 9), (0, 4), (5, 9))
    mask = causal_padding_mask(valid, causal=False)
    plan = packing.plan_from_mask(mask, valid, causal=False)
    assert plan is not None and plan.cu_seqlens_k.tolist() == [0, 9, 13, 17]
    assert packing.plan_from_mask(mask, valid, causal=True) is None


def test_positions_restarting_in_one_row_are_its_documents():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]], device=DEVICE)
    plan = packing.plan_from_positions(positions)
    assert plan.cu_seqlens_q.tolist() == [0, 3, 5, 9] and plan.max_seqlen_q == 4 and plan.q_rows is None
    assert packing.plan_from_positions(torch.arange(5, device=DEVICE).unsqueeze(0) + 7) is None  # no restart
    assert packing.plan_from_positions(positions.expand(2, -1)) is None  # not one row


def test_a_plan_is_cached_on_its_tensor_until_it_changes_in_place():
    mask = causal_padding_mask(padding((0, 9), (0, 5), (0, 3)))
    made = []
    first = packing.cached(mask, ("k",), lambda: made.append(1) or object())
    assert packing.cached(mask, ("k",), lambda: made.append(1) or object()) is first and len(made) == 1
    mask[0, 0, 0, 0] = True  # in place: _version moves
    assert packing.cached(mask, ("k",), lambda: made.append(1) or object()) is not first and len(made) == 2
