"""The warp-specialised Hopper (sm_90) attention backward in Gluon: the dK/dV kernel's device code
for head dims 64 and 128 (backward_launch.py launches it; backward_dq.py is the Gluon dQ kernel,
backward_wide.py the D=256 dK/dV kernel).

Conventions are the Triton backward's: q, do (B, Hq, Nq, D); k, v (B, Hkv, Nk, D); query head h
reads key/value head h // (Hq // Hkv); lse2 (B, Hq, Nq) float32, the forward's base-2 log-sum-exp
of the scaled scores; causal top-left aligned by default. With S = sm_scale Q K^T, P = softmax(S),
dP = dO V^T, Delta = rowsum(dO * O), dS = P * (dP - Delta): dV = P^T dO, dK = sm_scale dS^T Q.

Design (one CTA per 2 x BLOCK_N keys of one (batch, K/V head); FlashAttention-3's backward roles,
the forward's machinery with queries and keys swapped):

- a producer partition (1 warp) issues the TMA loads: the CTA's two K and two V tiles
  once, then for each query head of the group and each query block the Q and dO tiles
  into a ring of ``NUM_BUFFERS`` shared-memory slots (a Q-ready and a dO-ready mbarrier
  per slot, completed by the copies' byte counts, and an empty mbarrier both consumers
  arrive on when done with the slot);
- two consumer partitions (one warp group each) each own BLOCK_N keys, their K and V
  tiles and their fp32 dK and dV accumulators in registers, and walk the same query
  blocks. Per block, transposed (keys along the rows, the wgmma's M):
  S^T = K Q^T and dP^T = V dO^T issued together as async wgmmas; P^T = exp2(S^T scale -
  lse) while dP^T runs; dS^T = P^T (dP^T - Delta); dV += P^T dO and dK += dS^T Q issued
  (P^T and dS^T in registers); the slot is released once both are done;
- a step's row statistics (lse, Delta: one value per query, along the columns of S^T, where a
  thread of the wgmma layout holds 16 of a step's 64) load one per thread at the step's start and
  move to the S^T column layout where used: they are live across neither wgmma, which cut the
  kernels' spills by half or more (benchmarks/results: h200-gluon-switches-profile);
- causal: query blocks before the first query that sees the CTA's first key are never
  loaded; blocks on the diagonal are masked, the others not; a consumer group whose first
  step is all masked (the CTA's walk starts at the block of the first query that sees its
  first key, so with 64-query blocks the second group's first block often lies wholly before
  its keys) skips that step's matmuls (``_dead_step``; benchmarks/results:
  h100-gluon-bwd-causal-skip). Rows past Nq read as zeros (the descriptors' bounds) and their
  lse as +inf, so their P is 0 without a mask; key rows past Nk give rows of dK and dV that are
  never stored;
- a key block's work may be split over CTAs (``split``: the group's query heads, then chunks
  of its query blocks; fp32 partials summed afterwards), and under causal masking the CTAs
  start heaviest first (``sm90.lpt_tile``);
- with ``DQ_FUSED`` the kernel also computes dQ (``_fused_dq_share``: dS^T through shared
  memory, one TMA bulk reduce-add per consumer and step), so no dQ kernel runs;
- unsplit, with outputs the copy engine can address (``TMA_DKDV``), dK and dV leave through the
  consumers' K and V tiles in shared memory as TMA bulk stores: on short rows the epilogue is a
  large share of a CTA's time (benchmarks/results: h100-gluon-bwd-d64).

The CPU can only compile these kernels (tests/kernels/test_gluon_compile_sm90.py); the GPU
tests (tests/kernels/test_gluon_bwd_gpu.py) check them.
"""

from __future__ import annotations

import struct

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from flashtune.kernels.gluon.sm90 import (T_CLK_BLOCKS, T_CLK_Q, T_HEAD, T_STEP, dkdv_tile, load_q_do_ring, stamp,
                                          tma_reduce_add, trace_end, trace_slots, trace_start)

# 2^f ~ c0 + f (c1 + f (c2 + f c3)) on [-0.5, 0.5], relative error under 7.5e-5 evaluated in
# fp32 (coefficients fitted for minimax relative error by Lawson's iteration, then rounded to
# fp32; tests/kernels/test_gluon_bwd_config.py checks the bound on the host)
EXP2_POLY = (0.9999280571937561, 0.6932609677314758, 0.2426111400127411, 0.0551716685295105)


