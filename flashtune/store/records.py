"""What the store hands out and takes in: plain frozen dataclasses, never ORM objects."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Union

from flashtune.keys import DTYPES, PASSES, GpuInfo, TuningKey
from flashtune.outcome import Outcome
from flashtune.provenance import Provenance
from flashtune.store.errors import StoreError

if TYPE_CHECKING:
    from flashtune.configs.backward import BwdConfig
    from flashtune.configs.forward import FwdConfig
    from flashtune.runners import RunnerTime

Config = Union["FwdConfig", "BwdConfig"]


@dataclasses.dataclass(frozen=True)
class StoredResult:
    """The winning config of one tuning key, with what it measured and where it came from.

    ``time_ms`` is the winner's median time and ``default_time_ms`` the heuristic default
    config's time for the same key in the same run (None if the default could not run).
    ``error`` is the correctness error the winner measured. The GPU fields of
    ``provenance`` are those of ``gpu`` (the store keeps them once, in the GPU table).
    ``config`` and ``time_ms`` are the Triton winner's; ``runner`` is what serves the key
    (``flashtune.runners``: "triton", or an SDPA backend that was faster) and
    ``runner_times`` each runner's ``RunnerTime`` measured in the same run, GPU and eager
    (forward for an inference key, forward + backward for a training key; None when no other
    runner was timed; plain numbers, as older rows and exports hold, are read as GPU times with
    the eager time unknown); ``chosen_by`` which of the two chose the runner
    (``runners.CHOSEN_BY``; None for a row raced before runners had both).
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
    runner: str = "triton"
    runner_times: Mapping[str, RunnerTime] | None = None
    chosen_by: str | None = None
    created_at: datetime | None = None  # set by the store
    updated_at: datetime | None = None

    def __post_init__(self) -> None:
        from flashtune.runners import runner_times

        object.__setattr__(self, "runner_times", runner_times(self.runner_times))

    @property
    def speedup(self) -> float | None:
        """How many times faster than the default config, measured in one run."""
        return None if self.default_time_ms is None else self.default_time_ms / self.time_ms

    def check(self) -> None:
        """Raise ValueError naming the field if this result cannot be stored, or could be
        stored but not shown or served: every number within what the kernels run and the
        store holds (so a speed-up stays finite), every name printable text."""
        if self.gpu.key != self.key.gpu:
            raise ValueError(f"gpu: {self.gpu.key!r} is not the key's GPU {self.key.gpu!r}")
        check_key(self.key)
        check_config(self.key, self.config)
        check_runs(self.key, self.config)
        self.check_numbers()
        check_count("gpu.sm_count", self.gpu.sm_count)
        check_count("gpu.total_memory", self.gpu.total_memory, maximum=MAX_BIGINT)
        check_text("gpu.name", self.gpu.name)
        for field in dataclasses.fields(self.provenance):
            value = getattr(self.provenance, field.name)
            if isinstance(value, str):
                check_text(f"provenance.{field.name}", value)

    def check_numbers(self) -> None:
        """Raise ValueError naming the field if a figure of this result is out of bounds (what
        the store checks again on reading a row: such a row breaks output, e.g. an infinite
        speed-up in `--json`)."""
        check_number("time_ms", self.time_ms, minimum=MIN_TIME_MS, maximum=MAX_TIME_MS)
        check_number("tflops", self.tflops, minimum=0.0, maximum=MAX_TFLOPS)
        if self.default_time_ms is not None:
            check_number("default_time_ms", self.default_time_ms, minimum=MIN_TIME_MS, maximum=MAX_TIME_MS)
        check_number("error", self.error, minimum=0.0, maximum=MAX_ERROR)
        check_count("n_trials", self.n_trials)
        check_runners(self.runner, self.runner_times, self.chosen_by)


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One trial's outcome as recorded: for audit, and so a search can skip what it measured."""

    id: int
    key: TuningKey
    config: Config
    outcome: Outcome
    study: str | None
    kernel_hash: str
    triton_version: str
    created_at: datetime

    # the outcome's fields, read through
    status = property(lambda self: self.outcome.status)
    time_ms = property(lambda self: self.outcome.time_ms)
    error = property(lambda self: self.outcome.error)
    message = property(lambda self: self.outcome.message)


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
    seq_q: int | None = None
    causal: bool | None = None
    pass_: str | None = None
    seq_k: int | None = None
    group: int | None = None
    batch_heads: int | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.pass_ is not None and self.pass_ not in PASSES:
            raise ValueError(f"pass: expected 'fwd' or 'bwd', got {self.pass_!r}")

    @classmethod
    def for_key(cls, key: TuningKey) -> ResultFilter:
        return cls(key.gpu, key.dtype, key.head_dim, key.seq_q, key.causal, key.pass_, seq_k=key.seq_k,
                   group=key.group, batch_heads=key.batch_heads)

    @classmethod
    def for_family(cls, key: TuningKey) -> ResultFilter:
        """The key's family: every tuned point (lengths, group, batch x heads) of it."""
        return cls(*key.family[:3], None, *key.family[3:])

    def describe(self) -> str:
        parts = [f"{f.name.rstrip('_')}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if getattr(self, f.name) is not None]
        return ", ".join(parts) or "everything"


def check_config(key: TuningKey, config: Any) -> None:
    """Raise ValueError unless ``config`` is a valid config object for the key's pass."""
    from flashtune.configs.base import ConfigError, config_class

    expected = config_class(key.pass_)
    if not isinstance(config, expected):
        raise ValueError(f"config: a {key.pass_} key needs a {expected.__name__}, got {type(config).__name__}")
    try:
        config.check_fields()
    except ConfigError as e:
        raise ValueError(f"config: {e}") from e


def load_config(pass_: str, data: Mapping[str, Any], where: str) -> Config:
    """Rebuild a stored config; a row whose config is invalid raises ``StoreError`` naming it."""
    from flashtune.configs.base import ConfigError, config_class

    try:
        return config_class(pass_).from_dict(data)
    except (ConfigError, TypeError, ValueError, AttributeError) as e:
        shown = repr(data) if len(repr(data)) <= 80 else repr(data)[:77] + "..."
        raise StoreError(f"{where} has an invalid config {shown}: {e}; delete it with `flashtune delete` or tune "
                         "that key again") from e


def check_number(name: str, value: Any, *, minimum: float, inclusive: bool = True,
                 maximum: float | None = None) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (not inclusive and value == minimum) or (maximum is not None and value > maximum):
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        if maximum is not None:
            bound += f" and <= {maximum:g}"
        raise ValueError(f"{name}: expected a finite number {bound}, got {short_value(value)}")


# What a stored result may hold. Times: no launch takes under a nanosecond or over
# hours (and default/time must stay a finite speed-up); no GPU reaches 100 PFLOPS;
# counts fit PostgreSQL's INTEGER, memory its BIGINT.
MIN_TIME_MS, MAX_TIME_MS = 1e-6, 1e7
MAX_TFLOPS = 1e5
MAX_ERROR = 1e6
MAX_INT = 2**31 - 1
MAX_BIGINT = 2**63 - 1
MAX_SEQ_LEN = MAX_INT


def check_count(name: str, value: Any, *, maximum: int = MAX_INT) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise ValueError(f"{name}: expected an integer from 0 to {maximum}, got {short_value(value)}")


def check_key(key: TuningKey) -> None:
    """A key the kernels can run (head_dim within their limit) and the store can hold."""
    from flashtune.configs.base import MAX_HEAD_DIM

    if not key.head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim: the kernels run head dims up to {MAX_HEAD_DIM}, got {short_value(key.head_dim)}")
    for name in ("seq_q", "seq_k", "group", "batch_heads"):
        if not getattr(key, name) <= MAX_SEQ_LEN:
            raise ValueError(f"{name}: expected at most {MAX_SEQ_LEN}, got {short_value(getattr(key, name))}")
    check_text("gpu", key.gpu)


def check_runners(runner: Any, times: Any, chosen_by: Any = None) -> None:
    """A known runner, each runner's times (GPU, and eager where known) times the store holds, an
    SDPA runner timed, and what chose it one of ``runners.CHOSEN_BY`` where the runners were raced."""
    from flashtune.runners import CHOSEN_BY, RUNNERS, TRITON, RunnerTime, check_runner

    check_runner(runner)
    if times is None:
        if runner != TRITON:
            raise ValueError(f"runner_times: {runner!r} serves the key but has no time")
        if chosen_by is not None:
            raise ValueError(f"chosen_by: {short_value(chosen_by)} names what chose a runner, but none was raced")
        return
    if not isinstance(times, Mapping):
        raise ValueError(f"runner_times: expected a mapping of runner to times, got {short_value(times)}")
    for name, t in times.items():
        if name not in RUNNERS:
            raise ValueError(f"runner_times: expected runners of {', '.join(RUNNERS)}, got {short_value(name)}")
        if not isinstance(t, RunnerTime):
            raise ValueError(f"runner_times[{name}]: expected milliseconds or {{\"gpu_ms\": ..., \"eager_ms\": ...}}, "
                             f"got {short_value(t)}")
        check_number(f"runner_times[{name}].gpu_ms", t.gpu_ms, minimum=MIN_TIME_MS, maximum=MAX_TIME_MS)
        if t.eager_ms is not None:
            check_number(f"runner_times[{name}].eager_ms", t.eager_ms, minimum=MIN_TIME_MS, maximum=MAX_TIME_MS)
    if runner not in times:
        raise ValueError(f"runner_times: {runner!r} serves the key but has no time")
    if chosen_by is not None and chosen_by not in CHOSEN_BY:
        raise ValueError(f"chosen_by: expected one of {', '.join(CHOSEN_BY)}, got {short_value(chosen_by)}")


def check_runs(key: TuningKey, config: Any) -> None:
    """The config runs for its key on some device (the device-independent rules of
    ``validate()``: tma only for 16-bit dtypes, atomic dQ head dims, ...)."""
    import torch

    from flashtune.configs.base import ConfigError

    try:
        config.validate_anywhere(key.head_dim, getattr(torch, key.dtype))
    except ConfigError as e:
        raise ValueError(f"config: {e}") from e


def check_text(name: str, value: Any) -> None:
    """Printable text: no control characters (C0, C1) and no invisible format characters
    (zero-width, bidirectional overrides), which would let one name pass for another."""
    import unicodedata

    if not isinstance(value, str):
        raise ValueError(f"{name}: expected text, got {short_value(value)}")
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")), None)
    if bad is not None:
        raise ValueError(f"{name}: expected printable text, got the character U+{ord(bad):04X} in "
                         f"{short_value(value)}")


def short_value(value: Any, limit: int = 60) -> str:
    """``repr(value)``, a long one shortened (a 4001-digit number is not echoed in full)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{text[:12]}... ({len(text.lstrip('-'))} digits)"
    return text[:limit - 3] + "..."


def as_utc(moment: datetime) -> datetime:
    """A stored timestamp in UTC (SQLite hands them back without a zone, PostgreSQL in
    the connection's time zone; the store writes UTC)."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
