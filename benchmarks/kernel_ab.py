"""A whole flashtune tree against the current one, side by side in one process.

Performance claims are ratios measured in one run, so a change to flashtune (a kernel, a
heuristic, a restructuring) is judged by timing the version before it in the same process.
--baseline DIR holds the other version's ``flashtune/`` package, e.g.

    git worktree add /tmp/old REV                       # DIR = /tmp/old
    mkdir /tmp/old && git archive REV flashtune | tar -x -C /tmp/old

It is copied to a temporary folder as the package ``flashtune_baseline``, its absolute imports of
flashtune (and its ``flashtune::`` operator names) rewritten, so both trees import side by side.
For each row both trees' public ``attention(q, k, v, causal=...)`` runs with its own heuristic
defaults (no store): their outputs, and for rows with a backward their gradients, must agree to
the dtype's rounding (--tolerance, of the largest value of each tensor; the report says whether
they are equal bit for bit), then both are timed in --rounds interleaved rounds (the order
alternating by round): the forward alone, and the backward alone (the gradients of one kept
forward). Per row and pass the ratio is baseline time / current time (above 1: the current tree is
faster) and whether it is within +-(--within) %; the summary gives their geometric means.

    python benchmarks/kernel_ab.py --baseline /tmp/old --out ab.json               # grid and SHAPES.md rows
    python benchmarks/kernel_ab.py --baseline /tmp/old --rows grid-d128-4096 --pass bwd --rounds 7
    python benchmarks/kernel_ab.py --baseline /tmp/old --device cpu --shape 1,2,2,17,17,16,causal  # interpreter

Exit status: 1 when a row's trees disagree or a tree cannot run it; with --strict, 3 when every
row agrees but one is outside the tolerance band.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import pathlib
import re
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

harness.use_interpreter_for_cpu()

BASELINE = "flashtune_baseline"


def rewrite(source: str, name: str) -> str:
    """``source`` with its absolute imports of flashtune, dotted references and ``flashtune::``
    operator names pointing at the package ``name`` instead."""
    source = re.sub(r"(?m)^([ \t]*)import flashtune[ \t]*$", rf"\1import {name}; flashtune = {name}", source)
    source = re.sub(r"\bimport flashtune(?=\s+as\s)", f"import {name}", source)
    source = re.sub(r"\bfrom flashtune(?=\s+import\s)", f"from {name}", source)
    return re.sub(r"\bflashtune(?=\.|::)", name, source)


def package_dir(path: str | pathlib.Path) -> pathlib.Path:
    """The ``flashtune`` package of --baseline: DIR/flashtune, or DIR itself when it is one."""
    path = pathlib.Path(path).expanduser().resolve()
    for candidate in (path / "flashtune", path):
        if candidate.name == "flashtune" and (candidate / "__init__.py").is_file():
            return candidate
    raise ValueError(f"{path}: expected a folder holding a flashtune/ package (or the package itself), e.g. from "
                     "`git worktree add DIR REV` or `git archive REV flashtune | tar -x -C DIR`")


def load_tree(path: str | pathlib.Path, name: str = BASELINE):
    """The flashtune package at ``path`` imported as ``name`` (a rewritten copy in a temporary
    folder that lives as long as the process); the same one again for the same ``path``."""
    source = package_dir(path)
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, "__ab_source__", None) != str(source):
            raise ValueError(f"another tree is loaded as {name} already ({getattr(loaded, '__ab_source__', '?')})")
        return loaded
    folder = pathlib.Path(tempfile.mkdtemp(prefix="flashtune-ab-"))
    atexit.register(shutil.rmtree, folder, True)
    copy = folder / name
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for file in copy.rglob("*.py"):
        file.write_text(rewrite(file.read_text(encoding="utf-8"), name), encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))  # its submodules load through the package's own path
    module.__ab_source__ = str(source)
    if not callable(getattr(module, "attention", None)):
        raise ValueError(f"{source}: its flashtune package has no attention()")
    return module


def max_diff(a, b) -> float:
    """max |a - b| over max |b|: the largest difference in units of the tensor's largest value."""
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def compare_row(args, device, shape, layout: str, trees: dict) -> list[dict]:
    """One row: the trees' outputs compared, then their passes timed; one result per pass."""
    import torch

    base = {"name": shape.name, "shape": shape.as_dict(), "layout": layout}
    try:
        q, k, v, do = harness.make_inputs(shape, device, layout)
    except Exception as e:  # noqa: BLE001 - out of memory, say: the row says so, the run goes on
        return [dict(base, pass_=p, error=f"inputs: {harness.first_line(e)}") for p in shape.passes]
    tolerance = args.tolerance if args.tolerance is not None else (
        1e-5 if q.dtype == torch.float32 else 2 * torch.finfo(q.dtype).eps)
    runs = {tree: (lambda q, k, v, c, fn=fn: fn(q, k, v, causal=c)) for tree, fn in trees.items()}
    results, agreed = {}, []
    for p in shape.passes:
        row = dict(base, pass_=p, tolerance=tolerance, error=None)
        try:
            got = {tree: harness.outputs(run, q, k, v, do, shape.causal, p == "bwd") for tree, run in runs.items()}
        except Exception as e:  # noqa: BLE001 - a tree that cannot run the row
            row["error"] = f"cannot run: {harness.first_line(e)}"
            results[p] = row
            continue
        names = harness.NAMES[:len(got["current"])]
        row["max_diff"] = {n: max_diff(a, b) for n, a, b in zip(names, got["current"], got["baseline"])}
        row["bitwise"] = all(torch.equal(a, b) for a, b in zip(got["current"], got["baseline"]))
        worst = max(row["max_diff"].values())
        if not worst <= tolerance:  # NaN fails too
            row["error"] = (f"the trees disagree: max difference {worst:.3g} of the largest value > {tolerance:.3g} ("
                            + ", ".join(f"{n} {d:.3g}" for n, d in row["max_diff"].items()) + ")")
        else:
            agreed.append(p)
        results[p] = row
        del got
    times, failed = harness.time_rounds(runs, agreed, args.rounds, lambda run, p: harness.time_ms(
        harness.pass_call(run, p, q, k, v, do, shape.causal), device, args.timer, quick=args.quick)[0],
        max_rounds=args.max_rounds)
    for p in agreed:
        row = results[p]
        ms = {tree: harness.median(times[tree, p]) for tree in runs}
        row.update(ms=ms, rounds_ms={tree: times[tree, p] for tree in trees})
        row["ratio"] = harness.ratio(ms["baseline"], ms["current"])
        row["within"] = row["ratio"] is not None and abs(row["ratio"] - 1) <= args.within / 100
        if any((tree, p) in failed for tree in trees):
            row["error"] = "; ".join(f"{tree}: {failed[tree, p]}" for tree in trees if (tree, p) in failed)
    return [results[p] for p in shape.passes]