def _f32_hex(x: float) -> str:
    """A PTX fp32 immediate (0fXXXXXXXX) of ``x``."""
    return "0f" + struct.pack(">f", x).hex().upper()


def exp2_split_asm(poly: int) -> str:
    """The PTX of the split exponential (``_exp2_split``): 4 inputs ($4 ... $7) to 4 outputs
    ($0 ... $3), the last ``poly`` (0, 1 or 2) by the polynomial (x clamped to -126 so the exponent
    add cannot wrap, rounded to the nearest integer j by the 1.5 x 2^23 trick, 2^(x - j) by
    EXP2_POLY, times 2^j by adding j to the exponent field), the others by ex2.approx.ftz."""
    if isinstance(poly, bool) or poly not in (0, 1, 2):
        raise ValueError(f"poly: expected 0, 1 or 2 of 4 exponentials by the polynomial, got {poly!r}")
    c0, c1, c2, c3 = (_f32_hex(c) for c in EXP2_POLY)
    magic = _f32_hex(12582912.0)
    lines = [".reg .f32 %xc, %t, %j, %f, %p;", ".reg .b32 %ti, %pi;"]
    for i in range(4):
        out, inp = f"${i}", f"${i + 4}"
        if i < 4 - poly:
            lines.append(f"ex2.approx.ftz.f32 {out}, {inp};")
            continue
        lines += [f"max.f32 %xc, {inp}, {_f32_hex(-126.0)};",
                  f"add.rn.f32 %t, %xc, {magic};",
                  f"sub.rn.f32 %j, %t, {magic};",
                  "sub.rn.f32 %f, %xc, %j;",
                  f"fma.rn.f32 %p, %f, {c3}, {c2};",
                  f"fma.rn.f32 %p, %p, %f, {c1};",
                  f"fma.rn.f32 %p, %p, %f, {c0};",
                  "mov.b32 %ti, %t;",
                  "shl.b32 %ti, %ti, 23;",
                  "mov.b32 %pi, %p;",
                  "add.s32 %pi, %pi, %ti;",
                  f"mov.b32 {out}, %pi;"]
    return "{\n" + "\n".join(lines) + "\n}"


# one of every 4 exponentials by the polynomial (SPLIT_EXP2)
_EXP2_SPLIT_ASM = gl.constexpr(exp2_split_asm(1))


@gluon.jit
def _exp2(x, SPLIT_EXP2: gl.constexpr):
    """2^x, elementwise: gl.exp2, or with SPLIT_EXP2 the last of each 4 of a thread's values by
    the polynomial on the FMA and integer pipes and the others by the SFU (backward_launch's
    split_exp2 says where)."""
    if SPLIT_EXP2:
        return gl.inline_asm_elementwise(_EXP2_SPLIT_ASM, "=f,=f,=f,=f,f,f,f,f", [x], dtype=gl.float32,
                                         is_pure=True, pack=4)
    else:
        return gl.exp2(x)


@gluon.jit
def _producer(desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready,
              q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0, trace, pid,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, TRACE: gl.constexpr):
    """The TMA warp: the CTA's K and V, then its steps' Q and dO (sm90.load_q_do_ring)."""
    trace_start(trace, pid, n_steps, 0, first_qb, TRACE)
    # the two consumers' K and V tiles, once (rows past Nk read as zeros)
    for w in gl.static_range(2):
        mbarrier.expect(kv_ready.index(w), desc_k.block_type.nbytes + desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [off_b, off_hk, start_n + w * BLOCK_N, 0], kv_ready.index(w),
                                        k_smem.index(w))
        tma.async_copy_global_to_shared(desc_v, [off_b, off_hk, start_n + w * BLOCK_N, 0], kv_ready.index(w),
                                        v_smem.index(w))
    stamp(trace, T_CLK_Q, TRACE)
    load_q_do_ring(desc_q, desc_do, q_bufs, do_bufs, q_ready, do_ready, q_empty, off_b, first_qb, n_qb, n_steps,
                   head0, trace, BLOCK_M, NUM_BUFFERS, TRACE)
    stamp(trace, T_CLK_BLOCKS, TRACE)


