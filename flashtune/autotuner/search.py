"""The search: one Optuna study per tuning key, keeping only configs that are correct.

For each key: warm-start with the heuristic default and the stored winners of the
key and its neighbours (same family, other seq lens), then a few winners of related
keys (other masking, other head dims), then let the sampler propose
(TPE, multivariate) until the budget is spent; when the valid space fits in the
budget, every valid config is measured instead. A backward key's last trial may go to
the config pairing the fastest dK/dV half with the fastest dQ half measured so far
(its two kernels are timed apart: see ``Ledger.composed``). Configs ``validate()``
rejects are told to the study as pruned without a compile, and a config proposed twice
is measured once. Every trial's outcome goes to the store as it finishes, and to the
study's storage (a JournalStorage file by default), so an interrupted search resumes
where it stopped. At the end the best few configs and the default are re-timed
interleaved; the winner and its speed-up over the default, both from that run, are
stored.

The jobs live apart: ``study`` (Optuna), ``ledger`` (what a key measured),
``key_search`` (one key's loop and its winner), and this module (many keys, the
arguments, the progress reports).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import signal
import threading
import time
from typing import Callable, Iterable, Mapping, Sequence

from flashtune.autotuner.key_search import Bench, Budget, KeyResult, KeySearch
from flashtune.autotuner.revalidate import DEFAULT_RUNNERS_UP, revalidate_key
from flashtune.autotuner.study import journal_path, open_storage, study_name
from flashtune.keys import GpuInfo, TuningKey
from flashtune.configs.base import MAX_HEAD_DIM

__all__ = ["KeyResult", "Progress", "SearchSummary", "build_keys", "search", "study_name"]


@dataclasses.dataclass(frozen=True)
class SearchSummary:
    results: list[KeyResult]
    interpreter: bool
    storage: str


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the search reports to its ``progress`` callback: at the start of each key,
    after each trial (``trial``: the config just measured and its outcome), and when a key
    ends (``done``, with its ``result``)."""

    key: TuningKey
    keys_done: int  # keys finished before this one
    keys_total: int
    trials: int  # the budget per key
    n_measured: int  # of this key
    best_ms: float | None = None
    default_ms: float | None = None
    done: bool = False
    trial: tuple | None = None  # (config, Outcome) of the trial this report follows
    result: KeyResult | None = None  # the key's result, when done
    device: str = ""  # the device the key runs on ("cuda:1"; "" for a key no device searched)
    others: int = 0  # trials measured so far by the keys other devices are searching now
    held_by: str = ""  # the key waits: another search holds it (its holder, host:pid:uuid)

    @property
    def completed(self) -> int:
        """Trials done over the whole search, counting a finished key as its full budget."""
        own = 0 if self.done else min(self.n_measured, self.trials)
        return (self.keys_done + self.done) * self.trials + own + self.others

    def describe(self) -> str:
        if self.held_by:
            return f"{self.key.label()}: waiting, another search has it ({self.held_by})"
        if self.done:
            return f"{self.key.label()}: done"
        text = f"{self.key.label()}: {self.n_measured}/{self.trials} trials"
        if self.best_ms is not None:
            text += f", best {self.best_ms:.4g} ms"
            if self.default_ms is not None and self.best_ms > 0:
                text += f" ({self.default_ms / self.best_ms:.2f}x the default)"
        return text


def build_keys(gpu: str, *, head_dims: Iterable[int], dtypes: Iterable[str], seq_lens: Iterable[int],
               causal: Iterable[bool] = (False, True), passes: Iterable[str] = ("fwd", "bwd")) -> list[TuningKey]:
    """Every combination of the given values, as tuning keys for ``gpu`` (a GpuInfo.key)."""
    return [TuningKey(gpu, dt, d, n, c, p)
            for p, dt, d, c, n in itertools.product(passes, dtypes, head_dims, causal, seq_lens)]


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


