"""The @triton.jit pieces the Triton kernels share (tiles, masks, the heaviest-first tile order,
packed sequences, dropout), and their TMA descriptors."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from flashtune.device import tma_capable


@triton.jit
def softcap_log2_scores(qk, tanh_scale, softcap_log2):
    """``softcap * tanh(sm_scale * qk / softcap)`` in base-2 units, from the raw dot products
    and ``score_scales``' pair. tanh (Triton has none the interpreter runs): its odd series to
    x^9 below |x| = 0.3 (next term under 2e-8), else 1 - 2 / (e^(2|x|) + 1) with the sign,
    which is exact at both ends (e^(2|x|) overflows to inf: 1) and has no cancellation there.
    A cap far above the scores (tiny x) stays accurate, where the closed form alone would
    lose x's digits to 1 - 2 / (2 + 2x). The backward's factor is 1 - t^2, t = this /
    softcap_log2."""
    x = qk * tanh_scale
    x2 = x * x
    series = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * 0.021869488536155203))))
    ax = tl.abs(x)
    closed = 1.0 - 2.0 / (tl.math.exp2(ax * 2.885390081777927) + 1.0)  # e^(2|x|) = 2^(2|x| log2 e)
    t = tl.where(ax < 0.3, series, tl.where(x < 0, -closed, closed))
    return t * softcap_log2


def tma_descriptors(enabled: bool, tensors, rows: int, block_d: int):
    """TMA descriptors over (B, H, N, D) tensors for [rows, block_d] tiles of one head
    (rows past N and columns past D read as zeros), or None (load through pointers) when
    not ``enabled``, on a device without TMA, or when the copy engine cannot address one
    of the tensors: it needs a unit-stride head dim and 16-byte aligned base and strides."""
    if not enabled or not tma_capable(tensors[0].device):
        return None
    for t in tensors:
        e = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s <= 0 or s * e % 16 for s in t.stride()[:-1]):
            return None
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, block_d]) for t in tensors)


@triton.jit
def tma_tile(desc, b, h, start, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows [start, start + ROWS) of head (b, h) through a descriptor of tma_descriptors()."""
    return desc.load([b.to(tl.int32), h.to(tl.int32), start, 0]).reshape(ROWS, BLOCK_D)


@triton.jit
def lpt_tile(pid, n_blocks, n_units, LPT_UNITS):
    """(block, unit) of program ``pid`` of a 1-D grid of n_blocks x n_units programs in
    heaviest-first order (config.lpt_group): the units in groups of LPT_UNITS, within a group
    block 0 (the caller's heaviest) of every unit first, then block 1, and so on. The
    Gluon kernels' sm90.lpt_tile is the same walk."""
    per_group = n_blocks * LPT_UNITS
    group = pid // per_group
    units_here = tl.minimum(LPT_UNITS, n_units - group * LPT_UNITS)
    r = pid % per_group
    return r // units_here, group * LPT_UNITS + r % units_here


