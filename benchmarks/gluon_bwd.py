"""Time the Gluon backward (kernels/gluon_backward.py: Gluon dK/dV + Triton dQ) against
flashtune's Triton backward (its heuristic default config), SDPA's cuDNN backend and SDPA's
FlashAttention-2 backend on an H100/H200, in one process; print the ratios and, with --out,
write them as JSON.

    python benchmarks/gluon_bwd.py                     # three large shapes
    python benchmarks/gluon_bwd.py --grid --realistic  # the standard grid (D 64/128) and the
                                                       # compute-bound rows of SHAPES.md
    python benchmarks/gluon_bwd.py --configs all       # the Gluon default and its neighbours
    python benchmarks/gluon_bwd.py --stats both        # the row statistics compact and wide
    python benchmarks/gluon_bwd.py --switch CONSUMER_TURNS=0,1 --switch COMPACT_STATS=0,1
                                                       # the kernel module's switches, every combination
    python benchmarks/gluon_bwd.py --dq-first both     # the fused dQ runners with DQ_FIRST 0 and 1
    python benchmarks/gluon_bwd.py --gluon fused --buffers 2,3   # the fused runners with 2 and 3 Q/dO slots
    python benchmarks/gluon_bwd.py --gluon fused --persistent both  # ... one CTA per tile and persistent
    python benchmarks/gluon_bwd.py --rows gemma2-d256-train-4k --prefetch all  # a D=256 row: the D=256 kernel's
                                                       # runners, its PREFETCH off, early and late

Backward only: every runner's backward from the same forward output (flashtune's from its
own forward's o and log-sum-exp; SDPA's through autograd.grad with the graph kept). For
every shape each runner's dQ, dK and dV are first checked against cuDNN's (max |diff| over
max |cuDNN's| within 4x FlashAttention-2's own relative distance from cuDNN, and at most
0.05); a runner that fails is reported and not timed. Then each is timed with
triton.testing.do_bench (median), in --rounds interleaved rounds, each figure the median of
its rounds. The Gluon backward runs its dK/dV kernel with either the Triton dQ kernel
(labels ending "/triton-dq") or the Gluon dQ kernel ("/dq-nNbB"), or computes dQ itself
("/fused-dq"). "dq" is the Triton dQ
kernel alone, so a "/triton-dq" time minus it is about the Gluon dK/dV kernel and the Delta
preprocess.
Ratios are speed ratios (1.10: 1.10x as fast). TFLOP/s counts 10 x B x Hq x Nq x Nk x D
(halved for causal): the backward's five matmuls (2.5x the forward's).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.kernels import attention_forward, default_config
from flashtune.kernels.backward import attention_backward, dq_kernel_alone
from flashtune.kernels import gluon_backward, gluon_backward_wide
from flashtune.kernels.gluon_backward import GluonBwdConfig, default_gluon_bwd_config, gluon_attention_backward

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gluon_bench  # noqa: E402  (benchmarks/gluon_bench.py: shapes, rounds, ratios, summary)

LARGE = [  # (name, B, Hq, Hkv, Nq, Nk, D, causal or None for both)
    ("4x16x4k-d128", 4, 16, 16, 4096, 4096, 128, None),
    ("4x16x4k-d64", 4, 16, 16, 4096, 4096, 64, None),
    ("2x16x8k-d128", 2, 16, 16, 8192, 8192, 128, None),
    ("2x16x4k-d256", 2, 16, 16, 4096, 4096, 256, None),  # the D=256 kernel's runners (gluon_backward_wide)
    # the same tokens at shorter lengths: where the D=256 kernel starts to beat the Triton default
    ("4x16x2k-d256", 4, 16, 16, 2048, 2048, 256, None),
    ("8x16x1k-d256", 8, 16, 16, 1024, 1024, 256, None),
    ("16x16x512-d256", 16, 16, 16, 512, 512, 256, None),
]
# --prefetch: the D=256 kernel's PREFETCH values (gluon_backward_wide: 0 off, 1 early, 2 late)
PREFETCH_VALUES = {"default": None, "off": (0, ), "on": (1, ), "late": (2, ), "both": (0, 1), "all": (0, 1, 2)}
# (the dK/dV kernel's config with the Gluon dQ kernel's fields, whether dQ is the Gluon kernel's)
NEIGHBOURS = [(GluonBwdConfig(BLOCK_M=32), False), (GluonBwdConfig(NUM_BUFFERS=3), False),
              (GluonBwdConfig(NUM_BUFFERS=3, DQ_BUFFERS=3), True), (GluonBwdConfig(DQ_OVERLAP=0), True),
              (GluonBwdConfig(DQ_BLOCK_N=128, DQ_OVERLAP=0), True), (GluonBwdConfig(BLOCK_M=32, DQ_BUFFERS=3), True),
              (GluonBwdConfig(DQ_BLOCK_N=128), True)]


def shapes(args) -> list[tuple]:
    """gluon_bench.shapes' rows; with --rows also SHAPES.md's D=256 rows (the D=256 kernel, gluon_backward_wide)
    and the LARGE shapes it names."""
    if not args.rows:
        return gluon_bench.shapes(args, LARGE, min_seq_k=1024)
    found = gluon_bench.shapes(args, [], min_seq_k=1024, head_dims=(64, 128, 256))
    named = set(args.rows.split(","))
    return found + [s for s in LARGE if s[0] in named and s not in found]


def wide_configs(args) -> list:
    """The D=256 kernel's runners (gluon_backward_wide): fused dQ with 3 and 2 Q/dO slots (or --buffers), and
    with the Triton dQ kernel."""
    base = gluon_backward_wide.default_wide_config()
    fused = [dataclasses.replace(base, NUM_BUFFERS=b) for b in (args.buffers_list or (3, 2))]
    return [(c, False) for c in fused + [dataclasses.replace(base, DQ_FUSED=0)]]


def validate(cfg, D, dtype, device):
    return gluon_backward_wide.validate_wide(cfg, dtype, device) if D == 256 else cfg.validate(D, dtype, device)


def sdpa_backward(backend, q, k, v, do, causal, scale):
    """A callable running SDPA's backward (``backend``) for one fixed forward."""
    qs, ks, vs = (x.detach().requires_grad_() for x in (q, k, v))
    with sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale,
                                           enable_gqa=q.shape[1] != k.shape[1])
    return lambda: torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True)


