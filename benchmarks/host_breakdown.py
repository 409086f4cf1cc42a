"""flashtune's own host time per call, without the GPU: every Triton kernel's launch
replaced by a no-op, so what is left is flashtune's Python (input checks, the dispatcher's
lookup, schedules, allocations, argument lists) and torch's autograd machinery.

Runs on the CPU under the Triton interpreter's module setup (no kernel ever runs). The
figures are host costs of this machine's CPU, to find where flashtune's microseconds go;
the GPU launch cost of triton's launcher comes on top, measured on the GPU with
benchmarks/dispatch_overhead.py. Two floors are timed beside flashtune's paths: autograd of
a sum, and a Python autograd.Function of flashtune's shape that does no work.

    python benchmarks/host_breakdown.py [--seq-len 128] [--head-dim 64] [--iters 1000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

os.environ.setdefault("TRITON_INTERPRET", "1")


def no_launches() -> None:
    """Every Triton kernel of flashtune's launch a no-op (their modules' ``*_kernel`` functions)."""
    kern = harness.kernels()
    for module in (kern.forward_module, kern.backward_module, kern.decode_module):
        for name in dir(module):
            if name.endswith("_kernel"):
                getattr(module, name).run = lambda *a, **kw: None


def empty_attention_function():
    """An autograd.Function of flashtune's shape (q, k, v saved, one output, three gradients) that
    only allocates: the floor of any attention defined in Python."""
    import torch

    class EmptyAttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, do):
            q, k, v = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    return EmptyAttentionFunction


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--out", metavar="FILE.json", help="write the figures as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.seq_len < 1 or args.head_dim < 1:
        ap.error("--iters, --seq-len, --head-dim: expected positive integers")
    import torch

    import flashtune

    kern = harness.kernels()
    no_launches()
    n, d = args.seq_len, args.head_dim
    q, k, v = (torch.randn(1, 1, n, d, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 1, n, d)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    fwd_cfg = kern.default_config("fwd", d, q.dtype, "cpu")
    bwd_cfg = kern.default_config("bwd", d, q.dtype, "cpu")
    o, lse2 = kern.attention_forward(qd, kd, vd, fwd_cfg, causal=False, sm_scale=d ** -0.5)
    empty = tempfile.TemporaryDirectory()  # an empty store: the drop-in serves the heuristic defaults
    tuned = flashtune.get_tuned_attention(os.path.join(empty.name, "none.db"), device="cpu")

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn()
        return run

    def train(fn):
        return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    rows = {
        "attention_forward (launcher)": lambda: kern.attention_forward(qd, kd, vd, fwd_cfg, causal=False,
                                                                        sm_scale=d ** -0.5),
        "attention_backward (launchers)": lambda: kern.attention_backward(do, qd, kd, vd, o, lse2, bwd_cfg,
                                                                          causal=False, sm_scale=d ** -0.5),
        "flashtune.attention, no grad": no_grad(lambda: flashtune.attention(q, k, v)),
        "drop-in, no grad": no_grad(lambda: tuned(q, k, v)),
        "flashtune.attention, fwd+bwd": train(flashtune.attention),
        "drop-in, fwd+bwd": train(tuned),
        "torch.autograd.grad of q + k + v (floor)": train(lambda q, k, v: q + k + v),
        "empty Python autograd.Function (floor)": train(empty_attention_function().apply),
    }
    print(f"host us per call, kernels not launched; B=1 H=1 N={n} D={d} fp32 on the CPU")
    figures = {}
    for name, fn in rows.items():
        figures[name] = harness.host_us_per_call(fn, args.iters)
        print(f"{name:44s} {figures[name]:8.1f}")
    harness.write_json(args.out, {"environment": harness.environment("cpu"), "args": vars(args),
                                  "us_per_call": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
