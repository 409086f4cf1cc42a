"""``flashtune revalidate``: bring stale tuned results back into service after an upgrade."""

from __future__ import annotations

import click

from flashtune.cli._common import (
    Command,
    choose_device,
    db_option,
    echo_json,
    filter_options,
    interpreter_options,
    matches,
    missing_store,
    open_store,
    read_results,
)

# The finalists' re-timing rounds: fewer than a search's five, a revalidation re-times a handful
# of configs a search already ranked.
DEFAULT_ROUNDS = 3


@click.command("revalidate", cls=Command)
@filter_options
@db_option
@click.option("--all", "all_rows", is_flag=True, help="Check the current results too, not only the stale ones.")
@click.option("--shipped/--no-shipped", default=True, show_default=True,
              help="Also check the stale rows of the table flashtune ships for this GPU where the store has no "
              "current result of their key (they are written into the store).")
@click.option("--runners-up", type=click.IntRange(min=0), default=None, metavar="N",
              help="The stored winner's runners-up checked beside it (the fastest other configs of its search). "
              "[default: 2]")
@click.option("--rounds", type=click.IntRange(min=1), default=DEFAULT_ROUNDS, show_default=True,
              help="Interleaved re-timing rounds of the configs that pass.")
@click.option("--trial-timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
              metavar="SECONDS", help="A check that takes longer is killed and recorded as a timeout.")
@click.option("--sdpa/--no-sdpa", default=None, help="Also time torch SDPA's backends and serve the fastest correct "
              "runner. [default: on a GPU, off under the interpreter]")
@interpreter_options
@click.option("--devices", metavar="all|0,1,...", help="Revalidate on several devices at once, one key per device.")
@click.option("--progress/--no-progress", default=None, help="Show progress on stderr. [default: on, off with --json]")
@click.option("--json", "as_json", is_flag=True, help="Output the summary as JSON.")
def revalidate_command(where, db, all_rows, shipped, runners_up, rounds, trial_timeout, sdpa, interpreter, device,
                       devices, progress, as_json):
    """Check and re-time stale tuned results, so that they serve again.

    A result is stale when it was tuned under other kernel sources or another
    triton (after upgrading flashtune or triton, or imported from another team):
    its correctness check ran on other code, so get_tuned_attention() does not
    serve it. This checks the stored winner of each stale key of this GPU, its
    runners-up and the heuristic default against the fp32 reference, re-times
    those that pass (and torch SDPA's backends) and stores the fastest with this
    installation's versions: a handful of trials per key, not a search. A key
    none of whose stored configs passes stays stale: search it again.

    \b
    Examples:
      flashtune revalidate
      flashtune revalidate --head-dim 128 --pass bwd
      flashtune revalidate --interpreter     # the CPU demo's store
    """
    from flashtune.cli.search import _device_names, run_search
    from flashtune.keys import GpuInfo

    if devices is not None and device is not None:
        raise click.UsageError("give --device or --devices, not both")
    dev, is_interpreter = choose_device("revalidate", device, interpreter)
    names = _device_names(devices, is_interpreter)
    if is_interpreter:
        gpus = [GpuInfo.interpreter()]
    else:
        gpus = list({g.key: g for g in (GpuInfo.from_device(n) for n in (names or [dev]))}.values())
    if where.gpu is not None and where.gpu not in {g.key for g in gpus}:
        raise click.BadParameter(f"{where.gpu!r} is not this host's GPU ({', '.join(g.key for g in gpus)}): "
                                 "a result is checked on the GPU it serves", param_hint="'--gpu'")
    rows, before = {}, {}
    for gpu in gpus:
        found = _rows_to_check(db, gpu, where, all_rows=all_rows, shipped=shipped)
        rows.update(found)
        before.update(found)
    if not rows:
        what = "result" if all_rows else "stale result"
        message = f"nothing to revalidate: no {what} for {', '.join(g.key for g in gpus)} matches ({where.describe()})"
        if as_json:
            echo_json({"interpreter": is_interpreter, "keys": [], "message": message})
        else:
            click.echo(message, err=True)
        return
    run_search(list(rows), gpus=gpus, names=names, dev=dev, interpreter=is_interpreter, trials=1, db=db,
               storage=None, progress=progress, as_json=as_json, before=before, revalidate=True, rows=rows,
               runners_up=runners_up, rounds=rounds, trial_timeout=trial_timeout, sdpa=sdpa)


def _rows_to_check(db, gpu, where, *, all_rows: bool, shipped: bool) -> dict:
    """Key -> the row to revalidate: the store's stale rows of ``gpu`` (every row with ``all_rows``)
    matching ``where``, then the shipped table's stale rows of keys the store has no current row of."""
    import dataclasses

    from flashtune import tables
    from flashtune.provenance import is_current

    where = dataclasses.replace(where, gpu=gpu.key)
    stored = []
    if not missing_store(db):
        with open_store(db) as store:
            stored = read_results(store, where)
    rows = {r.key: r for r in stored if all_rows or not is_current(r.provenance)}
    current = {r.key for r in stored if is_current(r.provenance)}
    if shipped:
        table, problems = tables.for_gpu(gpu)
        for problem in problems:
            click.echo(f"warning: {problem}", err=True)
        for r in table.for_device(gpu) if table is not None else ():
            if matches(where, r.key) and not is_current(r.provenance) and r.key not in current:
                rows.setdefault(r.key, r)
    return dict(sorted(rows.items()))