@gluon.jit
def _dq_share_issue(which, p, k_smem, ds_smem, ds_ready, ev, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, DS_SLOTS: gl.constexpr, TRACE: gl.constexpr):
    """Step p's dQ share of consumer ``which``, issued: dQ[:, half] = dS K[:, half] over both
    groups' keys once both stored their dS^T (two async wgmmas: A dS^T transposed from shared
    memory, B a column slice of each K tile). Returns (dq, ds0, ds1, k0, k1), the accumulator
    in flight and its operands. TRACE: stamps event 8 (trace.BACKWARD)."""
    HALF: gl.constexpr = HEAD_DIM // 2
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HALF, 16])
    slot = p % DS_SLOTS
    mbarrier.wait(ds_ready.index(slot), (p // DS_SLOTS) & 1)
    stamp(ev, 8, TRACE)
    ds0 = ds_smem.index(slot * 2).permute((1, 0))
    ds1 = ds_smem.index(slot * 2 + 1).permute((1, 0))
    k0 = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).slice(which * HALF, HALF, dim=1)
    k1 = k_smem.index(1).reshape([BLOCK_N, HEAD_DIM]).slice(which * HALF, HALF, dim=1)
    dq = warpgroup_mma(ds0, k0, gl.zeros([BLOCK_M, HALF], gl.float32, dq_layout), use_acc=False, is_async=True)
    dq = warpgroup_mma(ds1, k1, dq, is_async=True)
    return dq, ds0, ds1, k0, k1


@gluon.jit
def _dq_share_send(which, dq, h, qb, dq_smem, desc_dqa, off_b, sm_scale, ev, HEAD_DIM: gl.constexpr,
                   BLOCK_M: gl.constexpr, TRACE: gl.constexpr):
    """A finished dQ share ``dq``, times sm_scale, sent as one TMA bulk reduce-add into the fp32 dQ
    buffer at (batch, query head h, query block qb) through consumer ``which``'s staging tile, once
    the previous share's reduce has read it. TRACE: stamps events 10 and 11."""
    HALF: gl.constexpr = HEAD_DIM // 2
    dq_buf = dq_smem.index(which)
    tma.store_wait(0)  # the previous share's reduce has read the buffer
    stamp(ev, 10, TRACE)
    gl.thread_barrier()
    dq_buf.reshape([BLOCK_M, HALF]).store(dq * sm_scale)
    fence_async_shared()
    gl.thread_barrier()
    tma_reduce_add(desc_dqa, [off_b, h, qb * BLOCK_M, which * HALF], dq_buf)
    stamp(ev, 11, TRACE)


@gluon.jit
def _fused_dq_share(which, p, h, qb, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b, sm_scale, ev,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DS_SLOTS: gl.constexpr,
                    TRACE: gl.constexpr):
    """Step p's dQ share of consumer ``which`` (``_dq_share_issue``), waited for with every
    wgmma of the group, then sent (``_dq_share_send``). TRACE: stamps events 8 to 11 of the
    step's trace slots ``ev`` (trace.BACKWARD)."""
    dq, ds0, ds1, k0, k1 = _dq_share_issue(which, p, k_smem, ds_smem, ds_ready, ev, HEAD_DIM, BLOCK_M, BLOCK_N,
                                           DS_SLOTS, TRACE)
    dq, _d0, _d1, _k0, _k1 = warpgroup_mma_wait(0, deps=(dq, ds0, ds1, k0, k1))
    stamp(ev, 9, TRACE)
    _dq_share_send(which, dq, h, qb, dq_smem, desc_dqa, off_b, sm_scale, ev, HEAD_DIM, BLOCK_M, TRACE)


@gluon.jit
def _due_dq_share(which, it, h, qb, h_before, qb_before, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b,
                  sm_scale, ev, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  FUSED_DQ: gl.constexpr, TRACE: gl.constexpr):
    """Step ``it``'s (at query head h and block qb) dQ share in the step's usual order
    (``_fused_dq_share``): FUSED_DQ 1 this step's, 2 the previous step's (h_before, qb_before;
    none at the first step, so the groups may drift a step apart); a step without one stamps its
    four dQ events at once (events 8 to 11)."""
    DS_SLOTS: gl.constexpr = 4 if FUSED_DQ == 2 else 2
    if FUSED_DQ == 1:
        _fused_dq_share(which, it, h, qb, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b, sm_scale, ev,
                        HEAD_DIM, BLOCK_M, BLOCK_N, DS_SLOTS, TRACE)
    elif FUSED_DQ == 2:  # (nested: a constexpr `and` a runtime value is not folded)
        if it > 0:
            _fused_dq_share(which, it - 1, h_before, qb_before, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b,
                            sm_scale, ev, HEAD_DIM, BLOCK_M, BLOCK_N, DS_SLOTS, TRACE)
        else:
            for e in gl.static_range(8, 12):
                stamp(ev, e, TRACE)
    else:
        for e in gl.static_range(8, 12):
            stamp(ev, e, TRACE)


@gluon.jit
def _dead_step(which, it, h, qb, h_before, qb_before, q_ready, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa,
               off_b, sm_scale, ev, phase, s, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               FUSED_DQ: gl.constexpr, TRACE: gl.constexpr):
    """Step ``it`` (ring slot s) of consumer ``which`` where every query of the block comes before
    the group's first key: P^T and dS^T would be all zeros, so no S^T, dP^T, exponentials, dV or
    dK. What the other partitions count on still happens in order: a zero dS^T half in the step's
    slot with its dS-ready arrival, and the dQ share that is due (its own half of dQ over both
    groups' keys). The wait for the slot's Q keeps this group's release of the slot (after the
    return) in the slot's current phase: the group may otherwise be a full ring ahead of the
    other. Only the walk's first step is peeled so: a branch inside the loop cost spills."""
    mbarrier.wait(q_ready.index(s), phase)
    for e in gl.static_range(1, 8):
        stamp(ev, e, TRACE)
    if FUSED_DQ:
        DS_SLOTS: gl.constexpr = 4 if FUSED_DQ == 2 else 2
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_M, 16])
        ds_smem.index((it % DS_SLOTS) * 2 + which).store(gl.zeros([BLOCK_N, BLOCK_M], ds_smem.dtype, s_layout))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_ready.index(it % DS_SLOTS))
    _due_dq_share(which, it, h, qb, h_before, qb_before, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b,
                  sm_scale, ev, HEAD_DIM, BLOCK_M, BLOCK_N, FUSED_DQ, TRACE)
    stamp(ev, 12, TRACE)


