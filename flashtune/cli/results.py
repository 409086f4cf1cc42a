"""``flashtune list`` and ``flashtune show``: the stored table, and one key in detail."""

from __future__ import annotations

from typing import Any

import click

from flashtune.cli._common import (
    FILTER_OPTIONS,
    Command,
    check_one_format,
    db_option,
    echo_csv,
    echo_json,
    filter_options,
    fmt,
    format_table,
    matches,
    open_store,
    read_results,
    output_options,
    stale_note,
    plural,
    ratio,
    tflops,
)

CSV_COLUMNS = ("gpu", "dtype", "head_dim", "seq_q", "seq_k", "group", "batch_heads", "causal", "pass", "config",
               "time_ms", "tflops",
               "default_time_ms", "speedup", "error", "n_trials", "runner", "chosen_by", "runner_gpu_ms",
               "runner_eager_ms", "flashtune_version", "kernel_hash",
               "triton_version", "torch_version", "cuda_version", "driver_version", "created_at", "updated_at",
               "stale", "table")
TABLE_COLUMNS = ("gpu", "pass", "dtype", "d", "nq", "nk", "g", "bh", "mask", "config", "ms", "TFLOPS", "vs default",
                 "trials", "runner")


def key_cells(key) -> list[Any]:
    return [key.gpu, key.pass_, key.dtype, key.head_dim, key.seq_q, key.seq_k, key.group, key.batch_heads, key.mask]


def result_record(result, table: str | None = None) -> dict[str, Any]:
    """A stored result as JSON: its export entry plus the GPU, speed-up, timestamps, what makes it
    stale (``provenance.stale_versions``; null: current, it serves) and the shipped ``table`` it is of."""
    from flashtune.provenance import stale_versions
    from flashtune.store.exchange import entry_dict

    record = {"gpu": result.key.gpu, **entry_dict(result), "speedup": result.speedup,
              "created_at": _iso(result.created_at), "updated_at": _iso(result.updated_at),
              "stale": stale_versions(result.provenance)}
    return {**record, "table": table} if table is not None else record


def _iso(moment) -> str | None:
    return None if moment is None else moment.isoformat()


def _shipped_results(where) -> list[tuple]:
    """(result, its file name) of the tables shipped with flashtune that match ``where``."""
    from flashtune import tables

    found, problems = tables.shipped_tables()
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    return [(r, t.name) for t in found for r in t.results if matches(where, r.key)]


@click.command("list", cls=Command)
@filter_options
@db_option
@output_options
@click.option("--recorded", is_flag=True, help="List the calls get_tuned_attention(record=True) recorded without a "
              "tuned key of their own, by bucket, with their call counts (`flashtune search --recorded` tunes them).")
@click.option("--shipped", is_flag=True, help="List the tables shipped with flashtune (served where the store has no "
              "current result of a key) instead of the store.")
def list_command(where, db, as_json, as_csv, recorded, shipped):
    """List the tuned results, filtered by key fields.

    \b
    Columns: config is BLOCK_MxBLOCK_N (bwd: M1xN1/M2xN2), warps and stages;
    ms is the winner's median time, "vs default" its speed-up over the heuristic
    default config measured in the same run; "stale" (shown when a result is)
    what it was tuned with that this installation differs in: stale results
    are not served until `flashtune revalidate` has checked them again.

    \b
    Examples:
      flashtune list --gpu 'NVIDIA H200@sm90' --pass fwd --causal
      flashtune list --json
    """
    check_one_format(as_json, as_csv)
    if recorded:
        _list_recorded(where, db, as_json, as_csv)
        return
    from flashtune.provenance import stale_versions

    if recorded and shipped:
        raise click.UsageError("--recorded and --shipped exclude each other: choose one")
    if shipped:
        found = _shipped_results(where)
    else:
        with open_store(db) as store:
            found = [(r, None) for r in read_results(store, where)]
    records = [result_record(r, table) for r, table in found]
    if as_json:
        echo_json(records)
    elif as_csv:
        echo_csv(CSV_COLUMNS, [[_csv_value(rec, column) for column in CSV_COLUMNS] for rec in records])
    elif not found:
        click.echo(f"no {'shipped' if shipped else 'tuned'} results ({where.describe()})", err=True)
    else:
        columns = [*TABLE_COLUMNS, *(["table"] if shipped else [])]
        rows = [[*key_cells(r.key), r.config.label(), r.time_ms, tflops(r.tflops), ratio(r.speedup), r.n_trials,
                 _runner_cell(r), *([table] if shipped else [])] for r, table in found]
        if any(r.runner_times for r, _ in found):  # the served runner's two times, where one was raced
            at = columns.index("runner") + 1
            columns.insert(at, RACE_COLUMN)
            for row, (r, _) in zip(rows, found):
                row.insert(at, _race_cell(r))
        stale = [stale_versions(r.provenance) for r, _ in found]
        if any(stale):
            columns.append("stale")
            rows = [[*row, reason] for row, reason in zip(rows, stale)]
        click.echo(format_table(columns, rows))
        if any(stale):
            click.echo(stale_note(sum(map(bool, stale)), len(found), db), err=True)


