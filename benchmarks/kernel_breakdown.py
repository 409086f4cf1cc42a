"""Where a call's GPU time goes, kernel by kernel: flashtune's drop-in (its heuristic defaults, or
the configs it is given) beside SDPA's cuDNN backend, from torch.profiler, for the forward and the
backward of each shape.

    python benchmarks/kernel_breakdown.py --grid --rows grid-d128-512,grid-d128-1024
    python benchmarks/kernel_breakdown.py --realistic --rows mistral-7b-train-2k --calls 20

For every shape and pass, each runner is called ``--calls`` times under the profiler (after a
warm-up that compiles and records the launch plans); the table lists its kernels with their
launches and GPU microseconds per call and their share, then the GPU time per call (the kernels'
sum), the wall time per call (CUDA events around the calls, the host's gaps included: a wall time
well over the GPU time is a host-bound call) and, for flashtune, its GPU and wall time over
cuDNN's. The backward runs from one fixed forward (autograd.grad with the graph kept), so its
kernels are the backward's alone. Shapes as in gluon_fwd.py / gluon_bwd.py (--grid, --realistic,
--rows).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


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


def runners(B, Hq, Hkv, Nq, Nk, D, causal, dtype, pass_):
    """{"flashtune": fn, "cudnn": fn} for one pass of one shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import gluon_bench
    from flashtune import attention

    q, k, v, do = gluon_bench.row_inputs(B, Hq, Hkv, Nq, Nk, D, dtype, with_do=True)
    gqa = Hq != Hkv

    def ours(*x):
        return attention(*x, causal=causal)

    def cudnn(*x):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(*x, is_causal=causal, enable_gqa=gqa)

    fns = {}
    for name, run in (("flashtune", ours), ("cudnn", cudnn)):
        if pass_ == "fwd":
            fns[name] = lambda run=run: run(q, k, v)
        else:
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            o = run(*leaves)
            fns[name] = lambda o=o, leaves=leaves: torch.autograd.grad(o, leaves, do, retain_graph=True)
    return fns


def print_table(name: str, mask: str, pass_: str, results: dict) -> None:
    for runner, (rows, gpu_us, wall_ms) in results.items():
        print(f"{name} {mask} {pass_} {runner}: GPU {gpu_us:.1f} us/call, wall {wall_ms * 1e3:.1f} us/call")
        for r in rows:
            print(f"    {r['us']:9.1f} us {r['share']:6.1%}  x{r['launches']:g}  {r['kernel']}")
    if "flashtune" in results and "cudnn" in results:
        ours, theirs = results["flashtune"], results["cudnn"]
        print(f"  flashtune / cudnn: GPU time {ours[1] / theirs[1]:.3f}, wall time {ours[2] / theirs[2]:.3f}"
              " (above 1: flashtune slower)", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--grid", action="store_true", help="the standard grid, D 64 and 128, N 512..16k")
    ap.add_argument("--realistic", action="store_true", help="SHAPES.md's rows with D 64/128 and Nq >= 1024")
    ap.add_argument("--rows", metavar="NAMES", help="only the shapes of these names (comma-separated)")
    ap.add_argument("--passes", default="fwd,bwd", help="fwd, bwd or both (comma-separated)")
    ap.add_argument("--calls", type=int, default=10, help="profiled calls per runner (at least 1)")
    ap.add_argument("--out", metavar="FILE.json")
    args = ap.parse_args(argv)
    passes = [p for p in args.passes.split(",") if p]
    if not passes or any(p not in ("fwd", "bwd") for p in passes):
        ap.error(f"--passes: expected fwd, bwd or both, got {args.passes!r}")
    if args.calls < 1:
        ap.error(f"--calls: expected at least 1, got {args.calls}")

    import torch

    import gluon_bench

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    large = [("4x16x4k-d128", 4, 16, 16, 4096, 4096, 128, None)]
    shapes = gluon_bench.shapes(args, large)
    if args.rows:
        wanted = set(args.rows.split(","))
        shapes = [s for s in shapes if s[0] in wanted]
        if not shapes:
            ap.error(f"--rows: no shape named {sorted(wanted)}")
    out = []
    for name, B, Hq, Hkv, Nq, Nk, D, causal in shapes:
        for c in ((False, True) if causal is None else (causal, )):
            for pass_ in passes:
                results = {}
                for runner, fn in runners(B, Hq, Hkv, Nq, Nk, D, c, dtype, pass_).items():
                    kernels, wall_ms = profile_calls(fn, args.calls)
                    rows = breakdown(kernels, args.calls)
                    results[runner] = (rows, sum(r["us"] for r in rows), wall_ms)
                mask = "causal" if c else "full"
                print_table(name, mask, pass_, results)
                out.append({"name": name, "mask": mask, "pass": pass_, "shape": [B, Hq, Hkv, Nq, Nk, D],
                            **{runner: {"gpu_us": g, "wall_ms": w, "kernels": rows}
                               for runner, (rows, g, w) in results.items()}})
                torch.cuda.empty_cache()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
