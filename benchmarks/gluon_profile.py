"""Where the Gluon forward's time goes, from the kernel's own instrumentation
(kernels/kernel_trace.py), beside its speed against cuDNN in the same process.

    python benchmarks/gluon_profile.py                               # three large D=128 shapes
    python benchmarks/gluon_profile.py --grid --realistic --head-dim 128 --configs default,persistent \
        --out prof.json --traces traces/                             # the rows issue 18 counts

For every shape and config: the untraced call, the traced call and cuDNN are timed in
interleaved rounds (triton's do_bench, median); the traced call's o and LSE must equal the
untraced call's bit for bit (else the row says so and is not read); then one traced call's
trace is read: the consumers' time split into waiting for Q, K, V, the other consumer's turn,
the S and P V wgmmas, the softmax and the rest, the producer's into waiting for free slots and
issuing, and the SMs' time over the kernel's span into busy, gaps between tiles, head and tail.
"traced/untraced" is the instrumentation's cost (1.03: the traced call takes 3 % longer);
"TC" is the untraced call's matmul rate over the H200's dense 16-bit peak (989 TFLOP/s).

Configs: default (gluon_forward.default_gluon_config), persistent (it with PERSISTENT=1), seq
(OVERLAP=0), b2 (NUM_BUFFERS=2), nopp (PINGPONG=0). ``--traces DIR`` keeps each raw trace as
.npy when it is at most 64 MiB, for reading again anywhere (kernel_trace.account).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.kernels import kernel_trace
from flashtune.kernels.common import sm_count
from flashtune.kernels.gluon_forward import default_gluon_config, gluon_attention_forward, trace_buffer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gluon_bench  # noqa: E402  (benchmarks/gluon_bench.py: shapes, rounds)

PEAK_TFLOPS = 989.0  # H100/H200 SXM, dense bf16/fp16 wgmma
LARGE = [  # (name, B, Hq, Hkv, Nq, Nk, D, causal or None for both)
    ("4x16x4k-d128", 4, 16, 16, 4096, 4096, 128, None),
    ("2x16x8k-d128", 2, 16, 16, 8192, 8192, 128, None),
    ("8x16x1k-d128", 8, 16, 16, 1024, 1024, 128, None),
]
VARIANTS = {"default": {}, "persistent": {"PERSISTENT": 1}, "seq": {"OVERLAP": 0}, "b2": {"NUM_BUFFERS": 2},
            "nopp": {"PINGPONG": 0}}
MAX_SAVED_BYTES = 64 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--configs", default="default", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--grid", action="store_true", help="the standard grid, D 64 and 128, N 512..16k")
    ap.add_argument("--realistic", action="store_true", help="SHAPES.md's rows with D 64/128 and Nq >= 1024")
    ap.add_argument("--head-dim", type=int, choices=(64, 128), help="only the shapes of this head dim")
    ap.add_argument("--rows", metavar="NAMES", help="only the shapes of these names (comma-separated)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rep", type=int, default=50, help="do_bench rep (ms)")
    ap.add_argument("--out", metavar="FILE.json")
    ap.add_argument("--traces", metavar="DIR", help="keep the raw traces (.npy) here")
    args = ap.parse_args()
    variants = args.configs.split(",")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"--configs: {v!r} is not one of {', '.join(VARIANTS)}")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("needs an sm_90 GPU (H100/H200)")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    env = (f"{datetime.date.today()} {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
           f"{triton.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, {args.dtype}")
    print(env)
    sms = sm_count(torch.device("cuda"))
    traces = pathlib.Path(args.traces) if args.traces else None
    if traces:
        traces.mkdir(parents=True, exist_ok=True)
    wanted = set(args.rows.split(",")) if args.rows else None
    rows = []
    for name, B, Hq, Hkv, Nq, Nk, D, causal_of in gluon_bench.shapes(args, LARGE):
        if (wanted is not None and name not in wanted) or (args.head_dim and D != args.head_dim):
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        scale = 1 / math.sqrt(D)
        for causal in ((False, True) if causal_of is None else (causal_of,)):
            flops = 4 * B * Hq * Nq * Nk * D / (2 if causal else 1)
            mask = "causal" if causal else "full"

            def cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                          enable_gqa=Hq != Hkv)

            for variant in variants:
                cfg = dataclasses.replace(default_gluon_config(D, causal), **VARIANTS[variant])
                buf = trace_buffer(q, k, cfg)

                def plain(cfg=cfg):
                    return gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale)

                def traced(cfg=cfg, buf=buf):
                    return gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale, trace=buf)

                row = dict(name=name, B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal, variant=variant,
                           config=cfg.to_dict())
                o, lse = plain()
                buf.zero_()
                o_t, lse_t = traced()
                torch.cuda.synchronize()
                if not (torch.equal(o, o_t) and torch.equal(lse, lse_t)):
                    row["error"] = "the traced call's output differs from the untraced call's"
                    print(f"{name:>28} {mask:>6} {variant:>10}: {row['error']}", flush=True)
                    rows.append(row)
                    continue
                trace = buf.cpu().numpy()
                acc = kernel_trace.account(trace, cfg.OVERLAP, sms=sms)
                if traces and trace.nbytes <= MAX_SAVED_BYTES:
                    np.save(traces / f"{name}-{mask}-{variant}.npy", trace)
                ms = gluon_bench.time_rounds({"gluon": plain, "traced": traced, "cudnn": cudnn}, args.rounds,
                                             args.rep)
                row.update(ms=ms, account=acc.to_dict(), **{
                    "gluon/cudnn": ms["cudnn"] / ms["gluon"], "traced/untraced": ms["traced"] / ms["gluon"],
                    "tc": flops / ms["gluon"] / 1e9 / PEAK_TFLOPS})
                rows.append(row)
                print(f"{name:>28} {mask:>6} {variant:>10} {cfg.short():>20}: {ms['gluon']:.3f} ms, "
                      f"{row['gluon/cudnn']:.3f}x cuDNN, TC {100 * row['tc']:.1f}%, traced/untraced "
                      f"{row['traced/untraced']:.3f}", flush=True)
                for line in acc.lines():
                    print(f"{'':>30}{line}")
                del buf
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"env": env, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