RECORDED_COLUMNS = ("gpu", "pass", "dtype", "d", "nq", "nk", "g", "bh", "mask", "B", "Hq", "Hkv", "calls",
                    "signatures", "tuned")


def _list_recorded(where, db, as_json: bool, as_csv: bool) -> None:
    """The recorded buckets (``recording.buckets``: a bucket's key, its most called signature's
    batch and heads, the summed calls) and whether a current result of the store tunes the key."""
    from flashtune.provenance import is_current
    from flashtune.recording import buckets

    with open_store(db) as store:
        found = [b for b in buckets(store.recorded_calls(where.gpu)) if matches(where, b.key)]
        tuned = {key for gpu in {b.key.gpu for b in found}
                 for key, r in store.load_table(gpu, damaged=[]).items() if is_current(r.provenance)}
    records = [{**b.key.as_dict(), "batch": b.batch, "heads_q": b.heads_q, "heads_kv": b.heads_kv, "calls": b.calls,
                "signatures": b.signatures, "tuned": b.key in tuned, "first_seen": _iso(b.first_seen),
                "last_seen": _iso(b.last_seen)} for b in found]
    if as_json:
        echo_json(records)
    elif as_csv:
        columns = list(records[0]) if records else ["gpu", "dtype", "head_dim", "seq_q", "seq_k", "calls"]
        echo_csv(columns, [[rec[c] for c in columns] for rec in records])
    elif not found:
        click.echo(f"no recorded calls ({where.describe()}): run the model with get_tuned_attention(record=True) "
                   "or FLASHTUNE_RECORD=1", err=True)
    else:
        rows = [[*key_cells(b.key), b.batch, b.heads_q, b.heads_kv, b.calls, b.signatures,
                 "yes" if b.key in tuned else "no"] for b in found]
        click.echo(format_table(RECORDED_COLUMNS, rows))
        click.echo("each row is a bucket: the calls whose lengths round to its nq and nk (powers of two), counted "
                   "together; `flashtune search --recorded` tunes each at B, Hq, Hkv", err=True)


# The list's column of the served runner's times (GPU / eager), shown when a listed key was raced
RACE_COLUMN = "gpu/eager ms"
# what chose the runner (runners.CHOSEN_BY), as the list shows it
_BY = {"gpu": "by GPU", "host-bound": "by eager: host-bound", "forced": "by eager: --host-bound"}


def _runner_cell(result) -> str:
    """"triton" where nothing was raced; else the runner that serves the key, with its speed-up
    over the kernels on the timing that chose it (an SDPA backend) and what chose it (a row raced
    before runners had both times: its one time, nothing said of what chose)."""
    times = result.runner_times
    if not times:
        return result.runner
    by = _BY.get(result.chosen_by)
    if result.runner == "triton" or "triton" not in times:
        return f"{result.runner} ({by})" if by else result.runner
    served, triton = times[result.runner], times["triton"]
    eager = result.chosen_by in ("host-bound", "forced") and served.eager_ms and triton.eager_ms
    speedup = triton.eager_ms / served.eager_ms if eager else triton.gpu_ms / served.gpu_ms
    return f"{result.runner} ({speedup:.2f}x{', ' + by if by else ''})"


def _race_cell(result) -> str | None:
    """The served runner's race times, "GPU/eager" ms ("-" for an eager time not measured)."""
    t = (result.runner_times or {}).get(result.runner)
    return None if t is None else f"{fmt(t.gpu_ms)}/{fmt(t.eager_ms)}"


def _csv_value(record: dict[str, Any], column: str) -> Any:
    if column in ("runner_gpu_ms", "runner_eager_ms"):
        served = (record.get("runner_times") or {}).get(record["runner"]) or {}
        return served.get(column.removeprefix("runner_"))
    return record["provenance"][column] if column in record["provenance"] else record.get(column)


@click.command("show", cls=Command)
@filter_options
@db_option
@click.option("--json", "as_json", is_flag=True, help="Output JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Output the trials as CSV.")
def show_command(where, db, as_json, as_csv):
    """Show one key in detail: its result, provenance and trials.

    The filters must pick out one key (`flashtune list` with the same filters shows
    the candidates). A key that was searched but has no valid config shows its trials
    when every key field is given.

    \b
    Example:
      flashtune show --gpu 'NVIDIA H200@sm90' --pass bwd --dtype bfloat16 \\
          --head-dim 128 --seq-len 4096 --causal
    """
    check_one_format(as_json, as_csv)
    with open_store(db) as store:
        results = read_results(store, where)
        if len(results) > 1:
            raise click.ClickException(
                f"{len(results)} results match ({where.describe()}): narrow them to one key with "
                f"{_differing_options(results)} (`flashtune list` shows them)")
        if results:
            result, key = results[0], results[0].key
            trials = store.trials_for(key)
        else:
            result = None
            key, trials = _trials_without_result(store, where)
    if as_json:
        echo_json({"key": key.as_dict(), "result": result and result_record(result), "time_measured_by": RETIMED,
                   "trials": [_trial_record(t) for t in trials]})
    elif as_csv:
        records = [_trial_record(t) for t in trials]
        columns = ("id", "status", "config", "time_ms", "error", "message", "study", "kernel_hash",
                   "triton_version", "created_at")
        echo_csv(columns, [[rec[c] for c in columns] for rec in records])
    else:
        click.echo(_details(key, result, trials))


