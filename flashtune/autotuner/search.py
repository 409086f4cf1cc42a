"""The search: one Optuna study per tuning key, keeping only configs that are correct.

For each key: warm-start with the heuristic default and the stored winners of the
key and its neighbours (same family, other seq lens), then a few winners of related
keys (other masking, other head dims), then let the sampler propose
(TPE, multivariate) until the budget is spent; when the valid space fits in the
budget, every valid config is measured instead. A backward key's last trial may go to
the config pairing the fastest dK/dV half with the fastest dQ half measured so far
(its two kernels are timed apart: see ``_KeySearch.composed``). Configs ``validate()`` rejects are
told to the study as pruned without a compile, and a config proposed twice is
measured once. Every trial's outcome goes to the store as it finishes, and to the
study's storage (a JournalStorage file by default), so an interrupted search resumes
where it stopped. At the end the best few configs and the default are re-timed
interleaved; the winner and its speed-up over the default, both from that run, are
stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import signal
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from flashtune.keys import GpuInfo, TuningKey
from flashtune.kernels.config import MAX_HEAD_DIM, ConfigError, default_config
from flashtune.kernels.space import SPACES, default_neighbours, valid_candidates

STUDY_PREFIX = "flashtune"
# the fields of a backward config that only its dQ kernel uses
DQ_HALF = ("BLOCK_M2", "BLOCK_N2", "dq_num_warps", "dq_num_stages")


@dataclasses.dataclass(frozen=True)
class KeyResult:
    """What the search did for one key."""

    key: TuningKey
    status: str  # "tuned", "no_valid_config", "already_tuned", "failed: crashed|timeout|error"
    winner: object | None = None
    time_ms: float | None = None
    tflops: float | None = None
    default_time_ms: float | None = None
    n_trials: int = 0
    outcomes: dict = dataclasses.field(default_factory=dict)  # trial status -> count
    wall_s: float = 0.0
    timer: str = ""
    shape: tuple[int, int] | None = None  # (batch, heads) the trials used
    message: str = ""  # why a key failed

    @property
    def speedup(self) -> float | None:
        if self.time_ms is None or self.default_time_ms is None:
            return None
        return self.default_time_ms / self.time_ms

    @property
    def rejected(self) -> int:
        return sum(n for status, n in self.outcomes.items() if status != "ok")


@dataclasses.dataclass(frozen=True)
class SearchSummary:
    results: list[KeyResult]
    interpreter: bool
    storage: str


def build_keys(gpu: str, *, head_dims: Iterable[int], dtypes: Iterable[str], seq_lens: Iterable[int],
               causal: Iterable[bool] = (False, True), passes: Iterable[str] = ("fwd", "bwd")) -> list[TuningKey]:
    """Every combination of the given values, as tuning keys for ``gpu`` (a GpuInfo.key)."""
    return [TuningKey(gpu, dt, d, n, c, p)
            for p, dt, d, c, n in itertools.product(passes, dtypes, head_dims, causal, seq_lens)]


def study_name(key: TuningKey, kernel_hash: str) -> str:
    """A stable name, so running the same search again resumes the same study."""
    mode = "causal" if key.causal else "full"
    return f"{STUDY_PREFIX}:{key.gpu}:{key.pass_}:{key.dtype}:d{key.head_dim}:n{key.seq_len}:{mode}:{kernel_hash}"


def default_storage_path(store_url) -> Path:
    """The journal file next to a SQLite store, else in the user data dir."""
    from flashtune.store.engine import default_path, sqlite_path

    path = sqlite_path(store_url)
    return (path.parent if path is not None else default_path().parent) / "optuna-journal.log"


def _journal_path(storage) -> Path | None:
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
    """An Optuna storage: a JournalStorage file (default, or a path; repaired if a write
    was cut short) or an RDB URL; one that cannot be opened raises ValueError naming it."""
    from flashtune.autotuner.storage_checks import open_journal, open_rdb_storage, shown_storage

    path = _journal_path(storage)
    if path is None and not storage:
        path = default_storage_path(store_url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open_journal(path), str(path)
    return open_rdb_storage(storage), shown_storage(storage)


def _config_id(cfg) -> tuple:
    """Identity of a launch: configs that differ only in fields it does not use are one."""
    return tuple(sorted(cfg.canonical().to_dict().items()))


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM stops the search like Ctrl-C: what finished is kept."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _KeySearch:
    """The search of one key; the study, the store and the worker are shared."""

    def __init__(self, key, *, store, storage, worker, gpu, provenance, device, trials, timeout, trial_timeout,
                 finalists, rounds, seed, faults, batch, revalidate=False):
        import optuna

        self.key, self.store, self.worker, self.gpu = key, store, worker, gpu
        self.provenance, self.trials, self.timeout = provenance, trials, timeout
        self.trial_timeout, self.finalists, self.rounds = trial_timeout, finalists, rounds
        self.faults = faults or {}
        self.batch = batch
        self.revalidate = revalidate
        cls, space = SPACES[key.pass_]
        self.cls = cls
        self.dists = {name: optuna.distributions.CategoricalDistribution(values) for name, values in space.items()}
        import torch

        self.dtype = getattr(torch, key.dtype)
        self.valid = valid_candidates(key.pass_, key.head_dim, self.dtype, device)
        self.valid_ids = {_config_id(c) for c in self.valid}
        try:
            self.default = default_config(key.pass_, key.head_dim, self.dtype, device, causal=key.causal)
        except ConfigError:  # nothing runs on this device: the key ends as no_valid_config
            self.default = None
        sampler = optuna.samplers.TPESampler(multivariate=True, seed=seed, constant_liar=True,
                                             n_startup_trials=max(4, min(10, trials // 3)))
        self.study = optuna.create_study(study_name=study_name(key, provenance.kernel_hash), storage=storage,
                                         sampler=sampler, direction="minimize", load_if_exists=True)
        # Only valid configs count: they are what the budget pays for.
        self.measured: dict[tuple, tuple[str, float | None, float | None]] = {}
        # backward configs with a dQ kernel: that kernel's time alone (see composed())
        self.dq_ms: dict[tuple, float] = {}
        for t in self.study.get_trials(deepcopy=False):
            status = t.user_attrs.get("status")
            if status and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL):
                cid = _config_id(cls(**t.params))
                if cid in self.valid_ids:
                    self.measured[cid] = (status, t.user_attrs.get("time_ms"), t.user_attrs.get("error"))
                    if t.user_attrs.get("dq_ms") is not None:
                        self.dq_ms[cid] = t.user_attrs["dq_ms"]
        self._adopt_recorded_trials()

    def _adopt_recorded_trials(self) -> None:
        """Trials the store has (same key, same kernel) but the study does not: a search
        stopped between recording a trial and telling the study, or the study storage
        is new. They count as measured and are told to the study, so nothing is measured
        twice and the sampler learns from them."""
        import optuna

        recorded = {}
        for rec in self.store.trials_for(self.key, kernel_hash=self.provenance.kernel_hash):  # oldest first
            cid = _config_id(rec.config)
            if cid in self.valid_ids and cid not in self.measured:
                recorded[cid] = rec
        for cid, rec in recorded.items():
            ok = rec.status == "ok"
            self.study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE if ok else optuna.trial.TrialState.FAIL,
                value=rec.time_ms if ok else None, params=rec.config.to_dict(), distributions=self.dists,
                user_attrs={"status": rec.status, "time_ms": rec.time_ms, "error": rec.error,
                            "message": rec.message, "source": "store"}))
            self.measured[cid] = (rec.status, rec.time_ms, rec.error)

    # -- proposals ---------------------------------------------------------------------

    def warm_start(self) -> list:
        from flashtune.store import ResultFilter

        first = [self.default] if self.default is not None else []
        family = self.store.list_results(ResultFilter(self.key.gpu, self.key.dtype, self.key.head_dim, None,
                                                      self.key.causal, self.key.pass_))
        family.sort(key=lambda r: abs(r.key.seq_len - self.key.seq_len))
        first += [r.config for r in family]
        if self.default is not None:
            first += default_neighbours(self.default)
        # Winners of related keys (same GPU, dtype and pass; the other masking first, then
        # other head dims; nearest seq len first): one key's winner is often near the best
        # of another, and a few trials settle it. At most an eighth of the budget.
        relatives = [r for r in self.store.list_results(ResultFilter(self.key.gpu, self.key.dtype, None, None, None,
                                                                     self.key.pass_))
                     if (r.key.head_dim, r.key.causal) != (self.key.head_dim, self.key.causal)]
        relatives.sort(key=lambda r: (r.key.head_dim != self.key.head_dim, abs(r.key.seq_len - self.key.seq_len)))
        seen, queue = set(), []

        def take(configs, cap=None) -> None:
            taken = 0
            for cfg in configs:
                cid = _config_id(cfg)
                if cid in self.valid_ids and cid not in self.measured and cid not in seen and (
                        cap is None or taken < cap):
                    seen.add(cid)
                    queue.append(cfg)
                    taken += 1

        take(first)
        take([r.config for r in relatives], cap=max(1, self.trials // 8))
        if len(self.valid) <= self.trials:
            take(self.valid)  # the valid space fits the budget: measure all of it
        return queue

    def _unmeasured(self):
        return [c for c in self.valid if _config_id(c) not in self.measured]

    # -- the loop ----------------------------------------------------------------------

    def n_measured(self) -> int:
        return len(self.measured)

    def best(self):
        ok = [(v[1], cid) for cid, v in self.measured.items() if v[0] == "ok"]
        return min(ok) if ok else None

    def _enqueue(self, configs) -> None:
        """Queue configs not already waiting in the study's queue. (Optuna's skip_if_exists
        also skips a config whose earlier trial failed or was interrupted, which would
        keep e.g. the default from ever being measured after an interrupt.)"""
        import optuna

        waiting = {_config_id(self.cls(**t.system_attrs["fixed_params"]))
                   for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
                   if set(t.system_attrs.get("fixed_params", {})) == set(self.cls.FIELDS)}
        for cfg in configs:
            if _config_id(cfg) not in waiting:
                self.study.enqueue_trial(cfg.to_dict())

    def composed(self):
        """The backward config pairing the fastest dK/dV half measured with the fastest dQ
        half measured (same tma), if it is valid, unmeasured and predicted to beat every
        config measured; else None.

        The two kernels are separate launches, so a config's time is its dK/dV half's
        (time_ms - dq_ms, the preprocess included) plus its dQ half's (dq_ms, timed
        alone): the pair's time is predicted without running it, from halves the
        sampler found in different configs."""
        if self.key.pass_ != "bwd":
            return None
        ok = {cid: (self.measured[cid][1], dq) for cid, dq in self.dq_ms.items()
              if self.measured.get(cid, ("",))[0] == "ok" and not dict(cid).get("atomic_dq")}
        best_ms = self.best()
        pick = None
        for tma in {dict(cid).get("tma", 0) for cid in ok}:
            same = {cid: t for cid, t in ok.items() if dict(cid).get("tma", 0) == tma}
            first = min(same, key=lambda cid: same[cid][0] - same[cid][1])
            second = min(same, key=lambda cid: same[cid][1])
            predicted = same[first][0] - same[first][1] + same[second][1]
            if pick is None or predicted < pick[0]:
                dq_half = {f: dict(second)[f] for f in DQ_HALF}
                pick = (predicted, self.cls(**{**dict(first), **dq_half}))
        if pick is None or (best_ms is not None and pick[0] >= best_ms[0]):
            return None
        cid = _config_id(pick[1])
        return pick[1] if cid in self.valid_ids and cid not in self.measured else None

    def _propose(self, n: int, limit: int) -> list:
        """Up to ``n`` distinct, valid, unmeasured proposals as (trial, config) pairs,
        while fewer than ``limit`` configs are measured.

        Configs ``validate()`` rejects and configs already measured are told to the study
        as pruned (they cost nothing); if the sampler keeps proposing them, an unmeasured
        valid config is enqueued to steer it."""
        import optuna

        batch, ids, idle = [], set(), 0
        while len(batch) < n and self.n_measured() + len(batch) < limit:
            rest = [c for c in self._unmeasured() if _config_id(c) not in ids]
            if not rest:
                break
            trial = self.study.ask(self.dists)
            cfg = self.cls(**trial.params)
            cid = _config_id(cfg)
            if cid not in self.valid_ids or cid in self.measured or cid in ids:
                trial.set_user_attr("skipped", "invalid" if cid not in self.valid_ids else "duplicate")
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                idle += 1
                if idle >= 20:
                    idle = 0
                    self.study.enqueue_trial(rest[len(self.measured) % len(rest)].to_dict())
                continue
            idle = 0
            batch.append((trial, cfg))
            ids.add(cid)
        return batch

    def run(self, on_trial) -> None:
        """Measure configs until the budget is spent. A backward search keeps its last
        trial for composed() (if it has a pair to try; else the sampler has it)."""
        self._enqueue(self.warm_start())
        start = time.monotonic()
        reserve = 1 if self.key.pass_ == "bwd" and self.trials >= 4 else 0
        self._loop(on_trial, start, self.trials - reserve)
        if reserve and not self._out_of_time(start):
            pair = self.composed()
            if pair is not None:
                self._enqueue([pair])
        self._loop(on_trial, start, self.trials)

    def _out_of_time(self, start: float) -> bool:
        return self.timeout is not None and time.monotonic() - start >= self.timeout

    def _loop(self, on_trial, start: float, limit: int) -> None:
        import optuna

        while self.n_measured() < limit and not self._out_of_time(start):
            batch = self._propose(self.batch, limit)
            if not batch:
                break
            pending = list(batch)
            try:
                if len(batch) > 1:
                    self.worker.precompile(self.key, [c for _, c in batch],
                                           [self.faults.get(_config_id(c), 0) for _, c in batch],
                                           timeout=self.trial_timeout * len(batch))
                while pending:
                    if self._out_of_time(start):
                        break
                    trial, cfg = pending.pop(0)
                    self._measure(trial, cfg, on_trial)
            finally:
                # interrupted, out of time, or the key's inputs could not be built: these
                # configs stay unmeasured (a resumed search measures them)
                for trial, _ in pending:
                    self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _measure(self, trial, cfg, on_trial) -> None:
        import optuna

        cid = _config_id(cfg)
        try:
            outcome = self.worker.run(self.key, cfg, self.trial_timeout, self.faults.get(cid, 0))
            self._record(cfg, outcome)
            for name, value in (("status", outcome.status), ("time_ms", outcome.time_ms),
                                ("error", outcome.error), ("message", outcome.message), ("dq_ms", outcome.dq_ms)):
                trial.set_user_attr(name, value)
        except BaseException:
            # no outcome reached the study: the config stays unmeasured there (if the store
            # got it, a resumed search takes it from the store)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        if outcome.status == "ok":
            self.study.tell(trial, outcome.time_ms)
        else:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        on_trial(self, cfg, outcome)

    def _record(self, cfg, outcome) -> None:
        """A trial's outcome into the store and into what this search knows."""
        self.store.record_trial(self.key, cfg, outcome.status, provenance=self.provenance,
                                time_ms=outcome.time_ms, error=outcome.error, message=outcome.message,
                                study=self.study.study_name)
        self.measured[_config_id(cfg)] = (outcome.status, outcome.time_ms, outcome.error)
        if outcome.status == "ok" and outcome.dq_ms is not None:
            self.dq_ms[_config_id(cfg)] = outcome.dq_ms

    def finalize(self, started: float) -> KeyResult:
        """Re-time the best few with the default, interleaved, and store the winner."""
        from flashtune.autotuner.trial import trial_shape
        from flashtune.store import ResultFilter, StoredResult

        outcomes = Counter(v[0] for v in self.measured.values())
        ok = sorted((v[1], cid) for cid, v in self.measured.items() if v[0] == "ok")
        shape = trial_shape(self.key, self.worker.interpreter)
        common = dict(n_trials=len(self.measured), outcomes=dict(outcomes), shape=shape,
                      timer="interpreter-wall-clock" if self.worker.interpreter else "cuda-events")
        if not ok:
            return KeyResult(self.key, "no_valid_config", wall_s=time.monotonic() - started, **common)
        finalists = [self.cls(**dict(cid)) for _, cid in ok[: self.finalists]]
        # The stored winner must win again, in this run; it is a contender only if it
        # passed the correctness check here (it is queued early, right after the default).
        stored = self.store.list_results(ResultFilter.for_key(self.key))
        if stored and self._measured_ok(stored[0].config):
            finalists.append(stored[0].config)
        if self.default is not None and self._measured_ok(self.default):
            finalists.append(self.default)
        finalists = list({_config_id(c): c for c in finalists}.values())
        if self.revalidate:
            # checked and timed again under the current versions; a config that is now
            # wrong (or fails to build) drops out
            for cfg in finalists:
                self._record(cfg, self.worker.run(self.key, cfg, self.trial_timeout,
                                                  self.faults.get(_config_id(cfg), 0)))
            finalists = [c for c in finalists if self._measured_ok(c)]
            common["outcomes"] = dict(Counter(v[0] for v in self.measured.values()))
            if not finalists:
                return KeyResult(self.key, "no_valid_config", wall_s=time.monotonic() - started, **common)
        default_ok = self.default is not None and self._measured_ok(self.default)
        unique = finalists
        times = self.worker.retime(self.key, unique, self.rounds, timeout=self.trial_timeout * (1 + self.rounds)
                                   * len(unique))
        # after retime: the child has this key's inputs even when no trial ran in this
        # process (a search resumed after all its trials had finished)
        info = self.worker.info_for(self.key)
        common["timer"] = info.get("timer", common["timer"])
        medians = [statistics.median(t) for t in times]
        i = min(range(len(unique)), key=medians.__getitem__)
        winner, best_ms = unique[i], medians[i]
        default_ms = medians[[_config_id(c) for c in unique].index(_config_id(self.default))] if default_ok else None
        flops = info.get("flops") or 0.0
        result = StoredResult(key=self.key, config=winner, time_ms=best_ms, tflops=flops / best_ms * 1e-9,
                              default_time_ms=default_ms, error=float(self.measured[_config_id(winner)][2] or 0.0),
                              n_trials=len(self.measured), gpu=self.gpu, provenance=self.provenance)
        self.store.save_result(result, replace=True)
        self.study.set_user_attr("finalized_trials", len(self.measured))
        return KeyResult(self.key, "tuned", winner, best_ms, result.tflops, default_ms,
                         wall_s=time.monotonic() - started, **common)

    def _measured_ok(self, cfg) -> bool:
        return self.measured.get(_config_id(cfg), ("",))[0] == "ok"


