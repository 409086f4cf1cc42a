"""Time the Gluon forward (kernels/gluon_forward.py) against flashtune's Triton forward
(the Triton kernel's heuristic default config, never a Gluon entry, whatever the call's
length: the "triton" column; before 2026-12-05's sixth session it was flashtune's default,
the Gluon entry for long calls), SDPA's cuDNN backend and SDPA's FlashAttention-2 backend
on an H100/H200, in one process; print the ratios and, with --out, write them as JSON.

    python benchmarks/gluon_fwd.py                    # three large shapes
    python benchmarks/gluon_fwd.py --grid --realistic # the standard grid (D 64/128) and the
                                                      # compute-bound rows of SHAPES.md
    python benchmarks/gluon_fwd.py --configs all      # the Gluon default and a few neighbours
    python benchmarks/gluon_fwd.py --configs persistent  # the default, and it with PERSISTENT=1
    python benchmarks/gluon_fwd.py --fma-softmax both    # each config with FMA_SOFTMAX off and on
    python benchmarks/gluon_fwd.py --tma-store both      # each config with O stored from registers and by TMA
    python benchmarks/gluon_fwd.py --configs persistent --persistent-order both   # strided and snake tile orders
    python benchmarks/gluon_fwd.py --switch ROW_LIMIT_MASK=0,1      # a module switch, each value
    python benchmarks/gluon_fwd.py --configs persistent --persistent-buffers 2,3 --o-tile both
                                                      # the persistent kernel with and without its O tiles

Forward only. For every shape each kernel's output is first checked against cuDNN's
(max |diff| within 4x FlashAttention-2's own distance from cuDNN, and at most 0.05);
a kernel that fails is reported and not timed. Then each is timed with
triton.testing.do_bench (median), in --rounds interleaved rounds, each figure the median
of its rounds. Ratios are speed ratios: "gluon/cudnn" 1.10 means the Gluon kernel is
1.10x as fast as cuDNN. TFLOP/s counts 4 x B x Hq x Nq x Nk x D (halved for causal).
Nothing is tuned: the Gluon configs are the default (gluon_forward.default_gluon_config)
and, with --configs all, a few neighbours; "gluon" in the summary is the best of those.
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
from flashtune.kernels import gluon_forward
from flashtune.kernels.gluon_forward import GluonFwdConfig, default_gluon_config, gluon_attention_forward

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gluon_bench  # noqa: E402  (benchmarks/gluon_bench.py: shapes, rounds, ratios, summary)

LARGE = [  # (name, B, Hq, Hkv, Nq, Nk, D, causal or None for both)
    ("4x16x4k-d128", 4, 16, 16, 4096, 4096, 128, None),
    ("4x16x4k-d64", 4, 16, 16, 4096, 4096, 64, None),
    ("2x16x8k-d128", 2, 16, 16, 8192, 8192, 128, None),
]
NEIGHBOURS = [GluonFwdConfig(OVERLAP=0), GluonFwdConfig(NUM_BUFFERS=3), GluonFwdConfig(PINGPONG=0),
              GluonFwdConfig(BLOCK_N=64)]


# --d256: head dim 256 at gemma2's heads (16 query, 8 key/value), 16k tokens a call, both maskings
D256 = [(f"d256-{n}", 16384 // n, 16, 8, n, n, 256, None) for n in (512, 1024, 2048, 4096, 8192)]


def shapes(args) -> list[tuple]:
    extra = D256 if args.d256 else []
    if extra and not (args.grid or args.realistic):
        return extra
    return gluon_bench.shapes(args, LARGE, head_dims=gluon_forward.HEAD_DIMS) + extra  # SHAPES.md's D=256 rows too


def sdpa(backend, q, k, v, causal, scale):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])


def o_tile_label(cfg: GluonFwdConfig, head_dim: int, dtype: torch.dtype, tma: bool, switch: bool) -> str:
    """What O_TILE 1 gives this persistent config (``switch``: the runner's O_TILE), as a label suffix."""
    if not switch:
        return ""
    tma_store = gluon_forward._tma_store(dtype, tma)
    cfg = dataclasses.replace(cfg, O_TILE=1)
    o_tile, early_q = gluon_forward.persistent_o_tile(cfg, head_dim, dtype, tma_store)
    v_buffers = gluon_forward.persistent_v_buffers(cfg, head_dim, dtype, tma_store)
    short_v = f" v{v_buffers}" if v_buffers != cfg.NUM_BUFFERS else ""  # V's ring a slot shorter
    return f" otile{short_v}" if o_tile else " early-q" if early_q else " no-otile"


def config_fields(ap: argparse.ArgumentParser, given: list[str]) -> list[dict[str, int]]:
    """--config's FIELD=V[,V...] arguments (GluonFwdConfig's fields) as every combination of
    their values, one dict per combination ([] for none)."""
    names = sorted(f.name for f in dataclasses.fields(GluonFwdConfig))
    axes = gluon_bench.int_axes(ap, "--config", given,
                                lambda name: None if name in names else f"expected one of {names}, got {name!r}")
    return gluon_bench.combinations(axes) if axes else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--d256", action="store_true", help="head dim 256 from 512 to 8192 queries (gemma2's heads)")
    ap.add_argument("--overlap", choices=("default", "off", "on", "both"), default="default",
                    help="each config with the softmax/matmul overlap (OVERLAP) as it has it, off, on or both")
    ap.add_argument("--configs", choices=("default", "all", "persistent"), default="default",
                    help="all: the default and its neighbours (persistent included); persistent: the default and "
                         "the default with PERSISTENT=1")
    ap.add_argument("--fma-softmax", choices=("default", "off", "on", "both"), default="default",
                    help="gluon_forward.FMA_SOFTMAX: as the module has it, off, on, or both (each Gluon config "
                         "twice, labels ending ' fma' for on)")
    ap.add_argument("--persistent-order", choices=("default", "strided", "snake", "both"), default="default",
                    help="gluon_forward.PERSISTENT_SNAKE for the persistent configs: as the module has it, off "
                         "(strided), on (snake), or both (labels ending ' snake' for on)")
    ap.add_argument("--tma-store", choices=("default", "off", "on", "both"), default="default",
                    help="gluon_forward.TMA_STORE_O: as the module has it, off, on, or both (labels ending ' tma' "
                         "for on)")
    ap.add_argument("--o-tile", choices=("default", "off", "on", "both"), default="default",
                    help="GluonFwdConfig.O_TILE of the persistent configs: as the config has it, off, on, "
                         "or both (labels ending ' otile' for on; ' early-q' where Q is released early without an "
                         "O tile of its own, ' no-otile' where none fits)")
    ap.add_argument("--switch", action="append", default=[], metavar="NAME=V[,V...]",
                    help="one of gluon_forward's switches (ROW_LIMIT_MASK, ...) at these integer values (repeatable): "
                         "each Gluon runner once per combination (labels ending ' NAME=V' for the switches given "
                         "more than one value); unnamed switches as the module has them")
    ap.add_argument("--persistent-buffers", metavar="N[,N]",
                    help="the persistent configs' NUM_BUFFERS, one persistent config each (default: the default "
                         "config's); D=128 holds O tiles with 2")
    ap.add_argument("--persistent-block-n", metavar="N[,N]",
                    help="the persistent configs' BLOCK_N, one persistent config each with each of "
                         "--persistent-buffers (default: the default config's)")
    ap.add_argument("--config", action="append", default=[], metavar="FIELD=V[,V...]",
                    help="GluonFwdConfig fields (repeatable): adds the default config with each combination of "
                         "these values (for example --config CONSUMER_REGS=104,240 --config PERSISTENT=0,1)")
    ap.add_argument("--grid", action="store_true", help="the standard grid, D 64 and 128, N 512..16k")
    ap.add_argument("--realistic", action="store_true", help="SHAPES.md's rows with D 64/128 and Nq >= 1024")
    ap.add_argument("--rows", metavar="NAMES", help="only the shapes of these names (comma-separated)")
    gluon_bench.add_shape_arg(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=100, help="ms of calls per runner and round")
    gluon_bench.add_timer_args(ap)
    ap.add_argument("--out", metavar="FILE.json")
    args = ap.parse_args()
    module_switches = gluon_bench.switch_values(ap, gluon_forward, args.switch)
    fields = config_fields(ap, args.config)
    dtype, env = gluon_bench.sm90_run(args.dtype)
    print(f"timer: {args.timer}")
    print(f"{'shape':>28} {'mask':>6} {'gluon cfg':>20} {'gluon ms':>9} {'TFLOP/s':>8} {'triton':>8} {'cudnn':>8} "
          f"{'flash':>8} {'g/triton':>8} {'g/cudnn':>8} {'g/flash':>8} {'t/cudnn':>8}")
    rows = []
    wanted = gluon_bench.wanted_rows(args)
    for name, B, Hq, Hkv, Nq, Nk, D, causal_of in shapes(args):
        if wanted is not None and name not in wanted:
            continue
        q, k, v = gluon_bench.row_inputs(B, Hq, Hkv, Nq, Nk, D, dtype)
        scale = 1 / math.sqrt(D)
        for causal in ((False, True) if causal_of is None else (causal_of,)):
            flops = 4 * B * Hq * Nq * Nk * D / (2 if causal else 1)
            ref = sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal, scale)
            base_err = (sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal, scale).float() - ref.float()).abs().max()
            bound = min(0.05, max(4 * base_err.item(), 1e-2))
            fwd_cfg = default_config("fwd", D, dtype, q.device, causal=causal, seq_q=Nq, seq_k=Nk, triton_only=True)
            fns = {
                "triton": lambda: attention_forward(q, k, v, fwd_cfg, causal=causal, sm_scale=scale)[0],
                "cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal, scale),
                "flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal, scale),
            }
            configs = [default_gluon_config(D, causal)]
            if args.configs in ("all", "persistent"):
                buffers = ([int(n) for n in args.persistent_buffers.split(",")] if args.persistent_buffers
                           else [configs[0].NUM_BUFFERS])
                block_ns = ([int(n) for n in args.persistent_block_n.split(",")] if args.persistent_block_n
                            else [configs[0].BLOCK_N])
                configs += [dataclasses.replace(configs[0], PERSISTENT=1, NUM_BUFFERS=n, BLOCK_N=bn)
                            for bn in block_ns for n in buffers]
            if gluon_bench.ON_OFF[args.overlap]:
                configs = [dataclasses.replace(c, OVERLAP=o) for c in configs for o in gluon_bench.ON_OFF[args.overlap]]
            if args.configs == "all":
                configs += [c for c in NEIGHBOURS if c not in configs]
            configs += [c for c in (dataclasses.replace(configs[0], **f) for f in fields) if c not in configs]
            errors = {}
            for cfg in configs:
                try:
                    cfg.validate(D, dtype, q.device)
                except Exception as e:  # noqa: BLE001 - report and go on
                    errors[cfg.short()] = f"invalid: {e}"
                    continue
                switches = {"default": None, "off": (False, ), "on": (True, ), "both": (False, True)}
                orders = {"default": None, "strided": (False, ), "snake": (True, ), "both": (False, True)}
                snakes = (orders[args.persistent_order] if cfg.PERSISTENT else None) or (
                    gluon_forward.PERSISTENT_SNAKE, )
                o_tiles = (switches[args.o_tile] if cfg.PERSISTENT else None) or (bool(cfg.O_TILE), )
                for fma, tma, snake, o_tile, flags in itertools.product(
                        switches[args.fma_softmax] or (gluon_forward.FMA_SOFTMAX, ),
                        switches[args.tma_store] or (gluon_forward.TMA_STORE_O, ), snakes, o_tiles, module_switches):
                    label = (f"gluon {cfg.short()}{' fma' if fma and args.fma_softmax == 'both' else ''}"
                             f"{' tma' if tma and args.tma_store == 'both' else ''}"
                             f"{' snake' if snake and len(snakes) > 1 else ''}"
                             f"{o_tile_label(cfg, D, dtype, tma, o_tile) if len(o_tiles) > 1 else ''}"
                             + gluon_bench.switch_tag(flags, args.switch))
                    fns[label] = (
                        lambda cfg=dataclasses.replace(cfg, O_TILE=int(o_tile)), fma=fma, tma=tma, snake=snake,
                        flags=flags: gluon_bench.with_flags(
                            gluon_forward, {"FMA_SOFTMAX": fma, "TMA_STORE_O": tma, "PERSISTENT_SNAKE": snake,
                                            **flags},
                            lambda: gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale)[0]))
            for label in list(fns):
                err = (fns[label]().float() - ref.float()).abs().max().item()
                if not err <= bound:
                    errors[label] = f"max |diff| to cuDNN {err:.4g} > {bound:.4g}"
                    del fns[label]
            if args.host_time:
                gluon_bench.print_host_times(name, "causal" if causal else "full", fns)
            ms = gluon_bench.time_rounds(fns, args.rounds, args.rep, args.timer)
            row = gluon_bench.ratio_row(name, B, Hq, Hkv, Nq, Nk, D, causal, ms, errors)
            rows.append(row)
            gluon_bench.print_row(row, flops)
    summary = gluon_bench.summarize(rows)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"env": env, "timer": args.timer, "rows": rows, "summary": summary}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
