"""The Gluon dQ kernel for sm_90 (BwdConfig's family 2, beside the Gluon dK/dV kernel of
backward.py; backward_launch.py launches it): the forward's structure with one accumulator.

One CTA per 2 x 64 query rows of one (batch, head): a producer warp loads the two consumers' Q and
dO tiles once, then the K and V blocks into a ring of DQ_BUFFERS slots; each consumer warp group
walks the key blocks with S = Q K^T and dP = dO V^T issued together, P = exp2(S scale - lse) while
dP runs, dS = P (dP - Delta), and block j-1's dQ += dS K wgmma running under block j's S, dP and
softmax; dQ (times sm_scale) is stored from the registers. Under causal masking the last query
blocks, which see the most keys, start first.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)


@gluon.jit
def _dq_producer(desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready,
                 kv_empty, off_b, off_h, off_hk, start_m, n_blocks,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr):
    # the two consumers' Q and dO tiles, once (rows past Nq read as zeros)
    for w in gl.static_range(2):
        mbarrier.expect(q_ready.index(w), desc_q.block_type.nbytes + desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [off_b, off_h, start_m + w * BLOCK_M, 0], q_ready.index(w),
                                        q_smem.index(w))
        tma.async_copy_global_to_shared(desc_do, [off_b, off_h, start_m + w * BLOCK_M, 0], q_ready.index(w),
                                        do_smem.index(w))
    for j in range(n_blocks):
        s = j % NUM_BUFFERS
        mbarrier.wait(kv_empty.index(s), ((j // NUM_BUFFERS) & 1) ^ 1)
        mbarrier.expect(k_ready.index(s), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [off_b, off_hk, j * BLOCK_N, 0], k_ready.index(s), k_bufs.index(s))
        mbarrier.expect(v_ready.index(s), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_v, [off_b, off_hk, j * BLOCK_N, 0], v_ready.index(s), v_bufs.index(s))


@gluon.jit
def _dq_scores(q, do, k_bufs, v_bufs, k_ready, v_ready, j, rows, cols, lse, delta, qk_scale, causal_off, mask_from,
               CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
               s_zero, a_layout: gl.constexpr):
    """Key block j's dS = P (dP - Delta) as the dQ wgmma's 16-bit A operand: S = Q K^T and
    dP = dO V^T issued together, P while dP runs. Waits for every wgmma this warp group
    issued before (wgmma groups complete in order)."""
    s = j % NUM_BUFFERS
    phase = (j // NUM_BUFFERS) & 1
    k = k_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])
    v = v_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])
    mbarrier.wait(k_ready.index(s), phase)
    qk = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(s), phase)
    dp = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    qk, _q, _k = warpgroup_mma_wait(1, deps=(qk, q, k))
    # keys past Nk read as zeros: their P is not 0, but their K rows are, so dS K is not moved
    p = gl.exp2(qk * qk_scale - lse[:, None])
    if CAUSAL:
        if j >= mask_from:
            keys = j * BLOCK_N + cols
            p = gl.where(keys[None, :] <= rows[:, None] + causal_off, p, 0.0)
    dp, _do, _v = warpgroup_mma_wait(0, deps=(dp, do, v))
    return gl.convert_layout((p * (dp - delta[:, None])).to(q.dtype), a_layout)


@gluon.jit
def _dq_blocks_overlapped(dq, q, do, k_bufs, v_bufs, k_ready, v_ready, kv_empty, rows, cols, lse, delta, qk_scale,
                          causal_off, mask_from, n_blocks, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr,
                          BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, s_zero, a_layout: gl.constexpr):
    """The key blocks with block j-1's dQ wgmma running under block j's S, dP and softmax:
    S_j and dP_j are issued, then dQ += dS_{j-1} K_{j-1}; P_j waits for S_j only, dS_j for
    dP_j; slot j-1 is released once its dQ wgmma is done."""
    if n_blocks > 0:
        ds16 = _dq_scores(q, do, k_bufs, v_bufs, k_ready, v_ready, 0, rows, cols, lse, delta, qk_scale, causal_off,
                          mask_from, CAUSAL, HEAD_DIM, BLOCK_N, NUM_BUFFERS, s_zero, a_layout)
        for j in range(1, n_blocks):
            s = j % NUM_BUFFERS
            sp = (j - 1) % NUM_BUFFERS
            phase = (j // NUM_BUFFERS) & 1
            k = k_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])
            v = v_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])
            k_prev = k_bufs.index(sp).reshape([BLOCK_N, HEAD_DIM])
            mbarrier.wait(k_ready.index(s), phase)
            qk = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(s), phase)
            dp = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dq = warpgroup_mma(ds16, k_prev, dq, is_async=True)
            qk, _q, _k = warpgroup_mma_wait(2, deps=(qk, q, k))
            p = gl.exp2(qk * qk_scale - lse[:, None])
            if CAUSAL:
                if j >= mask_from:
                    keys = j * BLOCK_N + cols
                    p = gl.where(keys[None, :] <= rows[:, None] + causal_off, p, 0.0)
            dp, _do, _v = warpgroup_mma_wait(1, deps=(dp, do, v))
            ds = p * (dp - delta[:, None])
            dq, _ds, _kp = warpgroup_mma_wait(0, deps=(dq, ds16, k_prev))
            gl.thread_barrier()  # every warp is done with slot j-1 before its one arrival
            mbarrier.arrive(kv_empty.index(sp))
            ds16 = gl.convert_layout(ds.to(q.dtype), a_layout)
        sl = (n_blocks - 1) % NUM_BUFFERS
        k_last = k_bufs.index(sl).reshape([BLOCK_N, HEAD_DIM])
        dq = warpgroup_mma(ds16, k_last, dq, is_async=True)
        dq, _ds, _kl = warpgroup_mma_wait(0, deps=(dq, ds16, k_last))
        gl.thread_barrier()
        mbarrier.arrive(kv_empty.index(sl))
    return dq


@gluon.jit
def _dq_consumer(which, q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, DQ, LSE, DELTA,
                 qk_scale, sm_scale, stride_dqb, stride_dqh, stride_dqn, stride_dqd, off_b, off_h, H, N_Q,
                 causal_off, start_m, n_blocks, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    row0 = start_m + which * BLOCK_M
    rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    row_base = (off_b.to(gl.int64) * H + off_h) * N_Q
    # rows past Nq: lse +inf makes their P 0 (their dQ rows are not stored)
    lse = gl.load(LSE + row_base + rows, mask=rows < N_Q, other=float("inf"))
    delta = gl.load(DELTA + row_base + rows, mask=rows < N_Q, other=0.0)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout)
    # blocks from here on have keys past some row's diagonal (causal): masked
    mask_from = n_blocks
    if CAUSAL:
        mask_from = gl.minimum(gl.maximum(row0 + causal_off + 1, 0) // BLOCK_N, n_blocks)

    mbarrier.wait(q_ready.index(which), 0)
    q = q_smem.index(which).reshape([BLOCK_M, HEAD_DIM])
    do = do_smem.index(which).reshape([BLOCK_M, HEAD_DIM])
    dq = _dq_blocks_overlapped(dq, q, do, k_bufs, v_bufs, k_ready, v_ready, kv_empty, rows, cols, lse, delta,
                               qk_scale, causal_off, mask_from, n_blocks, CAUSAL, HEAD_DIM, BLOCK_N, NUM_BUFFERS,
                               s_zero, a_layout)

    dq = dq * sm_scale
    o_rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    ptrs = DQ + off_b.to(gl.int64) * stride_dqb + off_h.to(gl.int64) * stride_dqh \
        + o_rows.to(gl.int64)[:, None] * stride_dqn + o_cols[None, :] * stride_dqd
    gl.store(ptrs, dq.to(DQ.dtype.element_ty), mask=o_rows[:, None] < N_Q)


@gluon.jit
def _gluon_attn_bwd_dq_kernel(desc_q, desc_do, desc_k, desc_v, DQ, LSE, DELTA, qk_scale, sm_scale,
                              stride_dqb, stride_dqh, stride_dqn, stride_dqd, H, GROUP, N_Q, N_K, causal_off,
                              CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                              BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                              CONSUMER_REGS: gl.constexpr):
    pid_m = gl.program_id(0)
    if CAUSAL:  # the last query blocks have the most keys: start them first
        pid_m = gl.num_programs(0) - 1 - pid_m
    off_h = gl.program_id(1)
    off_b = gl.program_id(2)
    off_hk = off_h // GROUP
    start_m = pid_m * (2 * BLOCK_M)
    hi = N_K
    if CAUSAL:  # the CTA's last row's last visible key
        hi = gl.maximum(gl.minimum(start_m + 2 * BLOCK_M + causal_off, N_K), 0)
    n_blocks = gl.cdiv(hi, BLOCK_N)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [2] + desc_q.block_type.shape, desc_q.layout)
    do_smem = gl.allocate_shared_memory(desc_do.dtype, [2] + desc_do.block_type.shape, desc_do.layout)
    k_bufs = gl.allocate_shared_memory(desc_k.dtype, [NUM_BUFFERS] + desc_k.block_type.shape, desc_k.layout)
    v_bufs = gl.allocate_shared_memory(desc_v.dtype, [NUM_BUFFERS] + desc_v.block_type.shape, desc_v.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both consumers release a slot
    fence_async_shared()

    gl.warp_specialize([
        (_dq_consumer, (0, q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, DQ, LSE, DELTA,
                        qk_scale, sm_scale, stride_dqb, stride_dqh, stride_dqn, stride_dqd, off_b, off_h, H, N_Q,
                        causal_off, start_m, n_blocks, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS)),
        (_dq_consumer, (1, q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, DQ, LSE, DELTA,
                        qk_scale, sm_scale, stride_dqb, stride_dqh, stride_dqn, stride_dqd, off_b, off_h, H, N_Q,
                        causal_off, start_m, n_blocks, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS)),
        (_dq_producer, (desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready,
                        kv_empty, off_b, off_h, off_hk, start_m, n_blocks, BLOCK_M, BLOCK_N, NUM_BUFFERS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # CONSUMER_WARPS, PRODUCER_WARPS


