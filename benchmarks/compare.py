"""flashtune against the other attention implementations, forward and backward, in one process.

For every row (the standard grid, the shapes models run, the off-grid head dims, rows by name,
or --shape's) and layout, flashtune (its heuristic defaults, and the variants of --flashtune) and
the anchors of --anchors are first checked against an fp32 reference (FlashAttention's rule for
flashtune: at most twice the check anchor's error; every runner within 5 % of the anchor's
output), then timed in --rounds interleaved rounds, each runner's figure the median of its rounds:

  forward FLOPs  = 4 * B * Hq * Nq * Nk * D, halved when causal with Nq = Nk
  backward FLOPs = 2.5 * forward; the backward is timed alone (the gradients of one kept forward)
  decode rows (one query): also the K/V bytes read per second over the copy bandwidth measured
               in the same run (a decode step reads all of K and V once)

The table gives TFLOPS and, for each flashtune variant and anchor, the speed ratio
time(anchor) / time(flashtune) (above 1: flashtune faster), and against the row's fastest anchor
("best", with more than one), and ends with their geometric means per pass and layout. A runner
that cannot run a row says why and is left out of that row.

    python benchmarks/compare.py --out grid.json                        # the grid against cuDNN, FA2, FA4
    python benchmarks/compare.py --rows shapes --layout both --anchors cudnn,flash,efficient,fa2,fa4
    python benchmarks/compare.py --rows grid-d128-4096,llama3-8b-train-8k --pass bwd --anchors cudnn,flex
    python benchmarks/compare.py --rows headdims --flashtune default,triton
    python benchmarks/compare.py --rows shapes --db tuned.db            # a tuned store through the drop-in
    python benchmarks/compare.py --device cpu --rows gpt2-train-512     # the interpreter on a tiny row

--flashtune: default (flashtune.attention's heuristic configs), triton (the Triton kernels' own
defaults, where the default is a Gluon kernel), configs (--configs FILE.json: {"ROW" or "*": {"fwd":
{...}, "bwd": {...}}}, config fields as the store keeps them), dropin (get_tuned_attention(--db): the
runner and configs a search stored, SDPA's signature, lookup included), tuned (the store's Triton
configs through flashtune.attention). --configs adds configs and --db adds dropin when not named.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

harness.use_interpreter_for_cpu()

VARIANTS = ("default", "triton", "configs", "dropin", "tuned")
LABELS = {"default": "flashtune", "triton": "flashtune-triton", "configs": "flashtune-configs", "dropin": "dropin",
          "tuned": "flashtune-tuned"}
DEFAULT_ANCHORS = "cudnn,flash,fa2,fa4"


def parse_args(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_row_args(ap)
    ap.add_argument("--layout", default="contiguous", help="contiguous, transformers or both (default contiguous)")
    ap.add_argument("--anchors", default=DEFAULT_ANCHORS,
                    help=f"comma-separated (default {DEFAULT_ANCHORS}): {harness.ANCHOR_HELP}")
    ap.add_argument("--flashtune", default="default", metavar="VARIANT,...",
                    help=f"flashtune's variants, comma-separated, of {', '.join(VARIANTS)} (default: default)")
    ap.add_argument("--configs", metavar="FILE.json", help="configs per row for the configs variant (see above)")
    ap.add_argument("--db", metavar="STORE", action="append", default=[],
                    help="a tuned store for the dropin and tuned variants; repeat it to time the drop-in of each "
                         "store side by side (dropin, dropin-2, ...; tuned uses the first); a path that does not "
                         "exist is a fresh install's empty store, served by the package's shipped table")
    harness.add_timing_args(ap)
    ap.add_argument("--out", metavar="FILE.json", help="write the environment and every row as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    args.layouts = harness.parse_layouts(ap, args.layout)
    args.anchor_names = harness.parse_anchors(ap, args.anchors)
    variants = [v for v in args.flashtune.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        ap.error(f"--flashtune: expected some of {', '.join(VARIANTS)}, got {args.flashtune!r}")
    if args.configs and "configs" not in variants:
        variants.append("configs")
    if args.db and "dropin" not in variants:
        variants.append("dropin")
    if "configs" in variants and not args.configs:
        ap.error("--flashtune configs: needs --configs FILE.json")
    if {"dropin", "tuned"} & set(variants) and not args.db:
        ap.error("--flashtune dropin/tuned: needs --db STORE")
    args.variants = list(dict.fromkeys(variants))
    return ap, args


def load_configs(ap: argparse.ArgumentParser, path: str, rows) -> dict:
    """--configs FILE.json as {row name or "*": {"fwd": FwdConfig, "bwd": BwdConfig}}."""
    kern = harness.kernels()
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        ap.error(f"--configs: cannot read {path}: {harness.first_line(e)}")
    if not isinstance(data, dict):
        ap.error(f"--configs: {path}: expected an object mapping row names (or \"*\") to {{\"fwd\": ..., \"bwd\": ...}}")
    names = {r.name for r in rows} | {"*"}
    out = {}
    for name, entry in data.items():
        if name not in names:
            ap.error(f"--configs: {path}: {name!r} is none of the rows run ({', '.join(sorted(names))})")
        if not isinstance(entry, dict) or not entry or set(entry) - {"fwd", "bwd"}:
            ap.error(f"--configs: {path}: {name}: expected {{\"fwd\": {{...}}, \"bwd\": {{...}}}}")
        try:
            out[name] = {p: (kern.FwdConfig if p == "fwd" else kern.BwdConfig).from_dict(cfg) for p, cfg in entry.items()}
        except (kern.ConfigError, TypeError, ValueError) as e:
            ap.error(f"--configs: {path}: {name}: {harness.first_line(e)}")
    return out


def dropin_labels(stores: list) -> list[str]:
    """The variant label of each --db's drop-in: dropin, dropin-2, ..."""
    return [LABELS["dropin"] + ("" if i == 0 else f"-{i + 1}") for i in range(len(stores))]


