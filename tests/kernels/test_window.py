"""Sliding-window attention (FlashAttention's ``window_size``): query i sees key j iff
diag - left <= j <= diag + right, diag its diagonal in the causal_align frame, -1 an
unbounded side; with causal, right is 0.

Checked against reference_attention with the same window (kernel_checks.check_attention,
FlashAttention's rule; SDPA in float64 with the window's boolean mask checks the
reference), forward and every gradient, plain and split-KV kernels, on odd shapes,
grouped heads, both causal modes and alignments, rows that see no key included. That key
blocks outside the window are skipped, not masked, is checked twice: the block ranges as
data (common.window_blocks, and the kernels' tl copy of it, window_range, against it),
and by NaN in every K/V (Q/dO) row of the blocks the ranges leave out, which a kernel that
loaded and masked them would spread into its outputs (0 x NaN is NaN).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import flashtune.device
import triton
import triton.language as tl
from kernel_checks import Case, case_inputs, run_case

from flashtune.kernels import BwdConfig, FwdConfig, attention, reference_attention
from flashtune.kernels.common import causal_offset, window_blocks, window_bounds
from flashtune.kernels.triton.common import window_range
from flashtune.kernels.triton.decode import plan_schedule
from flashtune.kernels.reference import attention_mask

F, B = FwdConfig, BwdConfig
CONFIGS = [
    (F(16, 16, 4, 1), B(16, 16, 16, 16, 4, 1)),
    (F(32, 16, 4, 2), B(16, 32, 32, 16, 4, 1, atomic_dq=1)),
    (F(16, 32, 4, 1), B(32, 16, 16, 32, 4, 1, dkdv_split=2)),
]
TMA = (F(16, 32, 4, 1, tma=1), B(32, 16, 16, 32, 4, 1, tma=1, dkdv_split=2))  # 16-bit inputs only


# ----------------------------------------------------------------------------------
# Against the reference
# ----------------------------------------------------------------------------------
def _cases() -> list[Case]:
    """Windows left only, right only, both, 0, past the sequence; causal and not; both
    alignments; Nq = Nk, Nq < Nk and Nq > Nk (rows that see no key); fp32 and fp16."""
    rows = [  # dtype, causal, align, (n_q, n_k), d, heads, window
        ("fp32-ieee", False, "top_left", (37, 37), 16, (4, 2), (5, -1)),
        ("fp32-ieee", False, "top_left", (37, 37), 32, (2, 2), (-1, 4)),
        ("fp32-ieee", True, "top_left", (37, 37), 16, (4, 2), (6, 3)),  # right capped at 0
        ("fp16", False, "bottom_right", (37, 37), 32, (4, 2), (7, 9)),
        ("fp32-ieee", False, "top_left", (37, 37), 16, (2, 1), (0, 0)),  # the diagonal alone
        ("fp16", True, "bottom_right", (37, 37), 16, (4, 2), (0, -1)),
        ("fp32-ieee", False, "top_left", (50, 70), 32, (4, 2), (10, 20)),
        ("fp32-ieee", False, "bottom_right", (50, 70), 16, (4, 2), (18, 2)),
        ("fp16", True, "top_left", (50, 70), 32, (4, 2), (20, -1)),
        ("fp32-ieee", True, "bottom_right", (50, 70), 16, (2, 2), (9, -1)),
        ("fp32-ieee", False, "top_left", (70, 50), 16, (4, 2), (12, 3)),  # queries past 62 see no key
        ("fp16", False, "bottom_right", (70, 50), 32, (4, 2), (-1, 5)),  # the first 15 see none
        ("fp32-ieee", True, "top_left", (70, 50), 32, (4, 2), (25, -1)),
        ("fp32-ieee", True, "bottom_right", (70, 50), 16, (4, 1), (10, 4)),
        ("fp32-tf32", False, "top_left", (37, 37), 16, (2, 2), (500, 500)),  # past the sequence
        ("fp16", True, "top_left", (50, 70), 16, (4, 2), (1000, -1)),
    ]
    cases = []
    for i, (dtype, causal, align, (n_q, n_k), d, heads, window) in enumerate(rows):
        fwd, bwd = TMA if dtype == "fp16" and i % 2 else CONFIGS[i % len(CONFIGS)]
        cases.append(Case(dtype, causal, n_q, n_k, d, heads=heads, fwd=fwd, bwd=bwd, causal_align=align,
                          window=window))
    return cases


def _split_cases() -> list[Case]:
    """The split-KV forward: decode-sized queries over chunks the window leaves empty,
    packed and not, and a longer query block."""
    return [Case("fp32-ieee", False, 1, 70, 32, heads=(4, 2), fwd=F(16, 16, 4, 1, num_splits=3, pack_gqa=1),
                 causal_align="bottom_right", window=(20, -1)),
            Case("fp16", True, 4, 70, 16, heads=(4, 1), fwd=F(16, 16, 4, 1, num_splits=5, pack_gqa=1),
                 causal_align="bottom_right", window=(9, -1)),
            Case("fp32-ieee", False, 3, 69, 16, heads=(2, 2), fwd=F(16, 16, 4, 1, num_splits=2, pack_gqa=0),
                 window=(3, 30)),  # top-left: the keys near the start
            Case("fp32-ieee", True, 33, 69, 32, heads=(4, 2), fwd=F(16, 16, 4, 1, num_splits=3, pack_gqa=1),
                 causal_align="bottom_right", window=(13, -1))]


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_window_matches_the_reference(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _split_cases(), ids=str)
def test_window_through_the_split_kernel(case, kernel_device):
    run_case(case, kernel_device)


def test_rows_without_keys_get_zero(kernel_device):
    """A window leaves queries without a key (top-left, Nq > Nk: those past Nk + left):
    output and dQ exactly 0, log-sum-exp -inf, as causal bottom-right gives them; the plain
    and the split forward alike."""
    case = Case("fp32-ieee", False, 40, 17, 16, heads=(4, 2))
    q, k, v, do = case_inputs(case, kernel_device)
    empty = torch.arange(40) > 16 + 5  # window (5, 0): query i sees [i - 5, i] of 17 keys
    for fwd in (F(16, 16, 4, 1, num_splits=1, pack_gqa=0), F(16, 16, 4, 1, num_splits=2, pack_gqa=1)):
        o, lse = attention(q, k, v, window_size=(5, 0), return_lse=True, fwd_config=fwd,
                           bwd_config=CONFIGS[0][1], fp32_precision="ieee")
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        assert (o[:, :, empty] == 0).all() and (dq[:, :, empty] == 0).all()
        assert torch.isneginf(lse[:, :, empty]).all() and torch.isfinite(lse[:, :, ~empty]).all()
        assert torch.isfinite(dk).all() and torch.isfinite(dv).all()


def test_none_and_unbounded_are_no_window_and_a_window_past_the_sequence_changes_nothing(kernel_device):
    gen = torch.Generator(device=kernel_device).manual_seed(0)
    q, k, v = (torch.randn(1, 2, 29, 16, device=kernel_device, generator=gen) for _ in range(3))
    for causal in (False, True):
        plain = attention(q, k, v, causal=causal, fp32_precision="ieee")
        assert torch.equal(attention(q, k, v, causal=causal, window_size=None, fp32_precision="ieee"), plain)
        assert torch.equal(attention(q, k, v, causal=causal, window_size=(-1, -1), fp32_precision="ieee"), plain)
        assert torch.equal(attention(q, k, v, causal=causal, window_size=[-1, 3] if causal else (-1, -1),
                                     fp32_precision="ieee"), plain)  # causal caps right at 0: causal alone
        wide = attention(q, k, v, causal=causal, window_size=(29, 28), fp32_precision="ieee")
        torch.testing.assert_close(wide, plain, rtol=1e-6, atol=1e-6)
    narrow = attention(q, k, v, window_size=(3, 3), fp32_precision="ieee")
    assert (narrow - attention(q, k, v, fp32_precision="ieee")).abs().max() > 0.05


# ----------------------------------------------------------------------------------
# Skipped, not masked
# ----------------------------------------------------------------------------------
def _outside(n: int, block: int, lo: int, hi: int) -> torch.Tensor:
    """The positions of [0, n) in blocks outside [lo, hi)."""
    blocks = torch.arange(n) // block
    return (blocks < lo) | (blocks >= hi)


@pytest.mark.parametrize(("n_q", "fwd", "causal", "align", "window"), [
    (16, F(16, 16, 4, 1, num_splits=1, pack_gqa=0), False, "bottom_right", (20, -1)),
    (16, F(16, 16, 4, 1, num_splits=1, pack_gqa=0), False, "top_left", (40, 30)),
    (3, F(16, 16, 4, 1, num_splits=3, pack_gqa=1), True, "bottom_right", (25, -1)),
], ids=["plain-bottom_right-left20", "plain-top_left-40.30", "split-causal-bottom_right-left25"])
def test_forward_and_dq_never_read_keys_outside_the_window(kernel_device, n_q, fwd, causal, align, window):
    """One block of queries over 200 keys: NaN in K and V at the blocks window_blocks leaves
    out, yet the output, the log-sum-exp and dQ equal the reference's on clean keys."""
    n_k, d = 200, 16
    gen = torch.Generator(device=kernel_device).manual_seed(1)
    q, k, v, do = (torch.randn(1, 2, n, d, device=kernel_device, generator=gen) for n in (n_q, n_k, n_k, n_q))
    off = causal_offset(align, n_q, n_k)
    left, right = window_bounds(window, causal, n_q, n_k)
    lo, _, _, hi = window_blocks(0, n_q - 1, n_k, 16, off, left, right)
    assert 0 < hi - lo < n_k // 16 - 3  # most blocks skipped
    dirty = _outside(n_k, 16, lo, hi)
    k_nan, v_nan = k.clone(), v.clone()
    k_nan[:, :, dirty] = float("nan")
    v_nan[:, :, dirty] = float("nan")
    q = q.requires_grad_()
    args = dict(causal=causal, causal_align=align, window_size=window)
    o, lse = attention(q, k_nan, v_nan, **args, return_lse=True, fwd_config=fwd, bwd_config=CONFIGS[0][1],
                       fp32_precision="ieee")
    (dq,) = torch.autograd.grad(o, (q,), do)
    qr = q.detach().double().requires_grad_()
    o_ref, lse_ref = reference_attention(qr, k.double(), v.double(), **args, dtype=torch.float64)
    (dq_ref,) = torch.autograd.grad(o_ref, (qr,), do.double())
    for got, want in ((o, o_ref), (lse, lse_ref), (dq, dq_ref)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bwd", [B(16, 16, 16, 16, 4, 1), B(16, 16, 16, 16, 4, 1, atomic_dq=1),
                                 B(16, 16, 16, 16, 4, 1, dkdv_split=2)], ids=["plain", "atomic_dq", "dkdv_split"])
