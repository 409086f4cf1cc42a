"""A warp-specialised Hopper (sm_90) attention forward written in Gluon (issue 18).

A kernel family of ``FwdConfig`` (``family=1``; ``FwdConfig.gluon()`` gives this module's
``GluonFwdConfig``): the search times it per key and ``attention_forward`` launches it; also
callable directly through ``gluon_attention_forward`` (tests/kernels/test_gluon_gpu.py,
benchmarks/gluon_fwd.py). ``trace=`` runs it with its own instrumentation (kernels/kernel_trace.py).

Conventions are ``forward.attention_forward``'s: q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D),
query head h reads key/value head h // (Hq // Hkv); causal is top-left aligned by default
(query i sees keys j <= i, also when Nq != Nk); returns ``(o, lse2)`` with o in q's layout
and dtype and lse2 (B, Hq, Nq) float32, the base-2 log-sum-exp of the scaled scores.

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
- ``PERSISTENT``: at most one CTA per SM, each walking the tiles pid, pid + CTAs, ... of the
  grid's 1-D order (``_tile``); the ring's slot and phase counters, the turns' phases and
  the Q barriers' phases run on across tiles (``it0``, ``tile_i``), the producer loads a
  tile's first blocks (at most NUM_BUFFERS: more would wait on slots only this tile's
  consumers free, before its Q is in) while the consumers finish the previous tile, then
  its Q once each consumer has released its tile (a Q-empty mbarrier per consumer).

The CPU can only compile this kernel (tests/kernels/test_gluon_compile_sm90.py); its numbers
are checked on an H200 (tests/kernels/test_gluon_gpu.py and the persistent and trace tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashtune.kernels import kernel_trace, launch
from flashtune.kernels.common import (LOG2E, LPT_ON, causal_offset, cdiv, fwd_lpt_units, on_device, sm_count,
                                     window_bounds)
from flashtune.kernels.config import ConfigError, device_capability

SM90_SHARED_MEMORY = 232448  # bytes per block, opt-in maximum of the H100/H200 (227 KiB)
SM90_SM_SHARED_MEMORY = 233472  # bytes per SM (228 KiB), shared by the CTAs it holds
_SHARED_RESERVED_PER_CTA = 1024  # what the driver keeps of an SM's shared memory per resident CTA
SM90_REGISTERS = 65536  # 32-bit registers per SM (and per block)
# 256 for 16-bit inputs only, with 64-key blocks in 2 slots (the two Q tiles and the K/V ring fill 192 KiB of
# shared memory), or 3 K slots and 2 V slots (229 KiB, ring_v_buffers); O's 64 x 256 fp32 tile takes 128 of a
# consumer's registers. FlashAttention-3's tiles for D=256 are 128 x 80, which the power-of-two arange of this
# kernel cannot take
HEAD_DIMS = (64, 128, 256)
DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
# fp8 inputs (attention_fp8: inference, per-tensor descales, fp16/bf16 output): V in the
# key-contiguous layout (fp8.keys_contiguous), the K-major operand fp8 wgmma reads P V's V in
FP8_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}
ALL_DTYPES = {**DTYPES, **FP8_DTYPES}
# FwdConfig.occupancy -> CONSUMER_REGS: at 104 the kernel's maxnreg is 80 and two CTAs' 3 warp
# groups fit an SM's registers (programs_per_sm)
CONSUMER_REGS_BY_OCCUPANCY = {1: 240, 2: 104}
CONSUMER_WARPS = 4  # one warp group per consumer
PRODUCER_WARPS = 1
# registers per thread a consumer keeps beside its accumulators (addresses, row statistics,
# loop state): a config whose O, S and P tiles leave less than this would spill. 24: D=64 with
# 64x64 blocks without the overlap (80 registers of tiles) compiled for sm_90 at CONSUMER_REGS 104
# with no spill unmasked and 8 bytes a thread causal (2026-12-06); every config at the default 240
# validates the same with 24 as with 32
_CONSUMER_SPARE_REGS = 24
_BARRIER_BYTES = 8
# what triton adds beside the named buffers (alignment, layout-conversion scratch): the
# compiled kernels of the compile test needed 232 to 288 bytes over the buffers' sum
_SHARED_SLACK = 512
# the softmax's scale: True (and sm_scale > 0) takes the row max over the raw scores, scaled once,
# and scales and shifts each score by one multiply-add (SCALE_POSITIVE, the Triton kernel's rule;
# 64 instructions fewer a consumer thread and key block at BLOCK_N 128); False scales every score
# first (the kernel as measured on the H200 through 2026-12-04). On since the H200 checked and timed
# it (2026-12-05: test_gluon_gpu.py with it on, 234 passed; benchmarks/gluon_fwd.py --grid --realistic
# --fma-softmax both: 1.045x the scale-first kernel in geometric mean over 18 D=128 rows, 1.02x over
# 12 D=64 rows; docs/gluon.md). Read at each launch; a launch plan (kernels/launch.py) replays the
# kernel it recorded, so set it before the calls.
FMA_SOFTMAX = True
# the causal mask of a diagonal block (causal calls without a window): True compares each score's
# column once, against its row's limit min(row + offset + 1, N_K) - the block's first key (a value
# a row); False tests the sequence end and the diagonal for each score and ands them. The same
# scores at -inf, so the same bits. In the sm_90 machine code (benchmarks/gluon_sass.py, 2026-12-05)
# the persistent D=128 causal kernel with O tiles' hot loop is 602 instructions against 740 and
# spills nothing against 28/52 bytes a thread (the grid kernel's: 596 against 722); the H100 profile
# of grid-d128-512 causal put a masked block's softmax at 1674-1744 cycles against 1248-1266
# unmasked. On since the H200 ran it (2026-12-05, sixth session: test_gluon_gpu.py -k row_limit 20
# passed, the same bits; benchmarks/gluon_fwd.py --grid over the 12 D=128 rows --configs persistent
# --o-tile both --switch ROW_LIMIT_MASK=0,1: the fastest per row 1.007x -> 1.022x cuDNN, causal
# 1.011x -> 1.042x, 512 causal 0.802x -> 0.874x with O tiles; the full rows within noise;
# docs/gluon.md). Read at each launch.
ROW_LIMIT_MASK = True
# the softmax's exponentials split between the SFU and the FMA pipe (16-bit calls; the blocks
# without a mask only, as a masked score needs exactly 0 and the polynomial clamps at 2^-126): of
# every 8 scores a thread holds, POLY_EXP2 (0 to 4) take 2^x as the degree-3 polynomial of
# exp2_split_asm (about 9 issue slots on the FMA and integer pipes), the rest the SFU's ex2. At
# D=64 a consumer's 64 x 128 block costs the SFU as much as the tensor cores (2 x 8192 ex2 a block
# pair at 16 a cycle per SM: 1024 cycles; QK^T and PV, 4 x 64 x 128 x 64 MACs at about 2048 a
# cycle: 1024), so the SFU, not the matmuls, bounds the loop; at D=128 the matmuls take twice as
# long. sm_90 code (benchmarks/gluon_sass.py, the D=64 default without masking): a consumer's loop
# MUFU 66 / all 407 at 0, 58 / 464 at 1, 50 / 520 at 2; by count (a warp's MUFU at 8 cycles on its
# sub-partition, both consumers' warps issuing there) 1 balances the SFU against issue. The
# backward's switch of the same name takes 0-2 of every 4; this one's form is the same otherwise:
# one value for every launch, or a dict by (head dim, causal), 0 for what it does not name.
# Relative error under 7.5e-5, below bf16's and fp16's rounding of P; other bits than 0's (checked
# against float64 on an H100, 2026-12-06: test_gluon_gpu.py -k poly_exp2, 51 passed). **Off: it
# gained nothing where timed.** H100, 2026-12-06, benchmarks/gluon_fwd.py --grid --rows <the 12 D=64
# grid rows, gpt2-train-512, bert-base-512, vit-l16-257> --configs persistent --switch POLY_EXP2=0,1,2,
# ratio to cuDNN in geometric mean over the 15: grid kernel 0.837 / 0.843 / 0.835, persistent 0.892 /
# 0.888 / 0.869 (docs/gluon.md): the SFU is not what bounds the D=64 loop, the count above
# notwithstanding. Read at each launch.
POLY_EXP2: int | dict = 0
# the output's store: True writes each consumer's normalized O tile into its Q tile's shared memory
# (free once its last S = QK^T is waited for) and issues one TMA bulk store for it (the rows past
# N_Q clipped by the descriptor), False stores it from registers (32 st.global of 4 bytes a thread
# with 64-bit addresses and a row mask). The profile of 2026-12-05 (docs/gluon.md) put the
# epilogue at 2300-4300 cycles a tile and consumer, 10-20 % of the consumers' time on the
# N <= 2k rows. 16-bit inputs whose o the copy engine can address (fp8's o has another dtype than
# its Q tile): else the register store. On since the H200 checked and timed it (2026-12-05:
# test_gluon_gpu.py's TMA-store tests, 43 passed, bits equal to the register store's;
# benchmarks/gluon_fwd.py --grid --realistic --configs persistent --tma-store both: 1.05x the
# register store in geometric mean over 18 D=128 rows, up to 1.15x on N <= 1k; docs/gluon.md).
# Read at each launch, like FMA_SOFTMAX.
TMA_STORE_O = True
# the persistent kernel's tile order (PERSISTENT configs only): True hands each CTA the tiles of
# round k (n_prog consecutive tiles of the order) in a snake, pid in even rounds and n_prog - 1 - pid
# in odd ones (persistent_tiles), over the unit-major order (a (batch, head) unit's tiles together,
# under causal masking its last query block first) or, for causal calls that one leaves unbalanced
# (few units of many query blocks: 16k, llama3-70b-tp8), the block-major one (persistent_lpt_units);
# the schedule model (benchmarks/persistent_order.py) puts the busiest CTA within 3.1 % of the mean
# on every causal D=128 grid and SHAPES.md row. False: tiles pid, pid + n_prog, ... of the grid
# kernel's order, which gives CTA p the same query block of every unit wherever n_prog is a
# multiple of the query blocks (a busiest CTA 1.1-1.6x the mean on those rows). On since the H200
# ran it (2026-12-05: test_gluon_persistent_gpu.py -k "snake or heaviest", 14 passed, bit for bit
# the grid kernel's; benchmarks/gluon_fwd.py --grid --realistic --configs persistent
# --persistent-order both over the 12 D=128 grid rows, ratio to cuDNN in geometric mean: persistent
# 0.891 strided -> 0.976 snake, causal 0.827 -> 0.982, 16k causal 0.739 -> 1.041; docs/gluon.md).
# An earlier version took every causal call block-major: on an H100 the same day it lost 15-33 % on
# grid-d128-1024/2048 causal, 132 units a round reading their K/V from memory once a tile.
# Read at each launch.
PERSISTENT_SNAKE = True


# 2^f ~ c0 + f (c1 + f (c2 + f c3)) on [-0.5, 0.5], relative error under 7.5e-5 evaluated in
# fp32 (coefficients fitted here for minimax relative error by Lawson's iteration, then rounded
# to fp32; tests/kernels/test_gluon_bwd_config.py checks the bound on the host)
EXP2_POLY = (0.9999280571937561, 0.6932609677314758, 0.2426111400127411, 0.0551716685295105)


def _f32_hex(x: float) -> str:
    """A PTX fp32 immediate (0fXXXXXXXX) of ``x``."""
    return "0f" + struct.pack(">f", x).hex().upper()


def _choices(most: int) -> str:
    """'0, 1 or 2' for 2."""
    return ", ".join(str(i) for i in range(most)) + f" or {most}"


@functools.lru_cache(maxsize=None)
def exp2_split_asm(poly: int, lanes: int = 4) -> str:
    """The PTX of the split exponential (``_exp2_poly`` here, ``gluon_backward._exp2_split``):
    ``lanes`` inputs ($lanes ...) to as many outputs ($0 ...), the last ``poly`` by the polynomial
    (x clamped to -126 so the exponent add cannot wrap, rounded to the nearest integer j by the
    1.5 x 2^23 trick, 2^(x - j) by EXP2_POLY, times 2^j by adding j to the exponent field), the
    others by ex2.approx.ftz."""
    if lanes not in (4, 8):
        raise ValueError(f"exp2_split_asm: lanes must be 4 or 8, got {lanes!r}")
    if isinstance(poly, bool) or poly not in range(lanes // 2 + 1):
        raise ValueError(f"POLY_EXP2: expected {_choices(lanes // 2)}, got {poly!r}")
    c0, c1, c2, c3 = (_f32_hex(c) for c in EXP2_POLY)
    magic = _f32_hex(12582912.0)
    lines = [".reg .f32 %xc, %t, %j, %f, %p;", ".reg .b32 %ti, %pi;"]
    for i in range(lanes):
        out, inp = f"${i}", f"${i + lanes}"
        if i < lanes - poly:
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


def poly_exp2_value(setting, head_dim: int, causal: bool, name: str, most: int = 2) -> int:
    """A POLY_EXP2 switch (``name``: the module's, for the error) resolved for a launch at
    ``head_dim`` with or without causal masking: how many exponentials of each group by the
    polynomial, 0 to ``most``. ``setting``: one value for every launch, or a dict of values by
    (head dim, causal), 0 for the launches it does not name."""
    value = setting.get((head_dim, bool(causal)), 0) if isinstance(setting, dict) else setting
    if isinstance(value, bool) or value not in range(most + 1):
        raise ValueError(f"{name}: expected {_choices(most)} (or a dict of them by (head dim, causal)), got {setting!r}")
    return int(value)


# the forward's split exponentials, 8 values a call: _EXP2_ASM[n] takes n of every 8 to the polynomial
_EXP2_ASM = gl.constexpr(tuple(exp2_split_asm(n, 8) for n in range(5)))
_EXP2_CONSTRAINTS = gl.constexpr(",".join(["=f"] * 8 + ["f"] * 8))


def check_int_fields(config) -> None:
    """ConfigError naming the first field of the (all-int) config dataclass that is not an int
    (a bool is not one)."""
    for name in (f.name for f in dataclasses.fields(config)):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")


def check_register_split(producer_regs: int, consumer_regs: int) -> None:
    """The setmaxnreg values of a producer warp and two consumer warp groups: multiples of 8 in
    [24, 256] that fit an SM's registers over the three warp groups."""
    for name, value in (("PRODUCER_REGS", producer_regs), ("CONSUMER_REGS", consumer_regs)):
        if not 24 <= value <= 256 or value % 8:
            raise ConfigError(f"{name}: expected a multiple of 8 in [24, 256] (setmaxnreg), got {value}")
    budget = SM90_REGISTERS // 128  # per thread, summed over the 3 warp groups
    if 2 * consumer_regs + producer_regs > budget:
        raise ConfigError(f"CONSUMER_REGS: 2 x {consumer_regs} + PRODUCER_REGS {producer_regs} "
                          f"registers per thread exceed the {SM90_REGISTERS} of an SM over 3 warp groups "
                          f"(at most {budget} in all)")


def kernel_maxnreg(producer_regs: int, consumer_regs: int) -> int:
    """A kernel's maxnreg: 3 warp groups (2 consumers, the producer's warp rounded up to a group)
    of 128 threads; the default partition (the first consumer) gets what the workers leave of
    maxnreg x 3 warp groups."""
    regs = -(-(2 * consumer_regs + producer_regs) // 24) * 8  # a multiple of 8: the first consumer gets enough
    if 3 * regs > SM90_REGISTERS // 128:
        regs -= 8
    return regs


@functools.cache
def _programs_per_sm(config: "GluonFwdConfig", head_dim: int, dtype: torch.dtype, by_regs: int) -> int:
    """GluonFwdConfig.programs_per_sm where the registers allow more than one CTA: the shared memory's bound too."""
    smem = config.shared_memory(head_dim, dtype, bool(config.O_TILE), config.ring_v_buffers(head_dim, dtype))
    return max(1, min(by_regs, SM90_SM_SHARED_MEMORY // (smem + _SHARED_RESERVED_PER_CTA)))


def check_sm90_device(device, what: str) -> None:
    """ConfigError unless ``device`` is a CUDA device of compute capability 9.0."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ConfigError(f"device: {what} runs on CUDA sm_90 only, got {dev}")
    cap = device_capability(dev)
    if cap != (9, 0):
        raise ConfigError(f"device: {what} needs compute capability 9.0 (H100/H200), {dev} has "
                          f"{'.'.join(map(str, cap))}")


@dataclasses.dataclass(frozen=True)
class GluonFwdConfig:
    """Launch config of the Gluon forward; ``validate`` before compiling.

    BLOCK_M: query rows per consumer warp group (a CTA covers 2 x BLOCK_M rows).
    BLOCK_N: keys per K/V block. NUM_BUFFERS: K/V ring slots in shared memory (V's one fewer
    where only that fits, ring_v_buffers).
    PRODUCER_REGS / CONSUMER_REGS: registers per thread of the TMA warp's and of each
    consumer warp group's (setmaxnreg; warp groups of 128 threads share 65536).
    PINGPONG: 1 makes the consumers take turns issuing their S matmul.
    OVERLAP: 1 issues block j's S with block j-1's P V (FA3's intra-warpgroup overlap).
    PERSISTENT: 1 launches one CTA per SM (at most) that walks the tiles of 2 x BLOCK_M
    query rows in the grid's order (heaviest first under causal masking), with the K/V
    ring and its barriers carried from tile to tile: the producer loads the next tile's
    first K/V blocks while the consumers finish the current one, and a tile's Q is reloaded
    once both consumers are done with the previous one's (per consumer a Q-empty mbarrier).
    O_TILE: 1 (PERSISTENT configs only) gives each consumer an O tile of its own in shared
    memory where it fits beside the Q tiles and the K/V ring (persistent_o_tile: D=64 at every
    ring; D=128 with 2 buffers, and with 3 with V's ring one slot shorter than K's,
    persistent_v_buffers), with the TMA store of O (TMA_STORE_O); and releases the consumer's Q
    tile once its last S = QK^T has been waited for, before the last P V and the epilogue, so
    the producer loads the next tile's Q under them (also with the register store). 0: O goes
    out through the Q tile, released only once the bulk store has read it (per tile and consumer
    the epilogue, the store and a Q load in series). Measured (H100, 2026-12-05, docs/gluon.md):
    with 3 K and 2 V slots at D=128 it gains 1-9 % from 512 to 4096 keys (grid-d128-512 full
    0.881 -> 0.959x cuDNN, 1024 causal 0.949 -> 1.017x) and loses 4 % at 16384 (1.047 -> 1.008x),
    where the shorter V ring shows; the search chooses it per key.
    """

    BLOCK_M: int = 64
    BLOCK_N: int = 128
    NUM_BUFFERS: int = 2
    PRODUCER_REGS: int = 24
    CONSUMER_REGS: int = 240
    PINGPONG: int = 1
    OVERLAP: int = 1
    PERSISTENT: int = 0
    O_TILE: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        return (f"m{self.BLOCK_M}n{self.BLOCK_N}b{self.NUM_BUFFERS}r{self.PRODUCER_REGS}/{self.CONSUMER_REGS}"
                f"{'pp' if self.PINGPONG else ''}{'' if self.OVERLAP else 'seq'}{'P' if self.PERSISTENT else ''}"
                f"{'o' if self.O_TILE else ''}")

    def shared_memory(self, head_dim: int, dtype: torch.dtype, o_tile: bool = False,
                      v_buffers: int | None = None) -> int:
        """Bytes of shared memory: two Q tiles, the K and V rings, the mbarriers (``o_tile``:
        and the two O tiles of O_TILE; ``v_buffers``: V's ring slots where fewer than
        K's, persistent_v_buffers)."""
        e = torch.empty((), dtype=dtype).element_size()
        v_slots = self.NUM_BUFFERS if v_buffers is None else v_buffers
        q_tiles = 4 if o_tile else 2  # the Q tiles, and the O tiles of the same shape
        tiles = q_tiles * self.BLOCK_M * head_dim * e + (self.NUM_BUFFERS + v_slots) * self.BLOCK_N * head_dim * e
        barriers = (2 + 2 * self.NUM_BUFFERS + v_slots + 2 + (2 if self.PERSISTENT else 0)) * _BARRIER_BYTES
        if dtype in FP8_DTYPES and self.OVERLAP:  # the consumers' P tiles (_stage_p)
            tiles += 2 * self.BLOCK_M * self.BLOCK_N * e
        return tiles + barriers + _SHARED_SLACK

    def fitting_v_buffers(self, head_dim: int, dtype: torch.dtype, o_tile: bool = False) -> int | None:
        """V's ring slots that fit in shared memory beside the Q tiles, the K ring (and ``o_tile``:
        the O tiles): NUM_BUFFERS, else one fewer (at least 2), else None. With fewer V slots than K
        slots the V loads wait for their own slots (_load_kv)."""
        for v_buffers in (self.NUM_BUFFERS, self.NUM_BUFFERS - 1):
            if v_buffers >= 2 and self.shared_memory(head_dim, dtype, o_tile, v_buffers) <= SM90_SHARED_MEMORY:
                return v_buffers
        return None

    def ring_v_buffers(self, head_dim: int, dtype: torch.dtype) -> int:
        """V's ring slots without O tiles: fitting_v_buffers (D=256 with 3 x 64-key slots: 3 K and 2 V
        slots, 229 KB), NUM_BUFFERS where not even that fits (validate then refuses the config)."""
        return self.fitting_v_buffers(head_dim, dtype) or self.NUM_BUFFERS

    def maxnreg(self) -> int:
        """The kernel's maxnreg (``kernel_maxnreg``)."""
        return kernel_maxnreg(self.PRODUCER_REGS, self.CONSUMER_REGS)

    def programs_per_sm(self, head_dim: int, dtype: torch.dtype) -> int:
        """CTAs of this config an SM holds at once: its registers (maxnreg over 3 warp groups) and
        its shared memory (the most a config of these fields takes: O tiles where it has O_TILE)
        against an SM's. 1 at the default CONSUMER_REGS (240: maxnreg 168); 2 where CONSUMER_REGS
        is at most 104 (maxnreg 80) and the tiles take less than half the SM's shared memory
        (D=64 with 64-row Q tiles). The persistent grid launches this many CTAs per SM (each launch:
        the default split answers from its registers alone, the others once per config)."""
        by_regs = SM90_REGISTERS // (3 * 128 * self.maxnreg())
        return 1 if by_regs <= 1 else _programs_per_sm(self, head_dim, dtype, by_regs)

    def default_partition_regs(self) -> int:
        """Registers per thread the first consumer (the default partition) runs with."""
        return min(256, 3 * self.maxnreg() - self.CONSUMER_REGS - self.PRODUCER_REGS)

    def consumer_registers_needed(self, head_dim: int) -> int:
        """fp32 O and S tiles, 16-bit P (two with OVERLAP: the previous block's, read by its PV
        wgmma, and this block's), per thread of a consumer warp group, plus spare."""
        threads = 32 * CONSUMER_WARPS
        p_tiles = 2 if self.OVERLAP else 1
        return (self.BLOCK_M * (head_dim + self.BLOCK_N) + p_tiles * self.BLOCK_M * self.BLOCK_N // 2) // threads \
            + _CONSUMER_SPARE_REGS

    def validate(self, head_dim: int, dtype: torch.dtype, device=None) -> "GluonFwdConfig":
        """Raise ConfigError naming the field if this config cannot run; return self.

        ``device`` None checks against the sm_90 limits only (compiling without a GPU);
        a device must be a CUDA device of compute capability 9.0 exactly.
        """
        check_int_fields(self)
        if self.BLOCK_M not in (64, 128):
            raise ConfigError(f"BLOCK_M: expected 64 or 128 rows per consumer warp group, got {self.BLOCK_M}")
        if self.BLOCK_N not in (64, 128):
            raise ConfigError(f"BLOCK_N: expected 64 or 128, got {self.BLOCK_N}")
        if not 2 <= self.NUM_BUFFERS <= 4:
            raise ConfigError(f"NUM_BUFFERS: expected 2 to 4 K/V slots, got {self.NUM_BUFFERS}")
        if self.PINGPONG not in (0, 1):
            raise ConfigError(f"PINGPONG: expected 0 or 1, got {self.PINGPONG}")
        if self.OVERLAP not in (0, 1):
            raise ConfigError(f"OVERLAP: expected 0 or 1, got {self.OVERLAP}")
        if self.PERSISTENT not in (0, 1):
            raise ConfigError(f"PERSISTENT: expected 0 or 1, got {self.PERSISTENT}")
        if self.O_TILE not in (0, 1) or (self.O_TILE and not self.PERSISTENT):
            raise ConfigError(f"O_TILE: expected 0 or 1, and 1 only with PERSISTENT 1 (the persistent kernel's O "
                              f"tiles), got {self.O_TILE} with PERSISTENT {self.PERSISTENT}")
        check_register_split(self.PRODUCER_REGS, self.CONSUMER_REGS)
        if head_dim not in HEAD_DIMS:
            raise ConfigError(f"head_dim: the Gluon forward supports {HEAD_DIMS}, got {head_dim}")
        if dtype not in ALL_DTYPES:
            raise ConfigError(f"dtype: the Gluon forward supports float16/bfloat16 and fp8 (e4m3, e5m2), got {dtype}")
        if head_dim == 256 and dtype not in DTYPES:
            raise ConfigError(f"dtype: the Gluon forward runs head_dim 256 in float16/bfloat16 only, got {dtype}")
        needed = self.consumer_registers_needed(head_dim)
        if needed > self.CONSUMER_REGS:
            raise ConfigError(f"BLOCK_M: {self.BLOCK_M} rows x (head_dim {head_dim} + BLOCK_N {self.BLOCK_N}) need "
                              f"about {needed} registers per consumer thread, CONSUMER_REGS is "
                              f"{self.CONSUMER_REGS}; use smaller blocks")
        smem = self.shared_memory(head_dim, dtype, v_buffers=self.ring_v_buffers(head_dim, dtype))
        if smem > SM90_SHARED_MEMORY:
            raise ConfigError(f"NUM_BUFFERS: needs {smem} bytes of shared memory, sm_90 allows "
                              f"{SM90_SHARED_MEMORY}; use fewer buffers or smaller blocks")
        if device is not None:
            check_sm90_device(device, "the Gluon forward")
        return self


def default_gluon_config(head_dim: int, causal: bool = False) -> GluonFwdConfig:
    """The starting point per head dim (FA3's tile shape: 2 x 64 query rows, 128 keys): the
    best of five configs on most rows of the standard grid and SHAPES.md's compute-bound
    rows (benchmarks/gluon_fwd.py --configs all, H200, 2026-12-02, docs/gluon.md). D=128:
    3 buffers with the intra-warpgroup overlap (0.96-1.00x cuDNN from N=4k, against
    0.93-0.99 without the overlap and 0.87-0.93 with 2 buffers); D=64: 2 buffers without
    the overlap (best on 11 of 12 grid rows; 0.01-0.05 of cuDNN's speed over the others)."""
    if head_dim <= 64:
        return GluonFwdConfig(BLOCK_M=64, BLOCK_N=128, NUM_BUFFERS=2, OVERLAP=0)
    if head_dim > 128:  # D=256: 64-key blocks (HEAD_DIMS), 2 slots; the long default is the persistent kernel with
        # 3 K / 2 V slots (config.py's table: 1.238x cuDNN against this one's 0.958x on gemma2-d256, H100)
        return GluonFwdConfig(BLOCK_M=64, BLOCK_N=64, NUM_BUFFERS=2)
    return GluonFwdConfig(BLOCK_M=64, BLOCK_N=128, NUM_BUFFERS=3)


# ----------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------
# the trace's layout (kernels/kernel_trace.py) as the kernel's constants
_T_HEAD = gl.constexpr(kernel_trace.HEAD)
_T_EVENTS = gl.constexpr(kernel_trace.FORWARD.events)
_T_GT_START = gl.constexpr(kernel_trace.H_GT_START)
_T_CLK_START = gl.constexpr(kernel_trace.H_CLK_START)
_T_SMID = gl.constexpr(kernel_trace.H_SMID)
_T_PID = gl.constexpr(kernel_trace.H_PID)
_T_CLK_Q = gl.constexpr(kernel_trace.H_CLK_Q)
_T_CLK_BLOCKS = gl.constexpr(kernel_trace.H_CLK_BLOCKS)
_T_CLK_END = gl.constexpr(kernel_trace.H_CLK_END)
_T_GT_END = gl.constexpr(kernel_trace.H_GT_END)
_T_N_BLOCKS = gl.constexpr(kernel_trace.H_N_BLOCKS)
_T_TILE_I = gl.constexpr(kernel_trace.H_TILE_I)
_T_LO = gl.constexpr(kernel_trace.H_LO)
_T_CLK_LAST_V = gl.constexpr(kernel_trace.H_CLK_LAST_V)


@gluon.jit
def _clock():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _global_timer():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _stamp(trace, slot, TRACE: gl.constexpr):
    """TRACE: the SM's cycle counter into the partition's trace slot (one thread stores)."""
    if TRACE:
        gl.store(trace + slot, _clock())


@gluon.jit
def _trace_start(trace, pid, n_blocks, tile_i, lo, TRACE: gl.constexpr):
    """TRACE: a tile's header at its start in this partition (kernels/kernel_trace.py)."""
    if TRACE:
        gl.store(trace + _T_GT_START, _global_timer())
        gl.store(trace + _T_CLK_START, _clock())
        smid = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.store(trace + _T_SMID, smid.to(gl.int64))
        gl.store(trace + _T_PID, gl.to_tensor(pid).to(gl.int64))
        gl.store(trace + _T_N_BLOCKS, gl.to_tensor(n_blocks).to(gl.int64))
        gl.store(trace + _T_TILE_I, gl.to_tensor(tile_i).to(gl.int64))
        gl.store(trace + _T_LO, gl.to_tensor(lo).to(gl.int64))


@gluon.jit
def _trace_end(trace, TRACE: gl.constexpr):
    if TRACE:
        gl.store(trace + _T_CLK_END, _clock())
        gl.store(trace + _T_GT_END, _global_timer())


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
    ev = trace + _T_HEAD + _T_EVENTS * j
    _stamp(ev, 0, TRACE)
    # a fresh mbarrier counts as having completed the phase before its first: the
    # first lap through the ring does not wait
    mbarrier.wait(kv_empty.index(s), phase ^ 1)
    _stamp(ev, 1, TRACE)
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
    _stamp(ev, 2, TRACE)


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
    _trace_start(trace, pid, n_blocks, tile_i, lo, TRACE)
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
        _stamp(trace, _T_CLK_Q, TRACE)
        for j in range(n_pre, n_blocks):
            _load_kv(desc_k, desc_v, k_bufs, v_bufs, k_ready, v_ready, kv_empty, off_b, off_hk, lo, j, it0, trace,
                     BLOCK_N, NUM_BUFFERS, FP8, TRACE)
    else:
        _load_q(desc_q, q_smem, q_ready, q_empty, off_b, off_h, start_m, tile_i, BLOCK_M, PERSISTENT)
        _stamp(trace, _T_CLK_Q, TRACE)
        for j in range(n_blocks):
            _load_kv(desc_k, desc_v, k_bufs, v_bufs, k_ready, v_ready, kv_empty, off_b, off_hk, lo, j, it0, trace,
                     BLOCK_N, NUM_BUFFERS, FP8, TRACE)
    _stamp(trace, _T_CLK_BLOCKS, TRACE)
    _trace_end(trace, TRACE)


@gluon.jit
def _consume_blocks(acc, m_i, l_i, q, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn, which, rows, first, last,
                    lo, it0, qk_scale, N_K, causal_off, win_left, win_right, trace,
                    MASK: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, HEAD_DIM: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
                    PINGPONG: gl.constexpr, FP8: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                    TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr, ROW_LIMIT: gl.constexpr, POLY: gl.constexpr):
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
        ev = trace + _T_HEAD + _T_EVENTS * j  # kernel_trace.FORWARD.consumer[0]
        _stamp(ev, 0, TRACE)
        mbarrier.wait(k_ready.index(s), phase)
        _stamp(ev, 1, TRACE)
        if PINGPONG:
            # consumer 0 goes first: its first wait is on the fresh barrier's completed phase
            mbarrier.wait(turn.index(which), (g & 1) ^ (1 - which))
        _stamp(ev, 2, TRACE)
        qk = warpgroup_mma(q, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - which))
        qk, _q, _k = warpgroup_mma_wait(0, deps=(qk, q, k_smem))
        _stamp(ev, 3, TRACE)
        p, alpha, m_new, l_i = _softmax_block(qk, m_i, l_i, rows, cols, j, lo, 0, 0, qk_scale, N_K, causal_off,
                                              win_left, win_right, MASK, CAUSAL, WINDOW, BLOCK_N, SCALE_POSITIVE,
                                              ROW_LIMIT, POLY)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        _stamp(ev, 4, TRACE)
        mbarrier.wait(v_ready.index(sv), (g // VB) & 1)
        _stamp(ev, 5, TRACE)
        acc = warpgroup_mma(p16, v_smem, acc, is_async=True)
        acc, _v = warpgroup_mma_wait(0, deps=(acc, v_smem))
        _stamp(ev, 6, TRACE)
        # every warp of the group is done with the slot before its one arrival
        gl.thread_barrier()
        mbarrier.arrive(kv_empty.index(s))
        _stamp(ev, 7, TRACE)
        m_i = m_new
    return acc, m_i, l_i


@gluon.jit
def _masked(qk, rows, cols, kb, N_K, causal_off, win_left, win_right, CAUSAL: gl.constexpr,
            WINDOW: gl.constexpr, BLOCK_N: gl.constexpr, ROW_LIMIT: gl.constexpr):
    """Key block kb's scores with the keys past the sequence end (causal: past each row's
    diagonal; a window: outside [diag - left, diag + right]) at -inf. ROW_LIMIT (causal without
    a window): one compare a score, against each row's limit (ROW_LIMIT_MASK)."""
    if ROW_LIMIT and CAUSAL and not WINDOW:
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
def _exp2_poly(x, POLY: gl.constexpr):
    """2^x, elementwise, ``POLY`` (1 to 4) of each 8 of a thread's values by the polynomial
    (exp2_split_asm), the others by the SFU."""
    return gl.inline_asm_elementwise(_EXP2_ASM[POLY], _EXP2_CONSTRAINTS, [x], dtype=gl.float32, is_pure=True, pack=8)


@gluon.jit
def _softmax_block(qk, m_i, l_i, rows, cols, j, lo, full_lo, full_hi, qk_scale, N_K, causal_off, win_left,
                   win_right, MASK: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                   BLOCK_N: gl.constexpr, SCALE_POSITIVE: gl.constexpr, ROW_LIMIT: gl.constexpr, POLY: gl.constexpr):
    """The CTA's block j (key block lo + j) into probabilities (online softmax, base 2):
    (p, alpha, m, l). The causal, window and/or sequence-end mask: MASK 0 none, 1 always,
    2 outside the blocks [full_lo, full_hi) (counted as j is). SCALE_POSITIVE (qk_scale > 0,
    every call but one with a negative sm_scale): the scale commutes with the row max, so the
    max is taken over the raw scores and scaled once, and each score is scaled and shifted by
    one multiply-add (the Triton kernel's rule): 64 multiplies a thread and block fewer."""
    if not SCALE_POSITIVE:
        qk = qk * qk_scale
    if MASK == 1:
        qk = _masked(qk, rows, cols, lo + j, N_K, causal_off, win_left, win_right, CAUSAL, WINDOW, BLOCK_N,
                     ROW_LIMIT)
    elif MASK == 2:
        if (j < full_lo) | (j >= full_hi):
            qk = _masked(qk, rows, cols, lo + j, N_K, causal_off, win_left, win_right, CAUSAL, WINDOW, BLOCK_N,
                     ROW_LIMIT)
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
    # POLY (POLY_EXP2): some exponentials on the FMA pipe, in the blocks without a mask only (the
    # polynomial clamps at 2^-126 where a masked score needs exactly 0)
    if POLY == 0 or MASK == 1:
        p = gl.exp2(x)
    elif MASK == 2:
        if (j < full_lo) | (j >= full_hi):
            p = gl.exp2(x)
        else:
            p = _exp2_poly(x, POLY)
    else:
        p = _exp2_poly(x, POLY)
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def _consume_overlapped(acc, m_i, l_i, q, k_bufs, v_bufs, p_smem, k_ready, v_ready, kv_empty, turn, q_empty, which,
                        rows, lo, full_lo, full_hi, n_blocks, it0, qk_scale, N_K, causal_off, win_left, win_right,
                        trace, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, HEAD_DIM: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
                        PINGPONG: gl.constexpr, FP8: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                        TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr, ROW_LIMIT: gl.constexpr, POLY: gl.constexpr,
                        EARLY_Q: gl.constexpr):
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
        ev = trace + _T_HEAD
        _stamp(ev, 0, TRACE)
        mbarrier.wait(k_ready.index(s0), (it0 // NUM_BUFFERS) & 1)
        _stamp(ev, 1, TRACE)
        _stamp(ev, 2, TRACE)
        if PINGPONG:
            mbarrier.wait(turn.index(which), (it0 & 1) ^ (1 - which))
        _stamp(ev, 3, TRACE)
        qk = warpgroup_mma(q, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - which))
        qk, _q, _k = warpgroup_mma_wait(0, deps=(qk, q, k_smem))
        _stamp(ev, 4, TRACE)
        p, alpha, m_i, l_i = _softmax_block(qk, m_i, l_i, rows, cols, 0, lo, full_lo, full_hi, qk_scale, N_K,
                                            causal_off, win_left, win_right, 2, CAUSAL, WINDOW, BLOCK_N,
                                            SCALE_POSITIVE, ROW_LIMIT, POLY)
        p16 = _stage_p(p, p_smem, dtype, p_layout, FP8)
        _stamp(ev, 5, TRACE)
        _stamp(ev, 6, TRACE)
        _stamp(ev, 7, TRACE)
        for j in range(1, n_blocks):
            g = it0 + j
            s = g % NUM_BUFFERS
            sp = (g - 1) % NUM_BUFFERS
            k_smem = k_bufs.index(s).reshape([BLOCK_N, HEAD_DIM])
            v_prev = _v_tile(v_bufs, (g - 1) % VB, FP8, HEAD_DIM, BLOCK_N)
            ev = trace + _T_HEAD + _T_EVENTS * j
            _stamp(ev, 0, TRACE)
            mbarrier.wait(k_ready.index(s), (g // NUM_BUFFERS) & 1)
            _stamp(ev, 1, TRACE)
            mbarrier.wait(v_ready.index((g - 1) % VB), ((g - 1) // VB) & 1)
            _stamp(ev, 2, TRACE)
            if PINGPONG:
                mbarrier.wait(turn.index(which), (g & 1) ^ (1 - which))
            _stamp(ev, 3, TRACE)
            qk = warpgroup_mma(q, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(p16, v_prev, acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - which))
            # S (issued first) done; the PV wgmma may still run under this softmax
            qk, _q, _k = warpgroup_mma_wait(1, deps=(qk, q, k_smem))
            _stamp(ev, 4, TRACE)
            p, alpha, m_i, l_i = _softmax_block(qk, m_i, l_i, rows, cols, j, lo, full_lo, full_hi, qk_scale, N_K,
                                                causal_off, win_left, win_right, 2, CAUSAL, WINDOW, BLOCK_N,
                                                SCALE_POSITIVE, ROW_LIMIT, POLY)
            _stamp(ev, 5, TRACE)
            acc, _p, _v = warpgroup_mma_wait(0, deps=(acc, p16, v_prev))
            _stamp(ev, 6, TRACE)
            # every warp of the group is done with slot j-1 before its one arrival
            gl.thread_barrier()
            mbarrier.arrive(kv_empty.index(sp))
            # O so far is relative to the previous row max: rescale to this block's
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
            p16 = _stage_p(p, p_smem, dtype, p_layout, FP8)
            _stamp(ev, 7, TRACE)
        if EARLY_Q:  # every S is done (all four warps past their waits): Q may be reloaded
            gl.thread_barrier()
            mbarrier.arrive(q_empty)
        # the last block's PV
        g_last = it0 + n_blocks - 1
        sl = g_last % NUM_BUFFERS
        v_last = _v_tile(v_bufs, g_last % VB, FP8, HEAD_DIM, BLOCK_N)
        mbarrier.wait(v_ready.index(g_last % VB), (g_last // VB) & 1)
        _stamp(trace, _T_CLK_LAST_V, TRACE)
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
              ROW_LIMIT: gl.constexpr, POLY: gl.constexpr,
              TMA_STORE: gl.constexpr, O_TILE: gl.constexpr, EARLY_Q: gl.constexpr):
    """One consumer's rows of one tile (``it0``: the blocks the ring carried before it;
    ``tile_i``: the tiles this CTA ran before it, for the Q barriers' phases; ``trace``: this
    partition's slots of the tile's trace, with TRACE). TMA_STORE: ``O`` is the output's TMA
    descriptor (TMA_STORE_O), else its pointer with the strides; the bulk store goes through
    ``o_smem``, the consumers' O tiles with O_TILE (the config's O_TILE), else their Q tiles."""
    # PERSISTENT: the Q tile goes back to the producer once no wgmma reads it any more, unless
    # O goes out through it (then once the bulk store has read it); EARLY_Q (the config's O_TILE,
    # with the overlap): before the last P V
    Q_FOR_O: gl.constexpr = TMA_STORE and not O_TILE
    _trace_start(trace, pid, n_blocks, tile_i, lo, TRACE)
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
    _stamp(trace, _T_CLK_Q, TRACE)
    q = q_smem.index(which).reshape([BLOCK_M, HEAD_DIM])
    if OVERLAP:
        acc, m_i, l_i = _consume_overlapped(acc, m_i, l_i, q, k_bufs, v_bufs, p_bufs.index(which), k_ready, v_ready,
                                            kv_empty, turn, q_empty.index(which),
                                            which, rows, lo, full_lo, full_hi, n_blocks, it0, qk_scale, N_K, causal_off,
                                            win_left, win_right, trace, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N,
                                            NUM_BUFFERS, PINGPONG, FP8, s_layout, p_layout, TRACE, SCALE_POSITIVE,
                                            ROW_LIMIT, POLY,
                                            EARLY_Q)
    else:
        if WINDOW:  # the window's left edge
            acc, m_i, l_i = _consume_blocks(acc, m_i, l_i, q, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn,
                                            which, rows, 0, full_lo, lo, it0, qk_scale, N_K, causal_off, win_left,
                                            win_right, trace, 1, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N,
                                            NUM_BUFFERS, PINGPONG, FP8, s_layout, p_layout, TRACE, SCALE_POSITIVE,
                                            ROW_LIMIT, POLY)
        acc, m_i, l_i = _consume_blocks(acc, m_i, l_i, q, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn, which,
                                        rows, full_lo, full_hi, lo, it0, qk_scale, N_K, causal_off, win_left, win_right,
                                        trace, 0, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, PINGPONG,
                                        FP8, s_layout, p_layout, TRACE, SCALE_POSITIVE, ROW_LIMIT, POLY)
        acc, m_i, l_i = _consume_blocks(acc, m_i, l_i, q, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn, which,
                                        rows, full_hi, n_blocks, lo, it0, qk_scale, N_K, causal_off, win_left,
                                        win_right, trace, 1, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS,
                                        PINGPONG, FP8, s_layout, p_layout, TRACE, SCALE_POSITIVE, ROW_LIMIT, POLY)
    _stamp(trace, _T_CLK_BLOCKS, TRACE)
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
    _trace_end(trace, TRACE)


@gluon.jit
def lpt_tile(pid, n_blocks, n_units, LPT_UNITS):
    """(block, unit) of CTA ``pid`` of a 1-D grid of n_blocks x n_units CTAs. LPT_UNITS 0:
    blocks fastest (unit-major). Else heaviest first (config.lpt_group; common.lpt_tile is
    the Triton copy): the units in groups of LPT_UNITS, within a group block 0 (the caller's
    heaviest: the dK/dV kernel's first key block, the forward's last query block) of every
    unit first, then block 1, and so on."""
    blk = pid % n_blocks
    unit = pid // n_blocks
    if LPT_UNITS > 0:
        per_group = n_blocks * LPT_UNITS
        group = pid // per_group
        units_here = gl.minimum(LPT_UNITS, n_units - group * LPT_UNITS)
        r = pid % per_group
        blk = r // units_here
        unit = group * LPT_UNITS + r % units_here
    return blk, unit


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
def _round_tile(k, pid, n_prog, SNAKE: gl.constexpr):
    """The tile a persistent CTA takes in its round ``k`` (persistent_tiles is the host copy)."""
    if SNAKE:
        return k * n_prog + pid + (k % 2) * (n_prog - 1 - 2 * pid)
    else:
        return k * n_prog + pid


@gluon.jit
def _cta_tiles(total, pid, n_prog, SNAKE: gl.constexpr):
    """How many of the ``total`` tiles a persistent CTA takes: every full round's, and the last
    round's if its place there is one of the tiles left."""
    full = total // n_prog
    n = full
    if _round_tile(full, pid, n_prog, SNAKE) < total:
        n += 1
    return n


@gluon.jit
def _trace_slots(TRACE_PTR, TRACE_SLOTS, tile, part, TRACE: gl.constexpr):
    """The slots of (tile, partition) in the trace (kernel_trace's [tiles, 3, slots] layout)."""
    if TRACE:
        return TRACE_PTR + (gl.to_tensor(tile).to(gl.int64) * 3 + part) * TRACE_SLOTS
    else:
        return TRACE_PTR


@gluon.jit
def _producer_tiles(desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                    pid, n_prog, n_units, H, GROUP, N_Q, N_K, causal_off, win_left, win_right, LPT_UNITS,
                    TRACE_PTR, TRACE_SLOTS, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, FP8: gl.constexpr, TRACE: gl.constexpr,
                    SNAKE: gl.constexpr, EARLY_Q: gl.constexpr):
    """PERSISTENT: the producer of every tile of this CTA (_round_tile of each of its rounds)."""
    n_m = gl.cdiv(N_Q, 2 * BLOCK_M)
    it = 0
    tile_i = 0
    for k in range(_cta_tiles(n_m * n_units, pid, n_prog, SNAKE)):
        t = _round_tile(k, pid, n_prog, SNAKE)
        off_b, off_h, start_m, lo, n_blocks = _tile(t, n_m, n_units, H, N_Q, N_K, causal_off, win_left, win_right,
                                                    LPT_UNITS, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
        _producer(desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                  off_b, off_h, off_h // GROUP, start_m, lo, n_blocks, it, tile_i,
                  _trace_slots(TRACE_PTR, TRACE_SLOTS, t, 2, TRACE), pid, BLOCK_M, BLOCK_N, NUM_BUFFERS, FP8, True,
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
                    FP8: gl.constexpr, TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr, ROW_LIMIT: gl.constexpr,
                    POLY: gl.constexpr, TMA_STORE: gl.constexpr,
                    SNAKE: gl.constexpr, O_TILE: gl.constexpr, EARLY_Q: gl.constexpr):
    """PERSISTENT: one consumer's rows of every tile of this CTA, in the producer's order."""
    n_m = gl.cdiv(N_Q, 2 * BLOCK_M)
    it = 0
    tile_i = 0
    for k in range(_cta_tiles(n_m * n_units, pid, n_prog, SNAKE)):
        t = _round_tile(k, pid, n_prog, SNAKE)
        off_b, off_h, start_m, lo, n_blocks = _tile(t, n_m, n_units, H, N_Q, N_K, causal_off, win_left, win_right,
                                                    LPT_UNITS, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
        _consumer(which, q_smem, o_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turn,
                  O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, off_b, off_h, H, N_Q, N_K,
                  causal_off, win_left, win_right, start_m, lo, n_blocks, it, tile_i,
                  _trace_slots(TRACE_PTR, TRACE_SLOTS, t, which, TRACE), pid, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M,
                  BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, True, TRACE, SCALE_POSITIVE, ROW_LIMIT, POLY, TMA_STORE,
                  O_TILE,
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
                           TRACE: gl.constexpr, SCALE_POSITIVE: gl.constexpr, ROW_LIMIT: gl.constexpr,
                           POLY: gl.constexpr, TMA_STORE: gl.constexpr,
                           SNAKE: gl.constexpr, O_TILE: gl.constexpr, EARLY_Q: gl.constexpr,
                           V_BUFFERS: gl.constexpr):
    # V_BUFFERS: V's ring slots (NUM_BUFFERS, or fewer where the O tiles need the room:
    # persistent_v_buffers; the V loads then wait for their own slots, _load_kv);
    # TMA_STORE: O is the output's TMA descriptor (TMA_STORE_O), else its pointer; SNAKE: the
    # persistent CTAs' tiles in a snake over the rounds (PERSISTENT_SNAKE); O_TILE (PERSISTENT
    # with TMA_STORE): each consumer's O through a tile of its own; EARLY_Q (PERSISTENT with the
    # overlap, O not through Q): Q released before the last P V (both the config's O_TILE);
    # N_UNITS: batch x query heads (the 1-D orders' units); TRACE: the trace (kernel_trace.py) into
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

    if PERSISTENT:  # at most one CTA per SM, each walking one tile of each round (_round_tile) of _tile's order
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        gl.warp_specialize([
            (_consumer_tiles, (0, q_smem, o_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                               turn, O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, pid, n_prog,
                               N_UNITS, H, N_Q, N_K, causal_off, win_left, win_right, LPT_UNITS, TRACE_PTR, TRACE_SLOTS,
                               CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, TRACE,
                               SCALE_POSITIVE, ROW_LIMIT, POLY, TMA_STORE, SNAKE, O_TILE, EARLY_Q)),
            (_consumer_tiles, (1, q_smem, o_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                               turn, O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, pid, n_prog,
                               N_UNITS, H, N_Q, N_K, causal_off, win_left, win_right, LPT_UNITS, TRACE_PTR, TRACE_SLOTS,
                               CAUSAL, WINDOW, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, TRACE,
                               SCALE_POSITIVE, ROW_LIMIT, POLY, TMA_STORE, SNAKE, O_TILE, EARLY_Q)),
            (_producer_tiles, (desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready,
                               kv_empty, pid, n_prog, N_UNITS, H, GROUP, N_Q, N_K, causal_off, win_left, win_right,
                               LPT_UNITS, TRACE_PTR, TRACE_SLOTS, CAUSAL, WINDOW, BLOCK_M, BLOCK_N, NUM_BUFFERS, FP8,
                               TRACE, SNAKE, EARLY_Q)),
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
                         _trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 0, TRACE), pid, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M,
                         BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, False, TRACE, SCALE_POSITIVE, ROW_LIMIT, POLY,
                         TMA_STORE, False,
                         False)),
            (_consumer, (1, q_smem, q_smem, k_bufs, v_bufs, p_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turn,
                         O, LSE, qk_scale, v_scale, stride_ob, stride_oh, stride_on, stride_od, off_b, off_h, H, N_Q,
                         N_K, causal_off, win_left, win_right, start_m, lo, n_blocks, 0, 0,
                         _trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 1, TRACE), pid, CAUSAL, WINDOW, HEAD_DIM, BLOCK_M,
                         BLOCK_N, NUM_BUFFERS, PINGPONG, OVERLAP, FP8, False, TRACE, SCALE_POSITIVE, ROW_LIMIT, POLY,
                         TMA_STORE, False,
                         False)),
            (_producer, (desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                         off_b, off_h, off_hk, start_m, lo, n_blocks, 0, 0,
                         _trace_slots(TRACE_PTR, TRACE_SLOTS, pid, 2, TRACE), pid, BLOCK_M, BLOCK_N, NUM_BUFFERS, FP8,
                         False, TRACE, False)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # CONSUMER_WARPS, PRODUCER_WARPS


# ----------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def tile_layout(rows: int, head_dim: int, dtype: torch.dtype):
    """The shared layout of a [1, 1, rows, head_dim] TMA tile (one head's rows); made once
    per (rows, head_dim, dtype): gluon builds it in about 6 us, three times per launch
    (the layout is a frozen dataclass, so sharing one object is safe)."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], ALL_DTYPES[dtype])


def _tma_addressable(t: torch.Tensor) -> bool:
    e = t.element_size()
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s > 0 and s * e % 16 == 0 for s in t.stride()[:-1])


def _addressable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a dense copy of it where the copy engine cannot address it (a fresh copy:
    .contiguous() of a dense tensor off a 16-byte boundary is the same tensor). A copy is tensor
    work a launch plan does not repeat (kernels/launch.py): such a call runs its launcher every
    time."""
    if _tma_addressable(t):
        return t
    launch.unplannable()
    return t.clone(memory_format=torch.contiguous_format)


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    D = t.shape[-1]
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, D], tile_layout(rows, D, t.dtype))


def _tma_store(dtype: torch.dtype, switch: bool) -> bool:
    """Whether a kernel on inputs of ``dtype`` stores o through TMA (``switch``: TMA_STORE_O):
    16-bit only, as fp8's o is wider than the Q tile it would go through."""
    return bool(switch) and dtype not in FP8_DTYPES


def persistent_tiles(pid: int, n_prog: int, total: int, snake: bool) -> list[int]:
    """The tiles (indices into _tile's order) persistent CTA ``pid`` of ``n_prog`` takes, in
    order: the kernel's _cta_tiles and _round_tile on the host (tests, benchmarks/persistent_order.py)."""
    def round_tile(r):
        return r * n_prog + (pid + (r % 2) * (n_prog - 1 - 2 * pid) if snake else pid)

    full = total // n_prog
    return [round_tile(r) for r in range(full + (round_tile(full) < total))]


def persistent_cta_blocks(n_q: int, n_k: int, units: int, config: GluonFwdConfig, n_prog: int, *, causal: bool,
                          snake: bool, lpt_units: int = 0) -> list[int]:
    """Key blocks each of ``n_prog`` persistent CTAs walks for a call of ``units`` (batch x
    query heads) of ``n_q`` queries on ``n_k`` keys, top-left causal or full, no window: the
    kernel's schedule (_tile's order with LPT_UNITS ``lpt_units``, persistent_tiles) on the
    host, for persistent_lpt_units, tests and benchmarks/persistent_order.py (the balance of the
    CTAs' work)."""
    n_m = cdiv(n_q, 2 * config.BLOCK_M)
    loads = []
    for pid in range(n_prog):
        blocks = 0
        for t in persistent_tiles(pid, n_prog, n_m * units, snake):
            if lpt_units:  # lpt_tile's walk, heaviest first
                per_group = n_m * lpt_units
                units_here = min(lpt_units, units - t // per_group * lpt_units)
                pid_m = n_m - 1 - t % per_group // units_here
            else:
                pid_m = n_m - 1 - t % n_m if causal else t % n_m
            hi = min((pid_m + 1) * 2 * config.BLOCK_M, n_k) if causal else n_k
            blocks += cdiv(hi, config.BLOCK_N)
        loads.append(blocks)
    return loads


def persistent_o_tile(config: GluonFwdConfig, head_dim: int, dtype: torch.dtype,
                      tma_store: bool) -> tuple[bool, bool]:
    """(O_TILE, EARLY_Q) of a launch (``tma_store``: the launch's): with the config's O_TILE a
    persistent config's consumers get O tiles of their own where shared memory holds them beside
    the Q tiles and the ring (with the TMA store), and release their Q tiles before the last P V
    (with the overlap) wherever O does not go through them."""
    if not (config.PERSISTENT and config.O_TILE):
        return False, False
    # V's slots beside the O tiles (D=128 with 3 x 128-key slots: 3 K and 2 V slots and the O tiles,
    # 229 KB); none fit: no O tiles
    with_o_tile = bool(tma_store) and config.fitting_v_buffers(head_dim, dtype, o_tile=True) is not None
    return with_o_tile, bool(config.OVERLAP) and (with_o_tile or not tma_store)


def persistent_v_buffers(config: GluonFwdConfig, head_dim: int, dtype: torch.dtype, tma_store: bool) -> int:
    """V's ring slots of a launch, persistent or not (arguments as persistent_o_tile's): NUM_BUFFERS,
    or one fewer where the O tiles need the room or the ring does not fit otherwise (ring_v_buffers)
    (the V loads then wait for their own slots, each freed with the release of the block VB before:
    at 3 K and 2 V slots V keeps two blocks of lead, K three)."""
    with_o_tile, _early_q = persistent_o_tile(config, head_dim, dtype, tma_store)
    if with_o_tile:
        return config.fitting_v_buffers(head_dim, dtype, o_tile=True)
    return config.ring_v_buffers(head_dim, dtype)


# the snake's block-major order (a causal call's tiles heaviest first across all units) is taken
# only where the unit-major one leaves its busiest CTA this much busier (persistent_lpt_units)
SNAKE_BLOCK_MAJOR_GAIN = 1.05


def persistent_lpt_units(n_q: int, n_k: int, units: int, config: GluonFwdConfig, n_prog: int, *, causal: bool,
                         plain: bool) -> int:
    """LPT_UNITS of a persistent launch with PERSISTENT_SNAKE: 0 (unit-major: a unit's tiles
    together, its last query block first) or ``units`` (block-major: every unit's last query
    block, then every unit's next, ...), whichever the schedule's model (persistent_cta_blocks,
    a tile's fixed cost counted as one key block) balances better, unit-major unless block-major
    leaves the busiest CTA SNAKE_BLOCK_MAJOR_GAIN times less busy. Unit-major keeps the tiles
    that share a K/V head's blocks running together (measured on an H100, 2026-12-05: on
    grid-d128-2048 causal, 128 units, block-major's rounds of 132 units ran at 0.67x cuDNN against
    0.90x for the strided unit-major order, their K/V read from memory once a tile); block-major
    is what balances calls of few units and many query blocks (16k, llama3-70b-tp8: the snake over
    unit-major leaves the busiest CTA 1.5x the mean there). 0 without causal masking, with a
    window, or with LPT_ON["fwd"] off."""
    if not (causal and plain and LPT_ON["fwd"]) or units < 2:
        return 0
    return _snake_lpt_units(n_q, n_k, units, config, n_prog)


@functools.lru_cache(maxsize=1024)
def _snake_lpt_units(n_q: int, n_k: int, units: int, config: GluonFwdConfig, n_prog: int) -> int:
    def busiest(lpt: int) -> float:
        return persistent_balance(n_q, n_k, units, config, n_prog, causal=True, snake=True, lpt_units=lpt)

    return units if busiest(0) > SNAKE_BLOCK_MAJOR_GAIN * busiest(units) else 0


def persistent_balance(n_q: int, n_k: int, units: int, config: GluonFwdConfig, n_prog: int, *, causal: bool,
                       snake: bool, lpt_units: int = 0, tile_cost: float = 1.0) -> float:
    """The busiest of persistent_cta_blocks's CTAs over the mean (1.0: all end at once), each
    tile's fixed cost (its Q load and epilogue) counted as ``tile_cost`` key blocks."""
    total = cdiv(n_q, 2 * config.BLOCK_M) * units
    loads = persistent_cta_blocks(n_q, n_k, units, config, n_prog, causal=causal, snake=snake, lpt_units=lpt_units)
    work = [w + tile_cost * len(persistent_tiles(p, n_prog, total, snake)) for p, w in enumerate(loads)]
    return max(work) / (sum(work) / len(work))


def kernel_constexprs(config: GluonFwdConfig, head_dim: int, dtype: torch.dtype, causal: bool,
                      window: bool = False, trace: bool = False, scale_positive: bool | None = None,
                      tma_store: bool = False, snake: bool | None = None) -> dict:
    """The kernel's constexprs; ``scale_positive`` None: FMA_SOFTMAX (a launch passes
    FMA_SOFTMAX and sm_scale > 0); ``tma_store``: O is a TMA descriptor (TMA_STORE_O);
    ``snake`` None: PERSISTENT_SNAKE; the O tiles: the config's O_TILE (persistent_o_tile)."""
    with_o_tile, early_q = persistent_o_tile(config, head_dim, dtype, tma_store)
    v_buffers = persistent_v_buffers(config, head_dim, dtype, tma_store)
    return dict(CAUSAL=bool(causal), WINDOW=bool(window), HEAD_DIM=head_dim, BLOCK_M=config.BLOCK_M,
                BLOCK_N=config.BLOCK_N, NUM_BUFFERS=config.NUM_BUFFERS, PINGPONG=bool(config.PINGPONG),
                OVERLAP=bool(config.OVERLAP), FP8=dtype in FP8_DTYPES,
                P_LAYOUT=p_tile_layout(config.BLOCK_M, config.BLOCK_N, dtype),
                PRODUCER_REGS=config.PRODUCER_REGS, CONSUMER_REGS=config.CONSUMER_REGS,
                PERSISTENT=bool(config.PERSISTENT), TRACE=bool(trace),
                SCALE_POSITIVE=bool(FMA_SOFTMAX if scale_positive is None else scale_positive),
                ROW_LIMIT=bool(ROW_LIMIT_MASK),
                POLY=0 if dtype in FP8_DTYPES else poly_exp2_value(POLY_EXP2, head_dim, causal,
                                                                    "gluon_forward.POLY_EXP2", most=4),
                TMA_STORE=bool(tma_store),
                SNAKE=bool(config.PERSISTENT) and bool(PERSISTENT_SNAKE if snake is None else snake),
                O_TILE=with_o_tile, EARLY_Q=early_q, V_BUFFERS=v_buffers)


def trace_shape(q_shape, n_k: int, config: GluonFwdConfig) -> tuple[int, int, int]:
    """The trace's shape for a call on q of ``q_shape`` (B, H, Nq, D) over ``n_k`` keys: (tiles,
    partitions, slots), a tile being one grid CTA's 2 x BLOCK_M query rows of one (batch, head)
    and its key blocks at most all of them (kernels/kernel_trace.py)."""
    B, H, N_Q, _D = q_shape
    return (cdiv(N_Q, 2 * config.BLOCK_M) * H * B, len(kernel_trace.PARTITIONS),
            kernel_trace.FORWARD.slots(cdiv(n_k, config.BLOCK_N)))


def trace_buffer(q: torch.Tensor, k: torch.Tensor, config: GluonFwdConfig) -> torch.Tensor:
    """A zeroed trace for ``gluon_attention_forward(q, k, ..., config, trace=...)``."""
    return torch.zeros(trace_shape(q.shape, k.shape[2], config), dtype=torch.int64, device=q.device)


@functools.lru_cache(maxsize=None)
def p_tile_layout(rows: int, cols: int, dtype: torch.dtype):
    """The shared layout of a consumer's [rows, cols] P tile (fp8 with the overlap)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], ALL_DTYPES[dtype])


def fp8_v_runs(v: torch.Tensor) -> bool:
    """Whether the Gluon kernel takes this fp8 V: keys contiguous (fp8.keys_contiguous's
    layout), the K-major operand fp8 wgmma needs for P V (it cannot transpose 8-bit tiles)."""
    return v.stride(2) == 1 or v.shape[2] == 1


def _v_transposed(v: torch.Tensor) -> torch.Tensor:
    """A key-contiguous fp8 V (B, H, N, D) as the (B, H, D, N) tensor the V descriptor reads,
    copied with N padded to 16 bytes when its rows are not (TMA's stride alignment)."""
    vt = v.transpose(2, 3)
    if _tma_addressable(vt):
        return vt
    B, H, D, N = vt.shape
    padded = torch.empty((B, H, D, -(-N // 16) * 16), dtype=v.dtype, device=v.device)
    padded[..., :N] = vt
    return padded[..., :N]


def gluon_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: GluonFwdConfig, *,
                            causal: bool, sm_scale: float | None = None, causal_align: str = "top_left",
                            window_size: tuple[int, int] | None = None, v_descale: float = 1.0,
                            out_dtype: torch.dtype | None = None,
                            trace: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gluon forward with an explicit config: ``(o, lse2)`` as ``attention_forward``.

    fp8 inputs (float8_e4m3fn or float8_e5m2, as ``attention_fp8`` passes them): V with its
    keys contiguous (``fp8_v_runs``; ValueError otherwise), the q and k descales folded into
    ``sm_scale`` by the caller, ``v_descale`` applied once to the output, o in ``out_dtype``
    (fp16 or bf16; default bf16); P is cast to V's fp8 type for the P V wgmma.

    ``window_size`` (left, right) is ``attention``'s sliding window (FlashAttention's
    convention, -1 an unbounded side; with ``causal`` right is capped at 0): only the key
    blocks inside it are loaded, its edge blocks masked (common.window_blocks).

    Inputs the copy engine cannot address (head dim not unit-stride, a base or a stride not
    16-byte aligned) are made contiguous first; (B, N, H, D) storage viewed as (B, H, N, D)
    goes through the descriptors as it is. o has q's strides when q is dense and its head dim
    contiguous (dense otherwise).

    ``trace``: ``trace_buffer(q, k, config)``'s zeroed int64 tensor, filled by the kernel's own
    instrumentation (kernels/kernel_trace.py reads it); the outputs are the untraced call's.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v: expected (B, H, N, D) tensors")
    B, H, N_Q, D = q.shape
    Hk, N_K = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or H % Hk:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"dtypes: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if trace is not None:
        want = trace_shape(q.shape, N_K, config)
        if trace.dtype != torch.int64 or tuple(trace.shape) != want or not trace.is_contiguous() \
                or trace.device != q.device:
            raise ValueError(f"trace: expected a contiguous int64 tensor of shape {want} on {q.device} "
                             f"(trace_buffer), got {trace.dtype} {tuple(trace.shape)} on {trace.device}")
        launch.unplannable()  # a caller's buffer: nothing a plan can place
    config.validate(D, q.dtype, q.device)
    fp8 = q.dtype in FP8_DTYPES
    if fp8 and not fp8_v_runs(v):
        raise ValueError("v: the Gluon fp8 forward reads V with its keys contiguous (fp8.keys_contiguous(v)); "
                         f"got strides {tuple(v.stride())}")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    q_in = q
    q, k = _addressable(q), _addressable(k)
    if fp8:
        vt = _v_transposed(v)  # a view of an input, or a copy: no plan either way
        launch.unplannable()
    else:
        v = _addressable(v)
    window = None
    if window_size is not None:
        from flashtune.kernels.function import check_window  # function.py imports this module's caller

        window = window_bounds(check_window(window_size), bool(causal), N_Q, N_K)
    # the diagonal's offset: the causal mask's and the window's frame
    off = causal_offset(causal_align, N_Q, N_K) if causal or window else 0
    o_dtype = (out_dtype or torch.bfloat16) if fp8 else q.dtype
    # o in the caller's q's layout (also where q was copied to be addressable), unless its head dim
    # is strided: then dense (attention_forward sends such a q to the Triton kernel)
    if q_in.stride(-1) == 1:
        o = launch.empty_like(q_in, dtype=o_dtype)
    else:
        o = launch.empty(q.shape, dtype=o_dtype, device=q.device)
    lse2 = launch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    tma_store = _tma_store(q.dtype, TMA_STORE_O) and _tma_addressable(o)
    desc_q = _descriptor(q, config.BLOCK_M)
    desc_k = _descriptor(k, config.BLOCK_N)
    if fp8:  # [D, BLOCK_N] tiles of V^T
        desc_v = TensorDescriptor(vt, list(vt.shape), list(vt.stride()), [1, 1, D, config.BLOCK_N],
                                  tile_layout(D, config.BLOCK_N, vt.dtype))
    else:
        desc_v = _descriptor(v, config.BLOCK_N)
    n_m = cdiv(N_Q, 2 * config.BLOCK_M)  # common.cdiv: triton.cdiv is a jit function
    snake = bool(config.PERSISTENT and PERSISTENT_SNAKE)
    if config.PERSISTENT:  # as many CTAs as the SMs hold at once (programs_per_sm), each walking tiles
        grid = (min(n_m * H * B, sm_count(q.device) * config.programs_per_sm(D, q.dtype)), )
        lpt = persistent_lpt_units(N_Q, N_K, B * H, config, grid[0], causal=causal, plain=window is None) if snake \
            else fwd_lpt_units(q, k, n_m, causal=causal, plain=window is None)
    else:
        lpt = fwd_lpt_units(q, k, n_m, causal=causal, plain=window is None)
        grid = (n_m * H * B, ) if lpt else (n_m, H, B)
    with on_device(q):
        out = _descriptor(o, config.BLOCK_M) if tma_store else o
        launch.launch(_gluon_attn_fwd_kernel, desc_q, desc_k, desc_v, out, lse2, sm_scale * LOG2E, float(v_descale),
                      *o.stride(), H, H // Hk, N_Q, N_K, off, *(window or (0, 0)), lpt, H * B,
                      lse2 if trace is None else trace, 0 if trace is None else trace.shape[2], grid=grid,
                      **kernel_constexprs(config, D, q.dtype, causal, window is not None, trace is not None,
                                          FMA_SOFTMAX and sm_scale > 0, tma_store, snake),
                      num_warps=CONSUMER_WARPS, maxnreg=config.maxnreg())
    return o, lse2


# ----------------------------------------------------------------------------------
# Compiling for sm_90 without a GPU (tests/kernels/gluon_compile_sm90.py)
# ----------------------------------------------------------------------------------
def compile_for_sm90(config: GluonFwdConfig, head_dim: int, dtype: torch.dtype, causal: bool, window: bool = False,
                     out_dtype: torch.dtype = torch.bfloat16, trace: bool = False,
                     fma_softmax: bool | None = None, tma_store: bool | None = None, snake: bool | None = None):
    """Compile the kernel for sm_90 (ptxas; no GPU needed) as a launch on contiguous inputs
    would (``trace``: with its instrumentation; ``fma_softmax``: SCALE_POSITIVE, None
    FMA_SOFTMAX; ``tma_store``: the output through TMA, None TMA_STORE_O, never for fp8;
    ``snake``: a persistent config's snake order, None PERSISTENT_SNAKE);
    returns triton's CompiledKernel
    (``.metadata.shared``, ``.asm``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _gluon_attn_fwd_kernel
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8e4nv",
             torch.float8_e5m2: "fp8e5"}
    el = names[dtype]
    fp8 = dtype in FP8_DTYPES

    def desc(rows: int, cols: int = head_dim) -> str:
        return f"tensordesc<{el}[1,1,{rows},{cols}],{tile_layout(rows, cols, dtype)!r}>"

    tma_store = _tma_store(dtype, TMA_STORE_O if tma_store is None else tma_store)
    constexprs = kernel_constexprs(config, head_dim, dtype, causal, window, trace, fma_softmax, tma_store, snake)
    types = {"desc_q": desc(config.BLOCK_M), "desc_k": desc(config.BLOCK_N),
             "desc_v": desc(head_dim, config.BLOCK_N) if fp8 else desc(config.BLOCK_N),
             "O": desc(config.BLOCK_M) if tma_store else f"*{names[out_dtype] if fp8 else el}", "LSE": "*fp32",
             "qk_scale": "fp32", "v_scale": "fp32",
             "TRACE_PTR": "*i64" if trace else "*fp32"}
    constexprs["stride_od"] = 1
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = types.get(name, "i32")
            if name in ("LSE", "TRACE_PTR") or name.startswith("stride") or (name == "O" and not tma_store):
                attrs[(i, )] = [["tt.divisibility", 16]]
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": CONSUMER_WARPS, "maxnreg": config.maxnreg()})
