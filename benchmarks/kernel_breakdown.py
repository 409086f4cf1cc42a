"""Where a call's GPU time goes, kernel by kernel: flashtune (its heuristic defaults) beside an
anchor (SDPA's cuDNN backend unless --anchor), from torch.profiler, for the forward and the
backward of each row.

    python benchmarks/kernel_breakdown.py --rows grid-d128-512,grid-d128-1024
    python benchmarks/kernel_breakdown.py --rows mistral-7b-train-2k --calls 20 --layout transformers

For every row and pass, each runner is called ``--calls`` times under the profiler (after a
warm-up that compiles and records the launch plans); the table lists its kernels with their
launches and GPU microseconds per call and their share, then the GPU time per call (the kernels'
sum), the wall time per call (CUDA events around the calls, the host's gaps included: a wall time
well over the GPU time is a host-bound call) and, for flashtune, its GPU and wall time over the
anchor's. The backward runs from one fixed forward (autograd.grad with the graph kept), so its
kernels are the backward's alone. Rows as benchmarks/compare.py's (--rows, --shape, --pass).
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)


def short_name(kernel: str, width: int = 56) -> str:
    """A kernel's name without its template and argument lists, at most ``width`` characters."""
    name = kernel
    while True:  # innermost template brackets first, until none is left
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            break
        name = shorter
    name = re.sub(r"\(.*$", "", name).strip()
    name = name.split("::")[-1] if "::" in name and len(name) > width else name
    return name if len(name) <= width else name[:width - 3] + "..."


def breakdown(kernels: list[tuple[str, float]], calls: int) -> list[dict]:
    """[(kernel name, GPU microseconds)] of ``calls`` calls -> one entry per short name: launches
    and microseconds per call and share of the total, largest first."""
    if calls < 1:
        raise ValueError(f"calls: expected at least 1, got {calls}")
    time, count = collections.Counter(), collections.Counter()
    for name, us in kernels:
        key = short_name(name)
        time[key] += us
        count[key] += 1
    total = sum(time.values()) or 1.0
    return [{"kernel": key, "launches": count[key] / calls, "us": us / calls, "share": us / total}
            for key, us in time.most_common()]


def profile_calls(fn, calls: int) -> tuple[list[tuple[str, float]], float]:
    """The CUDA kernels (name, GPU us) of ``calls`` calls of ``fn`` and the wall ms per call."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # compile, record launch plans, warm caches
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return kernels, start.elapsed_time(end) / calls


def runners(shape, layout: str, pass_: str, anchor: str, device) -> dict:
    """{"flashtune": fn, anchor: fn} for one pass of one row."""
    q, k, v, do = harness.make_inputs(shape, device, layout)
    runs = {"flashtune": harness.flashtune_runner(), anchor: harness.anchor(anchor, device)}
    return {name: harness.pass_call(run, pass_, q, k, v, do, shape.causal) for name, run in runs.items()}


def print_table(name: str, pass_: str, results: dict, anchor: str) -> None:
    for runner, (rows, gpu_us, wall_ms) in results.items():
        print(f"{name} {pass_} {runner}: GPU {gpu_us:.1f} us/call, wall {wall_ms * 1e3:.1f} us/call")
        for r in rows:
            print(f"    {r['us']:9.1f} us {r['share']:6.1%}  x{r['launches']:g}  {r['kernel']}")
    if "flashtune" in results and anchor in results:
        ours, theirs = results["flashtune"], results[anchor]
        print(f"  flashtune / {anchor}: GPU time {ours[1] / theirs[1]:.3f}, wall time {ours[2] / theirs[2]:.3f}"
              " (above 1: flashtune slower)", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_row_args(ap, rows="grid-d128-4096")
    ap.add_argument("--layout", default="contiguous", help="contiguous, transformers or both (default contiguous)")
    ap.add_argument("--anchor", default="cudnn", help=f"what flashtune's kernels are set beside (default cudnn): "
                                                      f"{harness.ANCHOR_HELP}")
    ap.add_argument("--calls", type=int, default=10, help="profiled calls per runner (at least 1)")
    ap.add_argument("--out", metavar="FILE.json", help="write every row's kernels as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    layouts = harness.parse_layouts(ap, args.layout)
    names = harness.parse_anchors(ap, args.anchor)
    if len(names) != 1:
        ap.error(f"--anchor: expected one anchor, got {args.anchor!r}")
    anchor = names[0]
    if args.calls < 1:
        ap.error(f"--calls: expected at least 1, got {args.calls}")
    rows = harness.rows_from_args(ap, args)
    import torch

    if not torch.cuda.is_available():
        print("kernel_breakdown.py needs a CUDA GPU: it reads the CUDA kernels' times from torch.profiler",
              file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    env = harness.environment(device)
    print(harness.environment_line(env))
    out = []
    for shape in rows:
        for layout in layouts:
            for pass_ in shape.passes:
                results = {}
                try:
                    fns = runners(shape, layout, pass_, anchor, device)
                except harness.Unavailable as e:
                    ap.error(f"--anchor: {e}")
                for runner, fn in fns.items():
                    try:
                        kernels, wall_ms = profile_calls(fn, args.calls)
                    except Exception as e:  # noqa: BLE001 - a runner that cannot run the row says so
                        print(f"{shape.name} {pass_} {runner}: {harness.first_line(e)}", flush=True)
                        continue
                    table = breakdown(kernels, args.calls)
                    results[runner] = (table, sum(r["us"] for r in table), wall_ms)
                print_table(f"{shape.name} {layout}", pass_, results, anchor)
                out.append({"name": shape.name, "shape": shape.as_dict(), "layout": layout, "pass": pass_,
                            **{runner: {"gpu_us": g, "wall_ms": w, "kernels": table}
                               for runner, (table, g, w) in results.items()}})
                del fns
                torch.cuda.empty_cache()
    harness.write_json(args.out, {"environment": env, "rows": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
