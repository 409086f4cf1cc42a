"""flashtune vs torch SDPA (cuDNN and flash backends) on the standard grid, in one run.

The grid of ../shared/design/BENCHMARKS.md: head dim D in {64, 128}, H = 2048 / D heads,
sequence length N in {512, ..., 16384}, batch B = 16384 / N; bf16 by default; causal and
not; forward and backward. For every shape flashtune (heuristic default configs, or
the configs of --configs) is first checked against cuDNN, then each backend is timed
with triton.testing.do_bench(return_mode="median"), in --rounds interleaved rounds (each
backend's figure is the median of its rounds):

  forward FLOPs  = 4 * B * H * N^2 * D, halved when causal
  backward FLOPs = 2.5 * forward; backward time = o.backward(do, retain_graph=True) alone

and the table gives TFLOPS and the ratios flashtune/cuDNN and flashtune/flash, with
their geometric means per pass at the end.

    python benchmarks/attention.py                      # full grid, bf16
    python benchmarks/attention.py --quick --out bench.json
    python benchmarks/attention.py --configs tuned.json # explicit configs per shape

--configs FILE.json holds a list of entries (or {"entries": [...]}) such as
  {"head_dim": 128, "seq_len": 4096, "causal": true, "dtype": "bf16",
   "fwd": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
   "bwd": {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "num_warps": 8, "num_stages": 2}}
where head_dim, seq_len, causal and dtype are optional filters (absent: any) and fwd/bwd
are optional; for each shape and pass the matching entry with the most filters wins,
and a pass without one uses the heuristic default.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from flashtune.keys import mask_name
from flashtune.protocol import (GRID_HEAD_DIMS, GRID_SEQ_LENS, TOKENS, WIDTH,  # noqa: F401 (used by tests)
                                attention_flops, geomean, grid_shape)

QUICK_SEQ_LENS = (1024, 4096)
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
BASELINES = ("cudnn", "flash")


# ----------------------------------------------------------------------------------
# Pure pieces (no GPU needed)
# ----------------------------------------------------------------------------------
def tflops(flops: float, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else flops / (ms * 1e-3) / 1e12


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


@dataclass
class Row:
    pass_: str
    head_dim: int
    seq_len: int
    batch: int
    heads: int
    causal: bool
    dtype: str
    flops: float
    ms: dict = field(default_factory=dict)  # backend -> median ms over the rounds (None: failed)
    rounds_ms: dict = field(default_factory=dict)  # backend -> each round's do_bench median
    tflops: dict = field(default_factory=dict)
    config: dict | None = None  # flashtune's config for this pass
    config_source: str = "default"
    check: dict = field(default_factory=dict)  # correctness figures vs cuDNN
    error: str | None = None  # set when the row was aborted

    def ratios(self) -> dict:
        ft = self.tflops.get("flashtune")
        return {b: ratio(ft, self.tflops.get(b)) for b in BASELINES}


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


TABLE_HEADER = (f"{'pass':<4} {'D':>4} {'causal':<6} {'N':>6} {'B':>4} {'H':>3} | {'flashtune':>9} {'cuDNN':>7} "
                f"{'flash':>7} | {'ft/cuDNN':>8} {'ft/flash':>8}  config")


def format_row(row: Row) -> str:
    head = f"{row.pass_:<4} {row.head_dim:>4} {'yes' if row.causal else 'no':<6} {row.seq_len:>6} {row.batch:>4} " \
           f"{row.heads:>3} | "
    if row.error:
        return head + f"ABORTED: {row.error}"
    t, r = row.tflops, row.ratios()
    cfg = " ".join(f"{v}" for v in row.config.values()) if row.config else ""
    return head + (f"{_fmt(t.get('flashtune'), '9.1f')} {_fmt(t.get('cudnn'), '7.1f')} {_fmt(t.get('flash'), '7.1f')} | "
                   f"{_fmt(r['cudnn'], '8.3f')} {_fmt(r['flash'], '8.3f')}  {row.config_source}:{cfg}")


def summarize(rows: list[Row]) -> dict:
    """Geometric-mean ratio flashtune/baseline per pass (and per pass and causal)."""
    out = {}
    for pass_ in ("fwd", "bwd"):
        for causal in (None, False, True):
            sel = [r for r in rows if r.pass_ == pass_ and not r.error and (causal is None or r.causal == causal)]
            if not sel:
                continue
            key = pass_ if causal is None else f"{pass_}-{mask_name(causal)}"
            out[key] = {b: geomean(r.ratios()[b] for r in sel) for b in BASELINES}
            out[key]["rows"] = len(sel)
    return out


def format_summary(summary: dict) -> str:
    lines = ["geometric mean of flashtune / baseline (TFLOPS ratio; > 1: flashtune faster):"]
    for key, s in summary.items():
        lines.append(f"  {key:<12} vs cuDNN {_fmt(s['cudnn'], '.3f'):>6}   vs flash {_fmt(s['flash'], '.3f'):>6}"
                     f"   ({s['rows']} rows)")
    return "\n".join(lines)


def load_configs(path: str | None) -> list[dict]:
    if path is None:
        return []
    with open(path) as f:
        data = json.load(f)
    entries = data.get("entries") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SystemExit(f"--configs {path}: expected a list of entries or {{'entries': [...]}}")
    for e in entries:
        unknown = set(e) - {"head_dim", "seq_len", "causal", "dtype", "fwd", "bwd"}
        if unknown:
            raise SystemExit(f"--configs {path}: unknown keys {sorted(unknown)} in entry {e}")
    return entries


def pick_config(entries: list[dict], pass_: str, *, head_dim: int, seq_len: int, causal: bool, dtype: str):
    """The most specific entry's config dict for this pass and shape, or None."""
    best, best_score = None, -1
    for e in entries:
        if pass_ not in e:
            continue
        want = {"head_dim": head_dim, "seq_len": seq_len, "causal": causal, "dtype": dtype}
        if "dtype" in e and DTYPES.get(e["dtype"], e["dtype"]) != DTYPES[dtype]:
            continue
        if any(k in e and e[k] != v for k, v in want.items() if k != "dtype"):
            continue
        score = sum(k in e for k in want)
        if score > best_score:
            best, best_score = e[pass_], score
    return best


