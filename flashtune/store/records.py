"""What the store hands out and takes in: plain frozen dataclasses, never ORM objects."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Union

from flashtune.keys import DTYPES, PASSES, GpuInfo, TuningKey
from flashtune.provenance import Provenance
from flashtune.store.errors import StoreError

if TYPE_CHECKING:
    from flashtune.kernels.config import BwdConfig, FwdConfig

Config = Union["FwdConfig", "BwdConfig"]


@dataclasses.dataclass(frozen=True)
class StoredResult:
    """The winning config of one tuning key, with what it measured and where it came from.

    ``time_ms`` is the winner's median time and ``default_time_ms`` the heuristic default
    config's time for the same key in the same run (None if the default could not run).
    ``error`` is the correctness error the winner measured. The GPU fields of
    ``provenance`` are those of ``gpu`` (the store keeps them once, in the GPU table).
    """

    key: TuningKey
    config: Config
    time_ms: float
    tflops: float
    default_time_ms: float | None
    error: float
    n_trials: int
    gpu: GpuInfo
    provenance: Provenance
    created_at: datetime | None = None  # set by the store
    updated_at: datetime | None = None

    @property
    def speedup(self) -> float | None:
        """How many times faster than the default config, measured in one run."""
        return None if self.default_time_ms is None else self.default_time_ms / self.time_ms

    def check(self) -> None:
        """Raise ValueError naming the field if this result cannot be stored."""
        if self.gpu.key != self.key.gpu:
            raise ValueError(f"gpu: {self.gpu.key!r} is not the key's GPU {self.key.gpu!r}")
        check_config(self.key, self.config)
        check_number("time_ms", self.time_ms, minimum=0.0, inclusive=False)
        check_number("tflops", self.tflops, minimum=0.0)
        if self.default_time_ms is not None:
            check_number("default_time_ms", self.default_time_ms, minimum=0.0, inclusive=False)
        check_number("error", self.error, minimum=0.0)
        if not isinstance(self.n_trials, int) or isinstance(self.n_trials, bool) or self.n_trials < 0:
            raise ValueError(f"n_trials: expected a non-negative integer, got {self.n_trials!r}")


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One trial's outcome as recorded: for audit, and so a search can skip what it measured."""

    id: int
    key: TuningKey
    config: Config
    status: str
    time_ms: float | None
    error: float | None
    message: str
    study: str | None
    kernel_hash: str
    triton_version: str
    created_at: datetime


@dataclasses.dataclass(frozen=True)
class ImportSummary:
    """What ``Store.import_results`` did with each result."""

    inserted: int = 0
    replaced: int = 0
    kept: int = 0  # an existing result stayed (skip, or it was faster)


@dataclasses.dataclass(frozen=True)
class ResultFilter:
    """Which tuned results to list or delete; a field left None matches everything."""

    gpu: str | None = None  # a GpuInfo.key, e.g. "NVIDIA H200@sm90"
    dtype: str | None = None
    head_dim: int | None = None
    seq_len: int | None = None
    causal: bool | None = None
    pass_: str | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.pass_ is not None and self.pass_ not in PASSES:
            raise ValueError(f"pass: expected 'fwd' or 'bwd', got {self.pass_!r}")

    @classmethod
    def for_key(cls, key: TuningKey) -> ResultFilter:
        return cls(key.gpu, key.dtype, key.head_dim, key.seq_len, key.causal, key.pass_)

    def describe(self) -> str:
        parts = [f"{f.name.rstrip('_')}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if getattr(self, f.name) is not None]
        return ", ".join(parts) or "everything"


def config_class(pass_: str):
    """``FwdConfig`` or ``BwdConfig`` (imported on first use: it pulls in torch)."""
    from flashtune.kernels.config import BwdConfig, FwdConfig

    return FwdConfig if pass_ == "fwd" else BwdConfig


def check_config(key: TuningKey, config: Any) -> None:
    """Raise ValueError unless ``config`` is a valid config object for the key's pass."""
    from flashtune.kernels.config import ConfigError

    expected = config_class(key.pass_)
    if not isinstance(config, expected):
        raise ValueError(f"config: a {key.pass_} key needs a {expected.__name__}, got {type(config).__name__}")
    try:
        config.check_fields()
    except ConfigError as e:
        raise ValueError(f"config: {e}") from e


def load_config(pass_: str, data: Mapping[str, Any], where: str) -> Config:
    """Rebuild a stored config; a row whose config is invalid raises ``StoreError`` naming it."""
    from flashtune.kernels.config import ConfigError

    try:
        return config_class(pass_).from_dict(data)
    except (ConfigError, TypeError, ValueError, AttributeError) as e:
        shown = repr(data) if len(repr(data)) <= 80 else repr(data)[:77] + "..."
        raise StoreError(f"{where} has an invalid config {shown}: {e}; delete it with `flashtune delete` or tune "
                         "that key again") from e


def check_number(name: str, value: Any, *, minimum: float, inclusive: bool = True) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (not inclusive and value == minimum):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}")


def as_utc(moment: datetime) -> datetime:
    """A stored timestamp in UTC (SQLite hands them back without a zone, PostgreSQL in
    the session's zone; the store writes UTC)."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
