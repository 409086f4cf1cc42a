"""Sweep the Gluon forward's fp8 configs against flashtune's own bf16 forward (the goal: fp8 at
least 1.3x flashtune bf16 at D=128), in one process on an H100/H200: the evidence behind the
fp8 forward's heuristic default, which the search does not tune.

    python benchmarks/fp8_sweep.py --out fp8_sweep.json              # 24 Gluon configs, full and causal
    python benchmarks/fp8_sweep.py --block-n 128 --buffers 3 --overlap 0 --rounds 5   # a subset
    python benchmarks/fp8_sweep.py --extra-seq 1024 2048             # the best also at shorter N

What runs, on the same values (bf16 randn inputs, quantized per tensor to e4m3 with amax at
448, as benchmarks/variants.py's fp8 section does; seed 2):
- "flashtune-bf16": ``flashtune.attention`` on the bf16 inputs under torch.no_grad, its
  heuristic default (on sm_90 at D=128 from N=4096 the Gluon kernel's bf16 default);
- "cudnn-bf16": SDPA's cuDNN backend on the bf16 inputs (``flashtune.runners.sdpa``);
- "fp8-default": ``attention_fp8`` with ``config=None``: the heuristic default it serves
  (config.py; the labels are printed as "served");
- "fp8-triton": ``attention_fp8`` with the Triton kernel's fp8 default (``as_triton``);
- "gluon ...": ``attention_fp8`` with ``FwdConfig(BLOCK_M, BLOCK_N, 4, NUM_BUFFERS, family=1,
  pingpong=P, overlap=O)``, every combination of --block-m, --block-n, --buffers, --pingpong
  and --overlap whose ``validate()`` passes on this device (the others are printed with the
  reason and skipped).
V is passed keys-contiguous (``fp8.keys_contiguous``, copied once outside the timing): the
layout the fp8 kernels read P V's V in, so no copy is timed.

Each fp8 output is first checked against cuDNN's bf16 output (relative Frobenius error
below --max-rel, 0.1 by default, as variants.py does: P in e4m3 is off by up to 2^-4 per
probability); a config that fails the check or raises is reported and not timed. Then every
runner is timed with triton.testing.do_bench (median ms, L2 flushed; benchmarks/harness.py) in --rounds interleaved
rounds (more, up to --max-rounds, while a runner's rounds disagree by over 15 %: see
benchmarks/harness.py time_rounds); each figure is the median of its rounds. "x bf16" is
time(flashtune-bf16) / time(runner): > 1 means faster than flashtune's bf16 forward. TFLOPS
count 4 B H N^2 D (halved for causal).

--extra-seq N...: afterwards, the fastest Gluon config of each mask and the Triton fp8
default are timed against flashtune bf16 at these sequence lengths as well (the standard
grid's batch and heads for the length, flashtune.protocol.grid_shape): whether a default
chosen at N=4096 holds at shorter ones. The JSON (--out) is rewritten after each phase, so a
run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

_first_line = harness.first_line
GOAL = 1.3  # fp8 forward / flashtune bf16 forward
BASELINE = "flashtune-bf16"
MASKS = ("full", "causal")
FP8_TYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


# ----------------------------------------------------------------------------------
# Pure pieces (no GPU needed)
# ----------------------------------------------------------------------------------
def gluon_configs(args) -> list:
    """The swept FwdConfigs (family=1), in a fixed order; not yet validated."""
    FwdConfig = harness.kernels().FwdConfig

    return [FwdConfig(m, n, 4, b, family=1, pingpong=p, overlap=o)
            for m, n, b, p, o in itertools.product(args.block_m, args.block_n, args.buffers, args.pingpong,
                                                   args.overlap)]


def fwd_flops(b: int, h: int, n: int, d: int, causal: bool) -> float:
    """4 B H N^2 D, halved for causal (the grid's count)."""
    return harness.Shape(b, h, h, n, n, d, causal).flops("fwd")


def summarize(ms: dict, flops: float) -> dict:
    """{runner: {ms, tflops, x_bf16, x_cudnn}} from {runner: median ms or None}."""
    base, cudnn = ms.get(BASELINE), ms.get("cudnn-bf16")
    return {name: {"ms": t, "tflops": harness.tflops(flops, t), "x_bf16": harness.ratio(base, t),
                   "x_cudnn": harness.ratio(cudnn, t)} for name, t in ms.items()}


def best_gluon(summary: dict) -> str | None:
    """The fastest Gluon runner of a mask's summary (None if none was timed)."""
    timed = [(s["ms"], name) for name, s in summary.items() if name.startswith("gluon") and s["ms"] is not None]
    return min(timed)[1] if timed else None


def format_table(mask: str, summary: dict) -> str:
    lines = [f"## {mask}", f"{'runner':<28} {'ms':>8} {'TFLOPS':>7} {'x bf16':>7} {'x cuDNN':>8}"]
    order = sorted(summary, key=lambda k: (not k.startswith(("flashtune", "cudnn", "fp8")),
                                           summary[k]["ms"] if summary[k]["ms"] is not None else float("inf")))
    for name in order:
        s = summary[name]
        lines.append(f"{name:<28} {harness.fmt(s['ms'], '8.3f')} {harness.fmt(s['tflops'], '7.0f')} "
                     f"{harness.fmt(s['x_bf16'], '7.3f')} {harness.fmt(s['x_cudnn'], '8.3f')}")
    return "\n".join(lines)


def verdict(results: dict) -> dict:
    """For each mask the best Gluon runner and its ratio; and whether one config reaches the
    goal on every mask (the best such by its worst mask)."""
    out = {"goal": GOAL, "best": {}}
    for mask, summary in results.items():
        name = best_gluon(summary)
        out["best"][mask] = {"runner": name, "x_bf16": summary[name]["x_bf16"] if name else None}
    common = None
    for mask, summary in results.items():
        names = {n for n, s in summary.items() if n.startswith("gluon") and s["x_bf16"] is not None}
        common = names if common is None else common & names
    ranked = sorted(((min(results[m][n]["x_bf16"] for m in results), n) for n in common or ()), reverse=True)
    if ranked:
        out["best_on_all_masks"] = {"runner": ranked[0][1], "worst_x_bf16": ranked[0][0]}
        out["met"] = ranked[0][0] >= GOAL
    else:
        out["met"] = False
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=4, default=(4, 16, 4096, 128), metavar=("B", "H", "N", "D"),
                    help="batch, heads, sequence length, head dim (default 4 16 4096 128)")
    ap.add_argument("--fp8", choices=sorted(FP8_TYPES), default="e4m3", help="fp8 type (default e4m3)")
    ap.add_argument("--masks", nargs="+", choices=MASKS, default=list(MASKS))
    ap.add_argument("--block-m", type=int, nargs="+", default=[64], help="Gluon BLOCK_M values (default 64)")
    ap.add_argument("--block-n", type=int, nargs="+", default=[64, 128], help="Gluon BLOCK_N values")
    ap.add_argument("--buffers", type=int, nargs="+", default=[2, 3, 4], help="Gluon NUM_BUFFERS values")
    ap.add_argument("--pingpong", type=int, nargs="+", choices=(0, 1), default=[0, 1])
    ap.add_argument("--overlap", type=int, nargs="+", choices=(0, 1), default=[0, 1])
    ap.add_argument("--extra-seq", type=int, nargs="*", default=[], metavar="N",
                    help="also time the best Gluon configs and the Triton fp8 default at these lengths")
    ap.add_argument("--max-rel", type=float, default=0.1, help="relative error vs cuDNN bf16 allowed (0.1)")
    ap.add_argument("--quick", action="store_true", help="shorter do_bench runs (10 ms warm-up, 30 ms of calls)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken; default 3)")
    ap.add_argument("--max-rounds", type=int, default=5, help="rounds at most while rounds disagree (default 5)")
    ap.add_argument("--out", metavar="FILE.json", help="write the environment, checks and figures as JSON")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive number, got {args.rounds}")
    if args.shape[3] not in (64, 128):
        ap.error(f"--shape: the Gluon forward runs D 64 and 128, got D={args.shape[3]}")
    return args


