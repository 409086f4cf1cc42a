"""The most per-key tuning can be worth on some keys: each key's fastest config of the
whole search space against one fixed config, in one run.

Goal (b) of the autotuner's acceptance compares the search's winners with the best single
config for all keys. This script bounds that ratio from above: no search over the space can
beat the space's fastest config. For each key (the autotuner's KeyBench: its shape, inputs
and correctness check):

- forward: every valid config of the space is checked and timed (an exhaustive sweep);
- backward: its time is preprocess + dK/dV kernel + dQ kernel, two independent launches, so
  the fastest combination is found without timing all of the space's configs: for each tma
  value, every dK/dV half (BLOCK_M1, BLOCK_N1, num_warps, num_stages) is timed with the
  default's dQ half (or, where that combination does not fit the device, another valid
  one), then every dQ half (BLOCK_M2, BLOCK_N2, dq_num_warps, dq_num_stages) with the best
  dK/dV half; every atomic-dQ config (no dQ kernel) is timed as well.

The --finalists fastest configs found, the fixed config (--single, or the report's best single
config of the pass with --report) and the heuristic default are then re-timed interleaved
for --rounds rounds; the fastest finalist of that re-timing is the key's fastest config, the
bound is fixed / fastest per key, and its geometric mean over the keys. --quick screens the
space with a shorter do_bench (the re-timing stays full length).
Each config is checked against the reference before it is timed; one that fails is left out.

    python benchmarks/tuning_bound.py --pass bwd --head-dim 64 128 --seq-len 4096 \\
        --report report.json --out bound.json
    python benchmarks/tuning_bound.py --pass fwd --device cpu --seq-len 33 --space '{"BLOCK_M": [16, 32]}'

--shapes FILE takes the keys of a shape file (`flashtune search --shapes`' format: the rows
of the pass, each timed at its own batch and heads) instead of the grid's --head-dim /
--seq-len / --causal, so the bound can be measured on the shapes models run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

harness.use_interpreter_for_cpu()

import torch  # noqa: E402

from flashtune.autotuner.trial import KeyBench  # noqa: E402
from flashtune.keys import GpuInfo, TuningKey  # noqa: E402

_k = harness.kernels()
space_mod, BwdConfig, ConfigError, FwdConfig, default_config = (_k.space, _k.BwdConfig, _k.ConfigError, _k.FwdConfig,
                                                                _k.default_config)
geomean = harness.geomean

DKDV = ("BLOCK_M1", "BLOCK_N1", "num_warps", "num_stages")
DQ = BwdConfig.DQ_FIELDS


class Measured:
    """Check and time configs once each (by canonical form); remember the times."""

    def __init__(self, bench: KeyBench, threads: int, quick: bool = False):
        self.bench, self.threads, self.quick, self.times, self.failed = bench, threads, quick, {}, {}

    def __call__(self, configs) -> dict:
        todo = [c for c in dict.fromkeys(c.canonical() for c in configs)
                if c not in self.times and c not in self.failed]
        self.bench.precompile(todo, [0] * len(todo), self.threads)
        for cfg in todo:
            outcome = self.bench.run(cfg, quick=self.quick)
            if outcome.status == "ok":
                self.times[cfg] = outcome.time_ms
            else:
                self.failed[cfg] = f"{outcome.status}: {outcome.message}"
        return {c.canonical(): self.times[c.canonical()] for c in configs if c.canonical() in self.times}


def report_single(report: dict, pass_: str) -> dict:
    """The best single config of ``pass_`` in tuning_report.py's report (its fields)."""
    best = (report.get("summary", {}).get(pass_) or {}).get("best_single_config")
    if not best:
        sys.exit(f"tuning_bound: --report: no best single {pass_} config in it (tuning_report.py's --out)")
    return best


def fastest(times: dict):
    return min(times, key=times.get) if times else None


def leaders(times: dict, n: int) -> list:
    """The ``n`` fastest configs of ``times``, fastest first."""
    return sorted(times, key=times.get)[:n]


def search_space_bwd(valid: list, default: BwdConfig, measure: Measured):
    """The fastest backward config by halves (see the module docstring)."""
    best = {}
    for tma in sorted({c.tma for c in valid}):
        plain = [c for c in valid if c.tma == tma and not c.atomic_dq]
        if not plain:
            continue
        ref_dq = {f: getattr(default, f) for f in DQ}
        # every dK/dV half with the default's dQ half (or the nearest valid one)
        halves = {tuple(getattr(c, f) for f in DKDV): c for c in plain}
        firsts = []
        for some in halves.values():
            cfg = dataclasses.replace(some, **ref_dq)
            firsts.append(cfg if cfg in plain else some)
        lead = fastest(measure(firsts))
        if lead is None:
            continue
        # every dQ half with the fastest dK/dV half
        seconds = [c for c in plain if all(getattr(c, f) == getattr(lead, f) for f in DKDV)]
        best[("plain", tma)] = fastest(measure(seconds + [lead]))
    atomic = [c for c in valid if c.atomic_dq]
    if atomic:
        best["atomic"] = fastest(measure(atomic))
    candidates = [c for c in best.values() if c is not None]
    return fastest({c: measure.times[c] for c in candidates})


