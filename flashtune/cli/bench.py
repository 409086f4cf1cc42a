"""``flashtune bench``: tuned configs vs the heuristic default vs torch SDPA's backends."""

from __future__ import annotations

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
    key_grid_options,
    plural,
    ratio,
)

GPU_IMPLS = ("tuned", "default", "cudnn", "flash")
DEMO_IMPLS = ("tuned", "default")


@click.command("bench", cls=Command)
@key_grid_options
@click.option("--impl", "impls", multiple=True, type=click.Choice(GPU_IMPLS),
              help="Implementations to time. [default: all on a GPU; tuned and default under the interpreter]")
@db_option
@interpreter_options
@click.option("--plot", "plot_path", metavar="FILE.png", type=click.Path(dir_okay=False),
              help="Also plot TFLOPS vs sequence length, one line per implementation (needs matplotlib).")
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help="Interleaved rounds per key; each time is the median of its rounds. [default: 3 on a GPU, 1 "
                   "under the interpreter]")
@click.option("--json", "as_json", is_flag=True, help="Output JSON.")
def bench_command(head_dims, dtypes, seq_lens, causal, passes, impls, db, interpreter, device, plot_path, rounds,
                  as_json):
    """Benchmark tuned configs vs the heuristic default vs torch SDPA.

    For each key: flashtune as get_tuned_attention() serves it (the stored config of
    the key, else of the nearest tuned key close enough to carry over), flashtune with
    the heuristic default config, and torch SDPA's cuDNN and flash backends, at the
    benchmark grid's shapes (16k tokens, model width 2048). The table gives TFLOPS and the ratios of times (above 1: tuned
    is faster), with their geometric means.

    Without a GPU, --interpreter runs a tiny demo under the Triton interpreter that
    compares tuned and default only.

    \b
    Examples:
      flashtune bench --head-dim 128 --causal --plot bench.png
      flashtune bench --interpreter
    """
    if plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.ClickException("--plot needs matplotlib: pip install 'flashtune[plot]'") from None
    dev, is_interpreter = choose_device("bench", device, interpreter)
    if is_interpreter and set(impls) - set(DEMO_IMPLS):
        raise click.UsageError("under the interpreter only --impl tuned and --impl default can run (torch SDPA "
                               "backends need a GPU)")
    impls = list(impls) or list(DEMO_IMPLS if is_interpreter else GPU_IMPLS)

    from flashtune.autotuner import build_keys
    from flashtune.cli import _bench
    from flashtune.keys import GpuInfo

    gpu = GpuInfo.interpreter() if is_interpreter else GpuInfo.from_device(dev)
    values = grid(head_dims, dtypes, seq_lens, causal, passes, interpreter=is_interpreter)
    keys = build_keys(gpu.key, head_dims=values["head_dims"], dtypes=values["dtypes"], seq_lens=values["seq_lens"],
                      causal=values["causal"], passes=values["passes"])
    if not as_json:
        click.echo(f"benchmarking {plural(len(keys), 'key')} x {len(impls)} implementations on {gpu.key}"
                   f"{' (Triton interpreter, CPU wall clock: not GPU performance)' if is_interpreter else ''}",
                   err=True)

    n_rounds = rounds or (1 if is_interpreter else 3)

    def on_result(m):
        if not as_json and sys.stderr.isatty():
            click.echo(f"  {m.key.label()} {m.impl}: {'-' if m.time_ms is None else f'{m.time_ms:.4g} ms'}",
                       err=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", _dispatch_warning())
        measurements = _bench.measure(keys, impls, dev, db=db, on_result=on_result, rounds=n_rounds)
    for warning in caught:  # the dispatcher's: an unreadable store, stale rows
        click.echo(f"note: {warning.message}", err=True)
    if "tuned" in impls and all(m.time_ms is None for m in measurements if m.impl == "tuned"):
        click.echo(f"note: nothing is tuned for these keys on {gpu.key} in this store; run `flashtune search"
                   f"{' --interpreter' if is_interpreter else ''}` first", err=True)
    rows = _rows(keys, impls, measurements)
    timer = "interpreter-wall-clock" if is_interpreter else "triton.testing.do_bench median"
    if n_rounds > 1:
        timer += f", median of {n_rounds} interleaved rounds"
    if plot_path:
        _bench.plot(measurements, plot_path, f"flashtune bench on {gpu.key} ({timer})")
    if as_json:
        echo_json({"gpu": gpu.key, "interpreter": is_interpreter, "timer": timer, "versions": _versions(),
                   "measurements": [_measurement_record(m) for m in measurements],
                   "ratios": [{**key.as_dict(gpu=False), **r} for key, r in rows],
                   "geomean": _geomeans(rows)})
        return
    tuned = "tuned" in impls
    ratio_names = [f"tuned/{impl}" for impl in impls if impl != "tuned"] if tuned else []
    headers = ["key", *[f"{impl} TFLOPS" for impl in impls], *ratio_names, *(["tuned config"] if tuned else [])]
    table_rows = [[key.label(), *[r[f"{impl}_tflops"] for impl in impls], *[ratio(r[name]) for name in ratio_names],
                   *([r["tuned_note"].removeprefix("tuned ")] if tuned else [])] for key, r in rows]
    means = _geomeans(rows)
    table_rows.append(["geometric mean", *[None] * len(impls), *[ratio(means[name]) for name in ratio_names],
                       *([""] if tuned else [])])
    click.echo(format_table(headers, table_rows))
    click.echo(f"timer: {timer}; ratios are times (above 1: tuned is faster)")
    if plot_path:
        click.echo(f"plot: {plot_path}")


def _dispatch_warning() -> type[Warning]:
    from flashtune.dispatch import DispatchWarning

    return DispatchWarning


def _rows(keys, impls, measurements):
    """Per key: each implementation's TFLOPS, and the other implementations' time / tuned time."""
    by_key = {}
    for m in measurements:
        by_key.setdefault(m.key, {})[m.impl] = m
    rows = []
    for key in keys:
        got = by_key.get(key, {})
        row = {f"{impl}_tflops": got[impl].tflops if impl in got else None for impl in impls}
        tuned = got.get("tuned")
        if tuned is not None:
            row["tuned_note"] = tuned.note
            for impl in impls:
                if impl != "tuned":
                    other = got.get(impl)
                    ok = tuned.time_ms is not None and other is not None and other.time_ms is not None
                    row[f"tuned/{impl}"] = other.time_ms / tuned.time_ms if ok else None
        rows.append((key, row))
    return rows


def _geomeans(rows) -> dict:
    from flashtune.protocol import geomean

    names = sorted({name for _, r in rows for name in r if name.startswith("tuned/")})
    return {name: geomean(r.get(name) for _, r in rows) for name in names}


def _measurement_record(m) -> dict:
    return {**m.key.as_dict(gpu=False), "impl": m.impl, "time_ms": m.time_ms, "tflops": m.tflops, "note": m.note}


def _versions() -> dict:
    import torch
    import triton

    from flashtune import __version__
    from flashtune.provenance import kernel_source_hash

    return {"flashtune": __version__, "kernel_hash": kernel_source_hash(), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda}