@gluon.jit
def _consumer(which, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, DK, DV, LSE, DELTA,
              qk_scale, sm_scale, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
              stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
              n_steps, head0, desc_dqa, ds_smem, dq_smem, ds_ready, trace, pid, kv_empty, CAUSAL: gl.constexpr,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
              FUSED_DQ: gl.constexpr, TRACE: gl.constexpr, DQ_FIRST: gl.constexpr, SPLIT_EXP2: gl.constexpr,
              TMA_DKDV: gl.constexpr):
    """Consumer ``which``: its steps over the CTA's (query head, query block)s, the step ``it``'s
    ring slot and dS^T slot counted from it. TMA_DKDV: DK and DV are TMA descriptors, the tiles go
    out through this group's K and V tiles in shared memory (``kv_empty``: the mbarrier both
    groups pass once no dQ share reads a K tile); else DK and DV are pointers (at the CTA's split's
    slot)."""
    # TRACE: per step, the events of trace.BACKWARD (a step without a dQ share stamps its four dQ
    # events at once)
    trace_start(trace, pid, n_steps, 0, first_qb, TRACE)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    # a step's BLOCK_M row statistics one per thread (two threads each at BLOCK_M 64)
    stats_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])

    key0 = start_n + which * BLOCK_N
    keys = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)

    # fused dQ: dS^T slots per group (reused after the other group has read them: two steps on,
    # four when the share is computed a step late)
    DS_SLOTS: gl.constexpr = 4 if FUSED_DQ == 2 else 2

    mbarrier.wait(kv_ready.index(which), 0)
    stamp(trace, T_CLK_Q, TRACE)
    k = k_smem.index(which).reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.index(which).reshape([BLOCK_N, HEAD_DIM])
    # the walk's position counted step by step: a division by the blocks per head each step costs
    # about 25 instructions a step (benchmarks/results: h100-gluon-bwd-persistent-d256-fwd). The
    # previous step's position is derived one step back from it, not carried beside it: carried, the
    # late dQ shares (FUSED_DQ 2) went to wrong rows
    h_next = head0
    qb_next = first_qb
    it0 = 0
    if CAUSAL:  # the walk's first step, if every query of it precedes these keys (_dead_step)
        if n_steps > 0 and first_qb * BLOCK_M + (BLOCK_M - 1) + causal_off < key0:
            stamp(trace + T_HEAD, 0, TRACE)
            _dead_step(which, 0, head0, first_qb, head0, first_qb, q_ready, k_smem, ds_smem, dq_smem, ds_ready,
                       desc_dqa, off_b, sm_scale, trace + T_HEAD, 0, 0, HEAD_DIM, BLOCK_M, BLOCK_N, FUSED_DQ, TRACE)
            gl.thread_barrier()
            mbarrier.arrive(q_empty.index(0))
            stamp(trace + T_HEAD, 13, TRACE)
            it0 = 1
            wrap = (n_qb == 1).to(gl.int32)
            h_next = head0 + wrap
            qb_next = first_qb + 1 - wrap * n_qb
    for it in range(it0, n_steps):
        h = h_next
        qb = qb_next
        back = (qb == first_qb).to(gl.int32)
        h_before = h - back
        qb_before = qb - 1 + back * n_qb
        s = it % NUM_BUFFERS
        phase = (it // NUM_BUFFERS) & 1
        ev = trace + T_HEAD + T_STEP * it
        stamp(ev, 0, TRACE)
        rows = qb * BLOCK_M + cols  # the queries, along the columns of S^T
        row_base = (off_b.to(gl.int64) * H + h) * N_Q
        # queries past Nq: lse +inf makes their P 0, Delta 0 their dS; one value per thread now, in
        # the S^T columns' layout where used
        rows_c = qb * BLOCK_M + gl.arange(0, BLOCK_M, layout=stats_layout)
        lse_c = gl.load(LSE + row_base + rows_c, mask=rows_c < N_Q, other=float("inf"))
        delta_c = gl.load(DELTA + row_base + rows_c, mask=rows_c < N_Q, other=0.0)
        q = q_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        do = do_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        mbarrier.wait(q_ready.index(s), phase)
        stamp(ev, 1, TRACE)
        st = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(s), phase)
        stamp(ev, 2, TRACE)
        dpt = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        st, _k, _q = warpgroup_mma_wait(1, deps=(st, k, q))
        stamp(ev, 3, TRACE)
        lse = gl.convert_layout(lse_c, gl.SliceLayout(0, s_layout))
        pt = _exp2(st * qk_scale - lse[None, :], SPLIT_EXP2)
        # causal: the blocks on the diagonal (some query before some key of these rows)
        if CAUSAL:
            if qb * BLOCK_M + causal_off < key0 + BLOCK_N - 1:
                pt = gl.where(keys[:, None] <= rows[None, :] + causal_off, pt, 0.0)
        pt16 = gl.convert_layout(pt.to(q.dtype), a_layout)
        # dV after dS^T: fewer registers live at once
        stamp(ev, 4, TRACE)
        dpt, _v, _do = warpgroup_mma_wait(0, deps=(dpt, v, do))
        stamp(ev, 5, TRACE)
        delta = gl.convert_layout(delta_c, gl.SliceLayout(0, s_layout))
        dst = pt * (dpt - delta[None, :])
        dst16 = gl.convert_layout(dst.to(q.dtype), a_layout)
        if FUSED_DQ:  # dS^T to shared memory, where both groups' halves make the CTA's dS
            ds_smem.index((it % DS_SLOTS) * 2 + which).store(dst.to(q.dtype))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ds_ready.index(it % DS_SLOTS))
        stamp(ev, 6, TRACE)
        if DQ_FIRST and FUSED_DQ != 0:
            # the dQ share's wgmmas ahead of dV's and dK's, its store and reduce-add under them
            stamp(ev, 7, TRACE)
            if FUSED_DQ == 1:  # this step's
                p_share = it
                share_h = h
                share_qb = qb
            else:  # the previous step's; at the first step its own, computed and not sent
                p_share = gl.maximum(it - 1, 0)
                share_h = h_before
                share_qb = qb_before
            dq, _d0, _d1, _k0, _k1 = _dq_share_issue(which, p_share, k_smem, ds_smem, ds_ready, ev, HEAD_DIM,
                                                     BLOCK_M, BLOCK_N, DS_SLOTS, TRACE)
            dv = warpgroup_mma(pt16, do, dv, is_async=True)
            dk = warpgroup_mma(dst16, q, dk, is_async=True)
            # the share's two wgmmas done; dK, dV in flight
            dq, _d0, _d1, _k0, _k1 = warpgroup_mma_wait(2, deps=(dq, _d0, _d1, _k0, _k1))
            stamp(ev, 9, TRACE)
            if it >= FUSED_DQ - 1:
                _dq_share_send(which, dq, share_h, share_qb, dq_smem, desc_dqa, off_b, sm_scale, ev, HEAD_DIM,
                               BLOCK_M, TRACE)
            else:
                stamp(ev, 10, TRACE)
                stamp(ev, 11, TRACE)
        else:
            dv = warpgroup_mma(pt16, do, dv, is_async=True)
            dk = warpgroup_mma(dst16, q, dk, is_async=True)
            stamp(ev, 7, TRACE)
            _due_dq_share(which, it, h, qb, h_before, qb_before, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa,
                          off_b, sm_scale, ev, HEAD_DIM, BLOCK_M, BLOCK_N, FUSED_DQ, TRACE)
        dv, dk, _p, _ds, _do2, _q2 = warpgroup_mma_wait(0, deps=(dv, dk, pt16, dst16, do, q))
        stamp(ev, 12, TRACE)
        # every warp of the group is done with the slot before its one arrival
        gl.thread_barrier()
        mbarrier.arrive(q_empty.index(s))
        stamp(ev, 13, TRACE)
        # the next step's (query head, query block), as sm90.walk_step gives them
        wrap = (qb + 1 == first_qb + n_qb).to(gl.int32)
        h_next = h + wrap
        qb_next = qb + 1 - wrap * n_qb
    if FUSED_DQ == 2:
        # the last step's: one back from where the walk stopped
        back = (qb_next == first_qb).to(gl.int32)
        h_prev = h_next - back
        qb_prev = qb_next - 1 + back * n_qb
        if n_steps > 0:
            _fused_dq_share(which, n_steps - 1, h_prev, qb_prev, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa,
                            off_b, sm_scale, trace, HEAD_DIM, BLOCK_M, BLOCK_N, DS_SLOTS, False)
    if FUSED_DQ:
        tma.store_wait(0)
    stamp(trace, T_CLK_BLOCKS, TRACE)

    dk = dk * sm_scale
    if TMA_DKDV:
        # through this group's K and V tiles: V's was read by this group's dP^T only, every one waited
        # for; K's by the dQ shares of both groups too (FUSED_DQ), so both pass the mbarrier first
        if FUSED_DQ:
            gl.thread_barrier()
            mbarrier.arrive(kv_empty)
            mbarrier.wait(kv_empty, 0)
        dk_buf = k_smem.index(which)
        dv_buf = v_smem.index(which)
        dk_buf.reshape([BLOCK_N, HEAD_DIM]).store(dk.to(dk_buf.dtype))
        dv_buf.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(dv_buf.dtype))
        fence_async_shared()
        gl.thread_barrier()  # all four warps' rows in shared memory before the bulk stores
        # rows past Nk: clipped by the descriptors' bounds
        tma.async_copy_shared_to_global(DK, [off_b, off_hk, key0, 0], dk_buf)
        tma.async_copy_shared_to_global(DV, [off_b, off_hk, key0, 0], dv_buf)
        tma.store_wait(0)
    else:
        o_rows = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
        o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
        in_rows = o_rows[:, None] < N_K
        dk_ptrs = DK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh \
            + o_rows.to(gl.int64)[:, None] * stride_dkn + o_cols[None, :] * stride_dkd
        gl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=in_rows)
        dv_ptrs = DV + off_b.to(gl.int64) * stride_dvb + off_hk.to(gl.int64) * stride_dvh \
            + o_rows.to(gl.int64)[:, None] * stride_dvn + o_cols[None, :] * stride_dvd
        gl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=in_rows)
    trace_end(trace, TRACE)