def _dropin_run(dropin):
    return lambda q, k, v, causal: dropin(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def flashtune_runners(args, shape, q, k, v, entries: dict, dropins: dict) -> tuple[dict, dict, dict]:
    """({label: run}, {label: {pass: config}}, {label: why it does not run this row}) of --flashtune;
    ``dropins``: {label: get_tuned_attention() of each --db}, the first also serving ``tuned``."""
    runs, configs, notes = {}, {}, {}
    dropin = next(iter(dropins.values()), None)
    for variant in args.variants:
        label = LABELS[variant]
        if variant == "dropin":
            for label, each in dropins.items():
                try:
                    choice = each.explain(q, k, v, is_causal=shape.causal, enable_gqa=q.shape[1] != k.shape[1])
                    runs[label] = _dropin_run(each)
                    configs[label] = {"serves": " / ".join(line.strip() for line in str(choice).splitlines())}
                except Exception as e:  # noqa: BLE001 - that store's drop-in says why it cannot run the row
                    notes[label] = harness.first_line(e)
            continue
        try:
            given = {}
            if variant == "configs":
                given = entries.get(shape.name) or entries.get("*") or {}
                if not given:
                    notes[label] = f"--configs has no entry for {shape.name}"
                    continue
            elif variant == "tuned":
                choice = dropin.explain(q, k, v, is_causal=shape.causal, enable_gqa=q.shape[1] != k.shape[1])
                given = {p: cfg for p, cfg, source in (("fwd", choice.fwd_config, choice.fwd_source),
                                                       ("bwd", choice.bwd_config, choice.bwd_source))
                         if cfg is not None and source.startswith("tuned")}
                if not given:
                    notes[label] = "the store has no tuned config for this row"
                    continue
            fwd, bwd = harness.flashtune_configs(q, k, shape.causal, given.get("fwd"), given.get("bwd"),
                                                 triton_only=variant == "triton")
            runs[label] = harness.flashtune_runner(fwd, bwd)
            configs[label] = {"fwd": fwd.label(), "bwd": bwd.label()}
        except Exception as e:  # noqa: BLE001 - e.g. a config this GPU refuses: that variant says so
            notes[label] = harness.first_line(e)
    return runs, configs, notes


def measure_row(args, device, shape, layout: str, entries: dict, dropins: dict, anchors: dict, copy_bw) -> list[dict]:
    """One row in one layout: checked, then timed; one result per pass."""
    import torch

    base = {"name": shape.name, "shape": shape.as_dict(), "layout": layout}
    try:
        q, k, v, do = harness.make_inputs(shape, device, layout)
    except Exception as e:  # noqa: BLE001 - out of memory, say: the row says so, the run goes on
        return [dict(base, pass_=p, error=f"inputs: {harness.first_line(e)}") for p in shape.passes]
    ours, configs, notes = flashtune_runners(args, shape, q, k, v, entries, dropins)
    runs = {**anchors, **ours}
    if not anchors:  # the check needs an anchor: torch SDPA's own choice, not timed
        runs = {"sdpa": harness.anchor("math", device) if device.type == "cpu" else
                (lambda q, k, v, causal: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])), **runs}
    try:
        passed, failed = harness.check(runs, set(ours), q, k, v, do, shape.causal, grads="bwd" in shape.passes)
    except Exception as e:  # noqa: BLE001 - the reference itself did not fit, say: the row says so
        return [dict(base, pass_=p, error=f"check: {harness.first_line(e)}") for p in shape.passes]
    failed.update(notes)
    timed = {name: run for name, run in runs.items() if name in passed and (name in anchors or name in ours)}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    times, time_failed, used = harness.time_row(timed, shape, (q, k, v, do), device, args)
    results = []
    for p in shape.passes:
        ms = {name: harness.median(times[name, p]) for name in timed}
        flops = shape.flops(p)
        row = dict(base, pass_=p, flops=flops, configs={label: c.get(p, c.get("serves")) for label, c in configs.items()},
                   check=passed, failed={**failed, **{n: why for (n, pp), why in time_failed.items() if pp == p}},
                   ms=ms, rounds_ms={name: times[name, p] for name in timed},
                   tflops={name: harness.tflops(flops, t) for name, t in ms.items()}, timer=sorted(used), error=None,
                   ratios={v: {a: harness.ratio(ms.get(a), ms.get(v)) for a in anchors} for v in ours})
        timed_anchors = {a: ms[a] for a in anchors if ms.get(a)}
        if len(anchors) > 1 and timed_anchors:  # the fastest anchor of the row: what a user would pick
            row["best_anchor"] = min(timed_anchors, key=timed_anchors.get)
            for v in ours:
                row["ratios"][v]["best"] = harness.ratio(timed_anchors[row["best_anchor"]], ms.get(v))
        if shape.decode and copy_bw:
            row["copy_fraction"] = {name: shape.kv_bytes() / (t * 1e-3) / copy_bw for name, t in ms.items() if t}
        wrong = [n for n in ours if n in failed and n not in notes]
        if wrong:  # a variant that computed the wrong answer, or could not run the row
            row["error"] = "; ".join(f"{n}: {failed[n]}" for n in wrong)
        results.append(row)
    return results


