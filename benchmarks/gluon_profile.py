"""Where the Gluon kernels' time goes, from their own instrumentation (kernels/kernel_trace.py),
beside their speed against cuDNN in the same process: the forward, and the backward's dK/dV
kernel.

    python benchmarks/gluon_profile.py                               # three large D=128 shapes
    python benchmarks/gluon_profile.py --grid --realistic --head-dim 128 --configs default,persistent \
        --out prof.json --traces traces/                             # the rows issue 18 counts
    python benchmarks/gluon_profile.py --pass bwd --bwd-configs f1,fused,late

For every shape and config: the untraced call, the traced call and cuDNN are timed in
interleaved rounds (triton's do_bench, median); the traced call's o and LSE must equal the
untraced call's bit for bit (else the row says so and is not read); then one traced call's
trace is read: the consumers' time split into waiting for Q, K, V, the other consumer's turn,
the S and P V wgmmas, the softmax and the rest, the producer's into waiting for free slots and
issuing, and the SMs' time over the kernel's span into busy, gaps between tiles, head and tail.
"traced/untraced" is the instrumentation's cost (1.03: the traced call takes 3 % longer);
"TC" is the untraced call's matmul rate over the H200's dense 16-bit peak (989 TFLOP/s).

Forward configs (``--configs``): default (gluon_forward.default_gluon_config), persistent (it
with PERSISTENT=1), otile (and O_TILE=1), n64 (that with 64-key blocks in 3 slots: config.family_defaults'
short causal entry), seq (OVERLAP=0), b2 (NUM_BUFFERS=2), nopp (PINGPONG=0). Backward configs
(``--bwd-configs``; ``--pass bwd``): f1 (gluon_backward.default_gluon_bwd_config: the Gluon
dK/dV kernel, Delta and dQ by the Triton kernels), fused (DQ_FUSED=1), late (DQ_FUSED=2); the
whole backward is timed (and cuDNN's, through autograd), the trace is the dK/dV kernel's, and
"dK/dV span" is that kernel's share of the traced backward's time. ``--traces DIR`` keeps each
raw trace as .npy when it is at most 64 MiB, for reading again anywhere (kernel_trace.account).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.kernels import gluon_backward, gluon_forward, kernel_trace
from flashtune.kernels.common import sm_count
from flashtune.kernels.gluon_backward import default_gluon_bwd_config, gluon_attention_backward
from flashtune.kernels.gluon_forward import default_gluon_config, gluon_attention_forward, trace_buffer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gluon_bench  # noqa: E402  (benchmarks/gluon_bench.py: shapes, rounds)
from gluon_bwd import sdpa_backward  # noqa: E402

PEAK_TFLOPS = 989.0  # H100/H200 SXM, dense bf16/fp16 wgmma
LARGE = [  # (name, B, Hq, Hkv, Nq, Nk, D, causal or None for both)
    ("4x16x4k-d128", 4, 16, 16, 4096, 4096, 128, None),
    ("2x16x8k-d128", 2, 16, 16, 8192, 8192, 128, None),
    ("8x16x1k-d128", 8, 16, 16, 1024, 1024, 128, None),
]
VARIANTS = {"default": {}, "persistent": {"PERSISTENT": 1}, "otile": {"PERSISTENT": 1, "O_TILE": 1},
            "seq": {"OVERLAP": 0}, "b2": {"NUM_BUFFERS": 2}, "nopp": {"PINGPONG": 0},
            "n64": {"PERSISTENT": 1, "O_TILE": 1, "BLOCK_N": 64, "NUM_BUFFERS": 3}}
BWD_VARIANTS = {"f1": {}, "fused": {"DQ_FUSED": 1}, "late": {"DQ_FUSED": 2},
                "fused-first": {"DQ_FUSED": 1, "DQ_FIRST": 1}, "late-first": {"DQ_FUSED": 2, "DQ_FIRST": 1}}
MAX_SAVED_BYTES = 64 << 20


def _report(row: dict, acc: kernel_trace.Account, traces, trace: np.ndarray, stem: str) -> None:
    mask = "causal" if row["causal"] else "full"
    line = (f"{row['name']:>28} {mask:>6} {row['variant']:>10} {row['label']:>20}: {row['ms']['gluon']:.3f} ms, "
            f"{row['gluon/cudnn']:.3f}x cuDNN, TC {100 * row['tc']:.1f}%, traced/untraced {row['traced/untraced']:.3f}")
    if "dkdv_share" in row:
        line += f", dK/dV span {100 * row['dkdv_share']:.0f}% of the traced backward"
    print(line, flush=True)
    for text in acc.lines():
        print(f"{'':>30}{text}")
    if traces and trace.nbytes <= MAX_SAVED_BYTES:
        np.save(traces / f"{stem}.npy", trace)


def profile_forward(q, k, v, causal, scale, variant, sms, rounds, rep, traces, base: dict, timer: str) -> dict:
    D = q.shape[-1]
    cfg = dataclasses.replace(default_gluon_config(D, causal), **VARIANTS[variant])
    buf = trace_buffer(q, k, cfg)

    def plain():
        return gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale)

    def traced():
        return gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale, trace=buf)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])

    row = dict(base, pass_="fwd", variant=variant, label=cfg.short(), config=cfg.to_dict())
    o, lse = plain()
    buf.zero_()
    o_t, lse_t = traced()
    torch.cuda.synchronize()
    if not (torch.equal(o, o_t) and torch.equal(lse, lse_t)):
        return dict(row, error="the traced call's output differs from the untraced call's")
    trace = buf.cpu().numpy()
    acc = kernel_trace.account(trace, cfg.OVERLAP, sms=sms)
    ms = gluon_bench.time_rounds({"gluon": plain, "traced": traced, "cudnn": cudnn}, rounds, rep, timer)
    row.update(ms=ms, account=acc.to_dict(), **{"gluon/cudnn": ms["cudnn"] / ms["gluon"],
                                                "traced/untraced": ms["traced"] / ms["gluon"],
                                                "tc": base["flops"] / ms["gluon"] / 1e9 / PEAK_TFLOPS})
    _report(row, acc, traces, trace, f"{base['name']}-{'causal' if causal else 'full'}-fwd-{variant}")
    return row


def profile_backward(q, k, v, causal, scale, variant, sms, rounds, rep, traces, base: dict, timer: str) -> dict:
    D = q.shape[-1]
    cfg = dataclasses.replace(default_gluon_bwd_config(D), **BWD_VARIANTS[variant])
    do = torch.randn_like(q)
    o, lse2 = gluon_attention_forward(q, k, v, default_gluon_config(D, causal), causal=causal, sm_scale=scale)
    sink: list = []

    def plain():
        return gluon_attention_backward(do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=scale)

    def traced():
        sink.clear()
        return gluon_attention_backward(do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=scale, trace=sink)

    row = dict(base, pass_="bwd", variant=variant, label=cfg.short(), config=cfg.to_dict())
    grads = plain()
    grads_t = traced()
    torch.cuda.synchronize()
    # dK and dV bit for bit (dQ's fused reduce-adds land in any order)
    if not (torch.equal(grads[1], grads_t[1]) and torch.equal(grads[2], grads_t[2])):
        return dict(row, error="the traced call's dK or dV differs from the untraced call's")
    trace = sink[0].cpu().numpy()
    acc = kernel_trace.account(trace, 0, sms=sms, layout=kernel_trace.BACKWARD)
    ms = gluon_bench.time_rounds({"gluon": plain, "traced": traced,
                                  "cudnn": sdpa_backward(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal, scale)},
                                 rounds, rep, timer)
    flops = base["flops"] * 10 / 4  # five matmuls to the forward's two
    row.update(ms=ms, account=acc.to_dict(), **{"gluon/cudnn": ms["cudnn"] / ms["gluon"],
                                                "traced/untraced": ms["traced"] / ms["gluon"],
                                                "tc": flops / ms["gluon"] / 1e9 / PEAK_TFLOPS,
                                                "dkdv_share": acc.span_us / 1e3 / ms["traced"]})
    _report(row, acc, traces, trace, f"{base['name']}-{'causal' if causal else 'full'}-bwd-{variant}")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--pass", dest="passes", default="fwd", help="fwd, bwd or fwd,bwd")
    ap.add_argument("--configs", default="default", help=f"forward, comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--bwd-configs", default="f1,late",
                    help=f"backward, comma-separated, of {', '.join(BWD_VARIANTS)}")
    ap.add_argument("--fma-softmax", choices=("default", "on", "off"), default="default",
                    help="gluon_forward.FMA_SOFTMAX for the whole run (default: as the module has it)")
    ap.add_argument("--tma-store", choices=("default", "on", "off"), default="default",
                    help="gluon_forward.TMA_STORE_O for the whole run (default: as the module has it)")
    ap.add_argument("--persistent-order", choices=("default", "strided", "snake"), default="default",
                    help="gluon_forward.PERSISTENT_SNAKE for the whole run (default: as the module has it)")
    ap.add_argument("--stats", choices=("default", "compact", "wide"), default="default",
                    help="gluon_backward.COMPACT_STATS for the whole run (default: as the module has it)")
    ap.add_argument("--switch", action="append", default=[], metavar="NAME=V",
                    help="one of gluon_backward's switches (CONSUMER_TURNS, COMPACT_STATS, ...) at this integer value "
                         "for the whole run (repeatable; default: as the module has them)")
    ap.add_argument("--grid", action="store_true", help="the standard grid, D 64 and 128, N 512..16k")
    ap.add_argument("--realistic", action="store_true", help="SHAPES.md's rows with D 64/128 and Nq >= 1024")
    ap.add_argument("--head-dim", type=int, choices=(64, 128), help="only the shapes of this head dim")
    ap.add_argument("--rows", metavar="NAMES", help="only the shapes of these names (comma-separated)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rep", type=int, default=50, help="ms of calls per runner and round")
    gluon_bench.add_timer_args(ap, host_time=False)
    ap.add_argument("--out", metavar="FILE.json")
    ap.add_argument("--traces", metavar="DIR", help="keep the raw traces (.npy) here")
    args = ap.parse_args()
    passes = args.passes.split(",")
    runs = []
    for p, names, table in (("fwd", args.configs, VARIANTS), ("bwd", args.bwd_configs, BWD_VARIANTS)):
        for v in names.split(","):
            if v not in table:
                ap.error(f"--{'configs' if p == 'fwd' else 'bwd-configs'}: {v!r} is not one of {', '.join(table)}")
            if p in passes:
                runs.append((p, v))
    if not runs or set(passes) - {"fwd", "bwd"}:
        ap.error(f"--pass: expected fwd, bwd or fwd,bwd, got {args.passes!r}")
    dtype, env = gluon_bench.sm90_run(args.dtype)
    if args.fma_softmax != "default":
        gluon_forward.FMA_SOFTMAX = args.fma_softmax == "on"
    if args.tma_store != "default":
        gluon_forward.TMA_STORE_O = args.tma_store == "on"
    if args.persistent_order != "default":
        gluon_forward.PERSISTENT_SNAKE = args.persistent_order == "snake"
    if args.stats != "default":
        gluon_backward.COMPACT_STATS = args.stats == "compact"
    combos = gluon_bench.switch_values(ap, gluon_backward, args.switch)
    if len(combos) != 1:
        ap.error("--switch: one value per switch here")
    for name, value in combos[0].items():
        setattr(gluon_backward, name, value)
    env += (f", timer {args.timer}, FMA_SOFTMAX {gluon_forward.FMA_SOFTMAX}, "
            f"TMA_STORE_O {gluon_forward.TMA_STORE_O}, PERSISTENT_SNAKE {gluon_forward.PERSISTENT_SNAKE}, "
            f"COMPACT_STATS {gluon_backward.COMPACT_STATS}, CONSUMER_TURNS {gluon_backward.CONSUMER_TURNS}")
    sms = sm_count(torch.device("cuda"))
    traces = pathlib.Path(args.traces) if args.traces else None
    if traces:
        traces.mkdir(parents=True, exist_ok=True)
    wanted = set(args.rows.split(",")) if args.rows else None
    rows = []
    for name, B, Hq, Hkv, Nq, Nk, D, causal_of in gluon_bench.shapes(args, LARGE):
        if (wanted is not None and name not in wanted) or (args.head_dim and D != args.head_dim):
            continue
        q, k, v = gluon_bench.row_inputs(B, Hq, Hkv, Nq, Nk, D, dtype)
        scale = 1 / math.sqrt(D)
        for causal in ((False, True) if causal_of is None else (causal_of,)):
            base = dict(name=name, B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
                        flops=4 * B * Hq * Nq * Nk * D / (2 if causal else 1))
            for p, variant in runs:
                profile = profile_forward if p == "fwd" else profile_backward
                row = profile(q, k, v, causal, scale, variant, sms, args.rounds, args.rep, traces, base, args.timer)
                if "error" in row:
                    print(f"{name:>28} {'causal' if causal else 'full':>6} {p} {variant:>10}: {row['error']}",
                          flush=True)
                rows.append(row)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"env": env, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