def _differing_options(results) -> str:
    """The filter options whose values differ among ``results``."""
    return ", ".join(option for field, option in FILTER_OPTIONS.items()
                     if len({getattr(r.key, field) for r in results}) > 1)


def _trials_without_result(store, where):
    """A key searched without a winner: its trials, when the filters name the whole key."""
    from flashtune.keys import TuningKey

    fields = (where.dtype, where.head_dim, where.seq_q, where.causal, where.pass_)
    if None not in fields:
        gpus = [where.gpu] if where.gpu is not None else [g.key for g in store.list_gpus()]
        for gpu in gpus:
            try:  # the fields left out are those of a grid key (seq_k = seq_q, group 1, its batch x heads)
                key = TuningKey(gpu, where.dtype, where.head_dim, where.seq_q, where.causal, where.pass_,
                                seq_k=where.seq_k or 0, group=where.group or 1, batch_heads=where.batch_heads or 0)
            except ValueError as e:
                raise click.BadParameter(str(e)) from None
            trials = store.trials_for(key)
            if trials:
                return key, trials
    raise click.ClickException(f"no tuned result matches ({where.describe()}): `flashtune list` shows what is "
                               "stored")


def _trial_record(trial) -> dict[str, Any]:
    return {"id": trial.id, "status": trial.status, "config": trial.config.to_dict(), "time_ms": trial.time_ms,
            "error": None if trial.error is None or trial.error == float("inf") else trial.error,
            "message": trial.message, "study": trial.study, "kernel_hash": trial.kernel_hash,
            "triton_version": trial.triton_version, "created_at": _iso(trial.created_at)}


# How a stored winner's time was measured (autotuner.key_search.KeySearch.store_winner): not a trial's
RETIMED = ("the median of interleaved rounds with the other finalists and the default, after the trials or at "
           "revalidation")


def _runner_details(result) -> str:
    """The runner, and where it was raced each runner's GPU and eager times and what chose it."""
    from flashtune.runners import describe_choice

    times = result.runner_times
    if not times:
        return _runner_cell(result)

    def both(t) -> str:
        return f"{fmt(t.gpu_ms)} / {fmt(t.eager_ms)}"

    ranked = sorted(times.items(), key=lambda item: item[1].gpu_ms)
    return (f"{result.runner}, chosen {describe_choice(times, result.chosen_by)}; raced, each runner's whole call "
            "(a training key: forward + backward), GPU / eager ms: "
            + ", ".join(f"{name} {both(t)}" for name, t in ranked))


def _details(key, result, trials) -> str:
    lines = [f"{key.label()} on {key.gpu}"]
    if result is None:
        lines.append("no tuned result: no config passed the correctness check")
    else:
        from flashtune.provenance import staleness

        p = result.provenance
        stale = staleness(p)
        pairs = [
            ("config", result.config.short()),
            ("time", f"{fmt(result.time_ms)} ms, re-timed ({RETIMED})"),
            ("TFLOPS", fmt(tflops(result.tflops))),
            ("default time", "-" if result.default_time_ms is None else f"{fmt(result.default_time_ms)} ms, re-timed "
                                                                        "with it"),
            ("speed-up", ratio(result.speedup)),
            ("error", f"{fmt(result.error)} (worst error / allowance; <= 1 passes)"),
            ("trials", str(result.n_trials)),
            ("runner", _runner_details(result)),
            ("tuned with", (f"flashtune {p.flashtune_version}, kernels {p.kernel_hash}, triton {p.triton_version}, "
                            f"torch {p.torch_version}, CUDA {p.cuda_version or '-'}, "
                            f"driver {p.driver_version or '-'}")),
            ("GPU", f"{p.gpu_name}, compute capability {p.capability}, {p.sm_count} SMs"),
            ("updated", _iso(result.updated_at) or "-"),
            ("state", "current: served" if stale is None else
             f"stale, {stale}: not served until `flashtune revalidate` has checked it again here"),
        ]
        width = max(len(name) for name, _ in pairs)
        lines += [f"  {name.ljust(width)}  {value}" for name, value in pairs]
    lines.append("")
    if not trials:
        lines.append("no trials recorded for this key (it was imported, or its trials were deleted)")
    else:
        lines.append(f"{plural(len(trials), 'trial')} (each config checked, then timed once; the times above are "
                     "the re-timing's):")
        rows = [[t.id, t.status, t.config.label(), t.time_ms, t.error, t.message[:60]] for t in trials]
        lines.append(format_table(("id", "status", "config", "ms", "error", "message"), rows))
    return "\n".join(lines)
