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
    open_store,
    read_results,
    output_options,
    plural,
    ratio,
    tflops,
)

CSV_COLUMNS = ("gpu", "dtype", "head_dim", "seq_q", "seq_k", "group", "batch_heads", "causal", "pass", "config",
               "time_ms", "tflops",
               "default_time_ms", "speedup", "error", "n_trials", "runner", "flashtune_version", "kernel_hash",
               "triton_version", "torch_version", "cuda_version", "driver_version", "created_at", "updated_at")
TABLE_COLUMNS = ("gpu", "pass", "dtype", "d", "nq", "nk", "g", "bh", "mask", "config", "ms", "TFLOPS", "vs default",
                 "trials", "runner")


def key_cells(key) -> list[Any]:
    return [key.gpu, key.pass_, key.dtype, key.head_dim, key.seq_q, key.seq_k, key.group, key.batch_heads, key.mask]


def result_record(result) -> dict[str, Any]:
    """A stored result as JSON: its export entry plus the GPU, speed-up and timestamps."""
    from flashtune.store.exchange import entry_dict

    return {"gpu": result.key.gpu, **entry_dict(result), "speedup": result.speedup,
            "created_at": _iso(result.created_at), "updated_at": _iso(result.updated_at)}


def _iso(moment) -> str | None:
    return None if moment is None else moment.isoformat()


def _stale_note(results) -> str | None:
    from flashtune.provenance import is_current

    stale = sum(not is_current(r.provenance) for r in results)
    if not stale:
        return None
    were = "was" if stale == 1 else "were"
    return (f"note: {stale} of {plural(len(results), 'result')} {were} tuned with other kernel sources or another "
            "triton; `flashtune search --revalidate` re-times them")


@click.command("list", cls=Command)
@filter_options
@db_option
@output_options
@click.option("--recorded", is_flag=True, help="List the calls get_tuned_attention(record=True) recorded without a "
              "tuned key of their own, with their call counts (`flashtune search --recorded` tunes them).")
def list_command(where, db, as_json, as_csv, recorded):
    """List the tuned results, filtered by key fields.

    \b
    Columns: config is BLOCK_MxBLOCK_N (bwd: M1xN1/M2xN2), warps and stages;
    ms is the winner's median time, "vs default" its speed-up over the heuristic
    default config measured in the same run.

    \b
    Examples:
      flashtune list --gpu 'NVIDIA H200@sm90' --pass fwd --causal
      flashtune list --json
    """
    check_one_format(as_json, as_csv)
    if recorded:
        _list_recorded(where, db, as_json, as_csv)
        return
    with open_store(db) as store:
        results = read_results(store, where)
    if as_json:
        echo_json([result_record(r) for r in results])
    elif as_csv:
        records = [result_record(r) for r in results]
        echo_csv(CSV_COLUMNS, [[_csv_value(rec, column) for column in CSV_COLUMNS] for rec in records])
    elif not results:
        click.echo(f"no tuned results ({where.describe()})", err=True)
    else:
        rows = [[*key_cells(r.key), r.config.label(), r.time_ms, tflops(r.tflops), ratio(r.speedup), r.n_trials,
                 _runner_cell(r)] for r in results]
        click.echo(format_table(TABLE_COLUMNS, rows))
        note = _stale_note(results)
        if note:
            click.echo(note, err=True)


RECORDED_COLUMNS = ("gpu", "pass", "dtype", "d", "nq", "nk", "g", "bh", "mask", "B", "Hq", "Hkv", "calls", "tuned")


def _list_recorded(where, db, as_json: bool, as_csv: bool) -> None:
    with open_store(db) as store:
        calls = [c for c in store.recorded_calls(where.gpu) if _matches(where, c.key)]
        tuned = {key for gpu in {c.key.gpu for c in calls} for key in store.load_table(gpu, damaged=[])}
    records = [{**c.key.as_dict(), "batch": c.batch, "heads_q": c.heads_q, "heads_kv": c.heads_kv, "calls": c.calls,
                "tuned": c.key in tuned, "first_seen": _iso(c.first_seen), "last_seen": _iso(c.last_seen)}
               for c in calls]
    if as_json:
        echo_json(records)
    elif as_csv:
        columns = list(records[0]) if records else ["gpu", "dtype", "head_dim", "seq_q", "seq_k", "calls"]
        echo_csv(columns, [[rec[c] for c in columns] for rec in records])
    elif not calls:
        click.echo(f"no recorded calls ({where.describe()}): run the model with get_tuned_attention(record=True) "
                   "or FLASHTUNE_RECORD=1", err=True)
    else:
        rows = [[*key_cells(c.key), c.batch, c.heads_q, c.heads_kv, c.calls, "yes" if c.key in tuned else "no"]
                for c in calls]
        click.echo(format_table(RECORDED_COLUMNS, rows))


def _matches(where, key) -> bool:
    """Whether a key passes the filters (the store applies them to results; recorded calls here)."""
    return all(getattr(where, name) is None or getattr(where, name) == getattr(key, name)
               for name in FILTER_OPTIONS if name != "gpu")


def _runner_cell(result) -> str:
    """"triton", or the SDPA backend that serves the key with its time against the kernels'."""
    if result.runner == "triton":
        return "triton"
    times = result.runner_times
    return f"{result.runner} ({times['triton'] / times[result.runner]:.2f}x)" if "triton" in times else result.runner


def _csv_value(record: dict[str, Any], column: str) -> Any:
    return record["provenance"][column] if column in record["provenance"] else record[column]


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
        echo_json({"key": key.as_dict(), "result": result and result_record(result),
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


def _details(key, result, trials) -> str:
    lines = [f"{key.label()} on {key.gpu}"]
    if result is None:
        lines.append("no tuned result: no config passed the correctness check")
    else:
        p = result.provenance
        pairs = [
            ("config", result.config.short()),
            ("time", f"{fmt(result.time_ms)} ms"),
            ("TFLOPS", fmt(tflops(result.tflops))),
            ("default time", "-" if result.default_time_ms is None else f"{fmt(result.default_time_ms)} ms"),
            ("speed-up", ratio(result.speedup)),
            ("error", f"{fmt(result.error)} (worst error / allowance; <= 1 passes)"),
            ("trials", str(result.n_trials)),
            ("runner", _runner_cell(result) + ("" if not result.runner_times else "; measured: " + ", ".join(
                f"{name} {fmt(ms)} ms" for name, ms in sorted(result.runner_times.items(), key=lambda x: x[1])))),
            ("tuned with", (f"flashtune {p.flashtune_version}, kernels {p.kernel_hash}, triton {p.triton_version}, "
                            f"torch {p.torch_version}, CUDA {p.cuda_version or '-'}, "
                            f"driver {p.driver_version or '-'}")),
            ("GPU", f"{p.gpu_name}, compute capability {p.capability}, {p.sm_count} SMs"),
            ("updated", _iso(result.updated_at) or "-"),
        ]
        width = max(len(name) for name, _ in pairs)
        lines += [f"  {name.ljust(width)}  {value}" for name, value in pairs]
    lines.append("")
    if not trials:
        lines.append("no trials recorded for this key (it was imported, or its trials were deleted)")
    else:
        lines.append(f"{plural(len(trials), 'trial')}:")
        rows = [[t.id, t.status, t.config.label(), t.time_ms, t.error, t.message[:60]] for t in trials]
        lines.append(format_table(("id", "status", "config", "ms", "error", "message"), rows))
    return "\n".join(lines)
