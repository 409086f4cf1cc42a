"""The Triton forward kernel: one program per block of queries walking the keys, with a launcher
that takes an explicit config (``triton_forward``). The split-KV kernel for decode-sized calls is
in decode.py; which of them, or the Gluon kernel, runs a call is decided in kernels/passes.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtune.configs.base import FP8_DTYPES, padded_head_dim
from flashtune.configs.forward import FwdConfig
from flashtune.kernels import launch
from flashtune.kernels.common import (DROPOUT_ARGS, VARLEN_SIZES, WINDOW_SIDES, call_geometry, dot_precision, dropout_args, kernel_strides, needs_int64, on_device, score_scales, stride_align)
from flashtune.kernels.schedule import query_lpt_units
from flashtune.kernels.triton.common import (aligned, block_offsets, dropout_keep, dropout_rows, key_range,
                                             load_tile, packed_sequence, query_block_program,
                                             softcap_log2_scores, store_tile, tma_descriptors, tma_tile,
                                             window_range)


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, desc_k, desc_v, off_b, off_hk,
               diag, offs_nb, offs_d, lo, hi, N_K, qk_scale, softcap_log2, win_left, win_right,
               MASK: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
               SCALE_POSITIVE: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr,
               rng_seed=0, drop_base=0, drop_threshold=0, DROPOUT: tl.constexpr = False,
               block_table=0, stride_btn=0, stride_kp=0, stride_vp=0, PAGED: tl.constexpr = False,
               PAGE_SIZE: tl.constexpr = 1):
    # diag: each row's diagonal key (causal: its last; the window's centre); with DROPOUT
    # drop_base holds each row's first Philox counter (common.dropout_rows). PAGED (the split
    # kernel's paged K/V cache, kernels/decode.py): key n is row n % PAGE_SIZE of the page
    # block_table[n // PAGE_SIZE] (entries stride_btn apart; pages stride_kp / stride_vp
    # apart, rows stride_kn / stride_vn); k_base and v_base then hold no batch offset. Every
    # tile starts at a multiple of BLOCK_N below N_K, so where PAGE_SIZE % BLOCK_N == 0 a tile
    # lies in one page (one table entry); else each row reads its own entry, masked past N_K.
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_nb
        if PAGED:
            if PAGE_SIZE % BLOCK_N == 0:
                page = tl.load(block_table + (start_n // PAGE_SIZE) * stride_btn).to(tl.int64)
                in_page = start_n % PAGE_SIZE + offs_nb
            else:
                if MASK:
                    page = tl.load(block_table + (offs_n // PAGE_SIZE) * stride_btn, mask=offs_n < N_K, other=0)
                else:
                    page = tl.load(block_table + (offs_n // PAGE_SIZE) * stride_btn)
                page = page.to(tl.int64)
                in_page = offs_n % PAGE_SIZE
            k_rows = page * stride_kp + in_page * stride_kn
            v_rows = page * stride_vp + in_page * stride_vn
        if TMA:
            k = tma_tile(desc_k, off_b, off_hk, start_n, BLOCK_N, BLOCK_D)
        elif PAGED:
            k = load_tile(k_base + k_rows[:, None], offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
        else:
            k = load_tile(k_base + offs_n[:, None] * stride_kn, offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP:  # softcap * tanh(scores / softcap) in log2 units (common.softcap_log2_scores; SCALE_POSITIVE off)
            qk = softcap_log2_scores(qk, qk_scale, softcap_log2)
        elif not SCALE_POSITIVE:
            qk = qk * qk_scale
        if MASK:
            valid = offs_n[None, :] < N_K
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= diag[:, None])
            if WINDOW:
                valid = valid & (offs_n[None, :] >= diag[:, None] - win_left) \
                    & (offs_n[None, :] <= diag[:, None] + win_right)
            qk = tl.where(valid, qk, float("-inf"))
        if SCALE_POSITIVE:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = m_new
        if MASK and (CAUSAL or WINDOW):
            # a row that sees no key of the blocks so far (bottom-right with Nq > Nk, a window's
            # first block, or a chunk of the split kernel) keeps m = -inf: subtract 0 instead,
            # so p = 0, not NaN. Unmasked blocks and the top-left mask's first block give every
            # row a key.
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        if SCALE_POSITIVE:
            # a positive scale commutes with the row max: scale the max, then one
            # multiply-add per score (scale and subtract) instead of a multiply and a subtract
            p = tl.math.exp2(qk * qk_scale - m_use[:, None])
        else:
            p = tl.math.exp2(qk - m_use[:, None])
        # rescale the running sum and accumulator: the row max moved
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:  # the output sums the kept P alone (scaled at the end); l_i, the log-sum-exp, all of it
            p = tl.where(dropout_keep(rng_seed, drop_base, start_n, drop_threshold, BLOCK_N), p, 0.0)
        if TMA:
            v = tma_tile(desc_v, off_b, off_hk, start_n, BLOCK_N, BLOCK_D)
        elif PAGED:
            v = load_tile(v_base + v_rows[:, None], offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
        else:
            v = load_tile(v_base + offs_n[:, None] * stride_vn, offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=WINDOW_SIDES + VARLEN_SIZES + DROPOUT_ARGS)
def _attn_fwd_kernel(Q, K, V, O, LSE, DescK, DescV, CU_Q, CU_K, RNG, qk_scale, softcap_log2, v_descale,
                     drop_threshold, drop_scale,
                     stride_qb, stride_qh, stride_qn, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_ob, stride_oh, stride_on, stride_od,
                     H, GROUP, N_Q, N_K, causal_off, win_left, win_right, TOTAL_Q, LPT_UNITS,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                     INT64: tl.constexpr, TMA: tl.constexpr, SCALE_POSITIVE: tl.constexpr, SOFTCAP: tl.constexpr,
                     WINDOW: tl.constexpr, VARLEN: tl.constexpr, FP8: tl.constexpr, DROPOUT: tl.constexpr,
                     STRIDE_ALIGN: tl.constexpr):
    stride_qb, stride_qh, stride_qn = aligned(stride_qb, stride_qh, stride_qn, STRIDE_ALIGN)
    stride_kb, stride_kh, stride_kn = aligned(stride_kb, stride_kh, stride_kn, STRIDE_ALIGN)
    stride_vb, stride_vh, stride_vn = aligned(stride_vb, stride_vh, stride_vn, STRIDE_ALIGN)
    stride_ob, stride_oh, stride_on = aligned(stride_ob, stride_oh, stride_on, STRIDE_ALIGN)
    pid_m, off_h, off_b = query_block_program(N_Q, H, BLOCK_M, CAUSAL, LPT_UNITS)
    off_hk = off_h // GROUP
    start_m = pid_m * BLOCK_M
    if DROPOUT:  # the mask's counters per row (common.Dropout): of the grid's N_K, before varlen sets its own
        drop_words = tl.cdiv(N_K, 4)

    if VARLEN:
        # sequence off_b of a packed batch (common.Varlen): its rows of Q and O from
        # CU_Q, of K and V from CU_K; causal and a window aligned bottom-right in it;
        # the grid covers the longest sequence, the blocks past this one's end stop here
        tl.static_assert(not TMA, "varlen loads through pointers")
        q_start, N_Q = packed_sequence(CU_Q, off_b, INT64)
        k_start, N_K = packed_sequence(CU_K, off_b, INT64)
        causal_off = N_K - N_Q
        if start_m >= N_Q:
            return
        q_off, k_off, v_off, o_off = q_start * stride_qn, k_start * stride_kn, k_start * stride_vn, q_start * stride_on
        lse_row = off_h * TOTAL_Q + q_start  # LSE (H, TOTAL_Q)
    else:
        q_off, k_off, v_off, o_off = off_b * stride_qb, off_b * stride_kb, off_b * stride_vb, off_b * stride_ob
        lse_row = (off_b * H + off_h) * N_Q  # LSE (B, H, N_Q)

    offs_m = block_offsets(start_m, BLOCK_M, INT64)
    offs_nb = block_offsets(0, BLOCK_N, INT64)
    offs_d = block_offsets(0, BLOCK_D, INT64)
    if DROPOUT:  # P's rows are numbered as the log-sum-exp's
        rng_seed, drop_base = dropout_rows(RNG, lse_row + offs_m, drop_words)
    else:
        rng_seed, drop_base = 0, 0

    q_base = Q + q_off + off_h * stride_qh + offs_d[None, :] * stride_qd
    k_base = K + k_off + off_hk * stride_kh + offs_d[None, :] * stride_kd
    v_base = V + v_off + off_hk * stride_vh + offs_d[None, :] * stride_vd
    q = load_tile(q_base + offs_m[:, None] * stride_qn, offs_m, N_Q, offs_d, True, HEAD_DIM, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Key blocks [full_lo, full_hi) need no mask; [full_hi, hi) need the causal and/or
    # sequence-end mask; with a window [lo, full_lo) its left edge, and the blocks outside
    # [lo, hi) are never visited (common.window_blocks).
    if WINDOW:
        lo, full_lo, full_hi, hi = window_range(start_m, tl.minimum(start_m + BLOCK_M, N_Q) - 1, N_K, BLOCK_N,
                                                causal_off, win_left, win_right)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b,
                                   off_hk, offs_m + causal_off, offs_nb, offs_d, lo * BLOCK_N, full_lo * BLOCK_N, N_K,
                                   qk_scale, softcap_log2, win_left, win_right,
                                   True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SCALE_POSITIVE, SOFTCAP,
                                   WINDOW, rng_seed, drop_base, drop_threshold, DROPOUT)
        full_lo, full_hi, hi = full_lo * BLOCK_N, full_hi * BLOCK_N, hi * BLOCK_N
    else:
        full_lo = 0
        full_hi, hi = key_range(start_m, N_K, CAUSAL, BLOCK_M, BLOCK_N, causal_off)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b, off_hk,
                               offs_m + causal_off, offs_nb, offs_d, full_lo, full_hi, N_K, qk_scale, softcap_log2,
                               win_left, win_right,
                               False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SCALE_POSITIVE, SOFTCAP,
                               WINDOW, rng_seed, drop_base, drop_threshold, DROPOUT)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, DescK, DescV, off_b, off_hk,
                               offs_m + causal_off, offs_nb, offs_d, full_hi, hi, N_K, qk_scale, softcap_log2,
                               win_left, win_right,
                               True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION, TMA, SCALE_POSITIVE, SOFTCAP,
                               WINDOW, rng_seed, drop_base, drop_threshold, DROPOUT)

    if FP8:  # P @ V ran on the quantized V: its descale, once per output element
        acc = acc * v_descale
    if CAUSAL or WINDOW or VARLEN:
        # rows that saw no key (bottom-right or a window, Nq > Nk; a packed sequence
        # without keys): output 0, log-sum-exp -inf
        acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    else:
        acc = acc / l_i[:, None]
    if DROPOUT:
        acc = acc * drop_scale  # 1 / (1 - p): the kept P scaled up
    o_ptrs = O + o_off + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    store_tile(o_ptrs, acc.to(O.dtype.element_ty), offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D)
    # log-sum-exp in base 2 units of the scaled scores: lse2 = log2(sum_j 2^(s_j))
    lse_ptrs = LSE + lse_row + offs_m
    tl.store(lse_ptrs, m_i + tl.math.log2(l_i), mask=offs_m < N_Q)


def triton_forward(q, k, v, config: FwdConfig, causal, sm_scale, fp32_precision, compile_only, causal_align,
                   softcap, window_size, varlen, v_descale, out_dtype, dropout) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain kernel's launch with a Triton ``config`` on checked inputs (passes.attention_forward's
    arguments)."""
    B, H, _, N_Q, N_K, D, window, off = call_geometry(q, k, varlen, causal, causal_align, window_size)
    fp8 = q.dtype in FP8_DTYPES
    o = launch.empty_like(q, dtype=out_dtype or q.dtype)
    lse_shape = (B, H, N_Q) if varlen is None else (H, q.shape[0])
    lse2 = launch.empty(lse_shape, device=q.device, dtype=torch.float32)
    BLOCK_D = padded_head_dim(D, q.dtype)
    # K and V tiles through TMA descriptors when the config asks and the copy engine can
    # address the tensors; otherwise (or for the unused arguments) the pointer loads
    descs = tma_descriptors(config.tma and varlen is None and not fp8, (k, v), config.BLOCK_N, BLOCK_D)
    cu = (lse2, lse2) if varlen is None else (varlen.cu_seqlens_q, varlen.cu_seqlens_k)  # unused without varlen
    # CUDA caps grid y and z at 65535; plain int division: triton.cdiv is a jit function,
    # ~10 us of host time per call through its wrapper
    n_m = -(-N_Q // config.BLOCK_M)
    lpt = query_lpt_units(q, k, n_m, causal=causal, plain=window is None and varlen is None)
    grid = (n_m * H * B, ) if lpt else (n_m, H, B)
    rng, drop_threshold, drop_scale = dropout_args(dropout, lse2)
    with on_device(q):
        launch.launch(
            _attn_fwd_kernel, q, k, v, o, lse2, *(descs or (k, v)), *cu, rng, *score_scales(sm_scale, softcap), v_descale,
            drop_threshold, drop_scale,
            *kernel_strides(q, varlen), *kernel_strides(k, varlen), *kernel_strides(v, varlen),
            *kernel_strides(o, varlen),
            H, H // k.shape[1], N_Q, N_K, off, *(window or (0, 0)), lse2.shape[-1], lpt,
            CAUSAL=bool(causal), HEAD_DIM=D, BLOCK_D=BLOCK_D,
            BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N,
            PRECISION=dot_precision(q.dtype, fp32_precision), INT64=needs_int64(q, k, v, o), TMA=descs is not None,
            SCALE_POSITIVE=sm_scale > 0 and not softcap, SOFTCAP=bool(softcap), WINDOW=window is not None,
            VARLEN=varlen is not None, FP8=fp8, DROPOUT=dropout is not None, STRIDE_ALIGN=stride_align(q, k, v, o),
            num_warps=config.num_warps, num_stages=config.num_stages,
            grid=grid, warmup=compile_only,
        )
    return o, lse2
