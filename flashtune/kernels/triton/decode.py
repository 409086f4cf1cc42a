"""Split-KV forward (FlashDecoding) with grouped-query packing, and its exact combine.

The plain forward runs one program per (query block, query head, batch): a decode step
(one query per sequence) then has B * Hq programs that each walk all of K/V alone, and
the Hq / Hkv query heads of a group read the same K/V once each. Here:

- ``pack_gqa``: the rows of a tile are (query, head of the group) pairs, row r holding
  query r // GROUP of head hk * GROUP + r % GROUP, so one program reads each K/V tile of
  its K/V head once for the whole group;
- ``num_splits``: the keys are cut into chunks of whole key blocks, one program per
  chunk, each writing its normalised partial output and base-2 log-sum-exp (fp32); the
  combine kernel merges them exactly: lse = log2(sum_s 2^lse_s), O = sum_s 2^(lse_s - lse) O_s.
  A chunk a row sees no key of (an empty chunk, or causal) has lse_s = -inf and weight 0.
  With a sliding window the chunks cut only the key blocks some query reaches.

With one split the kernel writes O and the log-sum-exp directly. The log-sum-exp handed
to the backward is the merged one, in the plain forward's layout (B, Hq, Nq).

Two constexpr variants serve a K/V cache (kernels/kvcache.py, ``attention_kvcache``):
SEQLENS reads each sequence's length from a (B,) int32 tensor (its masks stop there, causal
and a window align bottom-right on it, and the chunks past it are empty), and PAGED, with
SEQLENS, loads K and V from (pages, page_size, Hkv, D) pages through a (B, max_pages) block
table (forward._fwd_inner). Both off, the kernel is the one above.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from flashtune.configs.base import DECODE_MAX_Q, MAX_SPLITS, padded_head_dim
from flashtune.configs.forward import FwdConfig
from flashtune.device import schedule_sm_count
from flashtune.kernels import launch
from flashtune.kernels.common import WINDOW_SIDES, needs_int64, on_device, score_scales
from flashtune.kernels.triton.common import block_offsets, key_range, tma_descriptors, window_range
from flashtune.kernels.triton.forward import _fwd_inner

# Auto splits aim at this many programs per SM: one program streams its keys with num_stages tiles
# in flight, several per SM keep more loads in flight (decode at 8 programs per SM read K/V at the
# copy bandwidth, at 2 per SM at 0.52-0.68 of it; docs/performance.md).
AUTO_PROGRAMS_PER_SM = 4
# Auto splits give each chunk at least this many keys: a short call split in two pays a second
# launch (the combine) and a partials buffer for a few microseconds of GPU time, and at 1024
# decode-mqa-d256-b16-8k runs one wave of 128 programs (1.07x its 16 chunks of 512 keys;
# benchmarks/results: h200-shapes-gluon-bwd-defaults).
MIN_CHUNK_KEYS = 1024
# The combine kernel (combine_parts) cuts a row's columns into parts where few rows would leave it a
# latency-bound tail on few SMs (decode-b1-64k's step 1.03x faster in 4 parts), but not below
# COMBINE_MIN_ELEMENTS partials or COMBINE_MIN_COLUMNS columns a part (benchmarks/results:
# h200-lpt-cap-decode-combine).
COMBINE_PROGRAMS_PER_SM = 2
COMBINE_MIN_COLUMNS = 32
COMBINE_MIN_ELEMENTS = 2048


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the split kernel runs a call: ``pack`` (query heads of a group as rows of one
    tile), ``block_m`` rows per tile, ``splits`` chunks of ``chunk`` keys each, from key
    ``start`` (a sliding window's first reachable key block; else 0)."""

    pack: bool
    block_m: int
    splits: int
    chunk: int
    start: int = 0



