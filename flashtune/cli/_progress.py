"""The search's progress reports (``flashtune.autotuner.Progress``) drawn as rich bars:
one for the whole search and, when it runs on several devices, a line per device with
the key it is searching."""

from __future__ import annotations


class ProgressBar:
    """A context manager whose instance is ``search()``'s ``progress`` callback."""

    def __init__(self, console=None, *, devices: int = 1):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=console, transient=False)
        self._task = None
        self._many = devices > 1
        self._devices: dict[str, int] = {}  # device -> its task

    def __enter__(self) -> "ProgressBar":
        self._bar.__enter__()
        self._task = self._bar.add_task("starting", total=None)
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def __call__(self, report) -> None:
        total = report.keys_total * report.trials
        if self._many and report.device:
            # several devices: the overall bar, and each device's key on a line of its own
            if report.device not in self._devices:
                self._devices[report.device] = self._bar.add_task("", total=report.trials)
            self._bar.update(self._devices[report.device], description=f"  {report.device}: {report.describe()}",
                             completed=report.trials if report.done else min(report.n_measured, report.trials))
            self._bar.update(self._task, total=total, completed=report.completed,
                             description=f"{report.keys_done + report.done}/{report.keys_total} keys")
            return
        self._bar.update(self._task, total=total, completed=report.completed,
                         description=f"{report.device}: {report.describe()}" if report.device else report.describe())
