"""The search's progress reports (``flashtune.autotuner.Progress``) drawn as one rich bar."""

from __future__ import annotations


class ProgressBar:
    """A context manager whose instance is ``search()``'s ``progress`` callback."""

    def __init__(self, console=None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=console, transient=False)
        self._task = None

    def __enter__(self) -> "ProgressBar":
        self._bar.__enter__()
        self._task = self._bar.add_task("starting", total=None)
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def __call__(self, report) -> None:
        self._bar.update(self._task, total=report.keys_total * report.trials, completed=report.completed,
                         description=report.describe())
