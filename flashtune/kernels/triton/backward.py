"""The Triton backward kernels: recompute P from the saved log-sum-exp.

Three launches: a preprocess for Delta = rowsum(dO * O); a dK/dV kernel that holds a
block of keys and walks the queries of every query head sharing that key head
(grouped-query attention needs no atomics); a dQ kernel that holds a block of queries
and walks the keys. In each walk, blocks that need no mask (not on the causal diagonal
or a window's edge, not past the sequence end) run apart from those that do, and blocks
outside a sliding window are not walked (common.window_blocks).

With S = sm_scale * Q K^T, P = softmax(S), dP = dO V^T, dS = P * (dP - Delta):
dV = P^T dO, dK = sm_scale * dS^T Q, dQ = sm_scale * dS K.

With dropout (DROPOUT, common.Dropout) the forward's output is (Z * P) V, Z = mask / (1 - p),
the mask regenerated here from its seed: dV = (Z * P)^T dO, dP = Z * (dO V^T), dS = P * (dP -
Delta), and Delta = rowsum(P * dP) = rowsum(dO * (Z * P) V) = rowsum(dO * O) as without it.

The walked tiles (Q and dO in the dK/dV kernel, K and V in the dQ kernel) load through
pointers or, with ``config.tma``, through TMA descriptors (common.tma_descriptors).

Packed variable-length sequences (VARLEN, ``varlen``): the dK/dV kernel runs over (key
block, K/V head, sequence), the dQ kernel over (query block, head, sequence), each reading
its sequence's rows from the cumulative offsets (common.Varlen); the preprocess runs over
the packed rows; the log-sum-exp and Delta are (Hq, total_q).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtune.configs.backward import BwdConfig, dkdv_split
from flashtune.configs.base import padded_head_dim
from flashtune.device import sm_count
from flashtune.kernels import launch
from flashtune.kernels.common import (DROPOUT_ARGS, Dropout, VARLEN_SIZES, Varlen, WINDOW_SIDES, call_geometry, cdiv, dot_precision, dropout_args, kernel_strides, needs_int64, on_device, score_scales, stride_align)
from flashtune.kernels.schedule import query_lpt_units
from flashtune.kernels.triton.common import (aligned, block_offsets, dropout_keep, dropout_rows, key_range,
                                             load_tile, packed_sequence, query_block_program,
                                             softcap_log2_scores, store_tile, tma_descriptors, tma_tile,
                                             window_range)


@triton.jit
def _bwd_preprocess_kernel(O, DO, DELTA, ZERO,
                           stride_ob, stride_oh, stride_on, stride_od,
                           stride_dob, stride_doh, stride_don, stride_dod,
                           H, N_Q, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
                           INT64: tl.constexpr, STRIDE_ALIGN: tl.constexpr, ZERO_ROWS: tl.constexpr):
    # ZERO_ROWS: also zero the same rows of ZERO, a contiguous (B, H, N_Q, HEAD_DIM) float32
    # tensor (the fused dQ's accumulator), so it needs no fill kernel of its own
    stride_ob, stride_oh, stride_on = aligned(stride_ob, stride_oh, stride_on, STRIDE_ALIGN)
    stride_dob, stride_doh, stride_don = aligned(stride_dob, stride_doh, stride_don, STRIDE_ALIGN)
    off_h = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    pid_bh = off_b * H + off_h
    offs_m = block_offsets(tl.program_id(0) * BLOCK, BLOCK, INT64)
    offs_d = block_offsets(0, BLOCK_D, INT64)
    o = load_tile(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od,
                  offs_m, N_Q, offs_d, True, HEAD_DIM, BLOCK_D)
    do = load_tile(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_don
                   + offs_d[None, :] * stride_dod, offs_m, N_Q, offs_d, True, HEAD_DIM, BLOCK_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + pid_bh * N_Q + offs_m, delta, mask=offs_m < N_Q)
    if ZERO_ROWS:
        zero_ptrs = ZERO + (pid_bh * N_Q + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
        if HEAD_DIM == BLOCK_D:
            tl.store(zero_ptrs, tl.zeros([BLOCK, BLOCK_D], tl.float32), mask=offs_m[:, None] < N_Q)
        else:
            tl.store(zero_ptrs, tl.zeros([BLOCK, BLOCK_D], tl.float32),
                     mask=(offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, stride_qn, stride_don, lse_base, delta_base, dqa_base,
                    desc_q, desc_do, desc_dqa, off_b, off_h,
                    offs_n, offs_mb, offs_d, lo, hi, N_Q, N_K, qk_scale, softcap_log2, sm_scale, causal_off,
                    win_left, win_right,
                    MASK: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                    ATOMIC_DQ: tl.constexpr, TMA: tl.constexpr, TMA_DQ: tl.constexpr, SOFTCAP: tl.constexpr,
                    WINDOW: tl.constexpr, rng_seed, drop_base, drop_words, drop_threshold, drop_scale, start_n,
                    DROPOUT: tl.constexpr):
    # with DROPOUT drop_base is the first query row's first Philox counter (common.dropout_rows)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_mb
        if TMA:
            q = tma_tile(desc_q, off_b, off_h, start_m, BLOCK_M, BLOCK_D)
        else:
            q = load_tile(q_base + offs_m[:, None] * stride_qn, offs_m, N_Q, offs_d, MASK, HEAD_DIM, BLOCK_D)
        if MASK:
            lse = tl.load(lse_base + offs_m, mask=offs_m < N_Q, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
        # scores transposed: keys along rows, queries along columns
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        if SOFTCAP:  # the capped scores (common.softcap_log2_scores); qk_scale is its tanh scale
            s_t = softcap_log2_scores(s_t, qk_scale, softcap_log2)
            p_t = tl.math.exp2(s_t - lse[None, :])
        else:
            p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
        if MASK:
            valid = (offs_m[None, :] < N_Q) & (offs_n[:, None] < N_K)
            if CAUSAL:
                valid = valid & (offs_n[:, None] <= offs_m[None, :] + causal_off)
            if WINDOW:
                valid = valid & (offs_n[:, None] >= offs_m[None, :] + causal_off - win_left) \
                    & (offs_n[:, None] <= offs_m[None, :] + causal_off + win_right)
            p_t = tl.where(valid, p_t, 0.0)
        if DROPOUT:  # the forward's mask, regenerated in its [queries, keys] orientation
            keep_t = tl.trans(dropout_keep(rng_seed, drop_base + offs_m.to(tl.int64) * drop_words, start_n,
                                           drop_threshold, BLOCK_N))
            pk_t = tl.where(keep_t, p_t, 0.0)  # dV = (mask * P / (1 - p))^T dO, the scale applied at the end
        else:
            pk_t = p_t
        if TMA:
            do = tma_tile(desc_do, off_b, off_h, start_m, BLOCK_M, BLOCK_D)
        else:
            do = load_tile(do_base + offs_m[:, None] * stride_don, offs_m, N_Q, offs_d, MASK, HEAD_DIM, BLOCK_D)
        dv = tl.dot(pk_t.to(do.dtype), do, dv, input_precision=PRECISION)
        if MASK:
            delta = tl.load(delta_base + offs_m, mask=offs_m < N_Q, other=0.0)
        else:
            delta = tl.load(delta_base + offs_m)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        if DROPOUT:  # dP through the dropout: mask * dP / (1 - p); Delta = rowsum(dO * O) holds as it is
            dp_t = tl.where(keep_t, dp_t * drop_scale, 0.0)
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:  # through the cap: d(c tanh(s / c)) / ds = 1 - tanh^2
            t_t = s_t / softcap_log2
            ds_t = ds_t * (1.0 - t_t * t_t)
        ds_t = ds_t.to(q.dtype)
        dk = tl.dot(ds_t, q, dk, input_precision=PRECISION)
        if ATOMIC_DQ:
            # this key block's share of dQ, added into the fp32 accumulator
            dq = tl.dot(tl.trans(ds_t), k, input_precision=PRECISION) * sm_scale
            if TMA_DQ:
                # one bulk reduce-add of the whole tile from shared memory (rows past
                # N_Q fall outside the descriptor and are dropped)
                desc_dqa.atomic_add([off_b.to(tl.int32), off_h.to(tl.int32), start_m, 0],
                                    dq.reshape(1, 1, BLOCK_M, BLOCK_D))
            else:
                dq_ptrs = dqa_base + offs_m[:, None] * BLOCK_D + offs_d[None, :]
                if MASK:
                    tl.atomic_add(dq_ptrs, dq, mask=offs_m[:, None] < N_Q, sem="relaxed")
                else:
                    tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=WINDOW_SIDES + VARLEN_SIZES + DROPOUT_ARGS)
def _bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, DQA, DescQ, DescDO, DescDQA, CU_Q, CU_K, RNG, sm_scale, qk_scale,
                     softcap_log2, drop_threshold, drop_scale,
                     stride_qb, stride_qh, stride_qn, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_dob, stride_doh, stride_don, stride_dod,
                     stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                     stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                     H, GROUP, N_Q, N_K, causal_off, win_left, win_right, SPLIT_H, SPLIT_Q, TOTAL_Q,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
                     ATOMIC_DQ: tl.constexpr, TMA: tl.constexpr, TMA_DQ: tl.constexpr, PARTIAL: tl.constexpr,
                     SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, VARLEN: tl.constexpr, DROPOUT: tl.constexpr,
                     STRIDE_ALIGN: tl.constexpr):
    stride_qb, stride_qh, stride_qn = aligned(stride_qb, stride_qh, stride_qn, STRIDE_ALIGN)
    stride_kb, stride_kh, stride_kn = aligned(stride_kb, stride_kh, stride_kn, STRIDE_ALIGN)
    stride_vb, stride_vh, stride_vn = aligned(stride_vb, stride_vh, stride_vn, STRIDE_ALIGN)
    stride_dob, stride_doh, stride_don = aligned(stride_dob, stride_doh, stride_don, STRIDE_ALIGN)
    stride_dkb, stride_dkh, stride_dkn = aligned(stride_dkb, stride_dkh, stride_dkn, STRIDE_ALIGN)
    stride_dvb, stride_dvh, stride_dvn = aligned(stride_dvb, stride_dvh, stride_dvn, STRIDE_ALIGN)
    # axis 1 runs over (K/V head, split): split s of a key block takes the query heads
    # [s_h * GROUP / SPLIT_H, ...) of the group and the s_q-th of SPLIT_Q chunks of its
    # query blocks; with PARTIAL its dK/dV go to fp32 slot s of DK/DV, summed afterwards
    block_n = tl.program_id(0)
    hk_split = tl.program_id(1)
    off_b = tl.program_id(2).to(tl.int64)
    n_batch = tl.num_programs(2)
    split = hk_split % (SPLIT_H * SPLIT_Q)
    off_hk = (hk_split // (SPLIT_H * SPLIT_Q)).to(tl.int64)
    start_n = block_n * BLOCK_N
    if DROPOUT:  # the mask's counters per row (common.Dropout): of the grid's N_K, before varlen sets its own
        drop_words = tl.cdiv(N_K, 4)
        rng_seed, rng_offset = tl.load(RNG), tl.load(RNG + 1)
    else:
        drop_words, rng_seed = 0, 0
    if VARLEN:
        # sequence off_b of a packed batch (common.Varlen, as the forward kernel); a
        # sequence without queries still writes its keys' zero dK and dV
        tl.static_assert(not (TMA or TMA_DQ or PARTIAL), "varlen: pointer loads, no split")
        q_start, N_Q = packed_sequence(CU_Q, off_b, INT64)
        k_start, N_K = packed_sequence(CU_K, off_b, INT64)
        causal_off = N_K - N_Q
        if start_n >= N_K:
            return
        q_off, do_off = q_start * stride_qn, q_start * stride_don
        k_off, v_off, dk_off, dv_off = (k_start * stride_kn, k_start * stride_vn, k_start * stride_dkn,
                                        k_start * stride_dvn)
    else:
        q_off, do_off = off_b * stride_qb, off_b * stride_dob
        k_off, v_off, dk_off, dv_off = off_b * stride_kb, off_b * stride_vb, off_b * stride_dkb, off_b * stride_dvb
    offs_n = block_offsets(start_n, BLOCK_N, INT64)
    offs_mb = block_offsets(0, BLOCK_M, INT64)
    offs_d = block_offsets(0, BLOCK_D, INT64)

    k = load_tile(K + k_off + off_hk * stride_kh + offs_n[:, None] * stride_kn
                  + offs_d[None, :] * stride_kd, offs_n, N_K, offs_d, True, HEAD_DIM, BLOCK_D)
    v = load_tile(V + v_off + off_hk * stride_vh + offs_n[:, None] * stride_vn
                  + offs_d[None, :] * stride_vd, offs_n, N_K, offs_d, True, HEAD_DIM, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # Query blocks (aligned to BLOCK_M): [first, diag_end) straddle the causal diagonal,
    # [diag_end, tail) need no mask, [tail, n_blocks) cross the end of the sequence.
    # (query i sees keys j <= i + causal_off; clamped at 0 before dividing). With a window:
    # [first, diag_end) and [tail, n_blocks) hold its edges, and the query blocks outside
    # [first, n_blocks) are skipped (common.window_blocks, the keys' view: query i sees key
    # j iff j - right - causal_off <= i <= j + left - causal_off).
    if WINDOW:
        first, diag_end, tail, n_blocks = window_range(start_n, tl.minimum(start_n + BLOCK_N, N_K) - 1, N_Q, BLOCK_M,
                                                       -causal_off, win_right, win_left)
    else:
        n_blocks = tl.cdiv(N_Q, BLOCK_M)
        if CAUSAL:
            first = tl.maximum(start_n - causal_off, 0) // BLOCK_M
            diag_end = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_off, 0), BLOCK_M), n_blocks)
        else:
            first = 0
            diag_end = 0
        tail = tl.maximum(diag_end, N_Q // BLOCK_M)
    if SPLIT_Q > 1:
        # this split's chunk [lo, hi) of the query blocks [first, n_blocks), each segment clamped to it
        chunk = tl.cdiv(n_blocks - first, SPLIT_Q)
        lo = first + (split % SPLIT_Q) * chunk
        hi = tl.minimum(lo + chunk, n_blocks)
        first = tl.minimum(tl.maximum(first, lo), hi)
        diag_end = tl.minimum(tl.maximum(diag_end, lo), hi)
        tail = tl.minimum(tl.maximum(tail, lo), hi)
        n_blocks = hi
    heads = GROUP // SPLIT_H
    g_lo = (split // SPLIT_Q) * heads

    for g in range(g_lo, g_lo + heads):
        off_h = off_hk * GROUP + g
        q_base = Q + q_off + off_h * stride_qh + offs_d[None, :] * stride_qd
        do_base = DO + do_off + off_h * stride_doh + offs_d[None, :] * stride_dod
        if VARLEN:
            row = off_h * TOTAL_Q + q_start  # LSE, Delta (H, TOTAL_Q); atomic dQ (H, TOTAL_Q, BLOCK_D)
        else:
            row = (off_b * H + off_h) * N_Q
        dqa_base = DQA + row * BLOCK_D
        if DROPOUT:
            drop_base = rng_offset + row * drop_words  # query row 0's first counter (common.dropout_rows)
        else:
            drop_base = 0
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, stride_qn, stride_don, LSE + row, DELTA + row,
                                 dqa_base, DescQ, DescDO, DescDQA, off_b, off_h,
                                 offs_n, offs_mb, offs_d, first * BLOCK_M, diag_end * BLOCK_M, N_Q, N_K,
                                 qk_scale, softcap_log2, sm_scale, causal_off, win_left, win_right,
                                 True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, ATOMIC_DQ, TMA,
                                 TMA_DQ, SOFTCAP, WINDOW, rng_seed, drop_base, drop_words, drop_threshold,
                                 drop_scale, start_n, DROPOUT)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, stride_qn, stride_don, LSE + row, DELTA + row,
                                 dqa_base, DescQ, DescDO, DescDQA, off_b, off_h,
                                 offs_n, offs_mb, offs_d, diag_end * BLOCK_M, tail * BLOCK_M, N_Q, N_K,
                                 qk_scale, softcap_log2, sm_scale, causal_off, win_left, win_right,
                                 False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, ATOMIC_DQ, TMA,
                                 TMA_DQ, SOFTCAP, WINDOW, rng_seed, drop_base, drop_words, drop_threshold,
                                 drop_scale, start_n, DROPOUT)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, stride_qn, stride_don, LSE + row, DELTA + row,
                                 dqa_base, DescQ, DescDO, DescDQA, off_b, off_h,
                                 offs_n, offs_mb, offs_d, tail * BLOCK_M, n_blocks * BLOCK_M, N_Q, N_K,
                                 qk_scale, softcap_log2, sm_scale, causal_off, win_left, win_right,
                                 True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, ATOMIC_DQ, TMA,
                                 TMA_DQ, SOFTCAP, WINDOW, rng_seed, drop_base, drop_words, drop_threshold,
                                 drop_scale, start_n, DROPOUT)

    dk = dk * sm_scale
    if DROPOUT:
        dv = dv * drop_scale  # the kept P's 1 / (1 - p)
    if PARTIAL:
        # (split, B, H_KV, N_K, BLOCK_D) fp32 slots, summed by _bwd_dkdv_sum_kernel
        slot = ((split * n_batch + off_b) * (H // GROUP) + off_hk) * N_K  # int64, as off_b is
        ptrs = (slot + offs_n[:, None]) * BLOCK_D + offs_d[None, :]
        tl.store(DK + ptrs, dk, mask=offs_n[:, None] < N_K)
        tl.store(DV + ptrs, dv, mask=offs_n[:, None] < N_K)
    else:
        store_tile(DK + dk_off + off_hk * stride_dkh + offs_n[:, None] * stride_dkn
                   + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty), offs_n, N_K, offs_d, HEAD_DIM,
                   BLOCK_D)
        store_tile(DV + dv_off + off_hk * stride_dvh + offs_n[:, None] * stride_dvn
                   + offs_d[None, :] * stride_dvd, dv.to(DV.dtype.element_ty), offs_n, N_K, offs_d, HEAD_DIM,
                   BLOCK_D)


@triton.jit
def _bwd_dkdv_sum_kernel(PK, PV, DK, DV,
                         stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                         stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                         SPLIT, N_K, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
                         INT64: tl.constexpr, STRIDE_ALIGN: tl.constexpr):
    stride_dkb, stride_dkh, stride_dkn = aligned(stride_dkb, stride_dkh, stride_dkn, STRIDE_ALIGN)
    stride_dvb, stride_dvh, stride_dvn = aligned(stride_dvb, stride_dvh, stride_dvn, STRIDE_ALIGN)
    # dK and dV of one block of keys: the sum of the SPLIT fp32 partials, in a fixed order
    off_hk = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    offs_n = block_offsets(tl.program_id(0) * BLOCK, BLOCK, INT64)
    offs_d = block_offsets(0, BLOCK_D, INT64)
    slots = tl.num_programs(2).to(tl.int64) * tl.num_programs(1) * N_K * BLOCK_D  # elements per slot
    ptrs = ((off_b * tl.num_programs(1) + off_hk) * N_K + offs_n[:, None]) * BLOCK_D + offs_d[None, :]
    mask = offs_n[:, None] < N_K
    dk = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    for s in range(SPLIT):
        dk += tl.load(PK + s * slots + ptrs, mask=mask, other=0.0)
        dv += tl.load(PV + s * slots + ptrs, mask=mask, other=0.0)
    store_tile(DK + off_b * stride_dkb + off_hk * stride_dkh + offs_n[:, None] * stride_dkn
               + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty), offs_n, N_K, offs_d, HEAD_DIM, BLOCK_D)
    store_tile(DV + off_b * stride_dvb + off_hk * stride_dvh + offs_n[:, None] * stride_dvn
               + offs_d[None, :] * stride_dvd, dv.to(DV.dtype.element_ty), offs_n, N_K, offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, desc_k, desc_v, off_b, off_hk,
                  diag, offs_nb, offs_d, lo, hi, N_K, qk_scale, softcap_log2, win_left, win_right,
                  MASK: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
                  SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, rng_seed, drop_base, drop_threshold, drop_scale,
                  DROPOUT: tl.constexpr):
    # diag: each query's diagonal key (its query index + causal_off); with DROPOUT drop_base
    # holds each query's first Philox counter (common.dropout_rows)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_nb
        if TMA:
            k = tma_tile(desc_k, off_b, off_hk, start_n, BLOCK_N, BLOCK_D)
            v = tma_tile(desc_v, off_b, off_hk, start_n, BLOCK_N, BLOCK_D)
        else:
            k = load_tile(k_base + offs_n[:, None] * stride_kn, offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
            v = load_tile(v_base + offs_n[:, None] * stride_vn, offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP:
            s = softcap_log2_scores(s, qk_scale, softcap_log2)
            p = tl.math.exp2(s - lse[:, None])
        else:
            p = tl.math.exp2(s * qk_scale - lse[:, None])
        if MASK:
            valid = offs_n[None, :] < N_K
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= diag[:, None])
            if WINDOW:
                valid = valid & (offs_n[None, :] >= diag[:, None] - win_left) \
                    & (offs_n[None, :] <= diag[:, None] + win_right)
            p = tl.where(valid, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:  # dP through the forward's mask, regenerated: mask * dP / (1 - p)
            keep = dropout_keep(rng_seed, drop_base, start_n, drop_threshold, BLOCK_N)
            dp = tl.where(keep, dp * drop_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            t = s / softcap_log2
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit(do_not_specialize=WINDOW_SIDES + VARLEN_SIZES + DROPOUT_ARGS)
def _bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, DescK, DescV, CU_Q, CU_K, RNG, sm_scale, qk_scale, softcap_log2,
                   drop_threshold, drop_scale,
                   stride_qb, stride_qh, stride_qn, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_dob, stride_doh, stride_don, stride_dod,
                   stride_dqb, stride_dqh, stride_dqn, stride_dqd,
                   H, GROUP, N_Q, N_K, causal_off, win_left, win_right, TOTAL_Q, LPT_UNITS,
                   CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
                   TMA: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, VARLEN: tl.constexpr,
                   DROPOUT: tl.constexpr, STRIDE_ALIGN: tl.constexpr):
    stride_qb, stride_qh, stride_qn = aligned(stride_qb, stride_qh, stride_qn, STRIDE_ALIGN)
    stride_kb, stride_kh, stride_kn = aligned(stride_kb, stride_kh, stride_kn, STRIDE_ALIGN)
    stride_vb, stride_vh, stride_vn = aligned(stride_vb, stride_vh, stride_vn, STRIDE_ALIGN)
    stride_dob, stride_doh, stride_don = aligned(stride_dob, stride_doh, stride_don, STRIDE_ALIGN)
    stride_dqb, stride_dqh, stride_dqn = aligned(stride_dqb, stride_dqh, stride_dqn, STRIDE_ALIGN)
    pid_m, off_h, off_b = query_block_program(N_Q, H, BLOCK_M, CAUSAL, LPT_UNITS)
    off_hk = off_h // GROUP
    start_m = pid_m * BLOCK_M
    if DROPOUT:  # the mask's counters per row (common.Dropout): of the grid's N_K, before varlen sets its own
        drop_words = tl.cdiv(N_K, 4)
    if VARLEN:
        # sequence off_b of a packed batch (common.Varlen, as the forward kernel)
        tl.static_assert(not TMA, "varlen loads through pointers")
        q_start, N_Q = packed_sequence(CU_Q, off_b, INT64)
        k_start, N_K = packed_sequence(CU_K, off_b, INT64)
        causal_off = N_K - N_Q
        if start_m >= N_Q:
            return
        q_off, do_off, dq_off = q_start * stride_qn, q_start * stride_don, q_start * stride_dqn
        k_off, v_off = k_start * stride_kn, k_start * stride_vn
        row = off_h * TOTAL_Q + q_start  # LSE, Delta (H, TOTAL_Q)
    else:
        q_off, do_off, dq_off = off_b * stride_qb, off_b * stride_dob, off_b * stride_dqb
        k_off, v_off = off_b * stride_kb, off_b * stride_vb
        row = (off_b * H + off_h) * N_Q
    offs_m = block_offsets(start_m, BLOCK_M, INT64)
    offs_nb = block_offsets(0, BLOCK_N, INT64)
    offs_d = block_offsets(0, BLOCK_D, INT64)

    q = load_tile(Q + q_off + off_h * stride_qh + offs_m[:, None] * stride_qn
                  + offs_d[None, :] * stride_qd, offs_m, N_Q, offs_d, True, HEAD_DIM, BLOCK_D)
    do = load_tile(DO + do_off + off_h * stride_doh + offs_m[:, None] * stride_don
                   + offs_d[None, :] * stride_dod, offs_m, N_Q, offs_d, True, HEAD_DIM, BLOCK_D)
    lse = tl.load(LSE + row + offs_m, mask=offs_m < N_Q, other=0.0)
    delta = tl.load(DELTA + row + offs_m, mask=offs_m < N_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if DROPOUT:
        rng_seed, drop_base = dropout_rows(RNG, row + offs_m, drop_words)
    else:
        rng_seed, drop_base = 0, 0

    k_base = K + k_off + off_hk * stride_kh + offs_d[None, :] * stride_kd
    v_base = V + v_off + off_hk * stride_vh + offs_d[None, :] * stride_vd
    # key blocks as the forward walks them (with a window: its left edge [lo, full_lo) masked
    # first, nothing outside [lo, hi), common.window_blocks)
    if WINDOW:
        lo, full_lo, full_hi, hi = window_range(start_m, tl.minimum(start_m + BLOCK_M, N_Q) - 1, N_K, BLOCK_N,
                                                causal_off, win_left, win_right)
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b, off_hk,
                           offs_m + causal_off, offs_nb, offs_d, lo * BLOCK_N, full_lo * BLOCK_N, N_K, qk_scale,
                           softcap_log2, win_left, win_right,
                           True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SOFTCAP, WINDOW,
                           rng_seed, drop_base, drop_threshold, drop_scale, DROPOUT)
        full_lo, full_hi, hi = full_lo * BLOCK_N, full_hi * BLOCK_N, hi * BLOCK_N
    else:
        full_lo = 0
        full_hi, hi = key_range(start_m, N_K, CAUSAL, BLOCK_M, BLOCK_N, causal_off)
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b, off_hk,
                       offs_m + causal_off, offs_nb, offs_d, full_lo, full_hi, N_K, qk_scale, softcap_log2,
                       win_left, win_right,
                       False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SOFTCAP, WINDOW,
                       rng_seed, drop_base, drop_threshold, drop_scale, DROPOUT)
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b, off_hk,
                       offs_m + causal_off, offs_nb, offs_d, full_hi, hi, N_K, qk_scale, softcap_log2,
                       win_left, win_right,
                       True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SOFTCAP, WINDOW,
                       rng_seed, drop_base, drop_threshold, drop_scale, DROPOUT)
    dq = dq * sm_scale
    store_tile(DQ + dq_off + off_h * stride_dqh + offs_m[:, None] * stride_dqn
               + offs_d[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty), offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D)


def triton_backward(do, q, k, v, o, lse2, config: BwdConfig, causal, sm_scale, fp32_precision, compile_only,
                    causal_align, softcap, window_size, varlen, dropout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton kernels' launches with a Triton ``config`` on checked inputs
    (passes.attention_backward's arguments)."""
    B, H, H_KV, N_Q, N_K, D, window, off = call_geometry(q, k, varlen, causal, causal_align, window_size)
    BLOCK_D = padded_head_dim(D)
    precision = dot_precision(q.dtype, fp32_precision)
    dq, dk, dv = launch.empty_like(q), launch.empty_like(k), launch.empty_like(v)
    # Delta in the log-sum-exp's layout: (B, H, N_Q), or (H, total_q) packed
    rows = (B, H, N_Q) if varlen is None else (H, q.shape[0])
    delta = launch.empty(rows, device=q.device, dtype=torch.float32)
    atomic_dq = bool(config.atomic_dq) and not torch.are_deterministic_algorithms_enabled()
    if atomic_dq:  # a zeroed accumulator and a copy out of it: not in a launch plan
        launch.unplannable()
    # dQ accumulator of the atomic mode, padded to BLOCK_D so the adds need no column mask
    # (without atomics the kernel never touches it: any fp32 pointer will do, no allocation)
    dq_acc = torch.zeros((*rows, BLOCK_D), device=q.device, dtype=torch.float32) if atomic_dq else delta

    # the walked tiles (dK/dV: Q and dO; dQ: K and V) through TMA descriptors when the
    # config asks and the copy engine can address the tensors, else through pointers
    tma = bool(config.tma) and varlen is None
    descs_dkdv = tma_descriptors(tma, (q, do), config.BLOCK_M1, BLOCK_D)
    # atomic dQ with tma: each tile's adds go as one bulk reduce-add through a descriptor
    # over the accumulator (ours, so always addressable), instead of one atomic per element
    # (GPU only: the interpreter has no descriptor reduce)
    desc_dqa = (tma_descriptors(tma, (dq_acc,), config.BLOCK_M1, BLOCK_D)
                if atomic_dq and q.device.type == "cuda" else None)
    int64 = needs_int64(q, k, v, o, do, dq, dk, dv, dq_acc)
    cu = (delta, delta) if varlen is None else (varlen.cu_seqlens_q, varlen.cu_seqlens_k)  # unused without varlen
    rng, drop_threshold, drop_scale = dropout_args(dropout, delta)
    with on_device(q):
        if varlen is None:
            _preprocess(o, do, delta, int64=int64, compile_only=compile_only)
        else:  # over the packed rows: (1, H, total_q, D) views, Delta (1, H, total_q)
            _preprocess(o.unsqueeze(0).transpose(1, 2), do.unsqueeze(0).transpose(1, 2), delta.unsqueeze(0),
                        int64=int64, compile_only=compile_only)
        options = dict(CAUSAL=bool(causal), HEAD_DIM=D, BLOCK_D=BLOCK_D, PRECISION=precision, INT64=int64,
                      num_warps=config.num_warps, num_stages=config.num_stages, warmup=compile_only)
        split_h, split_q = (dkdv_split(config, batch=B, heads_q=H, heads_kv=H_KV, n_q=N_Q, n_k=N_K,
                                       sm_count=sm_count(q.device)) if varlen is None else (1, 1))
        split = split_h * split_q
        # a split key block's programs write fp32 partials, summed in a fixed order afterwards
        parts = (launch.empty((2, split, B, H_KV, N_K, BLOCK_D), device=q.device, dtype=torch.float32)
                 if split > 1 else (dk, dv))
        n_n = cdiv(N_K, config.BLOCK_N1)
        launch.launch(
            _bwd_dkdv_kernel, q, k, v, do, parts[0], parts[1], lse2, delta, dq_acc, *(descs_dkdv or (q, do)),
            *(desc_dqa or (dq_acc,)), *cu, rng, sm_scale, *score_scales(sm_scale, softcap), drop_threshold,
            drop_scale, *kernel_strides(q, varlen), *kernel_strides(k, varlen), *kernel_strides(v, varlen),
            *kernel_strides(do, varlen), *kernel_strides(dk, varlen), *kernel_strides(dv, varlen),
            H, H // H_KV, N_Q, N_K, off, *(window or (0, 0)), split_h, split_q, rows[-1],
            BLOCK_M=config.BLOCK_M1, BLOCK_N=config.BLOCK_N1,
            # grid order: the heaviest-first order gains only on the grouped-query D=128 rows, which the
            # Gluon backward serves on sm_90 (benchmarks/results: h200-lpt-cap-decode-combine)
            grid=(n_n, H_KV * split, B),
            ATOMIC_DQ=atomic_dq, TMA=descs_dkdv is not None, TMA_DQ=desc_dqa is not None, PARTIAL=split > 1,
            SOFTCAP=bool(softcap), WINDOW=window is not None, VARLEN=varlen is not None,
            DROPOUT=dropout is not None, STRIDE_ALIGN=stride_align(q, k, v, do, dk, dv), **options)
        if split > 1:
            _sum_partials(parts, dk, dv, int64=int64, compile_only=compile_only)
        if atomic_dq:
            if not compile_only:  # the kernel added dQ already scaled
                dq.copy_(dq_acc[..., :D] if varlen is None else dq_acc[..., :D].transpose(0, 1))
            return dq, dk, dv
        _launch_dq(q, k, v, do, dq, lse2, delta, config, causal=causal, sm_scale=sm_scale, precision=precision,
                   int64=int64, compile_only=compile_only, causal_off=off, softcap=softcap, window=window,
                   varlen=varlen, dropout=dropout)
    return dq, dk, dv


