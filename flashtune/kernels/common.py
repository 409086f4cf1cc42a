"""Pieces shared by the forward and backward kernels and their launchers."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from flashtune.kernels.config import lpt_group, lpt_pays  # config imports no kernel module at import time

# Triton decides at decoration time whether @triton.jit functions are interpreted.
INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") == "1"

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

PRECISIONS = ("tf32", "tf32x3", "ieee")
# The fp32-accurate dots of torch's "highest": "ieee" (true fp32 products). "tf32x3"
# (three tf32 tensor-core products per dot, the inputs split into a high and a low tf32
# part) is accepted too; which of the two is faster on the H200, and whether tf32x3 stays
# within 2x an fp32 attention's error, is not measured yet: benchmarks/fp32_precision.py
# measures both (docs/shapes.md).
ACCURATE_FP32 = "ieee"


def torch_fp32_precision(dtype: torch.dtype) -> str:
    """The fp32_precision that follows torch's fp32 matmul setting, as torch's own fp32
    matmuls do: ``torch.backends.cuda.matmul.fp32_precision`` when it says "tf32" or
    "ieee", else ``torch.get_float32_matmul_precision()``: "high" or "medium" give
    "tf32", "highest" (torch's default) ACCURATE_FP32. Other dtypes ignore it."""
    if dtype is not torch.float32:
        return "tf32"
    setting = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
    if setting == "tf32":
        return "tf32"
    if setting == "ieee":
        return ACCURATE_FP32
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else ACCURATE_FP32


def score_scales(sm_scale: float, softcap: float = 0.0) -> tuple[float, float]:
    """The kernels' two score scalars: without softcap (qk_scale, unused), qk_scale =
    sm_scale x log2(e), the scores in base-2 units; with it (sm_scale / softcap,
    softcap x log2(e)) for ``softcap_log2_scores``."""
    if not softcap:
        return sm_scale * LOG2E, 0.0
    return sm_scale / softcap, softcap * LOG2E


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


def dot_precision(dtype: torch.dtype, fp32_precision: str) -> str:
    """The tl.dot input precision: only fp32 inputs have a choice."""
    return fp32_precision if dtype == torch.float32 else "ieee"


def on_device(t: torch.Tensor):
    """A context that makes ``t``'s CUDA device current: triton launches on the current one."""
    if t.device.type == "cuda" and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def needs_int64(*tensors: torch.Tensor) -> bool:
    """Whether an element offset inside one of the tensors may pass int32."""
    for t in tensors:
        # no offset passes the storage's size: one C call settles most tensors (asked on every
        # launch: the per-dimension sum for all of them was 37 us of host time per backward)
        if t.untyped_storage().nbytes() >= (2**31 - 1) * t.element_size() \
                and sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) >= 2**31 - 1:
            return True
    return False


