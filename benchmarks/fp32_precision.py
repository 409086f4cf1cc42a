"""fp32 attention: flashtune's dot precisions against each other and SDPA's fp32 math.

For fp32 inputs each precision ("tf32", "tf32x3", "ieee") and torch SDPA at its own setting are
timed (forward, and the backward alone) and its error against a float64 reference (batch 0, head 0) is compared with the error of
SDPA's math backend in fp32 (true fp32 matmuls): the default under torch's "highest" matmul
precision must stay within 2x of it, and be the faster of the fp32-accurate ones.

    python benchmarks/fp32_precision.py --out fp32.json
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

harness.use_interpreter_for_cpu()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=4, default=[2, 16, 2048, 128], metavar=("B", "H", "N", "D"))
    ap.add_argument("--causal", action="store_true")
    harness.add_timing_args(ap, rounds=3)
    ap.add_argument("--out", metavar="FILE.json", help="write the figures as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    device = harness.timing_from_args(ap, args)
    import torch

    import flashtune

    B, H, N, D = args.shape
    shape = harness.Shape(B, H, H, N, N, D, args.causal, "float32", harness.PASSES, "fp32")
    q, k, v, do = harness.make_inputs(shape, device)
    truth = harness.reference(q, k, v, do, args.causal, grads=True, dtype=torch.float64)

    def errors(run) -> dict:
        got = harness.reference_slice(harness.outputs(run, q, k, v, do, args.causal, True), q, k)
        return {n: (a.double() - t).abs().max().item() for n, a, t in zip(harness.NAMES, got, truth)}

    matmul = torch.backends.cuda.matmul
    setting = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, setting)
    setattr(matmul, setting, "ieee" if setting == "fp32_precision" else False)
    try:
        base = errors(harness.anchor("math", device))
    finally:
        setattr(matmul, setting, before)
    env = harness.environment(device)
    print(harness.environment_line(env))
    print(f"B,H,N,D={args.shape} causal={args.causal}; SDPA math fp32 error: "
          + " ".join(f"{n}={e:.2e}" for n, e in base.items()))
    runs = {p: (lambda q, k, v, causal, p=p: flashtune.attention(q, k, v, causal=causal, fp32_precision=p))
            for p in ("tf32", "tf32x3", "ieee")}
    # torch SDPA at torch's own setting (its memory-efficient backend for fp32): the speed to beat
    runs["sdpa"] = lambda q, k, v, causal: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    rows = {"sdpa-math-fp32": {"err": base}}
    for name, run in runs.items():
        err = errors(run)
        rows[name] = {"err": err, "ratio": {n: harness.ratio(err[n], base[n]) for n in err}}
    times, failed = harness.time_rounds(runs, list(harness.PASSES), args.rounds, lambda run, p: harness.time_ms(
        harness.pass_call(run, p, q, k, v, do, args.causal), device, args.timer, quick=args.quick)[0],
        max_rounds=args.max_rounds)
    for name, r in rows.items():
        if name not in runs:
            continue
        for p in harness.PASSES:
            r[f"{p}_ms"] = harness.median(times[name, p])
            r[f"{p}_tflops"] = harness.tflops(shape.flops(p), r[f"{p}_ms"])
        if name != "sdpa":
            r["speed_vs_sdpa"] = {p: harness.ratio(harness.median(times["sdpa", p]), r[f"{p}_ms"])
                                  for p in harness.PASSES}
        print(f"{name:<7} fwd {harness.fmt(r['fwd_tflops'], '6.1f')} TFLOPS, bwd {harness.fmt(r['bwd_tflops'], '6.1f')}"
              " TFLOPS; error / SDPA fp32: " + " ".join(f"{n}={harness.fmt(x, '.2f')}" for n, x in r["ratio"].items())
              + ("".join(f"; {p} {harness.fmt(x, '.2f')}x SDPA" for p, x in r.get("speed_vs_sdpa", {}).items())),
              flush=True)
    for (name, p), why in failed.items():
        print(f"  {name} {p}: {why}")
    harness.write_json(args.out, {"environment": env, "args": vars(args), "rows": rows})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