def ratio_labels(variants: list[str], anchor_names: list[str]) -> list[str]:
    return [f"{v.removeprefix('flashtune')[1:] or 'ft'}/{a}" for v in variants for a in anchor_names]


def header(runners: list[str], variants: list[str], anchor_names: list[str]) -> str:
    ratios = " ".join(f"{label:>{max(8, len(label))}}" for label in ratio_labels(variants, anchor_names))
    return f"{'row':<30} {'layout':<12} {'pass':<4} | " + " ".join(f"{r[:11]:>11}" for r in runners) + f" | {ratios}"


def format_row(row: dict, runners: list[str], variants: list[str], anchor_names: list[str]) -> list[str]:
    """The row's line (TFLOPS; decode rows: fractions of the copy bandwidth), then what failed."""
    head = f"{row['name'][:30]:<30} {row['layout']:<12} {row['pass_']:<4} | "
    if row.get("error") and not row.get("ms"):
        return [head + f"ABORTED: {row['error']}"]
    if "interpreter wall clock" in row["timer"]:  # no GPU figure: the interpreter's milliseconds
        figures, spec = row["ms"], "11.1f"
    else:
        figures = row.get("copy_fraction") or row["tflops"]
        spec = "11.2f" if "copy_fraction" in row else "11.1f"
    widths = [max(8, len(label)) for label in ratio_labels(variants, anchor_names)]
    ratios = " ".join(harness.fmt(row["ratios"].get(v, {}).get(a), f"{w}.3f")
                      for (v, a), w in zip([(v, a) for v in variants for a in anchor_names], widths))
    lines = [head + " ".join(harness.fmt(figures.get(r), spec) for r in runners) + f" | {ratios}"]
    lines += [f"{'':<30}   {name}: {why}" for name, why in row["failed"].items()]
    if row.get("error"):
        lines.append(f"{'':<30}   ERROR: {row['error']}")
    return lines