def search(keys: Sequence[TuningKey], *, db=None, trials: int = 32, timeout: float | None = None,
           trial_timeout: float = 120.0, storage: str | os.PathLike | None = None, device: str | None = None,
           progress: Callable[[Progress], None] | None = None, finalists: int = 3, rounds: int = 5, seed: int = 0,
           force: bool = False, faults: dict | None = None, batch: int | None = None,
           revalidate: bool = False, sdpa: bool | None = None, devices=None, lease: float = 60.0,
           shapes: Mapping[TuningKey, tuple[int, int, int]] | None = None, rows: Mapping | None = None,
           runners_up: int = DEFAULT_RUNNERS_UP, host_bound: bool = False) -> SearchSummary:
    """Tune every key: ``trials`` measured configs and/or ``timeout`` seconds per key.

    ``db`` is the store (URL, path or None for the default); ``storage`` Optuna's (a
    journal file path or an RDB URL; default: a journal file next to the store).
    ``device`` is a CUDA device ("cuda:0"), or "cpu" to run under the Triton
    interpreter (tiny shapes, interpreter timings: a test and demo mode). A key whose
    study already finished with this budget is skipped unless ``force``.
    ``revalidate``: search nothing; check and re-time each key's stored row (``rows``, a
    mapping of key to StoredResult, e.g. the shipped table's; default the store's), its
    ``runners_up`` and the default under the current versions, and store the fastest that
    passes (``flashtune.autotuner.revalidate``: a handful of trials per key, not ``trials``);
    its status is "revalidated".
    ``progress`` is called with a ``Progress`` as the search goes (the CLI draws a bar
    from it). ``faults`` (tests only) maps a config (its canonical form) to a fault the
    trial worker injects into its launch (``flashtune.autotuner.faults``).
    ``batch`` proposals are taken from the sampler at a time and their kernels compiled
    in parallel before they are measured one by one (default 8 on a GPU, 1 under the
    interpreter, which has nothing to compile).

    ``devices`` ("all", "0,1", [0, 1], ["cuda:0", "cuda:1"]; instead of ``device``)
    searches on several devices at once, one trial worker process each: a free device
    takes the next key of its GPU, and all of a key's trials run on that device
    (``flashtune.autotuner.devices``; under the interpreter, pretend devices cpu:N).
    Every key is claimed in the store before it is searched, with a lease of ``lease``
    seconds that is renewed while it runs, so searches sharing a store split the keys:
    a key another search holds is waited for (reported ``tuned_elsewhere`` when it is
    done), and taken over when its holder dies and the lease expires
    (``flashtune.autotuner.scheduler``, ``flashtune.store.claims``).

    A bad argument raises ValueError naming it before the store or the study storage
    is touched. A key whose inputs cannot be built, or whose re-timing crashes, ends
    as ``failed: ...`` (with ``message``) and the search goes on. Ctrl-C or SIGTERM
    raises KeyboardInterrupt once the worker is stopped; what finished is kept, and
    the same call resumes.
    ``sdpa``: also time torch SDPA's backends for each key as runners beside the Triton
    winner, and store the fastest as the key's runner (``flashtune.runners``); default: on a
    GPU, not under the interpreter (whose timings are no match for native CPU code). Each runner
    is timed by GPU time and eagerly; ``runners.choose`` picks by GPU time unless the call is
    host-bound, and ``host_bound=True`` picks by eager time always (stored with the key, so
    ``explain()`` says it, and kept by a revalidation of the key).
    ``shapes`` maps keys to the (batch, heads_q, heads_kv) of a call they were made from (a
    shape file's row, a model preset's call, a recorded call): those keys' trials and race
    run that call's own shape instead of the key's ``trial_shape()``, so what is timed is what
    will be served (``TuningKey.for_call`` of the shape must be the key).
    """
    import optuna

    from flashtune.autotuner.devices import worker_device
    from flashtune.autotuner.scheduler import Device, DeviceWorker, Plan, run_keys
    from flashtune.device import resolve_device
    from flashtune.provenance import current_provenance
    from flashtune.store import ResultFilter, Store
    from flashtune.store.claims import new_holder

    _not_in_a_starting_worker()
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
        raise ValueError(f"faults: expected a dict of config -> fault code, got {type(faults).__name__}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: expected a callable taking a Progress, got {progress!r}")
    _check_seconds("lease", lease)
    if not isinstance(runners_up, int) or isinstance(runners_up, bool) or runners_up < 0:
        raise ValueError(f"runners_up: expected a non-negative integer, got {runners_up!r}")
    if not isinstance(host_bound, bool):
        raise ValueError(f"host_bound: expected True or False, got {host_bound!r}")
    if rows is not None and not revalidate:
        raise ValueError("rows: only a revalidation takes the rows to check")
    shapes = _check_shapes(shapes, keys)
    names = _device_names(device, devices)
    interpreter = names[0].startswith("cpu")
    if batch is None:
        batch = 1 if interpreter else 8
    _check_count("batch", batch)
    gpus = {name: _gpu_of(name) for name in names}
    known = {gpu.key for gpu in gpus.values()}
    for key in keys:
        if key.gpu not in known:
            these = (f"this device is {next(iter(known))!r}" if len(known) == 1
                     else f"these devices are {', '.join(sorted(known))}")
            raise ValueError(f"keys: {key.label()} is for GPU {key.gpu!r}, {these}")
        if key.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"keys: {key.label()}: the kernels run head dims up to {MAX_HEAD_DIM}")
    journal_path(storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    report = progress or (lambda p: None)
    budget = Budget(trials=trials, timeout=timeout, trial_timeout=trial_timeout, finalists=finalists, rounds=rounds,
                    seed=seed, batch=batch, sdpa=(not interpreter) if sdpa is None else sdpa, host_bound=host_bound,
                    faults={cfg.canonical(): code for cfg, code in (faults or {}).items()})
    store = Store(db)
    try:
        for gpu in {gpu.key: gpu for gpu in gpus.values()}.values():
            store.upsert_gpu(gpu)
        # a revalidation re-checks stored configs and asks no study: no journal is made for it
        optuna_storage, storage_label = (None, "") if revalidate else open_storage(storage, store.url)
        store_id = store.store_id()
        plan_stop = threading.Event()
        fleet = []
        for name in names:
            dev = resolve_device(worker_device(name))
            bench = Bench(store=store, storage=optuna_storage, gpu=gpus[name], device=dev, store_id=store_id,
                          worker=DeviceWorker(str(dev), interpreter=interpreter, stop=plan_stop),
                          provenance=current_provenance(None if interpreter else dev))
            bench.worker.shapes = shapes
            fleet.append(Device(name, gpus[name], bench))
        kernel_hash = fleet[0].bench.provenance.kernel_hash

        def already(key: TuningKey, status: str) -> KeyResult | None:
            stored = store.list_results(ResultFilter.for_key(key))
            if not stored:
                return None
            won = stored[0]
            return KeyResult(key, status, winner=won.config, time_ms=won.time_ms, tflops=won.tflops,
                             default_time_ms=won.default_time_ms, n_trials=won.n_trials)

        def search_key(key: TuningKey, bench: Bench, tell) -> KeyResult:
            if not revalidate:
                return _search_key(key, bench, budget, tell, force=force)
            row = (rows or {}).get(key) or next(iter(store.list_results(ResultFilter.for_key(key))), None)
            if row is None:
                return KeyResult(key, "failed: nothing stored", message="the store has no result of this key to "
                                 "revalidate: tune it with `flashtune search`")
            return revalidate_key(key, bench, budget, tell, row=row, n_runners_up=runners_up, progress=Progress)

        if revalidate:  # what a key's progress counts: its candidates
            trials = runners_up + 2
        plan = Plan(store=store, holder=new_holder(), lease_s=float(lease), kernel_hash=kernel_hash, trials=trials,
                    retake_done=force or revalidate, report=report, progress=Progress, already=already,
                    stop=plan_stop)
        with _sigterm_as_interrupt():
            results = run_keys(keys, fleet, plan, search_key)
    finally:
        store.close()
    return SearchSummary(results, interpreter, storage_label)


def _not_in_a_starting_worker() -> None:
    """A script without a main guard calls search() again in the worker process that spawn
    starts (it imports the script): that search must not run (it would wait for the key
    its parent holds); it raises, the worker dies, and the parent's key fails saying why.
    (multiprocessing's own check, which ``Process.start`` does, reads the same flag.)"""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError("search() was called while a worker process was starting: call it under "
                           "`if __name__ == '__main__':` in a script")


def _device_names(device, devices) -> list[str]:
    """The names of the devices to search on ("cuda:0", "cpu"; "cpu:N" for pretend devices)."""
    from flashtune.autotuner.devices import resolve_devices
    from flashtune.device import resolve_device

    if devices is None:
        return [str(resolve_device(device))]
    if device is not None:
        raise ValueError(f"devices: give device ({device!r}) or devices ({devices!r}), not both")
    return resolve_devices(devices)


def _gpu_of(name: str) -> GpuInfo:
    return GpuInfo.interpreter() if name.startswith("cpu") else GpuInfo.from_device(name)


def _search_key(key: TuningKey, bench: Bench, budget: Budget, tell, *, force: bool) -> KeyResult:
    """One key on one device (a device thread of the scheduler runs this); ``tell`` gets
    its Progress reports (keys_done and keys_total are the driver's to fill in)."""
    from flashtune.autotuner.worker import WorkerError, WorkerLost
    from flashtune.store import ResultFilter

    def status(ks: KeySearch, result: KeyResult | None = None, trial=None) -> Progress:
        return Progress(key, 0, 0, budget.trials, ks.n_measured(), ks.best_ms(), ks.default_ms(),
                        result is not None, trial, result)

    started = time.monotonic()
    ks = KeySearch(key, bench, budget, on_trial=lambda ks, cfg, outcome: tell(status(ks, trial=(cfg, outcome))))
    if not force and ks.already_done():
        stored = bench.store.list_results(ResultFilter.for_key(key))
        if stored:  # else: finished, but its winner is gone from the store: finalised again below
            won = dict(winner=stored[0].config, time_ms=stored[0].time_ms, tflops=stored[0].tflops,
                       default_time_ms=stored[0].default_time_ms)
            result = ks.result("already_tuned", **won)
            tell(status(ks, result))
            return result
    tell(status(ks))
    try:
        ks.run()
        result = ks.finalize(started)
    except (WorkerLost, WorkerError) as e:
        # the key's inputs or reference could not be built, or the re-timing died:
        # this key fails, its finished trials stay, the other keys go on
        failure = e.status if isinstance(e, WorkerLost) else "error"
        result = ks.result(f"failed: {failure}", started, message=str(e)[:2000])
    tell(status(ks, result))
    return result


def _check_shapes(shapes, keys: list[TuningKey]) -> dict:
    """``shapes`` as a dict, each entry a call whose key is the entry's key (ValueError naming it)."""
    if shapes is None:
        return {}
    if not isinstance(shapes, Mapping):
        raise ValueError(f"shapes: expected a mapping of TuningKey -> (batch, heads_q, heads_kv), got "
                         f"{type(shapes).__name__}")
    wanted, out = set(keys), {}
    for key, shape in shapes.items():
        if key not in wanted:
            raise ValueError(f"shapes: {key!r} is not one of the keys searched")
        if (not isinstance(shape, (tuple, list)) or len(shape) != 3
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in shape)):
            raise ValueError(f"shapes[{key.label()}]: expected (batch, heads_q, heads_kv) of positive integers, "
                             f"got {shape!r}")
        batch, heads_q, heads_kv = shape
        made = TuningKey.for_call(key.gpu, key.dtype, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                                  seq_q=key.seq_q, seq_k=key.seq_k, head_dim=key.head_dim, causal=key.causal,
                                  pass_=key.pass_) if heads_q % heads_kv == 0 else None
        if made != key:
            raise ValueError(f"shapes[{key.label()}]: a call of batch {batch}, {heads_q} query and {heads_kv} "
                             f"key/value heads is not of this key (group {key.group}, batch x heads bucket "
                             f"{key.batch_heads})")
        out[key] = tuple(shape)
    return out


def _check_count(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _check_seconds(name: str, value, *, optional: bool = False) -> None:
    """A positive number of seconds; None (no limit) only where ``optional``."""
    if value is None and optional:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
        raise ValueError(f"{name}: expected a positive, finite number of seconds, got {value!r}")
