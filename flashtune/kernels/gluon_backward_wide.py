"""The Gluon dK/dV kernel for head dim 256 on Hopper (sm_90): the two consumer groups split by role
and by head-dim half (issue 18; gemma2's D=256 backward).

Why a kernel of its own: gluon_backward's dK/dV kernel gives each consumer warp group BLOCK_N = 64
keys and their whole fp32 dK and dV rows, 2 x 64 x D / 128 registers a thread: 128 at D=128, 256 at
D=256, more than a thread has. Here both groups work on the same 64 keys and each keeps the dK and
dV columns of one half of the head dim (2 x 64 x 128 / 128 = 128 registers a thread, as at D=128);
the scores are split by role instead of by keys, so no matmul is computed twice:

- the producer (1 warp): the CTA's K and V tiles ([64, 256]) once, then per step (query head,
  block of BLOCK_M = 32 queries) the Q and dO tiles into a ring of NUM_BUFFERS slots, as
  gluon_backward's producer;
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
  to run, as gluon_backward's fused dQ);
- dK (times sm_scale) and dV stored from the registers, a split's to its fp32 slot.

The exchanges: P^T and dS^T have two slots each (step g uses slot g % 2), a P-ready mbarrier
(consumer 0 arrives) and a dS-ready one (consumer 1 arrives) per slot. A group writes slot s
again two steps on, and by then the other group has waited for every wgmma of the step that read
it (it arrived on the exchange of the step between, which it reaches only past that wait), so
no empty barrier is needed. Every matmul has N = 32 (S^T, dP^T, dQ^T) or 128 (dV, dK): N = 32
wgmmas read more shared memory per FLOP; FlashAttention-3's D=256 backward splits its scores the
same way (its two groups on halves of the queries).

Written 2026-12-06 without a GPU (the sm_90 compile, its registers, spills and shared memory are
checked on the CPU: tests/kernels/gluon_compile_sm90.py). On its first GPU run (H100, 2026-12-06,
docs/data/h100-2026-12-06e-gluon/) its GPU tests (tests/kernels/test_gluon_bwd_wide_gpu.py) passed
and with dQ fused and 3 slots it ran gemma2-d256-train-4k's backward at 0.972x cuDNN, 1.555x the
Triton kernel (benchmarks/gluon_bwd.py); gluon_backward.WIDE_HEAD_DIM then opened it to BwdConfig's
Gluon families 1 and 3, so to the heuristic table, the search and the dispatcher.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashtune.kernels import launch
from flashtune.kernels.common import LOG2E, cdiv, key_block_lpt_units, on_device
from flashtune.kernels.config import ConfigError
from flashtune.kernels.gluon_backward import (GLUON_DKDV_PROGRAMS_PER_SM, GluonBwdConfig, _kernel_inputs,
                                              _load_q_do_ring, _step,
                                              _tile_params, _tma_reduce_add)
from flashtune.kernels.gluon_forward import (CONSUMER_WARPS, DTYPES, SM90_SHARED_MEMORY, _BARRIER_BYTES,
                                             _SHARED_SLACK, _descriptor, check_int_fields, check_register_split,
                                             check_sm90_device, p_tile_layout,
                                             tile_layout)

HEAD_DIM = 256
BLOCK_KEYS = 64  # keys a CTA (both groups'; the wgmma's M of S^T, dP^T, dV and dK)
WIDE_BLOCK_M = 32  # queries a step (each consumer's N of S^T / dP^T)
DQ_CHUNK = 64  # head-dim columns of one dQ reduce-add tile (a group's half is two)
# each group's first matmul of a step (S^T or dP^T) issued a step ahead. 1 (True), early: during step
# it, group 0 issues step it + 1's S^T once its dV is issued and before it waits for dS^T, group 1 its
# dP^T before it waits for P^T, so the tensor cores have work while the other group computes its
# exponentials or dS^T. 2, late: each group issues it behind the step's dK, once its dQ share is
# stored (its registers free), and leaves it in flight over the slot's release into the next step,
# waiting for it at the step's start (the early matmul sits ahead of the step's dQ and dK in the
# group's in-order wgmma queue; the late one behind them). Either way the last step issues its own
# again, not read (one matmul in n_steps). The same matmuls on the same operands: the same bits.
# Read at each launch; a launch plan replays the kernel it recorded. Late written 2026-12-06 without
# a GPU (compiled for sm_90: no spills, fused or not, causal or not), to be timed.
# Off: early was slower on every row and slot count timed, ratio to cuDNN off / early with dQ fused and 3
# slots: gemma2-d256-train-4k 0.972 / 0.919, 2x16x4k-d256 full 0.906 / 0.859, causal 0.845 / 0.806 (2
# slots 0.963 / 0.758, 0.891 / 0.678, 0.845 / 0.669): benchmarks/gluon_bwd.py --rows
# gemma2-d256-train-4k,2x16x4k-d256 --prefetch both --buffers 2,3 --rounds 2 --rep 30, GPU time, H100,
# triton 3.6, 2026-12-06 (docs/data/h100-2026-12-06e-gluon/bwd_d256.log).
PREFETCH = 0


def wide_shared_memory(config: GluonBwdConfig, dtype: torch.dtype) -> int:
    """Bytes of shared memory of the D=256 kernel: K and V, the Q/dO ring, the P^T (16-bit and
    fp32) and dS^T slots, with DQ_FUSED both groups' staging tiles, the mbarriers."""
    e = torch.empty((), dtype=dtype).element_size()
    m = config.BLOCK_M
    tiles = 2 * BLOCK_KEYS * HEAD_DIM * e + 2 * config.NUM_BUFFERS * m * HEAD_DIM * e
    tiles += 2 * (BLOCK_KEYS * m * e + BLOCK_KEYS * m * 4 + BLOCK_KEYS * m * e)
    if config.DQ_FUSED:
        tiles += 2 * (HEAD_DIM // 2) * m * 4
    barriers = (1 + 3 * config.NUM_BUFFERS + 2 * 2) * _BARRIER_BYTES
    return tiles + barriers + _SHARED_SLACK


def validate_wide(config: GluonBwdConfig, dtype: torch.dtype, device=None) -> GluonBwdConfig:
    """Raise ConfigError naming the field if ``config`` cannot run the D=256 kernel; return it.
    The kernel's fields: BLOCK_M (32), NUM_BUFFERS, the register split, DQ_FUSED (0 or 1); the
    others must keep their defaults (the D=128 kernel's options it does not have)."""
    check_int_fields(config)
    if config.BLOCK_M != WIDE_BLOCK_M:
        raise ConfigError(f"BLOCK_M: the D=256 backward takes {WIDE_BLOCK_M} query rows per step, got {config.BLOCK_M}")
    if config.BLOCK_N != BLOCK_KEYS:
        raise ConfigError(f"BLOCK_N: the D=256 backward takes {BLOCK_KEYS} keys per CTA, got {config.BLOCK_N}")
    if config.DQ_FUSED not in (0, 1):
        raise ConfigError(f"DQ_FUSED: the D=256 backward computes dQ in its step (1) or not (0), got {config.DQ_FUSED}")
    for name in ("DV_EARLY", "DQ_FIRST", "PERSISTENT"):
        if getattr(config, name):
            raise ConfigError(f"{name}: the D=256 backward has no such option, expected 0, got {getattr(config, name)}")
    if not 2 <= config.NUM_BUFFERS <= 4:
        raise ConfigError(f"NUM_BUFFERS: expected 2 to 4 Q/dO slots, got {config.NUM_BUFFERS}")
    check_register_split(config.PRODUCER_REGS, config.CONSUMER_REGS)
    if dtype not in DTYPES:
        raise ConfigError(f"dtype: the Gluon backward supports float16 and bfloat16, got {dtype}")
    smem = wide_shared_memory(config, dtype)
    if smem > SM90_SHARED_MEMORY:
        raise ConfigError(f"NUM_BUFFERS: the D=256 backward needs {smem} bytes of shared memory with "
                          f"{config.NUM_BUFFERS} slots, sm_90 allows {SM90_SHARED_MEMORY}; use fewer")
    if device is not None:
        check_sm90_device(device, "the Gluon backward")
    return config


def default_wide_config() -> GluonBwdConfig:
    """The D=256 kernel's starting config: dQ fused, 3 Q/dO slots (the fastest of the runners timed:
    PREFETCH's comment)."""
    return GluonBwdConfig(BLOCK_M=WIDE_BLOCK_M, BLOCK_N=BLOCK_KEYS, NUM_BUFFERS=3, DQ_FUSED=1)


# ----------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------
@gluon.jit
def _wide_producer(desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready,
                   q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0, BLOCK_M: gl.constexpr,
                   NUM_BUFFERS: gl.constexpr):
    """The TMA warp: K and V once, then each step's Q and dO into ring slot it % NUM_BUFFERS."""
    mbarrier.expect(kv_ready, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, [off_b, off_hk, start_n, 0], kv_ready, k_smem)
    tma.async_copy_global_to_shared(desc_v, [off_b, off_hk, start_n, 0], kv_ready, v_smem)
    _load_q_do_ring(desc_q, desc_do, q_bufs, do_bufs, q_ready, do_ready, q_empty, off_b, first_qb, n_qb, n_steps,
                    head0, 0, 0, BLOCK_M, NUM_BUFFERS, False)


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
    _tma_reduce_add(desc_dqa, [off_b, h, qb * BLOCK_M, WHICH * HALF], dq_smem.index(2 * WHICH))
    _tma_reduce_add(desc_dqa, [off_b, h, qb * BLOCK_M, WHICH * HALF + CHUNK], dq_smem.index(2 * WHICH + 1))


@gluon.jit
def _wide_consumer(WHICH: gl.constexpr, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty,
                   p16_smem, p32_smem, ds_smem, p_ready, ds_ready, dq_smem, desc_dqa, DK, DV, LSE, DELTA,
                   qk_scale, sm_scale, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                   stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                   n_steps, head0, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, FUSED_DQ: gl.constexpr,
                   PREFETCH: gl.constexpr):
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
    # PREFETCH (1 early, 2 late): step it + 1's first matmul is issued during step it (early: group 0
    # before it waits for dS^T, group 1 before it waits for P^T; late: after the step's dK, in flight
    # over the dQ share's store and into the next step); the first step's here (late: not waited for)
    first = s_zero
    if PREFETCH == 1:
        if n_steps > 0:
            mbarrier.wait(b_ready.index(0), 0)
            b0 = b_bufs.index(0).reshape([BLOCK_M, HEAD_DIM])
            f0 = warpgroup_mma(a_op, b0.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            first, _a0, _b0 = warpgroup_mma_wait(0, deps=(f0, a_op, b0))
    if PREFETCH == 2:
        # issued whether or not there is a step (no branch around a wgmma left in flight: ptxas then
        # serializes every wgmma of the kernel); with none it reads an unfilled slot and is not read
        mbarrier.wait(b_ready.index(0), 0, pred=n_steps > 0)
        b0 = b_bufs.index(0).reshape([BLOCK_M, HEAD_DIM])
        f0 = warpgroup_mma(a_op, b0.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        # a wait that leaves it in flight, so it is carried into the loop as a tensor
        first, _a0, _b0 = warpgroup_mma_wait(1, deps=(f0, a_op, b0))
    for it in range(n_steps):
        h, qb = _step(it, n_qb, first_qb, head0)
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
        if PREFETCH != 0:  # issued in the step before (early: and waited for there)
            mine = first
            if PREFETCH == 2:
                mine, _a, _b = warpgroup_mma_wait(0, deps=(first, a_op, b))
            # the next step's ring slot (the last step: its own again, for a matmul nobody reads)
            more = (it + 1 < n_steps).to(gl.int32)
            s_next = (it + more) % NUM_BUFFERS
            phase_next = ((it + more) // NUM_BUFFERS) & 1
            b_next = b_bufs.index(s_next).reshape([BLOCK_M, HEAD_DIM])
        else:
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
            if PREFETCH == 1:
                mbarrier.wait(b_ready.index(s_next), phase_next)
                first = warpgroup_mma(a_op, b_next.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(ds_ready.index(x), x_phase)
        else:
            # Delta 0 past Nq (their P is 0 already)
            delta = gl.load(DELTA + row_base + rows, mask=rows < N_Q, other=0.0)
            if PREFETCH == 1:
                mbarrier.wait(b_ready.index(s_next), phase_next)
                first = warpgroup_mma(a_op, b_next.permute((1, 0)), s_zero, use_acc=False, is_async=True)
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
            # (in order: dV's and the early prefetched matmul done too; dK in flight)
            dq0, dq1, _kt0, _kt1, _ds = warpgroup_mma_wait(1, deps=(dq0, dq1, kt0, kt1, ds16))
            _wide_dq_send(WHICH, dq0, dq1, dq_smem, desc_dqa, off_b, h, qb, sm_scale, HEAD_DIM, BLOCK_M)
        if PREFETCH == 2:  # the next step's first matmul behind dK (and the dQ share's registers free), left in flight
            mbarrier.wait(b_ready.index(s_next), phase_next)
            first = warpgroup_mma(a_op, b_next.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if PREFETCH == 1:
            dv, dk, first, _p, _ds2, _do2, _q2, _bn = warpgroup_mma_wait(
                0, deps=(dv, dk, first, p16, ds16, do, q, b_next))
        elif PREFETCH == 2:  # dV and dK done, the next step's first matmul left in flight (carried on)
            dv, dk, first, _p, _ds2, _do2, _q2, _bn = warpgroup_mma_wait(
                1, deps=(dv, dk, first, p16, ds16, do, q, b_next))
        else:
            dv, dk, _p, _ds2, _do2, _q2 = warpgroup_mma_wait(0, deps=(dv, dk, p16, ds16, do, q))
        # every warp of the group is done with the slot before its one arrival
        gl.thread_barrier()
        mbarrier.arrive(q_empty.index(s))
    if PREFETCH == 2:  # the last step's late matmul (its own operands again, not read)
        first = warpgroup_mma_wait(0, deps=(first, ))
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
                                PREFETCH: gl.constexpr, X_LAYOUT: gl.constexpr, X32_LAYOUT: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr):
    # a 1-D grid of one CTA per (key block of BLOCK_N keys, unit), gluon_backward._tile_params' order
    # (its BLOCK_N is a group's keys there, half the CTA's: BLOCK_N // 2 here)
    n_kb = gl.cdiv(N_K, BLOCK_N)
    split, off_b, off_hk, start_n, first_qb, n_qb, head0, n_steps = _tile_params(
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
                          n_steps, head0, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, FUSED_DQ, PREFETCH)),
        (_wide_consumer, (1, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, p16_smem,
                          p32_smem, ds_smem, p_ready, ds_ready, dq_smem, desc_dqa, DK, DV, LSE, DELTA, qk_scale,
                          sm_scale, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                          stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                          n_steps, head0, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, FUSED_DQ, PREFETCH)),
        (_wide_producer, (desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready,
                          do_ready, q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0, BLOCK_M,
                          NUM_BUFFERS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # CONSUMER_WARPS, PRODUCER_WARPS


# ----------------------------------------------------------------------------------
# The host side
# ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _dq_chunk_layout(rows: int):
    """The shared layout of one fp32 [1, 1, rows, 64] dQ reduce-add tile."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, DQ_CHUNK], gl.float32)


@functools.lru_cache(maxsize=None)
def _exchange_layouts(block_m: int, dtype: torch.dtype) -> tuple:
    """The shared layouts of the 16-bit P^T / dS^T slots (wgmma operands) and of the fp32 P^T slots, made
    once per (block_m, dtype) (the layouts are frozen dataclasses, as gluon_forward.tile_layout's)."""
    return (p_tile_layout(BLOCK_KEYS, block_m, dtype),
            gl.NVMMASharedLayout.get_default_for([BLOCK_KEYS, block_m], gl.float32))


def wide_kernel_constexprs(config: GluonBwdConfig, dtype: torch.dtype, causal: bool) -> dict:
    x_layout, x32_layout = _exchange_layouts(config.BLOCK_M, dtype)
    return dict(CAUSAL=bool(causal), HEAD_DIM=HEAD_DIM, BLOCK_M=config.BLOCK_M, BLOCK_N=BLOCK_KEYS,
                NUM_BUFFERS=config.NUM_BUFFERS, FUSED_DQ=bool(config.DQ_FUSED), PREFETCH=int(PREFETCH),
                X_LAYOUT=x_layout,
                X32_LAYOUT=x32_layout, PRODUCER_REGS=config.PRODUCER_REGS, CONSUMER_REGS=config.CONSUMER_REGS)


def gluon_dkdv_wide(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse2: torch.Tensor,
                    delta: torch.Tensor, config: GluonBwdConfig, *, causal: bool, sm_scale: float,
                    causal_off: int = 0, split: tuple[int, int] = (1, 1), lpt: int | None = None,
                    dq_acc: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """dK and dV at head dim 256, as ``gluon_backward.gluon_dkdv`` gives them (the same arguments;
    a DQ_FUSED config adds sm_scale dS K into ``dq_acc``, a zeroed contiguous float32 tensor of
    q's shape)."""
    from flashtune.kernels import backward

    B, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    if D != HEAD_DIM:
        raise ValueError(f"q: the D=256 backward takes head dim {HEAD_DIM}, got {D}")
    split_h, split_q = split
    group = H // H_KV
    if split_h < 1 or split_q < 1 or group % split_h:
        raise ValueError(f"split: expected (head splits dividing the group of {group}, query chunks >= 1), "
                         f"got {split}")
    dk, dv = launch.empty_like(k), launch.empty_like(v)
    n_split = split_h * split_q
    if n_split > 1:  # (dK, dV) x split x (B, H_KV, N_K, D) fp32 slots
        parts = launch.empty((2, n_split, B, H_KV, N_K, D), device=q.device, dtype=torch.float32)
        outs = (parts[0], parts[1])
    else:
        outs = (dk, dv)
    strides = [(o.stride(0) if n_split > 1 else 0, *o.stride()[-4:]) for o in outs]
    q, k, v, do, lse2, delta = _kernel_inputs(q, k, v, do, lse2, delta)
    desc_q, desc_do = _descriptor(q, config.BLOCK_M), _descriptor(do, config.BLOCK_M)
    desc_k, desc_v = _descriptor(k, BLOCK_KEYS), _descriptor(v, BLOCK_KEYS)
    if lpt is None:
        lpt = key_block_lpt_units(q, heads_per_unit=group // split_h, units=B * H_KV * n_split,
                                  key_blocks=cdiv(N_K, BLOCK_KEYS), programs_per_sm=GLUON_DKDV_PROGRAMS_PER_SM,
                                  causal=causal)
    if config.DQ_FUSED:
        if dq_acc is None or dq_acc.dtype != torch.float32 or dq_acc.shape != q.shape or not dq_acc.is_contiguous():
            raise ValueError("dq_acc: a DQ_FUSED config needs a zeroed contiguous float32 tensor of q's shape")
        desc_dqa = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()),
                                    [1, 1, config.BLOCK_M, DQ_CHUNK], _dq_chunk_layout(config.BLOCK_M))
    else:
        desc_dqa = desc_q  # not read
    n_units = B * H_KV * n_split
    grid = (cdiv(N_K, BLOCK_KEYS) * n_units, )
    with on_device(q):
        launch.launch(_gluon_attn_bwd_wide_kernel, desc_q, desc_do, desc_k, desc_v, *outs, lse2, delta,
                      sm_scale * LOG2E, sm_scale, *strides[0], *strides[1], H, H_KV, group, N_Q, N_K, causal_off,
                      split_h, split_q, lpt, n_units, desc_dqa, grid=grid,
                      **wide_kernel_constexprs(config, q.dtype, causal), num_warps=CONSUMER_WARPS,
                      maxnreg=config.maxnreg())
        if n_split > 1:
            backward._sum_partials(parts, dk, dv, int64=backward.needs_int64(parts, dk, dv))
    return dk, dv


def compile_wide_for_sm90(config: GluonBwdConfig, dtype: torch.dtype, causal: bool):
    """Compile the D=256 kernel for sm_90 (ptxas; no GPU needed) as an unsplit launch on
    contiguous inputs would; returns triton's CompiledKernel (``.metadata.shared``, ``.asm``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    el = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]

    def desc(rows: int) -> str:
        return f"tensordesc<{el}[1,1,{rows},{HEAD_DIM}],{tile_layout(rows, HEAD_DIM, dtype)!r}>"

    fn = _gluon_attn_bwd_wide_kernel
    constexprs = wide_kernel_constexprs(config, dtype, causal)
    constexprs["stride_dkd"] = 1
    constexprs["stride_dvd"] = 1
    m = config.BLOCK_M
    types = {"desc_q": desc(m), "desc_do": desc(m), "desc_k": desc(BLOCK_KEYS), "desc_v": desc(BLOCK_KEYS),
             "DK": f"*{el}", "DV": f"*{el}", "LSE": "*fp32", "DELTA": "*fp32", "qk_scale": "fp32",
             "sm_scale": "fp32",
             "desc_dqa": (f"tensordesc<fp32[1,1,{m},{DQ_CHUNK}],{_dq_chunk_layout(m)!r}>" if config.DQ_FUSED
                          else desc(m))}
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = types.get(name, "i32")
            if name in ("DK", "DV", "LSE", "DELTA") or name.startswith("stride"):
                attrs[(i, )] = [["tt.divisibility", 16]]
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": CONSUMER_WARPS, "maxnreg": config.maxnreg()})


__all__ = ["HEAD_DIM", "BLOCK_KEYS", "WIDE_BLOCK_M", "default_wide_config", "validate_wide", "wide_shared_memory",
           "gluon_dkdv_wide", "compile_wide_for_sm90"]
