"""Search progress where stderr is not a terminal (a log file, CI, a pipe): one line per
trial and one per key, each with an ETA, written as they happen (a progress bar would
show only its last frame there)."""

from __future__ import annotations

import time

import click


def duration(seconds: float) -> str:
    """``0:03:07``."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class TrialLog:
    """The search's progress as lines on stderr (same calls as the search's progress bar)."""

    clock = staticmethod(time.monotonic)

    def __init__(self, n_keys: int, trials: int):
        self.n_keys, self.trials = n_keys, trials
        self.done_keys = 0
        self.measured = 0  # trials measured by this run (the ETA's rate)
        self.started = self.clock()

    def __enter__(self) -> TrialLog:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def _eta(self, done_trials: int) -> str:
        if not self.measured:
            return "ETA -"
        rate = (self.clock() - self.started) / self.measured
        return f"ETA {duration(rate * max(0, self.n_keys * self.trials - done_trials))}"

    def _done(self, ks) -> int:
        return self.done_keys * self.trials + min(ks.n_measured(), self.trials)

    def start_key(self, ks) -> None:
        return None

    def on_trial(self, ks, cfg, outcome) -> None:
        from flashtune.cli._common import fmt
        from flashtune.cli.results import config_label

        self.measured += 1
        shown = f"{fmt(outcome.time_ms)} ms" if outcome.status == "ok" else outcome.status
        best = ks.best()
        best = f", best {fmt(best[0])} ms" if best is not None else ""
        click.echo(f"[{self._done(ks)}/{self.n_keys * self.trials} trials] {ks.key.label()}: trial "
                   f"{min(ks.n_measured(), self.trials)}/{self.trials} {config_label(cfg)}: {shown}{best}, "
                   f"{self._eta(self._done(ks))}", err=True)

    def finish_key(self, ks, result, trials) -> None:
        from flashtune.cli._common import fmt, ratio

        self.done_keys += 1
        what = result.status
        if result.time_ms is not None:
            what += f", {fmt(result.time_ms)} ms"
            if result.speedup is not None:
                what += f" ({ratio(result.speedup)} the default)"
        self._key_line(ks.key, f"{what} in {duration(result.wall_s)}")

    def advance_key(self, key, trials) -> None:
        self.done_keys += 1
        self._key_line(key, "already tuned")

    def _key_line(self, key, what: str) -> None:
        click.echo(f"[{self.done_keys}/{self.n_keys} keys] {key.label()}: {what}, "
                   f"{self._eta(self.done_keys * self.trials)}", err=True)