def _preprocess(o, do, delta, *, int64: bool, compile_only: bool = False, zero: torch.Tensor | None = None) -> None:
    """Delta = rowsum(dO * O) into ``delta`` (B, H, N_Q) for (B, H, N_Q, D) o and do, on
    the current device; ``zero``: a contiguous float32 tensor of o's shape, zeroed by the same
    kernel (the fused dQ's accumulator)."""
    B, H, N_Q, D = o.shape
    if zero is not None and (zero.dtype != torch.float32 or zero.shape != o.shape or not zero.is_contiguous()):
        raise ValueError(f"zero: expected a contiguous float32 tensor of shape {tuple(o.shape)}, got "
                         f"{zero.dtype} {tuple(zero.shape)}{'' if zero.is_contiguous() else ' (strided)'}")
    BLOCK_D = padded_head_dim(D)
    block = max(16, min(128, 8192 // BLOCK_D))
    launch.launch(
        _bwd_preprocess_kernel, o, do, delta, delta if zero is None else zero, *o.stride(), *do.stride(), H, N_Q,
        HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK=block, INT64=int64,  # (ZERO's offsets are int64: pid_bh is)
        STRIDE_ALIGN=stride_align(o, do), ZERO_ROWS=zero is not None, grid=(cdiv(N_Q, block), H, B),
        warmup=compile_only)


def _sum_partials(parts, dk, dv, *, int64: bool, compile_only: bool = False) -> None:
    """dK, dV = the sum over the split of the fp32 partials ``parts`` (2, split, B, H_KV, N_K,
    BLOCK_D), cast, on the current device."""
    _, split, B, H_KV, N_K, BLOCK_D = parts.shape
    block = max(16, min(128, 8192 // BLOCK_D))
    launch.launch(
        _bwd_dkdv_sum_kernel, parts[0], parts[1], dk, dv, *dk.stride(), *dv.stride(), split, N_K,
        HEAD_DIM=dk.shape[-1], BLOCK_D=BLOCK_D, BLOCK=block, INT64=int64, STRIDE_ALIGN=stride_align(dk, dv),
        grid=(cdiv(N_K, block), H_KV, B),
        num_warps=4, num_stages=1, warmup=compile_only)


def _launch_dq(q, k, v, do, dq, lse2, delta, config: BwdConfig, *, causal: bool, sm_scale: float, precision: str,
               int64: bool, compile_only: bool = False, causal_off: int = 0, softcap: float = 0.0,
               window: tuple[int, int] | None = None, varlen: Varlen | None = None,
               dropout: Dropout | None = None) -> None:
    """The dQ kernel (non-atomic configs), on the current device (``window`` as
    common.window_bounds gives it; ``varlen`` and ``dropout`` as attention_backward takes them)."""
    if varlen is None:
        B, H, N_Q, D = q.shape
        N_K = k.shape[2]
        cu = (delta, delta)  # unused
    else:
        _, H, D = q.shape
        B, N_Q, N_K = varlen.batch, varlen.max_seqlen_q, varlen.max_seqlen_k
        cu = (varlen.cu_seqlens_q, varlen.cu_seqlens_k)
    BLOCK_D = padded_head_dim(D)
    rng, drop_threshold, drop_scale = dropout_args(dropout, delta)
    descs_dq = tma_descriptors(config.tma and varlen is None, (k, v), config.BLOCK_N2, BLOCK_D)
    n_m = cdiv(N_Q, config.BLOCK_M2)
    lpt = query_lpt_units(q, k, n_m, causal=causal, plain=window is None and varlen is None)
    grid = (n_m * H * B, ) if lpt else (n_m, H, B)
    launch.launch(
        _bwd_dq_kernel, q, k, v, do, dq, lse2, delta, *(descs_dq or (k, v)), *cu, rng, sm_scale, *score_scales(sm_scale, softcap),
        drop_threshold, drop_scale, *kernel_strides(q, varlen), *kernel_strides(k, varlen), *kernel_strides(v, varlen),
        *kernel_strides(do, varlen), *kernel_strides(dq, varlen),
        H, H // k.shape[1], N_Q, N_K, causal_off, *(window or (0, 0)), lse2.shape[-1], lpt,
        CAUSAL=bool(causal), HEAD_DIM=D, BLOCK_D=BLOCK_D, PRECISION=precision, INT64=int64,
        BLOCK_M=config.BLOCK_M2, BLOCK_N=config.BLOCK_N2, grid=grid,
        TMA=descs_dq is not None, SOFTCAP=bool(softcap), WINDOW=window is not None, VARLEN=varlen is not None,
        DROPOUT=dropout is not None, STRIDE_ALIGN=stride_align(q, k, v, do, dq),
        num_warps=config.dq_num_warps, num_stages=config.dq_num_stages,
        warmup=compile_only)


def dq_kernel_alone(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                    lse2: torch.Tensor, config: BwdConfig, *, causal: bool, sm_scale: float,
                    fp32_precision: str = "tf32"):
    """A no-argument callable launching only the dQ kernel of a non-atomic ``config`` (its
    Delta computed once, here) and returning dQ, or None for an atomic-dQ config. The dK/dV and dQ kernels
    are separate launches whose configs are independent halves of a BwdConfig: timing the
    dQ kernel apart from the whole backward tells the autotuner what each half costs."""
    if config.atomic_dq and not torch.are_deterministic_algorithms_enabled():
        return None
    precision = dot_precision(q.dtype, fp32_precision)
    dq = torch.empty_like(q)
    delta = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    int64 = needs_int64(q, k, v, o, do, dq)
    with on_device(q):
        _preprocess(o, do, delta, int64=int64)

    def run() -> torch.Tensor:
        with on_device(q):
            _launch_dq(q, k, v, do, dq, lse2, delta, config, causal=causal, sm_scale=sm_scale, precision=precision,
                       int64=int64)
        return dq
    return run
