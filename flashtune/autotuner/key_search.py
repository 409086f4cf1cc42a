"""The search of one key: warm start, the sampler's proposals, measurement, and the
interleaved re-timing that picks and stores the winner."""

from __future__ import annotations

import dataclasses
import statistics
import time

from flashtune.autotuner.ledger import Ledger
from flashtune.autotuner.study import KeyStudy
from flashtune.configs.base import ConfigError, DECODE_MAX_Q
from flashtune.heuristics.defaults import default_config, family_defaults, portfolio
from flashtune.configs.space import default_neighbours, valid_candidates
from flashtune.keys import GpuInfo, TuningKey, key_distance
from flashtune.outcome import Outcome
from flashtune.protocol import trial_shape


@dataclasses.dataclass(frozen=True)
class Budget:
    """How hard each key is searched (``search()``'s arguments)."""

    trials: int
    timeout: float | None
    trial_timeout: float
    finalists: int
    rounds: int
    seed: int
    batch: int
    sdpa: bool = False  # also time torch SDPA's backends as runners (flashtune.runners)
    host_bound: bool = False  # choose the runner by eager time (runners.choose; search --host-bound)
    faults: dict = dataclasses.field(default_factory=dict)  # tests only: canonical config -> fault code


@dataclasses.dataclass(frozen=True)
class Bench:
    """What every key's search shares: the store, the study storage, the trial worker."""

    store: object
    storage: object
    worker: object
    gpu: GpuInfo
    provenance: object
    device: object
    store_id: str | None = None  # the store's identity, in the study names


@dataclasses.dataclass(frozen=True)
class KeyResult:
    """What the search did for one key."""

    key: TuningKey
    # "tuned", "no_valid_config" (every config rejected, or none runs here), "already_tuned",
    # "failed: crashed|timeout|error", "taken_over"
    status: str
    winner: object | None = None
    time_ms: float | None = None
    tflops: float | None = None
    default_time_ms: float | None = None
    n_trials: int = 0
    outcomes: dict = dataclasses.field(default_factory=dict)  # trial status -> count
    wall_s: float = 0.0
    timer: str = ""
    shape: tuple[int, int, int] | None = None  # (batch, heads_q, heads_kv) the trials used
    message: str = ""  # why a key failed
    runner: str = "triton"  # what serves the key (flashtune.runners)
    runner_times: dict | None = None  # each runner's RunnerTime (GPU and eager ms), measured in one run
    chosen_by: str | None = None  # which timing chose the runner (runners.CHOSEN_BY); None: not raced

    @property
    def speedup(self) -> float | None:
        if self.time_ms is None or self.default_time_ms is None:
            return None
        return self.default_time_ms / self.time_ms

    @property
    def rejected(self) -> int:
        return sum(n for status, n in self.outcomes.items() if status != "ok")


