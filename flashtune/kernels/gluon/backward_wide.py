"""The Gluon dK/dV kernel for head dim 256 on Hopper (sm_90): the two consumer groups split by role
and by head-dim half (backward_launch.py launches it; its configs: configs/gluon.validate_wide).

Why a kernel of its own: backward.py's dK/dV kernel gives each consumer warp group BLOCK_N = 64
keys and their whole fp32 dK and dV rows, 2 x 64 x D / 128 registers a thread: 128 at D=128, 256 at
D=256, more than a thread has. Here both groups work on the same 64 keys and each keeps the dK and
dV columns of one half of the head dim (2 x 64 x 128 / 128 = 128 registers a thread, as at D=128);
the scores are split by role instead of by keys, so no matmul is computed twice:

- the producer (1 warp): the CTA's K and V tiles ([64, 256]) once, then per step (query head,
  block of BLOCK_M = 32 queries) the Q and dO tiles into a ring of NUM_BUFFERS slots, as
  backward.py's producer;
- consumer 0: S^T = K Q^T ([64 keys, 32 queries], an async wgmma over the whole head dim),
  P^T = exp2(S^T qk_scale - lse) (masked on the diagonal blocks), stored to shared memory twice:
  in 16 bits (the A operand of both groups' dV) and in fp32 (consumer 1's dS^T);
- consumer 1: dP^T = V dO^T (the same shape, under consumer 0's S^T), then, once consumer 0's
  P^T is there, dS^T = P^T (dP^T - Delta), stored in 16 bits (the A operand of both groups' dK,
  the B operand of both groups' dQ);
- then each group c, on its half d_c of the head dim: dV[:, d_c] += P^T dO[:, d_c],
  dK[:, d_c] += dS^T Q[:, d_c], and, DQ_FUSED, dQ[:, d_c]^T = K[:, d_c]^T dS^T (two [64, 32]
  wgmmas, M being the head dim), sent transposed through a staging tile as TMA bulk reduce-adds
  into the zeroed fp32 dQ buffer (so the order of the adds, hence dQ's last bits, varies from run
  to run, as backward.py's fused dQ);
- dK (times sm_scale) and dV stored from the registers, a split's to its fp32 slot.

The exchanges: P^T and dS^T have two slots each (step g uses slot g % 2), a P-ready mbarrier
(consumer 0 arrives) and a dS-ready one (consumer 1 arrives) per slot. A group writes slot s
again two steps on, and by then the other group has waited for every wgmma of the step that read
it (it arrived on the exchange of the step between, which it reaches only past that wait), so
no empty barrier is needed. Every matmul has N = 32 (S^T, dP^T, dQ^T) or 128 (dV, dK): N = 32
wgmmas read more shared memory per FLOP; FlashAttention-3's D=256 backward splits its scores the
same way (its two groups on halves of the queries). Each group issues a step's first matmul in the
step itself: issued a step ahead it was slower on every row timed (benchmarks/results:
h100-gluon-bwd-d256).

The CPU can only compile this kernel (tests/kernels/gluon_compile_sm90.py checks its registers,
spills and shared memory); tests/kernels/test_gluon_bwd_wide_gpu.py checks it on a GPU.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from flashtune.kernels.gluon.sm90 import dkdv_tile, load_q_do_ring, tma_reduce_add, walk_step


@gluon.jit
def _wide_producer(desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready,
                   q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0, BLOCK_M: gl.constexpr,
                   NUM_BUFFERS: gl.constexpr):
    """The TMA warp: K and V once, then each step's Q and dO into ring slot it % NUM_BUFFERS."""
    mbarrier.expect(kv_ready, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, [off_b, off_hk, start_n, 0], kv_ready, k_smem)
    tma.async_copy_global_to_shared(desc_v, [off_b, off_hk, start_n, 0], kv_ready, v_smem)
    load_q_do_ring(desc_q, desc_do, q_bufs, do_bufs, q_ready, do_ready, q_empty, off_b, first_qb, n_qb, n_steps,
                   head0, 0, BLOCK_M, NUM_BUFFERS, False)