def stride_align(*tensors: torch.Tensor) -> int:
    """The largest power of two up to 16 that divides every stride of ``tensors`` but the
    last (head-dim) one: the kernels' STRIDE_ALIGN. Triton specialises an integer argument
    divisible by 16 by itself, but a head dim such as 40 (Stable Diffusion's) makes row
    strides it treats as arbitrary, so every tile load and store would move 2 bytes at a
    time; told that the strides are multiples of 8 (``aligned``), it moves 16. A stride of
    0 divides by anything."""
    align = 16
    for t in tensors:
        for s in t.stride()[:-1]:
            align = math.gcd(align, s)
    return align


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids (triton.cdiv, a constexpr function, costs 9 us a call on the host)."""
    return -(-a // b)


def tma_capable(device: torch.device) -> bool:
    """Whether tile loads through TMA descriptors run on ``device``: Hopper (sm_90) and
    newer, or the interpreter (CPU tensors)."""
    if device.type != "cuda":
        return INTERPRETER
    return _cuda_major(device.index if device.index is not None else torch.cuda.current_device()) >= 9


def query_lpt_units(q: torch.Tensor, k: torch.Tensor, query_blocks: int, *, causal: bool, plain: bool) -> int:
    """LPT_UNITS of a kernel with one program per block of queries of one (batch, query head),
    the dQ kernel's and the forward's (0: their 3-D grid, per head heaviest first): for a
    causal call without a window or packed sequences, the (batch, query head) units of
    ``query_blocks`` programs in groups of config.lpt_group's size over the K and V they walk
    (a K/V head's bytes shared by the query heads of its group, neighbours in the order);
    only where config.lpt_pays."""
    if not (causal and plain):  # (packed sequences: q is 3-D)
        return 0
    B, H, _, D = q.shape
    slots = sm_count(q.device)
    if not lpt_pays(B * H, query_blocks, slots):
        return 0
    per_unit = 2 * k.shape[2] * D * k.element_size() * k.shape[1] // H
    return lpt_group(B * H, query_blocks, per_unit, slots=slots)


def key_block_lpt_units(q: torch.Tensor, *, heads_per_unit: int, units: int, key_blocks: int, programs_per_sm: int,
                        causal: bool) -> int:
    """LPT_UNITS of a dK/dV kernel (the Triton one's, the Gluon one's), with one program per
    key block of one (batch, K/V head, split) unit (0: grid order, without masking): for a
    causal launch, its ``units`` of ``key_blocks`` programs in groups of config.lpt_group's
    size over the Q and dO each unit walks (``heads_per_unit`` query heads), at
    ``programs_per_sm`` programs per SM."""
    if not causal:
        return 0
    per_unit = 2 * heads_per_unit * q.shape[2] * q.shape[3] * q.element_size()
    return lpt_group(units, key_blocks, per_unit, slots=programs_per_sm * sm_count(q.device))


# Heaviest-first orders across heads (query_lpt_units, backward.dkdv_lpt_units), switched
# per kernel. The forwards' (Triton's and the Gluon one's) and the dQ kernel's are on, within
# query_lpt_units' cap; the Gluon dK/dV kernel's always. The Triton dK/dV kernel's is off:
# on the H200 (2026-12-03, benchmarks/lpt_order.py, docs/shapes.md) it moved the rows that
# serve it by default 0.96-1.02x (gpt2-train-512 0.957, gemma2-d256 1.020, the D=64 grid
# 0.98-1.01); it gains only on the D=128 grouped-query rows (1.03-1.12x), which the Gluon
# backward serves on sm_90.
LPT_ON = {"fwd": True, "triton_dkdv": False}


def fwd_lpt_units(q: torch.Tensor, k: torch.Tensor, query_blocks: int, *, causal: bool, plain: bool) -> int:
    """The forward kernels' LPT_UNITS for one call: query_lpt_units while LPT_ON["fwd"], else 0
    (their 3-D grid, per head heaviest first)."""
    return query_lpt_units(q, k, query_blocks, causal=causal, plain=plain) if LPT_ON["fwd"] else 0


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (the interpreter: the H200's 132, so CPU
    runs take the schedules a GPU would)."""
    if device.type != "cuda":
        return 132
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _cuda_major(index: int) -> int:
    # asked on every launch of a TMA config: once per device is enough
    return torch.cuda.get_device_capability(index)[0]


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
    Gluon kernels' gluon_forward.lpt_tile is the same walk."""
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


@dataclasses.dataclass(frozen=True, eq=False)
class Varlen:
    """A packed batch of variable-length sequences, FlashAttention's varlen convention:
    sequence b holds the rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the packed q (and
    o), and [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v (int32 tensors of batch + 1
    entries on the tensors' device, checked by function.check_varlen_inputs); the max
    lengths size the grid. The kernels read each program's sequence bounds from the
    cu_seqlens tensors themselves."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.shape[0] - 1


def kernel_strides(t: torch.Tensor, varlen: Varlen | None) -> tuple[int, int, int, int]:
    """The kernels' (batch, head, row, head-dim) strides of ``t``: a (B, H, N, D) tensor's
    own, or for a packed (total, H, D) tensor (``varlen``) batch 0 (a sequence's first row
    comes from cu_seqlens) and its (row, head, head-dim) strides in that order."""
    if varlen is None:
        return t.stride()
    return 0, t.stride(1), t.stride(0), t.stride(2)


@triton.jit
def packed_sequence(CU, b, INT64: tl.constexpr):
    """(first row, length) of sequence ``b`` of a packed batch, read from its cumulative
    lengths ``CU`` (Varlen); the first row in int64 when offsets may pass int32."""
    start = tl.load(CU + b)
    n = tl.load(CU + b + 1) - start
    if INT64:
        start = start.to(tl.int64)
    return start, n


@dataclasses.dataclass(frozen=True, eq=False)
class Dropout:
    """Dropout on the attention probabilities, FlashAttention's: each element of P =
    softmax(S) is kept with probability 1 - ``p`` and scaled by 1 / (1 - p), the output is
    (mask * P / (1 - p)) V, the log-sum-exp is of the undropped scores. The mask is never
    stored: every kernel regenerates it from ``rng``, an int64 tensor (seed, offset) on the
    tensors' device that the kernels read (so a captured CUDA graph replays with the values
    its tensor holds then). Element (b, h, i, j) of P, h the query head, i the query, j the
    key, is kept iff the 31 high bits of 32-bit word (b*Hq + h)*Nq + i, j of Philox4x32-10
    (key: the seed; counter: offset + ((b*Hq + h)*Nq + i) * ceil(Nk / 4) + j // 4, lane
    j % 4) are at least ``threshold``: a function of (seed, offset, b, h, i, j) and the shape
    alone, never of a config's blocks or splits (``dropout_keep``). Packed sequences
    (Varlen) index the row by (h, packed query row), as their log-sum-exp is laid out, and
    Nk is max_seqlen_k."""

    p: float
    rng: torch.Tensor

    @property
    def threshold(self) -> int:
        """floor(p * 2^31): a word's 31 high bits below it drop the element (keep rate 1 - p
        to within 2^-31)."""
        return int(self.p * 2**31)

    def kernel_args(self) -> tuple[torch.Tensor, int, float]:
        """The kernels' (RNG, drop_threshold, drop_scale)."""
        return self.rng, self.threshold, 1.0 / (1.0 - self.p)