# ----------------------------------------------------------------------------------
# The GPU part
# ----------------------------------------------------------------------------------
def make_inputs(b: int, h: int, n: int, d: int, fp8_dtype):
    """bf16 q, k, v (seeded randn), their fp8 quantization (per tensor, amax to the type's
    max), V keys-contiguous, and the descales."""
    import torch

    keys_contiguous = harness.kernels().keys_contiguous

    gen = torch.Generator(device="cuda").manual_seed(2)
    q16, k16, v16 = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    fmax = torch.finfo(fp8_dtype).max
    scales = [x.abs().amax().float().item() / fmax for x in (q16, k16, v16)]
    q8, k8, v8 = ((x.float() / s).to(fp8_dtype) for x, s in zip((q16, k16, v16), scales))
    descales = {"q_descale": scales[0], "k_descale": scales[1], "v_descale": scales[2]}
    return (q16, k16, v16), (q8, k8, keys_contiguous(v8)), descales


def make_runners(bf16, fp8, descales, triton_cfg: dict, gluon: dict) -> dict:
    """name -> run(causal) -> o."""
    import torch

    import flashtune
    from flashtune.runners import sdpa

    q16, k16, v16 = bf16
    q8, k8, v8 = fp8

    def ft_bf16(causal):
        with torch.no_grad():
            return flashtune.attention(q16, k16, v16, causal=causal)

    runners = {BASELINE: ft_bf16,
               "cudnn-bf16": lambda causal: sdpa("sdpa-cudnn", q16, k16, v16, is_causal=causal),
               "fp8-default": lambda causal: flashtune.attention_fp8(q8, k8, v8, causal=causal, **descales)}
    for name, cfg in {"fp8-triton": triton_cfg, **gluon}.items():
        # cfg: {mask: FwdConfig} (the Triton default may differ by mask)
        runners[name] = (lambda causal, c=cfg: flashtune.attention_fp8(
            q8, k8, v8, causal=causal, config=c["causal" if causal else "full"], **descales))
    return runners


