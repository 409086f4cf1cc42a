"""The forward's launch config (``FwdConfig``) and its validity rules."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from flashtune.configs.base import (FP8_DTYPES, FP8_MIN_K, MAX_SPLITS, ConfigError, _check_block, _check_flag,
                                    _check_launch, _check_smem, _check_tma, _ConfigBase, _element_size,
                                    padded_head_dim)
from flashtune.configs.gluon import CONSUMER_REGS_BY_OCCUPANCY, GluonFwdConfig
from flashtune.device import resolve_device

# what FwdConfig fixes on construction per family (_ConfigBase.UNUSED_BY_FAMILY), so its
# canonical form (_ConfigBase.canonical) is the config itself
_FWD_UNUSED_BY_FAMILY = {
    0: {"pingpong": (1, (0, 1)), "overlap": (1, (0, 1)), "persistent": (0, (0, 1)), "occupancy": (1, (1, 2))},
    1: {"num_warps": (4, (1, 2, 4, 8, 16)), "tma": (0, (0, 1)), "num_splits": (1, range(MAX_SPLITS + 1)),
        "pack_gqa": (0, (-1, 0, 1))},
}


@dataclasses.dataclass(frozen=True, order=True)
class FwdConfig(_ConfigBase):
    """Forward launch config.

    Each program computes a BLOCK_M x head_dim tile of the output and walks the keys in
    blocks of BLOCK_N, loading them through pointers or, with ``tma=1``, through Hopper's
    tensor memory accelerator (one copy instruction per tile: faster at D=128, slower at
    D=64; benchmarks/results: h200-tma-sweep). A TMA
    config whose tensors the copy engine cannot address (head dim not unit-stride, or
    base or strides not 16-byte aligned) runs with pointer loads. Constraints: BLOCK_M
    and BLOCK_N powers of two in [16, 256]; num_warps in {1, 2, 4, 8, 16}; num_stages in
    [1, 8]; tma 0 or 1, 1 only for 16-bit dtypes, head dims up to 128 and compute
    capability 9.0 or newer; the estimated shared memory (the Q tile plus num_stages
    buffers of a K and a V tile) within the device's limit. fp8 inputs (kernels/fp8.py):
    BLOCK_N at least 32 and tma=0; num_splits and pack_gqa are ignored (the plain kernel
    always runs); BLOCK_M below 64 runs but compiles to fp16 mma.sync on sm_90, not fp8
    wgmma (docs/fp8.md).

    The schedule (kernels/triton/decode.py), for shapes whose query blocks do not fill the GPU:
    - ``num_splits``: the keys of each query block are cut into this many chunks, each
      walked by its own program writing a partial output and log-sum-exp, merged exactly
      by a combine kernel (FlashDecoding). 1: never split; 0 (the default, "auto"): chosen
      at launch from the shape and the SM count (1 when the query blocks fill the GPU).
      At most 128.
    - ``pack_gqa``: 1 packs the query heads sharing a K/V head as rows of one tile, so
      each K/V tile is read once per group (a decode step reads K/V once); 0 never packs;
      -1 (the default, "auto") packs when there are grouped heads and one head's queries
      do not fill a BLOCK_M tile.
    With either in effect the split kernel runs; its row block is BLOCK_M, shrunk to the
    power of two (at least 16) that covers the packed rows. Configs stored before these
    fields existed load with the auto defaults, which run their shapes as before.

    The kernel family, ``family``: 0 (the default) the Triton kernel above; 1 the Gluon
    warp-specialised kernel for sm_90 (kernels/gluon/: a TMA producer warp and
    two consumer warp groups, each of BLOCK_M query rows, so a program covers 2 x BLOCK_M
    rows; num_stages is its K/V ring's slot count; ``pingpong`` 1 makes the consumers take
    turns issuing their matmuls; ``overlap`` 1 pipelines each consumer's blocks, the
    softmax of one under the PV matmul of the one before; ``persistent`` 1 launches one
    program per SM that walks the tiles, heaviest first under causal masking, with the K/V
    ring carried from tile to tile: faster on short and non-causal rows, slower on long
    causal ones on the H200, so the search chooses it per key; ``o_tile`` 1, persistent only, gives
    each consumer an O tile of its own in shared memory and releases its Q tile early,
    GluonFwdConfig.O_TILE: faster up to 4k keys, slower at 16k on an H100, chosen per key too;
    a non-persistent config holds 0); ``occupancy`` 2 sizes the Gluon kernel for two CTAs per SM
    (each consumer thread 104 registers instead of 240, GluonFwdConfig.CONSUMER_REGS and
    programs_per_sm; the persistent grid launches two per SM): it validates only where the tiles fit
    those registers (D=64, 64x64 blocks without the overlap) and two CTAs' shared memory an SM,
    for the short D=64 rows where a CTA's own start and end are much of its time (the Triton
    family's configs hold 1: its occupancy is its compiler's). A Gluon config validates only for head dims 64 and 128,
    float16/bfloat16 or fp8 (attention_fp8), or 256 in float16/bfloat16 with 64-key blocks in 2
    slots, and a device of compute capability 9.0, so the
    search never tries it and the dispatcher never serves it anywhere else; num_warps, tma
    and the schedule do not apply to it (its canonical form fixes them). A call the Gluon
    kernel cannot run (a softcap, packed sequences, dropout, an fp8 V with its head dim
    contiguous) runs the Triton kernel's default (kernels/passes.as_triton).
    """

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    tma: int = 0
    num_splits: int = 0
    pack_gqa: int = -1
    family: int = 0
    pingpong: int = 1
    overlap: int = 1
    persistent: int = 0
    o_tile: int = 0
    occupancy: int = 1

    PASS: ClassVar[str] = "fwd"
    UNUSED_BY_FAMILY: ClassVar[dict] = _FWD_UNUSED_BY_FAMILY

    def __post_init__(self) -> None:
        self._flags_as_ints("tma", "pack_gqa", "family", "pingpong", "overlap", "persistent", "o_tile")
        self._fix_unused_fields()
        if self.persistent == 0 and type(self.persistent) is int and self.o_tile in (0, 1):
            # the O tiles are the persistent kernel's: the grid kernels (the Triton family's too,
            # whose persistent is fixed at 0 above) hold 0
            object.__setattr__(self, "o_tile", 0)

    def label(self) -> str:
        """Compact: ``BLOCK_MxBLOCK_N wW sS``, `` tma`` when tiles load through TMA; a Gluon
        config ``gluon 2xBLOCK_MxBLOCK_N bB``, `` pp`` with ping-pong."""
        if self.family:
            return (f"gluon 2x{self.BLOCK_M}x{self.BLOCK_N} b{self.num_stages}{' pp' if self.pingpong else ''}"
                    f"{'' if self.overlap else ' seq'}{' persistent' if self.persistent else ''}"
                    f"{' o-tile' if self.o_tile else ''}{f' x{self.occupancy}' if self.occupancy != 1 else ''}")
        shown = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "tma", "pingpong", "overlap", "persistent",
                 "o_tile", "occupancy")
        return (f"{self.BLOCK_M}x{self.BLOCK_N} w{self.num_warps} s{self.num_stages}{' tma' if self.tma else ''}"
                + self._extra_label(shown))

    def validate_anywhere(self, head_dim: int, dtype: torch.dtype) -> "FwdConfig":
        """A Gluon config: against sm_90's limits, the one architecture it runs on."""
        if not self.family:
            return super().validate_anywhere(head_dim, dtype)
        self.check_fields()
        self._gluon_validate(head_dim, dtype, None)
        return self

    def _gluon_validate(self, head_dim: int, dtype: torch.dtype, device) -> None:
        """GluonFwdConfig.validate; with occupancy 2 its rules at one CTA's registers (the configs differ in
        CONSUMER_REGS alone), then the occupancy's own: the tiles in the registers it leaves, and two
        CTAs in an SM."""
        gluon = self.gluon()
        if self.occupancy == 1:
            gluon.validate(head_dim, dtype, device)
            return
        dataclasses.replace(self, occupancy=1).gluon().validate(head_dim, dtype, device)
        needed = gluon.consumer_registers_needed(head_dim)
        if needed > gluon.CONSUMER_REGS:
            raise ConfigError(f"occupancy: 2 CTAs per SM leave {gluon.CONSUMER_REGS} registers per consumer "
                              f"thread, these blocks need about {needed} ({self.BLOCK_M} rows x (head_dim "
                              f"{head_dim} + BLOCK_N {self.BLOCK_N}){' and the overlap' if self.overlap else ''}); "
                              f"use occupancy 1 or 64x64 blocks without the overlap")
        if self.occupancy > gluon.programs_per_sm(head_dim, dtype):
            raise ConfigError(f"occupancy: {self.occupancy} CTAs of {gluon.shared_memory(head_dim, dtype)} bytes "
                              f"of shared memory do not fit an SM; use fewer buffers or occupancy 1")

    def gluon(self):
        """The Gluon kernel's own config class for this config (configs/gluon.py)."""
        return GluonFwdConfig(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, NUM_BUFFERS=self.num_stages,
                              PINGPONG=self.pingpong, OVERLAP=self.overlap, PERSISTENT=self.persistent,
                              O_TILE=self.o_tile, CONSUMER_REGS=CONSUMER_REGS_BY_OCCUPANCY[self.occupancy])

    def check_fields(self) -> None:
        _check_block("BLOCK_M", self.BLOCK_M)
        _check_block("BLOCK_N", self.BLOCK_N)
        _check_launch(self.num_warps, self.num_stages)
        _check_flag("tma", self.tma)
        if not isinstance(self.num_splits, int) or isinstance(self.num_splits, bool) \
                or not 0 <= self.num_splits <= MAX_SPLITS:
            raise ConfigError(f"num_splits: expected an integer in [0, {MAX_SPLITS}] (0: auto), "
                              f"got {self.num_splits!r}")
        if not isinstance(self.pack_gqa, int) or isinstance(self.pack_gqa, bool) or self.pack_gqa not in (-1, 0, 1):
            raise ConfigError(f"pack_gqa: expected -1 (auto), 0 or 1, got {self.pack_gqa!r}")
        _check_flag("family", self.family)
        _check_flag("pingpong", self.pingpong)
        _check_flag("overlap", self.overlap)
        _check_flag("persistent", self.persistent)
        _check_flag("o_tile", self.o_tile)
        if not isinstance(self.occupancy, int) or isinstance(self.occupancy, bool) or self.occupancy not in (1, 2):
            raise ConfigError(f"occupancy: expected 1 or 2 CTAs per SM, got {self.occupancy!r}")

    def shared_memory(self, head_dim: int, dtype: torch.dtype, dropout: bool = False) -> int:
        d, e = padded_head_dim(head_dim, dtype), _element_size(dtype)
        # The Q tile and num_stages buffers of K and V (fp8: one byte an element), what triton
        # allocates for sm_90 (an upper bound at num_stages=1); TMA loads add at most 1 KiB of
        # barriers and alignment; the DROPOUT kernel converts the mask's [BLOCK_M, BLOCK_N]
        # byte tile into the scores' layout through shared memory. tests/kernels/
        # test_shared_memory_sm90.py and test_fp8.py compile configs for sm_90 and hold the
        # estimate to what triton allocates.
        return e * d * (self.BLOCK_M + 2 * self.num_stages * self.BLOCK_N) + 1024 * self.tma \
            + self.BLOCK_M * self.BLOCK_N * bool(dropout)

    def validate(self, head_dim: int, dtype: torch.dtype, device=None, dropout: bool = False) -> "FwdConfig":
        """Raise ConfigError naming the field if this config cannot run (``dropout``: its
        DROPOUT kernel); return self.

        A Gluon config (``family=1``) is checked by GluonFwdConfig.validate on the device
        (None: the current CUDA device, else the CPU), which must be a CUDA sm_90 one; a call
        with dropout runs the Triton fallback instead (kernels/passes.py checks that one)."""
        self.check_fields()
        if self.family:
            # no device: the current one, as device_capability reads it (the CPU without a GPU)
            self._gluon_validate(head_dim, dtype, device if device is not None else resolve_device())
            return self
        if self.tma:
            _check_tma(head_dim, dtype, device)
        if dtype in FP8_DTYPES and self.BLOCK_N < FP8_MIN_K:
            raise ConfigError(f"BLOCK_N: expected at least {FP8_MIN_K} for {dtype} inputs (the fp8 dot P @ V "
                              f"reduces over BLOCK_N keys, and fp8 dots need at least {FP8_MIN_K}), got {self.BLOCK_N}")
        _check_smem("FwdConfig", self.shared_memory(head_dim, dtype, dropout), device)
        return self
