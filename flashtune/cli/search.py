"""``flashtune search``: tune this GPU's kernel configs and store the winners."""

from __future__ import annotations

import contextlib
import sys
import warnings

import click

from flashtune.cli._common import (
    Command,
    choose_device,
    db_option,
    echo_json,
    format_table,
    grid,
    interpreter_options,
    interrupted,
    key_grid_options,
    open_store,
    plural,
    ratio,
    tflops,
)

# On the H200 (docs/tuning.md), 16 trials per key left one forward key 3.4 % behind an
# exhaustive sweep of its 296 configs; 32 came within 1.2 % on both swept keys.
DEFAULT_TRIALS = 32
DEMO_TRIALS = 3
TIMER_NOTES = {"interpreter-wall-clock": "Triton interpreter on the CPU, wall clock: not GPU performance",
               "cuda-graph-replay": "each config's launches replayed from a CUDA graph: GPU time, no host time"}


@click.command("search", cls=Command)
@key_grid_options
@click.option("--shapes", "shapes_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Tune the calls of a JSON or YAML file of shape rows (B, Hq, Hkv, Nq, Nk, D, causal, dtype, "
              "passes) instead of the grid.")
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="Tune a preset model's prefill, decode and training calls (--list-models shows them); "
              "repeat for several.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --model: the tensor-parallel degree (each GPU runs heads / tp query heads).")
@click.option("--list-models", is_flag=True, help="List the --model presets and exit.")
@click.option("--recorded", is_flag=True, help="Tune the calls get_tuned_attention(record=True) recorded on this GPU "
              "(`flashtune list --recorded` shows them).")
@click.option("--trials", type=click.IntRange(min=1), metavar="N",
              help=f"Configs measured per key. [default: {DEFAULT_TRIALS}; interpreter: {DEMO_TRIALS}]")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Start no trial of a key after this long (with --trials, whichever comes first); a key's "
              "first batch of trials (8 configs compiled together on a GPU) is always measured.")
@click.option("--trial-timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
              metavar="SECONDS", help="A trial that takes longer is killed and recorded as a timeout.")
@db_option
@click.option("--storage", metavar="PATH|URL", help="Optuna's study storage: a journal file or an RDB URL "
              "(PostgreSQL to share a search between hosts). [default: optuna-journal.log next to the store]")
@click.option("--revalidate", is_flag=True, help="Search nothing: check and re-time the stored winners, their "
              "runners-up and the default under the current versions (the stored keys of this GPU that match the key "
              "options, stale or not; `flashtune revalidate` takes the stale ones).")
@click.option("--force", is_flag=True, help="Search keys again even if their search already finished.")
@click.option("--sdpa/--no-sdpa", default=None, help="Also time torch SDPA's backends (cuDNN, FlashAttention-2, "
              "memory-efficient) for each key and serve the fastest correct runner. [default: on a GPU, off "
              "under the interpreter]")
@click.option("--host-bound", is_flag=True, help="Choose each key's runner by its eager time (plain calls, the host's "
              "work included) rather than its GPU time, for a model whose host is the bottleneck (small batches, "
              "eager decode loops). Without it the eager time decides only where a call is host-bound. Stored with "
              "the key (`flashtune show`, explain()).")
@interpreter_options
@click.option("--devices", metavar="all|0,1,...", help="Search on several devices at once, one worker process each "
              "(a free device takes the next key; each key's trials stay on one device): all of this host's, or "
              "these indices. Under --interpreter the host pretends to have $FLASHTUNE_INTERPRETER_DEVICES "
              "devices. [default: --device]")
@click.option("--seed", type=int, default=0, show_default=True, help="The sampler's seed.")
@click.option("--progress/--no-progress", default=None, help="Show progress on stderr: a bar on a terminal, else "
              "one line per trial and per key with an ETA (for logs). [default: on, off with --json]")