def _keys(args, gpu: str, maskings) -> list:
    """(key, (batch, heads_q, heads_kv) or None) per key to bound: the shape file's rows of the
    pass (each key once, at its first row's shape), else the grid's keys."""
    if not args.shapes:
        return [(TuningKey(gpu, args.dtype, d, n, causal, args.pass_), None)
                for d in args.head_dim for causal in maskings for n in args.seq_len]
    from flashtune.shapes import ShapeError, load_shapes

    try:
        shapes = load_shapes(args.shapes)
    except (OSError, ShapeError) as e:
        sys.exit(f"tuning_bound: --shapes: {e}")
    out: dict = {}
    for s in shapes:
        if args.pass_ in s.passes:
            out.setdefault(TuningKey.for_shape(gpu, s, args.pass_), (s.batch, s.heads_q, s.heads_kv))
    if not out:
        sys.exit(f"tuning_bound: --shapes: no row of {args.shapes} has the pass {args.pass_}")
    return list(out.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), required=True)
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seq-len", type=int, nargs="+", default=[4096])
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--shapes", metavar="FILE", help="the rows of a shape file (JSON/YAML) instead of the grid")
    ap.add_argument("--single", help="the fixed config, as a JSON object of its fields")
    ap.add_argument("--report", help="tuning_report.py's JSON: its best single config of the pass")
    ap.add_argument("--space", help="JSON object overriding some of the pass's search-space values")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="screen the space with a shorter do_bench; the --finalists fastest are re-timed in full")
    ap.add_argument("--finalists", type=int, default=3,
                    help="how many of the screen's fastest configs the interleaved re-timing compares (default 3)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--threads", type=int, default=16, help="parallel compiles")
    ap.add_argument("--out", help="write the rows as JSON")
    args = ap.parse_args()

    device = torch.device(args.device)
    cls = FwdConfig if args.pass_ == "fwd" else BwdConfig
    single = None
    if args.single:
        single = cls.from_dict(json.loads(args.single))
    elif args.report:
        with open(args.report) as f:
            single = cls.from_dict(report_single(json.load(f), args.pass_))
    if args.space:
        space = dict(space_mod.SPACES[args.pass_][1])
        override = json.loads(args.space)
        unknown = sorted(set(override) - set(space))
        if unknown:
            sys.exit(f"tuning_bound: --space: unknown fields {unknown}; expected some of {sorted(space)}")
        space.update(override)
        space_mod.SPACES[args.pass_] = (cls, space)
    gpu = GpuInfo.from_device(device) if device.type == "cuda" else GpuInfo.interpreter()
    maskings = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]

    rows = []
    for key, shape in _keys(args, gpu.key, maskings):
        d, n, causal, dtype = key.head_dim, key.seq_q, key.causal, getattr(torch, key.dtype)
        valid = space_mod.valid_candidates(args.pass_, d, dtype, device)
        bench = KeyBench(key, device, shape)
        default = default_config(args.pass_, d, dtype, device, causal=causal, seq_q=key.seq_q)
        measure = Measured(bench, args.threads, args.quick)
        best = (fastest(measure(valid)) if args.pass_ == "fwd"
                else search_space_bwd(valid, default, measure))
        if best is None:
            sys.exit(f"tuning_bound: {key.label()}: no config of the space ran correct here")
        # the screen's runners-up are re-timed too: its fastest may be so by noise
        named = {f"finalist{i}": c for i, c in enumerate(leaders(measure.times, args.finalists)) if c != best}
        named.update(fastest=best, default=default)
        if single is not None:
            try:
                named["single"] = single.validate(d, dtype, device)
            except ConfigError as e:
                print(f"{key.label()}: the fixed config cannot run here: {e}", flush=True)
        checked = measure(list(named.values()))  # the fixed configs are checked too
        names = [name for name, c in named.items() if c.canonical() in checked]
        times = bench.retime([named[name] for name in names], args.rounds)
        med = {name: statistics.median(t) for name, t in zip(names, times)}
        # the fastest config is the fastest of the re-timing, not of the screen
        won = min((n for n in med if n == "fastest" or n.startswith("finalist")), key=med.get)
        best = named[won]
        med = {"fastest": med[won], **{n: t for n, t in med.items() if n in ("single", "default")}}
        row = {"key": key.label(), "head_dim": d, "seq_len": n, "seq_k": key.seq_k, "causal": causal,
               "shape": [bench.batch, bench.heads, bench.heads_kv],
               "measured": len(measure.times), "failed": len(measure.failed),
               "fastest": best.to_dict(), "times_ms": med,
               "single_vs_fastest": med["single"] / med["fastest"] if "single" in med else None,
               "default_vs_fastest": med["default"] / med["fastest"] if "default" in med else None}
        rows.append(row)
        print(f"{key.label()}: {row['measured']} configs ok, {row['failed']} failed; fastest {best.short()}"
              f"; single / fastest {row['single_vs_fastest'] or float('nan'):.3f}, default / fastest "
              f"{row['default_vs_fastest'] or float('nan'):.3f}", flush=True)
        del bench
        if device.type == "cuda":
            torch.cuda.empty_cache()
    summary = {"pass": args.pass_, "keys": len(rows), "single": single.to_dict() if single else None,
               "single_vs_fastest": geomean([r["single_vs_fastest"] for r in rows]),
               "default_vs_fastest": geomean([r["default_vs_fastest"] for r in rows])}
    print(json.dumps(summary, indent=1))
    timer = "cuda-graph-replay" if device.type == "cuda" else "interpreter-wall-clock (not GPU performance)"
    harness.write_json(args.out, {"environment": harness.environment(device), "timer": timer, "rows": rows,
                                  "summary": summary})


if __name__ == "__main__":
    main()
