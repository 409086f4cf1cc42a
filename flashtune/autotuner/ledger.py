"""What one key's search has measured: each valid config's outcome, by identity."""

from __future__ import annotations

from collections import Counter

from flashtune.outcome import Outcome


class Ledger:
    """The outcomes of one key's measured configs, keyed by ``config.canonical()``.

    ``valid`` is the key's valid search space (canonical forms): only valid configs
    count as measured, they are what the budget pays for.
    """

    def __init__(self, valid: list):
        self.valid = valid
        self.valid_ids = {c.canonical() for c in valid}
        self.outcomes: dict[object, Outcome] = {}

    def __len__(self) -> int:
        return len(self.outcomes)

    def is_valid(self, cfg) -> bool:
        return cfg.canonical() in self.valid_ids

    def has(self, cfg) -> bool:
        return cfg.canonical() in self.outcomes

    def wants(self, cfg) -> bool:
        """Valid and not measured yet."""
        return self.is_valid(cfg) and not self.has(cfg)

    def record(self, cfg, outcome: Outcome) -> None:
        self.outcomes[cfg.canonical()] = outcome

    def adopt(self, cfg, outcome: Outcome) -> bool:
        """Record a trial measured earlier (study or store) if it counts here; say if it did."""
        if not self.wants(cfg):
            return False
        self.record(cfg, outcome)
        return True

    def get(self, cfg) -> Outcome | None:
        return self.outcomes.get(cfg.canonical())

    def measured_ok(self, cfg) -> bool:
        outcome = self.get(cfg)
        return outcome is not None and outcome.ok

    def unmeasured(self) -> list:
        return [c for c in self.valid if c.canonical() not in self.outcomes]

    def counts(self) -> dict[str, int]:
        """Trial status -> how many configs ended so."""
        return dict(Counter(o.status for o in self.outcomes.values()))

    def fastest(self, n: int | None = None) -> list:
        """The configs measured ok, fastest first (the first ``n``)."""
        ok = sorted((o.time_ms, i, cfg) for i, (cfg, o) in enumerate(self.outcomes.items()) if o.ok)
        return [cfg for _, _, cfg in ok[:n]]

    def best_ms(self) -> float | None:
        best = self.fastest(1)
        return self.outcomes[best[0]].time_ms if best else None

    def composed(self):
        """The backward config pairing the fastest dK/dV half measured with the fastest dQ
        half measured (same tma), if it is valid, unmeasured and predicted to beat every
        config measured; else None.

        The two kernels are separate launches, so a config's time is its dK/dV half's
        (time_ms - dq_ms, the preprocess included) plus its dQ half's (dq_ms, timed
        alone): the pair's time is predicted without running it, from halves the
        sampler found in different configs."""
        import dataclasses

        halves = {cfg: (o.time_ms, o.dq_ms) for cfg, o in self.outcomes.items()
                  if o.ok and o.dq_ms is not None and not getattr(cfg, "atomic_dq", 0)}
        best_ms = self.best_ms()
        pick = None
        for tma in {cfg.tma for cfg in halves}:
            same = {cfg: t for cfg, t in halves.items() if cfg.tma == tma}
            first = min(same, key=lambda c: same[c][0] - same[c][1])
            second = min(same, key=lambda c: same[c][1])
            predicted = same[first][0] - same[first][1] + same[second][1]
            if pick is None or predicted < pick[0]:
                dq_half = {f: getattr(second, f) for f in type(second).DQ_FIELDS}
                pick = (predicted, dataclasses.replace(first, **dq_half))
        if pick is None or (best_ms is not None and pick[0] >= best_ms):
            return None
        return pick[1] if self.wants(pick[1]) else None