@click.option("--json", "as_json", is_flag=True, help="Output the summary as JSON.")
def search_command(head_dims, dtypes, seq_lens, causal, passes, shapes_file, models, tp, list_models, recorded, trials,
                   timeout, trial_timeout, db, storage, revalidate, force, sdpa, host_bound, interpreter, device,
                   devices, seed, progress, as_json):
    """Tune kernel configs for this GPU and store the winners.

    By default: the common LLM shapes (head dims 64 and 128, bfloat16, sequence
    lengths 512 to 16384, causal and full, forward and backward) with a budget
    of 32 configs per key. Every config is checked against an fp32 reference before
    it is timed; the winner, its speed-up over the heuristic default, and every
    trial go to the store. An interrupted search resumes where it stopped.

    \b
    Examples:
      flashtune search
      flashtune search --head-dim 128 --seq-len 4096,8192 --causal --trials 64
      flashtune search --model llama3-8b     # a model's prefill, decode and training calls
      flashtune search --shapes shapes.yaml  # the calls a team runs
      flashtune search --revalidate          # re-check every stored winner (flashtune revalidate: the stale ones)
      flashtune search --devices all         # every GPU of this host, one key per GPU at a time
      flashtune search --interpreter         # tiny CPU demo, no GPU needed

    Searches that share a store (several hosts on one PostgreSQL database, or several
    runs on one SQLite file) split the keys: each key is claimed in the store with a
    lease, and a key whose search died is taken over once its lease expires.
    """
    from flashtune.autotuner import build_keys
    from flashtune.keys import GpuInfo

    if list_models:
        _list_models(as_json)
        return
    shaped = shapes_file is not None or bool(models) or recorded
    grid_given = [name for name, value in (("--head-dim", head_dims), ("--dtype", dtypes), ("--seq-len", seq_lens),
                                           ("--causal/--full", causal is not None), ("--pass", passes)) if value]
    if shaped and (grid_given or revalidate):
        raise click.UsageError(f"--shapes, --model and --recorded name the calls themselves; leave out "
                               f"{', '.join(grid_given or ['--revalidate'])}")
    if tp != 1 and not models:
        raise click.UsageError("--tp applies to --model")
    from flashtune.shapes import MODELS

    unknown = [name for name in models if name not in MODELS]
    if unknown:  # before the device: a typo is named on any machine
        raise click.BadParameter(f"model: unknown {unknown[0]!r}; expected one of {', '.join(MODELS)}",
                                 param_hint="'--model'")
    if devices is not None and device is not None:
        raise click.UsageError("give --device or --devices, not both")
    dev, is_interpreter = choose_device("search", device, interpreter)
    if is_interpreter and models:
        raise click.UsageError("--model presets are real models' shapes, far too large for the Triton interpreter; "
                               "under --interpreter give tiny rows with --shapes")
    if host_bound and not (sdpa if sdpa is not None else not is_interpreter):
        raise click.UsageError("--host-bound chooses among the runners SDPA's backends are raced against, and this "
                               "search races none (--no-sdpa, the interpreter's default): add --sdpa or leave out "
                               "--host-bound")
    names = _device_names(devices, is_interpreter)
    trials = trials or (DEMO_TRIALS if is_interpreter else DEFAULT_TRIALS)
    values = grid(head_dims, dtypes, seq_lens, causal, passes, interpreter=is_interpreter)
    if is_interpreter:
        gpus = [GpuInfo.interpreter()]
    else:  # one set of keys per GPU model among the devices, as one device would have
        gpus = list({g.key: g for g in (GpuInfo.from_device(n) for n in (names or [dev]))}.values())
    gpu = gpus[0]
    before, keys, call_shapes = {}, [], {}
    for each in gpus:
        if revalidate:
            found, stored = _stored_keys(db, each.key, head_dims, dtypes, seq_lens, causal, passes)
            keys += found
            before.update(stored)
        elif recorded:
            call_shapes.update(_recorded_keys(db, each.key))
        elif shaped:
            call_shapes.update(shape_keys(each.key, shapes_file, models, tp))
        else:
            keys += build_keys(each.key, head_dims=values["head_dims"], dtypes=values["dtypes"],
                               seq_lens=values["seq_lens"], causal=values["causal"], passes=values["passes"])
    keys += list(call_shapes)  # a shape set's or the recorded calls' keys, timed at their calls' shapes
    run_search(keys, gpus=gpus, names=names, dev=dev, interpreter=is_interpreter, trials=trials, db=db,
               storage=storage, progress=progress, as_json=as_json, before=before, timeout=timeout,
               trial_timeout=trial_timeout, seed=seed, force=force, revalidate=revalidate, sdpa=sdpa,
               host_bound=host_bound, shapes=call_shapes or None)


# what a key's search ended in, when it did what was asked
OK_STATUSES = ("tuned", "already_tuned", "tuned_elsewhere", "revalidated")


