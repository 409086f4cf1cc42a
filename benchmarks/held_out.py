"""What a tuned store serves for shapes it was not tuned on, against the heuristic default and SDPA.

A store tuned on the SHAPES rows (``flashtune search --shapes``; ``flashtune.shapes.REALISTIC_GRID``)
or the standard grid serves other calls from a neighbouring tuned key where it carries over
(``flashtune.keys.neighbour_gap``: within a factor of 2 in each of the lengths, the group and the
batch x heads bucket, grouped only from grouped heads, decode only from decode), else the heuristic
default. This script checks that rule on held-out rows (``HELD_OUT``: none of them is a key of the
SHAPES rows or the grid, ``--list-rows`` prints them), in one process, each row's runners checked
against an fp32 reference and then timed in interleaved rounds:

  served    get_tuned_attention(--db): what the drop-in runs for the call (the tuned key's
            runner and configs, or the heuristic default); explain() names the key that served
  default   flashtune.attention with no store: the heuristic default configs
  cudnn, flash, efficient
            torch SDPA's backends (--anchors); "best SDPA" is the fastest of them per row and pass

the forward for every row and the backward (alone, of one kept forward) for training rows.
Figures are speed ratios, time(other) / time(served) (above 1: served faster): served / default
per row, its minimum (over all rows, and over the rows a tuned key served) and geometric mean, and
served and default against the best SDPA backend. A row or runner that cannot run here (out of
memory, a backend that refuses the shape) is left out with a note, and the run goes on.

    python benchmarks/held_out.py --db tuned.db --out held_out.json
    python benchmarks/held_out.py --db tuned.db --rows mqa71-prefill-3000-d64,decode-b1-g4-20000 --pass fwd
    python benchmarks/held_out.py --db tuned.db --device cpu --rows decode-b8-g4-3000   # interpreter smoke run

The exit status is 1 when the served call or the default computed a wrong answer on a row.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

harness.use_interpreter_for_cpu()

from flashtune.shapes import Shape  # noqa: E402

_FB, _F = ("fwd", "bwd"), ("fwd",)
SDPA_ANCHORS = tuple(harness.SDPA_ANCHORS)


def _between(d: int, n: int, causal: bool) -> Shape:
    """The grid's 16k tokens at model width 2048 (B = 16384 // N, H = 2048 / D), at a length between its own."""
    return Shape(max(1, 16384 // n), 2048 // d, 2048 // d, n, n, d, causal, "bfloat16", _FB,
                 f"between-d{d}-{n}-{'causal' if causal else 'full'}")


# Rows off the SHAPES rows and the grid (their keys are none of theirs: tests/benchmarks/test_held_out.py),
# near a tuned key and far from every one: a 71-group MQA prefill (no tuned group near it), lengths
# between the grid's at the grid's tokens, GQA groups 4 and 6, batch x heads buckets the grid does not
# have, decode at cache lengths between the SHAPES rows' and at batch sizes they do not have.
HELD_OUT: tuple[Shape, ...] = (
    Shape(1, 71, 1, 3000, 3000, 64, True, "bfloat16", _F, "mqa71-prefill-3000-d64"),
    *(_between(d, n, causal) for d in (64, 128) for causal in (True, False) for n in (3000, 6000, 12000)),
    Shape(2, 32, 8, 3000, 3000, 128, True, "bfloat16", _F, "gqa4-prefill-b2-3000-d128"),
    Shape(1, 24, 4, 3000, 3000, 128, True, "bfloat16", _F, "gqa6-prefill-3000-d128"),
    Shape(1, 48, 8, 6000, 6000, 128, True, "bfloat16", _FB, "gqa6-train-6000-d128"),
    Shape(3, 16, 16, 2048, 2048, 128, True, "bfloat16", _FB, "bh48-d128-2048-causal"),
    Shape(1, 16, 16, 2048, 2048, 128, False, "bfloat16", _FB, "bh16-d128-2048-full"),
    Shape(3, 32, 32, 1024, 1024, 64, False, "bfloat16", _FB, "bh96-d64-1024-full"),
    Shape(32, 32, 8, 1, 3000, 128, False, "bfloat16", _F, "decode-b32-g4-3000"),
    Shape(8, 32, 8, 1, 3000, 128, False, "bfloat16", _F, "decode-b8-g4-3000"),
    Shape(1, 32, 8, 1, 20000, 128, False, "bfloat16", _F, "decode-b1-g4-20000"),
    Shape(16, 32, 8, 1, 20000, 128, False, "bfloat16", _F, "decode-b16-g4-20000"),
)
ROWS = {row.name: row for row in HELD_OUT}


def parse_args(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", metavar="STORE", help="the tuned store (a SQLite path or a SQLAlchemy URL); required")
    ap.add_argument("--rows", default="", metavar="ROW,...", help="held-out rows by name, comma-separated "
                    "(default: all; --list-rows prints them)")
    ap.add_argument("--list-rows", action="store_true", help="print the held-out rows and exit")
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "both"), default="both",
                    help="the passes of each row to run (default both; a row without it is left out)")
    ap.add_argument("--dtype", default=None, choices=sorted(harness.DTYPES),
                    help="the rows' dtype (default bf16 on a GPU, fp16 under the interpreter)")
    ap.add_argument("--anchors", default=",".join(SDPA_ANCHORS),
                    help=f"SDPA backends to compare with, comma-separated (default {','.join(SDPA_ANCHORS)})")
    harness.add_timing_args(ap)
    ap.add_argument("--out", metavar="FILE.json", help="write the environment and every row as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    if args.list_rows:
        for row in HELD_OUT:
            print(f"{row.name:<28} {row.label()}")
        raise SystemExit(0)
    if not args.db:
        ap.error("--db: required (the store to serve the held-out rows from)")
    args.anchor_names = harness.parse_anchors(ap, args.anchors)
    others = [a for a in args.anchor_names if a not in SDPA_ANCHORS]
    if others or not args.anchor_names:
        ap.error(f"--anchors: expected some of {', '.join(SDPA_ANCHORS)} (SDPA's backends), got {args.anchors!r}")
    args.row_list = select_rows(ap, args)
    return ap, args


def select_rows(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[Shape]:
    """The rows --rows, --pass and --dtype ask for (interpreter-sized under --device cpu)."""
    names = [n for n in args.rows.split(",") if n] or list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"--rows: unknown row {unknown[0]!r}; expected held-out rows (--list-rows prints them)")
    cpu = str(args.device).startswith("cpu")
    dtype = harness.DTYPES[args.dtype] if args.dtype else "float16" if cpu else "bfloat16"
    wanted = harness.PASSES if args.pass_ == "both" else (args.pass_,)
    rows = [dataclasses.replace(ROWS[n], dtype=dtype, passes=tuple(p for p in ROWS[n].passes if p in wanted))
            for n in dict.fromkeys(names) if set(ROWS[n].passes) & set(wanted)]
    if not rows:
        ap.error("--rows/--pass: no row to run")
    return [harness.tiny(r) for r in rows] if cpu else rows


def check_store(ap: argparse.ArgumentParser, db: str) -> str:
    """--db as the store's URL shown; ``ap.error`` for one that is no store (a missing SQLite file
    would serve every row the heuristic default: nothing to measure)."""
    from flashtune.store import StoreError
    from flashtune.store.engine import resolve_url, show_url, sqlite_path

    try:
        url = resolve_url(db)
    except (StoreError, ValueError) as e:
        ap.error(f"--db: {harness.first_line(e)}")
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        ap.error(f"--db: no store at {path} (tune one first: flashtune search --shapes ... --db {path})")
    return show_url(url)


def served_by(source: str, call_label: str) -> str | None:
    """The label of the tuned key an ``explain()`` source names (the call's own for "tuned exact"),
    or None where no tuned key served (the heuristic, an SDPA fallback)."""
    if source.startswith("tuned exact"):
        return call_label
    if source.startswith("tuned nearest ("):
        return source.removeprefix("tuned nearest (").split(")")[0].split(";")[0]
    return None


def measure_row(args, device, shape: Shape, served, anchors: dict, gpu: str) -> list[dict]:
    """One row: checked, then timed; one result per pass."""
    import torch

    import flashtune
    from flashtune.keys import TuningKey

    base = {"name": shape.name, "shape": shape.as_dict(), "error": None}
    try:
        q, k, v, do = harness.make_inputs(shape, device)
        gqa = shape.heads_q != shape.heads_kv
        choice = served.explain(q, k, v, is_causal=shape.causal, enable_gqa=gqa)
    except Exception as e:  # noqa: BLE001 - out of memory, say: the row says so, the run goes on
        return [dict(base, pass_=p, error=f"skipped: {harness.first_line(e)}") for p in shape.passes]
    ours = {"served": lambda q, k, v, causal: served(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1]),
            "default": lambda q, k, v, causal: flashtune.attention(q, k, v, causal=causal)}
    runs = {**anchors, **ours}
    if not anchors:  # the check needs an anchor: SDPA's math backend, not timed
        runs = {"math": harness.anchor("math", device), **runs}
    try:
        passed, failed = harness.check(runs, set(ours), q, k, v, do, shape.causal, grads="bwd" in shape.passes)
    except Exception as e:  # noqa: BLE001 - the reference itself did not fit, say
        return [dict(base, pass_=p, error=f"skipped: check: {harness.first_line(e)}") for p in shape.passes]
    timed = {name: run for name, run in runs.items() if name in passed and (name in anchors or name in ours)}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    times, time_failed, used = harness.time_row(timed, shape, (q, k, v, do), device, args)
    results = []
    for p in shape.passes:
        key = TuningKey.for_shape(gpu, shape, p)
        source = choice.fwd_source if p == "fwd" else choice.bwd_source
        ms = {name: harness.median(times[name, p]) for name in timed}
        sdpa = {a: ms[a] for a in anchors if ms.get(a)}
        best = min(sdpa, key=sdpa.get) if sdpa else None
        row = dict(base, pass_=p, key=key.label(), source=source, served_by=served_by(source, key.label()),
                   runner=choice.runner if p == "fwd" else choice.train_runner,  # the forward is timed without grad
                   choice=str(choice), check=passed, ms=ms, rounds_ms={n: times[n, p] for n in timed},
                   failed={**failed, **{n: why for (n, pp), why in time_failed.items() if pp == p}},
                   timer=sorted(used), best_sdpa=best,
                   served_vs_default=harness.ratio(ms.get("default"), ms.get("served")),
                   served_vs_best_sdpa=harness.ratio(sdpa.get(best), ms.get("served")),
                   default_vs_best_sdpa=harness.ratio(sdpa.get(best), ms.get("default")))
        wrong = [n for n in ours if n in failed]
        if wrong:
            row["error"] = "; ".join(f"{n}: {failed[n]}" for n in wrong)
        results.append(row)
    del q, k, v, do
    return results