@gluon.jit
def _wide_dq_issue(WHICH: gl.constexpr, k, ds, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
    """Group WHICH's dQ share of the step, issued: dQ[:, half]^T = K[:, half]^T dS^T as two async
    [64, BLOCK_M] wgmmas (M the head dim). Returns (dq0, dq1, kt0, kt1): the accumulators in flight
    and their A operands."""
    HALF: gl.constexpr = HEAD_DIM // 2
    CHUNK: gl.constexpr = 64
    t_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    kt0 = k.slice(WHICH * HALF, CHUNK, dim=1).permute((1, 0))
    kt1 = k.slice(WHICH * HALF + CHUNK, CHUNK, dim=1).permute((1, 0))
    zero = gl.zeros([CHUNK, BLOCK_M], gl.float32, t_layout)
    dq0 = warpgroup_mma(kt0, ds, zero, use_acc=False, is_async=True)
    dq1 = warpgroup_mma(kt1, ds, zero, use_acc=False, is_async=True)
    return dq0, dq1, kt0, kt1


@gluon.jit
def _wide_dq_send(WHICH: gl.constexpr, dq0, dq1, dq_smem, desc_dqa, off_b, h, qb, sm_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
    """A finished dQ share (``_wide_dq_issue``), scaled and sent transposed as two TMA reduce-adds of
    [BLOCK_M, 64] fp32 through group WHICH's staging tiles, once the previous step's have read them."""
    HALF: gl.constexpr = HEAD_DIM // 2
    CHUNK: gl.constexpr = 64
    tma.store_wait(0)  # the previous step's reduce-adds have read the staging tiles
    gl.thread_barrier()
    dq_smem.index(2 * WHICH).reshape([BLOCK_M, CHUNK]).store(gl.permute(dq0 * sm_scale, (1, 0)))
    dq_smem.index(2 * WHICH + 1).reshape([BLOCK_M, CHUNK]).store(gl.permute(dq1 * sm_scale, (1, 0)))
    fence_async_shared()
    gl.thread_barrier()
    tma_reduce_add(desc_dqa, [off_b, h, qb * BLOCK_M, WHICH * HALF], dq_smem.index(2 * WHICH))
    tma_reduce_add(desc_dqa, [off_b, h, qb * BLOCK_M, WHICH * HALF + CHUNK], dq_smem.index(2 * WHICH + 1))


@gluon.jit
def _wide_consumer(WHICH: gl.constexpr, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty,
                   p16_smem, p32_smem, ds_smem, p_ready, ds_ready, dq_smem, desc_dqa, DK, DV, LSE, DELTA,
                   qk_scale, sm_scale, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                   stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                   n_steps, head0, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, FUSED_DQ: gl.constexpr):
    """Consumer WHICH (0: S^T and P^T, 1: dP^T and dS^T; both: dV, dK and dQ on their head-dim half)."""
    HALF: gl.constexpr = HEAD_DIM // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HALF, 16])
    keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([BLOCK_N, HALF], gl.float32, acc_layout)
    dv = gl.zeros([BLOCK_N, HALF], gl.float32, acc_layout)

    mbarrier.wait(kv_ready, 0)
    k = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.reshape([BLOCK_N, HEAD_DIM])
    # the group's own first matmul: S^T = K Q^T (group 0) or dP^T = V dO^T (group 1)
    if WHICH == 0:
        a_op = k
        b_bufs = q_bufs
        b_ready = q_ready
    else:
        a_op = v
        b_bufs = do_bufs
        b_ready = do_ready
    for it in range(n_steps):
        h, qb = walk_step(it, n_qb, first_qb, head0)
        s = it % NUM_BUFFERS
        phase = (it // NUM_BUFFERS) & 1
        x = it % 2  # the exchange slot
        x_phase = (it // 2) & 1
        rows = qb * BLOCK_M + cols  # the queries, along the columns of S^T
        row_base = (off_b.to(gl.int64) * H + h) * N_Q
        q = q_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        do = do_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        p16 = p16_smem.index(x)
        ds16 = ds_smem.index(x)
        do_half = do.slice(WHICH * HALF, HALF, dim=1)
        q_half = q.slice(WHICH * HALF, HALF, dim=1)
        b = b_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        mbarrier.wait(b_ready.index(s), phase)
        f = warpgroup_mma(a_op, b.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mine, _a, _b = warpgroup_mma_wait(0, deps=(f, a_op, b))
        if WHICH == 0:
            # queries past Nq: lse +inf makes their P 0
            lse = gl.load(LSE + row_base + rows, mask=rows < N_Q, other=float("inf"))
            pt = gl.exp2(mine * qk_scale - lse[None, :])
            if CAUSAL:  # the blocks on the diagonal (some query before some key of the CTA)
                if qb * BLOCK_M + causal_off < start_n + BLOCK_N - 1:
                    pt = gl.where(keys[:, None] <= rows[None, :] + causal_off, pt, 0.0)
            p16.store(pt.to(q.dtype))
            p32_smem.index(x).store(pt)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(p_ready.index(x))
            mbarrier.wait(do_ready.index(s), phase)
            dv = warpgroup_mma(p16, do_half, dv, is_async=True)
            mbarrier.wait(ds_ready.index(x), x_phase)
        else:
            # Delta 0 past Nq (their P is 0 already)
            delta = gl.load(DELTA + row_base + rows, mask=rows < N_Q, other=0.0)
            mbarrier.wait(p_ready.index(x), x_phase)
            dv = warpgroup_mma(p16, do_half, dv, is_async=True)  # under dS^T's arithmetic
            pt = p32_smem.index(x).load(s_layout)
            dst = pt * (mine - delta[None, :])
            ds16.store(dst.to(q.dtype))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ds_ready.index(x))
            mbarrier.wait(q_ready.index(s), phase)
        # the dQ share's wgmmas before dK's, so its store and reduce-add run under dK
        if FUSED_DQ:
            dq0, dq1, kt0, kt1 = _wide_dq_issue(WHICH, k, ds16, HEAD_DIM, BLOCK_M)
        dk = warpgroup_mma(ds16, q_half, dk, is_async=True)
        if FUSED_DQ:
            # (in order: dV's done too; dK in flight)
            dq0, dq1, _kt0, _kt1, _ds = warpgroup_mma_wait(1, deps=(dq0, dq1, kt0, kt1, ds16))
            _wide_dq_send(WHICH, dq0, dq1, dq_smem, desc_dqa, off_b, h, qb, sm_scale, HEAD_DIM, BLOCK_M)
        dv, dk, _p, _ds2, _do2, _q2 = warpgroup_mma_wait(0, deps=(dv, dk, p16, ds16, do, q))
        # every warp of the group is done with the slot before its one arrival
        gl.thread_barrier()
        mbarrier.arrive(q_empty.index(s))
    if FUSED_DQ:
        tma.store_wait(0)

    dk = dk * sm_scale
    o_rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    o_cols = WHICH * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, acc_layout))
    in_rows = o_rows[:, None] < N_K  # key rows past Nk are never stored
    dk_ptrs = DK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh \
        + o_rows.to(gl.int64)[:, None] * stride_dkn + o_cols[None, :] * stride_dkd
    gl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=in_rows)
    dv_ptrs = DV + off_b.to(gl.int64) * stride_dvb + off_hk.to(gl.int64) * stride_dvh \
        + o_rows.to(gl.int64)[:, None] * stride_dvn + o_cols[None, :] * stride_dvd
    gl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=in_rows)