# ----------------------------------------------------------------------------------
# The GPU part
# ----------------------------------------------------------------------------------
def environment() -> dict:
    import torch
    import triton

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "driver": None,
    }
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       check=False, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    with contextlib.suppress(ImportError):
        import flashtune

        env["flashtune"] = flashtune.__version__
    return env


def _sdpa(backend):
    """SDPA with one backend. The GPU backends are selected as flashtune's SDPA runners select
    them (torch's backend switches, flashtune.runners.sdpa), so an anchor and a drop-in call
    served by that backend pay the same host cost: ``sdpa_kernel`` adds about 12 us a call,
    which on a 20-100 us row made the anchor look slower than the same backend behind the
    drop-in (H200, 2026-12-02). The math backend (the interpreter's stand-in) keeps sdpa_kernel."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtune.runners import sdpa

    name = {SDPBackend.CUDNN_ATTENTION: "sdpa-cudnn", SDPBackend.FLASH_ATTENTION: "sdpa-flash",
            SDPBackend.EFFICIENT_ATTENTION: "sdpa-efficient"}.get(backend)

    def run(q, k, v, causal):
        if name is not None:
            return sdpa(name, q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])

    return run


def _flashtune(fwd_cfg, bwd_cfg):
    from flashtune.kernels import attention

    def run(q, k, v, causal):
        return attention(q, k, v, causal=causal, fwd_config=fwd_cfg, bwd_config=bwd_cfg)

    return run


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_against_cudnn(ours, cudnn, q, k, v, do, causal) -> dict:
    """flashtune vs cuDNN: relative error over the whole tensors, and both against an
    fp32 reference on the first (batch, head) with FlashAttention's rule (ours at most
    2x cuDNN's error + rounding slack). Raises AssertionError with the figures if wrong."""
    import torch

    from flashtune.kernels import reference_attention

    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o_ft = ours(*leaves, causal)
    g_ft = torch.autograd.grad(o_ft, leaves, do)
    leaves_cu = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o_cu = cudnn(*leaves_cu, causal)
    g_cu = torch.autograd.grad(o_cu, leaves_cu, do)

    fig = {"rel_vs_cudnn": {n: _rel(a, b) for n, a, b in zip(("o", "dq", "dk", "dv"), (o_ft, *g_ft), (o_cu, *g_cu))}}
    # fp32 reference on one (batch, head)
    sl = (slice(0, 1), slice(0, 1))
    ref_leaves = [x.detach()[sl].float().requires_grad_() for x in (q, k, v)]
    o_ref, _ = reference_attention(*ref_leaves, causal=causal)
    g_ref = torch.autograd.grad(o_ref, ref_leaves, do[sl].float())
    eps = torch.finfo(q.dtype).eps
    bad = []
    fig["slice_err"] = {}
    for n, a, c, r in zip(("o", "dq", "dk", "dv"), (o_ft, *g_ft), (o_cu, *g_cu), (o_ref, *g_ref)):
        r = r.detach()
        err_ft = (a[sl].float() - r).abs().max().item()
        err_cu = (c[sl].float() - r).abs().max().item()
        allowed = 2 * err_cu + 4 * eps * r.abs().max().item()
        fig["slice_err"][n] = {"flashtune": err_ft, "cudnn": err_cu}
        if not math.isfinite(err_ft) or err_ft > allowed:
            bad.append(f"{n}: max error {err_ft:.3g} vs fp32 on (0, 0) > allowed {allowed:.3g} "
                       f"(cuDNN's error {err_cu:.3g})")
        if not math.isfinite(fig["rel_vs_cudnn"][n]) or fig["rel_vs_cudnn"][n] > 0.05:
            bad.append(f"{n}: relative error vs cuDNN {fig['rel_vs_cudnn'][n]:.3g} > 0.05")
    if bad:
        raise AssertionError("; ".join(bad))
    return fig


