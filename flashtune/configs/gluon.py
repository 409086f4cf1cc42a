"""The Gluon kernels' own launch configs (sm_90 only): ``GluonFwdConfig`` for the forward,
``GluonBwdConfig`` for the dK/dV kernel (and the D=256 one, ``validate_wide``), their shared-memory
and register estimates and their validity rules. ``FwdConfig.gluon()`` and ``BwdConfig.gluon()``
build them from the search's configs. Data only: nothing here imports a kernel (the kernels are
in flashtune/kernels/gluon/)."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import torch

from flashtune.configs.base import FP8_DTYPES, ConfigError
from flashtune.device import (SM90, SM90_REGISTERS, SM90_SHARED_MEMORY, SM90_SHARED_RESERVED_PER_CTA,
                              SM90_SM_SHARED_MEMORY, device_capability)

# 256 for 16-bit inputs only, with 64-key blocks in 2 slots (the two Q tiles and the K/V ring fill 192 KiB of
# shared memory), or 3 K slots and 2 V slots (229 KiB, ring_v_buffers); O's 64 x 256 fp32 tile takes 128 of a
# consumer's registers. FlashAttention-3's tiles for D=256 are 128 x 80, which the power-of-two arange of the
# kernel cannot take
GLUON_FWD_HEAD_DIMS = (64, 128, 256)
# the dK/dV kernel's; head dim 256 has a kernel of its own (WIDE_HEAD_DIM, validate_wide)
GLUON_BWD_HEAD_DIMS = (64, 128)
GLUON_DTYPES = (torch.bfloat16, torch.float16)
# FwdConfig.occupancy -> CONSUMER_REGS: at 104 the kernel's maxnreg is 80 and two CTAs' 3 warp
# groups fit an SM's registers (programs_per_sm)
CONSUMER_REGS_BY_OCCUPANCY = {1: 240, 2: 104}
CONSUMER_WARPS = 4  # one warp group per consumer
PRODUCER_WARPS = 1
# registers per thread a consumer keeps beside its accumulators (addresses, row statistics, loop
# state): a config whose O, S and P tiles leave less would spill. At 24, D=64 with 64x64 blocks without
# the overlap compiles for sm_90 at CONSUMER_REGS 104 without spilling unmasked (8 bytes a thread
# causal), and every config at 240 validates as it would with 32
_CONSUMER_SPARE_REGS = 24
# the dK/dV kernel's: with 16, BLOCK_M 64 at D=128 is allowed (its sm_90 compile spills 112-248 bytes
# a thread), BLOCK_M 128 at D=64 (920 registers estimated) is not
_BWD_SPARE_REGS = 16
BARRIER_BYTES = 8
# what triton adds beside the named buffers (alignment, layout-conversion scratch): the kernels of
# the sm_90 compile test need 232 to 288 bytes over the buffers' sum
SHARED_SLACK = 512
DQ_BLOCK_M = 64  # query rows per consumer warp group of the Gluon dQ kernel (a CTA covers 2 x 64)
# the D=256 dK/dV kernel: both consumer groups on the same 64 keys, each on one half of the head dim
WIDE_HEAD_DIM = 256
WIDE_BLOCK_KEYS = 64  # keys a CTA (the wgmma's M of S^T, dP^T, dV and dK)
WIDE_BLOCK_M = 32  # queries a step (each consumer's N of S^T / dP^T)


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


def check_sm90_device(device, what: str) -> None:
    """ConfigError unless ``device`` is a CUDA device of compute capability 9.0."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ConfigError(f"device: {what} runs on CUDA sm_90 only, got {dev}")
    cap = device_capability(dev)
    if cap != SM90:
        raise ConfigError(f"device: {what} needs compute capability 9.0 (H100/H200), {dev} has "
                          f"{'.'.join(map(str, cap))}")


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@functools.cache
def _programs_per_sm(config: "GluonFwdConfig", head_dim: int, dtype: torch.dtype, by_regs: int) -> int:
    """GluonFwdConfig.programs_per_sm where the registers allow more than one CTA: the shared memory's bound too."""
    smem = config.shared_memory(head_dim, dtype, bool(config.O_TILE), config.ring_v_buffers(head_dim, dtype))
    return max(1, min(by_regs, SM90_SM_SHARED_MEMORY // (smem + SM90_SHARED_RESERVED_PER_CTA)))


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
    query rows (kernels/gluon/persistent.py's order), with the K/V ring and its barriers
    carried from tile to tile: the producer loads the next tile's first K/V blocks while the
    consumers finish the current one, and a tile's Q is reloaded once both consumers are done
    with the previous one's (per consumer a Q-empty mbarrier).
    O_TILE: 1 (PERSISTENT configs only) gives each consumer an O tile of its own in shared
    memory where it fits beside the Q tiles and the K/V ring (D=64 at every ring; D=128 with 2
    buffers, and with 3 with V's ring one slot shorter than K's), stored by TMA; and releases the
    consumer's Q tile once its last S = QK^T has been waited for, before the last P V and the
    epilogue, so the producer loads the next tile's Q under them. 0: O goes out through the Q
    tile, released only once the bulk store has read it. With 3 K and 2 V slots at D=128 it gains
    from 512 to 4096 keys and loses at 16384, where the shorter V ring shows (benchmarks/results:
    h100-gluon-otile-dq-first): the search chooses it per key.
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
        and the two O tiles of O_TILE; ``v_buffers``: V's ring slots where fewer than K's)."""
        e = _element_size(dtype)
        v_slots = self.NUM_BUFFERS if v_buffers is None else v_buffers
        q_tiles = 4 if o_tile else 2  # the Q tiles, and the O tiles of the same shape
        tiles = q_tiles * self.BLOCK_M * head_dim * e + (self.NUM_BUFFERS + v_slots) * self.BLOCK_N * head_dim * e
        barriers = (2 + 2 * self.NUM_BUFFERS + v_slots + 2 + (2 if self.PERSISTENT else 0)) * BARRIER_BYTES
        if dtype in FP8_DTYPES and self.OVERLAP:  # the consumers' P tiles (fp8 P goes through shared memory)
            tiles += 2 * self.BLOCK_M * self.BLOCK_N * e
        return tiles + barriers + SHARED_SLACK

    def fitting_v_buffers(self, head_dim: int, dtype: torch.dtype, o_tile: bool = False) -> int | None:
        """V's ring slots that fit in shared memory beside the Q tiles, the K ring (and ``o_tile``:
        the O tiles): NUM_BUFFERS, else one fewer (at least 2), else None. With fewer V slots than K
        slots the V loads wait for their own slots."""
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
        (D=64 with 64-row Q tiles). The persistent grid launches this many CTAs per SM."""
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
        for name in ("PINGPONG", "OVERLAP", "PERSISTENT"):
            if getattr(self, name) not in (0, 1):
                raise ConfigError(f"{name}: expected 0 or 1, got {getattr(self, name)}")
        if self.O_TILE not in (0, 1) or (self.O_TILE and not self.PERSISTENT):
            raise ConfigError(f"O_TILE: expected 0 or 1, and 1 only with PERSISTENT 1 (the persistent kernel's O "
                              f"tiles), got {self.O_TILE} with PERSISTENT {self.PERSISTENT}")
        check_register_split(self.PRODUCER_REGS, self.CONSUMER_REGS)
        if head_dim not in GLUON_FWD_HEAD_DIMS:
            raise ConfigError(f"head_dim: the Gluon forward supports {GLUON_FWD_HEAD_DIMS}, got {head_dim}")
        if dtype not in GLUON_DTYPES and dtype not in FP8_DTYPES:
            raise ConfigError(f"dtype: the Gluon forward supports float16/bfloat16 and fp8 (e4m3, e5m2), got {dtype}")
        if head_dim == 256 and dtype not in GLUON_DTYPES:
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


def default_gluon_config(head_dim: int) -> GluonFwdConfig:
    """The starting point per head dim (FA3's tile shape: 2 x 64 query rows, 128 keys), the best of
    five configs on most rows of the standard grid and SHAPES.md's compute-bound rows
    (benchmarks/results: h200-gluon-fwd-first). D=128: 3 buffers with the intra-warpgroup overlap;
    D=64: 2 buffers without the overlap; D=256: 64-key blocks in 2 slots (the long calls' default
    is the persistent kernel, the heuristic tables')."""
    if head_dim <= 64:
        return GluonFwdConfig(BLOCK_M=64, BLOCK_N=128, NUM_BUFFERS=2, OVERLAP=0)
    if head_dim > 128:
        return GluonFwdConfig(BLOCK_M=64, BLOCK_N=64, NUM_BUFFERS=2)
    return GluonFwdConfig(BLOCK_M=64, BLOCK_N=128, NUM_BUFFERS=3)


@dataclasses.dataclass(frozen=True)
class GluonBwdConfig:
    """Launch config of the Gluon dK/dV kernel (and of the Gluon dQ kernel beside it); ``validate``
    before compiling.

    BLOCK_M: query rows per step (the N of the S^T and dP^T wgmmas, the K of dV's and dK's).
    BLOCK_N: keys per consumer warp group (a CTA covers 2 x BLOCK_N keys).
    NUM_BUFFERS: Q/dO ring slots in shared memory.
    DQ_BLOCK_N / DQ_BUFFERS: the Gluon dQ kernel's keys per step and K/V ring slots (its
    consumers hold 64 query rows each; each block's dQ wgmma runs under the next block's S, dP
    and softmax); used where that kernel runs (BwdConfig's family 2).
    DQ_FUSED: 1 computes dQ in the dK/dV kernel instead (five matmuls, not seven): each step
    both consumers store dS^T to shared memory, each computes dQ = dS K for its half of the
    head dim over the CTA's 2 x BLOCK_N keys and sends it as one TMA bulk reduce-add into a
    zeroed fp32 buffer (FlashAttention-3's scheme; the order of the adds, hence dQ's last
    bits, varies from run to run). 2: the same, each step's share computed during the next
    step (four dS^T slots instead of two), so the two consumers are not held in lock-step
    (the faster without causal masking, the slower with it). BLOCK_M 64 only (a wgmma's M);
    the other DQ_ fields unused.
    DQ_FIRST: 1 (DQ_FUSED configs only) issues a step's dQ share's two wgmmas before its dV and
    dK, waits for them alone, and stores the share and issues its reduce-add while dV and dK run;
    0 issues dV and dK first and waits for all four before the store. The same wgmmas on the
    same operands: the same bits. It gains on some rows and loses on others (benchmarks/results:
    h100-gluon-otile-dq-first): the search chooses it per key.
    PRODUCER_REGS / CONSUMER_REGS (not fields: every config has them): registers per thread of
    the TMA warp's and of each consumer warp group's (setmaxnreg), in both kernels.
    """

    BLOCK_M: int = 64
    BLOCK_N: int = 64
    NUM_BUFFERS: int = 2
    DQ_BLOCK_N: int = 64
    DQ_BUFFERS: int = 2
    DQ_FUSED: int = 0
    DQ_FIRST: int = 0

    PRODUCER_REGS: ClassVar[int] = 24
    CONSUMER_REGS: ClassVar[int] = 240

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        head = f"m{self.BLOCK_M}n2x{self.BLOCK_N}b{self.NUM_BUFFERS}r{self.PRODUCER_REGS}/{self.CONSUMER_REGS}"
        if self.DQ_FUSED:
            return head + ("/fused-dq" if self.DQ_FUSED == 1 else "/fused-dq-late") + (
                "-first" if self.DQ_FIRST else "")
        return head + f"/dq-n{self.DQ_BLOCK_N}b{self.DQ_BUFFERS}"

    def dq_shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        """The dQ kernel's bytes: both consumers' Q and dO tiles, the K/V ring, the mbarriers."""
        e = _element_size(dtype)
        tiles = 2 * 2 * DQ_BLOCK_M * head_dim * e + 2 * self.DQ_BUFFERS * self.DQ_BLOCK_N * head_dim * e
        return tiles + (2 + 3 * self.DQ_BUFFERS) * BARRIER_BYTES + SHARED_SLACK

    def dq_registers_needed(self, head_dim: int) -> int:
        """The dQ kernel's fp32 dQ, S and dP tiles and two 16-bit dS tiles (the previous block's,
        read by its dQ wgmma, and this one's), per consumer thread, plus spare."""
        return (DQ_BLOCK_M * head_dim + 2 * DQ_BLOCK_M * self.DQ_BLOCK_N
                + 2 * DQ_BLOCK_M * self.DQ_BLOCK_N // 2) // (32 * CONSUMER_WARPS) + _BWD_SPARE_REGS

    def shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of shared memory: the CTA's K and V tiles, the Q/dO ring, the consumers' exchange
        of a step's row statistics (triton's layout-conversion scratch, counted as a BLOCK_M fp32
        vector each), the mbarriers (with the one both groups pass before dK leaves through a K
        tile); with DQ_FUSED also the dS^T slots (two per consumer, four a step late) and the two
        consumers' fp32 dQ shares. Head dim 256: the D=256 kernel's (``wide_shared_memory``)."""
        if head_dim == WIDE_HEAD_DIM:
            return wide_shared_memory(self, dtype)
        e = _element_size(dtype)
        tiles = 2 * 2 * self.BLOCK_N * head_dim * e + 2 * self.NUM_BUFFERS * self.BLOCK_M * head_dim * e
        tiles += 2 * self.BLOCK_M * 4
        barriers = (2 + 3 * self.NUM_BUFFERS + 1) * BARRIER_BYTES
        if self.DQ_FUSED:
            slots = 4 if self.DQ_FUSED == 2 else 2
            tiles += 2 * slots * self.BLOCK_N * self.BLOCK_M * e + 2 * self.BLOCK_M * (head_dim // 2) * 4
            barriers += slots * BARRIER_BYTES
        return tiles + barriers + SHARED_SLACK

    def maxnreg(self) -> int:
        """The kernels' maxnreg (``kernel_maxnreg``)."""
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
        (``device`` as GluonFwdConfig.validate's). Head dim 256: ``validate_wide``."""
        check_int_fields(self)
        if head_dim == WIDE_HEAD_DIM:
            return validate_wide(self, dtype, device)
        if self.BLOCK_M not in (32, 64, 128):
            raise ConfigError(f"BLOCK_M: expected 32, 64 or 128 query rows per step, got {self.BLOCK_M}")
        if self.BLOCK_N != 64:
            raise ConfigError(f"BLOCK_N: expected 64 keys per consumer warp group, got {self.BLOCK_N}")
        if not 2 <= self.NUM_BUFFERS <= 4:
            raise ConfigError(f"NUM_BUFFERS: expected 2 to 4 Q/dO slots, got {self.NUM_BUFFERS}")
        if self.DQ_FUSED not in (0, 1, 2):
            raise ConfigError(f"DQ_FUSED: expected 0, 1 or 2, got {self.DQ_FUSED}")
        if self.DQ_FIRST not in (0, 1) or (self.DQ_FIRST and not self.DQ_FUSED):
            raise ConfigError(f"DQ_FIRST: expected 0 or 1, and 1 only with DQ_FUSED 1 or 2 (the fused dQ share's "
                              f"order), got {self.DQ_FIRST} with DQ_FUSED {self.DQ_FUSED}")
        if self.DQ_FUSED and self.BLOCK_M != 64:
            raise ConfigError(f"BLOCK_M: the fused dQ (DQ_FUSED) takes 64 query rows per step (a wgmma's M), "
                              f"got {self.BLOCK_M}")
        if self.DQ_BLOCK_N not in (64, 128):
            raise ConfigError(f"DQ_BLOCK_N: expected 64 or 128 keys per step of the dQ kernel, got {self.DQ_BLOCK_N}")
        if not 2 <= self.DQ_BUFFERS <= 4:
            raise ConfigError(f"DQ_BUFFERS: expected 2 to 4 K/V slots of the dQ kernel, got {self.DQ_BUFFERS}")
        if head_dim not in GLUON_BWD_HEAD_DIMS:
            raise ConfigError(f"head_dim: the Gluon backward supports {GLUON_BWD_HEAD_DIMS + (WIDE_HEAD_DIM, )}, "
                              f"got {head_dim}")
        if dtype not in GLUON_DTYPES:
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
    """The starting point per head dim: FlashAttention-3's tile (2 x 64 keys, 64 queries a step)."""
    return GluonBwdConfig(BLOCK_M=64, NUM_BUFFERS=2 if head_dim > 64 else 3)


def wide_shared_memory(config: GluonBwdConfig, dtype: torch.dtype) -> int:
    """Bytes of shared memory of the D=256 kernel: K and V, the Q/dO ring, the P^T (16-bit and
    fp32) and dS^T slots, with DQ_FUSED both groups' staging tiles, the mbarriers."""
    e = _element_size(dtype)
    m = config.BLOCK_M
    tiles = 2 * WIDE_BLOCK_KEYS * WIDE_HEAD_DIM * e + 2 * config.NUM_BUFFERS * m * WIDE_HEAD_DIM * e
    tiles += 2 * (WIDE_BLOCK_KEYS * m * e + WIDE_BLOCK_KEYS * m * 4 + WIDE_BLOCK_KEYS * m * e)
    if config.DQ_FUSED:
        tiles += 2 * (WIDE_HEAD_DIM // 2) * m * 4
    barriers = (1 + 3 * config.NUM_BUFFERS + 2 * 2) * BARRIER_BYTES
    return tiles + barriers + SHARED_SLACK


def validate_wide(config: GluonBwdConfig, dtype: torch.dtype, device=None) -> GluonBwdConfig:
    """Raise ConfigError naming the field if ``config`` cannot run the D=256 kernel; return it.
    The kernel's fields: BLOCK_M (32), BLOCK_N (64), NUM_BUFFERS, DQ_FUSED (0 or 1); DQ_FIRST
    must stay 0 (it has no such order)."""
    check_int_fields(config)
    if config.BLOCK_M != WIDE_BLOCK_M:
        raise ConfigError(f"BLOCK_M: the D=256 backward takes {WIDE_BLOCK_M} query rows per step, got {config.BLOCK_M}")
    if config.BLOCK_N != WIDE_BLOCK_KEYS:
        raise ConfigError(f"BLOCK_N: the D=256 backward takes {WIDE_BLOCK_KEYS} keys per CTA, got {config.BLOCK_N}")
    if config.DQ_FUSED not in (0, 1):
        raise ConfigError(f"DQ_FUSED: the D=256 backward computes dQ in its step (1) or not (0), got {config.DQ_FUSED}")
    if config.DQ_FIRST:
        raise ConfigError(f"DQ_FIRST: the D=256 backward has no such option, expected 0, got {config.DQ_FIRST}")
    if not 2 <= config.NUM_BUFFERS <= 4:
        raise ConfigError(f"NUM_BUFFERS: expected 2 to 4 Q/dO slots, got {config.NUM_BUFFERS}")
    if dtype not in GLUON_DTYPES:
        raise ConfigError(f"dtype: the Gluon backward supports float16 and bfloat16, got {dtype}")
    smem = wide_shared_memory(config, dtype)
    if smem > SM90_SHARED_MEMORY:
        raise ConfigError(f"NUM_BUFFERS: the D=256 backward needs {smem} bytes of shared memory with "
                          f"{config.NUM_BUFFERS} slots, sm_90 allows {SM90_SHARED_MEMORY}; use fewer")
    if device is not None:
        check_sm90_device(device, "the Gluon backward")
    return config


def default_wide_config() -> GluonBwdConfig:
    """The D=256 kernel's starting config: dQ fused, 3 Q/dO slots, the fastest of the variants timed
    (benchmarks/results: h100-gluon-bwd-d256)."""
    return GluonBwdConfig(BLOCK_M=WIDE_BLOCK_M, BLOCK_N=WIDE_BLOCK_KEYS, NUM_BUFFERS=3, DQ_FUSED=1)