@gluon.jit
def _gluon_attn_bwd_wide_kernel(desc_q, desc_do, desc_k, desc_v, DK, DV, LSE, DELTA, qk_scale, sm_scale,
                                stride_dks, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                                stride_dvs, stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                                H, H_KV, GROUP, N_Q, N_K, causal_off, SPLIT_H, SPLIT_Q, LPT_UNITS, N_UNITS, desc_dqa,
                                CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, FUSED_DQ: gl.constexpr,
                                X_LAYOUT: gl.constexpr, X32_LAYOUT: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr):
    # a 1-D grid of one CTA per (key block of BLOCK_N keys, unit), sm90.dkdv_tile's order
    # (its BLOCK_N is a group's keys there, half the CTA's: BLOCK_N // 2 here)
    n_kb = gl.cdiv(N_K, BLOCK_N)
    split, off_b, off_hk, start_n, first_qb, n_qb, head0, n_steps = dkdv_tile(
        gl.program_id(0), n_kb, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off, CAUSAL,
        BLOCK_M, BLOCK_N // 2)
    # a split CTA's dK/dV go to its own fp32 slot (summed afterwards); unsplit, stride 0
    DK += split.to(gl.int64) * stride_dks
    DV += split.to(gl.int64) * stride_dvs

    k_smem = gl.allocate_shared_memory(desc_k.dtype, desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, desc_v.block_type.shape, desc_v.layout)
    q_bufs = gl.allocate_shared_memory(desc_q.dtype, [NUM_BUFFERS] + desc_q.block_type.shape, desc_q.layout)
    do_bufs = gl.allocate_shared_memory(desc_do.dtype, [NUM_BUFFERS] + desc_do.block_type.shape, desc_do.layout)
    p16_smem = gl.allocate_shared_memory(desc_q.dtype, [2, BLOCK_N, BLOCK_M], X_LAYOUT)
    p32_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_N, BLOCK_M], X32_LAYOUT)
    ds_smem = gl.allocate_shared_memory(desc_q.dtype, [2, BLOCK_N, BLOCK_M], X_LAYOUT)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both consumers release a slot
    for i in gl.static_range(2):
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(ds_ready.index(i), count=1)
    if FUSED_DQ:  # each group's two [BLOCK_M, 64] fp32 staging tiles (group c's: 2c, 2c + 1)
        dq_smem = gl.allocate_shared_memory(desc_dqa.dtype, [4] + desc_dqa.block_type.shape, desc_dqa.layout)
    else:  # not read: a stand-in (warp_specialize takes values, not None)
        dq_smem = q_bufs
    fence_async_shared()

    gl.warp_specialize([
        (_wide_consumer, (0, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, p16_smem,
                          p32_smem, ds_smem, p_ready, ds_ready, dq_smem, desc_dqa, DK, DV, LSE, DELTA, qk_scale,
                          sm_scale, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                          stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                          n_steps, head0, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, FUSED_DQ)),
        (_wide_consumer, (1, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, p16_smem,
                          p32_smem, ds_smem, p_ready, ds_ready, dq_smem, desc_dqa, DK, DV, LSE, DELTA, qk_scale,
                          sm_scale, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                          stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                          n_steps, head0, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, FUSED_DQ)),
        (_wide_producer, (desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready,
                          do_ready, q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0, BLOCK_M,
                          NUM_BUFFERS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # CONSUMER_WARPS, PRODUCER_WARPS


