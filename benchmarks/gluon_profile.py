"""Where the Gluon kernels' time goes, from their own instrumentation (kernels/gluon/trace.py),
beside their speed against cuDNN in the same process: the forward, and the backward's dK/dV
kernel.

    python benchmarks/gluon_profile.py                               # three D=128 grid rows
    python benchmarks/gluon_profile.py --rows grid,shapes --configs default,persistent \
        --out prof.json --traces traces/                             # every D=64/128 row
    python benchmarks/gluon_profile.py --pass bwd --bwd-configs f1,fused,late

For every row (of head dim 64 or 128, more than one query) and config: the untraced call, the
traced call and cuDNN are timed in interleaved rounds (GPU time, the launches' host work hidden:
--timer cushioned, benchmarks/harness.py); the traced call's o and LSE must equal the
untraced call's bit for bit (else the row says so and is not read); then one traced call's
trace is read: the consumers' time split into waiting for Q, K, V, the other consumer's turn,
the S and P V wgmmas, the softmax and the rest, the producer's into waiting for free slots and
issuing, and the SMs' time over the kernel's span into busy, gaps between tiles, head and tail.
"traced/untraced" is the instrumentation's cost (1.03: the traced call takes 3 % longer);
"TC" is the untraced call's matmul rate over the H100/H200's dense 16-bit peak (989 TFLOP/s).

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
import math
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

PEAK_TFLOPS = 989.0  # H100/H200 SXM, dense bf16/fp16 wgmma
ROWS = "grid-d128-1024,grid-d128-4096,grid-d128-8192"
VARIANTS = {"default": {}, "persistent": {"PERSISTENT": 1}, "otile": {"PERSISTENT": 1, "O_TILE": 1},
            "seq": {"OVERLAP": 0}, "b2": {"NUM_BUFFERS": 2}, "nopp": {"PINGPONG": 0},
            "n64": {"PERSISTENT": 1, "O_TILE": 1, "BLOCK_N": 64, "NUM_BUFFERS": 3}}
BWD_VARIANTS = {"f1": {}, "fused": {"DQ_FUSED": 1}, "late": {"DQ_FUSED": 2},
                "fused-first": {"DQ_FUSED": 1, "DQ_FIRST": 1}, "late-first": {"DQ_FUSED": 2, "DQ_FIRST": 1}}
MAX_SAVED_BYTES = 64 << 20


def _report(row: dict, acc, traces, trace: np.ndarray, stem: str) -> None:
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


def _timed(fns: dict, args) -> dict:
    """Each callable's median ms over interleaved rounds."""
    device = torch.device("cuda", torch.cuda.current_device())
    times, failed = harness.time_rounds(fns, ["-"], args.rounds, lambda fn, _: harness.time_ms(
        fn, device, args.timer, quick=args.quick)[0], max_rounds=args.max_rounds)
    if failed:
        raise RuntimeError("; ".join(f"{name}: {why}" for (name, _), why in failed.items()))
    return {name: harness.median(times[name, "-"]) for name in fns}


def profile_forward(q, k, v, causal, scale, variant, sms, args, traces, base: dict) -> dict:
    g = harness.gluon()
    default_gluon_config, gluon_attention_forward = g.forward.default_gluon_config, g.forward.gluon_attention_forward
    D = q.shape[-1]
    cfg = dataclasses.replace(default_gluon_config(D), **VARIANTS[variant])
    buf = g.forward.trace_buffer(q, k, cfg)

    def plain():
        return gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale)

    def traced():
        return gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale, trace=buf)

    cudnn = harness.pass_call(harness.anchor("cudnn", q.device), "fwd", q, k, v, None, causal)

    row = dict(base, pass_="fwd", variant=variant, label=cfg.short(), config=cfg.to_dict())
    o, lse = plain()
    buf.zero_()
    o_t, lse_t = traced()
    torch.cuda.synchronize()
    if not (torch.equal(o, o_t) and torch.equal(lse, lse_t)):
        return dict(row, error="the traced call's output differs from the untraced call's")
    trace = buf.cpu().numpy()
    acc = g.trace.account(trace, cfg.OVERLAP, sms=sms)
    ms = _timed({"gluon": plain, "traced": traced, "cudnn": cudnn}, args)
    row.update(ms=ms, account=acc.to_dict(), **{"gluon/cudnn": ms["cudnn"] / ms["gluon"],
                                                "traced/untraced": ms["traced"] / ms["gluon"],
                                                "tc": base["flops"] / ms["gluon"] / 1e9 / PEAK_TFLOPS})
    _report(row, acc, traces, trace, f"{base['name']}-{'causal' if causal else 'full'}-fwd-{variant}")
    return row


