"""What every kernel launch config shares: the field rules, the JSON form, labels and the
canonical identity. Config types are data: nothing here imports a kernel."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import torch

from flashtune.device import device_capability, shared_memory_limit

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
# fp8 inputs (kernels/fp8.py): the forward only. Triton's fp8 dots need a reduction of at
# least 32 (the tensor cores' fp8 K step): the head dim pads to 32, BLOCK_N (P @ V's K) >= 32.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_MIN_K = 32


class ConfigError(ValueError):
    """A config that the kernel cannot run; the message names the field."""


def padded_head_dim(head_dim: int, dtype: torch.dtype | None = None) -> int:
    """The tile width the kernels use for a head dim: next power of two, at least 16 (at
    least FP8_MIN_K for an fp8 ``dtype``)."""
    return max(FP8_MIN_K if dtype in FP8_DTYPES else MIN_BLOCK, 1 << (int(head_dim) - 1).bit_length())


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

    # family -> {field: (its fixed value, the valid values it replaces)}: the fields a kernel
    # family does not read (each class sets its own; configs/space.py enumerates with it)
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