def time_pass(run, pass_, q, k, v, do, causal, *, warmup, rep) -> float:
    """Median ms of one pass: the forward alone, or ``o.backward(do, retain_graph=True)`` alone."""
    import torch
    import triton

    if pass_ == "fwd":
        with torch.no_grad():
            return triton.testing.do_bench(lambda: run(q, k, v, causal), warmup=warmup, rep=rep,
                                           return_mode="median")
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = run(*leaves, causal)
    return triton.testing.do_bench(lambda: o.backward(do, retain_graph=True), warmup=warmup, rep=rep,
                                   grad_to_none=leaves, return_mode="median")


def bench_shape(args, entries, head_dim, seq_len, causal, dtype_name) -> list[Row]:
    import torch
    from torch.nn.attention import SDPBackend

    from flashtune.kernels import BwdConfig, FwdConfig
    from flashtune.kernels.function import resolve_configs

    dtype = getattr(torch, DTYPES[dtype_name])
    batch, heads = grid_shape(head_dim, seq_len)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=dtype, generator=gen)
                   for _ in range(4))

    given, sources = {}, {}
    for pass_, cls in (("fwd", FwdConfig), ("bwd", BwdConfig)):
        entry = pick_config(entries, pass_, head_dim=head_dim, seq_len=seq_len, causal=causal, dtype=dtype_name)
        given[pass_] = cls.from_dict(entry) if entry else None
        sources[pass_] = "file" if entry else "default"
    # the configs flashtune.attention() launches for this call: the given ones validated, else the
    # heuristic defaults of the call's buckets (the long entries by its lengths: config.is_long)
    cfgs = dict(zip(("fwd", "bwd"), resolve_configs(q, given["fwd"], given["bwd"], causal=causal)))
    runners = {"flashtune": _flashtune(cfgs["fwd"], cfgs["bwd"]),
               "cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION), "flash": _sdpa(SDPBackend.FLASH_ATTENTION)}

    rows = {p: Row(p, head_dim, seq_len, batch, heads, causal, dtype_name,
                   attention_flops(p, batch, heads, seq_len, head_dim, causal),
                   config=cfgs[p].to_dict(), config_source=sources[p]) for p in args.passes}
    try:
        check = check_against_cudnn(runners["flashtune"], runners["cudnn"], q, k, v, do, causal)
    except AssertionError as e:
        for row in rows.values():
            row.error = f"flashtune disagrees with cuDNN: {e}"
        return list(rows.values())
    except Exception as e:  # noqa: BLE001 - e.g. a launch failure: abort the row, keep the run
        for row in rows.values():
            row.error = f"check failed to run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return list(rows.values())
    torch.cuda.empty_cache()

    timed = time_rounds(runners, list(rows), args.rounds,
                        lambda run, pass_: time_pass(run, pass_, q, k, v, do, causal, warmup=args.warmup,
                                                     rep=args.rep))
    for (name, pass_), times in timed.items():
        row = rows[pass_]
        row.check = check
        row.rounds_ms[name] = times
        row.ms[name] = statistics.median(times) if times else None
        row.tflops[name] = tflops(row.flops, row.ms[name])
    return list(rows.values())


def time_rounds(runners: dict, passes: list, rounds: int, time_one, *, max_rounds: int | None = None,
                spread: float = 1.15) -> dict:
    """{(backend, pass): [ms of each round]} from ``time_one(run, pass_)``, the backends and
    passes interleaved round by round, so a slow moment of a shared machine hits one round
    of each rather than all of one backend. A backend that raises on a pass is reported once
    and gets an empty list for it.

    ``max_rounds``: after ``rounds``, more rounds (up to ``max_rounds`` in all) while a backend's
    slowest round is over ``spread`` times its fastest and the slow rounds are not yet a
    minority, so a median never lands on a disturbed round: one or two rounds that a busy
    host slowed several-fold (H200, 2026-12-02: a row's drop-in at 0.193, 0.108 and 0.058 ms
    over three rounds) are outvoted by quiet ones."""
    times = {(name, pass_): [] for name in runners for pass_ in passes}
    failed = set()

    def one_round() -> None:
        for name, run in runners.items():
            for pass_ in passes:
                if (name, pass_) in failed:
                    continue
                try:
                    times[name, pass_].append(time_one(run, pass_))
                except Exception as e:  # noqa: BLE001 - a backend that cannot run this shape
                    print(f"  {name} {pass_} failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
                    failed.add((name, pass_))
                    times[name, pass_] = []

    def disturbed(ms: list) -> bool:
        fast = min(ms)
        slow = sum(1 for t in ms if t > fast * spread)
        return slow * 2 >= len(ms)

    for _ in range(rounds):
        one_round()
    done = rounds
    while done < (max_rounds or 0) and any(ms and disturbed(ms) for ms in times.values()):
        one_round()
        done += 1
    return times


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="input dtype (default bf16)")
    ap.add_argument("--quick", action="store_true", help=f"only N in {QUICK_SEQ_LENS}")
    ap.add_argument("--head-dims", type=int, nargs="+", default=list(GRID_HEAD_DIMS), metavar="D")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=None, metavar="N",
                    help=f"override the sequence lengths (default {GRID_SEQ_LENS})")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--passes", nargs="+", choices=["fwd", "bwd"], default=["fwd", "bwd"])
    ap.add_argument("--configs", metavar="FILE.json", help="explicit flashtune configs per shape (see above)")
    ap.add_argument("--out", metavar="FILE.json", help="write the environment and every row as JSON")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warmup (ms)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds per shape; each backend's figure is the median of its rounds (default 3)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive number of rounds, got {args.rounds}")
    if args.seq_lens is None:
        args.seq_lens = list(QUICK_SEQ_LENS if args.quick else GRID_SEQ_LENS)
    for n in args.seq_lens:
        if n <= 0 or TOKENS % n:
            ap.error(f"--seq-lens: {n} must divide {TOKENS} (batch = {TOKENS} / N)")
    for d in args.head_dims:
        if d <= 0 or WIDTH % d:
            ap.error(f"--head-dims: {d} must divide {WIDTH} (heads = {WIDTH} / D)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/attention.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    entries = load_configs(args.configs)
    env = environment()
    print(f"# {env['gpu']} sm_{env['capability'][0]}{env['capability'][1]}, torch {env['torch']}, "
          f"triton {env['triton']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, driver {env['driver']}, {env['date']}")
    print(f"# dtype {args.dtype}; TFLOPS from do_bench medians; flashtune configs: "
          f"{args.configs or 'heuristic defaults'}")
    print(TABLE_HEADER, flush=True)
    causal_values = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    rows: list[Row] = []
    for head_dim in args.head_dims:
        for causal in causal_values:
            for seq_len in args.seq_lens:
                for row in bench_shape(args, entries, head_dim, seq_len, causal, args.dtype):
                    rows.append(row)
                    print(format_row(row), flush=True)
    summary = summarize(rows)
    print(format_summary(summary))
    aborted = [r for r in rows if r.error]
    if aborted:
        print(f"WARNING: {len(aborted)} rows aborted because flashtune's output was wrong or failed", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "args": vars(args), "rows": [asdict(r) for r in rows],
                       "summary": summary}, f, indent=1)
        print(f"# wrote {args.out}")
    return 1 if aborted else 0


if __name__ == "__main__":
    sys.exit(main())
