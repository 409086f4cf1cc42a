"""fp32 attention: flashtune's dot precisions against each other and SDPA's fp32 math.

For fp32 inputs each precision ("tf32", "tf32x3", "ieee") is timed (do_bench median,
forward and backward) and its error against a float64 reference is compared with the
error of SDPA's math backend in fp32 (true fp32 matmuls): the default under torch's
"highest" matmul precision must stay within 2x of it (issue 12), and be the faster of
the fp32-accurate ones.

    python benchmarks/fp32_precision.py --out fp32.json
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=4, default=[2, 16, 2048, 128], metavar=("B", "H", "N", "D"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import torch
    import triton

    from flashtune.kernels import attention, reference_attention

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    B, H, N, D = args.shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", generator=gen) for _ in range(4))
    leaves64 = [x[:1, :2].double().requires_grad_() for x in (q, k, v)]
    o64, _ = reference_attention(*leaves64, causal=args.causal, dtype=torch.float64)
    truth = (o64, *torch.autograd.grad(o64, leaves64, do[:1, :2].double()))

    def errors(fn):
        leaves = [x[:1, :2].clone().requires_grad_() for x in (q, k, v)]
        o = fn(*leaves)
        got = (o, *torch.autograd.grad(o, leaves, do[:1, :2]))
        return {n: (a.double() - t).abs().max().item() for n, a, t in zip(("o", "dq", "dk", "dv"), got, truth)}

    matmul = torch.backends.cuda.matmul
    setting = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, setting)
    setattr(matmul, setting, "ieee" if setting == "fp32_precision" else False)
    try:
        base = errors(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal))
    finally:
        setattr(matmul, setting, before)
    flops = 4.0 * B * H * N * N * D / (2 if args.causal else 1)
    rows = {"sdpa-math-fp32": {"err": base}}
    print(f"B,H,N,D={args.shape} causal={args.causal}; SDPA math fp32 error: "
          + " ".join(f"{n}={e:.2e}" for n, e in base.items()))
    for precision in ("tf32", "tf32x3", "ieee"):
        def run(q, k, v, precision=precision):
            return attention(q, k, v, causal=args.causal, fp32_precision=precision)
        err = errors(run)
        with torch.no_grad():
            fwd = triton.testing.do_bench(lambda: run(q, k, v), return_mode="median")
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = run(*leaves)
        bwd = triton.testing.do_bench(lambda: o.backward(do, retain_graph=True), grad_to_none=leaves,
                                      return_mode="median")
        rows[precision] = {"err": err, "ratio": {n: err[n] / base[n] for n in err}, "fwd_ms": fwd, "bwd_ms": bwd,
                           "fwd_tflops": flops / fwd / 1e9, "bwd_tflops": 2.5 * flops / bwd / 1e9}
        r = rows[precision]
        print(f"{precision:<7} fwd {r['fwd_tflops']:6.1f} TFLOPS, bwd {r['bwd_tflops']:6.1f} TFLOPS; "
              "error / SDPA fp32: "
              + " ".join(f"{n}={x:.2f}" for n, x in r["ratio"].items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
