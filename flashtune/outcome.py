"""A trial's outcome: the one form it takes from the trial worker to the search, the
Optuna study's user attributes and the store."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

# what a trial can end as; the store's trials.status column holds one of these
TRIAL_STATUSES: tuple[str, ...] = ("ok", "incorrect", "compile_error", "out_of_resources", "crashed", "timeout")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one trial measured. ``status`` is one of ``TRIAL_STATUSES``."""

    status: str
    time_ms: float | None = None
    error: float | None = None  # the worst error as a multiple of its allowance (<= 1 passes)
    message: str = ""
    # backward configs with a dQ kernel: that kernel's time alone (the rest of time_ms is
    # the dK/dV half's), so the search can pair the fastest dK/dV half with the fastest dQ
    # half. Not stored (the store keeps what a trial decided, not how it was split).
    dq_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def check(self) -> None:
        """Raise ValueError naming the field if the store cannot record this outcome."""
        if self.status not in TRIAL_STATUSES:
            raise ValueError(f"status: expected one of {', '.join(TRIAL_STATUSES)}, got {self.status!r}")
        if self.time_ms is not None:
            ok = isinstance(self.time_ms, (int, float)) and not isinstance(self.time_ms, bool)
            if not ok or not math.isfinite(self.time_ms) or self.time_ms <= 0:
                raise ValueError(f"time_ms: expected a finite number > 0.0, got {self.time_ms!r}")
        elif self.ok:
            raise ValueError("time_ms: an 'ok' trial needs its time")
        if self.error is not None and not (math.isnan(self.error) or self.error >= 0):
            raise ValueError(f"error: expected a number >= 0, got {self.error!r}")

    def stored_error(self) -> float | None:
        """The error as the store keeps it: NaN (the kernel produced NaN) as infinity."""
        return math.inf if self.error is not None and math.isnan(self.error) else self.error

    def as_attrs(self) -> dict[str, Any]:
        """As an Optuna trial's user attributes."""
        return dataclasses.asdict(self)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> "Outcome":
        """From an Optuna trial's user attributes (extra attributes are ignored)."""
        return cls(**{f.name: attrs[f.name] for f in dataclasses.fields(cls) if f.name in attrs})