def check_and_time(args, runners: dict, masks, flops_of) -> tuple[dict, dict, dict]:
    """Check every runner per mask against cuDNN bf16, then time those that pass in
    interleaved rounds. Returns ({mask: summary}, {mask: {runner: check}}, {mask: {runner:
    [ms per round]}})."""
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    results, checks, rounds = {}, {}, {}
    for mask in masks:
        causal = mask == "causal"
        checks[mask] = {}
        ok = {}
        ref = runners["cudnn-bf16"](causal)
        checks[mask]["mean_abs_o"] = ref.float().abs().mean().item()
        for name, run in runners.items():
            try:
                o = run(causal)
                torch.cuda.synchronize()
                rel = harness._rel(o, ref)
            except Exception as e:  # noqa: BLE001 - a config that does not compile or run: report it
                checks[mask][name] = {"error": _first_line(e)}
                print(f"  {mask} {name}: FAILED {_first_line(e)}", flush=True)
                continue
            checks[mask][name] = {"rel_vs_cudnn_bf16": rel}
            if not rel < args.max_rel:
                checks[mask][name]["error"] = f"relative error vs cuDNN bf16 {rel:.3g} >= {args.max_rel}"
                print(f"  {mask} {name}: WRONG, relative error vs cuDNN bf16 {rel:.3g}", flush=True)
                continue
            ok[name] = run
            del o
        del ref
        print(f"# {mask}: {len(ok)} of {len(runners)} runners pass the check; timing {args.rounds}+ rounds",
              flush=True)

        def time_one(run, _mask, c=causal):
            return harness.time_ms(lambda: run(c), device, quick=args.quick)[0]

        times, failed = harness.time_rounds(ok, [mask], args.rounds, time_one, max_rounds=args.max_rounds)
        for (name, _), why in failed.items():
            checks[mask][name] = {"error": why}
        rounds[mask] = {name: ms for (name, _), ms in times.items()}
        ms = {name: harness.median(v) for name, v in rounds[mask].items()}
        results[mask] = summarize(ms, flops_of(causal))
        print(format_table(mask, results[mask]), flush=True)
    return results, checks, rounds