def profile_backward(q, k, v, causal, scale, variant, sms, args, traces, base: dict) -> dict:
    g = harness.gluon()
    default_gluon_config, gluon_attention_forward = g.forward.default_gluon_config, g.forward.gluon_attention_forward
    default_gluon_bwd_config = g.backward.default_gluon_bwd_config
    gluon_attention_backward = g.backward.gluon_attention_backward
    D = q.shape[-1]
    cfg = dataclasses.replace(default_gluon_bwd_config(D), **BWD_VARIANTS[variant])
    do = torch.randn_like(q)
    o, lse2 = gluon_attention_forward(q, k, v, default_gluon_config(D), causal=causal, sm_scale=scale)
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
    acc = g.trace.account(trace, 0, sms=sms, layout=g.trace.BACKWARD)
    cudnn = harness.pass_call(harness.anchor("cudnn", q.device), "bwd", q, k, v, do, causal)
    ms = _timed({"gluon": plain, "traced": traced, "cudnn": cudnn}, args)
    flops = base["flops"] * 10 / 4  # five matmuls to the forward's two
    row.update(ms=ms, account=acc.to_dict(), **{"gluon/cudnn": ms["cudnn"] / ms["gluon"],
                                                "traced/untraced": ms["traced"] / ms["gluon"],
                                                "tc": flops / ms["gluon"] / 1e9 / PEAK_TFLOPS,
                                                "dkdv_share": acc.span_us / 1e3 / ms["traced"]})
    _report(row, acc, traces, trace, f"{base['name']}-{'causal' if causal else 'full'}-bwd-{variant}")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_row_args(ap, rows=ROWS)
    ap.add_argument("--configs", default="default", help=f"forward, comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--bwd-configs", default="f1,late",
                    help=f"backward, comma-separated, of {', '.join(BWD_VARIANTS)}")
    harness.add_timing_args(ap, rounds=2)
    ap.set_defaults(timer="cushioned", pass_="fwd")
    ap.add_argument("--out", metavar="FILE.json", help="write every row as JSON ('-': stdout)")
    ap.add_argument("--traces", metavar="DIR", help="keep the raw traces (.npy) here")
    args = ap.parse_args(argv)
    runs = []
    for p, names, table in (("fwd", args.configs, VARIANTS), ("bwd", args.bwd_configs, BWD_VARIANTS)):
        for v in names.split(","):
            if v not in table:
                ap.error(f"--{'configs' if p == 'fwd' else 'bwd-configs'}: {v!r} is not one of {', '.join(table)}")
            if p == args.pass_ or args.pass_ == "both":
                runs.append((p, v))
    rows = harness.rows_from_args(ap, args)
    device = harness.timing_from_args(ap, args)
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        ap.error("--device: the Gluon kernels run on an sm_90 GPU (H100/H200) only")
    env = harness.environment(device)
    print(harness.environment_line(env))
    print(f"# timer {args.timer}")
    sms = harness.kernels().sm_count(device)
    traces = pathlib.Path(args.traces) if args.traces else None
    if traces:
        traces.mkdir(parents=True, exist_ok=True)
    out = []
    for shape in rows:
        if shape.head_dim not in (64, 128) or shape.decode:
            print(f"{shape.name}: skipped (the Gluon kernels run head dims 64 and 128, more than one query)")
            continue
        q, k, v, do = harness.make_inputs(shape, device)
        base = dict(name=shape.name, B=shape.batch, Hq=shape.heads_q, Hkv=shape.heads_kv, Nq=shape.seq_q,
                    Nk=shape.seq_k, D=shape.head_dim, causal=shape.causal, flops=shape.flops("fwd"))
        for p, variant in runs:
            if p not in shape.passes:
                continue
            profile = profile_forward if p == "fwd" else profile_backward
            try:
                row = profile(q, k, v, shape.causal, 1 / math.sqrt(shape.head_dim), variant, sms, args, traces, base)
            except Exception as e:  # noqa: BLE001 - a config this row or kernel refuses: the row says so
                row = dict(base, pass_=p, variant=variant, error=harness.first_line(e))
            if "error" in row:
                print(f"{shape.name:>28} {'causal' if shape.causal else 'full':>6} {p} {variant:>10}: {row['error']}",
                      flush=True)
            out.append(row)
        del q, k, v, do
        torch.cuda.empty_cache()
    harness.write_json(args.out, {"environment": env, "timer": args.timer, "rows": out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