def run_search(keys, *, gpus, names, dev, interpreter: bool, trials: int, db, storage, progress, as_json: bool,
               before: dict, revalidate: bool = False, rows=None, runners_up: int | None = None, **options) -> None:
    """Search (or revalidate) ``keys`` with a progress display on stderr, then print the summary;
    keys that did not end as asked make the command fail (exit 1) naming what to look at."""
    from flashtune.autotuner import search
    from flashtune.autotuner.revalidate import DEFAULT_RUNNERS_UP

    if interpreter and "bfloat16" in {k.dtype for k in keys}:
        # a shape row's dtype defaults to bfloat16 (real models'), so a tiny shapes file meets this too
        remedy = ("give its rows `dtype: float32` (or float16)" if options.get("shapes")
                  else "use --dtype float32 or float16")
        click.echo("warning: bfloat16 gives wrong results under the Triton interpreter; its configs will fail the "
                   f"correctness check ({remedy})", err=True)
    if progress is None:
        progress = not as_json
    reporter = None
    if progress and not sys.stderr.isatty():  # a bar would show only its last frame
        from flashtune.cli.progress import TrialLog

        reporter, progress = TrialLog(), False
    runners_up = DEFAULT_RUNNERS_UP if runners_up is None else runners_up
    if not as_json:
        mode = "the Triton interpreter: a CPU demo" if interpreter else dev
        on = ", ".join(g.key for g in gpus)
        on += f" ({plural(len(names), 'device')}: {', '.join(names)}; {mode})" if names else f" ({mode})"
        if revalidate:
            what = (f"checking and re-timing each stored winner, its {plural(runners_up, 'runner-up', 'runners-up')} "
                    "and the default")
            click.echo(f"revalidating {plural(len(keys), 'key')} on {on}, {what}", err=True)
        else:
            click.echo(f"searching {plural(len(keys), 'key')} on {on}, {plural(trials, 'trial')} per key", err=True)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_warnings_as_lines())
            report = None
            if not progress:
                report = reporter  # lines where stderr is no terminal (or None: nothing)
            else:
                from rich.console import Console

                from flashtune.cli._progress import ProgressBar

                report = stack.enter_context(ProgressBar(Console(stderr=True), devices=len(names or [dev])))
            summary = search(keys, db=db, trials=trials, storage=storage, device=None if names else dev,
                             devices=names, progress=report, revalidate=revalidate, rows=rows,
                             runners_up=runners_up, **options)
    except KeyboardInterrupt:
        raise interrupted("interrupted: the keys finished so far are stored; run the same command again to "
                          "resume") from None
    _report(summary, before, as_json)
    failed = [r for r in summary.results if r.status not in OK_STATUSES]
    if failed:
        were = "was" if len(failed) == 1 else "were"
        done = "revalidated" if revalidate else "tuned"
        raise click.ClickException(f"{len(failed)} of {plural(len(summary.results), 'key')} {were} not {done} "
                                   f"({', '.join(sorted({r.status for r in failed}))}): `flashtune show` with a "
                                   "key's options lists its trials and their errors")


def _device_names(devices: str | None, interpreter: bool) -> list[str] | None:
    """``--devices`` as device names; a malformed value or a device this host lacks is a usage error."""
    if devices is None:
        return None
    from flashtune.autotuner.devices import resolve_devices

    try:
        return resolve_devices(devices, interpreter=interpreter)
    except ValueError as e:
        raise click.BadParameter(str(e).removeprefix("devices: "), param_hint="'--devices'") from None


@contextlib.contextmanager
def _warnings_as_lines():
    """The search's own warnings (a repaired journal) as "warning: ..." lines on stderr."""
    from flashtune.autotuner.storage_checks import JournalRepaired

    with warnings.catch_warnings():
        warnings.simplefilter("always", JournalRepaired)
        shown = warnings.showwarning

        def show(message, category, *args, **kwargs):
            if issubclass(category, JournalRepaired):
                click.echo(f"warning: {message}", err=True)
            else:
                shown(message, category, *args, **kwargs)

        warnings.showwarning = show
        yield


def shape_keys(gpu_key: str, shapes_file, models, tp: int) -> dict:
    """The tuning keys of a shape file's rows and the presets' calls, each key once, in order,
    each with the (batch, heads_q, heads_kv) of its first call (what its trials run)."""
    from flashtune.keys import TuningKey
    from flashtune.shapes import ShapeError, load_shapes, model_shapes

    shapes = []
    try:
        if shapes_file is not None:
            shapes += load_shapes(shapes_file)
        for name in models:
            shapes += model_shapes(name, tp=tp)
    except ShapeError as e:
        option = "--shapes" if shapes_file is not None and str(e).startswith(str(shapes_file)) else "--model"
        raise click.BadParameter(str(e), param_hint=f"'{option}'") from None
    out: dict = {}
    for shape in shapes:
        for pass_ in shape.passes:
            out.setdefault(TuningKey.for_shape(gpu_key, shape, pass_), (shape.batch, shape.heads_q, shape.heads_kv))
    return out


def _recorded_keys(db, gpu_key: str) -> dict:
    """The recorded buckets' keys (``recording.buckets``), each with the shape of its most called
    signature, the most called bucket first."""
    from flashtune.recording import buckets

    with open_store(db) as store:
        found = buckets(store.recorded_calls(gpu_key))
    if not found:
        raise click.ClickException(f"no recorded calls for {gpu_key}: run the model once with "
                                   "get_tuned_attention(record=True) or FLASHTUNE_RECORD=1, then search again")
    return {bucket.key: bucket.shape for bucket in found}