def write(args, payload: dict) -> None:
    harness.write_json(args.out, payload)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/fp8_sweep.py needs a CUDA GPU (torch.cuda.is_available() is False); "
              "the Gluon fp8 forward runs on sm_90 only", file=sys.stderr)
        return 2
    kern = harness.kernels()
    ConfigError, FwdConfig, default_config = kern.ConfigError, kern.FwdConfig, kern.default_config

    env = harness.environment(torch.device("cuda", torch.cuda.current_device()))
    print(harness.environment_line(env), flush=True)
    b, h, n, d = args.shape
    fp8_dtype = getattr(torch, FP8_TYPES[args.fp8])
    dev = torch.device("cuda", torch.cuda.current_device())
    # what each baseline serves: flashtune bf16's and attention_fp8's defaults for this call
    # (their long bucket from N=4096), the Triton fp8 default
    served = {mask: {name: default_config("fwd", d, dtype, dev, causal=mask == "causal", seq_q=n).label()
                     for name, dtype in (("flashtune-bf16", torch.bfloat16), ("fp8-default", fp8_dtype))}
              for mask in args.masks}
    triton_cfg = {mask: harness.kernels().as_triton(FwdConfig(64, 128, 4, 2, family=1), d, fp8_dtype, dev, mask == "causal")
                  for mask in MASKS}
    for mask in args.masks:
        served[mask]["fp8-triton"] = triton_cfg[mask].label()
    print(f"# served: {json.dumps(served)}", flush=True)
    gluon, skipped = {}, {}
    for cfg in gluon_configs(args):
        try:
            cfg.validate(d, fp8_dtype, dev)
        except ConfigError as e:
            skipped[cfg.label()] = _first_line(e)
            print(f"# skip {cfg.label()}: {_first_line(e)}", flush=True)
            continue
        gluon[cfg.label()] = {mask: cfg for mask in MASKS}
    payload = {"environment": env, "args": vars(args), "shape": {"B": b, "H": h, "N": n, "D": d, "fp8": args.fp8},
               "served": served, "configs": {name: c["full"].to_dict() for name, c in gluon.items()},
               "skipped": skipped}
    write(args, payload)

    bf16, fp8, descales = make_inputs(b, h, n, d, fp8_dtype)
    runners = make_runners(bf16, fp8, descales, triton_cfg, gluon)
    results, checks, rounds = check_and_time(args, runners, args.masks,
                                             lambda causal: fwd_flops(b, h, n, d, causal))
    payload.update(results=results, checks=checks, rounds_ms=rounds, verdict=verdict(results))
    write(args, payload)
    v = payload["verdict"]
    for mask, best in v["best"].items():
        print(f"# best Gluon fp8 {mask}: {best['runner']} {harness.fmt(best['x_bf16'], '.3f')}x flashtune bf16",
              flush=True)
    if "best_on_all_masks" in v:
        print(f"# best on every mask: {v['best_on_all_masks']['runner']}, worst mask "
              f"{v['best_on_all_masks']['worst_x_bf16']:.3f}x flashtune bf16: goal >= {GOAL} "
              f"{'met' if v['met'] else 'MISSED'}", flush=True)
    del bf16, fp8, runners
    torch.cuda.empty_cache()

    if args.extra_seq:
        picks = {r["runner"] for r in v["best"].values() if r["runner"]}
        if "best_on_all_masks" in v:
            picks.add(v["best_on_all_masks"]["runner"])
        payload["extra"] = {}
        for n2 in args.extra_seq:
            b2, h2 = harness.grid_shape(d, n2)
            print(f"# extra: B{b2} H{h2} N{n2} D{d}, {sorted(picks)}", flush=True)
            bf16, fp8, descales = make_inputs(b2, h2, n2, d, fp8_dtype)
            runners = make_runners(bf16, fp8, descales, triton_cfg, {name: gluon[name] for name in sorted(picks)})
            res, chk, rnd = check_and_time(args, runners, args.masks,
                                           lambda causal, b2=b2, h2=h2, n2=n2: fwd_flops(b2, h2, n2, d, causal))
            payload["extra"][f"B{b2} H{h2} N{n2} D{d}"] = {"results": res, "checks": chk, "rounds_ms": rnd}
            write(args, payload)
            del bf16, fp8, runners
            torch.cuda.empty_cache()
    if args.out:
        print(f"# wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