@triton.jit
def query_block_program(N_Q, H, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, LPT_UNITS):
    """(query block, query head, batch) of this program of a kernel with one program per
    BLOCK_M queries of one (batch, query head), the forward's and the dQ kernel's: from the
    3-D grid (blocks, heads, batch), the last blocks first under causal masking (they see the
    most keys), or with LPT_UNITS > 0 from a 1-D grid in heaviest-first order across heads
    (query_lpt_units, lpt_tile)."""
    if LPT_UNITS > 0:
        n_m = tl.cdiv(N_Q, BLOCK_M)
        pid_m, unit = lpt_tile(tl.program_id(0), n_m, tl.num_programs(0) // n_m, LPT_UNITS)
        pid_m = n_m - 1 - pid_m
        off_h = (unit % H).to(tl.int64)
        off_b = (unit // H).to(tl.int64)
    else:
        pid_m = tl.program_id(0)
        if CAUSAL:
            pid_m = tl.num_programs(0) - 1 - pid_m
        off_h = tl.program_id(1).to(tl.int64)
        off_b = tl.program_id(2).to(tl.int64)
    return pid_m, off_h, off_b


@triton.jit
def block_offsets(start, BLOCK: tl.constexpr, INT64: tl.constexpr):
    """start + arange(BLOCK), in int64 when offsets times strides may pass int32."""
    offs = start + tl.arange(0, BLOCK)
    if INT64:
        offs = offs.to(tl.int64)
    return offs


@triton.jit
def aligned(stride_b, stride_h, stride_n, ALIGN: tl.constexpr):
    """A tensor's batch, head and row strides, known to the compiler as multiples of ALIGN
    (stride_align on the host), so its tiles load and store in vectors. (s // ALIGN) *
    ALIGN is s for those strides; written so, the product tells triton's divisibility
    analysis, where tl.multiple_of on a kernel argument is dropped. Strides divisible by
    16 triton sees by itself (ALIGN 16: nothing to do)."""
    if ALIGN > 1 and ALIGN < 16:
        stride_b = (stride_b // ALIGN) * ALIGN
        stride_h = (stride_h // ALIGN) * ALIGN
        stride_n = (stride_n // ALIGN) * ALIGN
    return stride_b, stride_h, stride_n


@triton.jit
def packed_sequence(CU, b, INT64: tl.constexpr):
    """(first row, length) of sequence ``b`` of a packed batch, read from its cumulative
    lengths ``CU`` (Varlen); the first row in int64 when offsets may pass int32."""
    start = tl.load(CU + b)
    n = tl.load(CU + b + 1) - start
    if INT64:
        start = start.to(tl.int64)
    return start, n


@triton.jit
def dropout_rows(RNG, rows, row_words):
    """(seed, the first Philox counter of each of ``rows``) of the mask (Dropout): rows are
    P's global row indices ((b*Hq + h)*Nq + i, the log-sum-exp's), ``row_words`` the
    counters per row, ceil(Nk / 4)."""
    return tl.load(RNG), tl.load(RNG + 1) + rows.to(tl.int64) * row_words


@triton.jit
def dropout_keep(seed, row_base, start_n, threshold, BLOCK_N: tl.constexpr):
    """Which elements of a [rows, BLOCK_N] tile of P (keys from ``start_n``, a multiple of 4)
    dropout keeps: one Philox call gives the four keys of a counter (Dropout), interleaved
    back into key order. ``row_base``: dropout_rows' counters of the tile's rows."""
    tl.static_assert(BLOCK_N % 4 == 0, "four keys per Philox counter")
    words = row_base[:, None] + (start_n // 4 + tl.arange(0, BLOCK_N // 4))[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, words)
    r = tl.interleave(tl.interleave(r0, r2), tl.interleave(r1, r3))  # r0, r1, r2, r3 of each counter in turn
    return (r >> 1).to(tl.int32, bitcast=True) >= threshold


@triton.jit
def key_range(start_m, N_K, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, causal_off):
    """(full_hi, hi) for a block of queries from start_m walking the keys: keys [0, full_hi)
    need no mask, [full_hi, hi) need the causal and/or sequence-end mask (full_hi is a
    multiple of BLOCK_N; causal: query i sees keys j <= i + causal_off, see causal_offset)."""
    n_full = N_K // BLOCK_N
    if CAUSAL:
        # clamped at 0 before dividing: integer division truncates toward zero
        n_full = tl.minimum(n_full, tl.maximum(start_m + causal_off + 1, 0) // BLOCK_N)
        hi = tl.maximum(tl.minimum(start_m + BLOCK_M + causal_off, N_K), 0)
    else:
        hi = N_K
    return n_full * BLOCK_N, hi


@triton.jit
def window_range(first, last, n, BLOCK: tl.constexpr, off, left, right):
    """``window_blocks`` in tl code (see there): block indices (lo, full_lo, full_hi, hi)."""
    lo_pos = tl.maximum(first + off - left, 0)
    hi_pos = tl.minimum(last + off + right + 1, n)
    lo = lo_pos // BLOCK
    hi = tl.where(hi_pos > lo_pos, tl.cdiv(tl.maximum(hi_pos, 0), BLOCK), lo)
    full_lo = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(last + off - left, 0), BLOCK), lo), hi)
    full_hi = tl.minimum(tl.maximum(tl.maximum(tl.minimum(first + off + right + 1, n), 0) // BLOCK, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def load_tile(ptrs, rows, n_rows, cols, CHECK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Load a [rows, BLOCK_D] tile, zero-filling rows past n_rows and the head-dim padding."""
    if CHECK_ROWS:
        if HEAD_DIM == BLOCK_D:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM), other=0.0)
    else:
        if HEAD_DIM == BLOCK_D:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=cols[None, :] < HEAD_DIM, other=0.0)
    return x


@triton.jit
def store_tile(ptrs, x, rows, n_rows, cols, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a [rows, BLOCK_D] tile, skipping rows past n_rows and the head-dim padding."""
    if HEAD_DIM == BLOCK_D:
        tl.store(ptrs, x, mask=rows[:, None] < n_rows)
    else:
        tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM))