@gluon.jit
def _gluon_attn_bwd_dkdv_kernel(desc_q, desc_do, desc_k, desc_v, DK, DV, LSE, DELTA, qk_scale, sm_scale,
                                stride_dks, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                                stride_dvs, stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                                H, H_KV, GROUP, N_Q, N_K, causal_off, SPLIT_H, SPLIT_Q, LPT_UNITS, N_UNITS,
                                desc_dqa, TRACE_PTR, TRACE_SLOTS,
                                CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, FUSED_DQ: gl.constexpr,
                                DS_LAYOUT: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                TRACE: gl.constexpr, DQ_FIRST: gl.constexpr, SPLIT_EXP2: gl.constexpr,
                                TMA_DKDV: gl.constexpr):
    # TRACE: the trace (trace.BACKWARD) into TRACE_PTR's [CTAs, 3, TRACE_SLOTS] int64 slots; a 1-D
    # grid of one CTA a tile of key blocks (2 x BLOCK_N keys) x N_UNITS units (sm90.dkdv_tile)
    n_kb = gl.cdiv(N_K, 2 * BLOCK_N)
    split, off_b, off_hk, start_n, first_qb, n_qb, head0, n_steps = dkdv_tile(
        gl.program_id(0), n_kb, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off, CAUSAL,
        BLOCK_M, BLOCK_N)
    if not TMA_DKDV:  # (TMA_DKDV: DK and DV are descriptors, only ever unsplit)
        # a split CTA's dK/dV go to its own fp32 slot (summed afterwards); unsplit, stride 0
        DK += split.to(gl.int64) * stride_dks
        DV += split.to(gl.int64) * stride_dvs
    if TRACE:
        pid = gl.program_id(0)
    else:
        pid = 0

    k_smem = gl.allocate_shared_memory(desc_k.dtype, [2] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [2] + desc_v.block_type.shape, desc_v.layout)
    q_bufs = gl.allocate_shared_memory(desc_q.dtype, [NUM_BUFFERS] + desc_q.block_type.shape, desc_q.layout)
    do_bufs = gl.allocate_shared_memory(desc_do.dtype, [NUM_BUFFERS] + desc_do.block_type.shape, desc_do.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both consumers release a slot
    if FUSED_DQ:  # dS^T per (slot, consumer); each consumer's dQ share; a dS-ready mbarrier per slot
        DS_SLOTS: gl.constexpr = 4 if FUSED_DQ == 2 else 2
        ds_smem = gl.allocate_shared_memory(desc_q.dtype, [2 * DS_SLOTS, BLOCK_N, BLOCK_M], DS_LAYOUT)
        dq_smem = gl.allocate_shared_memory(desc_dqa.dtype, [2] + desc_dqa.block_type.shape, desc_dqa.layout)
        ds_ready = gl.allocate_shared_memory(gl.int64, [DS_SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(DS_SLOTS):
            mbarrier.init(ds_ready.index(i), count=2)
    else:  # not read: stand-ins (warp_specialize takes values, not None)
        ds_smem = q_bufs
        dq_smem = q_bufs
        ds_ready = q_empty
    if TMA_DKDV:  # both consumers are past their last dQ share before dK goes through a K tile
        kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_empty, count=2)
    else:  # not read
        kv_empty = q_empty.index(0)
    fence_async_shared()

    gl.warp_specialize([
        (_consumer, (0, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, DK, DV, LSE, DELTA,
                     qk_scale, sm_scale, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                     stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                     n_steps, head0, desc_dqa, ds_smem, dq_smem, ds_ready,
                     trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 0, TRACE), pid, kv_empty, CAUSAL, HEAD_DIM, BLOCK_M,
                     BLOCK_N, NUM_BUFFERS, FUSED_DQ, TRACE, DQ_FIRST, SPLIT_EXP2, TMA_DKDV)),
        (_consumer, (1, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, DK, DV, LSE, DELTA,
                     qk_scale, sm_scale, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                     stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                     n_steps, head0, desc_dqa, ds_smem, dq_smem, ds_ready,
                     trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 1, TRACE), pid, kv_empty, CAUSAL, HEAD_DIM, BLOCK_M,
                     BLOCK_N, NUM_BUFFERS, FUSED_DQ, TRACE, DQ_FIRST, SPLIT_EXP2, TMA_DKDV)),
        (_producer, (desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready,
                     q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0,
                     trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 2, TRACE), pid, BLOCK_M, BLOCK_N, NUM_BUFFERS, TRACE)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # CONSUMER_WARPS, PRODUCER_WARPS
