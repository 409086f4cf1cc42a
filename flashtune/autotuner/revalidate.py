"""Revalidation: a stored winner checked and re-timed on this installation, without a search.

After an upgrade (other kernel sources, another triton) a stored row is stale: its
correctness check ran on other code. Searching its key again would cost the whole budget;
revalidating it measures a handful of configs the row's own search already ranked:

- the stored winner, its runners-up (the fastest other configs that passed in the trials of
  the search that stored it, ``runners_up`` of them; an imported row has none) and the key's
  heuristic default, each checked against the reference and timed, as a search's trial is
  (compiled together first on a GPU);
- those that pass are re-timed interleaved and the fastest races SDPA's backends, as a
  search's finalists do (``KeySearch.store_winner``; a row searched with ``host_bound`` keeps
  its runner chosen by eager time); the row is stored again with this
  installation's provenance and its search's trial count, so it serves again and a later
  search with the same budget finds the key done.

When neither the winner nor a runner-up passes, the key fails: the row stays stale (never
served) and the message says to search the key again. A candidate measured under this
installation since the row was stored (by an interrupted revalidation) is not measured again.
"""

from __future__ import annotations

import time

from flashtune.autotuner.key_search import Bench, Budget, KeyResult, KeySearch
from flashtune.runners import BY_FLAG

DEFAULT_RUNNERS_UP = 2


def runners_up(store, row, n: int) -> list:
    """The fastest other configs that passed in the trials of the search that stored ``row``
    (same kernel sources and triton as the row), fastest first, at most ``n``."""
    best: dict = {}
    for trial in store.trials_for(row.key, kernel_hash=row.provenance.kernel_hash):
        if trial.status != "ok" or trial.triton_version != row.provenance.triton_version:
            continue
        ident = trial.config.canonical()
        if ident != row.config.canonical() and (ident not in best or trial.time_ms < best[ident][0]):
            best[ident] = (trial.time_ms, trial.config)
    return [config for _, config in sorted(best.values(), key=lambda pair: pair[0])[:n]]


def revalidate_key(key, bench: Bench, budget: Budget, tell, *, row, n_runners_up: int = DEFAULT_RUNNERS_UP,
                   progress=None) -> KeyResult:
    """Revalidate one key's stored ``row`` on ``bench``'s device (a device thread of the scheduler
    runs this); ``tell`` gets ``progress`` reports (the search's ``Progress`` class)."""
    from flashtune.autotuner.worker import WorkerError, WorkerLost

    started = time.monotonic()
    ks = KeySearch(key, bench, budget, with_study=False)
    # the row checked here is the one the result may replace: a row stored since it was read (by a
    # search that held the key's claim, or an import) was never measured here and stays where faster
    ks.found = row
    ks.host_bound = ks.host_bound or row.chosen_by == BY_FLAG
    stored = [row.config, *runners_up(bench.store, row, n_runners_up)]
    candidates = list({c.canonical(): c for c in [*stored, *([ks.default] if ks.default else [])]}.values())

    def report(done: bool = False, result: KeyResult | None = None, trial=None) -> None:
        if progress is not None:
            tell(progress(key, 0, 0, len(candidates), ks.n_measured(), ks.best_ms(), ks.default_ms(), done, trial,
                          result))

    wanted = {c.canonical() for c in candidates}
    provenance = bench.provenance
    for trial in bench.store.trials_for(key, kernel_hash=provenance.kernel_hash):
        # measured here since the row was stored: by an interrupted revalidation
        later = row.updated_at is None or trial.created_at > row.updated_at
        if later and trial.triton_version == provenance.triton_version and trial.config.canonical() in wanted:
            ks.ledger.record(trial.config, trial.outcome)
    report()
    try:
        todo = [c for c in candidates if not ks.ledger.has(c)]
        if len(todo) > 1:
            bench.worker.precompile(key, todo, [ks._fault(c) for c in todo],
                                    timeout=budget.trial_timeout * len(todo))
        for cfg in todo:
            outcome = ks._trial(cfg)
            report(trial=(cfg, outcome))
        passed = [c for c in candidates if ks.ledger.measured_ok(c)]
        if not any(ks.ledger.measured_ok(c) for c in stored):
            result = ks.result("failed: no stored config passes", started, n_trials=row.n_trials, **ks.timing(),
                               message="neither the stored winner nor its runners-up passes the correctness check "
                               "here; the row stays stale (never served): tune the key again with `flashtune "
                               "search --force` and its options")
        else:
            result = ks.store_winner(passed, started, ks.timing(), status="revalidated", n_trials=row.n_trials)
    except (WorkerLost, WorkerError) as e:
        failure = e.status if isinstance(e, WorkerLost) else "error"
        result = ks.result(f"failed: {failure}", started, n_trials=row.n_trials, message=str(e)[:2000])
    report(done=True, result=result)
    return result