def _list_models(as_json: bool) -> None:
    from flashtune.shapes import MODELS

    if as_json:
        echo_json([{"name": m.name, "description": m.description, "heads_q": m.heads_q, "heads_kv": m.heads_kv,
                    "head_dim": m.head_dim, "shapes": [s.as_dict() for s in m.shapes()]} for m in MODELS.values()])
        return
    rows = [[m.name, m.description, len(m.shapes())] for m in MODELS.values()]
    click.echo(format_table(("model", "attention", "shapes"), rows))
    click.echo("each shape is one call (B, Hq, Hkv, Nq, Nk, D); `flashtune search --model NAME [--tp N]` tunes "
               "its forward and, for training calls, backward keys")


def _stored_keys(db, gpu_key, head_dims, dtypes, seq_lens, causal, passes):
    """The stored keys of this GPU that match every key option given, and their results."""
    with open_store(db) as store:
        table = store.load_table(gpu_key)
    keys = sorted(k for k in table
                  if (not head_dims or k.head_dim in head_dims) and (not dtypes or k.dtype in dtypes)
                  and (not seq_lens or k.seq_q in seq_lens) and (causal is None or k.causal == causal)
                  and (not passes or k.pass_ in passes))
    if not keys:
        raise click.ClickException(f"nothing to revalidate: the store has no tuned results for {gpu_key} that match "
                                   "the key options; run `flashtune search` first")
    return keys, {k: table[k] for k in keys}


def _runner_cell(r) -> str:
    """The runner a key got, "(by eager)" where its eager time chose it (runners.choose)."""
    return f"{r.runner} (by eager)" if r.chosen_by in ("host-bound", "forced") else r.runner


def _report(summary, before, as_json: bool) -> None:
    from flashtune.runners import times_as_dicts

    results = summary.results
    timers = sorted({r.timer for r in results if r.timer})
    if as_json:
        echo_json({
            "interpreter": summary.interpreter, "storage": summary.storage, "timers": timers,
            "keys": [{
                **r.key.as_dict(), "status": r.status,
                "config": r.winner.to_dict() if r.winner is not None else None, "time_ms": r.time_ms,
                "tflops": r.tflops, "default_time_ms": r.default_time_ms, "speedup": r.speedup,
                "trials": r.n_trials, "rejected": r.rejected, "outcomes": r.outcomes, "wall_s": r.wall_s,
                # (batch, heads_q, heads_kv) the trials ran: the call's own for a shape set's key
                "trial_shape": list(r.shape) if r.shape else None,
                "timer": r.timer, "before_ms": before[r.key].time_ms if r.key in before else None,
                "runner": r.runner, "chosen_by": r.chosen_by, "runner_times": times_as_dicts(r.runner_times),
                "message": getattr(r, "message", ""),
            } for r in results],
        })
        return
    headers = ["key", "status", "winner", "ms", "TFLOPS", "vs default", "trials", "rejected", "runner"]
    if before:
        headers.append("was ms")
    rows = []
    for r in results:
        row = [r.key.label(), r.status, r.winner.label() if r.winner is not None else None, r.time_ms,
               tflops(r.tflops), ratio(r.speedup), r.n_trials, r.rejected,
               _runner_cell(r) if r.status in ("tuned", "revalidated") else None]
        if before:
            row.append(before[r.key].time_ms if r.key in before else None)
        rows.append(row)
    click.echo(format_table(headers, rows))
    tuned = [r for r in results if r.status in ("tuned", "revalidated")]
    done = "revalidated" if any(r.status == "revalidated" for r in results) else "tuned"
    storage = "" if done == "revalidated" else f"; Optuna storage: {summary.storage}"  # a revalidation asks none
    click.echo(f"{len(tuned)} of {plural(len(results), 'key')} {done} on {results[0].key.gpu if results else '-'}"
               f"{storage}")
    for timer in timers:
        click.echo(f"timings: {timer}" + (f" ({TIMER_NOTES[timer]})" if timer in TIMER_NOTES else ""))
    for r in results:
        message = getattr(r, "message", "")
        # a stored key's note: the store kept a faster result than the one in the table above
        if message and (r.status.startswith("failed") or r.status in ("tuned", "revalidated")):
            click.echo(f"{r.key.label()} {r.status}: {message.strip().splitlines()[0]}")
    rejected = sum(r.rejected for r in results)
    if rejected:
        statuses = {}
        for r in results:
            for status, n in r.outcomes.items():
                if status != "ok":
                    statuses[status] = statuses.get(status, 0) + n
        click.echo("rejected trials: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
