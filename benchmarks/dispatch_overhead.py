"""What get_tuned_attention() adds per call, against launching the same kernel directly.

On a small shape (B=1, H=1, N=128, D=64, bf16 by default) the kernels take a few
microseconds on the GPU, so a loop of back-to-back calls is bound by the host: argument
checks, the config lookup, autograd, Triton's launcher. This script times --iters calls
between two torch.cuda.synchronize() and reports microseconds per call. That is the host
cost of a call (what a model of small attention calls pays), not the kernel's time; were
the GPU the bottleneck, every variant would show the same kernel time.

Variants, all with the configs the tuned callable picks for this shape (its choice is
printed: tuned when --db holds a row for it, else the heuristic default):

  direct     attention_forward(q, k, v, cfg, ...) [+ attention_backward(...)]: the launchers
  attention  flashtune.attention(q, k, v, fwd_config=cfg, bwd_config=bcfg): checks + autograd
  tuned      get_tuned_attention(db)(q, k, v): SDPA's signature, the table lookup
  sdpa       torch.nn.functional.scaled_dot_product_attention (for reference)

and with --runner NAME (an SDPA backend of flashtune.runners: sdpa-cudnn, sdpa-flash,
sdpa-efficient), what a call costs where the search stored that backend as the key's runner:

  served     get_tuned_attention(STORE)(q, k, v) on a temporary store whose keys for this
             shape (both passes) name NAME as their runner: the lookup, then the backend
  backend    flashtune.runners.sdpa(NAME, q, k, v): the same backend called directly

each for the forward alone (inputs without grad) and forward + backward
(torch.autograd.grad; the direct variant calls both launchers). The variants are
interleaved within each of --repeats rounds and the median round is reported, with
tuned's extra microseconds and ratio over attention and over direct.

    python benchmarks/dispatch_overhead.py
    python benchmarks/dispatch_overhead.py --db tuned.db --causal --out overhead.json
    python benchmarks/dispatch_overhead.py --device cpu --iters 3 --repeats 1   # interpreter smoke run

--diagnose adds measurements that locate the autograd path's extra cost: the backward
launcher alone (main thread), the same in another Python thread (autograd runs backward
on its own thread), and an autograd round trip through a do-nothing Function.

--out FILE writes the results as JSON (--out - prints them). --device cpu runs the
kernels under the Triton interpreter: its timings say nothing about the GPU.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

VARIANTS = ("direct", "attention", "tuned", "sdpa")
RUNNER_VARIANTS = ("served", "backend")
MODES = ("fwd", "fwd+bwd")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--causal", action="store_true")
    p.add_argument("--db", default=None, help="the tuned store (default: FLASHTUNE_DB or the user data dir's)")
    p.add_argument("--device", default="cuda", help="cuda[:N], or cpu for a run under the Triton interpreter")
    p.add_argument("--iters", type=int, default=2000, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (median reported)")
    p.add_argument("--out", default=None, help="write the results as JSON to this file ('-': stdout)")
    p.add_argument("--diagnose", action="store_true", help="also time the pieces of the autograd path")
    p.add_argument("--runner", default=None, choices=("sdpa-cudnn", "sdpa-flash", "sdpa-efficient"),
                   help="also time a call served by this SDPA backend as its key's runner (see above)")
    return p.parse_args(argv)


def per_call_us(call, iters: int, sync) -> float:
    """Microseconds per call of ``iters`` back-to-back calls, synchronized around the loop."""
    return harness.host_us_per_call(call, iters, repeats=1, sync=sync, warmup=0)


def make_calls(args, device):
    """{(variant, mode): zero-argument call} and the tuned callable's choice for the shape."""
    import torch
    import torch.nn.functional as F

    import flashtune

    kern = harness.kernels()
    attention_forward, attention_backward = kern.attention_forward, kern.attention_backward
    dtype = getattr(torch, args.dtype)
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = torch.randn(shape, device=device, dtype=dtype)
    causal, scale = args.causal, args.head_dim ** -0.5
    tuned = flashtune.get_tuned_attention(args.db, device=device)
    choice = tuned.explain(q, k, v, is_causal=causal)
    fwd, bwd = choice.fwd_config, choice.bwd_config
    if fwd is None:
        raise SystemExit(f"the tuned callable would not run flashtune's kernels here: {choice.fwd_source}")
    precision = kern.torch_fp32_precision(dtype)  # what the tuned callable picks

    def grads(attend):
        def call():
            out = attend(qg, kg, vg)
            return torch.autograd.grad(out, (qg, kg, vg), do)
        return call

    def direct_fwd_bwd():
        o, lse2 = attention_forward(q, k, v, fwd, causal=causal, sm_scale=scale, fp32_precision=precision)
        return attention_backward(do, q, k, v, o, lse2, bwd, causal=causal, sm_scale=scale,
                                  fp32_precision=precision)

    def attention(a, b, c):
        return flashtune.attention(a, b, c, causal=causal, fwd_config=fwd, bwd_config=bwd, fp32_precision=precision)

    def sdpa(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=causal)

    def tuned_call(a, b, c):
        return tuned(a, b, c, is_causal=causal)

    calls = {
        ("direct", "fwd"): lambda: attention_forward(q, k, v, fwd, causal=causal, sm_scale=scale,
                                                     fp32_precision=precision),
        ("direct", "fwd+bwd"): direct_fwd_bwd,
    }
    variants = [("attention", attention), ("tuned", tuned_call), ("sdpa", sdpa)]
    if args.runner:
        from flashtune import runners

        served = flashtune.get_tuned_attention(runner_store(args.runner, q, k, causal, fwd, bwd, device),
                                               device=device)
        variants += [("served", lambda a, b, c: served(a, b, c, is_causal=causal)),
                     ("backend", lambda a, b, c: runners.sdpa(args.runner, a, b, c, is_causal=causal))]
    for name, attend in variants:
        calls[(name, "fwd")] = lambda attend=attend: attend(q, k, v)
        calls[(name, "fwd+bwd")] = grads(attend)
    return calls, choice