def summarize(results: list[dict]) -> dict:
    """served / default: its minimum over every timed row and over the rows a tuned key served (the
    row it is at), its geometric mean; the rows a tuned key served and the ones the heuristic did."""
    timed = [r for r in results if r.get("served_vs_default")]
    tuned = [r for r in timed if r["served_by"] is not None]

    def lowest(rows):
        row = min(rows, key=lambda r: r["served_vs_default"], default=None)
        return None if row is None else {"served_vs_default": row["served_vs_default"], "name": row["name"],
                                         "pass": row["pass_"], "served_by": row["served_by"]}

    return {"rows": len(results), "timed": len(timed), "served_by_a_tuned_key": len(tuned),
            "served_by_the_heuristic": len(timed) - len(tuned), "min": lowest(timed), "min_tuned": lowest(tuned),
            "geomean": harness.geomean(r["served_vs_default"] for r in timed),
            "geomean_tuned": harness.geomean(r["served_vs_default"] for r in tuned),
            "skipped": [f"{r['name']} {r['pass_']}: {r['error']}" for r in results if r.get("error")]}


def format_row(row: dict) -> list[str]:
    head = f"{row['name'][:28]:<28} {row['pass_']:<4}"
    if "ms" not in row:
        return [f"{head} {row['error']}"]
    ms = row["ms"]
    by = row["served_by"] or row["source"].split(" (")[0].split(":")[0]  # "heuristic", "sdpa fallback"
    lines = [f"{head} {harness.fmt(ms.get('served'), '9.3f')} {harness.fmt(ms.get('default'), '9.3f')} "
             f"{harness.fmt(ms.get(row['best_sdpa']) if row['best_sdpa'] else None, '9.3f')} "
             f"{(row['best_sdpa'] or '-'):<9} {harness.fmt(row['served_vs_default'], '8.3f')} "
             f"{harness.fmt(row['served_vs_best_sdpa'], '8.3f')} {harness.fmt(row['default_vs_best_sdpa'], '8.3f')}  "
             f"{by}"]
    if row["served_by"] is None:
        lines.append(f"{'':<33} {row['source']}")
    lines += [f"{'':<33} {name}: {why}" for name, why in row["failed"].items()]
    if row.get("error"):
        lines.append(f"{'':<33} ERROR: {row['error']}")
    return lines