def fused_variants(configs: list, field: str, values) -> list:
    """(GluonBwdConfig, Gluon dQ) runners with each fused-dQ config once per value of ``field``
    (``values`` None or empty: unchanged); the others as they are."""
    if not values:
        return configs
    return [(dataclasses.replace(c, **{field: value}), gdq) if c.DQ_FUSED else (c, gdq)
            for c, gdq in configs for value in (values if c.DQ_FUSED else (None, ))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--configs", choices=("default", "all"), default="default")
    ap.add_argument("--grid", action="store_true", help="the standard grid, D 64 and 128, N 512..16k")
    ap.add_argument("--realistic", action="store_true", help="SHAPES.md's rows with D 64/128, Nq and Nk >= 1024")
    ap.add_argument("--rows", metavar="NAMES", help="only the shapes of these names (comma-separated)")
    gluon_bench.add_shape_arg(ap)
    ap.add_argument("--splits", default="0", metavar="LIST",
                    help="dkdv_split values for every Gluon config (comma-separated; 0: chosen from the shape)")
    ap.add_argument("--grid-order", action="store_true",
                    help="also each Gluon runner with its CTAs in grid order (LPT_UNITS 0) instead of heaviest first")
    ap.add_argument("--lpt", default="auto", metavar="LIST",
                    help="LPT_UNITS values for every Gluon runner of a causal row (comma-separated: auto, the "
                         "launcher's rule; all, one group of every unit; or a count, 0 for grid order)")
    ap.add_argument("--stats", choices=("default", "compact", "wide", "both"), default="default",
                    help="the dK/dV kernel's row statistics (gluon_backward.COMPACT_STATS): as the module has them, "
                         "compact (True), wide (False), or both, each Gluon runner twice (labels ending ' compact' "
                         "and ' wide')")
    ap.add_argument("--switch", action="append", default=[], metavar="NAME=V[,V...]",
                    help="one of gluon_backward's switches (CONSUMER_TURNS, COMPACT_STATS, ...) at these integer values "
                         "(repeatable): each Gluon runner once per combination (labels ending ' NAME=V' for the "
                         "switches given more than one value); unnamed switches as the module has them")
    ap.add_argument("--dq-first", choices=("default", "off", "on", "both"), default="default",
                    help="GluonBwdConfig.DQ_FIRST of the fused-dQ runners: as their configs have it (0), off, on, "
                         "or both (labels ending '-first' for on)")
    ap.add_argument("--persistent", choices=("default", "off", "on", "both"), default="default",
                    help="GluonBwdConfig.PERSISTENT of the fused-dQ runners: as their configs have it (0), off, on, "
                         "or both (labels with 'P' after the register split for on)")
    ap.add_argument("--buffers", metavar="N[,N]",
                    help="NUM_BUFFERS (the Q/dO ring's slots) of the fused-dQ runners, each value (labels 'b<N>'; "
                         "default: as their configs have it, 2 at D=128)")
    ap.add_argument("--gluon", choices=("all", "family1", "fused", "default"), default="all",
                    help="which Gluon runners: all four, family 1 only (Triton dQ), the two fused-dQ ones, or the "
                         "one the drop-in's heuristic default runs for the row (none where that is the Triton "
                         "kernel); --dq-first, --persistent and --buffers then vary it")
    ap.add_argument("--prefetch", choices=tuple(PREFETCH_VALUES), default="default",
                    help="the D=256 kernel's PREFETCH (gluon_backward_wide): as the module has it, off (0), early "
                         "(1, 'on'), late (2), off and early ('both') or all three (labels ending ' prefetch=V')")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=100, help="ms of calls per runner and round")
    gluon_bench.add_timer_args(ap)
    ap.add_argument("--out", metavar="FILE.json")
    args = ap.parse_args()
    switches = gluon_bench.switch_values(ap, gluon_backward, args.switch)
    buffers = None
    if args.buffers:
        try:
            buffers = [int(x) for x in args.buffers.split(",")]
        except ValueError:
            ap.error(f"--buffers: expected integers separated by commas, got {args.buffers!r}")
        if any(b < 2 for b in buffers):
            ap.error(f"--buffers: expected slots of at least 2, got {args.buffers!r}")
    args.buffers_list = buffers
    dtype, env = gluon_bench.sm90_run(args.dtype)
    print(f"timer: {args.timer}")
    print(f"{'shape':>28} {'mask':>6} {'gluon cfg':>34} {'gluon ms':>9} {'TFLOP/s':>8} {'triton':>8} {'cudnn':>8} "
          f"{'flash':>8} {'dq':>8} {'g/triton':>8} {'g/cudnn':>8} {'g/flash':>8} {'t/cudnn':>8}")
    rows = []
    splits = [int(x) for x in args.splits.split(",")]
    lpts = [None if x == "auto" else 1 << 20 if x == "all" else int(x) for x in args.lpt.split(",")]
    if args.grid_order and 0 not in lpts:
        lpts.append(0)
    wanted = gluon_bench.wanted_rows(args)
    for name, B, Hq, Hkv, Nq, Nk, D, causal_of in shapes(args):
        if wanted is not None and name not in wanted:
            continue
        q, k, v, do = gluon_bench.row_inputs(B, Hq, Hkv, Nq, Nk, D, dtype, with_do=True)
        scale = 1 / math.sqrt(D)
        for causal in ((False, True) if causal_of is None else (causal_of,)):
            flops = 10 * B * Hq * Nq * Nk * D / (2 if causal else 1)
            fwd_cfg = default_config("fwd", D, dtype, q.device, causal=causal, seq_q=Nq)
            bwd_cfg = default_config("bwd", D, dtype, q.device, causal=causal, seq_q=Nq, triton_only=True)
            o, lse2 = attention_forward(q, k, v, fwd_cfg, causal=causal, sm_scale=scale)
            fns = {
                "triton": lambda: attention_backward(do, q, k, v, o, lse2, bwd_cfg, causal=causal, sm_scale=scale),
                "cudnn": sdpa_backward(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal, scale),
                "flash": sdpa_backward(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal, scale),
            }
            dq_alone = dq_kernel_alone(do, q, k, v, o, lse2, bwd_cfg, causal=causal, sm_scale=scale)
            configs = [(default_gluon_bwd_config(D), False), (default_gluon_bwd_config(D), True),
                       (GluonBwdConfig(BLOCK_M=64, DQ_FUSED=1), False), (GluonBwdConfig(BLOCK_M=64, DQ_FUSED=2), False)]
            if args.configs == "all":
                configs += [c for c in NEIGHBOURS if c not in configs]
            if D == 256:  # the D=256 kernel's own runners (--gluon, --dq-first, --persistent do not apply)
                configs = wide_configs(args)
            elif args.gluon == "default":  # what flashtune.attention's backward launches for this row
                row_default = default_config("bwd", D, dtype, q.device, causal=causal, seq_q=Nq)
                configs = [(row_default.gluon(), row_default.family == 2)] if row_default.family else []
            elif args.gluon != "all":
                configs = [(c, gdq) for c, gdq in configs
                           if (args.gluon == "fused") == bool(c.DQ_FUSED) and not gdq]
            if D != 256:
                configs = fused_variants(configs, "DQ_FIRST", gluon_bench.ON_OFF[args.dq_first])
                configs = fused_variants(configs, "NUM_BUFFERS", buffers)
                configs = fused_variants(configs, "PERSISTENT", gluon_bench.ON_OFF[args.persistent])
            errors = {}
            for cfg, gdq in configs:
                label = cfg.short() if gdq or cfg.DQ_FUSED else cfg.short().split("/dq")[0] + "/triton-dq"
                if D == 256:  # the D=256 kernel: one block of BLOCK_N keys a CTA, both groups on it
                    label = "d256 " + label.replace(f"n2x{cfg.BLOCK_N}", f"n{cfg.BLOCK_N}")
                try:
                    validate(cfg, D, dtype, q.device)
                except Exception as e:  # noqa: BLE001 - report and go on
                    errors[label] = f"invalid: {e}"
                    continue
                for split in splits:
                    for lpt in (lpts if causal else (None,)):
                        for compact, flags in itertools.product(
                                {"default": (gluon_backward.COMPACT_STATS, ), "compact": (True, ),
                                 "wide": (False, ), "both": (True, False)}[args.stats], switches):
                            tag = (f" s{split}" if splits != [0] else "") + (
                                "" if lpt is None else " grid-order" if lpt == 0 else " lpt-all" if lpt == 1 << 20
                                else f" lpt{lpt}") + ({True: " compact", False: " wide"}[compact]
                                                      if args.stats == "both" else "") + gluon_bench.switch_tag(
                                flags, args.switch)
                            for prefetch in (PREFETCH_VALUES[args.prefetch] or (None, )) if D == 256 else (None, ):
                                wide_flags = {} if prefetch is None else {"PREFETCH": prefetch}
                                fns[f"gluon {label}{tag}" + (f" prefetch={prefetch}" if wide_flags else "")] = (
                                    lambda cfg=cfg, gdq=gdq, split=split, lpt=lpt, compact=compact, flags=flags,
                                    wide_flags=wide_flags: gluon_bench.with_flags(
                                        gluon_backward_wide, wide_flags, lambda: gluon_bench.with_flags(
                                            gluon_backward, {"COMPACT_STATS": compact, **flags},
                                            lambda: gluon_attention_backward(
                                                do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=scale,
                                                gluon_dq=gdq, dkdv_split=split, lpt=lpt))))
            ref = [g.float() for g in fns["cudnn"]()]
            flash = [g.float() for g in fns["flash"]()]

            def rel(grads):
                return max(((g.float() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref))

            bound = min(0.05, max(4 * rel(flash), 1e-2))
            for label in list(fns):
                err = rel(fns[label]())
                if not err <= bound:
                    errors[label] = f"max |diff| / max |cuDNN| {err:.4g} > {bound:.4g}"
                    del fns[label]
            if dq_alone is not None:
                fns["dq"] = dq_alone
            if args.host_time:
                gluon_bench.print_host_times(name, "causal" if causal else "full", fns)
            ms = gluon_bench.time_rounds(fns, args.rounds, args.rep, args.timer)
            row = gluon_bench.ratio_row(name, B, Hq, Hkv, Nq, Nk, D, causal, ms, errors)
            rows.append(row)
            gluon_bench.print_row(row, flops, extra=('dq',), label_width=34)
    summary = gluon_bench.summarize(rows)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"env": env, "timer": args.timer, "rows": rows, "summary": summary}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
