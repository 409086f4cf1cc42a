"""How much per-key tuning is worth: tuned winners against fixed configs, in one run.

For every stored key of this GPU (optionally filtered), times on the key's trial
inputs (the autotuner's KeyBench, so the same shape the search used):
  - the tuned winner from the store,
  - the heuristic default,
  - the seeds' single hardcoded config (forward 16x16, 3 stages, 4 warps; backward
    16/32 blocks, 3 stages, 4 warps),
  - the best single config for all keys of a pass together: the one, among every
    stored winner of that pass, with the lowest geometric-mean time over the keys,
and, with --sweep-db, the winner of an exhaustive sweep of the same key.
Each config is checked against the reference first; times are medians of interleaved
rounds in this process, so every ratio comes from one run. Needs a CUDA GPU.

    python benchmarks/tuning_report.py --db tuned.db --out report.json --markdown report.md
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)
from flashtune.autotuner.trial import KeyBench  # noqa: E402
from flashtune.keys import GpuInfo  # noqa: E402
from flashtune.store import ResultFilter, Store  # noqa: E402

_k = harness.kernels()
BwdConfig, ConfigError, FwdConfig, default_config = _k.BwdConfig, _k.ConfigError, _k.FwdConfig, _k.default_config
geomean = harness.geomean

SEED_CONFIGS = {"fwd": FwdConfig(16, 16, 4, 3), "bwd": BwdConfig(16, 32, 32, 16, 4, 3)}


def measure(bench: KeyBench, configs: dict, rounds: int) -> dict:
    """name -> median ms (None when the config is invalid here or incorrect)."""
    names, cfgs, out = [], [], {}
    for name, cfg in configs.items():
        try:
            cfg.validate(bench.key.head_dim, bench.dtype, bench.device)
        except ConfigError:
            out[name] = None
            continue
        outcome = bench.run(cfg)
        if outcome.status != "ok":
            print(f"  {name} {cfg.short()}: {outcome.status} {outcome.message}", file=sys.stderr)
            out[name] = None
            continue
        names.append(name)
        cfgs.append(cfg)
    times = bench.retime(cfgs, rounds)
    out.update({n: statistics.median(t) for n, t in zip(names, times)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="the store holding the search's winners")
    ap.add_argument("--sweep-db", help="a store holding exhaustive-sweep winners of some of the same keys")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the rows as JSON")
    ap.add_argument("--markdown", help="write a markdown table")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("tuning_report: needs a CUDA GPU")
    dev = torch.device("cuda")
    gpu = GpuInfo.from_device(dev)
    with Store(args.db, create=False) as store:
        results = store.list_results(ResultFilter(gpu=gpu.key))
    sweep = {}
    if args.sweep_db:
        with Store(args.sweep_db, create=False) as store:
            sweep = {r.key: r for r in store.list_results(ResultFilter(gpu=gpu.key))}
    if not results:
        sys.exit(f"tuning_report: no tuned results for {gpu.key} in {args.db}")
    singles = {p: list({r.config for r in results if r.key.pass_ == p}) for p in ("fwd", "bwd")}
    rows = []
    for r in sorted(results, key=lambda r: (r.key.pass_, r.key.head_dim, r.key.causal, r.key.seq_q)):
        key = r.key
        bench = KeyBench(key, dev)
        dtype = getattr(torch, key.dtype)
        configs = {"tuned": r.config, "default": default_config(key.pass_, key.head_dim, dtype, dev, causal=key.causal),
                   "seed": SEED_CONFIGS[key.pass_]}
        configs.update({f"single{i}": c for i, c in enumerate(singles[key.pass_])})
        if key in sweep:
            configs["sweep"] = sweep[key].config
        times = measure(bench, configs, args.rounds)
        row = {"key": key.label(), "pass": key.pass_, "head_dim": key.head_dim, "seq_q": key.seq_q, "seq_k": key.seq_k,
               "causal": key.causal, "tuned_config": r.config.to_dict(), "n_trials": r.n_trials,
               "tflops": bench.flops / times["tuned"] * 1e-9 if times["tuned"] else None, "times": times}
        if key in sweep:
            row["sweep_config"] = sweep[key].config.to_dict()
            row["sweep_trials"] = sweep[key].n_trials
        rows.append(row)
        print(key.label(), {k: round(v, 4) if v else v for k, v in times.items() if not k.startswith("single")},
              flush=True)
        del bench
        torch.cuda.empty_cache()
    summary = {}
    for p in ("fwd", "bwd"):
        prow = [x for x in rows if x["pass"] == p and x["times"]["tuned"]]
        if not prow:
            continue
        # the best single config: lowest geometric-mean time over the keys where it runs on all
        n = len(singles[p])
        usable = [i for i in range(n) if all(x["times"].get(f"single{i}") for x in prow)]
        best = min(usable, key=lambda i: geomean([x["times"][f"single{i}"] for x in prow])) if usable else None
        summary[p] = {
            "keys": len(prow),
            "vs_seed": geomean([x["times"]["seed"] / x["times"]["tuned"] for x in prow if x["times"]["seed"]]),
            "vs_best_single": geomean([x["times"][f"single{best}"] / x["times"]["tuned"] for x in prow])
            if best is not None else None,
            "best_single_config": singles[p][best].to_dict() if best is not None else None,
            "vs_default": geomean([x["times"]["default"] / x["times"]["tuned"] for x in prow
                                   if x["times"]["default"]]),
            "sweep_gap": {x["key"]: x["times"]["tuned"] / x["times"]["sweep"] for x in prow
                          if x["times"].get("sweep")},
        }
        for x in prow:
            x["best_single"] = x["times"][f"single{best}"] if best is not None else None
    report = {"environment": harness.environment(dev), "rows": rows, "summary": summary}
    print(json.dumps(summary, indent=1))
    harness.write_json(args.out, report)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"Measured {env['date']} on {env['gpu']} (torch {env['torch']}, triton {env['triton']}, flashtune "
             f"{env['flashtune']} {env['flashtune_commit']}).", "",
             "| key | tuned config | trials | TFLOPS | vs seed | vs best single | vs default |",
             "|---|---|---|---|---|---|---|"]
    for x in report["rows"]:
        t = x["times"]

        def ratio(name):
            v = x.get("best_single") if name == "best_single" else t.get(name)
            return f"{v / t['tuned']:.2f}x" if v and t["tuned"] else "-"

        cfg = " ".join(str(v) for v in x["tuned_config"].values())
        tf = f"{x['tflops']:.0f}" if x["tflops"] else "-"
        lines.append(f"| {x['key']} | {cfg} | {x['n_trials']} | {tf} | {ratio('seed')} | {ratio('best_single')} | "
                     f"{ratio('default')} |")
    lines.append("")
    for p, s in report["summary"].items():
        lines.append(f"- {p}: geometric mean over {s['keys']} keys: {s['vs_seed']:.2f}x the seeds' fixed config, "
                     f"{(s['vs_best_single'] or float('nan')):.2f}x the best single config "
                     f"({s['best_single_config']}), {s['vs_default']:.2f}x the heuristic default")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
