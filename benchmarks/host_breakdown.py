"""flashtune's own host time per call, without the GPU: every Triton kernel's launch
replaced by a no-op, so what is left is flashtune's Python (input checks, the dispatcher's
lookup, schedules, allocations, argument lists) and torch's autograd machinery.

Runs on the CPU under the Triton interpreter's module setup (no kernel ever runs). The
figures are host costs of this machine's CPU, to find where flashtune's microseconds go
(issue 14); the GPU launch cost of triton's launcher comes on top, measured on the GPU with
benchmarks/dispatch_overhead.py.

    python benchmarks/host_breakdown.py [--seq-len 128] [--head-dim 64] [--iters 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flashtune  # noqa: E402
from flashtune.kernels import attention, attention_backward, attention_forward, default_config  # noqa: E402

from autograd_floor import EmptyAttentionFunction  # noqa: E402  (benchmarks/)


def _no_launches() -> None:
    import flashtune.kernels.backward as bw
    import flashtune.kernels.decode as dc
    import flashtune.kernels.forward as fw

    for module in (fw, bw, dc):
        for name in dir(module):
            if name.endswith("_kernel"):
                getattr(module, name).run = lambda *a, **kw: None


def per_call_us(fn, iters: int, repeats: int = 5) -> float:
    for _ in range(20):
        fn()
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        rounds.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=1000)
    args = ap.parse_args()
    _no_launches()
    n, d = args.seq_len, args.head_dim
    q, k, v = (torch.randn(1, 1, n, d, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 1, n, d)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    fwd_cfg = default_config("fwd", d, q.dtype, "cpu")
    bwd_cfg = default_config("bwd", d, q.dtype, "cpu")
    o, lse2 = attention_forward(qd, kd, vd, fwd_cfg, causal=False, sm_scale=d ** -0.5)
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
        "attention_forward (launcher)": lambda: attention_forward(qd, kd, vd, fwd_cfg, causal=False,
                                                                   sm_scale=d ** -0.5),
        "attention_backward (launchers)": lambda: attention_backward(do, qd, kd, vd, o, lse2, bwd_cfg, causal=False,
                                                                     sm_scale=d ** -0.5),
        "flashtune.attention, no grad": no_grad(lambda: attention(q, k, v)),
        "drop-in, no grad": no_grad(lambda: tuned(q, k, v)),
        "flashtune.attention, fwd+bwd": train(attention),
        "drop-in, fwd+bwd": train(tuned),
        "torch.autograd.grad of q + k + v (floor)": train(lambda q, k, v: q + k + v),
        # a Python autograd node of flashtune's shape that does no work: the floor of any
        # attention defined in Python (benchmarks/host_profile_gpu.py measures it on the GPU)
        "empty Python autograd.Function (floor)": train(EmptyAttentionFunction.apply),
    }
    print(f"host us per call, kernels not launched; B=1 H=1 N={n} D={d} fp32 on the CPU")
    for name, fn in rows.items():
        print(f"{name:44s} {per_call_us(fn, args.iters):8.1f}")


if __name__ == "__main__":
    main()
