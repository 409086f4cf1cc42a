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
    """``search()``'s progress callback where stderr is no terminal: a line per trial and per key."""

    clock = staticmethod(time.monotonic)

    def __init__(self):
        self.measured = 0  # trials measured by this run (the ETA's rate)
        self.started = self.clock()

    def __call__(self, report) -> None:
        if report.held_by:
            click.echo(f"[{report.keys_done}/{report.keys_total} keys] {report.describe()}", err=True)
        elif report.trial is not None:
            self._trial_line(report)
        elif report.done:
            self._key_line(report)

    def _eta(self, report, done_trials: int) -> str:
        if not self.measured:
            return "ETA -"
        rate = (self.clock() - self.started) / self.measured
        return f"ETA {duration(rate * max(0, report.keys_total * report.trials - done_trials))}"

    def _trial_line(self, report) -> None:
        from flashtune.cli._common import fmt

        self.measured += 1
        config, outcome = report.trial
        shown = f"{fmt(outcome.time_ms)} ms" if outcome.status == "ok" else outcome.status
        best = f", best {fmt(report.best_ms)} ms" if report.best_ms is not None else ""
        done = report.completed
        click.echo(f"[{done}/{report.keys_total * report.trials} trials] {_on(report)}: trial "
                   f"{min(report.n_measured, report.trials)}/{report.trials} {config.label()}: {shown}{best}, "
                   f"{self._eta(report, done)}", err=True)

    def _key_line(self, report) -> None:
        from flashtune.cli._common import fmt, ratio

        result = report.result
        if result is None or result.status == "already_tuned":
            what = "already tuned"
        elif result.status == "tuned_elsewhere":
            what = "tuned by another search"
        else:
            what = result.status
            if result.time_ms is not None:
                what += f", {fmt(result.time_ms)} ms"
                if result.speedup is not None:
                    what += f" ({ratio(result.speedup)} the default)"
            what += f" in {duration(result.wall_s)}"
        done_keys = report.keys_done + 1
        click.echo(f"[{done_keys}/{report.keys_total} keys] {_on(report)}: {what}, "
                   f"{self._eta(report, done_keys * report.trials)}", err=True)


def _on(report) -> str:
    """The key, and the device it runs on."""
    return f"{report.key.label()} on {report.device}" if report.device else report.key.label()
