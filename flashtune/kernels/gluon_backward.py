"""A warp-specialised Hopper (sm_90) attention backward in Gluon: the dK/dV kernel (issue 18).

The first step of the Gluon backward: dK and dV come from the kernel here, Delta from the
Triton preprocess and dQ from the Triton dQ kernel (kernels/backward.py), so the two
families share every convention. A BwdConfig with ``family=1`` runs it
(backward.attention_backward; BwdConfig.gluon() is its GluonBwdConfig); also callable
directly through ``gluon_attention_backward`` (tests/kernels/test_gluon_bwd_gpu.py,
benchmarks/gluon_bwd.py).

Conventions are ``backward.attention_backward``'s: q, do (B, Hq, Nq, D); k, v (B, Hkv, Nk,
D); query head h reads key/value head h // (Hq // Hkv); lse2 (B, Hq, Nq) float32, the
forward's base-2 log-sum-exp of the scaled scores; causal top-left aligned by default.
With S = sm_scale Q K^T, P = softmax(S), dP = dO V^T, Delta = rowsum(dO * O),
dS = P * (dP - Delta): dV = P^T dO, dK = sm_scale dS^T Q.

Design (one CTA per 2 x BLOCK_N keys of one (batch, K/V head); FlashAttention-3's
backward roles, the forward's machinery (gluon_forward.py) with queries and keys swapped):

- a producer partition (1 warp) issues the TMA loads: the CTA's two K and two V tiles
  once, then for each query head of the group and each query block the Q and dO tiles
  into a ring of ``NUM_BUFFERS`` shared-memory slots (a Q-ready and a dO-ready mbarrier
  per slot, completed by the copies' byte counts, and an empty mbarrier both consumers
  arrive on when done with the slot);
- two consumer partitions (one warp group each) each own BLOCK_N keys, their K and V
  tiles and their fp32 dK and dV accumulators in registers, and walk the same query
  blocks. Per block, transposed (keys along the rows, the wgmma's M):
  S^T = K Q^T and dP^T = V dO^T issued together as async wgmmas; P^T = exp2(S^T scale -
  lse) while dP^T runs; dV += P^T dO issued (P^T in registers); dS^T = P^T (dP^T - Delta)
  while dV runs; dK += dS^T Q (dS^T in registers); the slot is released once both are done;
- causal: query blocks before the first query that sees the CTA's first key are never
  loaded; blocks on the diagonal are masked, the others not. Rows past Nq read as zeros
  (the descriptors' bounds) and their lse as +inf, so their P is 0 without a mask;
  key rows past Nk give rows of dK and dV that are never stored.

- a key block's work may be split over CTAs (``split``: the group's query heads, then chunks
  of its query blocks; fp32 partials summed afterwards), and under causal masking the CTAs
  start heaviest first (``gluon_forward.lpt_tile``);
- with ``DQ_FUSED`` the kernel also computes dQ (``_fused_dq_share``: dS^T through shared
  memory, one TMA bulk reduce-add per consumer and step), so no dQ kernel runs.

The CPU can only compile these kernels (tests/kernels/test_gluon_compile_sm90.py); the GPU
tests (tests/kernels/test_gluon_bwd_gpu.py) check them on an H200.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashtune.kernels import kernel_trace, launch
from flashtune.kernels.common import LOG2E, causal_offset, cdiv, key_block_lpt_units, on_device, sm_count
from flashtune.kernels.config import ConfigError, _triton_default, split_work
from flashtune.kernels.gluon_forward import (CONSUMER_WARPS, DTYPES, SM90_SHARED_MEMORY, _BARRIER_BYTES,
                                             _SHARED_SLACK, _T_CLK_BLOCKS, _T_CLK_Q, _T_HEAD, _addressable,
                                             _descriptor, _stamp, _tma_addressable, _trace_end, _trace_slots,
                                             _trace_start, check_int_fields, check_register_split, check_sm90_device,
                                             exp2_split_asm, kernel_maxnreg, lpt_tile, p_tile_layout,
                                             poly_exp2_value, tile_layout)

# registers per consumer thread beside the tiles the estimate counts (addresses, loop state;
# the lse and Delta columns): with 16, BLOCK_M 64 at D=128 is allowed, whose compile (ptxas,
# sm_90a, triton 3.6) spills 112-248 bytes per thread; BLOCK_M 128 at D=64 (920) is not
_BWD_SPARE_REGS = 16
HEAD_DIMS = (64, 128)  # the backward's (the forward runs 256 too: gluon_forward.HEAD_DIMS)
DQ_BLOCK_M = 64  # query rows per consumer warp group of the dQ kernel (a CTA covers 2 x 64)
# the dK/dV kernel (one CTA per SM, its shared memory allows no more): programs per SM its
# auto split (config.split_work) aims at
GLUON_DKDV_PROGRAMS_PER_SM = 1
# the dK/dV kernel's row statistics (lse, Delta: one value per query, along the columns of S^T,
# where each thread of the wgmma layout holds 16 of a step's 64): True loads them one per thread
# at the step's start and moves each to the S^T column layout where it is used (a shared-memory
# exchange inside the warp group), False loads all 16 of each per thread at the step's start,
# live across both wgmmas. Same values, same arithmetic; ptxas (sm_90a, 2026-12-05), spill bytes
# a thread False -> True: family 1 causal 260 -> 48, full 100 -> 64, fused dQ full 208 -> 60,
# fused late causal 508 -> 104, full 168 -> 84 (with the lse and Delta columns costing nothing
# at all: 0, 0, 20, 160, 112). On since the H200 checked and timed it (2026-12-05:
# test_the_compact_row_statistics_change_no_bit passed; benchmarks/gluon_bwd.py --grid --realistic
# --stats both, geometric mean over 19 D=128 rows, wide -> compact: fused dQ 0.835 -> 0.894x cuDNN,
# fused late 0.825 -> 0.889x, family 1 0.792 -> 0.815x; docs/gluon.md). Read at each launch; a launch
# plan (kernels/launch.py) replays the kernel it recorded, so set it before the calls.
COMPACT_STATS = True
# the dK/dV kernel's consumers out of step: 0 lets both walk the steps together (each step both
# issue S^T and dP^T, both compute P^T and dS^T while the tensor cores idle, both issue dV, dK and
# the dQ share); 1 starts consumer 1 once consumer 0 has its first P^T, half a step behind, and
# lets them run free from there; 2 keeps them so every step: a consumer issues a step's S^T and
# dP^T only after the other has its P^T of the step before (consumer 0) or of the same step
# (consumer 1), so one's exponentials run under the other's matmuls, as the forward's ping-pong.
# The turns order issues only (no data passes through them): same values, same bits. Off: on an
# H100 (2026-12-05: the turns' bits test passed, now test_the_order_switches_change_no_bit;
# gluon_bwd.py --switch CONSUMER_TURNS=0,1,2 (then --turns) over 5 D=128 rows, ratio to cuDNN in
# geometric mean, fused dQ 0.898 / 0.899 / 0.893, a step late 0.902 / 0.884 / 0.891) they gained
# nothing: the trace showed the late-dQ consumers already half a step apart without them, at the
# same cycles a step (docs/gluon.md). Read at each launch, as COMPACT_STATS; a launch plan replays
# the kernel it recorded.
CONSUMER_TURNS = 0
# the dK/dV kernel's P^T carrying sm_scale: True subtracts log2(sm_scale) from each loaded lse, so
# P^T comes out of its exp2 already scaled (the same one FFMA a score) and with it dS^T: dK and
# the fused dQ share then need no scaling (a consumer thread's 32 FMULs a step on the dQ share,
# the step's issue-bound elementwise path, docs/gluon.md), and dV, which accumulates the scaled
# P^T, is divided by sm_scale once at the end. Launches with 0 < sm_scale <= 1 only (P^T and
# dS^T never grow). Other roundings than False's (the 16-bit P^T and dS^T are of scaled values),
# checked against the reference (test_gluon_bwd_gpu.py: passed on the H100, 2026-12-05). Off: it
# was slower where timed (H100, 2026-12-05, gluon_bwd.py --grid --gluon default --switch
# STEP_COUNTERS=0,1 --switch SCALE_IN_P=0,1 over the 12 D=128 grid rows, ratio to cuDNN in geometric
# mean: 0.899 -> 0.863 with the division, 0.913 -> 0.879 with STEP_COUNTERS; slower on 11 of 12 rows;
# fewer instructions in the loop, not found why). Read at each launch, as COMPACT_STATS; a launch
# plan replays the kernel it recorded.
SCALE_IN_P = False
# the fused dQ's shares sent to the fp32 dQ buffer without sm_scale, which the buffer's cast to q's dtype
# applies once (torch.mul into the output, the same one pass over the buffer as the plain cast): a consumer
# thread's 32 FMULs a step fewer (sm_90 code, benchmarks/gluon_sass.py --switch DQ_SCALE_AT_CAST=0,1: the
# D=128 full default's loop, dQ first, 531 -> 498 instructions; the causal default's, a step late, 585 -> 552),
# with P^T, dS^T, dK and dV as they are (SCALE_IN_P moved the scale into P^T and changed
# their roundings). dQ's fp32 sum is of the unscaled shares, so its bits differ from the in-kernel scale's
# within fp32's rounding. Where SCALE_IN_P runs, the shares come scaled already and this changes nothing. Off: as
# SCALE_IN_P, slower where timed though its loop is shorter (H100, 2026-12-06, gluon_bwd.py --grid --rows <the 6
# D=128 lengths> --gluon default --switch DQ_SCALE_AT_CAST=0,1 --rounds 3: slower or equal on 10 of 12 rows, 0-4 %;
# docs/gluon.md). Read at each launch, as COMPACT_STATS; a launch plan replays the kernel and the cast it recorded.
DQ_SCALE_AT_CAST = False
# the dK/dV kernel's P^T exponentials split between the SFU and the FMA pipe: of every 4 scores
# a thread holds, POLY_EXP2 (0, 1 or 2) take 2^x as a degree-3 polynomial on the FMA and integer
# pipes (_exp2_split), the rest the SFU's ex2 (MUFU.EX2: 16 a cycle per SM, so both consumers'
# 2 x 64 x 64 scores of a step keep it busy 512 cycles, about half of the P^T phase that runs
# while neither consumer has a matmul in flight; a polynomial lane costs about 9 issue slots of
# the FMA pipe instead). 1 balances the two pipes by count (docs/gluon.md). The polynomial's
# relative error is under 7.5e-5 (fp32 evaluation, 2^f on [-0.5, 0.5]), below bf16's and fp16's
# rounding of P^T; other bits than 0's, checked against the reference (test_gluon_bwd_gpu.py,
# passed on the H100, 2026-12-05). A value for every launch, or a dict of values by (head dim,
# causal), 0 for the launches it does not name. Timed on the H100 (2026-12-05, with STEP_COUNTERS;
# gluon_bwd.py --grid --rows <the 6 D=128 lengths> --gluon default --switch POLY_EXP2=0,1,2,
# geometric mean of the ratio to cuDNN): D=128 without masking (the dQ-first fused config) 0.921 ->
# 0.946 (1) / 0.933 (2), faster on 5 of 6 rows; causal (the fused config) 0.909 -> 0.907 / 0.901.
# So 1 at D=128 without masking. D=64 without masking (the fused default there) is slower with it:
# 0.886 -> 0.879 over the 5 full D=64 grid rows from 1024 queries, slower on 4 of 5 (H100, 2026-12-06,
# gluon_bwd.py --grid --rows <those> --gluon default --switch POLY_EXP2=0,1; docs/gluon.md), so 0 there.
# Read at each launch, as COMPACT_STATS.
POLY_EXP2: int | dict = {(128, False): 1}
# the dK/dV consumers' walk over (query head, query block): True counts it step by step (the
# block one on, the head one on where the blocks wrap), False divides the step's index by the
# blocks per head each step (an integer division, about 25 instructions with an SFU reciprocal).
# The same (head, block) each step, so the same bits. sm_90 code (gluon_sass.py, 2026-12-05): a
# consumer's loop 609 -> 564 instructions (fused dQ, causal), 504 -> 487 (dQ first, full). Timed
# on the H100 (2026-12-05, the run under SCALE_IN_P): 0.899 -> 0.913x cuDNN in geometric mean over
# the 12 D=128 grid rows (full 0.909 -> 0.919, causal 0.889 -> 0.907; within noise or better on 10
# of 12). Its bits test failed there for the late dQ share (FUSED_DQ 2: dQ's rows wrong, dK and dV
# right), fixed since (the share's position one step back from the counted one) and passed on the
# H100 the same day (test_the_order_switches_change_no_bit -k STEP_COUNTERS, 10 passed). On since.
# Read at each launch, as COMPACT_STATS.
STEP_COUNTERS = True
# the dK/dV kernel's causal steps that a consumer group has nothing to do in: where every query of
# the step's block comes before the group's first key (the CTA's walk starts at the block of the
# first query that sees its first key, so with 64-query blocks the second group's first block of
# each query head is all masked when the diagonal falls on a block edge, as on the standard grid).
# True skips that group's S^T, dP^T, exponentials, dV and dK in the walk's first step (4 of its 6
# wgmmas; the dQ share's two stay, with its dS^T half stored as zeros); a grouped-query walk's later
# heads still compute theirs (a branch inside the loop cost spills), and so does the persistent walk
# (GluonBwdConfig.PERSISTENT: with the peeled step its causal loop spilled, sm_90: 9 spill
# instructions a consumer's loop against none, 268/432 spill bytes a thread against 152/220). False
# computes them, all zeros. At N queries a CTA of the first keys walks N / 64 steps, the last one 2:
# the skipped share is largest on short rows (at 512 queries one step in ten of the second group).
# dK, dV and dQ the same but for the sign of zero sums (test_the_order_switches_change_no_bit, H100,
# 2026-12-06: 8 passed). Timed on the H100 (2026-12-06, gluon_bwd.py --grid --rows <the 6 D=128
# lengths> --gluon fused --dq-first both --switch SKIP_DEAD_STEPS=0,1 --rounds 2 --rep 30;
# docs/gluon.md): faster in 20 of the 24 causal (row, variant) pairs, the causal default's variant
# (a step late, first) 0.913 -> 0.926x cuDNN in geometric mean over the 6 causal rows. On since.
# Read at each launch, as COMPACT_STATS.
SKIP_DEAD_STEPS = True
# the dK/dV kernel's epilogue through TMA: True writes each consumer group's dK and dV (scaled, in
# the inputs' 16-bit dtype) into its own K and V tiles in shared memory and sends each as one TMA
# bulk store (rows past Nk clipped by the descriptor), as the forward's TMA_STORE_O does with O; the
# K tiles once both groups are past their last dQ share (an mbarrier: those read both groups' K).
# False stores them from registers (64 4-byte stores a thread and tensor, 64-bit addresses, a row
# mask). Why: on short rows a CTA walks few steps and its epilogue is a large share of its time;
# cuDNN's backward pays the same Delta and dQ-cast passes as ours, so the gap there is the main
# kernel (H100, 2026-12-06: 1.16x cuDNN's at 512 and 1024 queries full, 1.26-1.30x causal), and the
# forward's TMA store of O gained 13-15 % on the 512 rows. The one-CTA-a-tile kernel, unsplit, with
# addressable outputs (_tma_dkdv); a split or the persistent walk keeps the register stores. The same
# values either way: the same bits as the register stores (test_the_tma_store_of_dk_dv_gives_the_register_stores_bits,
# H100, 2026-12-06: 11 passed with the launch-plan replay). Timed on the H100 (2026-12-06, gluon_bwd.py --grid
# --rows <the 6 D=128 lengths> --gluon fused --dq-first both --switch TMA_STORE_DKDV=0,1 --rounds 2 --rep 30;
# docs/gluon.md): over the 6 full D=128 rows 0.936 -> 0.971x cuDNN in geometric mean for the same-step share,
# 0.945 -> 0.972 with it first, 0.915 -> 0.966 a step late (512 queries 0.91 -> 1.00); causal 0.919 -> 0.954
# (same step), 0.910 -> 0.960 (a step late), but with the share first not (0.899 -> 0.893 same step, 0.932 ->
# 0.935 a step late; the causal default moved to the late share in the usual order). On since.
# Read at each launch, as COMPACT_STATS.
TMA_STORE_DKDV = True
# head dim 256 as a GluonBwdConfig's (hence BwdConfig's Gluon families 1, 3 and 4, the search's and the
# dispatcher's): the D=256 kernel (gluon_backward_wide.py, its configs checked by validate_wide: BLOCK_M 32,
# DQ_FUSED 0 or 1, so families 1 and 3). Written without a GPU (2026-12-06) and off until its GPU tests
# passed on an H100 the same day (docs/data/h100-2026-12-06e-gluon/: gemma2-d256-train-4k's backward 0.972x
# cuDNN with dQ fused, 1.555x the Triton kernel). Read by validate. On, gluon_backward_wide.py is in
# provenance.KERNEL_FILES (stored results name its source's hash; test_gluon_bwd_wide.py holds the two
# together); off, in UNTUNED_KERNEL_FILES.
WIDE_HEAD_DIM = True


@dataclasses.dataclass(frozen=True)
class GluonBwdConfig:
    """Launch config of the Gluon dK/dV kernel; ``validate`` before compiling.

    BLOCK_M: query rows per step (the N of the S^T and dP^T wgmmas, the K of dV's and dK's).
    BLOCK_N: keys per consumer warp group (a CTA covers 2 x BLOCK_N keys).
    NUM_BUFFERS: Q/dO ring slots in shared memory.
    PRODUCER_REGS / CONSUMER_REGS: registers per thread of the TMA warp's and of each
    consumer warp group's (setmaxnreg), in both kernels.
    DV_EARLY: 1 issues dV's wgmma before dS^T's arithmetic (more registers live).
    DQ_BLOCK_N / DQ_BUFFERS: the Gluon dQ kernel's keys per step and K/V ring slots (its
    consumers hold 64 query rows each); used where that kernel runs (``gluon_dq``).
    DQ_OVERLAP: 1 runs each block's dQ wgmma under the next block's S, dP and softmax.
    DQ_FUSED: 1 computes dQ in the dK/dV kernel instead (five matmuls, not seven): each step
    both consumers store dS^T to shared memory, each computes dQ = dS K for its half of the
    head dim over the CTA's 2 x BLOCK_N keys and sends it as one TMA bulk reduce-add into a
    zeroed fp32 buffer (FlashAttention-3's scheme; the order of the adds, hence dQ's last
    bits, varies from run to run). 2: the same, each step's share computed during the next
    step (four dS^T slots instead of two), so the two consumers are not held in lock-step
    (on the H200 the faster without causal masking, the slower with it). BLOCK_M 64 only
    (a wgmma's M); the other DQ_ fields unused.
    DQ_FIRST: 1 (DQ_FUSED configs only) issues a step's dQ share's two wgmmas before its dV and
    dK, waits for them alone, and stores the share and issues its reduce-add while dV and dK run;
    0 issues dV and dK first and waits for all four before the store. A step late (DQ_FUSED 2)
    the share's wgmmas need nothing of this step; in its own step (1) they wait for the other
    consumer's dS^T first, as before, but ahead of dV's and dK's issue. The same wgmmas on the
    same operands: the same bits. The trace (kernel_trace.BACKWARD) then counts the issue of dV
    and dK in "dQ: wgmma". Measured (H100, 2026-12-05, docs/gluon.md): a step late it gained
    1-4 % on 5 of 7 D=128 rows and lost 3 % on grid-d128-16384 full; in its own step it lost
    2-4 % causal and gained 1-7 % without the mask; the search chooses it per key.
    PERSISTENT: 1 launches at most one CTA per SM, each walking the tiles (2 x BLOCK_N keys of one
    unit) t x CTAs + its index, in reverse on odd rounds (a snake over the heaviest-first order):
    the producer loads the next tile's K and V once both consumers have handed the current
    ones back (after their last matmul, before their dK/dV epilogue), so a tile's epilogue and
    the next tile's first loads overlap, and the Q/dO ring and dS^T slots run on across tiles.
    For short calls, whose CTAs walk few steps (8 at 512 queries). Written 2026-12-05 without a
    GPU: not in the search space (BwdConfig) until its GPU tests have run; no trace (TRACE).
    """

    BLOCK_M: int = 64
    BLOCK_N: int = 64
    NUM_BUFFERS: int = 2
    PRODUCER_REGS: int = 24
    CONSUMER_REGS: int = 240
    DV_EARLY: int = 0
    DQ_BLOCK_N: int = 64
    DQ_BUFFERS: int = 2
    DQ_OVERLAP: int = 1
    DQ_FUSED: int = 0
    DQ_FIRST: int = 0
    PERSISTENT: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        head = f"m{self.BLOCK_M}n2x{self.BLOCK_N}b{self.NUM_BUFFERS}r{self.PRODUCER_REGS}/{self.CONSUMER_REGS}"
        head += "dv" if self.DV_EARLY else ""
        head += "P" if self.PERSISTENT else ""
        if self.DQ_FUSED:
            return head + ("/fused-dq" if self.DQ_FUSED == 1 else "/fused-dq-late") + (
                "-first" if self.DQ_FIRST else "")
        return head + f"/dq-n{self.DQ_BLOCK_N}b{self.DQ_BUFFERS}{'' if self.DQ_OVERLAP else 'seq'}"

    def dq_shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        """The dQ kernel's bytes: both consumers' Q and dO tiles, the K/V ring, the mbarriers."""
        e = torch.empty((), dtype=dtype).element_size()
        tiles = 2 * 2 * DQ_BLOCK_M * head_dim * e + 2 * self.DQ_BUFFERS * self.DQ_BLOCK_N * head_dim * e
        return tiles + (2 + 3 * self.DQ_BUFFERS) * _BARRIER_BYTES + _SHARED_SLACK

    def dq_registers_needed(self, head_dim: int) -> int:
        """The dQ kernel's fp32 dQ, S and dP tiles and 16-bit dS (two with the overlap: the
        previous block's, read by its dQ wgmma, and this one's), per consumer thread, plus spare."""
        ds_tiles = 2 if self.DQ_OVERLAP else 1
        return (DQ_BLOCK_M * head_dim + 2 * DQ_BLOCK_M * self.DQ_BLOCK_N
                + ds_tiles * DQ_BLOCK_M * self.DQ_BLOCK_N // 2) // (32 * CONSUMER_WARPS) + _BWD_SPARE_REGS

    def shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of shared memory: the CTA's K and V tiles, the Q/dO ring, the mbarriers; with
        DQ_FUSED also the dS^T slots (two per consumer, four a step late) and the two
        consumers' fp32 dQ shares; with COMPACT_STATS the consumers' exchange of a step's row
        statistics (triton's layout-conversion scratch, counted as a BLOCK_M fp32 vector each);
        with CONSUMER_TURNS the turns' two mbarriers; PERSISTENT the K/V hand-back mbarrier,
        TMA_STORE_DKDV its K-free one."""
        if head_dim == 256:  # the D=256 kernel's
            from flashtune.kernels.gluon_backward_wide import wide_shared_memory

            return wide_shared_memory(self, dtype)
        e = torch.empty((), dtype=dtype).element_size()
        tiles = 2 * 2 * self.BLOCK_N * head_dim * e + 2 * self.NUM_BUFFERS * self.BLOCK_M * head_dim * e
        if COMPACT_STATS:
            tiles += 2 * self.BLOCK_M * 4
        # (the K/V hand-back mbarrier: PERSISTENT's, or TMA_STORE_DKDV's K-free one)
        kv_free = 1 if self.PERSISTENT or TMA_STORE_DKDV else 0
        barriers = (2 + 3 * self.NUM_BUFFERS + (2 if CONSUMER_TURNS else 0) + kv_free) * _BARRIER_BYTES
        if self.DQ_FUSED:
            slots = 4 if self.DQ_FUSED == 2 else 2
            tiles += 2 * slots * self.BLOCK_N * self.BLOCK_M * e + 2 * self.BLOCK_M * (head_dim // 2) * 4
            barriers += slots * _BARRIER_BYTES
        return tiles + barriers + _SHARED_SLACK

    def maxnreg(self) -> int:
        """The kernels' maxnreg (gluon_forward.kernel_maxnreg)."""
        return kernel_maxnreg(self.PRODUCER_REGS, self.CONSUMER_REGS)

    def consumer_registers_needed(self, head_dim: int) -> int:
        """fp32 dK and dV accumulators, fp32 S^T and dP^T, 16-bit P^T and dS^T (wgmma A
        operands), per thread of a consumer warp group, plus spare (the fused dQ share, fp32
        BLOCK_M x head_dim / 2, lives after S^T and dP^T are dead: not counted)."""
        threads = 32 * CONSUMER_WARPS
        return (2 * self.BLOCK_N * head_dim + 2 * self.BLOCK_N * self.BLOCK_M
                + self.BLOCK_N * self.BLOCK_M) // threads + _BWD_SPARE_REGS

    def validate(self, head_dim: int, dtype: torch.dtype, device=None) -> "GluonBwdConfig":
        """Raise ConfigError naming the field if this config cannot run; return self
        (``device`` as GluonFwdConfig.validate's)."""
        check_int_fields(self)
        if head_dim == 256 and WIDE_HEAD_DIM:  # the D=256 kernel's own rules
            from flashtune.kernels.gluon_backward_wide import validate_wide

            return validate_wide(self, dtype, device)
        if self.BLOCK_M not in (32, 64, 128):
            raise ConfigError(f"BLOCK_M: expected 32, 64 or 128 query rows per step, got {self.BLOCK_M}")
        if self.BLOCK_N != 64:
            raise ConfigError(f"BLOCK_N: expected 64 keys per consumer warp group, got {self.BLOCK_N}")
        if self.DV_EARLY not in (0, 1):
            raise ConfigError(f"DV_EARLY: expected 0 or 1, got {self.DV_EARLY}")
        if not 2 <= self.NUM_BUFFERS <= 4:
            raise ConfigError(f"NUM_BUFFERS: expected 2 to 4 Q/dO slots, got {self.NUM_BUFFERS}")
        if self.DQ_OVERLAP not in (0, 1):
            raise ConfigError(f"DQ_OVERLAP: expected 0 or 1, got {self.DQ_OVERLAP}")
        if self.DQ_FUSED not in (0, 1, 2):
            raise ConfigError(f"DQ_FUSED: expected 0, 1 or 2, got {self.DQ_FUSED}")
        if self.DQ_FIRST not in (0, 1) or (self.DQ_FIRST and not self.DQ_FUSED):
            raise ConfigError(f"DQ_FIRST: expected 0 or 1, and 1 only with DQ_FUSED 1 or 2 (the fused dQ share's "
                              f"order), got {self.DQ_FIRST} with DQ_FUSED {self.DQ_FUSED}")
        if self.PERSISTENT not in (0, 1):
            raise ConfigError(f"PERSISTENT: expected 0 or 1, got {self.PERSISTENT}")
        if self.DQ_FUSED and self.BLOCK_M != 64:
            raise ConfigError(f"BLOCK_M: the fused dQ (DQ_FUSED) takes 64 query rows per step (a wgmma's M), "
                              f"got {self.BLOCK_M}")
        if self.DQ_BLOCK_N not in (64, 128):
            raise ConfigError(f"DQ_BLOCK_N: expected 64 or 128 keys per step of the dQ kernel, got {self.DQ_BLOCK_N}")
        if not 2 <= self.DQ_BUFFERS <= 4:
            raise ConfigError(f"DQ_BUFFERS: expected 2 to 4 K/V slots of the dQ kernel, got {self.DQ_BUFFERS}")
        check_register_split(self.PRODUCER_REGS, self.CONSUMER_REGS)
        if head_dim not in HEAD_DIMS:
            raise ConfigError(f"head_dim: the Gluon backward supports {HEAD_DIMS}, got {head_dim}")
        if dtype not in DTYPES:
            raise ConfigError(f"dtype: the Gluon backward supports float16 and bfloat16, got {dtype}")
        needed = self.consumer_registers_needed(head_dim)
        if needed > self.CONSUMER_REGS:
            raise ConfigError(f"BLOCK_M: {self.BLOCK_M} query rows with BLOCK_N {self.BLOCK_N} keys and head_dim "
                              f"{head_dim} need about {needed} registers per consumer thread, CONSUMER_REGS is "
                              f"{self.CONSUMER_REGS}; use a smaller BLOCK_M")
        smem = self.shared_memory(head_dim, dtype)
        if smem > SM90_SHARED_MEMORY:
            raise ConfigError(f"NUM_BUFFERS: needs {smem} bytes of shared memory, sm_90 allows "
                              f"{SM90_SHARED_MEMORY}; use fewer buffers or a smaller BLOCK_M")
        needed = self.dq_registers_needed(head_dim)
        if needed > self.CONSUMER_REGS:
            raise ConfigError(f"DQ_BLOCK_N: {self.DQ_BLOCK_N} keys a step of the dQ kernel at head_dim {head_dim} "
                              f"need about {needed} registers per consumer thread, CONSUMER_REGS is "
                              f"{self.CONSUMER_REGS}; use 64")
        smem = self.dq_shared_memory(head_dim, dtype)
        if smem > SM90_SHARED_MEMORY:
            raise ConfigError(f"DQ_BUFFERS: the dQ kernel needs {smem} bytes of shared memory, sm_90 allows "
                              f"{SM90_SHARED_MEMORY}; use fewer buffers or DQ_BLOCK_N 64")
        if device is not None:
            check_sm90_device(device, "the Gluon backward")
        return self


def default_gluon_bwd_config(head_dim: int) -> GluonBwdConfig:
    """The starting point per head dim: FlashAttention-3's tile (2 x 64 keys, 64 queries a
    step); unmeasured until benchmarks/gluon_bwd.py runs on an H200."""
    return GluonBwdConfig(BLOCK_M=64, NUM_BUFFERS=2 if head_dim > 64 else 3)


# ----------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------
@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """A TMA bulk reduce-add of shared-memory tile ``src`` into ``tensor_desc``'s tensor at
    ``coord`` (cp.reduce.async.bulk.tensor .add; completion as tma.store_wait counts it).
    Triton 3.6's Gluon builder has the op (``create_async_tma_reduce``), its Hopper ``tma``
    module no wrapper for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


_T_STEP = gl.constexpr(kernel_trace.BACKWARD.events)  # trace slots per step (kernel_trace.BACKWARD)

@gluon.jit
def _exp2_split(x, POLY: gl.constexpr, ASM: gl.constexpr):
    """2^x, elementwise: gl.exp2 with POLY 0, else ``exp2_split_asm(POLY)`` (ASM) on each 4 of a
    thread's values (POLY_EXP2)."""
    if POLY == 0:
        return gl.exp2(x)
    else:
        return gl.inline_asm_elementwise(ASM, "=f,=f,=f,=f,f,f,f,f", [x], dtype=gl.float32, is_pure=True, pack=4)


@gluon.jit
def _step(it, n_qb, first_qb, head0):
    """The walk's step ``it``: (query head, query block) of the CTA's heads x blocks."""
    return head0 + it // n_qb, first_qb + it % n_qb


@gluon.jit
def _tile_params(tile, n_kb, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off,
                 CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Tile ``tile`` of the dK/dV kernel's n_kb x N_UNITS (a unit being one (batch, K/V head,
    split) in that order; the key block and unit from the index, gluon_forward.lpt_tile):
    (split, batch, K/V head, first key, first query block, query blocks per head, first query
    head, steps). The query blocks it walks, per query head of its share of the group: causal
    starts at the block of the first query that sees its first key (key <= query + causal_off);
    a split takes GROUP // SPLIT_H heads and one of SPLIT_Q chunks of the blocks."""
    kb, unit = lpt_tile(tile, n_kb, N_UNITS, LPT_UNITS)
    split = unit % (SPLIT_H * SPLIT_Q)
    off_hk = (unit // (SPLIT_H * SPLIT_Q)) % H_KV
    off_b = unit // (SPLIT_H * SPLIT_Q * H_KV)
    start_n = kb * (2 * BLOCK_N)
    end_qb = gl.cdiv(N_Q, BLOCK_M)
    first_qb = 0
    if CAUSAL:
        first_qb = gl.minimum(gl.maximum(start_n - causal_off, 0) // BLOCK_M, end_qb)
    chunk = gl.cdiv(end_qb - first_qb, SPLIT_Q)
    first_qb = gl.minimum(first_qb + (split % SPLIT_Q) * chunk, end_qb)
    n_qb = gl.minimum(chunk, end_qb - first_qb)
    heads = GROUP // SPLIT_H
    head0 = off_hk * GROUP + (split // SPLIT_Q) * heads
    return split, off_b, off_hk, start_n, first_qb, n_qb, head0, heads * n_qb


@gluon.jit
def _walk_rounds(N_K, N_UNITS, BLOCK_N: gl.constexpr):
    """PERSISTENT: the rounds of the walk, one tile a CTA each (the last one maybe partial)."""
    return gl.cdiv(gl.cdiv(N_K, 2 * BLOCK_N) * N_UNITS, gl.num_programs(0))


@gluon.jit
def _walk_tile(t, N_K, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off, CAUSAL: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """PERSISTENT: this CTA's tile of round ``t`` (round t's CTAs in grid order, in reverse on odd
    rounds: a snake over the heaviest-first order, as the persistent forward's), as (whether the
    round has one for this CTA, *_tile_params): the one walk the producer and consumers share."""
    pid = gl.program_id(0)
    n_prog = gl.num_programs(0)
    if t % 2 == 1:
        pid = n_prog - 1 - pid
    tile = t * n_prog + pid
    n_kb = gl.cdiv(N_K, 2 * BLOCK_N)
    split, off_b, off_hk, start_n, first_qb, n_qb, head0, n_steps = _tile_params(
        tile, n_kb, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off, CAUSAL, BLOCK_M, BLOCK_N)
    return tile < n_kb * N_UNITS, split, off_b, off_hk, start_n, first_qb, n_qb, head0, n_steps


@gluon.jit
def _producer(desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready,
              q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0, trace, pid, kv_empty, N_K, N_Q,
              causal_off, H_KV, GROUP, SPLIT_H, SPLIT_Q, LPT_UNITS, N_UNITS, CAUSAL: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, TRACE: gl.constexpr,
              PERSISTENT: gl.constexpr):
    """The TMA warp: the CTA's tile (its values given), or PERSISTENT every tile of its walk
    (_walk_tile), the Q/dO ring's slots counted across them."""
    if PERSISTENT:
        g0 = 0
        for t in range(_walk_rounds(N_K, N_UNITS, BLOCK_N)):
            here, _split, t_b, t_hk, t_n, t_qb, t_nqb, t_h0, t_steps = _walk_tile(
                t, N_K, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off, CAUSAL, BLOCK_M, BLOCK_N)
            if here:
                if t > 0:  # both consumers done with the previous tile's K and V
                    mbarrier.wait(kv_empty, (t - 1) & 1)
                _producer_tile(desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready,
                               q_ready, do_ready, q_empty, t_b, t_hk, t_n, t_qb, t_nqb, t_steps, t_h0, g0, trace,
                               pid, BLOCK_M, BLOCK_N, NUM_BUFFERS, False)
                g0 += t_steps
    else:
        _producer_tile(desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready,
                       do_ready, q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0, 0, trace, pid,
                       BLOCK_M, BLOCK_N, NUM_BUFFERS, TRACE)


@gluon.jit
def _producer_tile(desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready,
                   q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0, g0, trace, pid,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, TRACE: gl.constexpr):
    """One tile's loads: its K and V, then its steps' Q and dO, the ring's slot of step ``it``
    being (g0 + it) % NUM_BUFFERS (g0: the CTA's steps before this tile)."""
    _trace_start(trace, pid, n_steps, 0, first_qb, TRACE)
    # the two consumers' K and V tiles, once (rows past Nk read as zeros)
    for w in gl.static_range(2):
        mbarrier.expect(kv_ready.index(w), desc_k.block_type.nbytes + desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [off_b, off_hk, start_n + w * BLOCK_N, 0], kv_ready.index(w),
                                        k_smem.index(w))
        tma.async_copy_global_to_shared(desc_v, [off_b, off_hk, start_n + w * BLOCK_N, 0], kv_ready.index(w),
                                        v_smem.index(w))
    _stamp(trace, _T_CLK_Q, TRACE)
    _load_q_do_ring(desc_q, desc_do, q_bufs, do_bufs, q_ready, do_ready, q_empty, off_b, first_qb, n_qb, n_steps,
                    head0, g0, trace, BLOCK_M, NUM_BUFFERS, TRACE)
    _stamp(trace, _T_CLK_BLOCKS, TRACE)


@gluon.jit
def _load_q_do_ring(desc_q, desc_do, q_bufs, do_bufs, q_ready, do_ready, q_empty, off_b, first_qb, n_qb, n_steps,
                    head0, g0, trace, BLOCK_M: gl.constexpr, NUM_BUFFERS: gl.constexpr, TRACE: gl.constexpr):
    """The producer's steps: each step's Q and dO tiles into ring slot (g0 + it) % NUM_BUFFERS once
    the consumers have freed it (the D=128/64 kernels' and the D=256 kernel's; ``trace`` is read
    only with TRACE)."""
    for it in range(n_steps):
        h, qb = _step(it, n_qb, first_qb, head0)
        g = g0 + it
        s = g % NUM_BUFFERS
        ev = trace + _T_HEAD + _T_STEP * it
        _stamp(ev, 0, TRACE)
        # a fresh mbarrier counts as having completed the phase before its first
        mbarrier.wait(q_empty.index(s), ((g // NUM_BUFFERS) & 1) ^ 1)
        _stamp(ev, 1, TRACE)
        mbarrier.expect(q_ready.index(s), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [off_b, h, qb * BLOCK_M, 0], q_ready.index(s), q_bufs.index(s))
        mbarrier.expect(do_ready.index(s), desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_do, [off_b, h, qb * BLOCK_M, 0], do_ready.index(s), do_bufs.index(s))
        _stamp(ev, 2, TRACE)
    _trace_end(trace, TRACE)


@gluon.jit
def _dq_share_issue(which, p, k_smem, ds_smem, ds_ready, ev, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, DS_SLOTS: gl.constexpr, TRACE: gl.constexpr):
    """Step p's dQ share of consumer ``which``, issued: dQ[:, half] = dS K[:, half] over both
    groups' keys once both stored their dS^T (two async wgmmas: A dS^T transposed from shared
    memory, B a column slice of each K tile). Returns (dq, ds0, ds1, k0, k1), the accumulator
    in flight and its operands. TRACE: stamps event 8 (kernel_trace.BACKWARD)."""
    HALF: gl.constexpr = HEAD_DIM // 2
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HALF, 16])
    slot = p % DS_SLOTS
    mbarrier.wait(ds_ready.index(slot), (p // DS_SLOTS) & 1)
    _stamp(ev, 8, TRACE)
    ds0 = ds_smem.index(slot * 2).permute((1, 0))
    ds1 = ds_smem.index(slot * 2 + 1).permute((1, 0))
    k0 = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).slice(which * HALF, HALF, dim=1)
    k1 = k_smem.index(1).reshape([BLOCK_N, HEAD_DIM]).slice(which * HALF, HALF, dim=1)
    dq = warpgroup_mma(ds0, k0, gl.zeros([BLOCK_M, HALF], gl.float32, dq_layout), use_acc=False, is_async=True)
    dq = warpgroup_mma(ds1, k1, dq, is_async=True)
    return dq, ds0, ds1, k0, k1


@gluon.jit
def _dq_share_send(which, dq, h, qb, dq_smem, desc_dqa, off_b, sm_scale, ev, HEAD_DIM: gl.constexpr,
                   BLOCK_M: gl.constexpr, TRACE: gl.constexpr, SCALING: gl.constexpr):
    """A finished dQ share ``dq``, times sm_scale (SCALING 1: it is already; 2: sent as it is, the cast of the dQ
    buffer scales it), sent as one TMA bulk reduce-add into the fp32 dQ buffer at (batch, query head h, query block
    qb) through consumer ``which``'s staging tile, once the previous share's reduce has read it. TRACE: stamps
    events 10 and 11."""
    HALF: gl.constexpr = HEAD_DIM // 2
    dq_buf = dq_smem.index(which)
    tma.store_wait(0)  # the previous share's reduce has read the buffer
    _stamp(ev, 10, TRACE)
    gl.thread_barrier()
    if SCALING != 0:
        dq_buf.reshape([BLOCK_M, HALF]).store(dq)
    else:
        dq_buf.reshape([BLOCK_M, HALF]).store(dq * sm_scale)
    fence_async_shared()
    gl.thread_barrier()
    _tma_reduce_add(desc_dqa, [off_b, h, qb * BLOCK_M, which * HALF], dq_buf)
    _stamp(ev, 11, TRACE)


@gluon.jit
def _fused_dq_share(which, p, h, qb, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b, sm_scale, ev,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DS_SLOTS: gl.constexpr,
                    TRACE: gl.constexpr, SCALING: gl.constexpr):
    """Step p's dQ share of consumer ``which`` (``_dq_share_issue``), waited for with every
    wgmma of the group, then sent (``_dq_share_send``). TRACE: stamps events 8 to 11 of the
    step's trace slots ``ev`` (kernel_trace.BACKWARD)."""
    dq, ds0, ds1, k0, k1 = _dq_share_issue(which, p, k_smem, ds_smem, ds_ready, ev, HEAD_DIM, BLOCK_M, BLOCK_N,
                                           DS_SLOTS, TRACE)
    dq, _d0, _d1, _k0, _k1 = warpgroup_mma_wait(0, deps=(dq, ds0, ds1, k0, k1))
    _stamp(ev, 9, TRACE)
    _dq_share_send(which, dq, h, qb, dq_smem, desc_dqa, off_b, sm_scale, ev, HEAD_DIM, BLOCK_M, TRACE, SCALING)


@gluon.jit
def _due_dq_share(which, g, it, h, qb, h_before, qb_before, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b,
                  sm_scale, ev, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  FUSED_DQ: gl.constexpr, TRACE: gl.constexpr, SCALING: gl.constexpr):
    """Step ``it``'s (walk index g, at query head h and block qb) dQ share in the step's usual
    order (``_fused_dq_share``): FUSED_DQ 1 this step's, 2 the previous step's (h_before,
    qb_before; none at the first step, so the groups may drift a step apart); a step without one
    stamps its four dQ events at once (events 8 to 11)."""
    DS_SLOTS: gl.constexpr = 4 if FUSED_DQ == 2 else 2
    if FUSED_DQ == 1:
        _fused_dq_share(which, g, h, qb, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b, sm_scale, ev,
                        HEAD_DIM, BLOCK_M, BLOCK_N, DS_SLOTS, TRACE, SCALING)
    elif FUSED_DQ == 2:  # (nested: a constexpr `and` a runtime value is not folded)
        if it > 0:
            _fused_dq_share(which, g - 1, h_before, qb_before, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b,
                            sm_scale, ev, HEAD_DIM, BLOCK_M, BLOCK_N, DS_SLOTS, TRACE, SCALING)
        else:
            for e in gl.static_range(8, 12):
                _stamp(ev, e, TRACE)
    else:
        for e in gl.static_range(8, 12):
            _stamp(ev, e, TRACE)


@gluon.jit
def _dead_step(which, g, it, h, qb, h_before, qb_before, q_ready, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, turn,
               off_b, sm_scale, ev, phase, s, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               FUSED_DQ: gl.constexpr, TURNS: gl.constexpr, TRACE: gl.constexpr, SCALING: gl.constexpr):
    """Step ``it`` (walk index g, ring slot s) of consumer ``which`` where every query of the
    block comes before the group's first key (SKIP_DEAD_STEPS): P^T and dS^T would be all
    zeros, so no S^T, dP^T, exponentials, dV or dK. What the other partitions count on still
    happens in order: the turns, a zero dS^T half in the step's slot with its dS-ready
    arrival, and the dQ share that is due (its own half of dQ over both groups' keys). The
    wait for the slot's Q keeps this group's release of the slot (after the return) in the
    slot's current phase: the group may otherwise be a full ring ahead of the other."""
    _turn_wait(turn, which, g, TURNS)
    mbarrier.wait(q_ready.index(s), phase)
    _turn_pass(turn, which, g, TURNS)
    for e in gl.static_range(1, 8):
        _stamp(ev, e, TRACE)
    if FUSED_DQ:
        DS_SLOTS: gl.constexpr = 4 if FUSED_DQ == 2 else 2
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_M, 16])
        ds_smem.index((g % DS_SLOTS) * 2 + which).store(gl.zeros([BLOCK_N, BLOCK_M], ds_smem.dtype, s_layout))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_ready.index(g % DS_SLOTS))
    _due_dq_share(which, g, it, h, qb, h_before, qb_before, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa, off_b,
                  sm_scale, ev, HEAD_DIM, BLOCK_M, BLOCK_N, FUSED_DQ, TRACE, SCALING)
    _stamp(ev, 12, TRACE)


@gluon.jit
def _turn_wait(turn, which, it, TURNS: gl.constexpr):
    """Before step ``it``'s S^T and dP^T (CONSUMER_TURNS): consumer 0 waits for consumer 1's
    P^T of the step before, consumer 1 for consumer 0's of this step (a fresh mbarrier counts
    as having completed the phase before its first: consumer 0's first wait passes)."""
    if TURNS == 2:
        mbarrier.wait(turn.index(which), (it & 1) ^ (1 - which))
    elif TURNS == 1:
        if it == 0:
            mbarrier.wait(turn.index(which), 1 - which)


@gluon.jit
def _turn_pass(turn, which, it, TURNS: gl.constexpr):
    """Once step ``it``'s P^T is computed: the other consumer's turn (CONSUMER_TURNS)."""
    if TURNS == 2:
        mbarrier.arrive(turn.index(1 - which))
    elif TURNS == 1:
        if it == 0:
            mbarrier.arrive(turn.index(1 - which))


@gluon.jit
def _consumer(which, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, DK, DV, LSE, DELTA,
              qk_scale, sm_scale, p_shift, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
              stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
              n_steps, head0, desc_dqa, ds_smem, dq_smem, ds_ready, turn, trace, pid, kv_empty, stride_dks,
              stride_dvs, H_KV, GROUP, SPLIT_H, SPLIT_Q, LPT_UNITS, N_UNITS, CAUSAL: gl.constexpr,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
              DV_EARLY: gl.constexpr, FUSED_DQ: gl.constexpr, TRACE: gl.constexpr, COMPACT: gl.constexpr,
              TURNS: gl.constexpr, DQ_FIRST: gl.constexpr, SCALING: gl.constexpr, POLY: gl.constexpr,
              POLY_ASM: gl.constexpr, STEPS: gl.constexpr, PERSISTENT: gl.constexpr, SKIP_DEAD: gl.constexpr,
              TMA_DKDV: gl.constexpr):
    """Consumer ``which``: the CTA's tile (its values given; DK and DV at its split's slot), or
    PERSISTENT every tile of its walk in the producer's order (_walk_tile, _tile_params), the
    steps counted across tiles for the rings and the dS^T slots, K and V handed back through
    ``kv_empty`` after each tile's last matmul."""
    if PERSISTENT:
        g0 = 0
        for t in range(_walk_rounds(N_K, N_UNITS, BLOCK_N)):
            here, t_split, t_b, t_hk, t_n, t_qb, t_nqb, t_h0, t_steps = _walk_tile(
                t, N_K, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off, CAUSAL, BLOCK_M, BLOCK_N)
            if here:
                _consumer_tile(which, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty,
                               DK + t_split.to(gl.int64) * stride_dks, DV + t_split.to(gl.int64) * stride_dvs,
                               LSE, DELTA, qk_scale, sm_scale, p_shift, stride_dkb, stride_dkh, stride_dkn,
                               stride_dkd, stride_dvb, stride_dvh, stride_dvn, stride_dvd, t_b, t_hk, H, N_Q, N_K,
                               causal_off, t_n, t_qb, t_nqb, t_steps, t_h0, desc_dqa, ds_smem, dq_smem, ds_ready,
                               turn, trace, pid, g0, t & 1, kv_empty, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N,
                               NUM_BUFFERS, DV_EARLY, FUSED_DQ, False, COMPACT, TURNS, DQ_FIRST, SCALING, POLY,
                               POLY_ASM, STEPS, True, False, False)  # (SKIP_DEAD_STEPS: not here, see its comment)
                g0 += t_steps
    else:
        _consumer_tile(which, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, DK, DV, LSE,
                       DELTA, qk_scale, sm_scale, p_shift, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                       stride_dvb, stride_dvh, stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off,
                       start_n, first_qb, n_qb, n_steps, head0, desc_dqa, ds_smem, dq_smem, ds_ready, turn, trace,
                       pid, 0, 0, kv_empty, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, DV_EARLY, FUSED_DQ,
                       TRACE, COMPACT, TURNS, DQ_FIRST, SCALING, POLY, POLY_ASM, STEPS, False, SKIP_DEAD,
                       TMA_DKDV)


@gluon.jit
def _consumer_tile(which, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, DK, DV, LSE,
                   DELTA, qk_scale, sm_scale, p_shift, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb,
                   stride_dvh, stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb,
                   n_qb, n_steps, head0, desc_dqa, ds_smem, dq_smem, ds_ready, turn, trace, pid, g0, kv_phase,
                   kv_empty, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, DV_EARLY: gl.constexpr,
                   FUSED_DQ: gl.constexpr, TRACE: gl.constexpr, COMPACT: gl.constexpr, TURNS: gl.constexpr,
                   DQ_FIRST: gl.constexpr, SCALING: gl.constexpr, POLY: gl.constexpr, POLY_ASM: gl.constexpr,
                   STEPS: gl.constexpr, RELEASE_KV: gl.constexpr, SKIP_DEAD: gl.constexpr,
                   TMA_DKDV: gl.constexpr):
    """One tile of consumer ``which``: its steps, the step ``it``'s ring slot, dS^T slot and
    turn counted from g0 + it (g0: the CTA's steps before this tile), its K and V from the
    ``kv_phase`` of their mbarrier; RELEASE_KV: an arrival on ``kv_empty`` once no matmul of
    this consumer reads them, before the dK/dV epilogue. TMA_DKDV: DK and DV are TMA descriptors,
    the tiles go out through this group's K and V tiles in shared memory (``kv_empty`` then the
    mbarrier both groups pass once no dQ share reads a K tile)."""
    # SCALING 1 (SCALE_IN_P): lse less p_shift = log2(sm_scale), so P^T and dS^T come scaled
    # TRACE: per step, the events of kernel_trace.BACKWARD (a step without a dQ share stamps
    # its four dQ events at once)
    _trace_start(trace, pid, n_steps, 0, first_qb, TRACE)
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
    h_prev = head0
    qb_prev = first_qb

    mbarrier.wait(kv_ready.index(which), kv_phase)
    _stamp(trace, _T_CLK_Q, TRACE)
    k = k_smem.index(which).reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.index(which).reshape([BLOCK_N, HEAD_DIM])
    # STEPS: the walk's position counted step by step, the previous step's one step back from it (with
    # h_prev and qb_prev carried beside h_next and qb_next, the H100 of 2026-12-05 sent the late dQ shares
    # (FUSED_DQ 2) to wrong rows, dK and dV right: test_the_order_switches_change_no_bit; cause not isolated)
    h_next = head0
    qb_next = first_qb
    it0 = 0
    if CAUSAL:  # SKIP_DEAD_STEPS: the walk's first step, if every query of it precedes these keys
        if SKIP_DEAD:
            if n_steps > 0 and first_qb * BLOCK_M + (BLOCK_M - 1) + causal_off < key0:
                _stamp(trace + _T_HEAD, 0, TRACE)
                _dead_step(which, g0, 0, head0, first_qb, head0, first_qb, q_ready, k_smem, ds_smem, dq_smem,
                           ds_ready, desc_dqa, turn, off_b, sm_scale, trace + _T_HEAD, (g0 // NUM_BUFFERS) & 1,
                           g0 % NUM_BUFFERS, HEAD_DIM, BLOCK_M, BLOCK_N, FUSED_DQ, TURNS, TRACE, SCALING)
                gl.thread_barrier()
                mbarrier.arrive(q_empty.index(g0 % NUM_BUFFERS))
                _stamp(trace + _T_HEAD, 13, TRACE)
                it0 = 1
                wrap = (n_qb == 1).to(gl.int32)
                h_next = head0 + wrap
                qb_next = first_qb + 1 - wrap * n_qb
    for it in range(it0, n_steps):
        if STEPS:
            h = h_next
            qb = qb_next
            back = (qb == first_qb).to(gl.int32)
            h_before = h - back
            qb_before = qb - 1 + back * n_qb
        else:
            h, qb = _step(it, n_qb, first_qb, head0)
            h_before = h_prev
            qb_before = qb_prev
        g = g0 + it  # the step's index in the CTA's walk (the rings', the dS^T slots', the turns')
        s = g % NUM_BUFFERS
        phase = (g // NUM_BUFFERS) & 1
        ev = trace + _T_HEAD + _T_STEP * it
        _stamp(ev, 0, TRACE)
        rows = qb * BLOCK_M + cols  # the queries, along the columns of S^T
        row_base = (off_b.to(gl.int64) * H + h) * N_Q
        # queries past Nq: lse +inf makes their P 0, Delta 0 their dS
        if COMPACT:  # one value per thread now, the columns where used (COMPACT_STATS)
            rows_c = qb * BLOCK_M + gl.arange(0, BLOCK_M, layout=stats_layout)
            lse_c = gl.load(LSE + row_base + rows_c, mask=rows_c < N_Q, other=float("inf"))
            if SCALING == 1:
                lse_c = lse_c - p_shift
            delta_c = gl.load(DELTA + row_base + rows_c, mask=rows_c < N_Q, other=0.0)
        else:
            lse = gl.load(LSE + row_base + rows, mask=rows < N_Q, other=float("inf"))
            if SCALING == 1:
                lse = lse - p_shift
            delta = gl.load(DELTA + row_base + rows, mask=rows < N_Q, other=0.0)
        q = q_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        do = do_bufs.index(s).reshape([BLOCK_M, HEAD_DIM])
        _turn_wait(turn, which, g, TURNS)  # (the trace counts it in the wait for Q)
        mbarrier.wait(q_ready.index(s), phase)
        _stamp(ev, 1, TRACE)
        st = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(s), phase)
        _stamp(ev, 2, TRACE)
        dpt = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        st, _k, _q = warpgroup_mma_wait(1, deps=(st, k, q))
        _stamp(ev, 3, TRACE)
        if COMPACT:
            lse = gl.convert_layout(lse_c, gl.SliceLayout(0, s_layout))
        pt = _exp2_split(st * qk_scale - lse[None, :], POLY, POLY_ASM)
        # causal: the blocks on the diagonal (some query before some key of these rows)
        if CAUSAL:
            if qb * BLOCK_M + causal_off < key0 + BLOCK_N - 1:
                pt = gl.where(keys[:, None] <= rows[None, :] + causal_off, pt, 0.0)
        pt16 = gl.convert_layout(pt.to(q.dtype), a_layout)
        _turn_pass(turn, which, g, TURNS)
        if DV_EARLY:  # dV's wgmma runs under dS^T's arithmetic (P^T's 16-bit copy stays live)
            dv = warpgroup_mma(pt16, do, dv, is_async=True)
            _stamp(ev, 4, TRACE)
            dpt, _v, _do = warpgroup_mma_wait(1, deps=(dpt, v, do))
        else:  # dV after dS^T: fewer registers live at once
            _stamp(ev, 4, TRACE)
            dpt, _v, _do = warpgroup_mma_wait(0, deps=(dpt, v, do))
        _stamp(ev, 5, TRACE)
        if COMPACT:
            delta = gl.convert_layout(delta_c, gl.SliceLayout(0, s_layout))
        dst = pt * (dpt - delta[None, :])
        dst16 = gl.convert_layout(dst.to(q.dtype), a_layout)
        if FUSED_DQ:  # dS^T to shared memory, where both groups' halves make the CTA's dS
            ds_smem.index((g % DS_SLOTS) * 2 + which).store(dst.to(q.dtype))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ds_ready.index(g % DS_SLOTS))
        _stamp(ev, 6, TRACE)
        if DQ_FIRST and FUSED_DQ != 0:
            # the dQ share's wgmmas ahead of dV's and dK's, its store and reduce-add under them
            _stamp(ev, 7, TRACE)
            if FUSED_DQ == 1:  # this step's
                p_share = g
                share_h = h
                share_qb = qb
            else:  # the previous step's; at the first step its own, computed and not sent
                p_share = gl.maximum(g - 1, g0)
                share_h = h_before
                share_qb = qb_before
            dq, _d0, _d1, _k0, _k1 = _dq_share_issue(which, p_share, k_smem, ds_smem, ds_ready, ev, HEAD_DIM,
                                                     BLOCK_M, BLOCK_N, DS_SLOTS, TRACE)
            if not DV_EARLY:
                dv = warpgroup_mma(pt16, do, dv, is_async=True)
            dk = warpgroup_mma(dst16, q, dk, is_async=True)
            # the share's two wgmmas done (with DV_EARLY dV's too, issued before them); dK, dV in flight
            dq, _d0, _d1, _k0, _k1 = warpgroup_mma_wait(1 if DV_EARLY else 2, deps=(dq, _d0, _d1, _k0, _k1))
            _stamp(ev, 9, TRACE)
            if it >= FUSED_DQ - 1:
                _dq_share_send(which, dq, share_h, share_qb, dq_smem, desc_dqa, off_b, sm_scale, ev, HEAD_DIM,
                               BLOCK_M, TRACE, SCALING)
            else:
                _stamp(ev, 10, TRACE)
                _stamp(ev, 11, TRACE)
        else:
            if not DV_EARLY:
                dv = warpgroup_mma(pt16, do, dv, is_async=True)
            dk = warpgroup_mma(dst16, q, dk, is_async=True)
            _stamp(ev, 7, TRACE)
            _due_dq_share(which, g, it, h, qb, h_before, qb_before, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa,
                          off_b, sm_scale, ev, HEAD_DIM, BLOCK_M, BLOCK_N, FUSED_DQ, TRACE, SCALING)
        dv, dk, _p, _ds, _do2, _q2 = warpgroup_mma_wait(0, deps=(dv, dk, pt16, dst16, do, q))
        _stamp(ev, 12, TRACE)
        # every warp of the group is done with the slot before its one arrival
        gl.thread_barrier()
        mbarrier.arrive(q_empty.index(s))
        _stamp(ev, 13, TRACE)
        if STEPS:  # the next step's (query head, query block), as _step gives them
            wrap = (qb + 1 == first_qb + n_qb).to(gl.int32)
            h_next = h + wrap
            qb_next = qb + 1 - wrap * n_qb
        else:
            h_prev = h
            qb_prev = qb
    if FUSED_DQ == 2:
        if STEPS:  # the last step's: one back from where the walk stopped
            back = (qb_next == first_qb).to(gl.int32)
            h_prev = h_next - back
            qb_prev = qb_next - 1 + back * n_qb
        if n_steps > 0:
            _fused_dq_share(which, g0 + n_steps - 1, h_prev, qb_prev, k_smem, ds_smem, dq_smem, ds_ready, desc_dqa,
                            off_b, sm_scale, trace, HEAD_DIM, BLOCK_M, BLOCK_N, DS_SLOTS, False, SCALING)
    if RELEASE_KV:  # every warp of the group past its last matmul on K and V
        gl.thread_barrier()
        mbarrier.arrive(kv_empty)
    if FUSED_DQ:
        tma.store_wait(0)
    _stamp(trace, _T_CLK_BLOCKS, TRACE)

    if SCALING == 1:  # dK came scaled with dS^T; dV accumulated the scaled P^T
        dv = dv * (1.0 / sm_scale)
    else:
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
    _trace_end(trace, TRACE)


@gluon.jit
def _gluon_attn_bwd_dkdv_kernel(desc_q, desc_do, desc_k, desc_v, DK, DV, LSE, DELTA, qk_scale, sm_scale, p_shift,
                                stride_dks, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                                stride_dvs, stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                                H, H_KV, GROUP, N_Q, N_K, causal_off, SPLIT_H, SPLIT_Q, LPT_UNITS, N_UNITS,
                                desc_dqa, TRACE_PTR, TRACE_SLOTS,
                                CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, DV_EARLY: gl.constexpr,
                                FUSED_DQ: gl.constexpr, DS_LAYOUT: gl.constexpr,
                                PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, TRACE: gl.constexpr,
                                COMPACT_STATS: gl.constexpr, TURNS: gl.constexpr, DQ_FIRST: gl.constexpr,
                                SCALING: gl.constexpr, POLY: gl.constexpr, POLY_ASM: gl.constexpr,
                                STEPS: gl.constexpr, PERSISTENT: gl.constexpr, SKIP_DEAD: gl.constexpr,
                                TMA_DKDV: gl.constexpr):
    # TRACE: the trace (kernel_trace.BACKWARD) into TRACE_PTR's [CTAs, 3, TRACE_SLOTS] int64 slots
    # tiles of key blocks (2 x BLOCK_N keys) x N_UNITS units (_tile_params): a 1-D grid of one
    # CTA a tile, or PERSISTENT at most one CTA per SM walking the tiles (_walk_tile), each
    # partition computing its tiles' values itself (those below are then not read)
    n_kb = gl.cdiv(N_K, 2 * BLOCK_N)
    split, off_b, off_hk, start_n, first_qb, n_qb, head0, n_steps = _tile_params(
        gl.program_id(0), n_kb, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off, CAUSAL,
        BLOCK_M, BLOCK_N)
    if not PERSISTENT:
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
    if PERSISTENT or TMA_DKDV:  # both consumers hand K and V back after each tile (PERSISTENT), or are past
        # their last dQ share before dK goes through a K tile (TMA_DKDV)
        kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_empty, count=2)
    else:  # not read
        kv_empty = q_empty.index(0)
    if TURNS:  # the consumers' turns (CONSUMER_TURNS): one mbarrier each, the other arrives
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
    else:  # not read
        turn = q_empty
    fence_async_shared()

    gl.warp_specialize([
        (_consumer, (0, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, DK, DV, LSE, DELTA,
                     qk_scale, sm_scale, p_shift, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                     stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                     n_steps, head0, desc_dqa, ds_smem, dq_smem, ds_ready, turn,
                     _trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 0, TRACE), pid, kv_empty, stride_dks, stride_dvs,
                     H_KV, GROUP, SPLIT_H, SPLIT_Q, LPT_UNITS, N_UNITS, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N,
                     NUM_BUFFERS, DV_EARLY, FUSED_DQ, TRACE, COMPACT_STATS, TURNS, DQ_FIRST, SCALING, POLY,
                     POLY_ASM, STEPS, PERSISTENT, SKIP_DEAD, TMA_DKDV)),
        (_consumer, (1, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready, q_empty, DK, DV, LSE, DELTA,
                     qk_scale, sm_scale, p_shift, stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh,
                     stride_dvn, stride_dvd, off_b, off_hk, H, N_Q, N_K, causal_off, start_n, first_qb, n_qb,
                     n_steps, head0, desc_dqa, ds_smem, dq_smem, ds_ready, turn,
                     _trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 1, TRACE), pid, kv_empty, stride_dks, stride_dvs,
                     H_KV, GROUP, SPLIT_H, SPLIT_Q, LPT_UNITS, N_UNITS, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N,
                     NUM_BUFFERS, DV_EARLY, FUSED_DQ, TRACE, COMPACT_STATS, TURNS, DQ_FIRST, SCALING, POLY,
                     POLY_ASM, STEPS, PERSISTENT, SKIP_DEAD, TMA_DKDV)),
        (_producer, (desc_q, desc_do, desc_k, desc_v, k_smem, v_smem, q_bufs, do_bufs, kv_ready, q_ready, do_ready,
                     q_empty, off_b, off_hk, start_n, first_qb, n_qb, n_steps, head0,
                     _trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 2, TRACE), pid, kv_empty, N_K, N_Q, causal_off, H_KV,
                     GROUP, SPLIT_H, SPLIT_Q, LPT_UNITS, N_UNITS, CAUSAL, BLOCK_M, BLOCK_N, NUM_BUFFERS, TRACE,
                     PERSISTENT)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # CONSUMER_WARPS, PRODUCER_WARPS


# ----------------------------------------------------------------------------------
# The dQ kernel: the forward's structure (gluon_forward.py), one accumulator
# ----------------------------------------------------------------------------------
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
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, OVERLAP: gl.constexpr):
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
    if OVERLAP:
        dq = _dq_blocks_overlapped(dq, q, do, k_bufs, v_bufs, k_ready, v_ready, kv_empty, rows, cols, lse, delta,
                                   qk_scale, causal_off, mask_from, n_blocks, CAUSAL, HEAD_DIM, BLOCK_N, NUM_BUFFERS,
                                   s_zero, a_layout)
    else:
        for j in range(n_blocks):
            s = j % NUM_BUFFERS
            k = k_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])
            ds16 = _dq_scores(q, do, k_bufs, v_bufs, k_ready, v_ready, j, rows, cols, lse, delta, qk_scale, causal_off,
                              mask_from, CAUSAL, HEAD_DIM, BLOCK_N, NUM_BUFFERS, s_zero, a_layout)
            dq = warpgroup_mma(ds16, k, dq, is_async=True)
            dq, _ds, _k2 = warpgroup_mma_wait(0, deps=(dq, ds16, k))
            gl.thread_barrier()
            mbarrier.arrive(kv_empty.index(s))

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
                              BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, OVERLAP: gl.constexpr,
                              PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
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
                        causal_off, start_m, n_blocks, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS,
                        OVERLAP)),
        (_dq_consumer, (1, q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, DQ, LSE, DELTA,
                        qk_scale, sm_scale, stride_dqb, stride_dqh, stride_dqn, stride_dqd, off_b, off_h, H, N_Q,
                        causal_off, start_m, n_blocks, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS,
                        OVERLAP)),
        (_dq_producer, (desc_q, desc_do, desc_k, desc_v, q_smem, do_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready,
                        kv_empty, off_b, off_h, off_hk, start_m, n_blocks, BLOCK_M, BLOCK_N, NUM_BUFFERS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------
def kernel_constexprs(config: GluonBwdConfig, head_dim: int, dtype: torch.dtype, causal: bool,
                      trace: bool = False, sm_scale: float | None = None, tma_dkdv: bool = False) -> dict:
    """The dK/dV kernel's constexprs (COMPACT_STATS, CONSUMER_TURNS, SCALE_IN_P and DQ_SCALE_AT_CAST as
    ``scaling(sm_scale)``, POLY_EXP2, STEP_COUNTERS, SKIP_DEAD_STEPS: the module's values at the call;
    ``tma_dkdv``: dK and dV through TMA, as ``_tma_dkdv`` decides for the launch)."""
    poly = _poly_exp2(head_dim, causal)
    return dict(CAUSAL=bool(causal), HEAD_DIM=head_dim, BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N,
                NUM_BUFFERS=config.NUM_BUFFERS, DV_EARLY=bool(config.DV_EARLY), FUSED_DQ=config.DQ_FUSED,
                DS_LAYOUT=p_tile_layout(config.BLOCK_N, config.BLOCK_M, dtype), PRODUCER_REGS=config.PRODUCER_REGS,
                CONSUMER_REGS=config.CONSUMER_REGS, TRACE=bool(trace), COMPACT_STATS=bool(COMPACT_STATS),
                TURNS=_consumer_turns(), DQ_FIRST=bool(config.DQ_FIRST), PERSISTENT=bool(config.PERSISTENT),
                SCALING=scaling(sm_scale),
                POLY=poly, POLY_ASM=exp2_split_asm(poly), STEPS=bool(STEP_COUNTERS),
                SKIP_DEAD=bool(SKIP_DEAD_STEPS), TMA_DKDV=bool(tma_dkdv))


def _tma_dkdv(config: GluonBwdConfig, n_split: int, dk: torch.Tensor | None = None,
              dv: torch.Tensor | None = None) -> bool:
    """Whether a launch stores dK and dV through TMA (TMA_STORE_DKDV): the one-CTA-a-tile kernel,
    unsplit (a split's fp32 partials keep the register stores), outputs the copy engine can
    address (None: taken as such)."""
    return bool(TMA_STORE_DKDV) and not config.PERSISTENT and n_split == 1 \
        and all(t is None or _tma_addressable(t) for t in (dk, dv))


def scaling(sm_scale: float | None) -> int:
    """Where the dK/dV kernel applies sm_scale (its SCALING constexpr, from the module's switches at the call):
    0 to each fused dQ share and to dK at the end; 1 in P^T (SCALE_IN_P, only where 0 < ``sm_scale`` <= 1, None
    standing for such a scale), dV divided by it at the end; 2 to dK at the end, the fused dQ shares sent
    unscaled and the dQ buffer's cast scaling them (DQ_SCALE_AT_CAST)."""
    if SCALE_IN_P and (sm_scale is None or 0.0 < sm_scale <= 1.0):
        return 1
    return 2 if DQ_SCALE_AT_CAST else 0


def _poly_exp2(head_dim: int, causal: bool) -> int:
    """POLY_EXP2 for a launch at ``head_dim`` with or without causal masking, checked: 0, 1 or 2
    of every 4 exponentials by the polynomial."""
    return poly_exp2_value(POLY_EXP2, head_dim, causal, "gluon_backward.POLY_EXP2")


def _consumer_turns() -> int:
    """CONSUMER_TURNS, checked: the kernel knows 0, 1 and 2 (any other value would run as 0)."""
    if CONSUMER_TURNS not in (0, 1, 2) or isinstance(CONSUMER_TURNS, bool):
        raise ValueError(f"gluon_backward.CONSUMER_TURNS: expected 0, 1 or 2, got {CONSUMER_TURNS!r}")
    return int(CONSUMER_TURNS)


def dkdv_trace_shape(q_shape, k_shape, config: GluonBwdConfig, split: tuple[int, int]) -> tuple[int, int, int]:
    """The dK/dV kernel's trace shape for a call on q of ``q_shape`` (B, Hq, Nq, D) and k of
    ``k_shape`` split as ``split``: (CTAs, partitions, slots), a CTA walking at most its share of
    the group's heads x all query blocks (kernels/kernel_trace.BACKWARD)."""
    B, H, N_Q, _D = q_shape
    H_KV, N_K = k_shape[1], k_shape[2]
    split_h, split_q = split
    steps = (H // H_KV) // split_h * cdiv(cdiv(N_Q, config.BLOCK_M), split_q)
    return (cdiv(N_K, 2 * config.BLOCK_N) * B * H_KV * split_h * split_q, len(kernel_trace.PARTITIONS),
            kernel_trace.BACKWARD.slots(steps))


def _dq_share_layout(rows: int, head_dim: int):
    """The shared layout of a consumer's fp32 [1, 1, rows, head_dim / 2] dQ share (the fused
    dQ's reduce-add tile)."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim // 2], gl.float32)


def _kernel_inputs(q, k, v, do, lse2, delta) -> tuple:
    """Both kernels' operands: q, k, v, dO as the copy engine can address them (a dense copy
    where not: such a call gets no launch plan) and the row statistics contiguous."""
    def contiguous(t):
        if not t.is_contiguous():
            launch.unplannable()
        return t.contiguous()

    return (*(_addressable(t) for t in (q, k, v, do)), contiguous(lse2), contiguous(delta))


def gluon_dkdv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse2: torch.Tensor,
               delta: torch.Tensor, config: GluonBwdConfig, *, causal: bool, sm_scale: float,
               causal_off: int = 0, split: tuple[int, int] = (1, 1), lpt: int | None = None,
               dq_acc: torch.Tensor | None = None,
               trace: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """dK and dV (in k's and v's dtype and layout, as torch.empty_like makes them) from the
    Gluon kernel, given the forward's lse2 and Delta = rowsum(dO * O), both (B, Hq, Nq)
    float32. Inputs the copy engine cannot address are copied dense first. ``split``:
    (head splits, query chunks) of each key block's work over CTAs, as ``config.dkdv_split``
    gives them (the head splits divide the group); their fp32 partials are summed by the
    Triton backward's sum kernel. ``lpt``: LPT_UNITS (None: common.key_block_lpt_units). A DQ_FUSED
    config also adds sm_scale dS K into ``dq_acc``, a zeroed contiguous (B, Hq, Nq, D)
    float32 tensor (dS K where ``scaling(sm_scale)`` is 2: its reader scales it). ``trace``: a zeroed contiguous int64 tensor of ``dkdv_trace_shape``, filled by
    the kernel's own instrumentation (kernels/kernel_trace.BACKWARD's layout)."""
    from flashtune.kernels import backward

    B, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    split_h, split_q = split
    group = H // H_KV
    if split_h < 1 or split_q < 1 or group % split_h:
        raise ValueError(f"split: expected (head splits dividing the group of {group}, query chunks >= 1), "
                         f"got {split}")
    if trace is not None:
        want = dkdv_trace_shape(q.shape, k.shape, config, split)
        if trace.dtype != torch.int64 or tuple(trace.shape) != want or not trace.is_contiguous() \
                or trace.device != q.device:
            raise ValueError(f"trace: expected a contiguous int64 tensor of shape {want} on {q.device} "
                             f"(dkdv_trace_shape), got {trace.dtype} {tuple(trace.shape)} on {trace.device}")
        if config.PERSISTENT:
            raise ValueError("trace: the persistent dK/dV kernel (PERSISTENT) has no trace")
        launch.unplannable()  # a caller's buffer: nothing a plan can place
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
    desc_k, desc_v = _descriptor(k, config.BLOCK_N), _descriptor(v, config.BLOCK_N)
    if lpt is None:
        lpt = key_block_lpt_units(q, heads_per_unit=group // split_h, units=B * H_KV * n_split,
                                  key_blocks=cdiv(N_K, 2 * config.BLOCK_N),
                                  programs_per_sm=GLUON_DKDV_PROGRAMS_PER_SM, causal=causal)
    if config.DQ_FUSED:
        if dq_acc is None or dq_acc.dtype != torch.float32 or dq_acc.shape != q.shape or not dq_acc.is_contiguous():
            raise ValueError("dq_acc: a DQ_FUSED config needs a zeroed contiguous float32 tensor of q's shape")
        desc_dqa = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), [1, 1, config.BLOCK_M, D // 2],
                                    _dq_share_layout(config.BLOCK_M, D))
    else:
        desc_dqa = desc_q  # not read
    n_units = B * H_KV * n_split
    n_tiles = cdiv(N_K, 2 * config.BLOCK_N) * n_units
    # PERSISTENT: at most one CTA per SM (its shared memory allows no second), each walking tiles
    grid = (min(n_tiles, sm_count(q.device)) if config.PERSISTENT else n_tiles, )
    tma_dkdv = _tma_dkdv(config, n_split, dk, dv)
    if tma_dkdv:  # the outputs as descriptors of the K/V tiles' kind (same dtype, rows and shared layout)
        outs = (_descriptor(dk, config.BLOCK_N), _descriptor(dv, config.BLOCK_N))
    constexprs = kernel_constexprs(config, D, q.dtype, causal, trace is not None, sm_scale, tma_dkdv)
    p_shift = math.log2(sm_scale) if constexprs["SCALING"] == 1 else 0.0
    with on_device(q):
        launch.launch(_gluon_attn_bwd_dkdv_kernel, desc_q, desc_do, desc_k, desc_v, *outs, lse2, delta,
                      sm_scale * LOG2E, sm_scale, p_shift, *strides[0], *strides[1], H, H_KV, group, N_Q, N_K, causal_off,
                      split_h, split_q, lpt, n_units, desc_dqa, lse2 if trace is None else trace,
                      0 if trace is None else trace.shape[2], grid=grid, **constexprs,
                      num_warps=CONSUMER_WARPS, maxnreg=config.maxnreg())
        if n_split > 1:
            backward._sum_partials(parts, dk, dv, int64=backward.needs_int64(parts, dk, dv))
    return dk, dv


def dq_kernel_constexprs(config: GluonBwdConfig, head_dim: int, causal: bool) -> dict:
    return dict(CAUSAL=bool(causal), HEAD_DIM=head_dim, BLOCK_M=DQ_BLOCK_M, BLOCK_N=config.DQ_BLOCK_N,
                NUM_BUFFERS=config.DQ_BUFFERS, OVERLAP=bool(config.DQ_OVERLAP), PRODUCER_REGS=config.PRODUCER_REGS,
                CONSUMER_REGS=config.CONSUMER_REGS)


def gluon_dq_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse2: torch.Tensor,
                    delta: torch.Tensor, config: GluonBwdConfig, *, causal: bool, sm_scale: float,
                    causal_off: int = 0) -> torch.Tensor:
    """dQ (in q's dtype and layout, as torch.empty_like makes it) from the Gluon dQ kernel,
    given lse2 and Delta as ``gluon_dkdv`` takes them."""
    B, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    dq = launch.empty_like(q)
    q, k, v, do, lse2, delta = _kernel_inputs(q, k, v, do, lse2, delta)
    desc_q, desc_do = _descriptor(q, DQ_BLOCK_M), _descriptor(do, DQ_BLOCK_M)
    desc_k, desc_v = _descriptor(k, config.DQ_BLOCK_N), _descriptor(v, config.DQ_BLOCK_N)
    grid = (cdiv(N_Q, 2 * DQ_BLOCK_M), H, B)
    with on_device(q):
        launch.launch(_gluon_attn_bwd_dq_kernel, desc_q, desc_do, desc_k, desc_v, dq, lse2, delta, sm_scale * LOG2E,
                      sm_scale, *dq.stride(), H, H // H_KV, N_Q, N_K, causal_off, grid=grid,
                      **dq_kernel_constexprs(config, D, causal), num_warps=CONSUMER_WARPS, maxnreg=config.maxnreg())
    return dq


def gluon_attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                             lse2: torch.Tensor, config: GluonBwdConfig, *, causal: bool,
                             sm_scale: float | None = None, causal_align: str = "top_left",
                             dq_config=None, gluon_dq: bool = False,
                             dkdv_split: int = 0, lpt: int | None = None,
                             trace: list | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) as ``backward.attention_backward`` returns them: dK and dV from the Gluon
    kernel, Delta and dQ from the Triton preprocess and dQ kernel (``dq_config``: a BwdConfig
    whose dQ half runs, with its ``tma``; default the device's Triton default, its dQ kernel
    kept apart), or with ``gluon_dq`` from the Gluon dQ kernel (the config's DQ_ fields), or
    with ``config.DQ_FUSED`` from the dK/dV kernel itself (but under
    ``torch.use_deterministic_algorithms``, where the dQ kernel named runs).
    ``dkdv_split``: BwdConfig.dkdv_split's value for the dK/dV kernel (0: chosen from the
    shape); ``lpt`` as ``gluon_dkdv``'s. dq, dk and dv come in q's, k's and v's layouts where
    those are dense. ``trace``: a list the dK/dV kernel's trace of this call is appended to (an
    int64 tensor, kernels/kernel_trace.BACKWARD's layout; the kernel then runs instrumented,
    its results unchanged)."""
    from flashtune.kernels import backward

    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or do.shape != q.shape or o.shape != q.shape:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"o {tuple(o.shape)}, do {tuple(do.shape)}")
    B, H, N_Q, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or H % k.shape[1]:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if len({q.dtype, k.dtype, v.dtype, do.dtype, o.dtype}) != 1:
        raise ValueError(f"dtypes: q {q.dtype}, k {k.dtype}, v {v.dtype}, o {o.dtype}, do {do.dtype}")
    wide = D == 256  # the D=256 kernel (gluon_backward_wide), which takes its own configs
    if wide:
        from flashtune.kernels import gluon_backward_wide

        if gluon_dq:
            raise ValueError("gluon_dq: the Gluon dQ kernel does not run head dim 256 (the D=256 backward fuses dQ, "
                             "DQ_FUSED 1, or leaves it to the Triton dQ kernel)")
        if trace is not None:
            raise ValueError("trace: the D=256 backward has no instrumentation")
        gluon_backward_wide.validate_wide(config, q.dtype, q.device)
    else:
        config.validate(D, q.dtype, q.device)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    off = causal_offset(causal_align, N_Q, k.shape[2]) if causal else 0
    if dq_config is None:
        dq_config = _triton_default("bwd", D, q.dtype, q.device, bool(causal))
    if dq_config.atomic_dq:
        dq_config = dataclasses.replace(dq_config, atomic_dq=0)
    if config.DQ_FUSED and torch.are_deterministic_algorithms_enabled():
        config = dataclasses.replace(config, DQ_FUSED=0)  # dQ by its own kernel: a fixed order of adds
    delta = launch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    int64 = backward.needs_int64(q, k, v, o, do)
    # the fused dQ's fp32 accumulator, zeroed by the kernel that computes Delta
    dq_acc = launch.empty(q.shape, device=q.device, dtype=torch.float32) if config.DQ_FUSED else None
    with on_device(q):
        backward._preprocess(o, do, delta, int64=int64, zero=dq_acc)
        # config.dkdv_split's rule for this kernel: 2 x BLOCK_N keys a CTA (the D=256 kernel's: BLOCK_N), one
        # CTA per SM
        split = split_work(dkdv_split, block_m=config.BLOCK_M,
                           keys_per_program=config.BLOCK_N if wide else 2 * config.BLOCK_N,
                           programs_per_sm=GLUON_DKDV_PROGRAMS_PER_SM, batch=B, heads_q=H, heads_kv=k.shape[1],
                           n_q=N_Q, n_k=k.shape[2], sm_count=sm_count(q.device))
        buf = None
        if trace is not None:
            buf = torch.zeros(dkdv_trace_shape(q.shape, k.shape, config, split), dtype=torch.int64, device=q.device)
            trace.append(buf)
        if wide:
            dk, dv = gluon_backward_wide.gluon_dkdv_wide(q, k, v, do, lse2, delta, config, causal=causal,
                                                         sm_scale=sm_scale, causal_off=off, split=split, lpt=lpt,
                                                         dq_acc=dq_acc)
        else:
            dk, dv = gluon_dkdv(q, k, v, do, lse2, delta, config, causal=causal, sm_scale=sm_scale, causal_off=off,
                                split=split, lpt=lpt, dq_acc=dq_acc, trace=buf)
        if dq_acc is not None:  # cast to q's dtype, and scaled where the narrow kernel left its shares unscaled
            dq = launch.copy_(launch.empty_like(q), dq_acc, scale=sm_scale if not wide and scaling(sm_scale) == 2
                              else None)
            return dq, dk, dv
        if gluon_dq:
            dq = gluon_dq_kernel(q, k, v, do, lse2, delta, config, causal=causal, sm_scale=sm_scale, causal_off=off)
            return dq, dk, dv
        dq = launch.empty_like(q)
        backward._launch_dq(q, k, v, do, dq, lse2, delta, dq_config, causal=causal, sm_scale=sm_scale,
                            precision=backward.dot_precision(q.dtype, "tf32"), int64=int64 or backward.needs_int64(dq),
                            causal_off=off)
    return dq, dk, dv


# ----------------------------------------------------------------------------------
# Compiling for sm_90 without a GPU (tests/kernels/gluon_compile_sm90.py)
# ----------------------------------------------------------------------------------
def compile_for_sm90(config: GluonBwdConfig, head_dim: int, dtype: torch.dtype, causal: bool, kernel: str = "dkdv",
                     trace: bool = False):
    """Compile the dK/dV kernel (or, ``kernel="dq"``, the dQ kernel) for sm_90 (ptxas; no GPU
    needed) as an unsplit launch on contiguous inputs would (``trace``: the dK/dV kernel with its
    instrumentation; TMA_STORE_DKDV as the module has it); returns triton's CompiledKernel
    (``.metadata.shared``, ``.asm``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    el = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]

    def desc(rows: int) -> str:
        return f"tensordesc<{el}[1,1,{rows},{head_dim}],{tile_layout(rows, head_dim, dtype)!r}>"

    if kernel == "dq":
        fn = _gluon_attn_bwd_dq_kernel
        constexprs = dq_kernel_constexprs(config, head_dim, causal)
        types = {"desc_q": desc(DQ_BLOCK_M), "desc_do": desc(DQ_BLOCK_M), "desc_k": desc(config.DQ_BLOCK_N),
                 "desc_v": desc(config.DQ_BLOCK_N), "DQ": f"*{el}"}
        constexprs["stride_dqd"] = 1
    else:
        fn = _gluon_attn_bwd_dkdv_kernel
        tma_dkdv = _tma_dkdv(config, 1)
        constexprs = kernel_constexprs(config, head_dim, dtype, causal, trace, tma_dkdv=tma_dkdv)
        out = desc(config.BLOCK_N) if tma_dkdv else f"*{el}"
        types = {"desc_q": desc(config.BLOCK_M), "desc_do": desc(config.BLOCK_M), "desc_k": desc(config.BLOCK_N),
                 "desc_v": desc(config.BLOCK_N), "DK": out, "DV": out,
                 "TRACE_PTR": "*i64" if trace else "*fp32",
                 "desc_dqa": (f"tensordesc<fp32[1,1,{config.BLOCK_M},{head_dim // 2}],"
                              f"{_dq_share_layout(config.BLOCK_M, head_dim)!r}>" if config.DQ_FUSED
                              else desc(config.BLOCK_M))}
        constexprs["stride_dkd"] = 1
        constexprs["stride_dvd"] = 1
    types.update({"LSE": "*fp32", "DELTA": "*fp32", "qk_scale": "fp32", "sm_scale": "fp32", "p_shift": "fp32"})
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = types.get(name, "i32")
            if name in ("DK", "DV", "DQ", "LSE", "DELTA", "TRACE_PTR") and not types.get(name, "").startswith(
                    "tensordesc") or name.startswith("stride"):
                attrs[(i, )] = [["tt.divisibility", 16]]
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": CONSUMER_WARPS, "maxnreg": config.maxnreg()})
