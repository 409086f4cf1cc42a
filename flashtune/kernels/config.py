"""Kernel launch configs as data, their validity rules, and the heuristic defaults.

``FwdConfig`` and ``BwdConfig`` are frozen dataclasses. ``validate(shape, dtype, device)``
states every constraint the kernels have, so the autotuner can drop an impossible
config before it costs a compile, and the dispatcher can refuse a bad stored row.

The heuristic tables give the config used when nothing is tuned; they are keyed by
(dtype, padded head_dim) per architecture, and lookup walks from the device's
architecture down to the generic table (as PyTorch FlexAttention does).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import torch

MIN_BLOCK = 16
MAX_BLOCK = 256
MAX_HEAD_DIM = 256
NUM_WARPS = (1, 2, 4, 8, 16)
MAX_STAGES = 8
# the atomic-dQ backward's shared-memory need was measured up to this head dim only
ATOMIC_DQ_MAX_HEAD_DIM = 128
# TMA tile loads: run on the H200 for 16-bit inputs up to this padded head dim
TMA_MAX_HEAD_DIM = 128
# split-KV forward: at most this many chunks of the keys per query block
MAX_SPLITS = 128
# calls with at most this many queries per head take the decode entries of the heuristic tables
DECODE_MAX_Q = 16

# Shared memory per block (opt-in maximum) by compute capability, used when torch
# cannot tell (older torch, or the interpreter).
_SMEM_BY_CAPABILITY = {(9, 0): 232448, (8, 0): 166912, (8, 6): 101376, (8, 9): 101376, (7, 5): 65536}
_INTERPRETER_SMEM = 1 << 30  # the interpreter has no shared-memory limit


class ConfigError(ValueError):
    """A config that the kernel cannot run; the message names the field."""


def padded_head_dim(head_dim: int) -> int:
    """The tile width the kernels use for a head dim: next power of two, at least 16."""
    return max(MIN_BLOCK, 1 << (int(head_dim) - 1).bit_length())


def shared_memory_limit(device: torch.device | str | None) -> int:
    """Bytes of shared memory one program may use on ``device``."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return _INTERPRETER_SMEM
    props = torch.cuda.get_device_properties(dev)
    limit = getattr(props, "shared_memory_per_block_optin", 0)
    return int(limit) or _SMEM_BY_CAPABILITY.get((props.major, props.minor), 49152)


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _check_block(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if not _is_pow2(value) or not MIN_BLOCK <= value <= MAX_BLOCK:
        raise ConfigError(f"{name}: expected a power of two in [{MIN_BLOCK}, {MAX_BLOCK}], got {value}")


def _check_launch(num_warps: Any, num_stages: Any, prefix: str = "") -> None:
    if not isinstance(num_warps, int) or isinstance(num_warps, bool) or num_warps not in NUM_WARPS:
        raise ConfigError(f"{prefix}num_warps: expected one of {NUM_WARPS}, got {num_warps!r}")
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or not 1 <= num_stages <= MAX_STAGES:
        raise ConfigError(f"{prefix}num_stages: expected an integer in [1, {MAX_STAGES}], got {num_stages!r}")


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value not in (0, 1):
        raise ConfigError(f"{name}: expected 0 or 1, got {value!r}")


def _check_tma(head_dim: int, dtype: torch.dtype, device) -> None:
    if _element_size(dtype) != 2 or padded_head_dim(head_dim) > TMA_MAX_HEAD_DIM:
        raise ConfigError(f"tma: supported for float16/bfloat16 up to head_dim {TMA_MAX_HEAD_DIM}, got {dtype} "
                          f"head_dim {head_dim}; use tma=0")
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and device_capability(dev) < (9, 0):
        raise ConfigError(f"tma: needs compute capability 9.0 or newer, {dev} has "
                          f"{'.'.join(map(str, device_capability(dev)))}; use tma=0")


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _check_smem(name: str, needed: int, device) -> None:
    limit = shared_memory_limit(device)
    if needed > limit:
        raise ConfigError(
            f"{name}: needs about {needed} bytes of shared memory, the device allows {limit}; "
            "use smaller blocks or fewer stages"
        )


class _ConfigBase:
    FIELDS: ClassVar[tuple[str, ...]]
    # fields that stored data written before they existed may lack (their defaults apply)
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        """Build a config from stored data; unknown or missing fields raise ConfigError."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{cls.__name__}: expected a mapping of fields, got {type(data).__name__}")
        missing = [f for f in cls.FIELDS if f not in data and f not in cls.OPTIONAL]
        extra = sorted(set(data) - set(cls.FIELDS))
        if missing or extra:
            raise ConfigError(f"{cls.__name__}: missing fields {missing}, unknown fields {extra}")
        cfg = cls(**{f: data[f] for f in cls.FIELDS if f in data})
        cfg.check_fields()
        return cfg

    def _flags_as_ints(self, *names: str) -> None:
        # True/False given for a 0/1 flag field: stored (and compared) as the int
        for name in names:
            if isinstance(getattr(self, name), bool):
                object.__setattr__(self, name, int(getattr(self, name)))

    def canonical(self):
        """The same kernel launch with the fields it does not use set to fixed values."""
        return self

    def short(self) -> str:
        return " ".join(f"{f}={getattr(self, f)}" for f in self.FIELDS)


@dataclasses.dataclass(frozen=True)
class FwdConfig(_ConfigBase):
    """Forward launch config.

    Each program computes a BLOCK_M x head_dim tile of the output and walks the keys in
    blocks of BLOCK_N, loading them through pointers or, with ``tma=1``, through Hopper's
    tensor memory accelerator (one copy instruction per tile; up to 8 % faster at D=128
    on the H200, 5-9 % slower at D=64: docs/data/h200-2026-11-30/fwd_tma.json). A TMA
    config whose tensors the copy engine cannot address (head dim not unit-stride, or
    base or strides not 16-byte aligned) runs with pointer loads. Constraints: BLOCK_M
    and BLOCK_N powers of two in [16, 256]; num_warps in {1, 2, 4, 8, 16}; num_stages in
    [1, 8]; tma 0 or 1, 1 only for 16-bit dtypes, head dims up to 128 and compute
    capability 9.0 or newer; the estimated shared memory (the Q tile plus num_stages
    buffers of a K and a V tile) within the device's limit.

    The schedule (kernels/decode.py), for shapes whose query blocks do not fill the GPU:
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
    """

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    tma: int = 0
    num_splits: int = 0
    pack_gqa: int = -1

    FIELDS: ClassVar[tuple[str, ...]] = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "tma", "num_splits",
                                         "pack_gqa")
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"tma", "num_splits", "pack_gqa"})

    def __post_init__(self) -> None:
        self._flags_as_ints("tma", "pack_gqa")

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

    def shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        d, e = padded_head_dim(head_dim), _element_size(dtype)
        # Q tile + num_stages buffers of K and V: equal to what Triton 3.6 allocated for
        # every config of the space at D=64 bf16 with num_stages >= 2 (an upper bound
        # at num_stages=1), measured on the H200 with benchmarks/sweep_space.py. TMA
        # loads add their barriers and alignment: at most 1 KiB over the pointer kernel in
        # all 72 D=128 bf16 configs of BLOCK_M 64..256, BLOCK_N 32..128, 4/8 warps, 1..4
        # stages, compiled for sm_90 (2026-11-30).
        return e * d * (self.BLOCK_M + 2 * self.num_stages * self.BLOCK_N) + 1024 * self.tma

    def validate(self, head_dim: int, dtype: torch.dtype, device=None) -> "FwdConfig":
        """Raise ConfigError naming the field if this config cannot run; return self."""
        self.check_fields()
        if self.tma:
            _check_tma(head_dim, dtype, device)
        _check_smem("FwdConfig", self.shared_memory(head_dim, dtype), device)
        return self


@dataclasses.dataclass(frozen=True)
class BwdConfig(_ConfigBase):
    """Backward launch config.

    The dK/dV kernel holds a BLOCK_N1 block of keys and walks the queries in blocks of
    BLOCK_M1, with num_warps and num_stages. dQ comes one of two ways:
    - ``atomic_dq=0``: a dQ kernel holds a BLOCK_M2 block of queries and walks the keys
      in blocks of BLOCK_N2, with dq_num_warps and dq_num_stages (default: the dK/dV
      kernel's); it recomputes the scores, 7 matmuls in all;
    - ``atomic_dq=1``: the dK/dV kernel adds each key block's share of dQ into an fp32
      buffer with atomic adds (5 matmuls in all; the order of the adds, hence dQ's last
      bits, varies from run to run; under ``torch.use_deterministic_algorithms`` the dQ
      kernel runs instead). BLOCK_M2, BLOCK_N2, dq_num_warps and dq_num_stages are unused.
    Constraints: the four blocks powers of two in [16, 256]; warps in {1, 2, 4, 8, 16};
    stages in [1, 8]; atomic_dq 0 or 1; the estimated shared memory of each kernel within
    the device's limit. ``tma=1`` loads the walked tiles (Q and dO in the dK/dV kernel, K
    and V in the dQ kernel) through TMA descriptors, under the forward's conditions (see
    FwdConfig); with ``atomic_dq=1`` on a GPU it also sends each tile's dQ share as one
    TMA bulk reduce-add instead of an atomic add per element.
    """

    BLOCK_M1: int
    BLOCK_N1: int
    BLOCK_M2: int
    BLOCK_N2: int
    num_warps: int
    num_stages: int
    dq_num_warps: int | None = None
    dq_num_stages: int | None = None
    atomic_dq: int = 0
    tma: int = 0

    FIELDS: ClassVar[tuple[str, ...]] = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_warps", "num_stages",
                                         "dq_num_warps", "dq_num_stages", "atomic_dq", "tma")
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"dq_num_warps", "dq_num_stages", "atomic_dq", "tma"})

    def __post_init__(self) -> None:
        # the dQ kernel's launch values default to the dK/dV kernel's (configs stored
        # before these fields existed launched both kernels with one pair)
        if self.dq_num_warps is None:
            object.__setattr__(self, "dq_num_warps", self.num_warps)
        if self.dq_num_stages is None:
            object.__setattr__(self, "dq_num_stages", self.num_stages)
        self._flags_as_ints("atomic_dq", "tma")

    def check_fields(self) -> None:
        for name in self.FIELDS[:4]:
            _check_block(name, getattr(self, name))
        _check_launch(self.num_warps, self.num_stages)
        _check_launch(self.dq_num_warps, self.dq_num_stages, prefix="dq_")
        _check_flag("atomic_dq", self.atomic_dq)
        _check_flag("tma", self.tma)

    def canonical(self) -> "BwdConfig":
        """With atomic dQ the dQ kernel's fields are unused (but for deterministic mode): they
        take the dK/dV kernel's values, blocks swapped (the dQ kernel holds BLOCK_M2 queries
        as the dK/dV kernel holds BLOCK_N1 keys), so the canonical form fits wherever the
        config does."""
        if not self.atomic_dq:
            return self
        return dataclasses.replace(self, BLOCK_M2=self.BLOCK_N1, BLOCK_N2=self.BLOCK_M1,
                                   dq_num_warps=self.num_warps, dq_num_stages=self.num_stages)

    def shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        d, e = padded_head_dim(head_dim), _element_size(dtype)
        # Each kernel: its two held tiles, num_stages buffers of the two walked tiles, and
        # layout-conversion scratch for the fp32 score block, which grows with the warps
        # for fp32 inputs. An upper bound of what Triton 3.6 allocated for sm_90 in every
        # config compiled so far (tests/kernels/sm90_shared_memory.py, 2026-11-30). The
        # atomic-dQ dK/dV kernel needs 24-40 KiB more than the plain one at D=128 bf16
        # (BLOCK_M1 16/32/64 x BLOCK_N1 64/128, 2-3 stages, 4/8 warps, with and without
        # TMA, and some D=64 and fp32 ones, compiled 2026-11-30: the estimate covers each,
        # exactly for BLOCK_M1=64 at D=128, the largest fitting ones). Under
        # deterministic mode an atomic config runs the dQ kernel with its blocks, so that
        # kernel's estimate counts either way.
        def scratch(warps: int) -> int:
            return max(9, warps + 1) if e == 4 else 2

        tiles = e * d * (2 * self.BLOCK_N1 + 2 * self.num_stages * self.BLOCK_M1)
        dkdv = tiles + 4 * self.BLOCK_M1 * self.BLOCK_N1 * scratch(self.num_warps)
        if self.atomic_dq and self.tma:
            # dQ's bulk reduce-adds (sm_90+): the fp32 dQ tile is staged in shared memory,
            # plus conversion scratch that grows with BLOCK_N1, more below 64 query rows
            # (fitted over 53 bf16/fp16 configs compiled for sm_90 with triton 3.6,
            # 2026-11-30: BLOCK_M1 16-128 x BLOCK_N1 64/128, 2-3 stages, 4/8 warps, D=64/128)
            scratch_per_key = 5 * self.BLOCK_M1 // 2 if self.BLOCK_M1 >= 64 else 340
            dkdv = tiles + 4 * self.BLOCK_M1 * d + self.BLOCK_N1 * scratch_per_key
        elif self.atomic_dq:
            # the fp32 dQ block goes through shared memory on its way to the atomic adds;
            # below 64 query rows the dS^T K product's operands do too (sized as for at
            # least 32 rows: 16-row blocks took as much as 32-row ones)
            m = max(self.BLOCK_M1, 32)
            dkdv = max(dkdv + e * self.BLOCK_M1 * self.BLOCK_N1 // 8,
                       tiles + 1024 + 4 * m * d + (8 * m * self.BLOCK_N1 if self.BLOCK_M1 < 64 else 0))
        dq = e * d * (2 * self.BLOCK_M2 + 2 * self.dq_num_stages * self.BLOCK_N2) \
            + 4 * self.BLOCK_M2 * self.BLOCK_N2 * scratch(self.dq_num_warps)
        # TMA loads add their barriers and alignment: at most 1 KiB per kernel over the
        # pointer kernels (32 D=128 bf16 configs compiled for sm_90, 2026-11-30)
        return max(dkdv, dq) + 1024 * self.tma

    def validate(self, head_dim: int, dtype: torch.dtype, device=None) -> "BwdConfig":
        """Raise ConfigError naming the field if this config cannot run; return self."""
        self.check_fields()
        if self.atomic_dq and padded_head_dim(head_dim) > ATOMIC_DQ_MAX_HEAD_DIM:
            raise ConfigError(f"atomic_dq: supported up to head_dim {ATOMIC_DQ_MAX_HEAD_DIM}, got head_dim {head_dim}; "
                              "use atomic_dq=0")
        if self.tma:
            _check_tma(head_dim, dtype, device)
        _check_smem("BwdConfig", self.shared_memory(head_dim, dtype), device)
        return self


# ----------------------------------------------------------------------------------
# Heuristic defaults: (dtype, padded head_dim) -> config, per architecture; an entry
# keyed (dtype, padded head_dim, causal) overrides it for that masking.
# ----------------------------------------------------------------------------------
_F, _B = FwdConfig, BwdConfig
_bf, _fp, _f32 = torch.bfloat16, torch.float16, torch.float32

# Starting point: PyTorch FlexAttention's H100 forward table, Triton's fused-attention
# tutorial for the backward; revised by measurement on the H200 (docs/benchmarks.md).
_SM90_FWD = {
    # bf16 D=64: within 2% of the best of the 160-config space at N=4096 (B=4, H=32),
    # causal and not; D=128: within 1% (B=4, H=16). benchmarks/sweep_space.py, H200,
    # triton 3.6, 2026-11-29. Since revised by the searches of docs/tuning.md.
    (_bf, 16): _F(128, 64, 8, 3), (_bf, 32): _F(128, 64, 8, 3), (_bf, 64): _F(128, 64, 8, 3),
    # bf16 D=128 causal: 64x64 with TMA loads, the search's winner at N=1k..16k (report of
    # ae407ed in docs/tuning.md; TMA is 1.08x / 1.03x the pointer loads at N=1k / 4k,
    # docs/data/h200-2026-11-30/fwd_tma.json).
    # D=256: 128x64, 8 warps, 2 stages, 1.26x the 64x32 w4 s3 default before it on
    # gemma2-d256-train-4k (B=1, 16/8 heads, N=4096, causal; benchmarks/shapes.py --sweep, H200,
    # 2026-12-01, docs/shapes.md)
    (_bf, 128): _F(64, 64, 4, 3, tma=1), (_bf, 256): _F(128, 64, 8, 2),
    # bf16 D=128 non-causal: 64x128, 4 warps, one stage, TMA loads: the search's winner at
    # N=1k..16k, 1.22x / 1.12x / 1.08x the 128x128 w8 s3 TMA default before it (report of
    # ae407ed, docs/tuning.md).
    (_bf, 128, False): _F(64, 128, 4, 1, tma=1),
    (_f32, 16): _F(64, 32, 4, 3), (_f32, 32): _F(64, 32, 4, 3), (_f32, 64): _F(64, 32, 4, 3),
    (_f32, 128): _F(32, 64, 4, 3), (_f32, 256): _F(32, 32, 4, 3),
}
_SM90_BWD = {
    # bf16 D=64: the search's winner of all six D=64 keys (report of ae407ed in
    # docs/tuning.md): TMA loads, 1.00-1.03x the same blocks with pointer loads
    # non-causal, 1.09-1.13x causal. D=128: dQ in its own kernel with 8 warps, 3 stages,
    # the winner of all six D=128 keys there, 1.01-1.11x the atomic-dQ default before it.
    # D=16/32 keep pointer loads (TMA with tiles that narrow never ran on the GPU).
    (_bf, 16): _B(64, 64, 128, 64, 4, 3), (_bf, 32): _B(64, 64, 128, 64, 4, 3),
    (_bf, 64): _B(64, 64, 128, 64, 4, 3, tma=1), (_bf, 128): _B(64, 128, 128, 64, 8, 3, 8, 3),
    (_bf, 256): _B(32, 64, 64, 32, 8, 1),
    (_f32, 16): _B(32, 64, 64, 32, 4, 2), (_f32, 32): _B(32, 64, 64, 32, 4, 2),
    (_f32, 64): _B(32, 64, 64, 32, 4, 2), (_f32, 128): _B(32, 64, 64, 32, 4, 1),
    (_f32, 256): _B(16, 32, 32, 16, 4, 1),
}
# Decode (at most DECODE_MAX_Q queries per head): the split kernel with auto splits and
# grouped-query packing; BLOCK_M shrinks at launch to cover the packed rows, so the entry
# sizes K/V tiles and the pipeline depth for streaming the keys.
# Sweeps of 2026-12-01 on the H200 (benchmarks/shapes.py --sweep, docs/shapes.md): at D=128
# BLOCK_N 64/128 with 4 warps and 2 stages were within 2 % of the best on the three
# decode rows; at D=256 BLOCK_N=64, 2 stages was the best of both sweeps (host-bound
# timings: +-15 % between identical launches).
for _d in (16, 32, 64, 128):
    _SM90_FWD[(_bf, _d, "decode")] = _F(64, 128, 4, 2)
    _SM90_FWD[(_f32, _d, "decode")] = _F(32, 64, 4, 2)
_SM90_FWD[(_bf, 256, "decode")] = _F(64, 64, 4, 2)
_SM90_FWD[(_f32, 256, "decode")] = _F(32, 32, 4, 2)
_GENERIC_FWD = {(_bf, d): _F(64, 32, 4, 2) for d in (16, 32, 64, 128, 256)}
_GENERIC_FWD.update({(_bf, d, "decode"): _F(32, 64, 4, 2) for d in (16, 32, 64, 128, 256)})
_GENERIC_FWD.update({(_f32, d, "decode"): _F(32, 32, 4, 2) for d in (16, 32, 64, 128, 256)})
_GENERIC_FWD.update({(_f32, d): _F(32, 32, 4, 2) for d in (16, 32, 64, 128, 256)})
_GENERIC_BWD = {(_bf, d): _B(32, 32, 32, 32, 4, 2) for d in (16, 32, 64, 128, 256)}
_GENERIC_BWD.update({(_f32, d): _B(16, 32, 32, 16, 4, 1) for d in (16, 32, 64, 128, 256)})

# capability -> (fwd table, bwd table); fp16 shares bf16's entries.
HEURISTICS: dict[tuple[int, int], tuple[dict, dict]] = {
    (9, 0): (_SM90_FWD, _SM90_BWD),
    (0, 0): (_GENERIC_FWD, _GENERIC_BWD),
}
# Last resort when no table entry is valid on the device.
_SMALLEST_FWD = FwdConfig(16, 16, 4, 1)
_SMALLEST_BWD = BwdConfig(16, 16, 16, 16, 4, 1)


def device_capability(device) -> tuple[int, int]:
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_capability(dev)
    if dev is None and torch.cuda.is_available():
        return torch.cuda.get_device_capability()
    return (0, 0)


def default_config(pass_: str, head_dim: int, dtype: torch.dtype, device=None, causal: bool | None = None,
                   seq_q: int | None = None):
    """The heuristic config for a pass ("fwd" or "bwd") on ``device``.

    Walks the tables from the device's architecture down to the generic one and
    returns the first entry that validates on the device; within a table an entry for
    decode ((dtype, head_dim, "decode"), forward calls with ``seq_q`` at most
    DECODE_MAX_Q) comes first, then one for this masking ((dtype, head_dim, causal)),
    then the one for both.
    """
    if pass_ not in ("fwd", "bwd"):
        raise ValueError(f"pass_: expected 'fwd' or 'bwd', got {pass_!r}")
    cap = device_capability(device)
    key = (_bf if dtype == _fp else dtype, padded_head_dim(head_dim))
    keys = [key] if causal is None else [(*key, bool(causal)), key]
    if pass_ == "fwd" and seq_q is not None and seq_q <= DECODE_MAX_Q:
        keys.insert(0, (*key, "decode"))
    candidates = [tables[0 if pass_ == "fwd" else 1].get(k)
                  for c, tables in sorted(HEURISTICS.items(), reverse=True) if c <= cap for k in keys]
    candidates.append(_SMALLEST_FWD if pass_ == "fwd" else _SMALLEST_BWD)
    last_error: ConfigError | None = None
    for cfg in candidates:
        if cfg is None:
            continue
        try:
            return cfg.validate(head_dim, dtype, device)
        except ConfigError as e:
            last_error = e
    raise ConfigError(f"no valid default {pass_} config for head_dim={head_dim} dtype={dtype}: {last_error}")
