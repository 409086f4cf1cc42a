"""Host-side pieces both kernel families share: score scales and dot precisions, the causal mask's
frame and the sliding window's bounds, packed sequences and dropout as the kernels take them."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch


LOG2E = math.log2(math.e)


LN2 = math.log(2.0)


PRECISIONS = ("tf32", "tf32x3", "ieee")


# The fp32-accurate dots of torch's "highest": "ieee" (true fp32 products). "tf32x3"
# (three tf32 tensor-core products per dot, the inputs split into a high and a low tf32
# part) is accepted too; which of the two is faster on the H200, and whether tf32x3 stays
# within 2x an fp32 attention's error, is not measured yet: benchmarks/fp32_precision.py
# measures both (docs/performance.md).
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
