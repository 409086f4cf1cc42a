"""The Optuna side of a key's search: its study's name and storage, and the study of one
key as configs and outcomes (the rest of the autotuner never sees Optuna's params or
user attributes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from flashtune.keys import TuningKey
from flashtune.outcome import Outcome

STUDY_PREFIX = "flashtune"


def study_name(key: TuningKey, kernel_hash: str, store_id: str | None = None) -> str:
    """A stable name, so running the same search again resumes the same study; with the
    store's identity (``Store.store_id``), so a new or other store never inherits it."""
    point = "" if key.is_grid else f":k{key.seq_k}:g{key.group}:bh{key.batch_heads}"  # grid keys: names as before
    return (f"{STUDY_PREFIX}:{key.gpu}:{key.pass_}:{key.dtype}:d{key.head_dim}:n{key.seq_q}:{key.mask}{point}:"
            f"{kernel_hash}" + (f":store-{store_id}" if store_id else ""))


def default_storage_path(store_url) -> Path:
    """The journal file next to a SQLite store, else in the user data dir."""
    from flashtune.store.engine import default_path, sqlite_path

    path = sqlite_path(store_url)
    return (path.parent if path is not None else default_path().parent) / "optuna-journal.log"


def journal_path(storage) -> Path | None:
    """The journal file a ``storage`` argument names (None: an RDB URL, or None/"" for the
    default); checked before anything is written."""
    if storage is None or storage == "":
        return None
    if not isinstance(storage, (str, os.PathLike)):
        raise ValueError(f"storage: expected a journal file path or an Optuna storage URL, got {storage!r}")
    if isinstance(storage, str) and "://" in storage:
        return None
    path = Path(storage).expanduser()
    if path.is_dir():
        raise ValueError(f"storage: {str(path)!r} is a directory; give the journal file's path, "
                         f"e.g. {str(path / 'optuna-journal.log')!r}")
    return path


def open_storage(storage, store_url):
    """An Optuna storage: a JournalStorage file (default, or a path; checked writable, and
    cut back to its last whole line if a write was cut short) or an RDB URL (connected now);
    one that cannot be opened raises ValueError naming it, with any password hidden."""
    from flashtune.autotuner.storage_checks import open_journal, open_rdb_storage, shown_storage

    path = journal_path(storage)
    if path is None and not storage:
        path = default_storage_path(store_url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open_journal(path), str(path)
    return open_rdb_storage(storage), shown_storage(storage)


class KeyStudy:
    """The Optuna study of one key (created, or resumed when it exists): TPE proposals over
    the pass's search space, told each outcome."""

    def __init__(self, key: TuningKey, *, storage, kernel_hash: str, seed: int, trials: int,
                 store_id: str | None = None):
        import optuna

        from flashtune.configs import config_class
        from flashtune.configs.space import search_space

        self.cls = config_class(key.pass_)
        self.dists = {name: optuna.distributions.CategoricalDistribution(values)
                      for name, values in search_space(key.pass_).items()}
        sampler = optuna.samplers.TPESampler(multivariate=True, seed=seed, constant_liar=True,
                                             n_startup_trials=max(4, min(10, trials // 3)))
        self.study = optuna.create_study(study_name=study_name(key, kernel_hash, store_id), storage=storage,
                                         sampler=sampler, direction="minimize", load_if_exists=True)

    @property
    def name(self) -> str:
        return self.study.study_name

    def _config(self, params: dict):
        # a study may hold params of fields the space no longer samples: they take defaults
        return self.cls(**{k: v for k, v in params.items() if k in self.cls.FIELDS})

    def finished(self) -> Iterator[tuple[object, Outcome]]:
        """(config, outcome) of every trial that was measured, oldest first."""
        import optuna

        for t in self.study.get_trials(deepcopy=False):
            if t.user_attrs.get("status") and t.state in (optuna.trial.TrialState.COMPLETE,
                                                          optuna.trial.TrialState.FAIL):
                yield self._config(t.params), Outcome.from_attrs(t.user_attrs)

    def add_recorded(self, config, outcome: Outcome) -> None:
        """Tell the study a trial it did not see (the store recorded it)."""
        import optuna

        self.study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE if outcome.ok else optuna.trial.TrialState.FAIL,
            value=outcome.time_ms if outcome.ok else None, params=config.to_dict(), distributions=self.dists,
            user_attrs={**outcome.as_attrs(), "source": "store"}))

    def enqueue(self, configs, *, again: bool = False) -> None:
        """Queue configs not already waiting in the study's queue (``again``: queue them
        even so). (Optuna's skip_if_exists also skips a config whose earlier trial failed
        or was interrupted, which would keep e.g. the default from ever being measured
        after an interrupt.)"""
        import optuna

        if again:
            for cfg in configs:
                self.study.enqueue_trial(cfg.to_dict())
            return
        waiting = {self._config(t.system_attrs["fixed_params"]).canonical()
                   for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
                   if set(t.system_attrs.get("fixed_params", {})) == set(self.cls.FIELDS)}
        for cfg in configs:
            if cfg.canonical() not in waiting:
                self.study.enqueue_trial(cfg.to_dict())

    def ask(self):
        """(trial, config) of the sampler's next proposal."""
        trial = self.study.ask(self.dists)
        return trial, self._config(trial.params)

    def skip(self, trial, reason: str) -> None:
        """A proposal not measured (invalid, or measured already): pruned, at no cost."""
        import optuna

        trial.set_user_attr("skipped", reason)
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    def tell(self, trial, outcome: Outcome) -> None:
        for name, value in outcome.as_attrs().items():
            trial.set_user_attr(name, value)
        if outcome.ok:
            self.study.tell(trial, outcome.time_ms)
        else:
            self.tell_unmeasured(trial)

    def tell_unmeasured(self, trial) -> None:
        """A trial that ended without an outcome (interrupted, out of time)."""
        import optuna

        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    @property
    def finalized_trials(self) -> int | None:
        """How many configs were measured when the key's winner was last stored."""
        return self.study.user_attrs.get("finalized_trials")

    @finalized_trials.setter
    def finalized_trials(self, n: int) -> None:
        self.study.set_user_attr("finalized_trials", n)