def search(keys: Sequence[TuningKey], *, db=None, trials: int = 32, timeout: float | None = None,
           trial_timeout: float = 120.0, storage: str | os.PathLike | None = None, device: str | None = None,
           progress: bool = True, finalists: int = 3, rounds: int = 5, seed: int = 0, force: bool = False,
           faults: dict | None = None, console=None, batch: int | None = None,
           revalidate: bool = False, reporter=None) -> SearchSummary:
    """Tune every key: ``trials`` measured configs and/or ``timeout`` seconds per key.

    ``db`` is the store (URL, path or None for the default); ``storage`` Optuna's (a
    journal file path or an RDB URL; default: a journal file next to the store).
    ``device`` is a CUDA device ("cuda:0"), or "cpu" to run under the Triton
    interpreter (tiny shapes, interpreter timings: a test and demo mode). A key whose
    study already finished with this budget is skipped unless ``force`` or
    ``revalidate``; ``revalidate`` also checks and times the finalists (the best few,
    the stored winner, the default) again under the current versions before the
    interleaved re-timing, so a config that became wrong cannot stay the winner. ``faults``
    (tests only) maps a config's id to a fault to inject into its forward launch.
    ``batch`` proposals are taken from the sampler at a time and their kernels compiled
    in parallel before they are measured one by one (default 8 on a GPU, 1 under the
    interpreter, which has nothing to compile).

    A bad argument raises ValueError naming it before the store or the study storage
    is touched. A key whose inputs cannot be built, or whose re-timing crashes, ends
    as ``failed: ...`` (with ``message``) and the search goes on. Ctrl-C or SIGTERM
    raises KeyboardInterrupt once the worker is stopped; what finished is kept, and
    the same call resumes.
    """
    import optuna
    import torch

    from flashtune.autotuner.worker import TrialWorker, WorkerError, WorkerLost
    from flashtune.provenance import current_provenance
    from flashtune.store import ResultFilter, Store

    # Every argument is checked before the store or the study storage is touched.
    keys = list(keys)
    if any(not isinstance(key, TuningKey) for key in keys):
        raise ValueError("keys: expected TuningKey objects (see build_keys)")
    _check_count("trials", trials)
    _check_count("finalists", finalists)
    _check_count("rounds", rounds)
    _check_seconds("timeout", timeout, optional=True)
    _check_seconds("trial_timeout", trial_timeout)
    if faults is not None and not isinstance(faults, dict):
        raise ValueError(f"faults: expected a dict of config id -> fault code, got {type(faults).__name__}")
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device: {device!r} is not a device: {e}") from e
    else:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected a CUDA device ('cuda', 'cuda:N') or 'cpu' (the interpreter), "
                         f"got {device!r}")
    interpreter = dev.type == "cpu"
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())  # the worker must name its device
    if batch is None:
        batch = 1 if interpreter else 8
    _check_count("batch", batch)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asks for CUDA, but no CUDA GPU is available; use device='cpu' for "
                         "the interpreter demo")
    gpu = GpuInfo.from_device(dev) if not interpreter else GpuInfo.interpreter()
    for key in keys:
        if key.gpu != gpu.key:
            raise ValueError(f"keys: {key.label()} is for GPU {key.gpu!r}, this device is {gpu.key!r}")
        if key.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"keys: {key.label()}: the kernels run head dims up to {MAX_HEAD_DIM}")
    _journal_path(storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    provenance = current_provenance(None if interpreter else dev)
    store = Store(db)
    results: list[KeyResult] = []
    worker = TrialWorker(str(dev), interpreter=interpreter)
    # reporter: what the CLI shows instead of the bar (start_key, on_trial, finish_key, advance_key)
    bar = reporter or _Progress(len(keys) * trials, enabled=progress, console=console)
    try:
        store.upsert_gpu(gpu)
        optuna_storage, storage_label = open_storage(storage, store.url)
        with _sigterm_as_interrupt(), bar:
            for key in keys:
                started = time.monotonic()
                ks = _KeySearch(key, store=store, storage=optuna_storage, worker=worker, gpu=gpu,
                                provenance=provenance, device=dev, trials=trials, timeout=timeout,
                                trial_timeout=trial_timeout, finalists=finalists, rounds=rounds, seed=seed,
                                faults=faults, batch=batch, revalidate=revalidate)
                done = ks.study.user_attrs.get("finalized_trials")
                if not (force or revalidate) and done is not None and done >= min(trials, len(ks.valid)):
                    bar.advance_key(key, trials)
                    stored = store.list_results(ResultFilter.for_key(key))
                    won = dict(winner=stored[0].config, time_ms=stored[0].time_ms, tflops=stored[0].tflops,
                               default_time_ms=stored[0].default_time_ms) if stored else {}
                    results.append(KeyResult(key, "already_tuned", n_trials=ks.n_measured(),
                                             outcomes=dict(Counter(v[0] for v in ks.measured.values())), **won))
                    continue
                bar.start_key(ks)
                try:
                    ks.run(bar.on_trial)
                    results.append(ks.finalize(started))
                except (WorkerLost, WorkerError) as e:
                    # the key's inputs or reference could not be built, or the re-timing died:
                    # this key fails, its finished trials stay, the other keys go on
                    status = e.status if isinstance(e, WorkerLost) else "error"
                    results.append(KeyResult(key, f"failed: {status}", n_trials=ks.n_measured(),
                                             outcomes=dict(Counter(v[0] for v in ks.measured.values())),
                                             wall_s=time.monotonic() - started, message=str(e)[:2000]))
                bar.finish_key(ks, results[-1], trials)
    finally:
        worker.close()
        store.close()
    return SearchSummary(results, interpreter, storage_label)


def _check_count(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _check_seconds(name: str, value, *, optional: bool = False) -> None:
    """A positive number of seconds; None (no limit) only where ``optional``."""
    if value is None and optional:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
        raise ValueError(f"{name}: expected a positive, finite number of seconds, got {value!r}")


class _Progress:
    """One rich progress bar for the whole search, or nothing."""

    def __init__(self, total: int, *, enabled: bool, console=None):
        self.enabled = enabled
        self.total = total
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), console=console, transient=False)
            self._task = None
        self._done_keys = 0

    def __enter__(self):
        if self.enabled:
            self._p.__enter__()
            self._task = self._p.add_task("starting", total=self.total)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._p.__exit__(*exc)

    def _describe(self, ks) -> str:
        best = ks.best()
        text = f"{ks.key.label()}: {ks.n_measured()}/{ks.trials} trials"
        if best is not None:
            text += f", best {best[0]:.4g} ms"
            default = ks.measured.get(_config_id(ks.default)) if ks.default is not None else None
            if default and default[0] == "ok" and best[0] > 0:
                text += f" ({default[1] / best[0]:.2f}x the default)"
        return text

    def start_key(self, ks) -> None:
        if self.enabled:
            self._p.update(self._task, description=self._describe(ks),
                           completed=self._done_keys * ks.trials + min(ks.n_measured(), ks.trials))

    def on_trial(self, ks, cfg, outcome) -> None:
        if self.enabled:
            self._p.update(self._task, description=self._describe(ks),
                           completed=self._done_keys * ks.trials + min(ks.n_measured(), ks.trials))

    def finish_key(self, ks, result, trials) -> None:
        self.advance_key(ks.key, trials)

    def advance_key(self, key, trials) -> None:
        self._done_keys += 1
        if self.enabled:
            self._p.update(self._task, completed=self._done_keys * trials, description=f"{key.label()}: done")