def main(argv=None) -> int:
    ap, args = parse_args(argv)
    where = check_store(ap, args.db)
    device = harness.timing_from_args(ap, args)
    from flashtune import get_tuned_attention
    from flashtune.keys import GpuInfo

    served = get_tuned_attention(args.db, device=device, record=False)  # measuring is no call to record
    gpu = GpuInfo.from_device(device).key
    env = harness.environment(device)
    print(harness.environment_line(env))
    anchors, anchor_notes = harness.anchors(args.anchor_names, device)
    for name, why in anchor_notes.items():
        print(f"# anchor {name} skipped: {why}")
    units = "interpreter ms (not GPU performance)" if device.type != "cuda" else "ms"
    print(f"# {len(args.row_list)} held-out rows served from {where} for {gpu}; timer {args.timer}, "
          f"{args.rounds}-{args.max_rounds} rounds; {units}; ratios time(other) / time(served)")
    print(f"{'row':<28} {'pass':<4} {'served':>9} {'default':>9} {'sdpa':>9} {'best':<9} {'srv/def':>8} "
          f"{'srv/sdpa':>8} {'def/sdpa':>8}  served by", flush=True)
    results = []
    for shape in args.row_list:
        for row in measure_row(args, device, shape, served, anchors, gpu):
            results.append(row)
            print("\n".join(format_row(row)), flush=True)
    summary = summarize(results)
    low, low_tuned = summary["min"], summary["min_tuned"]
    print(f"served / default: geometric mean {harness.fmt(summary['geomean'], '.3f')} over {summary['timed']} "
          f"rows ({summary['served_by_a_tuned_key']} served by a tuned key, {summary['served_by_the_heuristic']} by "
          f"the heuristic); minimum " + (f"{low['served_vs_default']:.3f} ({low['name']} {low['pass']})" if low else
                                        "n/a")
          + ("; over the tuned rows " + (f"{low_tuned['served_vs_default']:.3f} ({low_tuned['name']} "
                                         f"{low_tuned['pass']}, from {low_tuned['served_by']})")
             if low_tuned else ""))
    wrong = [r for r in results if r.get("error") and "ms" in r]
    for line in summary["skipped"]:
        print(f"# {line}")
    harness.write_json(args.out, {"environment": env, "store": where, "gpu_key": gpu,
                                  "args": {k: v for k, v in vars(args).items() if not k.startswith("_")
                                           and k != "row_list"},
                                  "rows_run": [r.as_dict() for r in args.row_list],
                                  "anchors_skipped": anchor_notes, "rows": results, "summary": summary})
    if wrong:
        print(f"WARNING: {len(wrong)} rows where the served call or the default failed its check", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