def format_row(row: dict, within: float) -> str:
    head = f"{row['name'][:30]:<30} {row['layout']:<12} {row['pass_']:<4} "
    if row.get("error"):
        return head + f"ERROR: {row['error']}"
    ms = row["ms"]
    diff = "bitwise equal" if row["bitwise"] else f"max diff {max(row['max_diff'].values()):.2g}"
    return (head + f"{harness.fmt(ms['baseline'], '10.4f')} {harness.fmt(ms['current'], '10.4f')} "
            f"{harness.fmt(row['ratio'], '8.3f')}  {'yes' if row['within'] else 'NO':<4} {diff}")


def summarize(rows: list[dict], within: float) -> dict:
    out = {}
    for p in harness.PASSES:
        sel = [r for r in rows if r["pass_"] == p and not r.get("error")]
        if not any(r["pass_"] == p for r in rows):
            continue
        out[p] = {"rows": len(sel), "geomean": harness.geomean(r["ratio"] for r in sel),
                  "within": sum(1 for r in sel if r["within"]),
                  "outside": [f"{r['name']} {r['layout']} ({r['ratio']:.3f})" for r in sel if not r["within"]],
                  "bitwise": sum(1 for r in sel if r["bitwise"]),
                  "errors": [f"{r['name']} {r['layout']}: {r['error']}" for r in rows if r["pass_"] == p
                             and r.get("error")]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, metavar="DIR", help="a folder holding the other flashtune/ package")
    harness.add_row_args(ap, rows="grid,shapes")
    ap.add_argument("--layout", default="contiguous", help="contiguous, transformers or both (default contiguous)")
    harness.add_timing_args(ap, rounds=5)
    ap.add_argument("--within", type=float, default=2.0, help="the band, in percent, a row's ratio is judged in (2)")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="largest difference allowed between the trees, in units of each tensor's largest value "
                         "(default 2 ulps of a 16-bit dtype, 1e-5 for float32)")
    ap.add_argument("--strict", action="store_true", help="exit 3 when a row is outside the band")
    ap.add_argument("--out", metavar="FILE.json", help="write the environment and every row as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    layouts = harness.parse_layouts(ap, args.layout)
    rows = harness.rows_from_args(ap, args)
    if args.within < 0:
        ap.error(f"--within: expected a percentage of at least 0, got {args.within}")
    device = harness.timing_from_args(ap, args)
    try:
        baseline = load_tree(args.baseline)
    except (ValueError, OSError) as e:
        ap.error(f"--baseline: {e}")
    except Exception as e:  # noqa: BLE001 - a tree that does not import: its error, without a traceback
        ap.error(f"--baseline: the tree at {args.baseline} does not import: {harness.first_line(e)}")
    import flashtune

    source = pathlib.Path(baseline.__ab_source__)
    env = harness.environment(device)
    env["baseline"] = {"path": str(source), "commit": harness.git_commit(source),
                       "flashtune": getattr(baseline, "__version__", None)}
    print(harness.environment_line(env))
    print(f"# baseline: {source} ({(env['baseline']['commit'] or 'no git checkout')[:19]}); current: "
          f"{env['flashtune_path']}; {args.rounds}-{args.max_rounds} interleaved rounds, timer {args.timer}")
    print(f"{'row':<30} {'layout':<12} {'pass':<4} {'base ms':>10} {'cur ms':>10} {'base/cur':>8}  "
          f"{f'±{args.within:g}%':<4} outputs", flush=True)
    trees = {"baseline": baseline.attention, "current": flashtune.attention}
    results = []
    for shape in rows:
        for layout in layouts:
            for row in compare_row(args, device, shape, layout, trees):
                results.append(row)
                print(format_row(row, args.within), flush=True)
            if device.type == "cuda":
                import torch

                torch.cuda.empty_cache()
    summary = summarize(results, args.within)
    for p, s in summary.items():
        print(f"{p}: geometric mean of baseline/current {harness.fmt(s['geomean'], '.4f')} over {s['rows']} rows; "
              f"{s['within']} within ±{args.within:g}%, {s['bitwise']} bitwise equal"
              + (f"; outside: {', '.join(s['outside'])}" if s["outside"] else "")
              + (f"; {len(s['errors'])} failed" if s["errors"] else ""))
    if device.type != "cuda":
        print("(interpreter wall clock: not GPU performance)")
    harness.write_json(args.out, {"environment": env, "args": {k: v for k, v in vars(args).items()
                                                              if not k.startswith("_")},
                                  "rows": results, "summary": summary})
    if any(s["errors"] for s in summary.values()):
        return 1
    return 3 if args.strict and any(s["outside"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