# the dropout threshold is a runtime int that triton does not specialise (on 1, or 16 | it)
DROPOUT_ARGS = ("drop_threshold",)


def dropout_args(dropout: Dropout | None, unused: torch.Tensor) -> tuple[torch.Tensor, int, float]:
    """The kernels' (RNG, drop_threshold, drop_scale) for ``dropout``; without it ``unused``
    stands in for the RNG pointer (never read: DROPOUT is off)."""
    return dropout.kernel_args() if dropout is not None else (unused, 0, 1.0)


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


CAUSAL_ALIGNS = ("top_left", "bottom_right")


def causal_offset(causal_align: str, n_q: int, n_k: int) -> int:
    """The causal mask's diagonal offset: query i sees keys j <= i + offset. 0 aligns the
    mask top-left (torch SDPA's ``is_causal``); n_k - n_q aligns it bottom-right
    (FlashAttention's convention, torch's ``causal_lower_right``: the queries are the last
    n_q positions). Bottom-right with n_q > n_k leaves the first n_q - n_k queries no key:
    their output is 0 and their log-sum-exp -inf."""
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align: expected one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    return n_k - n_q if causal_align == "bottom_right" else 0


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


# The window's sides are runtime ints that triton does not specialise (on 1, or on
# divisibility by 16): one compiled kernel per config serves every window size.
WINDOW_SIDES = ("win_left", "win_right")
# likewise a packed batch's total of query rows (the varlen kernels' LSE row stride)
VARLEN_SIZES = ("TOTAL_Q",)


def window_bounds(window_size, causal: bool, n_q: int, n_k: int) -> tuple[int, int] | None:
    """The kernels' (left, right) window for a checked ``window_size`` (FlashAttention's
    convention, -1 an unbounded side), or None when nothing is cut beyond the causal mask.
    Causal caps right at 0. An unbounded side becomes n_q + n_k, and larger sides are
    clamped to it: no diagonal is that far from a key (|diag - j| < n_q + n_k, see
    causal_offset), so the bound never cuts, and the kernels' ints stay in int32."""
    if window_size is None:
        return None
    left, right = window_size
    if causal:
        right = 0  # the diagonal
        if left < 0:
            return None  # the causal mask alone
    if left < 0 and right < 0:
        return None
    far = n_q + n_k
    return (far if left < 0 else min(left, far)), (far if right < 0 else min(right, far))


def call_geometry(q: torch.Tensor, k: torch.Tensor, varlen: Varlen | None, causal: bool, causal_align: str,
                  window_size) -> tuple[int, int, int, int, int, int, tuple[int, int] | None, int]:
    """What both passes' launchers derive from a call: (B, H, H_KV, N_Q, N_K, D, the
    kernels' window (window_bounds), the diagonal offset). With ``varlen`` the lengths are
    the longest sequence's (the grid's) and the offset 0: the kernels align each sequence
    bottom-right from its own lengths."""
    if varlen is None:
        B, H, N_Q, D = q.shape
        N_K = k.shape[2]
    else:
        _, H, D = q.shape
        B, N_Q, N_K = varlen.batch, varlen.max_seqlen_q, varlen.max_seqlen_k
    window = window_bounds(window_size, causal, N_Q, N_K)
    off = causal_offset(causal_align, N_Q, N_K) if (causal or window) and varlen is None else 0
    return B, H, k.shape[1], N_Q, N_K, D, window, off


def window_blocks(first: int, last: int, n: int, block: int, off: int, left: int, right: int
                  ) -> tuple[int, int, int, int]:
    """Blocks of ``block`` positions along an axis of length ``n`` that rows [first, last]
    reach through a window: row i sees positions [i + off - left, i + off + right] of [0, n).
    Returns block indices lo <= full_lo <= full_hi <= hi: blocks [lo, hi) hold a position
    some row sees (every other block is skipped, not masked), [full_lo, full_hi) only
    positions every row sees (no mask), the rest need the mask. The union of the rows'
    windows is the interval [first + off - left, last + off + right]: the range is tight.

    The kernels' ``window_range`` is this formula in tl code, line for line (the tests
    compare the two). The forward and the dQ kernel call it for a block of queries over
    the keys (off the diagonal offset); the dK/dV kernel for a block of keys over the
    queries, with off negated and left and right swapped (query i sees key j iff
    j - right - off <= i <= j + left - off). Division only of non-negative values: triton's
    integer division truncates toward zero, Python's floors."""
    lo_pos = max(first + off - left, 0)
    hi_pos = min(last + off + right + 1, n)
    lo = lo_pos // block
    hi = -(-hi_pos // block) if hi_pos > lo_pos else lo
    full_lo = min(max(-(-max(last + off - left, 0) // block), lo), hi)
    full_hi = min(max(max(min(first + off + right + 1, n), 0) // block, full_lo), hi)
    return lo, full_lo, full_hi, hi


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
