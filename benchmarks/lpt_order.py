"""A/B of the heaviest-first launch order across heads (config.lpt_group) per kernel, on
the causal rows of SHAPES.md and of the standard grid, in one process on a GPU.

    python benchmarks/lpt_order.py                  # every kernel, every causal row
    python benchmarks/lpt_order.py --kernels fwd    # the forward only (Triton and Gluon defaults)

For each row and kernel the call runs with the order on and with it off (the kernel's 3-D
grid, per head heaviest first), is checked bitwise equal between the two (the order decides
only when each program starts), and is timed in --rounds interleaved rounds, launch plans off
so each call runs its launcher: by default GPU time only (gluon_bench.cushioned_ms: the
launcher's host time hidden behind a device sleep; before 2026-12-05 triton's do_bench, which
counts host time that outlasts its L2 flush, `--timer do_bench`). Kernels:

- ``fwd``: the forward at the call's heuristic default (Gluon for long D=128 calls on sm_90,
  Triton elsewhere), switched by ``common.LPT_ON["fwd"]``;
- ``dkdv``: the Triton backward at its heuristic default (``triton_only``), switched by
  ``common.LPT_ON["triton_dkdv"]`` (its dQ kernel keeps its order);
- ``dq``: the Triton dQ kernel alone (backward.dq_kernel_alone), its rule against 0.

On is the rule as served: the forwards' and the dQ kernel's order only where
config.lpt_waves is at most config.LPT_MAX_WAVES (elsewhere on equals off); ``--uncapped``
lifts that cap, to time the order itself on every row.

Prints per row the off and on times (ms) and on's speed-up (> 1: the order pays), and the
row's heavy waves (config.lpt_waves of the forward's and the dQ kernel's grids).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import sys

import torch
import triton

from flashtune.kernels import attention_forward, backward, common, config, default_config, launch
from flashtune.protocol import geomean, grid_shape, warm_up_gpu
from flashtune.shapes import REALISTIC_GRID

KERNELS = ("fwd", "dkdv", "dq")


def rows(min_seq: int) -> list[tuple]:
    """(name, B, Hq, Hkv, Nq, Nk, D) of the causal rows with at least ``min_seq`` queries."""
    out = [(s.name, s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim)
           for s in REALISTIC_GRID if s.causal and s.seq_q >= min_seq]
    for d in (64, 128):
        for n in (1024, 2048, 4096, 8192, 16384):
            if n >= min_seq:
                b, h = grid_shape(d, n)
                out.append((f"grid-d{d}-{n}", b, h, h, n, n, d))
    return out


def heavy_waves(kernel: str, q, k) -> float | None:
    """config.lpt_waves of the kernel's grid at its default config (None: the dK/dV kernel,
    which has no cap)."""
    D, Nq, Nk = q.shape[-1], q.shape[2], k.shape[2]
    if kernel == "fwd":
        cfg = default_config("fwd", D, q.dtype, q.device, causal=True, seq_q=Nq, seq_k=Nk)
        rows_per_program = cfg.BLOCK_M * (2 if getattr(cfg, "family", 0) == 1 else 1)  # Gluon: two warp groups
    elif kernel == "dq":
        rows_per_program = default_config("bwd", D, q.dtype, q.device, causal=True, seq_q=Nq, seq_k=Nk,
                                          triton_only=True).BLOCK_M2
    else:
        return None
    blocks = -(-Nq // rows_per_program)
    return config.lpt_waves(q.shape[0] * q.shape[1], blocks, common.sm_count(q.device))


def runner(kernel: str, q, k, v, do, scale):
    """(callable, switch) for one kernel: the callable returns the tensors compared bitwise,
    switch(on) sets the order."""
    D, Nq, Nk = q.shape[-1], q.shape[2], k.shape[2]
    fwd_cfg = default_config("fwd", D, q.dtype, q.device, causal=True, seq_q=Nq, seq_k=Nk)
    if kernel == "fwd":
        return (lambda: attention_forward(q, k, v, fwd_cfg, causal=True, sm_scale=scale),
                lambda on: common.LPT_ON.__setitem__("fwd", on))
    o, lse2 = attention_forward(q, k, v, fwd_cfg, causal=True, sm_scale=scale)
    bwd_cfg = default_config("bwd", D, q.dtype, q.device, causal=True, seq_q=Nq, seq_k=Nk, triton_only=True)
    if kernel == "dkdv":
        return (lambda: backward.attention_backward(do, q, k, v, o, lse2, bwd_cfg, causal=True, sm_scale=scale),
                lambda on: common.LPT_ON.__setitem__("triton_dkdv", on))
    rule = backward.query_lpt_units
    fn = backward.dq_kernel_alone(do, q, k, v, o, lse2, bwd_cfg, causal=True, sm_scale=scale)

    def switch(on: bool) -> None:
        backward.query_lpt_units = rule if on else (lambda *a, **kw: 0)
    return (lambda: (fn(), )), switch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    ap.add_argument("--rows", help="only these rows (comma-separated names)")
    ap.add_argument("--min-seq", type=int, default=512, help="rows with at least this many queries")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rep", type=int, default=40, help="ms of calls per figure")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import gluon_bench  # benchmarks/gluon_bench.py: the timers

    gluon_bench.add_timer_args(ap, host_time=False)
    ap.add_argument("--uncapped", action="store_true",
                    help="time the order on every row (config.LPT_MAX_WAVES lifted), not only where it is served")
    ap.add_argument("--out", metavar="FILE.json")
    args = ap.parse_args()
    if args.uncapped:
        config.LPT_MAX_WAVES = math.inf
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    env = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC {torch.cuda.get_device_name()}, "
           f"torch {torch.__version__}, triton {triton.__version__}, bf16, timer {args.timer}")
    print(env)
    launch.ENABLED = False  # every call runs its launcher: a plan would replay the first call's grid
    warm_up_gpu(torch.device("cuda"))
    wanted = set(args.rows.split(",")) if args.rows else None
    results = []
    print(f"{'row':28s} {'kernel':6s} {'off ms':>8s} {'on ms':>8s} {'on/off':>7s} {'waves':>6s}")
    saved = dict(common.LPT_ON), backward.query_lpt_units
    for name, B, Hq, Hkv, Nq, Nk, D in rows(args.min_seq):
        if wanted is not None and name not in wanted:
            continue
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        do = torch.randn_like(q)
        for kernel in args.kernels:
            fn, switch = runner(kernel, q, k, v, do, 1 / math.sqrt(D))
            outs, times = {}, {True: [], False: []}
            for on in (False, True):
                switch(on)
                outs[on] = [t.clone() for t in fn()]
            same = all(torch.equal(a, b) for a, b in zip(outs[True], outs[False]))
            for _ in range(args.rounds):
                for on in (False, True):
                    switch(on)
                    times[on].append(gluon_bench.time_one(fn, args.rep, args.timer))
            common.LPT_ON.update(saved[0])
            backward.query_lpt_units = saved[1]
            off, on = min(times[False]), min(times[True])
            waves = heavy_waves(kernel, q, k)
            results.append(dict(row=name, kernel=kernel, off_ms=off, on_ms=on, speedup=off / on, bitwise_equal=same,
                                heavy_waves=waves))
            print(f"{name:28s} {kernel:6s} {off:8.3f} {on:8.3f} {off / on:7.3f} "
                  f"{'-' if waves is None else f'{waves:.1f}':>6s}"
                  f"{'' if same else '  NOT BITWISE EQUAL'}", flush=True)
    for kernel in args.kernels:
        ups = [r["speedup"] for r in results if r["kernel"] == kernel]
        if ups:
            print(f"geomean on/off {kernel}: {geomean(ups):.3f} over {len(ups)} rows")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"env": env, "rows": results}, fh, indent=1)
    return 0 if all(r["bitwise_equal"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