def summarize(results: list[dict], variants: list[str], anchor_names: list[str]) -> dict:
    """Geometric means of each variant's speed ratio to each anchor, per pass and layout (decode
    rows apart where there are others)."""
    out = {}
    for p in harness.PASSES:
        for layout in harness.LAYOUTS:
            rows = [r for r in results if r["pass_"] == p and r["layout"] == layout and r.get("ratios")]
            decode = [r for r in rows if r["shape"]["seq_q"] == 1]
            groups = {"all": rows}
            if decode and len(decode) < len(rows):
                groups.update({"non-decode": [r for r in rows if r not in decode], "decode": decode})
            for group, sel in groups.items():
                if not sel:
                    continue
                out[f"{p} {layout} {group}"] = {
                    v: {a: {"geomean": harness.geomean(r["ratios"][v].get(a) for r in sel if v in r["ratios"]),
                            "rows": sum(1 for r in sel if r["ratios"].get(v, {}).get(a))} for a in anchor_names}
                    for v in variants}
    return out


def format_summary(summary: dict) -> list[str]:
    lines = ["geometric mean of time(anchor) / time(flashtune) (above 1: flashtune faster):"]
    for key, by_variant in summary.items():
        for v, by_anchor in by_variant.items():
            cells = ", ".join(f"/ {a} {harness.fmt(s['geomean'], '.3f')} ({s['rows']} rows)"
                              for a, s in by_anchor.items() if s["rows"])
            if cells:
                lines.append(f"  {key:<28} {v:<18} {cells}")
    return lines


def main(argv=None) -> int:
    ap, args = parse_args(argv)
    rows = harness.rows_from_args(ap, args)
    device = harness.timing_from_args(ap, args)
    entries = load_configs(ap, args.configs, rows) if args.configs else {}
    dropins = {}
    if args.db:
        from flashtune import get_tuned_attention

        dropins = {label: get_tuned_attention(db, device=device)
                   for label, db in zip(dropin_labels(args.db), args.db)}
    env = harness.environment(device)
    print(harness.environment_line(env))
    anchors, anchor_notes = harness.anchors(args.anchor_names, device)
    for name, why in anchor_notes.items():
        print(f"# anchor {name} skipped: {why}")
    copy_bw = harness.copy_bandwidth(device, timer=args.timer) if any(r.decode for r in rows) else None
    variants = [label for v in args.variants
                for label in (dropin_labels(args.db) if v == "dropin" else [LABELS[v]])]
    names = list(anchors) + (["best"] if len(anchors) > 1 else [])
    units = ("interpreter ms (not GPU performance)" if device.type != "cuda" else
             "TFLOPS (decode rows: K/V read rate / copy bandwidth"
             + ("" if copy_bw is None else f", {copy_bw / 1e12:.2f} TB/s") + ")")
    print(f"# {len(rows)} rows x {len(args.layouts)} layouts; timer {args.timer}, {args.rounds}-{args.max_rounds} "
          f"rounds; {units}; ratios time(anchor) / time(flashtune)")
    runners = variants + list(anchors)
    print(header(runners, variants, names), flush=True)
    results = []
    for shape in rows:
        for layout in args.layouts:
            for row in measure_row(args, device, shape, layout, entries, dropins, anchors, copy_bw):
                results.append(row)
                print("\n".join(format_row(row, runners, variants, names)), flush=True)
    summary = summarize(results, variants, names)
    print("\n".join(format_summary(summary)))
    wrong = [r for r in results if r.get("error")]
    if wrong:
        print(f"WARNING: {len(wrong)} rows where a flashtune variant failed its check or did not run", file=sys.stderr)
    harness.write_json(args.out, {"environment": env, "args": {k: v for k, v in vars(args).items()
                                                              if not k.startswith("_")},
                                  "anchors_skipped": anchor_notes, "copy_bandwidth": copy_bw,
                                  "rows": results, "summary": summary})
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