class KeySearch:
    """The search of one key; the study, the store and the worker are shared."""

    def __init__(self, key: TuningKey, bench: Bench, budget: Budget, on_trial=None, *, with_study: bool = True):
        """``with_study=False``: no Optuna study (a revalidation measures given configs, it proposes none)."""
        import torch

        self.key, self.bench, self.budget = key, bench, budget
        self.on_trial = on_trial or (lambda search, config, outcome: None)
        self.dtype = dtype = getattr(torch, key.dtype)
        self.ledger = Ledger(valid_candidates(key.pass_, key.head_dim, dtype, bench.device))
        try:
            batch, heads_q, heads_kv = trial_shape(key, bench.device.type != "cuda")
            self.default = default_config(key.pass_, key.head_dim, dtype, bench.device, causal=key.causal,
                                          seq_q=key.seq_q, seq_k=key.seq_k, batch_heads_kv=batch * heads_kv,
                                          batch_heads=batch * heads_q)
        except ConfigError:  # nothing runs on this device: the key ends as no_valid_config
            self.default = None
        self._measured_before_run = 0  # set as each run starts (_out_of_time)
        # choose the runner by eager time (runners.choose); a revalidation keeps a stored row's flag
        self.host_bound = budget.host_bound
        # the key's stored result as the search found it: the one its winner may replace
        # (queued early, so re-checked and re-timed); one written later (an import, another
        # search) was never measured here and stays where it is faster (store_winner)
        from flashtune.store import ResultFilter

        found = bench.store.list_results(ResultFilter.for_key(key))
        self.found = found[0] if found else None
        self.study = None
        if not with_study:
            return
        self.study = KeyStudy(key, storage=bench.storage, kernel_hash=bench.provenance.kernel_hash,
                              seed=budget.seed, trials=budget.trials, store_id=bench.store_id)
        for cfg, outcome in self.study.finished():
            if self.ledger.is_valid(cfg):
                self.ledger.record(cfg, outcome)
        self._adopt_recorded_trials()

    def _adopt_recorded_trials(self) -> None:
        """Trials the store has (same key, same kernel) but the study does not: a search
        stopped between recording a trial and telling the study, or the study storage
        is new. They count as measured and are told to the study, so nothing is measured
        twice and the sampler learns from them."""
        for rec in self.bench.store.trials_for(self.key, kernel_hash=self.bench.provenance.kernel_hash):
            if self.ledger.adopt(rec.config, rec.outcome):  # oldest first: the first of a config counts
                self.study.add_recorded(rec.config, rec.outcome)

    # -- what the progress report reads ------------------------------------------------

    def n_measured(self) -> int:
        return len(self.ledger)

    def best_ms(self) -> float | None:
        return self.ledger.best_ms()

    def default_ms(self) -> float | None:
        outcome = self.ledger.get(self.default) if self.default is not None else None
        return outcome.time_ms if outcome is not None and outcome.ok else None

    def already_done(self) -> bool:
        """Whether the key's search finished before with at least this budget."""
        done = self.study.finalized_trials
        return done is not None and done >= min(self.budget.trials, len(self.ledger.valid))

    # -- proposals ---------------------------------------------------------------------

    def warm_start(self) -> list:
        """The default and the stored winners of the key's family first (nearest seq len
        first), the default's structural neighbours, the architecture's heuristic entries for
        other shapes (``portfolio``), then a few winners of related keys; all of the valid
        space when it fits the budget.

        A guess with a fixed number of split-KV chunks (``num_splits`` > 1, a decode key's
        winner or decode entry) is left out for a key of more than DECODE_MAX_Q queries: it
        cuts every query block's keys into that many chunks, which on the H200 took 2.6x and
        5.8x the best trial's time on llama3-70b-tp8's 4096 queries (4 and 16 chunks: 0.41 and
        0.92 ms against 0.16) and 16x on gpt2's 512 (1.08 against 0.067 ms), one or two of
        eight trials of a short budget spent so. The sampler can still propose such configs,
        the whole valid space is still measured when it fits the budget, and ``num_splits=0``
        (auto) splits where it pays."""
        from flashtune.store import ResultFilter

        store, key = self.bench.store, self.key
        first = [self.default] if self.default is not None else []
        family = store.list_results(ResultFilter.for_family(key))
        family.sort(key=lambda r: key_distance(r.key, key))
        first += [r.config for r in family]
        if self.default is not None:
            first += default_neighbours(self.default)
        first += family_defaults(key.pass_, key.head_dim, self.dtype, self.bench.device)  # the Gluon kernel's
        # Winners of related keys (same GPU, dtype and pass; the other masking first, then
        # other head dims; nearest seq len first): one key's winner is often near the best
        # of another, and a few trials settle it. At most an eighth of the budget.
        relatives = [r for r in store.list_results(ResultFilter(key.gpu, key.dtype, pass_=key.pass_))
                     if (r.key.head_dim, r.key.causal) != (key.head_dim, key.causal)]
        relatives.sort(key=lambda r: (r.key.head_dim != key.head_dim, key_distance(r.key, key)))
        seen, queue = set(), []

        def guesses(configs) -> list:
            return [c for c in configs if key.seq_q <= DECODE_MAX_Q or getattr(c, "num_splits", 0) <= 1]

        def take(configs, cap=None) -> None:
            taken = 0
            for cfg in configs:
                if self.ledger.wants(cfg) and cfg.canonical() not in seen and (cap is None or taken < cap):
                    seen.add(cfg.canonical())
                    queue.append(cfg)
                    taken += 1

        take(guesses(first))
        # the architecture's heuristic entries for other shapes: at most a quarter of the
        # budget (on the realistic grid, 8 trials from the default alone left the forward
        # 0.94x of the best single config; docs/shape-tuning.md)
        take(guesses(portfolio(key.pass_, key.head_dim, self.dtype, self.bench.device)),
             cap=max(1, self.budget.trials // 4))
        take(guesses(r.config for r in relatives), cap=max(1, self.budget.trials // 8))
        if len(self.ledger.valid) <= self.budget.trials:
            take(self.ledger.valid)  # the valid space fits the budget: measure all of it
        return queue

    def _propose(self, n: int, limit: int) -> list:
        """Up to ``n`` distinct, valid, unmeasured proposals as (trial, config) pairs,
        while fewer than ``limit`` configs are measured.

        Configs ``validate()`` rejects and configs already measured are told to the study
        as pruned (they cost nothing); if the sampler keeps proposing them, an unmeasured
        valid config is enqueued to steer it."""
        batch, ids, idle = [], set(), 0
        while len(batch) < n and self.n_measured() + len(batch) < limit:
            rest = [c for c in self.ledger.unmeasured() if c.canonical() not in ids]
            if not rest:
                break
            trial, cfg = self.study.ask()
            if not self.ledger.wants(cfg) or cfg.canonical() in ids:
                self.study.skip(trial, "invalid" if not self.ledger.is_valid(cfg) else "duplicate")
                idle += 1
                if idle >= 20:
                    idle = 0
                    self.study.enqueue([rest[self.n_measured() % len(rest)]], again=True)
                continue
            idle = 0
            batch.append((trial, cfg))
            ids.add(cfg.canonical())
        return batch

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        """Measure configs until the budget is spent. A backward search keeps its last
        trial for the composed pair (Ledger.composed), if it has one; else the sampler has it."""
        self.study.enqueue(self.warm_start())
        start = time.monotonic()
        self._measured_before_run = self.n_measured()  # a resumed key's trials of earlier runs
        trials = self.budget.trials
        reserve = 1 if self.key.pass_ == "bwd" and trials >= 4 else 0
        self._loop(start, trials - reserve)
        if reserve and not self._out_of_time(start):
            pair = self.ledger.composed()
            if pair is not None:
                self.study.enqueue([pair])
        self._loop(start, trials)

    def _out_of_time(self, start: float, first_batch: bool = False) -> bool:
        """Whether --timeout ran out. A run's first batch of configs for a key is always
        measured: on a cold compile cache building the inputs and compiling that batch (in
        parallel) can take longer than a short timeout, and a key left with no trial had nothing
        to show for the time (two of nine keys of an H200 run at --timeout 9); once
        compiled, a config costs its timing alone (under a second), so the whole batch is
        measured (the first key of the next run got one trial of eight compiled: the Gluon
        kernel's compile took its 10 s). So is a resumed key's (trials of an earlier run in its
        ledger): a rerun whose worker takes longer than the timeout to build the inputs still
        goes on, where it would otherwise stop with no trial, run after run. --trial-timeout
        still bounds each trial."""
        measured_this_run = self.n_measured() - self._measured_before_run
        return (self.budget.timeout is not None and measured_this_run > 0 and not first_batch
                and time.monotonic() - start >= self.budget.timeout)

    def _fault(self, cfg) -> int:
        return self.budget.faults.get(cfg.canonical(), 0)

    def _loop(self, start: float, limit: int) -> None:
        worker, budget = self.bench.worker, self.budget
        while self.n_measured() < limit and not self._out_of_time(start):
            first = self.n_measured() == self._measured_before_run
            batch = self._propose(budget.batch, limit)
            if not batch:
                break
            pending = list(batch)
            try:
                if len(batch) > 1:
                    worker.precompile(self.key, [c for _, c in batch], [self._fault(c) for _, c in batch],
                                      timeout=budget.trial_timeout * len(batch))
                while pending:
                    if self._out_of_time(start, first_batch=first):
                        break
                    trial, cfg = pending.pop(0)
                    self._measure(trial, cfg)
            finally:
                # interrupted, out of time, or the key's inputs could not be built: these
                # configs stay unmeasured (a resumed search measures them)
                for trial, _ in pending:
                    self.study.tell_unmeasured(trial)

    def _measure(self, trial, cfg) -> None:
        try:
            outcome = self._trial(cfg)
        except BaseException:
            # no outcome reached the study: the config stays unmeasured there (if the store
            # got it, a resumed search takes it from the store)
            self.study.tell_unmeasured(trial)
            raise
        self.study.tell(trial, outcome)
        self.on_trial(self, cfg, outcome)

    def _trial(self, cfg) -> Outcome:
        """Check and time ``cfg`` in the worker; the outcome goes to the store and the ledger."""
        outcome = self.bench.worker.run(self.key, cfg, self.budget.trial_timeout, self._fault(cfg))
        self.bench.store.record_trial(self.key, cfg, outcome, provenance=self.bench.provenance,
                                      study=self.study.name if self.study is not None else None)
        self.ledger.record(cfg, outcome)
        return outcome

    # -- the winner --------------------------------------------------------------------

    def result(self, status: str, started: float | None = None, **fields) -> KeyResult:
        fields.setdefault("n_trials", self.n_measured())
        return KeyResult(self.key, status, outcomes=self.ledger.counts(),
                         wall_s=0.0 if started is None else time.monotonic() - started, **fields)

    def timing(self) -> dict:
        """The shape and the timer the key's trials run with (a KeyResult's ``shape`` and ``timer``)."""
        worker = self.bench.worker
        return dict(shape=worker.shapes.get(self.key) or trial_shape(self.key, worker.interpreter),
                    timer="interpreter-wall-clock" if worker.interpreter else "cuda-graph-replay")

    def finalize(self, started: float) -> KeyResult:
        """Re-time the best few with the default, interleaved, and store the winner."""
        from flashtune.store import ResultFilter

        common = self.timing()
        finalists = self.ledger.fastest(self.budget.finalists)
        if not finalists:
            return self.result("no_valid_config", started, **common)
        # The stored winner must win again, in this run; it is a contender only if it
        # passed the correctness check here (it is queued early, right after the default).
        stored = self.bench.store.list_results(ResultFilter.for_key(self.key))
        if stored and self.ledger.measured_ok(stored[0].config):
            finalists.append(stored[0].config)
        if self.default is not None and self.ledger.measured_ok(self.default):
            finalists.append(self.default)
        result = self.store_winner(finalists, started, common)
        self.study.finalized_trials = self.n_measured()
        return result

    def store_winner(self, finalists: list, started: float, common: dict, *, status: str = "tuned",
                     n_trials: int | None = None) -> KeyResult:
        """Re-time ``finalists`` (configs that passed the check in this run) interleaved, race the
        fastest against SDPA's backends, and store it as the key's winner with this run's figures
        (``n_trials``: the trials the stored row counts, default those measured here)."""
        from flashtune.store import StoredResult

        worker, ledger = self.bench.worker, self.ledger
        finalists = list({c.canonical(): c for c in finalists}.values())
        finalists, times = self._retime(finalists)
        default_ok = self.default is not None and ledger.measured_ok(self.default)
        # after retime: the child has this key's inputs even when no trial ran in this
        # process (a search resumed after all its trials had finished)
        info = worker.info_for(self.key)
        common = {**common, "timer": info.get("timer", common["timer"])}
        medians = [statistics.median(t) for t in times]
        i = min(range(len(finalists)), key=medians.__getitem__)
        winner, best_ms = finalists[i], medians[i]
        ids = [c.canonical() for c in finalists]
        default_ms = medians[ids.index(self.default.canonical())] if default_ok and \
            self.default.canonical() in ids else None
        flops = info.get("flops") or 0.0
        runner, runner_times, chosen_by = self._race(winner, best_ms)
        n_trials = self.n_measured() if n_trials is None else n_trials
        result = StoredResult(key=self.key, config=winner, time_ms=best_ms, tflops=flops / best_ms * 1e-9,
                              default_time_ms=default_ms, error=float(ledger.get(winner).error or 0.0),
                              n_trials=n_trials, gpu=self.bench.gpu, provenance=self.bench.provenance,
                              runner=runner, runner_times=runner_times, chosen_by=chosen_by)
        message = ""
        if not self.bench.store.save_result(result, replace=True, replacing=self.found):
            message = "the store keeps a faster result written while this key was searched"
        return self.result(status, started, winner=winner, time_ms=best_ms, tflops=result.tflops,
                           default_time_ms=default_ms, runner=runner, runner_times=runner_times,
                           chosen_by=chosen_by, n_trials=n_trials, message=message,
                           **common)

    def _retime(self, finalists: list) -> tuple[list, list[list[float]]]:
        """(the finalists timed, each one's times over the rounds), interleaved
        (``TrialWorker.retime``). A worker lost on the way (the OOM killer, a signal, a finalist
        that crashed it) does not cost the key: each finalist is then timed alone, in a fresh
        worker where needed, and one that loses the worker again is recorded as such and drops
        out. WorkerLost when every one loses it (then none is recorded: nothing tells a culprit)."""
        from flashtune.autotuner.worker import WorkerLost

        worker, budget = self.bench.worker, self.budget
        each = budget.trial_timeout * (1 + budget.rounds)
        try:
            return finalists, worker.retime(self.key, finalists, budget.rounds, timeout=each * len(finalists))
        except WorkerLost:
            pass
        timed, times, lost = [], [], []
        for cfg in finalists:
            try:
                times.append(worker.retime(self.key, [cfg], budget.rounds, timeout=each)[0])
                timed.append(cfg)
            except WorkerLost as e:
                lost.append((cfg, e))
        if not timed:  # every one lost the worker: nothing tells a culprit, the key fails
            raise lost[-1][1]
        for cfg, e in lost:
            outcome = Outcome(e.status, message=f"while it was re-timed: {e}")
            self.bench.store.record_trial(self.key, cfg, outcome, provenance=self.bench.provenance,
                                          study=self.study.name if self.study else None)
            self.ledger.record(cfg, outcome)
        return timed, times

    def _race(self, winner, best_ms: float) -> tuple[str, dict | None, str | None]:
        """(runner, each runner's RunnerTime, what chose the runner) of the key: the Triton winner
        against SDPA's backends, in one run (``KeyBench.race``), chosen by ``runners.choose``
        (``self.host_bound``: by eager time); ("triton", None, None) when SDPA is not a candidate.
        A training key's Triton side pairs the winner with the stored winner of its fwd key (else
        the heuristic default). An inference key's Triton GPU time is the larger of the race's and
        the winner's re-timed ``best_ms`` (the same launch, inputs and timer): on the H200 a race
        once timed a split-KV winner at half its re-timed and its served time, and kept it against
        a faster cuDNN (docs/shape-tuning.md), so a doubt goes to SDPA."""
        import torch

        from flashtune.runners import choose
        from flashtune.store import ResultFilter

        if not self.budget.sdpa:
            return "triton", None, None
        fwd_config = None
        if self.key.pass_ == "bwd":
            fwd_key = dataclasses.replace(self.key, pass_="fwd")
            stored = self.bench.store.list_results(ResultFilter.for_key(fwd_key))
            fwd_config = stored[0].config if stored else default_config(
                "fwd", self.key.head_dim, getattr(torch, self.key.dtype), self.bench.device,
                causal=self.key.causal, seq_q=self.key.seq_q, seq_k=self.key.seq_k)
        from flashtune.autotuner.worker import WorkerLost

        budget = self.budget
        try:
            # each round times every runner twice (GPU, eager): twice a re-timing's allowance
            times = self.bench.worker.race(self.key, winner, fwd_config, budget.rounds,
                                           timeout=budget.trial_timeout * (1 + budget.rounds) * 8)
        except WorkerLost:  # a backend crashed or hung the worker: the Triton winner serves the key
            return "triton", None, None
        measured = {name: t for name, t in times.items() if t is not None}
        if not measured:
            return "triton", None, None
        triton = measured.get("triton")
        if self.key.pass_ == "fwd" and triton is not None and best_ms > triton.gpu_ms:
            measured["triton"] = dataclasses.replace(triton, gpu_ms=best_ms)
        runner, chosen_by = choose(measured, host_bound=self.host_bound)
        return runner, measured, chosen_by