def combine_parts(rows: int, splits: int, block_d: int, sms: int) -> int:
    """Programs per (batch, head, query) row of the combine kernel, each over block_d /
    parts of its columns: a power of two, while the row's partials (splits x block_d fp32)
    give each part at least COMBINE_MIN_ELEMENTS of them and no part is narrower than
    COMBINE_MIN_COLUMNS columns, up to about COMBINE_PROGRAMS_PER_SM programs per SM."""
    want = _cdiv(COMBINE_PROGRAMS_PER_SM * sms, rows)
    if want <= 1:
        return 1
    by_work = max(1, splits * block_d // COMBINE_MIN_ELEMENTS)
    cap = min(block_d // COMBINE_MIN_COLUMNS, 1 << (by_work.bit_length() - 1))
    return max(1, min(1 << (want - 1).bit_length(), cap))


def _cdiv(a: int, b: int) -> int:
    # plain ints: triton.cdiv is a jit function, ~10 us per host call through its wrapper
    return -(-a // b)


def auto_splits(programs: int, n_blocks: int, sms: int, min_chunk_blocks: int = 1) -> int:
    """Chunks per query block so that ``programs`` (query blocks x heads x batch) times the
    chunks give about AUTO_PROGRAMS_PER_SM programs per SM; 1 when they fill the GPU
    already; never a chunk of fewer than ``min_chunk_blocks`` key blocks."""
    if programs >= sms:
        return 1
    return max(1, min(MAX_SPLITS, n_blocks // min_chunk_blocks, _cdiv(AUTO_PROGRAMS_PER_SM * sms, programs)))


def plan_schedule(config: FwdConfig, batch: int, heads_q: int, heads_kv: int, n_q: int, n_k: int,
                  device: torch.device, key_blocks: tuple[int, int] | None = None) -> Schedule | None:
    """The split kernel's schedule for this call, or None when the plain forward runs.

    ``key_blocks``: the key blocks [lo, hi) that some query reaches (a sliding window,
    common.window_blocks over all the queries); the chunks cut those alone, so that none
    falls outside the window. None: every key block.

    Auto packing (pack_gqa=-1): grouped heads whose queries do not fill a BLOCK_M tile.
    Auto splits (num_splits=0): auto_splits() over the key blocks, chunks of whole key
    blocks (at least MIN_CHUNK_KEYS keys) with none empty; the split kernel also runs with
    one split for decode-sized queries (at most DECODE_MAX_Q per head), its row block shrunk
    to fit them. Explicit values are taken as they are, also when they leave chunks empty.
    Remembered per (config, shape, SM count): every forward launch asks (about 6 us of host
    time per call on the build machine's CPU otherwise).
    """
    return _schedule(config, batch, heads_q, heads_kv, n_q, n_k, schedule_sm_count(device), key_blocks)


@functools.lru_cache(maxsize=4096)
def _schedule(config: FwdConfig, batch: int, heads_q: int, heads_kv: int, n_q: int, n_k: int,
              sms: int, key_blocks: tuple[int, int] | None) -> Schedule | None:
    group = heads_q // heads_kv
    pack = group > 1 and (config.pack_gqa == 1 or (config.pack_gqa == -1 and n_q < config.BLOCK_M))
    rows = n_q * group if pack else n_q
    block_m = min(config.BLOCK_M, max(16, 1 << (rows - 1).bit_length()))
    first, end = key_blocks or (0, _cdiv(n_k, config.BLOCK_N))
    n_blocks = max(end - first, 1)  # a window that reaches no key: one (empty) chunk
    if config.num_splits == 0:
        programs = _cdiv(rows, block_m) * (heads_kv if pack else heads_q) * batch
        splits = auto_splits(programs, n_blocks, sms, _cdiv(MIN_CHUNK_KEYS, config.BLOCK_N))
        chunk_blocks = _cdiv(n_blocks, splits)
        splits = _cdiv(n_blocks, chunk_blocks)
        if not pack and splits == 1 and n_q > DECODE_MAX_Q:
            return None
    else:
        splits = config.num_splits
        if not pack and splits == 1:
            return None
        chunk_blocks = _cdiv(n_blocks, splits)
    return Schedule(pack, block_m, splits, chunk_blocks * config.BLOCK_N, first * config.BLOCK_N)


@triton.jit(do_not_specialize=WINDOW_SIDES)
def _split_fwd_kernel(Q, K, V, O, LSE, DescK, DescV, CACHE_SEQLENS, BLOCK_TABLE, qk_scale, softcap_log2,
                      stride_qb, stride_qh, stride_qn, stride_qd,
                      stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd,
                      stride_ob, stride_oh, stride_os, stride_on, stride_od,
                      stride_lb, stride_lh, stride_ls,
                      stride_kp, stride_vp, stride_btb, stride_btn,
                      H_ROWS, M_BLOCKS, PACK, GROUP, N_Q, N_K, CHUNK, KEY_START, causal_off, win_left, win_right,
                      CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                      INT64: tl.constexpr, TMA: tl.constexpr, SCALE_POSITIVE: tl.constexpr, SOFTCAP: tl.constexpr,
                      WINDOW: tl.constexpr, SEQLENS: tl.constexpr = False, PAGED: tl.constexpr = False,
                      PAGE_SIZE: tl.constexpr = 1):
    # program (row block x batch x row head, chunk): axis 0 holds up to 2^31 - 1 programs
    # (CUDA caps axes 1 and 2 at 65535); a row head is a K/V head when packing (PACK =
    # GROUP), else a query head (PACK = 1)
    pid_m = tl.program_id(0) % M_BLOCKS
    pid_z = tl.program_id(0) // M_BLOCKS
    split = tl.program_id(1)
    off_b = (pid_z // H_ROWS).to(tl.int64)
    off_hr = (pid_z % H_ROWS).to(tl.int64)
    off_hk = off_hr * PACK // GROUP
    if SEQLENS:
        # a K/V cache (kvcache_forward): sequence off_b holds CACHE_SEQLENS[off_b] keys of the
        # N_K it has room for; the masks stop there, and causal (and a window) align
        # bottom-right on that length. Chunks past it are empty (output 0, lse -inf).
        N_K = tl.load(CACHE_SEQLENS + off_b)
        causal_off = N_K - N_Q

    rows = block_offsets(pid_m * BLOCK_M, BLOCK_M, INT64)
    row_ok = rows < N_Q * PACK
    q_idx = rows // PACK
    head = off_hr * PACK + rows % PACK
    offs_nb = block_offsets(0, BLOCK_N, INT64)
    offs_d = block_offsets(0, BLOCK_D, INT64)

    q_ptrs = Q + off_b * stride_qb + head[:, None] * stride_qh + q_idx[:, None] * stride_qn \
        + offs_d[None, :] * stride_qd
    if HEAD_DIM == BLOCK_D:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    k_base = K + off_b * stride_kb + off_hk * stride_kh + offs_d[None, :] * stride_kd
    v_base = V + off_b * stride_vb + off_hk * stride_vh + offs_d[None, :] * stride_vd
    # PAGED: K and V are (pages, PAGE_SIZE, heads, D) with stride_kb = stride_vb = 0; this
    # sequence's row of the block table maps its key n to page BLOCK_TABLE[off_b, n // PAGE_SIZE]
    bt_row = BLOCK_TABLE + off_b * stride_btb

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # the keys of the whole row block: [0, full_hi) unmasked for every row, up to hi masked
    # (key_range from the first row's query; the last row's query bounds hi); with a window
    # [lo, full_lo) masked and [full_lo, full_hi) unmasked, nothing outside [lo, hi)
    # (common.window_blocks over the block's queries); each cut to this split's chunk
    q_first = (pid_m * BLOCK_M) // PACK
    q_last = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, N_Q * PACK - 1) // PACK
    lo_s = KEY_START + split * CHUNK
    hi_s = lo_s + CHUNK
    if WINDOW:
        lo, full_lo, full_hi, hi = window_range(q_first, q_last, N_K, BLOCK_N, causal_off, win_left, win_right)
        full_lo, full_hi, hi = full_lo * BLOCK_N, full_hi * BLOCK_N, hi * BLOCK_N
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b,
                                   off_hk, q_idx + causal_off, offs_nb, offs_d, tl.maximum(lo_s, lo * BLOCK_N),
                                   tl.minimum(hi_s, full_lo), N_K, qk_scale, softcap_log2, win_left, win_right,
                                   True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SCALE_POSITIVE, SOFTCAP,
                                   WINDOW, block_table=bt_row, stride_btn=stride_btn, stride_kp=stride_kp,
                                   stride_vp=stride_vp, PAGED=PAGED, PAGE_SIZE=PAGE_SIZE)
        full_lo = tl.maximum(lo_s, full_lo)
    else:
        full_lo = lo_s
        full_hi, _ = key_range(q_first, N_K, CAUSAL, 1, BLOCK_N, causal_off)
        _, hi = key_range(q_last, N_K, CAUSAL, 1, BLOCK_N, causal_off)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b, off_hk,
                               q_idx + causal_off, offs_nb, offs_d, full_lo, tl.minimum(hi_s, full_hi), N_K, qk_scale,
                               softcap_log2, win_left, win_right,
                               False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SCALE_POSITIVE, SOFTCAP,
                               WINDOW, block_table=bt_row, stride_btn=stride_btn, stride_kp=stride_kp,
                               stride_vp=stride_vp, PAGED=PAGED, PAGE_SIZE=PAGE_SIZE)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b, off_hk,
                               q_idx + causal_off, offs_nb, offs_d, tl.maximum(lo_s, full_hi),
                               tl.minimum(hi_s, hi), N_K, qk_scale, softcap_log2, win_left, win_right,
                               True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SCALE_POSITIVE, SOFTCAP,
                               WINDOW, block_table=bt_row, stride_btn=stride_btn, stride_kp=stride_kp,
                               stride_vp=stride_vp, PAGED=PAGED, PAGE_SIZE=PAGE_SIZE)

    # a row that saw no key here: output 0 and log-sum-exp -inf (weight 0 in the combine)
    seen = l_i > 0.0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    o_ptrs = O + off_b * stride_ob + head[:, None] * stride_oh + split * stride_os + q_idx[:, None] * stride_on \
        + offs_d[None, :] * stride_od
    if HEAD_DIM == BLOCK_D:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(LSE + off_b * stride_lb + head * stride_lh + split * stride_ls + q_idx, lse, mask=row_ok)


@triton.jit
def _combine_kernel(OP, LSEP, O, LSE, SPLITS, H, N_Q,
                    stride_ob, stride_oh, stride_on, stride_od,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, INT64: tl.constexpr,
                    BLOCK_DC: tl.constexpr = None):
    # one program per (batch, head, query) row and BLOCK_DC of its BLOCK_D columns (axis
    # 1; None: all), all its chunks in one [BLOCK_S, BLOCK_DC] tile (BLOCK_S >= SPLITS): no
    # serial walk over the chunks. The partials are (B, H, SPLITS, N_Q, BLOCK_D) and
    # (B, H, SPLITS, N_Q) contiguous; the merged log-sum-exp (B, H, N_Q) contiguous, so its
    # offset is the row's index; the programs of a row's first columns write it.
    row = tl.program_id(0)
    if INT64:
        row = row.to(tl.int64)
    bh = row // N_Q
    q_idx = row % N_Q
    offs_s = block_offsets(0, BLOCK_S, INT64)
    if BLOCK_DC is None:
        offs_d = block_offsets(0, BLOCK_D, INT64)
    else:
        offs_d = block_offsets(tl.program_id(1) * BLOCK_DC, BLOCK_DC, INT64)
    s_ok = offs_s < SPLITS
    lse_s = tl.load(LSEP + (bh * SPLITS + offs_s) * N_Q + q_idx, mask=s_ok, other=float("-inf"))
    m = tl.max(lse_s, 0)
    # every chunk empty for this row (it sees no key): weights 0, not NaN
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse_s - m)
    l_sum = tl.sum(w, 0)
    o_ptrs = OP + ((bh * SPLITS + offs_s) * N_Q + q_idx)[:, None] * BLOCK_D + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        o_s = tl.load(o_ptrs, mask=s_ok[:, None], other=0.0)
    else:  # the partials' padding columns were never written
        o_s = tl.load(o_ptrs, mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    acc = tl.sum(w[:, None] * o_s, 0)
    seen = l_sum > 0.0
    acc = acc / tl.where(seen, l_sum, 1.0)
    if tl.program_id(1) == 0:
        tl.store(LSE + row, tl.where(seen, m + tl.math.log2(tl.where(seen, l_sum, 1.0)), float("-inf")))
    off_b = bh // H
    off_h = bh % H
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + q_idx * stride_on + offs_d * stride_od
    if HEAD_DIM == BLOCK_D:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty))
    else:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM)