def test_dkdv_never_reads_queries_outside_the_window(kernel_device, bwd):
    """One block of keys under 200 queries: NaN in Q and dO at the query blocks that
    window_blocks (the keys' view) leaves out, yet dK and dV equal the reference's."""
    n_q, n_k, d, window = 200, 16, 16, (30, 10)
    gen = torch.Generator(device=kernel_device).manual_seed(2)
    q, k, v, do = (torch.randn(1, 2, n, d, device=kernel_device, generator=gen) for n in (n_q, n_k, n_k, n_q))
    left, right = window_bounds(window, False, n_q, n_k)
    lo, _, _, hi = window_blocks(0, n_k - 1, n_q, 16, 0, right, left)  # the keys' view of top-left
    assert 0 < hi - lo < n_q // 16 - 3
    dirty = _outside(n_q, 16, lo, hi)
    q_nan, do_nan = q.clone(), do.clone()
    q_nan[:, :, dirty] = float("nan")
    do_nan[:, :, dirty] = float("nan")
    k, v = k.requires_grad_(), v.requires_grad_()
    o = attention(q_nan, k, v, window_size=window, fwd_config=CONFIGS[0][0], bwd_config=bwd, fp32_precision="ieee")
    dk, dv = torch.autograd.grad(o, (k, v), do_nan)
    kr, vr = k.detach().double().requires_grad_(), v.detach().double().requires_grad_()
    o_ref, _ = reference_attention(q.double(), kr, vr, window_size=window, dtype=torch.float64)
    dk_ref, dv_ref = torch.autograd.grad(o_ref, (kr, vr), do.double())
    torch.testing.assert_close(dk.double(), dk_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dv.double(), dv_ref, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------
# The block ranges as data
# ----------------------------------------------------------------------------------
def _brute_force(first, last, n, block, off, left, right):
    """(visited, unmasked) blocks by looking at every (row, position) pair."""
    visited, full = set(), set()
    for b in range(-(-n // block) + 1):
        seen = [[r + off - left <= j <= r + off + right and j < n for j in range(b * block, (b + 1) * block)]
                for r in range(first, last + 1)]
        if any(map(any, seen)):
            visited.add(b)
        if all(map(all, seen)):
            full.add(b)
    return visited, full


PARAMS = [(first, first + rows - 1, n, block, off, left, right)
          for first, rows, n, block, off, left, right in itertools.product(
              (0, 5, 16, 33), (1, 16), (1, 37, 64), (16, 32), (-40, -7, 0, 12), (0, 3, 20, 200), (0, 5, 17, 200))]


def test_window_blocks_is_the_tight_range():
    """Every block with a position some row sees is visited, and only those; the unmasked
    blocks are exactly those whose every position every row sees."""
    for first, last, n, block, off, left, right in PARAMS:
        lo, full_lo, full_hi, hi = window_blocks(first, last, n, block, off, left, right)
        visited, full = _brute_force(first, last, n, block, off, left, right)
        case = (first, last, n, block, off, left, right)
        assert lo <= full_lo <= full_hi <= hi, case
        assert set(range(lo, hi)) == visited or (not visited and lo == hi), case
        assert set(range(full_lo, full_hi)) == full, case


def test_window_blocks_examples():
    # Mistral: 4096 keys to the left, queries 8000..8063 of 8192 keys (blocks of 64)
    assert window_blocks(8000, 8063, 8192, 64, 0, 4096, 0) == (61, 62, 125, 126)
    # 256 to the left and right, a block of 128 queries at 1024: keys [768, 1407]
    assert window_blocks(1024, 1151, 4096, 128, 0, 256, 256) == (6, 7, 10, 11)
    # the window past the end of the keys on both sides: every block, all unmasked but the last
    assert window_blocks(0, 15, 100, 32, 0, 500, 500) == (0, 0, 3, 4)
    # no key at all (top-left, queries past the keys): an empty range
    lo, full_lo, full_hi, hi = window_blocks(80, 95, 50, 16, 0, 10, 0)
    assert lo == full_lo == full_hi == hi
    # the dK/dV view (off negated, sides swapped): keys 64..127 under a (30, 10) window
    assert window_blocks(64, 127, 4096, 64, 0, 10, 30) == (0, 2, 2, 3)


@triton.jit
def _window_range_kernel(P, OUT, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    first = tl.load(P + i * 6)
    lo, full_lo, full_hi, hi = window_range(first, tl.load(P + i * 6 + 1), tl.load(P + i * 6 + 2), BLOCK,
                                            tl.load(P + i * 6 + 3), tl.load(P + i * 6 + 4), tl.load(P + i * 6 + 5))
    tl.store(OUT + i * 4, lo)
    tl.store(OUT + i * 4 + 1, full_lo)
    tl.store(OUT + i * 4 + 2, full_hi)
    tl.store(OUT + i * 4 + 3, hi)


def test_the_kernels_window_range_is_window_blocks(kernel_device):
    """The tl copy the kernels run gives window_blocks' ranges on every case above."""
    for block in (16, 32):
        params = [(f, la, n, off, le, r) for f, la, n, b, off, le, r in PARAMS if b == block]
        p = torch.tensor(params, dtype=torch.int32, device=kernel_device)
        out = torch.empty(len(params), 4, dtype=torch.int32, device=kernel_device)
        _window_range_kernel[(len(params),)](p, out, BLOCK=block)
        expected = [window_blocks(f, la, n, block, off, le, r) for f, la, n, off, le, r in params]
        assert out.tolist() == [list(e) for e in expected]


def test_window_bounds():
    assert window_bounds(None, False, 10, 20) is None
    assert window_bounds((-1, -1), False, 10, 20) is None
    assert window_bounds((-1, 5), True, 10, 20) is None  # causal alone
    assert window_bounds((4, 5), True, 10, 20) == (4, 0)
    assert window_bounds((4, -1), False, 10, 20) == (4, 30)
    assert window_bounds((-1, 0), False, 10, 20) == (30, 0)
    assert window_bounds((10**12, 2), False, 10, 20) == (30, 2)  # clamped: int32 in the kernels


def test_the_reference_mask_is_the_definition():
    for n_q, n_k, causal, align, (left, right) in itertools.product(
            (5, 9), (4, 9), (False, True), ("top_left", "bottom_right"), ((2, -1), (-1, 1), (0, 0), (3, 2))):
        keep = attention_mask(n_q, n_k, causal=causal, causal_align=align, window_size=(left, right))
        diag_off = n_k - n_q if align == "bottom_right" else 0
        for i, j in itertools.product(range(n_q), range(n_k)):
            d = i + diag_off
            sees = (left < 0 or j >= d - left) and (right < 0 or j <= d + right) and (not causal or j <= d)
            assert bool(keep[i, j]) == sees, (n_q, n_k, causal, align, left, right, i, j)


# ----------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("window", "error", "message"), [
    ((-2, 0), ValueError, "window_size: expected sizes >= 0, or -1 for an unbounded side, got left -2"),
    ((3, -5), ValueError, "got right -5"),
    ((True, 2), TypeError, "window_size: expected a (left, right) pair of ints or None, got bool for left"),
    ((2, 1.5), TypeError, "got float for right"),
    (8, TypeError, "window_size: expected a (left, right) pair of ints or None, got int"),
    ((1, 2, 3), TypeError, "got tuple of length 3"),
    ("ab", TypeError, "got str"),
])
def test_a_bad_window_is_named(window, error, message, kernel_device):
    q = torch.randn(1, 1, 8, 16, device=kernel_device)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        attention(q, q, q, window_size=window)


def test_the_split_kernels_chunks_cut_only_the_window(monkeypatch):
    """Decode with a window short against the keys: the chunks start at the window's first
    key block and cover its blocks alone, auto (on the H200's 132 SMs) and explicit splits."""
    from flashtune.kernels.triton import decode
    monkeypatch.setattr(flashtune.device, "INTERPRETER_SCHEDULE_SMS", 132)
    n_k, left = 32768, 4096
    lo, _, _, hi = window_blocks(0, 0, n_k, 64, n_k - 1, left, 0)  # one query, bottom-right
    assert (lo, hi) == (447, 512)
    for splits in (0, 4):
        plan = plan_schedule(F(64, 64, 4, 2, num_splits=splits), 1, 32, 8, 1, n_k, torch.device("cpu"), (lo, hi))
        assert plan.start == lo * 64
        assert (plan.splits - 1) * plan.chunk < (hi - lo) * 64 <= plan.splits * plan.chunk, plan
        # auto: the window's 65 blocks of 64 keys, chunks of whole blocks and at least
        # MIN_CHUNK_KEYS (1024) keys: 65 // 16 = 4 chunks (of 17 blocks)
        assert decode.MIN_CHUNK_KEYS == 1024
        assert plan.splits == 4 and (splits or plan.chunk == 17 * 64), plan
    # a window that reaches no key: one empty chunk
    assert plan_schedule(F(64, 64, 4, 2), 1, 4, 4, 1, 100, torch.device("cpu"), (2, 2)).splits == 1
