"""Kernel launch configs as data, their validity rules, and the heuristic defaults.

``FwdConfig`` and ``BwdConfig`` are frozen dataclasses. ``validate(shape, dtype, device)``
states every constraint the kernels have, so the autotuner can drop an impossible
config before it costs a compile, and the dispatcher can refuse a bad stored row.

The heuristic tables give the config used when nothing is tuned; they are keyed by
(dtype, padded head_dim) per architecture, and lookup walks from the device's
architecture down to the generic table (as PyTorch FlexAttention does).

(Longer than most modules, on purpose: each config class sits next to the measured
constraints of its kernel and the measured table entries that use it; a config field is
added in this one file. The tables may move out once the config classes stop changing.)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, Mapping

import torch

MIN_BLOCK = 16
MAX_BLOCK = 256
MAX_HEAD_DIM = 256
NUM_WARPS = (1, 2, 4, 8, 16)
MAX_STAGES = 8
# dK/dV programs per key block (BwdConfig.dkdv_split), and what its auto value aims at:
# key blocks x K/V heads x batch x split >= DKDV_PROGRAMS_PER_SM x SMs, query chunks of at
# least DKDV_MIN_CHUNK blocks
MAX_DKDV_SPLIT = 16
DKDV_PROGRAMS_PER_SM = 4
DKDV_MIN_CHUNK = 4
# the atomic-dQ backward's shared-memory need was measured up to this head dim only
ATOMIC_DQ_MAX_HEAD_DIM = 128
# TMA tile loads: run on the H200 for 16-bit inputs up to this padded head dim
TMA_MAX_HEAD_DIM = 128
# split-KV forward: at most this many chunks of the keys per query block
MAX_SPLITS = 128
# calls with at most this many queries per head take the decode entries of the heuristic tables
DECODE_MAX_Q = 16
# Long calls read a table's "long" entry first (the Gluon kernels on sm_90 at D=128): the
# forward from LONG_MIN_Q queries per head against at least LONG_MIN_K keys, the backward from
# LONG_MIN_Q_BWD queries; fp8 forward calls from LONG_MIN_Q_FP8 queries against LONG_MIN_K_FP8
# keys. See the tables' long entries for the measurements.
# 16-bit: 512 since 2026-12-05 (1024 queries against 2048 keys and 2048 queries for the backward
# before, when the Gluon kernels lost on square 1k calls). With the persistent forward's O tiles and
# its one-compare causal mask, and the backward's fused dQ, the Gluon defaults beat the Triton ones on
# the grid's short D=128 rows by 16-35 %: ratio to cuDNN, Triton default -> Gluon (the long entries'
# configs), forward 512 full 0.794 -> 0.979, causal 0.752 -> 0.874, 1024 full 0.815 -> 0.995, causal
# 0.796 -> 1.072; backward 512 full 0.754 -> 0.888, causal 0.787 -> 0.847, 1024 full 0.709 -> 0.890,
# causal 0.758 -> 0.867 (benchmarks/gluon_fwd.py and gluon_bwd.py --grid, H200, triton 3.6, GPU time,
# 2026-12-05; docs/gluon.md, docs/data/h200-2026-12-05d-gluon/).
# fp8 keeps 1024 against 2048: its Gluon variant lost at N=1024 causal (0.83x flashtune's bf16
# forward against the Triton fp8 kernel's 1.18x; the fp8 entry's comment).
LONG_MIN_Q = 512
LONG_MIN_K = 512
# the forward's long bound of queries of a (padded) head dim and masking (causal) where it is not
# LONG_MIN_Q (16-bit; the keys' bound stays LONG_MIN_K). D=64: 4096 for both maskings since 2026-12-06's
# second session, where the one-CTA Gluon kernel (64x128, 3 slots, O tiles) starts to match or beat two
# CTAs per SM (the middle band's entries below it; the D=64 entries' comments). (Causal 2048 with the
# Triton 128x64 w8 s3 as its long entry, and 512 without masking, before.)
LONG_MIN_Q_FWD_BY_HEAD_DIM = {(64, True): 4096, (64, False): 4096}
# The forward's middle band of a (padded) head dim: (fewest queries per head, fewest keys) of a 16-bit call
# below its long bound that reads the tables' "mid" entries (is_mid). D=64 from 192 queries against 192 keys:
# two CTAs per SM (FwdConfig.occupancy 2), 0.97-1.20x cuDNN on every D=64 row from 257 to 2048 queries measured
# (the D=64 entries' comments); B32 H12 at 197 queries 0.997x (grid kernel) against the Triton entry's 0.929x, at
# 128 queries 0.874x against 0.898x (benchmarks/gluon_fwd.py --shape ..., H100, 2026-12-06,
# docs/data/h100-2026-12-06g-gluon/fwd_short.log).
MID_MIN_FWD_BY_HEAD_DIM = {64: (192, 192)}
# Causal calls read the middle band's entries (the persistent kernel at two CTAs per SM) only where their
# tiles of 128 query rows (batch x query heads x ceil(queries / 128)) are at least this many per SM: on calls of
# one sequence that fill few SMs the Triton entry's 64-row blocks are faster (ratio to cuDNN, two CTAs against
# the Triton causal entry: B1 H12 N512, 48 tiles, 0.938 / 1.148; B1 H32 N256, 64 tiles, 0.939 / 1.054; B1 H12
# N2048, 192 tiles, 0.767 / 1.081; where they won, gpt2-train-512 has 1536 tiles, 11.6 an H100 SM; the
# threshold lies between, unmeasured). Without masking the grid kernel at two CTAs per SM was as fast as the
# Triton entry or faster on those calls (0.982 / 0.937, 1.011 / 1.013, 0.970 / 0.970): no bound.
# benchmarks/gluon_fwd.py --shape ..., H100, 2026-12-06 (docs/data/h100-2026-12-06g-gluon/fwd_short.log).
MID_MIN_TILES_PER_SM_CAUSAL = 4
LONG_MIN_Q_BWD = 512
LONG_MIN_Q_FP8 = 1024
LONG_MIN_K_FP8 = 2048
# the backward's long bound of a (padded) head dim and masking (causal) where it is not LONG_MIN_Q_BWD.
# D=64 without masking: 256 queries since 2026-12-06 (1024 before), where its long entry (the fused Gluon
# backward a step late, the share first) beats the Triton default with dK/dV through TMA (SHAPES.md's ViT
# row, 257 queries, 0.987x cuDNN against 0.905x; BERT at 512 0.952 / 0.901; grid 512 0.942 / 0.932);
# with masking 4096, where its causal entry starts to beat it (2048 0.946 / 0.949, 4096 0.958 / 0.913;
# GPT-2's 512-query row 0.966 / 1.027). The entries' comments. D=256 keeps LONG_MIN_Q_BWD: its long entry (the
# D=256 Gluon kernel) is 1.10-1.59x the Triton default from 512 queries on (its comment).
LONG_MIN_Q_BWD_BY_HEAD_DIM = {(64, False): 256, (64, True): 4096}


def decode_fills(batch_heads_kv: int | None, device) -> bool:
    """Whether a decode call (at most DECODE_MAX_Q queries per head) of ``batch_heads_kv``
    (batch x K/V heads; None: unknown) packed tiles fills the device's SMs, so that the auto
    schedule runs it in one chunk (decode.auto_splits): it then reads the tables'
    (dtype, head dim, "decode", "full") entry first. ``device`` None: the current CUDA device
    where there is one, as default_config reads it, else the CPU."""
    return batch_heads_kv is not None and batch_heads_kv >= _sm_count(device)


def _sm_count(device) -> int:
    """The SMs of ``device`` (None: the current CUDA device where there is one, as default_config
    reads it, else the CPU's stand-in, decode.INTERPRETER_SMS)."""
    from flashtune.kernels.decode import sm_count  # config imports no kernel module at import time

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return sm_count(torch.device(device))


def long_bounds(pass_: str, dtype: torch.dtype | None = None, head_dim: int | None = None,
                causal: bool | None = None) -> tuple[int, int | None]:
    """The fewest queries per head and keys (None: no bound) of a long call of ``pass_`` in
    ``dtype`` (None: a 16-bit one) at ``head_dim`` (None: one with no bound of its own) with
    ``causal`` masking (None: either; the lower bound of the two); the backward's by
    LONG_MIN_Q_BWD_BY_HEAD_DIM, the 16-bit forward's queries by LONG_MIN_Q_FWD_BY_HEAD_DIM, keyed
    by the head dim the tables pad it to and the masking."""
    if pass_ == "fwd" and dtype in FP8_DTYPES:
        return LONG_MIN_Q_FP8, LONG_MIN_K_FP8
    min_q, by_head_dim, min_k = ((LONG_MIN_Q, LONG_MIN_Q_FWD_BY_HEAD_DIM, LONG_MIN_K) if pass_ == "fwd"
                                 else (LONG_MIN_Q_BWD, LONG_MIN_Q_BWD_BY_HEAD_DIM, None))
    if head_dim is None:
        return min_q, min_k
    padded = padded_head_dim(head_dim, dtype)
    masks = (False, True) if causal is None else (bool(causal), )
    return min(by_head_dim.get((padded, m), min_q) for m in masks), min_k


def mid_bounds(dtype: torch.dtype | None = None, head_dim: int | None = None) -> tuple[int, int] | None:
    """The fewest queries per head and keys of a forward call in the middle band of ``dtype`` (None:
    a 16-bit one) at ``head_dim`` (MID_MIN_FWD_BY_HEAD_DIM, keyed by the padded head dim), or None
    where it has none (fp8, head dims without a bound, an unknown head dim)."""
    if head_dim is None or dtype in FP8_DTYPES:
        return None
    return MID_MIN_FWD_BY_HEAD_DIM.get(padded_head_dim(head_dim, dtype))


def is_mid(pass_: str, seq_q: int | None, seq_k: int | None = None, dtype: torch.dtype | None = None,
           head_dim: int | None = None, causal: bool | None = None, batch_heads: int | None = None,
           device=None) -> bool:
    """Whether a forward call of ``seq_q`` queries per head against ``seq_k`` keys (None: seq_q)
    reads the tables' middle-band ("mid") entries: from ``mid_bounds`` up to its long bound
    (``is_long``, which comes first); a causal one only where its ``batch_heads`` (batch x query
    heads; None: unknown, the lengths decide) give at least MID_MIN_TILES_PER_SM_CAUSAL tiles of
    128 query rows per SM of ``device`` (None: the current CUDA device, as default_config reads it)."""
    bounds = mid_bounds(dtype, head_dim)
    if pass_ != "fwd" or bounds is None or seq_q is None:
        return False
    seq_k = seq_q if seq_k is None else seq_k
    if seq_q < bounds[0] or seq_k < bounds[1] or is_long(pass_, seq_q, seq_k, dtype, head_dim, causal):
        return False
    if causal and batch_heads is not None:
        return batch_heads * -(-seq_q // 128) >= MID_MIN_TILES_PER_SM_CAUSAL * _sm_count(device)
    return True


def is_long(pass_: str, seq_q: int | None, seq_k: int | None = None, dtype: torch.dtype | None = None,
            head_dim: int | None = None, causal: bool | None = None) -> bool:
    """Whether a call of ``seq_q`` queries per head against ``seq_k`` keys (None: seq_q)
    in ``dtype`` (None: a 16-bit one) at ``head_dim`` with ``causal`` masking (``long_bounds``)
    reads the tables' long entries."""
    if seq_q is None:
        return False
    min_q, min_k = long_bounds(pass_, dtype, head_dim, causal)
    return seq_q >= min_q and (min_k is None or (seq_q if seq_k is None else seq_k) >= min_k)
# fp8 inputs (kernels/fp8.py): the forward only. Triton's fp8 dots need a reduction of at
# least 32 (the tensor cores' fp8 K step): the head dim pads to 32, BLOCK_N (P @ V's K) >= 32.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_MIN_K = 32

# Shared memory per block (opt-in maximum) by compute capability, used when torch
# cannot tell (older torch, or the interpreter).
_SMEM_BY_CAPABILITY = {(9, 0): 232448, (8, 0): 166912, (8, 6): 101376, (8, 9): 101376, (7, 5): 65536}
_INTERPRETER_SMEM = 1 << 30  # the interpreter has no shared-memory limit


class ConfigError(ValueError):
    """A config that the kernel cannot run; the message names the field."""


def padded_head_dim(head_dim: int, dtype: torch.dtype | None = None) -> int:
    """The tile width the kernels use for a head dim: next power of two, at least 16 (at
    least FP8_MIN_K for an fp8 ``dtype``)."""
    return max(FP8_MIN_K if dtype in FP8_DTYPES else MIN_BLOCK, 1 << (int(head_dim) - 1).bit_length())


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


class _FieldNames:
    """A config class's field names (``FIELDS``) or those with a default (``OPTIONAL``),
    read from the dataclass itself: a field added with a default needs no list updated."""

    def __init__(self, optional: bool):
        self.optional = optional

    def __get__(self, obj, cls):
        fields = dataclasses.fields(cls)
        if self.optional:
            return frozenset(f.name for f in fields
                             if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
        return tuple(f.name for f in fields)


# pass ("fwd", "bwd") -> its config class; filled by each class's definition
CONFIG_CLASSES: dict[str, type] = {}


def config_class(pass_: str) -> type:
    """``FwdConfig`` for "fwd", ``BwdConfig`` for "bwd"."""
    try:
        return CONFIG_CLASSES[pass_]
    except KeyError:
        raise ValueError(f"pass_: expected {' or '.join(map(repr, CONFIG_CLASSES))}, got {pass_!r}") from None


class _ConfigBase:
    """What every config class carries: its pass, its fields, its search space, its JSON
    form (read and written here only), its label and its canonical identity."""

    PASS: ClassVar[str]
    # the fields, in order, and those that stored data written before they existed may
    # lack (their defaults apply): both read from the dataclass
    FIELDS = _FieldNames(optional=False)
    OPTIONAL = _FieldNames(optional=True)
    # The JSON form is the dict of every field. Version 1: a field added later with a
    # default may be missing (older data), and reads as its default. A change that is
    # not such an addition bumps this, and from_dict reads the older versions.
    JSON_VERSION: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "PASS" in cls.__dict__:
            CONFIG_CLASSES.setdefault(cls.PASS, cls)

    def to_dict(self) -> dict[str, int]:
        """The JSON form, as stored, exported and sent to the trial worker."""
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        """Build a config from its JSON form; unknown or missing fields raise ConfigError."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{cls.__name__}: expected a mapping of fields, got {type(data).__name__}")
        missing = [f for f in cls.FIELDS if f not in data and f not in cls.OPTIONAL]
        extra = sorted(set(data) - set(cls.FIELDS))
        if missing or extra:
            raise ConfigError(f"{cls.__name__}: missing fields {missing}, unknown fields {extra}")
        cfg = cls(**{f: data[f] for f in cls.FIELDS if f in data})
        cfg.check_fields()
        return cfg

    @classmethod
    def search_space(cls) -> dict[str, list]:
        """The values the autotuner samples for each field (``kernels.space``)."""
        from flashtune.kernels.space import SPACES

        return SPACES[cls.PASS][1]

    # family -> {field: (its fixed value, the valid values it replaces)}: the fields a kernel
    # family does not read (each class sets its own; kernels/space.py enumerates with it)
    UNUSED_BY_FAMILY: ClassVar[dict] = {}

    def _fix_unused_fields(self) -> None:
        # The fields the config's family does not read take fixed values, so a config is its
        # own canonical form: a sampled config, the row it is stored as and its re-run compare
        # equal. Only valid values are replaced (check_fields still names a bad one).
        fixed = self.UNUSED_BY_FAMILY.get(self.family if type(self.family) is int else None, {})
        for name, (value, valid) in fixed.items():
            if type(getattr(self, name)) is int and getattr(self, name) in valid:
                object.__setattr__(self, name, value)

    def _flags_as_ints(self, *names: str) -> None:
        # True/False given for a 0/1 flag field: stored (and compared) as the int
        for name in names:
            if isinstance(getattr(self, name), bool):
                object.__setattr__(self, name, int(getattr(self, name)))

    def validate_anywhere(self, head_dim: int, dtype: torch.dtype):
        """Raise ConfigError if this config runs on no device (the device-independent rules of
        ``validate``, as the CPU's interpreter applies them); return self. What a store checks
        before it keeps a config."""
        return self.validate(head_dim, dtype, "cpu")

    def canonical(self):
        """The config's identity: the same kernel launch with the fields it does not use
        set to fixed values (hashable; two configs that launch alike are equal here)."""
        return self

    def short(self) -> str:
        return " ".join(f"{f}={getattr(self, f)}" for f in self.FIELDS)

    def _extra_label(self, shown: tuple[str, ...]) -> str:
        """`` name=value`` for each field the compact label does not show, where it is not
        the default (so a field added later shows without a label change)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return "".join(f" {name}={getattr(self, name)}" for name in self.FIELDS
                       if name not in shown and getattr(self, name) != defaults[name])


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
    tensor memory accelerator (one copy instruction per tile; up to 8 % faster at D=128
    on the H200, 5-9 % slower at D=64: docs/data/h200-2026-11-30/fwd_tma.json). A TMA
    config whose tensors the copy engine cannot address (head dim not unit-stride, or
    base or strides not 16-byte aligned) runs with pointer loads. Constraints: BLOCK_M
    and BLOCK_N powers of two in [16, 256]; num_warps in {1, 2, 4, 8, 16}; num_stages in
    [1, 8]; tma 0 or 1, 1 only for 16-bit dtypes, head dims up to 128 and compute
    capability 9.0 or newer; the estimated shared memory (the Q tile plus num_stages
    buffers of a K and a V tile) within the device's limit. fp8 inputs (kernels/fp8.py):
    BLOCK_N at least 32 and tma=0; num_splits and pack_gqa are ignored (the plain kernel
    always runs); BLOCK_M below 64 runs but compiles to fp16 mma.sync on sm_90, not fp8
    wgmma (docs/fp8.md).

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

    The kernel family, ``family``: 0 (the default) the Triton kernel above; 1 the Gluon
    warp-specialised kernel for sm_90 (kernels/gluon_forward.py: a TMA producer warp and
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
    contiguous) runs the Triton kernel's default (``as_triton``).
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
        """The Gluon kernel's own config class for this config (kernels/gluon_forward.py)."""
        from flashtune.kernels.gluon_forward import CONSUMER_REGS_BY_OCCUPANCY, GluonFwdConfig

        return GluonFwdConfig(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, NUM_BUFFERS=self.num_stages,
                              PINGPONG=self.pingpong, OVERLAP=self.overlap, PERSISTENT=self.persistent,
                              O_TILE=self.o_tile, CONSUMER_REGS=CONSUMER_REGS_BY_OCCUPANCY[self.occupancy])

    def as_triton(self, head_dim: int, dtype: torch.dtype, device=None, causal: bool | None = None) -> "FwdConfig":
        """The config that runs a call the Gluon kernel cannot (a softcap, packed
        sequences, dropout, an fp8 V with its head dim contiguous): the Triton kernel's
        heuristic default for the head dim, dtype, device and masking (``_triton_default``,
        cached: never a Gluon entry); a Triton config itself."""
        return self if not self.family else _triton_default("fwd", head_dim, dtype, resolve_device(device), causal)

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
        # fp8 tiles take one byte an element: half of a 16-bit config's need. Equal to what
        # triton 3.6 allocated compiling the fp8 defaults for sm_90 (D=64/128/256, V's keys
        # contiguous; less with V's head dim contiguous: V then skips the pipeline),
        # tests/kernels/test_fp8.py, 2026-12-02.
        # Q tile + num_stages buffers of K and V: equal to what Triton 3.6 allocated for
        # every config of the space at D=64 bf16 with num_stages >= 2 (an upper bound
        # at num_stages=1), measured on the H200 with benchmarks/sweep_space.py. TMA
        # loads add their barriers and alignment: at most 1 KiB over the pointer kernel in
        # all 72 D=128 bf16 configs of BLOCK_M 64..256, BLOCK_N 32..128, 4/8 warps, 1..4
        # stages, compiled for sm_90 (2026-11-30).
        # The DROPOUT kernel converts the mask's [BLOCK_M, BLOCK_N] tile (one byte an element)
        # into the scores' layout through shared memory: exactly BLOCK_M * BLOCK_N bytes more
        # in 7 configs compiled for sm_90 with triton 3.6 (BLOCK_M 64-256 x BLOCK_N 32-128,
        # bf16 and fp32, D=64-256, with and without TMA, 2026-12-02).
        return e * d * (self.BLOCK_M + 2 * self.num_stages * self.BLOCK_N) + 1024 * self.tma \
            + self.BLOCK_M * self.BLOCK_N * bool(dropout)

    def validate(self, head_dim: int, dtype: torch.dtype, device=None, dropout: bool = False) -> "FwdConfig":
        """Raise ConfigError naming the field if this config cannot run (``dropout``: its
        DROPOUT kernel); return self.

        A Gluon config (``family=1``) is checked by GluonFwdConfig.validate on the device
        (None: the current CUDA device, else the CPU), which must be a CUDA sm_90 one; with
        ``dropout`` also the Triton configs that run such a call instead (``as_triton``)."""
        self.check_fields()
        if self.family:
            # no device: the current one, as device_capability reads it (the CPU without a GPU)
            self._gluon_validate(head_dim, dtype, device if device is not None else resolve_device())
            if dropout:
                for causal in (False, True):
                    self.as_triton(head_dim, dtype, device, causal).validate(head_dim, dtype, device, dropout=True)
            return self
        if self.tma:
            _check_tma(head_dim, dtype, device)
        if dtype in FP8_DTYPES and self.BLOCK_N < FP8_MIN_K:
            raise ConfigError(f"BLOCK_N: expected at least {FP8_MIN_K} for {dtype} inputs (the fp8 dot P @ V "
                              f"reduces over BLOCK_N keys, and fp8 dots need at least {FP8_MIN_K}), got {self.BLOCK_N}")
        _check_smem("FwdConfig", self.shared_memory(head_dim, dtype, dropout), device)
        return self


# what BwdConfig fixes on construction per family (_ConfigBase.UNUSED_BY_FAMILY): the Gluon
# dK/dV kernel's unused fields; with the Gluon dQ kernel (2) also the Triton dQ kernel's
_GLUON_DKDV_UNUSED = {"num_warps": (4, (1, 2, 4, 8, 16)), "atomic_dq": (0, (0, 1))}
_BLOCKS = (16, 32, 64, 128, 256)
_FUSED_DQ_UNUSED = {**_GLUON_DKDV_UNUSED, "dq_num_warps": (4, (1, 2, 4, 8, 16)), "BLOCK_M2": (64, _BLOCKS),
                    "BLOCK_N2": (64, _BLOCKS), "dq_num_stages": (2, range(1, 9)), "tma": (0, (0, 1))}
# dq_first orders the fused dQ's share (families 3 and 4): the others have none
_NO_DQ_SHARE = {"dq_first": (0, (0, 1))}
_BWD_UNUSED_BY_FAMILY = {
    0: _NO_DQ_SHARE,
    1: {**_GLUON_DKDV_UNUSED, **_NO_DQ_SHARE},
    2: {**_GLUON_DKDV_UNUSED, **_NO_DQ_SHARE, "dq_num_warps": (4, (1, 2, 4, 8, 16)), "BLOCK_M2": (64, _BLOCKS),
        "tma": (0, (0, 1))},
    # the fused dQ (each step's share in its step, or a step late): no dQ kernel, no dQ half
    3: _FUSED_DQ_UNUSED,
    4: _FUSED_DQ_UNUSED,
}
BWD_FAMILIES = (0, 1, 2, 3, 4)


def _check_gluon_dq_head_dim(family: int, head_dim: int) -> None:
    """The Gluon dQ kernel (family 2) runs head dims 64 and 128 only (the D=256 dK/dV kernel fuses dQ or
    leaves it to the Triton dQ kernel)."""
    if family == 2 and head_dim > 128:
        raise ConfigError(f"family: the Gluon dQ kernel (family 2) runs head dims up to 128, got head_dim {head_dim}; "
                          "use family 1 or 3")


@dataclasses.dataclass(frozen=True, order=True)
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
    Constraints: the four blocks powers of two in [16, 256] (with no rule between them:
    the dK/dV kernel finds the query blocks that straddle the causal diagonal by ceiling
    division, so BLOCK_N1 need not be a multiple of BLOCK_M1); warps in {1, 2, 4, 8, 16};
    stages in [1, 8]; atomic_dq 0 or 1; the estimated shared memory of each kernel within
    the device's limit. ``tma=1`` loads the walked tiles (Q and dO in the dK/dV kernel, K
    and V in the dQ kernel) through TMA descriptors, under the forward's conditions (see
    FwdConfig); with ``atomic_dq=1`` on a GPU it also sends each tile's dQ share as one
    TMA bulk reduce-add instead of an atomic add per element.

    ``dkdv_split``: how many programs share one block of keys' dK/dV (0 to 16; 0, the
    default, lets ``dkdv_split()`` choose at launch from the shape and the SM count). The
    programs of a block split the query heads of its group (as far as the split divides
    the group) and then the query blocks; each writes fp32 partials that one more kernel
    sums in a fixed order (deterministic) and casts. It fills the GPU when key blocks x
    K/V heads x batch is small (one K/V head, batch 1), at the cost of the partials'
    traffic and one launch; on a shape that fills the GPU an explicit value is lowered
    (see ``dkdv_split()``).

    The kernel family, ``family``: 0 (the default) the Triton kernels above; 1 the Gluon
    warp-specialised dK/dV kernel for sm_90 (kernels/gluon_backward.py: a TMA producer warp
    and two consumer warp groups of BLOCK_N1 keys each, so a program covers 2 x BLOCK_N1
    keys, walking BLOCK_M1 queries a step; num_stages is its Q/dO ring's slot count) with
    the Triton preprocess and dQ kernel (the dQ half's fields and ``tma`` apply to it); 2 the
    same dK/dV kernel and the Gluon dQ kernel (two consumer warp groups of BLOCK_M2 = 64
    queries each walking BLOCK_N2 keys a step through a ring of dq_num_stages K/V slots).
    A Gluon config validates only for BLOCK_N1 64, head dims 64 and 128, float16/bfloat16
    and a device of compute capability 9.0; num_warps and atomic_dq do not apply to it (its
    canonical form fixes them: 4, 0; family 2 also dq_num_warps 4, BLOCK_M2 64 and tma 0);
    ``dkdv_split`` does, with its own auto target (``dkdv_split()``; configs stored before it
    did hold 1, unsplit, and launch as they did). Family 3: the Gluon dK/dV kernel computing
    dQ too (GluonBwdConfig.DQ_FUSED: TMA bulk reduce-adds into an fp32 buffer, five matmuls;
    BLOCK_M1 64 only; no dQ half, its fields fixed at 64, 64, 4 warps, 2 stages, tma 0; under
    ``torch.use_deterministic_algorithms`` dQ comes from the Triton default's dQ kernel);
    family 4 the same with each step's dQ share computed a step late (DQ_FUSED=2); for both,
    ``dq_first`` 1 issues the share's wgmmas ahead of the step's dV and dK and stores it under
    them (GluonBwdConfig.DQ_FIRST; the other families hold 0), chosen per key by the search. A
    call the Gluon kernels cannot run (a softcap, a window, packed sequences, dropout) runs
    the Triton default (``as_triton``).
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
    dkdv_split: int = 0
    family: int = 0
    dq_first: int = 0

    PASS: ClassVar[str] = "bwd"
    UNUSED_BY_FAMILY: ClassVar[dict] = _BWD_UNUSED_BY_FAMILY
    # the fields only the dQ kernel uses (a config's "dQ half")
    DQ_FIELDS: ClassVar[tuple[str, ...]] = ("BLOCK_M2", "BLOCK_N2", "dq_num_warps", "dq_num_stages")

    def __post_init__(self) -> None:
        # the dQ kernel's launch values default to the dK/dV kernel's (configs stored
        # before these fields existed launched both kernels with one pair)
        if self.dq_num_warps is None:
            object.__setattr__(self, "dq_num_warps", self.num_warps)
        if self.dq_num_stages is None:
            object.__setattr__(self, "dq_num_stages", self.num_stages)
        self._flags_as_ints("atomic_dq", "tma", "family", "dq_first")
        self._fix_unused_fields()

    def label(self) -> str:
        """Compact: ``M1xN1/M2xN2 wW sS`` (dK/dV then dQ blocks), ``M1xN1 wW sS / M2xN2 wW sS``
        when the dQ kernel has its own warps or stages, ``M1xN1 wW sS atomic-dQ`` when dQ is
        accumulated in the dK/dV kernel; `` tma`` when tiles load through TMA."""
        launch = f"w{self.num_warps} s{self.num_stages}"
        dq_launch = f"w{self.dq_num_warps} s{self.dq_num_stages}"
        tma = " tma" if self.tma else ""
        # the Gluon families' labels: every field but dkdv_split shown or fixed by the family
        gluon_shown = tuple(name for name in self.FIELDS if name != "dkdv_split")
        if self.family >= 3:  # ``gluon 2xN1 mM1 bS fused-dQ[ late]``: dQ in the Gluon dK/dV kernel
            return (f"gluon 2x{self.BLOCK_N1} m{self.BLOCK_M1} b{self.num_stages} fused-dQ"
                    f"{' late' if self.family == 4 else ''}{' first' if self.dq_first else ''}"
                    + self._extra_label(gluon_shown))
        if self.family == 2:  # ``gluon 2xN1 mM1 bS / gluon-dq nN2 bS``: both Gluon kernels
            return (f"gluon 2x{self.BLOCK_N1} m{self.BLOCK_M1} b{self.num_stages} / gluon-dq n{self.BLOCK_N2} "
                    f"b{self.dq_num_stages}" + self._extra_label(gluon_shown))
        if self.family:  # ``gluon 2xN1 mM1 bS / M2xN2 wW sS``: the Gluon dK/dV kernel, the dQ kernel
            return (f"gluon 2x{self.BLOCK_N1} m{self.BLOCK_M1} b{self.num_stages} / {self.BLOCK_M2}x{self.BLOCK_N2} "
                    f"{dq_launch}{tma}" + self._extra_label(gluon_shown))
        if self.atomic_dq:
            text = f"{self.BLOCK_M1}x{self.BLOCK_N1} {launch} atomic-dQ{tma}"
        elif dq_launch == launch:
            text = f"{self.BLOCK_M1}x{self.BLOCK_N1}/{self.BLOCK_M2}x{self.BLOCK_N2} {launch}{tma}"
        else:
            text = f"{self.BLOCK_M1}x{self.BLOCK_N1} {launch} / {self.BLOCK_M2}x{self.BLOCK_N2} {dq_launch}{tma}"
        shown = ("BLOCK_M1", "BLOCK_N1", "num_warps", "num_stages", "atomic_dq", "tma", *self.DQ_FIELDS)
        return text + self._extra_label(shown)

    def gluon(self):
        """The Gluon dK/dV kernel's own config class for this config (kernels/gluon_backward.py)."""
        from flashtune.kernels.gluon_backward import GluonBwdConfig

        dq = dict(DQ_BLOCK_N=self.BLOCK_N2, DQ_BUFFERS=self.dq_num_stages) if self.family == 2 else {}
        if self.family >= 3:
            dq = dict(DQ_FUSED=self.family - 2, DQ_FIRST=self.dq_first)
        return GluonBwdConfig(BLOCK_M=self.BLOCK_M1, BLOCK_N=self.BLOCK_N1, NUM_BUFFERS=self.num_stages, **dq)

    def as_triton(self, head_dim: int, dtype: torch.dtype, device=None, causal: bool | None = None) -> "BwdConfig":
        """The config that runs a call the Gluon kernel cannot (a softcap, a window, packed
        sequences, dropout): the Triton heuristic default (cached); a Triton config itself."""
        return self if not self.family else _triton_default("bwd", head_dim, dtype, resolve_device(device), causal)

    def validate_anywhere(self, head_dim: int, dtype: torch.dtype) -> "BwdConfig":
        """A Gluon config: against sm_90's limits, the one architecture it runs on."""
        if not self.family:
            return super().validate_anywhere(head_dim, dtype)
        self.check_fields()
        _check_gluon_dq_head_dim(self.family, head_dim)
        self.gluon().validate(head_dim, dtype, None)
        return self

    def check_fields(self) -> None:
        for name in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"):
            _check_block(name, getattr(self, name))
        _check_launch(self.num_warps, self.num_stages)
        _check_launch(self.dq_num_warps, self.dq_num_stages, prefix="dq_")
        _check_flag("atomic_dq", self.atomic_dq)
        _check_flag("tma", self.tma)
        _check_flag("dq_first", self.dq_first)
        if type(self.family) is not int or self.family not in BWD_FAMILIES:
            raise ConfigError(f"family: expected one of {BWD_FAMILIES} (0 Triton, 1 the Gluon dK/dV kernel, 2 both "
                              f"Gluon kernels, 3 and 4 the Gluon dK/dV kernel with dQ fused), got {self.family!r}")
        if (not isinstance(self.dkdv_split, int) or isinstance(self.dkdv_split, bool)
                or not 0 <= self.dkdv_split <= MAX_DKDV_SPLIT):
            raise ConfigError(f"dkdv_split: expected an integer in [0, {MAX_DKDV_SPLIT}] (0: chosen at launch), "
                              f"got {self.dkdv_split!r}")

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
        if self.family >= 3:  # one kernel (the Triton dQ kernel of the deterministic fallback is the default's)
            return self.gluon().shared_memory(head_dim, dtype)
        if self.family == 2:  # the Gluon kernels' own estimates
            return max(self.gluon().shared_memory(head_dim, dtype), self.gluon().dq_shared_memory(head_dim, dtype))
        dq = self._dq_shared_memory(head_dim, dtype)
        if self.family:  # the Gluon dK/dV kernel's own estimate, with the Triton dQ kernel's
            return max(self.gluon().shared_memory(head_dim, dtype), dq + 1024 * self.tma)
        # TMA loads add their barriers and alignment: at most 1 KiB per kernel over the
        # pointer kernels (32 D=128 bf16 configs compiled for sm_90, 2026-11-30)
        return max(dkdv, dq) + 1024 * self.tma

    def _dq_shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        """The dQ kernel's estimate (shared_memory's terms), without TMA's barriers."""
        d, e = padded_head_dim(head_dim), _element_size(dtype)
        scratch = max(9, self.dq_num_warps + 1) if e == 4 else 2
        return e * d * (2 * self.BLOCK_M2 + 2 * self.dq_num_stages * self.BLOCK_N2) \
            + 4 * self.BLOCK_M2 * self.BLOCK_N2 * scratch

    def validate(self, head_dim: int, dtype: torch.dtype, device=None, dropout: bool = False) -> "BwdConfig":
        """Raise ConfigError naming the field if this config cannot run; return self. The
        estimate covers the DROPOUT kernels as they are (``dropout`` changes nothing: compiled
        for sm_90, tests/kernels/test_shared_memory_sm90.py).

        A Gluon config (``family=1``) is checked by GluonBwdConfig.validate on the device
        (None: the current CUDA device, else the CPU), which must be a CUDA sm_90 one, and its
        dQ half as the Triton dQ kernel's; with ``dropout`` also the Triton configs that run
        such a call instead (``as_triton``)."""
        self.check_fields()
        if self.family:
            _check_gluon_dq_head_dim(self.family, head_dim)
            self.gluon().validate(head_dim, dtype, device if device is not None else resolve_device())
            if self.family >= 2:
                if dropout:
                    for causal in (False, True):
                        self.as_triton(head_dim, dtype, device, causal).validate(head_dim, dtype, device,
                                                                                 dropout=True)
                return self
            if self.tma:
                _check_tma(head_dim, dtype, device)
            _check_smem("BwdConfig", self._dq_shared_memory(head_dim, dtype) + 1024 * self.tma, device)
            if dropout:
                for causal in (False, True):
                    self.as_triton(head_dim, dtype, device, causal).validate(head_dim, dtype, device, dropout=True)
            return self
        if self.atomic_dq and padded_head_dim(head_dim) > ATOMIC_DQ_MAX_HEAD_DIM:
            raise ConfigError(f"atomic_dq: supported up to head_dim {ATOMIC_DQ_MAX_HEAD_DIM}, got head_dim {head_dim}; "
                              "use atomic_dq=0")
        if self.tma:
            _check_tma(head_dim, dtype, device)
        _check_smem("BwdConfig", self.shared_memory(head_dim, dtype), device)
        return self


def dkdv_split(config: BwdConfig, *, batch: int, heads_q: int, heads_kv: int, n_q: int, n_k: int,
               sm_count: int) -> tuple[int, int]:
    """(head splits, query splits) of one block of keys' dK/dV work for a launch of ``config``.

    An explicit ``config.dkdv_split`` S splits the group's query heads gcd(S, group) ways and
    the query blocks the rest (at most one chunk per query block; S is lowered until key
    blocks x K/V heads x batch x S is at most twice the auto target). With 0 (auto): no split
    once key blocks x K/V heads x batch reaches DKDV_PROGRAMS_PER_SM programs per SM;
    otherwise the smallest divisor of the group that reaches it (at most MAX_DKDV_SPLIT),
    and query chunks (powers of two, of at least DKDV_MIN_CHUNK blocks) only while that
    still leaves the GPU less than half that full. On the H200 (bwd_shapes.py, 2026-12-01,
    bf16 D=128 causal) head splits paid and query chunks cost: B=2 Hq=8 Hkv=1 N=4k 281 TFLOPS
    split 8 heads, 261 with 8 heads x 2 chunks, 135 unsplit; B=1 32/8 N=8k: 390 with 4, 373
    with 2, 352 unsplit, 348 with 4 x 2; B=4 32/8 N=2k: 285 with 2, 276 with 4, 272 unsplit.

    (The Gluon dK/dV kernel applies the same rule to its own program size and target:
    gluon_backward.gluon_attention_backward.)
    """
    return split_work(config.dkdv_split, block_m=config.BLOCK_M1, keys_per_program=config.BLOCK_N1,
                      programs_per_sm=DKDV_PROGRAMS_PER_SM, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                      n_q=n_q, n_k=n_k, sm_count=sm_count)


def split_work(requested: int, *, block_m: int, keys_per_program: int, programs_per_sm: int, batch: int,
               heads_q: int, heads_kv: int, n_q: int, n_k: int, sm_count: int) -> tuple[int, int]:
    """``dkdv_split``'s rule for a kernel of ``keys_per_program`` keys and ``block_m``
    queries a step, targeting ``programs_per_sm`` programs per SM; ``requested`` as
    ``BwdConfig.dkdv_split`` (0: auto)."""
    group = heads_q // heads_kv
    q_blocks = -(-n_q // block_m)
    programs = -(-n_k // keys_per_program) * heads_kv * batch
    target = programs_per_sm * sm_count
    # an explicit split (tuned where the key's shape left the GPU idle) never takes the grid
    # past twice the target: the partials cost 2 x split x dK's size in fp32
    split = max(1, min(requested, 2 * target // programs)) if requested else 0
    if split == 0:
        if programs >= target:
            return 1, 1
        divisors = [d for d in range(1, min(group, MAX_DKDV_SPLIT) + 1) if group % d == 0]
        split = next((d for d in divisors if programs * d >= target), divisors[-1])
        while (2 * programs * split <= target and 2 * split <= MAX_DKDV_SPLIT
               and 2 * split // divisors[-1] * DKDV_MIN_CHUNK <= q_blocks):
            split *= 2
    split_h = math.gcd(split, group)
    split_q = max(1, min(split // split_h, q_blocks))
    return split_h, split_q


# Heaviest-first launch order of the causal backward's kernels (lpt_group): the programs
# running together should share at most this many bytes of walked tiles in L2 (half of the
# H200's 50 MB), yet a group of units should cover at least LPT_WAVES waves of the GPU
LPT_L2_BYTES = 24 << 20
LPT_WAVES = 2
# ... and the query-block kernels (the forwards, the dQ kernel) take the order only where the
# tail it removes is a large part of the launch: lpt_waves() at most LPT_MAX_WAVES. Measured
# on the H200 (2026-12-03, benchmarks/lpt_order.py, docs/shapes.md): at 2-4 heavy waves
# (llama3-70b-tp8, qwen, gemma2-d256, prefill-2k) the forward gained 1.08-1.19x and the dQ
# kernel 1.04-1.20x; at 7-17 (llama3-8b-8k, mistral, gpt2, the standard grid) both moved
# within 0.92-1.03x, the L2 reuse of the per-head order weighing against the shorter tail.
LPT_MAX_WAVES = 6.0


def lpt_waves(units: int, programs_per_unit: int, slots: int) -> float:
    """The causal work of ``units`` of ``programs_per_unit`` programs (the i-th walking about
    i + 1 tiles) per slot of the GPU, counted in the heaviest program's work: how many of
    the heaviest programs each slot runs. Few (2-4): the last heavy programs started in grid
    order decide the launch's end, and the heaviest-first order shortens it."""
    return units * (programs_per_unit + 1) / (2 * max(1, slots))


def lpt_pays(units: int, programs_per_unit: int, slots: int) -> bool:
    """Whether a query-block kernel's launch takes the heaviest-first order: lpt_waves at
    most LPT_MAX_WAVES (read at each call, so a benchmark can lift it)."""
    return lpt_waves(units, programs_per_unit, slots) <= LPT_MAX_WAVES


def lpt_group(units: int, programs_per_unit: int, bytes_per_unit: int, *, slots: int) -> int:
    """Units per group of a heaviest-first (longest-processing-time) launch order: the
    backward kernels under causal masking run their programs group by group, and within a
    group the heaviest block of every unit first, so the short programs fill the SMs at the
    end. A group holds as many units as keep the tiles they walk within LPT_L2_BYTES, but at
    least as many as give LPT_WAVES waves of ``slots`` programs (fewer leave SMs idle while
    the group's last heavy programs run: measured on the H200, 2026-12-03, llama3-70b-tp8's
    dK/dV kernel took 1.25x as long in groups of 6 and 2 units as in one group of 8); and
    the groups are made equal, within one unit, so no small group runs last."""
    if units < 1 or programs_per_unit < 1:
        raise ValueError(f"lpt_group: expected units and programs_per_unit >= 1, got {units}, {programs_per_unit}")
    cap = max(1, LPT_L2_BYTES // max(1, bytes_per_unit))
    fill = -(-LPT_WAVES * slots // programs_per_unit)
    size = min(units, max(cap, fill))
    groups = -(-units // size)
    return -(-units // groups)


# ----------------------------------------------------------------------------------
# Heuristic defaults: (dtype, padded head_dim) -> config, per architecture; an entry
# keyed (dtype, padded head_dim, causal) overrides it for that masking.
# ----------------------------------------------------------------------------------
_F, _B = FwdConfig, BwdConfig
_bf, _fp, _f32 = torch.bfloat16, torch.float16, torch.float32
_f8 = torch.float8_e4m3fn  # the key of both fp8 dtypes (e5m2 shares e4m3's entries)

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
    # bf16 D=64 causal (on sm_90 below the middle band, MID_MIN_FWD_BY_HEAD_DIM, and the Triton fallback of
    # the Gluon entries; the long causal entry was the D=64 one from 2048 queries until 2026-12-06's second
    # session): 64x64, 4 warps, 3 stages, ratio to cuDNN against 128x64 w8 s3 (the D=64 entry) in two
    # runs: grid 512 0.897 / 0.806, 0.900 / 0.814; 1024 0.918 / 0.865, 0.914 / 0.873; from 2048 it loses
    # (2048 0.908 / 0.928, 0.915 / 0.915; 4096 0.898 / 0.942, 0.906 / 0.947; 8192 0.922 / 0.944; 16384
    # 0.924 / 0.949). SHAPES.md's gpt2-train-512: 0.0631 ms against 0.0705 (1.12x, 0.904x cuDNN), the
    # fastest of 56 Triton and Gluon configs. benchmarks/attention.py --head-dims 64 --passes fwd --rounds 2
    # [--configs fwd_d64_candidates.json] and benchmarks/shapes.py --rows gpt2-train-512 bert-base-512
    # --passes fwd --sweep fwd_d64_sweep_in.json, GPU time, H100, triton 3.6, 2026-12-06
    # (docs/data/h100-2026-12-06e-gluon/, run5.sh and run6.sh; docs/gluon.md).
    (_bf, 64, True): _F(64, 64, 4, 3),
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
    # bf16 D=64 non-causal: pointer loads. Short sequences are bound by the host, and each TMA
    # launch builds its descriptors there: B=32 H=12 N=512 (BERT) 257 TFLOPS against 176 with
    # TMA, B=32 H=16 N=257 (ViT) 109 against 86 (benchmarks/bwd_shapes.py, H200, 2026-12-01);
    # TMA gained 0-3 % on the standard grid.
    (_bf, 64, False): _B(64, 64, 128, 64, 4, 3),
    # bf16 D=256: dK/dV 64x64 with 8 warps, 2 stages (129 TFLOPS with the old dQ kernel,
    # against 112 for 32x64 w8 s1) and dQ 64x64 with 4 warps, 2 stages (161 with the old dK/dV
    # kernel): the best of each kernel's sweep at B=1 Hq=16 Hkv=8 N=4k causal; together 216
    # TFLOPS, 0.62x cuDNN (bwd_shapes.py, H200, 2026-12-01; docs/backward-shapes.md).
    (_bf, 256): _B(64, 64, 64, 64, 8, 2, 4, 2),
    (_f32, 16): _B(32, 64, 64, 32, 4, 2), (_f32, 32): _B(32, 64, 64, 32, 4, 2),
    (_f32, 64): _B(32, 64, 64, 32, 4, 2), (_f32, 128): _B(32, 64, 64, 32, 4, 1),
    (_f32, 256): _B(16, 32, 32, 16, 4, 1),
}
# Decode (at most DECODE_MAX_Q queries per head): the split kernel with auto splits and
# grouped-query packing; BLOCK_M shrinks at launch to cover the packed rows, so the entry
# sizes K/V tiles and the pipeline depth for streaming the keys.
# Sweeps of 2026-12-01 on the H200 (benchmarks/shapes.py --sweep, docs/shapes.md): at D=128
# BLOCK_N 64/128 with 4 warps and 2 stages were within 2 % of the best on the three decode rows
# (host-bound timings: +-15 % between identical launches), the entry of D <= 64 (not measured);
# D=128 and D=256 were measured again since (below).
for _d in (16, 32, 64, 128):
    _SM90_FWD[(_f32, _d, "decode")] = _F(32, 64, 4, 2)
for _d in (16, 32, 64):
    _SM90_FWD[(_bf, _d, "decode")] = _F(64, 128, 4, 2)
# D=256: 3 stages since 2026-12-03: with chunks of at least 1024 keys (decode.MIN_CHUNK_KEYS)
# decode-mqa-d256-b16-8k runs 8 chunks, 128 programs, one per SM, and 3 stages kept its K/V
# streaming: 50.4 us against 52.3 for 2 stages and 16 chunks, 0.77 of the copy bandwidth with
# a clean L2 (benchmarks/shapes.py --sweep, H200, docs/data/h200-2026-12-03-e2e/mqa_sweep.txt).
_SM90_FWD[(_bf, 256, "decode")] = _F(64, 64, 4, 3)
# D=128: K/V tiles through TMA, one stage. The best single config of a sweep over the three
# D=128 decode rows (BLOCK_N 64/128, 1-3 stages, TMA or not; benchmarks/shapes.py --sweep, H200,
# 2026-12-03 13:37 UTC, docs/data/h200-2026-12-03-e2e/plans-decode_sweep.txt): within 2.6 % of each
# row's best (decode-b1-64k's best, 1.08x the 2-stage TMA config: its 64 chunks of 1024 keys run
# more programs per SM with one stage's shared memory; decode-b32-4k 0.974x, b128 0.98x the best).
_SM90_FWD[(_bf, 128, "decode")] = _F(64, 128, 4, 1, tma=1)
# D=128 decode calls whose batch x K/V heads fill the SMs (decode_fills: one chunk, no combine):
# two stages with TMA, the best of that sweep on decode-b32-4k (B32, 32/8 heads, 4k keys: 132.8
# us against 136.3 for one stage) and within 0.6 % of the best on decode-b128-2k-70b (253.5 us;
# one stage 256.8); one stage pays only where many chunks share an SM (decode-b1-64k).
# (plans-decode_sweep.txt above; measured against the one-stage default since: docs/shapes.md.)
_SM90_FWD[(_bf, 128, "decode", "full")] = _F(64, 128, 4, 2, tma=1)
# D=128 for long calls (is_long: from 1024 queries against 2048 keys): the Gluon kernel (2 x 64
# rows, 128 keys, 3 buffers, ping-pong, overlap), 1.03-1.32x the Triton defaults on every row of
# the standard grid and of SHAPES.md from 4k (causal and not, llama3-8b-train-8k 1.18x,
# llama3-70b-tp8-train-4k 1.11x); at 2k 1.01-1.08x (grid full / causal, mistral-7b-train-2k) and on
# the chunk of 1024 queries over 16k keys 1.32x; slower on square 1k calls (0.77-0.95x):
# benchmarks/gluon_fwd.py --grid --realistic --configs all, H200, 2026-12-02 (docs/gluon.md,
# docs/data/h200-2026-12-02-gluon/gluon-grid-3.txt). That run's llama3-8b-prefill-2k (0.63x) was
# its host's cost (no launch plan for Gluon calls then, 0.1 ms calls); the search, timing CUDA-graph
# replays, chose the Gluon kernel there (1.03x the default, docs/shape-tuning.md).
# Other devices: it does not validate, and the entries after it serve.
# Since the persistent kernel's snake order (gluon_forward.PERSISTENT_SNAKE, 2026-12-05): the same
# with its persistent grid, faster than the grid kernel on 15 of the 16 long D=128 rows measured and
# within 1 % on chunked-prefill-1k-of-16k and grid-d128-16384 full; 4 % slower on grid-d128-16384
# causal (1.041x cuDNN against 1.083x). Ratio to cuDNN, grid kernel -> persistent: grid 1024
# 0.879 -> 0.943 full, 0.879 -> 0.961 causal; 2048 0.935 -> 0.979, 0.954 -> 1.026; 4096 0.972 ->
# 0.995, 1.004 -> 1.045; mistral-7b-train-2k 0.954 -> 1.028, llama3-8b-prefill-2k 1.185 -> 1.217;
# over the 18 D=128 rows of the standard grid and SHAPES.md 0.989 -> 1.021 in geometric mean.
# benchmarks/gluon_fwd.py --grid --realistic --configs persistent --persistent-order both --rounds 2,
# GPU time, H200, triton 3.6, 2026-12-05 (docs/gluon.md, docs/data/h200-2026-12-05c-gluon/). The
# search times both (family_defaults) and keeps the faster per key.
# From 512 queries against 512 keys since 2026-12-05 (LONG_MIN_Q, LONG_MIN_K: the grid's 512 and 1024
# rows, 1.16-1.35x the Triton default there; the bounds' comment).
# With O tiles (o_tile, GluonFwdConfig.O_TILE: each consumer's O through a tile of its own beside a
# V ring one slot shorter, its Q tile released before the last P V): causal calls since 2026-12-05's
# fifth session, all of them since its sixth. Causal, faster than without on every causal row
# measured but grid-d128-16384 (where the grid kernel serves better still): ratio to cuDNN without -> with, grid 2048 1.022 -> 1.075, 4096 1.047 -> 1.074,
# 8192 1.044 -> 1.059, llama3-8b-train-8k 1.053 -> 1.069, llama3-70b-tp8-train-4k 1.280 -> 1.309,
# mistral-7b-train-2k 1.022 -> 1.071, qwen-28h-train-4k 1.137 -> 1.171, llama3-8b-prefill-2k 1.209 ->
# 1.260; 16384 1.044 -> 1.041. Without masking it gains up to 4k keys and loses from 8k (8192 1.006 ->
# 0.998, 16384 1.047 -> 1.008, chunked-prefill-1k-of-16k 0.996 -> 0.987), so full calls kept the
# plain kernel until the run below. benchmarks/gluon_fwd.py --grid --realistic --configs persistent
# --tma-store on --o-tile both --rounds 2, GPU time, H100 (no H200 was lent), triton 3.6, 2026-12-05
# (docs/gluon.md, docs/data/h100-2026-12-05c-gluon/). The search times both (family_defaults) and keeps the faster.
# Non-causal, with O tiles too since the H200 ran them (2026-12-05, sixth session): faster than without
# on all 6 full D=128 grid rows, ratio to cuDNN without -> with, 512 0.906 -> 0.979, 1024
# 0.960 -> 0.990, 2048 0.982 -> 1.005, 4096 0.991 -> 1.016, 8192 0.981 -> 1.009, 16384 0.948 -> 1.014
# (benchmarks/gluon_fwd.py --grid --configs persistent --tma-store on --o-tile both --rounds 2, GPU time,
# H200, docs/data/h200-2026-12-05d-gluon/fwd_rowlimit.log); on the H100 run above 5 of 6 (8192 1.017 ->
# 1.004) and chunked-prefill-1k-of-16k 0.996 -> 0.987. The search times both per key.
_SM90_FWD[(_bf, 128, "long")] = _F(64, 128, 4, 3, family=1, persistent=1, o_tile=1)
# D=256 from the same bounds: the Gluon forward's persistent kernel with 3 K and 2 V slots of 64 keys
# (ring_v_buffers) and the overlap, on gemma2-d256-train-4k 1.238x cuDNN against the Triton default's
# 0.918x (1.349x it), the fastest of 6 Gluon configs (2 slots 0.952-0.958, without the overlap
# 1.155-1.170): benchmarks/gluon_fwd.py --realistic --rows gemma2-d256-train-4k --configs persistent
# --persistent-buffers 2,3 --overlap both, GPU time, H100, triton 3.6, 2026-12-05 (docs/gluon.md,
# docs/data/h100-2026-12-05f-gluon/).
_SM90_FWD[(_bf, 256, "long")] = _F(64, 64, 4, 3, family=1, persistent=1)
# D=64, the middle band (MID_MIN_FWD_BY_HEAD_DIM: from 192 queries against 192 keys, below the long bound of
# 4096 queries; causal where its tiles fill the SMs, MID_MIN_TILES_PER_SM_CAUSAL): the Gluon forward at two CTAs per SM (occupancy 2: 104 registers a consumer thread, 64x64
# blocks, 2 slots, no softmax/matmul overlap, ping-pong); without masking the grid kernel, causal the
# persistent kernel with O tiles (the faster of the two on each masking's rows). Ratio to cuDNN, the entry
# against the best one-CTA Gluon config of the same blocks and the Triton default: gpt2-train-512 (causal)
# 1.012 / 0.786 / 0.902, bert-base-512 0.956 (0.981 without ping-pong) / 0.766 / 0.894, vit-l16-257 1.180 /
# 0.948 / 1.049, whisper-enc-1500 1.098 / 0.959 / 1.050; grid 512 full 0.973 / 0.768 / 0.893, causal 0.981 /
# 0.696 / 0.894, 1024 0.996 / 0.839 / 0.945, 0.992 / 0.781 / 0.929, 2048 0.998 / 0.870 / 0.962, 0.987 / 0.838
# / 0.913 (the one-CTA 64x128 persistent entry before it on full calls from 512: bert 0.928 through the
# drop-in). benchmarks/gluon_fwd.py --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104
# --config PERSISTENT=0,1 --config O_TILE=0,1 --rounds 2, GPU time, H100, triton 3.6, 2026-12-06 (docs/gluon.md,
# docs/data/h100-2026-12-06f-gluon/). Through the drop-in with these bands (benchmarks/attention.py --head-dims 64
# --passes fwd and benchmarks/shapes.py --passes fwd, H100, 2026-12-06, docs/data/h100-2026-12-06g-gluon/): grid
# 512 full 0.977, causal 0.969; 1024 0.959, 0.984; 2048 0.977, 1.007; gpt2-train-512 0.977 (0.897 with the entries
# before), bert-base-512 0.932 (0.928), vit-l16-257 1.086 (1.019), whisper-enc-1500 1.100 (1.037).
# Without masking, no ping-pong since 2026-12-06's sixteenth session: faster than with it on all 6 full rows timed,
# ratio to cuDNN without / with (2 slots): 32x32 heads x 512 0.991 / 0.976, 16x32x1024 1.010 / 0.997, 8x32x2048
# 1.015 / 0.997, bert-base-512 0.979 / 0.960, vit-l16-257 1.185 / 1.163, whisper-enc-1500 1.107 / 1.094
# (benchmarks/gluon_fwd.py --rows bert-base-512,vit-l16-257,whisper-enc-1500 --shape <the three grid sizes>,full
# --config BLOCK_N=64 --config OVERLAP=0 --config CONSUMER_REGS=104 --config PERSISTENT=0 --config PINGPONG=0,1
# --config NUM_BUFFERS=2,3 --rounds 2, GPU time, H100, docs/data/h100-2026-12-06h-gluon/); 3 slots within 1 %.
# Other devices: they do not validate, and the D=64 entries serve.
_SM90_FWD[(_bf, 64, "mid", False)] = _F(64, 64, 4, 2, family=1, pingpong=0, overlap=0, occupancy=2)
_SM90_FWD[(_bf, 64, "mid", True)] = _F(64, 64, 4, 2, family=1, overlap=0, persistent=1, o_tile=1, occupancy=2)
# D=64 long calls (from 4096 queries against 512 keys, both maskings): the Gluon forward's persistent kernel
# with O tiles, 2 x 64 rows, 128 keys, 3 slots, no ping-pong, one CTA per SM. Ratio to cuDNN against two CTAs
# per SM (the best of its configs) and the Triton default: grid 4096 full 0.962 / 0.965 / 0.970, causal 1.014
# / 0.992 / 0.935; 8192 0.996 / 0.984 / 0.998, 1.009 / 0.986 / 0.948; 16384 1.030 / 0.994 / 1.023, 0.993 /
# 0.997 / 0.963 (benchmarks/gluon_fwd.py --grid --rows grid-d64-4096,grid-d64-8192,grid-d64-16384 --config
# BLOCK_N=64,128 --config OVERLAP=0,1 --config CONSUMER_REGS=104,240 --config PINGPONG=0,1 --config
# NUM_BUFFERS=2,3 --config PERSISTENT=0,1 --config O_TILE=1 --rounds 2, H100, the run above). Without masking
# it was the long entry from 512 queries before (0.970x cuDNN over the 6 full D=64 grid rows against the Triton
# default's 0.932x, H100, 2026-12-06, docs/data/h100-2026-12-06e-gluon/), causal the Triton 128x64 w8 s3 from
# 2048. Through the drop-in (the run above): 4096 full 0.984, causal 1.028; 8192 1.025, 1.025; 16384 0.965,
# 1.017. Other devices: it does not validate, and the long entry for both maskings serves: the D=64 one
# (128x64 w8 s3; causal 0.942-0.949x cuDNN from 4096 queries against the shorter causal entry's 0.898-0.924x,
# that entry's comment).
_SM90_FWD[(_bf, 64, "long", True)] = _SM90_FWD[(_bf, 64, "long", False)] = _F(
    64, 128, 4, 3, family=1, pingpong=0, persistent=1, o_tile=1)
_SM90_FWD[(_bf, 64, "long")] = _F(128, 64, 8, 3)
# The backward from LONG_MIN_Q_BWD queries at D=128: the Gluon families. Causal: the Gluon dK/dV
# kernel with the Triton default's dQ kernel (family 1, dkdv_split chosen at launch),
# 1.03-1.16x the Triton default on every causal row measured (grid 4k/8k/16k 1.03-1.10x not
# its best there, llama3-8b-train-8k 1.04x, llama3-70b-tp8-train-4k 1.03x, qwen-28h 1.14x;
# the fused dQ is faster on the grid's causal rows but 4-10 % slower than family 1 on the
# grouped-query ones, which the table cannot tell apart). Non-causal: dQ fused a step late
# (family 4), 1.25-1.33x the Triton default, 0.89-0.95x cuDNN (grid 4k/8k/16k).
# benchmarks/gluon_bwd.py --grid --realistic --rows ..., H200, triton 3.6, 2026-12-03
# (docs/gluon.md, docs/data/h200-2026-12-03-gluon-fused-variants/). From 2048 queries too
# (LONG_MIN_Q_BWD): grid-d128-2048 (B16 H16) causal family 1 1.05x, full family 4 1.23x the
# Triton default, mistral-7b-train-2k (B4 32/8) family 1 1.16x (0.829x cuDNN); benchmarks/
# gluon_bwd.py --grid --realistic --rows grid-d128-2048,mistral-7b-train-2k, H200, 2026-12-03
# 13:05 UTC (docs/data/h200-2026-12-03-e2e/gluon_bwd_2k.txt). Other devices: they do
# not validate, and the entries after them serve.
# Since the dK/dV kernel's compact row statistics (gluon_backward.COMPACT_STATS, on from
# 2026-12-05), causal: dQ fused in the same step (family 3), the best Gluon variant over the 11
# causal D=128 rows of the standard grid and SHAPES.md's training rows, 0.882x cuDNN in geometric
# mean against family 1's 0.808x and family 4's 0.877x, grouped-query rows included
# (llama3-8b-train-8k 0.967x / family 1 0.853x, mistral-7b 1.017x / 0.913x, qwen-28h 0.927x /
# 0.898x); benchmarks/gluon_bwd.py --grid --realistic --gluon all --stats both --rounds 2 --rep 30,
# H200, triton 3.6, 2026-12-05 (docs/gluon.md, docs/data/h200-2026-12-05-gluon/bwd.log). A second
# run the same day (benchmarks/gluon_profile.py, prof.log there) agreed on every causal row but
# one: llama3-70b-tp8-train-4k (2 x 8 heads / 1 K/V head, the only row split 4 ways), family 3
# 1.034x there and 0.654x here, family 1 0.977x / 0.976x; unresolved (docs/gluon.md), a search
# on that key measures it. Non-causal: family 4 stays (dQ fused a step late: 0.907x against family
# 3's 0.910x over 8 rows, within the runs' spread). The comment above is the measurement with the
# wide statistics that chose the entries before.
# From 512 queries since 2026-12-05 (LONG_MIN_Q_BWD; grid 512 and 1024 rows 1.08-1.26x the Triton
# default: the bounds' comment).
# Causal since 2026-12-06 (with gluon_backward.SKIP_DEAD_STEPS on): dQ fused a step late with the share
# first (family 4, dq_first 1), the fastest fused variant over the 6 causal D=128 grid rows in geometric
# mean, 0.926x cuDNN against the same-step share's 0.903x (2048 0.936 / 0.913, 4096 0.983 / 0.947, 8192
# 0.975 / 0.957, 16384 0.939 / 0.874; 512 and 1024 within 1 %), as the run before it had it from 2048
# queries; and on 3 of SHAPES.md's 4 grouped-query training rows (llama3-70b-tp8 1.216 / 1.185, mistral
# 0.976 / 0.951, qwen-28h 1.032 / 0.989; llama3-8b-train-8k 0.950 / 0.984, where the late share without
# the order, 0.996, is fastest). benchmarks/gluon_bwd.py --grid (--realistic) --rows ... --gluon fused
# --dq-first both --rounds 2 --rep 30, GPU time, H100, triton 3.6, 2026-12-06 (docs/gluon.md,
# docs/data/h100-2026-12-06b-gluon/). The search times all four per key.
# Since dK/dV leave through TMA (gluon_backward.TMA_STORE_DKDV, on from 2026-12-06): the late share in the usual
# order (family 4, dq_first 0), 0.960x cuDNN over the 6 causal D=128 grid rows in geometric mean against the
# share first's 0.935x (512 0.952 / 0.935, 1024 0.950 / 0.941, 2048 0.983 / 0.943, 4096 0.998 / 0.941, 8192
# 1.009 / 0.964, 16384 0.876 / 0.890); the same-step share 0.954x. gluon_bwd.py --grid --rows ... --gluon fused
# --dq-first both --switch TMA_STORE_DKDV=0,1 --rounds 2 --rep 30, GPU time, H100, triton 3.6, 2026-12-06
# (docs/gluon.md, docs/data/h100-2026-12-06c-gluon/). The search times all four per key.
_SM90_BWD[(_bf, 128, "long", True)] = _B(64, 64, 64, 64, 4, 2, family=4)
# Since the fused dQ share's order became a config field (dq_first, GluonBwdConfig.DQ_FIRST,
# 2026-12-05), non-causal: dQ fused in its step with the share's wgmmas ahead of dV and dK (family 3,
# dq_first 1), faster than family 4 in 5 of 6 measurements of 5 full D=128 rows, ratio to cuDNN family 4
# -> family 3 first: grid 1024 0.858 -> 0.884, 2048 0.868 -> 0.895, 4096 0.885 / 0.850 -> 0.904 /
# 0.911 (two runs), 8192 0.963 -> 0.959, 16384 0.954 -> 0.977; about 3 % in geometric mean. Causal
# it loses (2048 0.884 -> 0.864, 8192 0.948 -> 0.902), so the causal entry keeps the usual order.
# benchmarks/gluon_bwd.py --grid --realistic --gluon fused --dq-first both (and --switch DQ_FIRST=0,1
# before the field) --rounds 2 --rep 30, GPU time, H100, triton 3.6, 2026-12-05 (docs/gluon.md,
# docs/data/h100-2026-12-05c-gluon/). The search times all four fused variants (family_defaults).
_SM90_BWD[(_bf, 128, "long", False)] = _B(64, 64, 64, 64, 4, 2, family=3, dq_first=1)
# D=64 without masking, from 1024 queries (LONG_MIN_Q_BWD_BY_HEAD_DIM): dQ fused in its step (family
# 3), faster than the Triton default on every full D=64 row of the standard grid from 1024 queries,
# ratio to cuDNN Triton default -> family 3: 1024 0.785 -> 0.848, 2048 0.766 -> 0.846, 4096 0.754 ->
# 0.849, 8192 0.758 -> 0.870, 16384 0.754 -> 0.874 (1.08-1.16x; a step late, family 4, within 1 %
# of it); 512 0.881 -> 0.873, hence the bound. Causal D=64 keeps the Triton default (the Gluon
# variants 0.90-0.96x of it below 4096 queries, 1.02-1.05x from there). benchmarks/gluon_bwd.py
# --grid --realistic --gluon all --stats both --rounds 2 --rep 30, GPU time, H200, triton 3.6,
# 2026-12-05 (docs/data/h200-2026-12-05-gluon/bwd.log; docs/gluon.md). The search times the Gluon
# families per key (family_defaults).
# Since dK/dV leave through TMA (gluon_backward.TMA_STORE_DKDV, 2026-12-06): without masking the late share
# first (family 4, dq_first 1), from 256 queries, faster than family 3 on 5 of the 6 full D=64 grid rows and
# than the Triton default on every full D=64 row measured, ratio to cuDNN Triton default / family 3 / this:
# 512 0.932 / 0.934 / 0.942, 1024 0.825 / 0.872 / 0.908, 2048 0.771 / 0.840 / 0.892, 4096 0.762 / 0.859 /
# 0.926, 8192 0.777 / 0.906 / 0.951, 16384 0.755 / 0.871 / 0.940, SHAPES.md's bert-base-512 0.901 / 0.939 /
# 0.952, vit-l16-257 0.905 / 0.989 / 0.987. Causal, from 4096 queries (its own bound): the late share in the
# usual order (family 4, as the causal D=128 entry), 4096 0.913 / 0.958, 8192 0.913 / 1.005, 16384 0.852 /
# 0.974 (Triton default / this; 2048 0.949 / 0.946, 1024 0.998 / 0.943, 512 1.056 / 0.958, gpt2-train-512
# 1.027 / 0.966: the Triton default below the bound). benchmarks/gluon_bwd.py --grid --rows <the 6 D=64
# lengths>,bert-base-512,vit-l16-257,gpt2-train-512 --gluon fused --dq-first both --rounds 2 --rep 30, GPU
# time, H100, triton 3.6, 2026-12-06 (docs/gluon.md, docs/data/h100-2026-12-06c-gluon/bwd_d64.log).
_SM90_BWD[(_bf, 64, "long", False)] = _B(64, 64, 64, 64, 4, 2, family=4, dq_first=1)
# D=256 from LONG_MIN_Q_BWD_BY_HEAD_DIM's bound: the D=256 Gluon kernel (gluon_backward_wide, on since
# gluon_backward.WIDE_HEAD_DIM: 32 queries a step over 64 keys) with dQ fused and 3 Q/dO slots (family 3),
# ratio to cuDNN against the Triton default's: gemma2-d256-train-4k (B1, 16/8 heads, causal) 0.972 / 0.625,
# 2x16x4k-d256 full 0.906 / 0.575, causal 0.845 (2 slots, 0.845 with 3 too) / 0.594; the Triton dQ kernel
# instead of the fused share 0.863, 0.844, 0.764. benchmarks/gluon_bwd.py --rows gemma2-d256-train-4k,
# 2x16x4k-d256 --prefetch both --buffers 2,3 --rounds 2 --rep 30, GPU time, H100, triton 3.6, 2026-12-06
# (docs/data/h100-2026-12-06e-gluon/bwd_d256.log). At the same tokens in shorter calls (B x 16 heads x N,
# full / causal, this entry's ratio to cuDNN; the Triton default's): N=2048 0.904 / 0.876 (0.598 / 0.623),
# 1024 0.938 / 0.842 (0.662 / 0.678), 512 0.964 / 0.817 (0.744 / 0.777; causal the Triton dQ kernel, family
# 1, 0.856): 1.05-1.51x the Triton default at every length, so D=256 is long from LONG_MIN_Q_BWD (512).
# gluon_bwd.py --rows 16x16x512-d256,8x16x1k-d256,4x16x2k-d256,2x16x4k-d256 --buffers 2,3 --rounds 2 --rep
# 30, the same day and card (bwd_len.log there). Through the drop-in (benchmarks/shapes.py --rows
# gemma2-d256-train-4k --rep 50): 321.8 TFLOPS, 0.987x cuDNN (shapes_gemma2.txt there; SHAPES.md's
# baseline 0.62x). The search times the three (family_defaults) per key.
_SM90_BWD[(_bf, 256, "long")] = _B(32, 64, 64, 64, 4, 3, family=3)
_SM90_BWD[(_bf, 64, "long", True)] = _B(64, 64, 64, 64, 4, 2, family=4)
_SM90_FWD[(_f32, 256, "decode")] = _F(32, 32, 4, 2)
# fp8 forward, the Triton kernel: untuned; chosen by analogy with the bf16 entries and
# Triton's fused-attention tutorial's fp8 configs (128x128, 8 warps, 3 stages at D=128:
# 112 KiB of shared memory in one-byte tiles). D=256 keeps BLOCK_N 64, 2 stages (96 KiB).
# Decode-sized fp8 calls take these too: fp8 runs the plain kernel only. Also what a Gluon
# fp8 call runs where the Gluon kernel cannot (V with its head dim contiguous, a softcap):
# as_triton passes over Gluon entries. At D=128, e4m3 B=4 H=16 N=4096, 0.804 / 0.454 ms full
# / causal, 1.26x / 1.30x flashtune's bf16 forward (the run cited below).
_SM90_FWD.update({(_f8, d): _F(128, 128, 8, 3) for d in (32, 64, 128)})
_SM90_FWD[(_f8, 256)] = _F(128, 64, 8, 2)
# fp8 D=128 on long calls (is_long; measured from 4096 queries, and at 2048 below): the Gluon
# kernel's FP8 variant, 2 x 64 rows, 128 keys, 2 buffers, no ping-pong, no overlap (P in
# registers): the fastest of 24 Gluon configs
# (BLOCK_N 64/128 x 2-4 buffers x ping-pong x overlap) on both masks at e4m3 B=4 H=16
# N=4096, 0.732 / 0.433 ms full / causal against flashtune bf16's 1.010 / 0.592: 1.38x /
# 1.37x (Triton fp8 default above 1.26x / 1.30x); a second run 1.38x / 1.28-1.32x. At
# N=2048 (B=8) 1.32x / 1.34x (Triton 1.21x / 1.34x); at N=1024 (B=16) causal 0.83x (Triton
# 1.18x), hence the long bucket only. benchmarks/fp8_sweep.py --extra-seq 1024 2048, H200,
# triton 3.6, 2026-12-03 (docs/fp8.md, docs/data/h200-2026-12-03-fp8-sweep/). D=64: not
# measured, Triton's. Other devices: it does not validate, and the entries above serve.
_SM90_FWD[(_f8, 128, "long")] = _F(64, 128, 4, 2, family=1, pingpong=0, overlap=0)
_GENERIC_FWD = {(_bf, d): _F(64, 32, 4, 2) for d in (16, 32, 64, 128, 256)}
_GENERIC_FWD.update({(_bf, d, "decode"): _F(32, 64, 4, 2) for d in (16, 32, 64, 128, 256)})
_GENERIC_FWD.update({(_f32, d, "decode"): _F(32, 32, 4, 2) for d in (16, 32, 64, 128, 256)})
_GENERIC_FWD.update({(_f32, d): _F(32, 32, 4, 2) for d in (16, 32, 64, 128, 256)})
# fp8 off Hopper (Ada, sm_89, ~100 KiB of shared memory) and the interpreter: untuned
_GENERIC_FWD.update({(_f8, d): _F(64, 64, 4, 2) for d in (32, 64, 128)})
_GENERIC_FWD[(_f8, 256)] = _F(64, 32, 4, 2)
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


def resolve_device(device=None) -> torch.device:
    """The device flashtune runs on: ``device`` with a CUDA device's index filled in, or
    (None) the current CUDA device, else the CPU, where kernels run under the Triton
    interpreter. Raises ValueError for anything but a CUDA device or the CPU, and for a
    CUDA device when torch sees no GPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {device!r} is not a device: {e}") from e
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected a CUDA device ('cuda', 'cuda:N') or 'cpu' (the interpreter), "
                         f"got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asks for CUDA, but no CUDA GPU is available; use device='cpu' for "
                         "the Triton interpreter")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())  # a worker process must name its device
    return dev


def portfolio(pass_: str, head_dim: int, dtype: torch.dtype, device=None) -> list:
    """The heuristic tables' other entries for the device's architecture and this dtype's
    class (every head dim, both maskings, decode) that validate for ``head_dim``: configs
    chosen from measurements on neighbouring shapes, a search's cheap first guesses.
    Entries of this head dim come first, then the nearest head dims; no duplicates."""
    import math

    config_class(pass_)
    cap = device_capability(device)
    kind = _bf if dtype in (_bf, _fp) else dtype
    tables = [t[0 if pass_ == "fwd" else 1] for c, t in sorted(HEURISTICS.items(), reverse=True) if c <= cap][:1]
    entries = [(k, cfg) for table in tables for k, cfg in table.items() if k[0] == kind]
    entries.sort(key=lambda e: abs(math.log2(e[0][1]) - math.log2(padded_head_dim(head_dim))))
    out: dict = {}
    for _, cfg in entries:
        try:
            cfg = cfg.validate(head_dim, dtype, device)
        except ConfigError:
            continue
        out.setdefault(cfg.canonical(), cfg)
    return list(out.values())


def family_defaults(pass_: str, head_dim: int, dtype: torch.dtype, device=None) -> list:
    """The starting config of each other kernel family that runs this head dim and dtype on
    the device: on sm_90 the Gluon forward's default (gluon_forward.default_gluon_config), then
    the same with its persistent grid (with its snake order faster on 15 of 16 long D=128 rows and
    within 4 % on the last: H200, 2026-12-05, docs/gluon.md), then that with its O tiles (o_tile:
    1-9 % faster up to 4k keys, 4 % slower at 16k, H100, 2026-12-05), and that with 64-key blocks
    (the short causal rows'); at head dim 64 also two CTAs per SM (occupancy 2) on the grid and on
    the persistent kernel (the middle band's entries); for the backward the Gluon dK/dV kernel's
    (gluon_backward.default_gluon_bwd_config) with
    the Triton default's dQ half (family 1), then with the Gluon dQ kernel (family 2), then
    with dQ fused into it (families 3 and 4), each with its share in the step's usual order and
    ahead of dV and dK (dq_first: 1-4 % either way per row on an H100, 2026-12-05); at head dim
    256 the D=256 kernel's (gluon_backward_wide, while gluon_backward.WIDE_HEAD_DIM is on): dQ
    fused with 3 and 2 Q/dO slots, then with the Triton default's dQ kernel. Configs the device
    refuses are left out. The search times these first (key_search.warm_start), so the family
    is chosen per key by measurement."""
    config_class(pass_)
    if device_capability(device) != (9, 0) or dtype not in (_bf, _fp):
        return []
    if pass_ == "fwd":
        from flashtune.kernels.gluon_forward import HEAD_DIMS, default_gluon_config

        if head_dim not in HEAD_DIMS:
            return []
        g = default_gluon_config(head_dim)
        base = FwdConfig(g.BLOCK_M, g.BLOCK_N, 4, g.NUM_BUFFERS, family=1, pingpong=g.PINGPONG, overlap=g.OVERLAP)
        if head_dim == 256:  # 64-key blocks in 2 slots, or 3 K and 2 V slots, no O tiles (shared memory): the grid
            # and the persistent kernel, each with and without the softmax/matmul overlap
            configs = [dataclasses.replace(base, overlap=o, num_stages=n, persistent=p) for n in (2, 3)
                       for o in (1, 0) for p in (0, 1)]
        else:
            configs = [dataclasses.replace(base, persistent=p, o_tile=o) for p, o in ((0, 0), (1, 0), (1, 1))]
            # and the same with 64-key blocks and 3 slots: on short causal calls fewer keys of each
            # diagonal block are masked work (grid-d128-512 causal 0.906x cuDNN against 0.791x with
            # 128-key blocks; 1024 causal 0.947x against 1.013x; H100, 2026-12-05, docs/gluon.md)
            configs.append(dataclasses.replace(configs[-1], BLOCK_N=64, num_stages=3))
            if head_dim == 64:  # two CTAs per SM, the grid and the persistent kernel (the middle band's entries)
                two = FwdConfig(64, 64, 4, 2, family=1, overlap=0, occupancy=2)
                configs += [dataclasses.replace(two, pingpong=0), dataclasses.replace(two, persistent=1, o_tile=1)]
    else:
        from flashtune.kernels import gluon_backward
        from flashtune.kernels.gluon_backward import HEAD_DIMS, default_gluon_bwd_config

        wide = head_dim == 256 and gluon_backward.WIDE_HEAD_DIM
        if head_dim not in HEAD_DIMS and not wide:
            return []
        t = default_config("bwd", head_dim, dtype, device, triton_only=True)
        if wide:
            # the D=256 kernel (gluon_backward_wide: 32 queries a step over 64 keys): dQ fused with 3 and
            # 2 Q/dO slots (family 3), and with the Triton default's dQ kernel (family 1)
            configs = [BwdConfig(32, 64, 64, 64, 4, n, family=3) for n in (3, 2)]
            configs.append(BwdConfig(32, 64, t.BLOCK_M2, t.BLOCK_N2, 4, 3, t.dq_num_warps, t.dq_num_stages,
                                     tma=t.tma, family=1))
        else:
            # family 1 (the Gluon dK/dV kernel with the Triton default's dQ half) and family 2
            # (both Gluon, 3-slot rings: the best at 4x16x4k D=128 on the H200, 0.85x cuDNN
            # against family 1's 0.81x; docs/gluon.md)
            g = default_gluon_bwd_config(head_dim)
            configs = [BwdConfig(g.BLOCK_M, g.BLOCK_N, t.BLOCK_M2, t.BLOCK_N2, 4, g.NUM_BUFFERS, t.dq_num_warps,
                                 t.dq_num_stages, tma=t.tma, family=1),
                       BwdConfig(g.BLOCK_M, g.BLOCK_N, 64, 64, 4, 3, 4, 3, family=2),
                       *(BwdConfig(64, g.BLOCK_N, 64, 64, 4, 2, family=f, dq_first=first) for f in (3, 4)
                         for first in (0, 1))]
    out = []
    for cfg in configs:
        try:
            out.append(cfg.validate(head_dim, dtype, device))
        except ConfigError:
            pass
    return out


@functools.lru_cache(maxsize=256)
def _triton_default(pass_: str, head_dim: int, dtype: torch.dtype, device: torch.device, causal: bool | None):
    """The heuristic config of the pass without the long bucket and without Gluon entries
    (never a Gluon kernel, also where a table serves one for all lengths, as fp8's forward on
    sm_90 may): the ``as_triton`` fallback of both config classes."""
    return default_config(pass_, head_dim, dtype, device, causal=causal, triton_only=True)


def default_config(pass_: str, head_dim: int, dtype: torch.dtype, device=None, causal: bool | None = None,
                   seq_q: int | None = None, triton_only: bool = False, seq_k: int | None = None,
                   batch_heads_kv: int | None = None, batch_heads: int | None = None):
    """The heuristic config for a pass ("fwd" or "bwd") on ``device``.

    Walks the tables from the device's architecture down to the generic one and
    returns the first entry that validates on the device; within a table an entry for
    decode ((dtype, head_dim, "decode"), forward calls with ``seq_q`` at most
    DECODE_MAX_Q; before it (dtype, head_dim, "decode", "full") where ``batch_heads_kv``,
    the call's batch x K/V heads, fills the SMs: ``decode_fills``) or for long calls
    ((dtype, head_dim, "long", causal), then (dtype, head_dim, "long");
    ``is_long(pass_, seq_q, seq_k, dtype, head_dim, causal)``, seq_k None for seq_q) or for the
    forward's middle band below them (the same with "mid": ``is_mid``, a causal call's by its
    ``batch_heads``, batch x query heads, None: unknown) comes first,
    then one for this masking ((dtype, head_dim, causal)), then the one for both.
    ``triton_only``: entries of another kernel family (the Gluon forward, ``family=1``) are
    passed over (``FwdConfig.as_triton``'s fallback).
    """
    config_class(pass_)  # a bad pass raises ValueError
    cap = device_capability(device)
    key = (_bf if dtype == _fp else _f8 if dtype in FP8_DTYPES else dtype, padded_head_dim(head_dim, dtype))
    keys = [key] if causal is None else [(*key, bool(causal)), key]
    if pass_ == "fwd" and seq_q is not None and seq_q <= DECODE_MAX_Q:
        keys.insert(0, (*key, "decode"))
        if decode_fills(batch_heads_kv, device):
            keys.insert(0, (*key, "decode", "full"))
    band = ("long" if is_long(pass_, seq_q, seq_k, dtype, head_dim, causal)
            else "mid" if is_mid(pass_, seq_q, seq_k, dtype, head_dim, causal, batch_heads, device) else None)
    if band is not None:
        keys.insert(0, (*key, band))
        if causal is not None:  # an entry of the band with this masking first
            keys.insert(0, (*key, band, bool(causal)))
    candidates = [tables[0 if pass_ == "fwd" else 1].get(k)
                  for c, tables in sorted(HEURISTICS.items(), reverse=True) if c <= cap for k in keys]
    candidates.append(_SMALLEST_FWD if pass_ == "fwd" else _SMALLEST_BWD)
    last_error: ConfigError | None = None
    for cfg in candidates:
        if cfg is None or (triton_only and getattr(cfg, "family", 0)):
            continue
        try:
            return cfg.validate(head_dim, dtype, device)
        except ConfigError as e:
            last_error = e
    raise ConfigError(f"no valid default {pass_} config for head_dim={head_dim} dtype={dtype}: {last_error}")