def runner_store(runner: str, q, k, causal: bool, fwd, bwd, device) -> str:
    """A temporary store whose keys of this call (fwd and bwd) hold ``fwd``/``bwd`` with
    ``runner`` as their runner, as a search that measured that backend faster stores them."""
    import tempfile

    from flashtune.dispatch import call_key
    from flashtune.keys import GpuInfo
    from flashtune.provenance import current_provenance
    from flashtune.store import Store, StoredResult

    interpreter = device.type != "cuda"
    gpu = GpuInfo.interpreter() if interpreter else GpuInfo.from_device(device)
    path = os.path.join(tempfile.mkdtemp(prefix="flashtune-overhead-"), "runner.db")
    with Store(path) as store:
        for pass_, cfg in (("fwd", fwd), ("bwd", bwd)):
            store.save_result(StoredResult(
                key=call_key(gpu.key, pass_, q, k, causal), config=cfg, time_ms=1.0, tflops=1.0, default_time_ms=1.0,
                error=0.0, n_trials=1, gpu=gpu, provenance=current_provenance(None if interpreter else device),
                runner=runner, runner_times={"triton": 1.0, runner: 0.5}))
    return path


def diagnose(args, device, sync) -> dict:
    """Host µs per call of the pieces of the autograd path (see --diagnose)."""
    import threading

    import torch

    import flashtune

    kern = harness.kernels()
    attention_forward, attention_backward = kern.attention_forward, kern.attention_backward
    dtype = getattr(torch, args.dtype)
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    q, k, v, do = (torch.randn(shape, device=device, dtype=dtype) for _ in range(4))
    choice = flashtune.get_tuned_attention(args.db, device=device).explain(q, k, v, is_causal=args.causal)
    fwd, bwd, precision = choice.fwd_config, choice.bwd_config, kern.torch_fp32_precision(dtype)
    o, lse2 = attention_forward(q, k, v, fwd, causal=args.causal, sm_scale=args.head_dim ** -0.5,
                                fp32_precision=precision)

    def backward():
        return attention_backward(do, q, k, v, o, lse2, bwd, causal=args.causal, sm_scale=args.head_dim ** -0.5,
                                  fp32_precision=precision)

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g

    x = q.clone().requires_grad_()

    def noop_round_trip():
        return torch.autograd.grad(Identity.apply(x), (x,), do)

    def in_thread(call):
        def timed():
            box = []
            worker = threading.Thread(target=lambda: box.append(per_call_us(call, args.iters, sync)))
            worker.start()
            worker.join()
            return box[0]
        return timed

    measures = {"bwd launcher, main thread": lambda: per_call_us(backward, args.iters, sync),
                "bwd launcher, another thread": in_thread(backward),
                "autograd round trip, no-op Function": lambda: per_call_us(noop_round_trip, args.iters, sync)}
    backward(), noop_round_trip(), in_thread(backward)()  # warm up
    rounds = {name: [] for name in measures}
    for _ in range(args.repeats):
        for name, measure in measures.items():
            rounds[name].append(measure())
    return {name: statistics.median(times) for name, times in rounds.items()}