def split_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: FwdConfig, schedule: Schedule, *,
                  causal: bool, causal_off: int, sm_scale: float, precision: str,
                  compile_only: bool = False, softcap: float = 0.0, window: tuple[int, int] | None = None,
                  cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward through the split kernel (and the combine kernel when it splits):
    ``(o, lse2)`` as attention_forward returns them; ``window`` as common.window_bounds
    gives it.

    ``cache_seqlens`` (the SEQLENS variant, kvcache_forward): k and v are a K/V cache with
    room for N_K keys per sequence, sequence b holding cache_seqlens[b] of them (a contiguous
    int32 (B,) tensor); causal and the window then align bottom-right on that length in the
    kernel (``causal_off`` is ignored). ``block_table`` (the PAGED variant, with
    cache_seqlens): k and v are (pages, page_size, heads_kv, D) pages, and the int32 (B,
    max_pages) table maps sequence b's key n to row n % page_size of page
    block_table[b, n // page_size] (N_K = max_pages x page_size). Both load through
    pointers (the config's tma is ignored)."""
    B, H, N_Q, D = q.shape
    paged = block_table is not None
    if paged:
        page_size, H_KV = k.shape[1], k.shape[2]
        N_K = block_table.shape[1] * page_size
        # the kernel's (batch, head, row, head-dim) strides: no batch offset, the row within a page
        k_strides = (0, k.stride(2), k.stride(1), k.stride(3))
        v_strides = (0, v.stride(2), v.stride(1), v.stride(3))
        page_strides = (k.stride(0), v.stride(0), *block_table.stride())
    else:
        page_size, H_KV, N_K = 1, k.shape[1], k.shape[2]
        k_strides, v_strides, page_strides = k.stride(), v.stride(), (0, 0, 0, 0)
    group = H // H_KV
    BLOCK_D = padded_head_dim(D)
    o = launch.empty_like(q)
    lse2 = launch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    S = schedule.splits
    if S == 1:
        o_part, lse_part = o, lse2
        o_strides = (o.stride(0), o.stride(1), 0, o.stride(2), o.stride(3))
        l_strides = (H * N_Q, N_Q, 0)
    else:
        o_part = launch.empty((B, H, S, N_Q, BLOCK_D), device=q.device, dtype=torch.float32)
        lse_part = launch.empty((B, H, S, N_Q), device=q.device, dtype=torch.float32)
        o_strides = (o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), 1)
        l_strides = lse_part.stride()[:3]
    descs = tma_descriptors(config.tma and cache_seqlens is None, (k, v), config.BLOCK_N, BLOCK_D)
    int64 = needs_int64(q, k, v, o, o_part)
    pack = group if schedule.pack else 1
    h_rows = H_KV if schedule.pack else H
    m_blocks = _cdiv(N_Q * pack, schedule.block_m)
    grid = (m_blocks * B * h_rows, S)
    # the cache's tensors, or stand-ins the kernel never reads (SEQLENS and PAGED off)
    lens = cache_seqlens if cache_seqlens is not None else lse2
    table = block_table if paged else lens
    with on_device(q):
        launch.launch(
            _split_fwd_kernel, q, k, v, o_part, lse_part, *(descs or (k, v)), lens, table,
            *score_scales(sm_scale, softcap),
            *q.stride(), *k_strides, *v_strides, *o_strides, *l_strides, *page_strides,
            h_rows, m_blocks, pack, group, N_Q, N_K, schedule.chunk, schedule.start, causal_off,
            *(window or (0, 0)),
            CAUSAL=bool(causal), HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_M=schedule.block_m, BLOCK_N=config.BLOCK_N,
            PRECISION=precision, INT64=int64, TMA=descs is not None, SCALE_POSITIVE=sm_scale > 0 and not softcap,
            SOFTCAP=bool(softcap), WINDOW=window is not None, SEQLENS=cache_seqlens is not None, PAGED=paged,
            PAGE_SIZE=page_size,
            num_warps=config.num_warps, num_stages=config.num_stages, grid=grid, warmup=compile_only)
        if S > 1:
            block_s = max(2, 1 << (S - 1).bit_length())
            parts = combine_parts(B * H * N_Q, S, BLOCK_D, schedule_sm_count(q.device))
            block_dc = BLOCK_D // parts
            launch.launch(
                _combine_kernel, o_part, lse_part, o, lse2, S, H, N_Q, *o.stride(),
                HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_S=block_s, INT64=int64, BLOCK_DC=block_dc if parts > 1 else None,
                num_warps=4 if block_s * block_dc <= 8192 else 8, num_stages=1, grid=(B * H * N_Q, parts),
                warmup=compile_only)
    return o, lse2


def kvcache_schedule(config: FwdConfig, batch: int, heads_q: int, heads_kv: int, n_q: int, n_k: int,
                     device: torch.device) -> Schedule:
    """The split kernel's schedule for a K/V cache call (kvcache_forward) whose sequences hold
    at most ``n_k`` keys: plan_schedule's, and where that would run the plain forward
    (which has no per-sequence lengths), the split kernel with one chunk and no packing."""
    schedule = plan_schedule(config, batch, heads_q, heads_kv, n_q, max(n_k, 1), device)
    if schedule is None:
        block_m = min(config.BLOCK_M, max(16, 1 << (n_q - 1).bit_length()))
        schedule = Schedule(False, block_m, 1, _cdiv(max(n_k, 1), config.BLOCK_N) * config.BLOCK_N)
    return schedule
