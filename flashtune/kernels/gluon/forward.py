"""The warp-specialised Hopper (sm_90) attention forward in Gluon: the kernel's device code
(forward_launch.py launches it and compiles it for sm_90 without a GPU).

Conventions are the Triton forward's: q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D), query head h
reads key/value head h // (Hq // Hkv); causal is top-left aligned by default (query i sees keys
j <= i, also when Nq != Nk); the outputs are o in q's layout and dtype and lse2 (B, Hq, Nq)
float32, the base-2 log-sum-exp of the scaled scores.

Design (one CTA per 2 x BLOCK_M query rows of one (batch, head)):

- a producer partition (1 warp, ``PRODUCER_REGS`` registers) issues the TMA loads: the two
  Q tiles once, then the K and V blocks into a ring of ``NUM_BUFFERS`` shared-memory slots
  (per slot a K-ready and a V-ready mbarrier, completed by the copies' byte counts, and
  an empty mbarrier that both consumers arrive on when done with the slot);
- two consumer partitions (one warp group each, ``CONSUMER_REGS`` registers; the first
  is the warp_specialize default partition, whose count follows from the kernel's
  maxnreg) each own one BLOCK_M-row Q tile and walk the same key blocks:
  S = Q K^T by an async wgmma from shared memory, online softmax in registers (exp2 of the
  scores times sm_scale * log2 e), P cast to the input dtype and O += P V by a wgmma with
  P in registers;
- ``PINGPONG``: the two consumers take turns issuing their S = Q K^T wgmma (a pair of
  mbarriers passed back and forth), so one group's softmax runs while the other's
  matmul occupies the tensor cores (FA3's warp-scheduler barrier, with mbarriers
  instead of named barriers, which Gluon 3.6 does not expose);
- causal: key blocks past the CTA's last visible key are never loaded; blocks wholly
  visible to a consumer's rows run without a mask, only the diagonal ones are masked.
  Both consumers walk the same blocks (the ring and the turn-taking need the same count),
  so the first consumer computes one fully masked block where the second one's diagonal
  lies beyond its own (its p is 0 there).
- a sliding window (``WINDOW``): the CTA's key blocks start at its first row's first
  visible key as well ([lo, hi) of ``_window_range``, common.window_blocks' formula); each
  consumer masks the blocks outside its own rows' unmasked range (the window's edges).
- ``PERSISTENT``: at most programs_per_sm CTAs per SM, each walking one tile of each round of
  the grid's 1-D order (``_tile``; persistent.py's schedule); the ring's slot and phase counters,
  the turns' phases and the Q barriers' phases run on across tiles (``it0``, ``tile_i``), the
  producer loads a tile's first blocks (at most NUM_BUFFERS: more would wait on slots only this
  tile's consumers free, before its Q is in) while the consumers finish the previous tile, then
  its Q once each consumer has released its tile (a Q-empty mbarrier per consumer).
- the output: with ``TMA_STORE`` (16-bit inputs, an output the copy engine can address) each
  consumer writes its normalized O tile into shared memory (its Q tile, free once its last
  S = QK^T is waited for, or its own O tile with O_TILE) and issues one TMA bulk store for it;
  otherwise it stores from registers. The epilogue is 10-20 % of the consumers' time on short
  rows, and the bulk store gains up to 1.15x there (benchmarks/results: h200-gluon-gpu-timer-tma-store).

The CPU can only compile this kernel (tests/kernels/test_gluon_compile_sm90.py); its numbers
are checked on a GPU (tests/kernels/test_gluon_gpu.py and the persistent and trace tests).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from flashtune.kernels.gluon import trace as kernel_trace
from flashtune.kernels.gluon.persistent import cta_tiles, round_tile
from flashtune.kernels.gluon.sm90 import (T_CLK_BLOCKS, T_CLK_LAST_V, T_CLK_Q, T_HEAD, lpt_tile, stamp, trace_end,
                                          trace_slots, trace_start)

T_EVENTS = gl.constexpr(kernel_trace.FORWARD.events)  # trace slots per key block


@gluon.jit
def _window_range(first, last, n, BLOCK: gl.constexpr, off, left, right):
    """common.window_range (and window_blocks) in Gluon, line for line: the block indices
    (lo, full_lo, full_hi, hi) of the positions rows [first, last] see through the window."""
    lo_pos = gl.maximum(first + off - left, 0)
    hi_pos = gl.minimum(last + off + right + 1, n)
    lo = lo_pos // BLOCK
    hi = lo
    if hi_pos > lo_pos:
        hi = gl.cdiv(gl.maximum(hi_pos, 0), BLOCK)
    full_lo = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(last + off - left, 0), BLOCK), lo), hi)
    full_hi = gl.minimum(gl.maximum(gl.maximum(gl.minimum(first + off + right + 1, n), 0) // BLOCK, full_lo), hi)
    return lo, full_lo, full_hi, hi


@gluon.jit
def _stage_p(p, p_smem, dtype: gl.constexpr, p_layout: gl.constexpr, FP8: gl.constexpr):
    """P as the P V wgmma's A operand: 16-bit P in registers; fp8 P through this consumer's
    shared-memory tile (a wait on an in-flight wgmma cannot keep 8-bit register operands
    alive, so with the overlap fp8 P goes through shared memory, as a K-major A operand)."""
    if FP8:
        p_smem.store(p.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # every warp's part of P is stored before the wgmma reads it
        return p_smem
    else:
        return gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def _v_tile(v_bufs, s, FP8: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr):
    """Slot s of the V ring as P V's [BLOCK_N, HEAD_DIM] operand: 16-bit V as stored; fp8 V
    stored transposed ([HEAD_DIM, BLOCK_N], keys contiguous), viewed K-major."""
    if FP8:
        return v_bufs.index(s).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0))
    else:
        return v_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])


@gluon.jit
def _load_kv(desc_k, desc_v, k_bufs, v_bufs, k_ready, v_ready, kv_empty, off_b, off_hk, lo, j, it0, trace,
             BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, FP8: gl.constexpr, TRACE: gl.constexpr):
    """The tile's key block lo + j into ring slot (it0 + j) % NUM_BUFFERS; ``it0``: the blocks
    the ring carried before this tile (0 without PERSISTENT). V into slot (it0 + j) % VB of its
    own ring where ``v_bufs`` has fewer slots (VB) than the K ring (the O tiles' room,
    persistent_v_buffers): V slot free once block g - VB is released, which the K ring's empty
    mbarrier of that block's slot tells (the phase block g + NUM_BUFFERS - VB's K load waits for)."""
    VB: gl.constexpr = v_bufs.shape[0]
    g = it0 + j
    s = g % NUM_BUFFERS
    sv = g % VB
    phase = (g // NUM_BUFFERS) & 1
    ev = trace + T_HEAD + T_EVENTS * j
    stamp(ev, 0, TRACE)
    # a fresh mbarrier counts as having completed the phase before its first: the
    # first lap through the ring does not wait
    mbarrier.wait(kv_empty.index(s), phase ^ 1)
    stamp(ev, 1, TRACE)
    mbarrier.expect(k_ready.index(s), desc_k.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, [off_b, off_hk, (lo + j) * BLOCK_N, 0], k_ready.index(s),
                                    k_bufs.index(s))
    if VB != NUM_BUFFERS:
        r = g + (NUM_BUFFERS - VB)
        mbarrier.wait(kv_empty.index(r % NUM_BUFFERS), ((r // NUM_BUFFERS) & 1) ^ 1)
    mbarrier.expect(v_ready.index(sv), desc_v.block_type.nbytes)
    if FP8:  # V^T: [D, BLOCK_N] tiles of the key-contiguous V
        tma.async_copy_global_to_shared(desc_v, [off_b, off_hk, 0, (lo + j) * BLOCK_N], v_ready.index(sv),
                                        v_bufs.index(sv))
    else:
        tma.async_copy_global_to_shared(desc_v, [off_b, off_hk, (lo + j) * BLOCK_N, 0], v_ready.index(sv),
                                        v_bufs.index(sv))
    stamp(ev, 2, TRACE)


@gluon.jit
def _load_q(desc_q, q_smem, q_ready, q_empty, off_b, off_h, start_m, tile_i, BLOCK_M: gl.constexpr,
            PERSISTENT: gl.constexpr):
    # the two Q tiles (rows past Nq read as zeros: the descriptor's bounds are per head);
    # PERSISTENT: each once its consumer released the previous tile's (Q-empty, phase by tile)
    for w in gl.static_range(2):
        if PERSISTENT:
            mbarrier.wait(q_empty.index(w), (tile_i & 1) ^ 1)
        mbarrier.expect(q_ready.index(w), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [off_b, off_h, start_m + w * BLOCK_M, 0], q_ready.index(w),
                                        q_smem.index(w))


@gluon.jit
def _producer(desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
              off_b, off_h, off_hk, start_m, lo, n_blocks, it0, tile_i, trace, pid,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, FP8: gl.constexpr,
              PERSISTENT: gl.constexpr, TRACE: gl.constexpr, EARLY_Q: gl.constexpr):
    trace_start(trace, pid, n_blocks, tile_i, lo, TRACE)
    if PERSISTENT:
        # the first blocks of this tile go into slots the previous tile's consumption frees
        # (waits that need no Q of this tile), so they load under the previous tile's end;
        # then Q, once released; more blocks than slots before Q would deadlock. EARLY_Q (the
        # consumers release Q once the previous tile's block n-2 is done, before its last P V):
        # one block fewer first, as the last slot frees only with that last P V. A V ring shorter
        # than the K ring (v_bufs) bounds them the same way
        VB: gl.constexpr = v_bufs.shape[0]
        if EARLY_Q:
            n_pre = gl.minimum(n_blocks, VB - 1)
        else:
            n_pre = gl.minimum(n_blocks, VB)
        for j in range(0, n_pre):
            _load_kv(desc_k, desc_v, k_bufs, v_bufs, k_ready, v_ready, kv_empty, off_b, off_hk, lo, j, it0, trace,
                     BLOCK_N, NUM_BUFFERS, FP8, TRACE)
        _load_q(desc_q, q_smem, q_ready, q_empty, off_b, off_h, start_m, tile_i, BLOCK_M, PERSISTENT)
        stamp(trace, T_CLK_Q, TRACE)
        for j in range(n_pre, n_blocks):
            _load_kv(desc_k, desc_v, k_bufs, v_bufs, k_ready, v_ready, kv_empty, off_b, off_hk, lo, j, it0, trace,
                     BLOCK_N, NUM_BUFFERS, FP8, TRACE)
    else:
        _load_q(desc_q, q_smem, q_ready, q_empty, off_b, off_h, start_m, tile_i, BLOCK_M, PERSISTENT)
        stamp(trace, T_CLK_Q, TRACE)
        for j in range(n_blocks):
            _load_kv(desc_k, desc_v, k_bufs, v_bufs, k_ready, v_ready, kv_empty, off_b, off_hk, lo, j, it0, trace,
                     BLOCK_N, NUM_BUFFERS, FP8, TRACE)
    stamp(trace, T_CLK_BLOCKS, TRACE)
    trace_end(trace, TRACE)


@gluon.jit
def _consume_blocks(acc, m_i, l_i, q, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn, which, rows, first, last,
                    lo, it0, qk_scale, N_K, causal_off, win_left, win_right, trace,
                    MASK: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, HEAD_DIM: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
                    PINGPONG: gl.constexpr, FP8: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                    TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr):
    """The CTA's blocks [first, last) (counted from its first key block, ``lo``) of one
    consumer: online softmax into (acc, m_i, l_i). Ring slots and turns count from ``it0``,
    the blocks the ring carried before this tile."""
    dtype: gl.constexpr = q.dtype
    VB: gl.constexpr = v_bufs.shape[0]
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for j in range(first, last):
        g = it0 + j
        s = g % NUM_BUFFERS
        phase = (g // NUM_BUFFERS) & 1
        sv = g % VB  # V's slot (its own ring where shorter, _load_kv)
        k_smem = k_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])
        v_smem = _v_tile(v_bufs, sv, FP8, HEAD_DIM, BLOCK_N)
        ev = trace + T_HEAD + T_EVENTS * j  # kernel_trace.FORWARD.consumer[0]
        stamp(ev, 0, TRACE)
        mbarrier.wait(k_ready.index(s), phase)
        stamp(ev, 1, TRACE)
        if PINGPONG:
            # consumer 0 goes first: its first wait is on the fresh barrier's completed phase
            mbarrier.wait(turn.index(which), (g & 1) ^ (1 - which))
        stamp(ev, 2, TRACE)
        qk = warpgroup_mma(q, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - which))
        qk, _q, _k = warpgroup_mma_wait(0, deps=(qk, q, k_smem))
        stamp(ev, 3, TRACE)
        p, alpha, m_new, l_i = _softmax_block(qk, m_i, l_i, rows, cols, j, lo, 0, 0, qk_scale, N_K, causal_off,
                                              win_left, win_right, MASK, CAUSAL, WINDOW, BLOCK_N, SCALE_POSITIVE)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        stamp(ev, 4, TRACE)
        mbarrier.wait(v_ready.index(sv), (g // VB) & 1)
        stamp(ev, 5, TRACE)
        acc = warpgroup_mma(p16, v_smem, acc, is_async=True)
        acc, _v = warpgroup_mma_wait(0, deps=(acc, v_smem))
        stamp(ev, 6, TRACE)
        # every warp of the group is done with the slot before its one arrival
        gl.thread_barrier()
        mbarrier.arrive(kv_empty.index(s))
        stamp(ev, 7, TRACE)
        m_i = m_new
    return acc, m_i, l_i


@gluon.jit
def _masked(qk, rows, cols, kb, N_K, causal_off, win_left, win_right, CAUSAL: gl.constexpr,
            WINDOW: gl.constexpr, BLOCK_N: gl.constexpr):
    """Key block kb's scores with the keys past the sequence end (causal: past each row's
    diagonal; a window: outside [diag - left, diag + right]) at -inf. Causal without a window:
    one compare a score, against each row's limit, the same bits as testing the sequence end and
    the diagonal apart, in fewer instructions and without spills in the persistent kernel's hot
    loop (benchmarks/results: h200-gluon-row-limit-mask)."""
    if CAUSAL and not WINDOW:
        # keys < N_K and keys <= row + off  <=>  cols < min(row + off + 1, N_K) - kb * BLOCK_N
        limit = gl.minimum(rows + (causal_off + 1), N_K) - kb * BLOCK_N
        return gl.where(cols[None, :] < limit[:, None], qk, float("-inf"))
    keys = kb * BLOCK_N + cols
    valid = keys[None, :] < N_K
    if CAUSAL:
        valid = valid & (keys[None, :] <= rows[:, None] + causal_off)
    if WINDOW:
        valid = valid & (keys[None, :] >= rows[:, None] + (causal_off - win_left)) \
            & (keys[None, :] <= rows[:, None] + (causal_off + win_right))
    return gl.where(valid, qk, float("-inf"))


@gluon.jit
def _softmax_block(qk, m_i, l_i, rows, cols, j, lo, full_lo, full_hi, qk_scale, N_K, causal_off, win_left,
                   win_right, MASK: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                   BLOCK_N: gl.constexpr, SCALE_POSITIVE: gl.constexpr):
    """The CTA's block j (key block lo + j) into probabilities (online softmax, base 2):
    (p, alpha, m, l). The causal, window and/or sequence-end mask: MASK 0 none, 1 always,
    2 outside the blocks [full_lo, full_hi) (counted as j is). SCALE_POSITIVE (qk_scale > 0,
    every call but one with a negative sm_scale): the scale commutes with the row max, so the
    max is taken over the raw scores and scaled once, and each score is scaled and shifted by
    one multiply-add (the Triton kernel's rule): 64 multiplies a thread and block fewer."""
    if not SCALE_POSITIVE:
        qk = qk * qk_scale
    if MASK == 1:
        qk = _masked(qk, rows, cols, lo + j, N_K, causal_off, win_left, win_right, CAUSAL, WINDOW, BLOCK_N)
    elif MASK == 2:
        if (j < full_lo) | (j >= full_hi):
            qk = _masked(qk, rows, cols, lo + j, N_K, causal_off, win_left, win_right, CAUSAL, WINDOW, BLOCK_N)
    if SCALE_POSITIVE:
        m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    else:
        m_new = gl.maximum(m_i, gl.max(qk, 1))
    m_use = m_new
    if (CAUSAL or WINDOW) and MASK != 0:
        # a row that sees no key so far (bottom-right with Nq > Nk, a window's rows before
        # their first key) keeps m = -inf: subtract 0 instead so that p = 0, not NaN
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    if SCALE_POSITIVE:
        x = qk * qk_scale - m_use[:, None]
    else:
        x = qk - m_use[:, None]
    p = gl.exp2(x)
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def _consume_overlapped(acc, m_i, l_i, q, k_bufs, v_bufs, p_smem, k_ready, v_ready, kv_empty, turn, q_empty, which,
                        rows, lo, full_lo, full_hi, n_blocks, it0, qk_scale, N_K, causal_off, win_left, win_right,
                        trace, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, HEAD_DIM: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
                        PINGPONG: gl.constexpr, FP8: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                        TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr, EARLY_Q: gl.constexpr):
    """All key blocks of one consumer, software-pipelined within the warp group (FA3's
    intra-warpgroup overlap): block j's S = QK^T and block j-1's O += PV are issued
    together, and block j's softmax runs while that PV wgmma is in flight. A slot is
    released once its PV is done; a turn (PINGPONG) covers the two issues. Ring slots and
    turns count from ``it0``, the blocks the ring carried before this tile. EARLY_Q: the Q
    tile goes back to the producer (``q_empty``) once the last S is done, before the last PV."""
    dtype: gl.constexpr = q.dtype
    VB: gl.constexpr = v_bufs.shape[0]  # V's ring (shorter than K's where the O tiles need room)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    if n_blocks > 0:
        # block 0: S, then its softmax (no PV before it)
        # (the trace's events: kernel_trace.FORWARD.consumer[1]; block 0 has no V wait and no PV)
        s0 = it0 % NUM_BUFFERS
        k_smem = k_bufs.index(s0).reshape([BLOCK_N, HEAD_DIM])
        ev = trace + T_HEAD
        stamp(ev, 0, TRACE)
        mbarrier.wait(k_ready.index(s0), (it0 // NUM_BUFFERS) & 1)
        stamp(ev, 1, TRACE)
        stamp(ev, 2, TRACE)
        if PINGPONG:
            mbarrier.wait(turn.index(which), (it0 & 1) ^ (1 - which))
        stamp(ev, 3, TRACE)
        qk = warpgroup_mma(q, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - which))
        qk, _q, _k = warpgroup_mma_wait(0, deps=(qk, q, k_smem))
        stamp(ev, 4, TRACE)
        p, alpha, m_i, l_i = _softmax_block(qk, m_i, l_i, rows, cols, 0, lo, full_lo, full_hi, qk_scale, N_K,
                                            causal_off, win_left, win_right, 2, CAUSAL, WINDOW, BLOCK_N,
                                            SCALE_POSITIVE)
        p16 = _stage_p(p, p_smem, dtype, p_layout, FP8)
        stamp(ev, 5, TRACE)
        stamp(ev, 6, TRACE)
        stamp(ev, 7, TRACE)
        for j in range(1, n_blocks):
            g = it0 + j
            s = g % NUM_BUFFERS
            sp = (g - 1) % NUM_BUFFERS
            k_smem = k_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])
            v_prev = _v_tile(v_bufs, (g - 1) % VB, FP8, HEAD_DIM, BLOCK_N)
            ev = trace + T_HEAD + T_EVENTS * j
            stamp(ev, 0, TRACE)
            mbarrier.wait(k_ready.index(s), (g // NUM_BUFFERS) & 1)
            stamp(ev, 1, TRACE)
            mbarrier.wait(v_ready.index((g - 1) % VB), ((g - 1) // VB) & 1)
            stamp(ev, 2, TRACE)
            if PINGPONG:
                mbarrier.wait(turn.index(which), (g & 1) ^ (1 - which))
            stamp(ev, 3, TRACE)
            qk = warpgroup_mma(q, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(p16, v_prev, acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - which))
            # S (issued first) done; the PV wgmma may still run under this softmax
            qk, _q, _k = warpgroup_mma_wait(1, deps=(qk, q, k_smem))
            stamp(ev, 4, TRACE)
            p, alpha, m_i, l_i = _softmax_block(qk, m_i, l_i, rows, cols, j, lo, full_lo, full_hi, qk_scale, N_K,
                                                causal_off, win_left, win_right, 2, CAUSAL, WINDOW, BLOCK_N,
                                                SCALE_POSITIVE)
            stamp(ev, 5, TRACE)
            acc, _p, _v = warpgroup_mma_wait(0, deps=(acc, p16, v_prev))
            stamp(ev, 6, TRACE)
            # every warp of the group is done with slot j-1 before its one arrival
            gl.thread_barrier()
            mbarrier.arrive(kv_empty.index(sp))
            # O so far is relative to the previous row max: rescale to this block's
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
            p16 = _stage_p(p, p_smem, dtype, p_layout, FP8)
            stamp(ev, 7, TRACE)
        if EARLY_Q:  # every S is done (all four warps past their waits): Q may be reloaded
            gl.thread_barrier()
            mbarrier.arrive(q_empty)
        # the last block's PV
        g_last = it0 + n_blocks - 1
        sl = g_last % NUM_BUFFERS
        v_last = _v_tile(v_bufs, g_last % VB, FP8, HEAD_DIM, BLOCK_N)
        mbarrier.wait(v_ready.index(g_last % VB), (g_last // VB) & 1)
        stamp(trace, T_CLK_LAST_V, TRACE)
        acc = warpgroup_mma(p16, v_last, acc, is_async=True)
        acc, _p, _v = warpgroup_mma_wait(0, deps=(acc, p16, v_last))
        gl.thread_barrier()
        mbarrier.arrive(kv_empty.index(sl))
    return acc, m_i, l_i


@gluon.jit
def _consumer(which, q_smem, o_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turn, O,
              LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, off_b, off_h, H, N_Q, N_K, causal_off,
              win_left, win_right, start_m, lo, n_blocks, it0, tile_i, trace, pid,
              CAUSAL: gl.constexpr, WINDOW: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr,
              FP8: gl.constexpr, PERSISTENT: gl.constexpr, TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr,
              TMA_STORE: gl.constexpr, O_TILE: gl.constexpr, EARLY_Q: gl.constexpr):
    """One consumer's rows of one tile (``it0``: the blocks the ring carried before it;
    ``tile_i``: the tiles this CTA ran before it, for the Q barriers' phases; ``trace``: this
    partition's slots of the tile's trace, with TRACE). TMA_STORE: ``O`` is the output's TMA
    descriptor (16-bit inputs and an output the copy engine can address), else its pointer with
    the strides; the bulk store goes through ``o_smem``, the consumers' O tiles with O_TILE (the
    config's O_TILE), else their Q tiles."""
    # PERSISTENT: the Q tile goes back to the producer once no wgmma reads it any more, unless
    # O goes out through it (then once the bulk store has read it); EARLY_Q (the config's O_TILE,
    # with the overlap): before the last P V
    Q_FOR_O: gl.constexpr = TMA_STORE and not O_TILE
    trace_start(trace, pid, n_blocks, tile_i, lo, TRACE)
    # wgmma's K per instruction: 16 for 16-bit operands, 32 for fp8; a register A operand
    # holds 32 bits of K per element group (k_width 2 for 16-bit P, 4 for fp8 P)
    INSTR_K: gl.constexpr = 32 if FP8 else 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, INSTR_K])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, INSTR_K])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if FP8 else 2)

    row0 = start_m + which * BLOCK_M
    rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    # of the CTA's blocks [0, n_blocks) (key blocks lo + j; the same for both consumers),
    # [full_lo, full_hi) need no mask for these rows, the others the causal, window and/or
    # sequence-end one (a window's blocks of the CTA that these rows never reach: all -inf)
    if WINDOW:
        _lo, w_full_lo, w_full_hi, _hi = _window_range(row0, row0 + BLOCK_M - 1, N_K, BLOCK_N, causal_off,
                                                       win_left, win_right)
        full_lo = gl.minimum(gl.maximum(w_full_lo - lo, 0), n_blocks)
        full_hi = gl.minimum(gl.maximum(w_full_hi - lo, full_lo), n_blocks)
    else:
        full_lo = 0
        full_hi = N_K // BLOCK_N
        if CAUSAL:
            full_hi = gl.minimum(full_hi, gl.maximum(row0 + causal_off + 1, 0) // BLOCK_N)
        full_hi = gl.minimum(full_hi, n_blocks)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    mbarrier.wait(q_ready.index(which), tile_i & 1)
    stamp(trace, T_CLK_Q, TRACE)
    q = q_smem.index(which).reshape([BLOCK_M, HEAD_DIM])
    if OVERLAP:
        acc, m_i, l_i = _consume_overlapped(acc, m_i, l_i, q, k_bufs, v_bufs, p_bufs.index(which), k_ready, v_ready,
                                            kv_empty, turn, q_empty.index(which),
                                            which, rows, lo, full_lo, full_hi, n_blocks, it0, qk_scale, N_K, causal_off,
                                            win_left, win_right, trace, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N,
                                            NUM_BUFFERS, PINGPONG, FP8, s_layout, p_layout, TRACE, SCALE_POSITIVE,
                                            EARLY_Q)
    else:
        if WINDOW:  # the window's left edge
            acc, m_i, l_i = _consume_blocks(acc, m_i, l_i, q, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn,
                                            which, rows, 0, full_lo, lo, it0, qk_scale, N_K, causal_off, win_left,
                                            win_right, trace, 1, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N,
                                            NUM_BUFFERS, PINGPONG, FP8, s_layout, p_layout, TRACE, SCALE_POSITIVE)
        acc, m_i, l_i = _consume_blocks(acc, m_i, l_i, q, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn, which,
                                        rows, full_lo, full_hi, lo, it0, qk_scale, N_K, causal_off, win_left, win_right,
                                        trace, 0, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, PINGPONG,
                                        FP8, s_layout, p_layout, TRACE, SCALE_POSITIVE)
        acc, m_i, l_i = _consume_blocks(acc, m_i, l_i, q, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn, which,
                                        rows, full_hi, n_blocks, lo, it0, qk_scale, N_K, causal_off, win_left,
                                        win_right, trace, 1, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS,
                                        PINGPONG, FP8, s_layout, p_layout, TRACE, SCALE_POSITIVE)
    stamp(trace, T_CLK_BLOCKS, TRACE)
    if PERSISTENT and not Q_FOR_O:
        # every wgmma that read this Q tile has been waited for: all four warps past them,
        # one arrival, and the producer may load the next tile's rows into it (EARLY_Q: done
        # before the last P V, unless the tile had no key block)
        if EARLY_Q:
            if n_blocks == 0:
                gl.thread_barrier()
                mbarrier.arrive(q_empty.index(which))
        else:
            gl.thread_barrier()
            mbarrier.arrive(q_empty.index(which))

    if CAUSAL or WINDOW:
        # rows that saw no key (bottom-right, Nq > Nk): output 0, log-sum-exp -inf
        l_div = gl.where(l_i == 0.0, 1.0, l_i)
    else:
        l_div = l_i
    if FP8:  # V's descale, once on the output
        l_div = l_div / v_scale
    o = acc / gl.convert_layout(l_div, gl.SliceLayout(1, o_layout))[:, None]
    if TMA_STORE:
        # O_TILE: this consumer's O tile, once the previous tile's bulk store has read it (the
        # issuing thread waits, the barrier holds the others); else its Q tile, free: every
        # wgmma that read it has been waited for (in this partition: the other consumer and the
        # producer never touch it before q_empty)
        o_buf = o_smem.index(which)
        if O_TILE:
            tma.store_wait(0)
            gl.thread_barrier()
        o_buf.reshape([BLOCK_M, HEAD_DIM]).store(o.to(o_smem.dtype))
        fence_async_shared()
        gl.thread_barrier()  # all four warps' rows in shared memory before the one bulk store
        tma.async_copy_shared_to_global(O, [off_b, off_h, row0, 0], o_buf)
    else:
        o_rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        base = O + off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
        o_ptrs = base + o_rows.to(gl.int64)[:, None] * stride_on + o_cols[None, :] * stride_od
        gl.store(o_ptrs, o.to(O.dtype.element_ty), mask=o_rows[:, None] < N_Q)
    # log-sum-exp in base 2 of the scaled scores
    lse_ptrs = LSE + (off_b.to(gl.int64) * H + off_h) * N_Q + rows
    gl.store(lse_ptrs, m_i + gl.log2(l_i), mask=rows < N_Q)
    if Q_FOR_O:
        # the bulk store has read the tile: the CTA may exit, or (PERSISTENT) the producer may
        # load the next tile's rows into it
        tma.store_wait(0)
        if PERSISTENT:
            gl.thread_barrier()
            mbarrier.arrive(q_empty.index(which))
    trace_end(trace, TRACE)


@gluon.jit
def _key_blocks(start_m, N_Q, N_K, causal_off, win_left, win_right, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The key blocks the tile at query row ``start_m`` needs, (lo, n_blocks): causal stops
    at its last row's last visible key; a window also starts at its first row's first one
    (the rest are never loaded)."""
    if WINDOW:
        lo, _full_lo, _full_hi, hi_blk = _window_range(start_m, gl.minimum(start_m + 2 * BLOCK_M, N_Q) - 1, N_K,
                                                       BLOCK_N, causal_off, win_left, win_right)
        n_blocks = hi_blk - lo
    else:
        lo = 0
        hi = N_K
        if CAUSAL:
            hi = gl.maximum(gl.minimum(start_m + 2 * BLOCK_M + causal_off, N_K), 0)
        n_blocks = gl.cdiv(hi, BLOCK_N)
    return lo, n_blocks


@gluon.jit
def _tile(t, n_m, n_units, H, N_Q, N_K, causal_off, win_left, win_right, LPT_UNITS, CAUSAL: gl.constexpr,
          WINDOW: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(off_b, off_h, start_m, lo, n_blocks) of tile ``t`` of the 1-D order of n_m query tiles
    x n_units (batch, head) units: heaviest first in groups (lpt_tile) with LPT_UNITS; else
    the query tiles of a unit in a row (their K/V shared in the L2), the last first under
    causal masking (they see the most keys)."""
    if LPT_UNITS > 0:
        pid_m, unit = lpt_tile(t, n_m, n_units, LPT_UNITS)
        pid_m = n_m - 1 - pid_m
    else:
        pid_m = t % n_m
        unit = t // n_m
        if CAUSAL:
            pid_m = n_m - 1 - pid_m
    start_m = pid_m * (2 * BLOCK_M)
    lo, n_blocks = _key_blocks(start_m, N_Q, N_K, causal_off, win_left, win_right, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
    return unit // H, unit % H, start_m, lo, n_blocks


@gluon.jit
def _producer_tiles(desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                    pid, n_prog, n_units, H, GROUP, N_Q, N_K, causal_off, win_left, win_right, LPT_UNITS,
                    TRACE_PTR, TRACE_SLOTS, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, FP8: gl.constexpr, TRACE: gl.constexpr,
                    EARLY_Q: gl.constexpr):
    """PERSISTENT: the producer of every tile of this CTA (round_tile of each of its rounds)."""
    n_m = gl.cdiv(N_Q, 2 * BLOCK_M)
    it = 0
    tile_i = 0
    for k in range(cta_tiles(n_m * n_units, pid, n_prog)):
        t = round_tile(k, pid, n_prog)
        off_b, off_h, start_m, lo, n_blocks = _tile(t, n_m, n_units, H, N_Q, N_K, causal_off, win_left, win_right,
                                                    LPT_UNITS, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
        _producer(desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                  off_b, off_h, off_h // GROUP, start_m, lo, n_blocks, it, tile_i,
                  trace_slots(TRACE_PTR, TRACE_SLOTS, t, 2, TRACE), pid, BLOCK_M, BLOCK_N, NUM_BUFFERS, FP8, True,
                  TRACE, EARLY_Q)
        it += n_blocks
        tile_i += 1


@gluon.jit
def _consumer_tiles(which, q_smem, o_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turn,
                    O, LSE,
                    qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, pid, n_prog, n_units, H, N_Q, N_K,
                    causal_off, win_left, win_right, LPT_UNITS, TRACE_PTR, TRACE_SLOTS,
                    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr,
                    FP8: gl.constexpr, TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr, TMA_STORE: gl.constexpr,
                    O_TILE: gl.constexpr, EARLY_Q: gl.constexpr):
    """PERSISTENT: one consumer's rows of every tile of this CTA, in the producer's order."""
    n_m = gl.cdiv(N_Q, 2 * BLOCK_M)
    it = 0
    tile_i = 0
    for k in range(cta_tiles(n_m * n_units, pid, n_prog)):
        t = round_tile(k, pid, n_prog)
        off_b, off_h, start_m, lo, n_blocks = _tile(t, n_m, n_units, H, N_Q, N_K, causal_off, win_left, win_right,
                                                    LPT_UNITS, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
        _consumer(which, q_smem, o_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turn,
                  O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, off_b, off_h, H, N_Q, N_K,
                  causal_off, win_left, win_right, start_m, lo, n_blocks, it, tile_i,
                  trace_slots(TRACE_PTR, TRACE_SLOTS, t, which, TRACE), pid, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M,
                  BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, True, TRACE, SCALE_POSITIVE, TMA_STORE, O_TILE,
                  EARLY_Q)
        it += n_blocks
        tile_i += 1
    if O_TILE:  # the last tile's bulk store has read its O tile before the CTA exits
        tma.store_wait(0)


@gluon.jit
def _gluon_attn_fwd_kernel(desc_q, desc_k, desc_v, O, LSE, qk_scale, v_scale,
                           stride_ob, stride_oh, stride_on, stride_od,
                           H, GROUP, N_Q, N_K, causal_off, win_left, win_right, LPT_UNITS, N_UNITS, TRACE_PTR,
                           TRACE_SLOTS,
                           CAUSAL: gl.constexpr, WINDOW: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                           BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, PINGPONG: gl.constexpr,
                           OVERLAP: gl.constexpr, FP8: gl.constexpr, P_LAYOUT: gl.constexpr,
                           PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PERSISTENT: gl.constexpr,
                           TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr, TMA_STORE: gl.constexpr,
                           O_TILE: gl.constexpr, EARLY_Q: gl.constexpr, V_BUFFERS: gl.constexpr):
    # V_BUFFERS: V's ring slots (NUM_BUFFERS, or fewer where the O tiles need the room:
    # persistent_v_buffers; the V loads then wait for their own slots, _load_kv);
    # TMA_STORE: O is the output's TMA descriptor, else its pointer; O_TILE (PERSISTENT
    # with TMA_STORE): each consumer's O through a tile of its own; EARLY_Q (PERSISTENT with the
    # overlap, O not through Q): Q released before the last P V (both the config's O_TILE);
    # N_UNITS: batch x query heads (the 1-D orders' units); TRACE: the trace (gluon/trace.py) into
    # TRACE_PTR's [tiles, 3, TRACE_SLOTS] int64 slots (unused without)
    q_smem = gl.allocate_shared_memory(desc_q.dtype, [2] + desc_q.block_type.shape, desc_q.layout)
    k_bufs = gl.allocate_shared_memory(desc_k.dtype, [NUM_BUFFERS] + desc_k.block_type.shape, desc_k.layout)
    v_bufs = gl.allocate_shared_memory(desc_v.dtype, [V_BUFFERS] + desc_v.block_type.shape, desc_v.layout)
    if FP8 and OVERLAP:  # each consumer's P tile (_stage_p)
        p_bufs = gl.allocate_shared_memory(desc_q.dtype, [2, BLOCK_M, BLOCK_N], P_LAYOUT)
    else:
        p_bufs = q_smem  # not read
    if O_TILE:  # each consumer's O tile for the bulk store (else its Q tile, with TMA_STORE)
        o_smem = gl.allocate_shared_memory(desc_q.dtype, [2] + desc_q.block_type.shape, desc_q.layout)
    else:
        o_smem = q_smem
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if PERSISTENT:  # per consumer: its Q tile is free for the next tile's rows
        q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    else:
        q_empty = q_ready  # not used
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_BUFFERS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
        if PERSISTENT:
            mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(NUM_BUFFERS):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both consumers release a slot (its K and V)
    for i in gl.static_range(V_BUFFERS):
        mbarrier.init(v_ready.index(i), count=1)
    fence_async_shared()

    if PERSISTENT:  # at most one CTA per SM, each walking one tile of each round (round_tile) of _tile's order
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        gl.warp_specialize([
            (_consumer_tiles, (0, q_smem, o_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                               turn, O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, pid, n_prog,
                               N_UNITS, H, N_Q, N_K, causal_off, win_left, win_right, LPT_UNITS, TRACE_PTR, TRACE_SLOTS,
                               CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, TRACE,
                               SCALE_POSITIVE, TMA_STORE, O_TILE, EARLY_Q)),
            (_consumer_tiles, (1, q_smem, o_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                               turn, O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, pid, n_prog,
                               N_UNITS, H, N_Q, N_K, causal_off, win_left, win_right, LPT_UNITS, TRACE_PTR, TRACE_SLOTS,
                               CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, TRACE,
                               SCALE_POSITIVE, TMA_STORE, O_TILE, EARLY_Q)),
            (_producer_tiles, (desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready,
                               kv_empty, pid, n_prog, N_UNITS, H, GROUP, N_Q, N_K, causal_off, win_left, win_right,
                               LPT_UNITS, TRACE_PTR, TRACE_SLOTS, CAUSAL, WINDOW, BLOCK_M, BLOCK_N, NUM_BUFFERS, FP8,
                               TRACE, EARLY_Q)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # CONSUMER_WARPS, PRODUCER_WARPS
    else:
        if LPT_UNITS > 0:  # causal, a 1-D grid in heaviest-first order across heads (lpt_tile)
            n_m = gl.cdiv(N_Q, 2 * BLOCK_M)
            pid_m, unit = lpt_tile(gl.program_id(0), n_m, gl.num_programs(0) // n_m, LPT_UNITS)
            pid_m = n_m - 1 - pid_m
            off_h = unit % H
            off_b = unit // H
        else:
            pid_m = gl.program_id(0)
            if CAUSAL:
                # the last query blocks have the most keys: start them first
                pid_m = gl.num_programs(0) - 1 - pid_m
            off_h = gl.program_id(1)
            off_b = gl.program_id(2)
        off_hk = off_h // GROUP
        start_m = pid_m * (2 * BLOCK_M)
        lo, n_blocks = _key_blocks(start_m, N_Q, N_K, causal_off, win_left, win_right, CAUSAL, WINDOW, BLOCK_M,
                                   BLOCK_N)
        if TRACE:  # the CTA's place in the launch order: its tile in the trace
            pid = gl.program_id(0) + gl.num_programs(0) * (gl.program_id(1) + gl.num_programs(1) * gl.program_id(2))
        else:
            pid = 0
        gl.warp_specialize([
            (_consumer, (0, q_smem, q_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turn,
                         O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, off_b, off_h, H, N_Q,
                         N_K, causal_off, win_left, win_right, start_m, lo, n_blocks, 0, 0,
                         trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 0, TRACE), pid, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M,
                         BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, False, TRACE, SCALE_POSITIVE, TMA_STORE,
                         False, False)),
            (_consumer, (1, q_smem, q_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turn,
                         O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, off_b, off_h, H, N_Q,
                         N_K, causal_off, win_left, win_right, start_m, lo, n_blocks, 0, 0,
                         trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 1, TRACE), pid, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M,
                         BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, False, TRACE, SCALE_POSITIVE, TMA_STORE,
                         False, False)),
            (_producer, (desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                         off_b, off_h, off_hk, start_m, lo, n_blocks, 0, 0,
                         trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 2, TRACE), pid, BLOCK_M, BLOCK_N, NUM_BUFFERS, FP8,
                         False, TRACE, False)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # CONSUMER_WARPS, PRODUCER_WARPS