def run(args) -> dict:
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark measures GPU launches (use --device cpu for a smoke run "
                         "under the Triton interpreter)")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    calls, choice = make_calls(args, device)
    for call in calls.values():  # compile, fill caches
        call()
    rounds: dict[tuple, list[float]] = {key: [] for key in calls}
    for _ in range(args.repeats):
        for key, call in calls.items():
            rounds[key].append(per_call_us(call, args.iters, sync))
    us = {f"{variant} {mode}": statistics.median(rounds[(variant, mode)]) for variant, mode in calls}
    pieces = diagnose(args, device, sync) if args.diagnose else None
    overhead = {}
    pairs = [("tuned", "attention"), ("tuned", "direct")] + ([("served", "backend")] if args.runner else [])
    for mode in MODES:
        for variant, base in pairs:
            t, b = us[f"{variant} {mode}"], us[f"{base} {mode}"]
            overhead[f"{variant} vs {base} {mode}"] = {"extra_us": t - b, "ratio": t / b}
    env = harness.environment(device)
    return {
        "date": env["date"],
        "command": env["command"],
        "interpreter": device.type != "cuda",
        "shape": {"batch": args.batch, "heads": args.heads, "seq_len": args.seq_len, "head_dim": args.head_dim,
                  "dtype": args.dtype, "causal": args.causal},
        "iters": args.iters, "repeats": args.repeats, "runner": args.runner,
        "choice": {"fwd": choice.fwd_config.to_dict(), "fwd_source": choice.fwd_source,
                   "bwd": choice.bwd_config.to_dict(), "bwd_source": choice.bwd_source},
        "us_per_call": us,
        "overhead": overhead,
        **({"diagnose_us_per_call": pieces} if pieces is not None else {}),
        "environment": env,
    }


def format_report(result: dict) -> str:
    s = result["shape"]
    lines = [
        f"per-call host time, B={s['batch']} H={s['heads']} N={s['seq_len']} D={s['head_dim']} {s['dtype']}"
        f"{' causal' if s['causal'] else ''}; median of {result['repeats']} rounds of {result['iters']} calls"
        + ("  [Triton interpreter: not GPU figures]" if result["interpreter"] else ""),
        f"configs: fwd {result['choice']['fwd_source']}, bwd {result['choice']['bwd_source']}"
        + (f"; served/backend: {result['runner']}" if result["runner"] else ""),
        "",
        f"{'variant':<10} {'fwd us':>10} {'fwd+bwd us':>12}",
    ]
    for variant in VARIANTS + (RUNNER_VARIANTS if result["runner"] else ()):
        lines.append(f"{variant:<10} {result['us_per_call'][f'{variant} fwd']:>10.2f} "
                     f"{result['us_per_call'][f'{variant} fwd+bwd']:>12.2f}")
    lines.append("")
    for name, o in result["overhead"].items():
        lines.append(f"{name:<30} {o['extra_us']:+8.2f} us  x{o['ratio']:.3f}")
    if "diagnose_us_per_call" in result:
        lines.append("")
        lines.extend(f"{name:<38} {us:>8.2f} us" for name, us in result["diagnose_us_per_call"].items())
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    harness.use_interpreter_for_cpu(["--device", args.device])  # before triton is imported
    result = run(args)
    print(format_report(result))
    harness.write_json(args.out, result)


if __name__ == "__main__":
    main()
