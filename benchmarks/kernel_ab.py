"""A kernel change against the kernel before it, side by side in one process.

Performance claims are ratios measured in one run, so a change to a kernel file is judged
by timing both versions together: the working tree's module and another version of the
same file (e.g. ``git show REV:flashtune/kernels/forward.py > old_forward.py``), loaded
under its own name. For each shape of the standard grid (B = 16384 / N, H = 2048 / D,
bf16) and each config (the heuristic default, or --config), both versions' outputs are
compared (they must agree to the dtype's rounding), then timed with
``triton.testing.do_bench`` (median) in --rounds interleaved rounds; the ratio is
baseline time / current time (above 1: the change is faster), with its geometric mean.

    git show 6146f33:flashtune/kernels/forward.py > /tmp/forward_before.py
    python benchmarks/kernel_ab.py --pass fwd --baseline /tmp/forward_before.py --out ab.json
    python benchmarks/kernel_ab.py --pass bwd --baseline /tmp/backward_before.py --seq-lens 1024 16384
    python benchmarks/kernel_ab.py --pass fwd --baseline /tmp/f.py --device cpu --seq-lens 32   # smoke test

The baseline file must define the pass's launcher with today's signature:
``attention_forward(q, k, v, config, *, causal, sm_scale)`` or
``attention_backward(do, q, k, v, o, lse2, config, *, causal, sm_scale)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import sys

# The interpreter is chosen when triton is imported: before flashtune's kernels are.
if "--device" in sys.argv[:-1] and sys.argv[sys.argv.index("--device") + 1].startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from flashtune.keys import mask_name  # noqa: E402
from flashtune.protocol import geomean, grid_shape, time_ms  # noqa: E402
from flashtune.kernels import backward, forward  # noqa: E402
from flashtune.kernels.config import BwdConfig, FwdConfig, default_config  # noqa: E402


def load_baseline(path: str, pass_: str):
    """The module at ``path`` under a name of its own, and its launcher for ``pass_``."""
    name = f"flashtune.kernels._ab_baseline_{pass_}"
    if not os.path.isfile(path):
        raise SystemExit(f"kernel_ab: --baseline: no file {path!r}; expected a copy of the pass's kernel file from "
                         "another version (git show REV:flashtune/kernels/forward.py > FILE)")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"kernel_ab: --baseline: cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton's jit looks the kernels' module up
    spec.loader.exec_module(module)
    launcher = "attention_forward" if pass_ == "fwd" else "attention_backward"
    if not hasattr(module, launcher):
        raise SystemExit(f"kernel_ab: --baseline: {path!r} defines no {launcher}()")
    return getattr(module, launcher)


def max_rel_diff(a, b) -> float:
    """Largest |a - b| over the largest |b|, over the outputs of one launch."""
    worst = 0.0
    for x, y in zip(a, b):
        x, y = x.float(), y.float()
        worst = max(worst, ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item())
    return worst


def run(args) -> dict:
    device = torch.device(args.device)
    interpreter = device.type != "cuda"
    dtype = getattr(torch, args.dtype)
    baseline = load_baseline(args.baseline, args.pass_)
    current = forward.attention_forward if args.pass_ == "fwd" else backward.attention_backward
    cls = FwdConfig if args.pass_ == "fwd" else BwdConfig
    fixed = cls.from_dict(json.loads(args.config)) if args.config else None
    tolerance = 4 * torch.finfo(dtype).eps if dtype != torch.float32 else 1e-4
    rows = []
    for d in args.head_dims:
        for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
            cfg = (fixed or default_config(args.pass_, d, dtype, device, causal=causal)).validate(d, dtype, device)
            if args.pass_ == "fwd" and not fixed:
                # forward.py's own kernel: the auto schedule would run decode.py's split
                # kernel on shapes that do not fill the device (the interpreter's tiny ones)
                cfg = dataclasses.replace(cfg, num_splits=1, pack_gqa=0)
            for n in args.seq_lens:
                b, h = grid_shape(d, n, interpreter=interpreter)
                gen = torch.Generator(device=device).manual_seed(0)
                q, k, v, do = (torch.randn(b, h, n, d, device=device, dtype=dtype, generator=gen) for _ in range(4))
                scale = d ** -0.5
                if args.pass_ == "fwd":
                    calls = {name: (lambda f=f: f(q, k, v, cfg, causal=causal, sm_scale=scale))
                             for name, f in (("baseline", baseline), ("current", current))}
                else:
                    o, lse2 = forward.attention_forward(q, k, v, default_config("fwd", d, dtype, device,
                                                                                causal=causal),
                                                        causal=causal, sm_scale=scale)
                    calls = {name: (lambda f=f: f(do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=scale))
                             for name, f in (("baseline", baseline), ("current", current))}
                diff = max_rel_diff(calls["current"](), calls["baseline"]())
                if not diff <= tolerance:
                    raise SystemExit(f"kernel_ab: D={d} N={n} causal={causal}: the two versions disagree "
                                     f"(max relative difference {diff:.3g} > {tolerance:.3g})")
                times = {name: [] for name in calls}
                for _ in range(args.rounds):
                    for name, call in calls.items():
                        times[name].append(time_ms(call, device))
                med = {name: statistics.median(t) for name, t in times.items()}
                row = {"head_dim": d, "seq_len": n, "causal": causal, "batch": b, "heads": h,
                       "config": cfg.to_dict(), "max_rel_diff": diff, "ms": med, "rounds_ms": times,
                       "speedup": med["baseline"] / med["current"]}
                rows.append(row)
                print(f"{args.pass_} D={d:<4} N={n:<6} {mask_name(causal):<6} {cfg.short()}: "
                      f"baseline {med['baseline']:.4f} ms, current {med['current']:.4f} ms, "
                      f"baseline/current {row['speedup']:.3f}", flush=True)
    summary = {"pass": args.pass_, "rows": len(rows), "speedup_geomean": geomean([r["speedup"] for r in rows])}
    print(f"geometric mean of baseline/current: {summary['speedup_geomean']:.3f} over {len(rows)} shapes"
          + (" (interpreter wall clock: not GPU performance)" if interpreter else ""))
    return {"baseline": os.path.abspath(args.baseline), "timer": "interpreter-wall-clock" if interpreter
            else "cuda-events", "rows": rows, "summary": summary}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), required=True)
    ap.add_argument("--baseline", required=True, help="the other version of the pass's kernel file")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--config", help="one config for every shape, as a JSON object (default: the heuristic default)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", help="write the rows as JSON")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive number, got {args.rounds}")
    result = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
