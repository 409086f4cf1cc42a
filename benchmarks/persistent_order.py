"""The balance of the persistent Gluon forward's CTAs on the causal D=128 rows (no GPU needed).

    python benchmarks/persistent_order.py [--sms 132] [--head-dim 128]

For each causal row of the standard grid and of SHAPES.md (Nq = Nk >= 512, D 64/128) it
prints the key blocks of the busiest persistent CTA over the mean (1.0: every CTA ends at
once; the kernel's time is the busiest CTA's), for the two tile orders of
gluon_forward.PERSISTENT_SNAKE: ``strided`` (tiles pid, pid + n_prog, ... of the grid kernel's
order) and the snake (one tile a round, the rounds alternating direction) over the unit-major
order (``snake/unit``: a unit's tiles together, its heaviest first) and over the block-major
one (``snake/block``: every unit's heaviest tile first), with the one
gluon_forward.persistent_lpt_units picks (``picks``), and, for reference, the grid kernel's CTAs as a
greedy scheduler places them (each next CTA of its order to the SM that frees first), with
``--tile-cost`` blocks of fixed cost a tile (its Q load and epilogue) in every column. The
figures are a model of the schedule (gluon_forward.persistent_cta_blocks), not a timing.
"""

from __future__ import annotations

import argparse
import heapq

import torch

from flashtune.kernels import gluon_forward
from flashtune.kernels.common import cdiv, query_lpt_units
from flashtune.protocol import GRID_SEQ_LENS, grid_shape
from flashtune.shapes import REALISTIC_GRID


def rows(head_dim: int | None) -> list[tuple]:
    """(name, B, Hq, Hkv, N, D) of the causal rows."""
    out = [(f"grid-d{d}-{n}", b, h, h, n, d) for d in (64, 128) for n in GRID_SEQ_LENS for b, h in [grid_shape(d, n)]]
    out += [(s.name, s.batch, s.heads_q, s.heads_kv, s.seq_q, s.head_dim) for s in REALISTIC_GRID
            if s.causal and s.head_dim in (64, 128) and s.seq_q == s.seq_k and s.seq_q >= 512]
    return [r for r in out if head_dim is None or r[-1] == head_dim]


def grid_kernel_balance(n: int, units: int, lpt: int, config, sms: int, tile_cost: float) -> float:
    """The grid kernel's busiest SM over the mean, its CTAs in launch order to the SM that
    frees first (one CTA an SM, as its shared memory allows)."""
    # with one CTA per tile, the model's per-CTA blocks are each tile's, in launch order
    tiles = cdiv(n, 2 * config.BLOCK_M) * units
    loads = gluon_forward.persistent_cta_blocks(n, n, units, config, tiles, causal=True, snake=False, lpt_units=lpt)
    free = [0.0] * sms
    for w in loads:
        t = heapq.heappop(free)
        heapq.heappush(free, t + w + tile_cost)
    return max(free) / ((sum(loads) + tile_cost * len(loads)) / sms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132, help="SMs (persistent CTAs): the H200's 132")
    ap.add_argument("--head-dim", type=int, choices=(64, 128))
    ap.add_argument("--tile-cost", type=float, default=1.0, help="a tile's fixed cost in key blocks")
    args = ap.parse_args()
    print(f"{'row':>28} {'tiles':>6} {'grid kernel':>11} {'strided':>8} {'snake/unit':>10} {'snake/block':>11} "
          f"{'picks':>6}")
    for name, B, Hq, Hkv, n, d in rows(args.head_dim):
        config = gluon_forward.default_gluon_config(d, True)
        units = B * Hq
        q = torch.empty((B, Hq, n, d), device="meta", dtype=torch.bfloat16)
        k = torch.empty((B, Hkv, n, d), device="meta", dtype=torch.bfloat16)
        n_m = cdiv(n, 2 * config.BLOCK_M)
        lpt = query_lpt_units(q, k, n_m, causal=True, plain=True)
        total = n_m * units
        n_prog = min(total, args.sms)
        cells = [grid_kernel_balance(n, units, lpt, config, args.sms, args.tile_cost)]
        for snake, order in ((False, lpt), (True, 0), (True, units)):
            cells.append(gluon_forward.persistent_balance(n, n, units, config, n_prog, causal=True, snake=snake,
                                                          lpt_units=order, tile_cost=args.tile_cost))
        picks = gluon_forward.persistent_lpt_units(n, n, units, config, n_prog, causal=True, plain=True)
        print(f"{name:>28} {total:6d} " + " ".join(f"{c:{w}.3f}" for c, w in zip(cells, (11, 8, 10, 11)))
              + f" {'block' if picks else 'unit':>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
