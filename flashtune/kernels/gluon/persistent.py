"""The persistent Gluon forward's schedule: which tiles each CTA walks (the device's walk and its
host copy), the order of the tiles (unit-major or block-major), and the O tiles and V ring a
persistent launch gets.

A persistent launch runs at most programs_per_sm CTAs per SM; in round k each CTA takes one of the
n_prog consecutive tiles k x n_prog ... of the 1-D order, in a snake: pid in even rounds, n_prog - 1
- pid in odd ones. The order is unit-major (a (batch, head) unit's tiles together, under causal
masking its last query block first) or, for causal calls it leaves unbalanced (few units of many
query blocks), block-major. The schedule's model (persistent_cta_blocks, benchmarks/persistent_order.py)
puts the busiest CTA within 3.1 % of the mean on every causal D=128 grid and SHAPES.md row, where the
strided order (tiles pid, pid + n_prog, ...) gave CTA p the same query block of every unit, 1.1-1.6x
the mean (benchmarks/results: h200-gluon-fwd-snake-otile)."""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon

from flashtune.configs.gluon import GluonFwdConfig
from flashtune.kernels.common import cdiv

# the block-major order is taken only where the unit-major one leaves its busiest CTA this much
# busier (persistent_lpt_units): unit-major keeps the tiles that share a K/V head's blocks running
# together, and block-major's rounds of 132 units read their K/V from memory once a tile
# (benchmarks/results: h100-gluon-fwd-snake-order)
SNAKE_BLOCK_MAJOR_GAIN = 1.05


@gluon.jit
def round_tile(k, pid, n_prog):
    """The tile a persistent CTA takes in its round ``k`` (persistent_tiles is the host copy)."""
    return k * n_prog + pid + (k % 2) * (n_prog - 1 - 2 * pid)


@gluon.jit
def cta_tiles(total, pid, n_prog):
    """How many of the ``total`` tiles a persistent CTA takes: every full round's, and the last
    round's if its place there is one of the tiles left."""
    full = total // n_prog
    n = full
    if round_tile(full, pid, n_prog) < total:
        n += 1
    return n


def persistent_tiles(pid: int, n_prog: int, total: int) -> list[int]:
    """The tiles (indices into the 1-D order) persistent CTA ``pid`` of ``n_prog`` takes, in
    order: the kernel's cta_tiles and round_tile on the host."""
    def tile(r):
        return r * n_prog + pid + (r % 2) * (n_prog - 1 - 2 * pid)

    full = total // n_prog
    return [tile(r) for r in range(full + (tile(full) < total))]


def persistent_cta_blocks(n_q: int, n_k: int, units: int, config: GluonFwdConfig, n_prog: int, *, causal: bool,
                          lpt_units: int = 0) -> list[int]:
    """Key blocks each of ``n_prog`` persistent CTAs walks for a call of ``units`` (batch x
    query heads) of ``n_q`` queries on ``n_k`` keys, top-left causal or full, no window: the
    kernel's schedule (its tile order with LPT_UNITS ``lpt_units``, persistent_tiles) on the
    host, for persistent_lpt_units, tests and benchmarks/persistent_order.py."""
    n_m = cdiv(n_q, 2 * config.BLOCK_M)
    loads = []
    for pid in range(n_prog):
        blocks = 0
        for t in persistent_tiles(pid, n_prog, n_m * units):
            if lpt_units:  # lpt_tile's walk, heaviest first
                per_group = n_m * lpt_units
                units_here = min(lpt_units, units - t // per_group * lpt_units)
                pid_m = n_m - 1 - t % per_group // units_here
            else:
                pid_m = n_m - 1 - t % n_m if causal else t % n_m
            hi = min((pid_m + 1) * 2 * config.BLOCK_M, n_k) if causal else n_k
            blocks += cdiv(hi, config.BLOCK_N)
        loads.append(blocks)
    return loads


def persistent_balance(n_q: int, n_k: int, units: int, config: GluonFwdConfig, n_prog: int, *, causal: bool,
                       lpt_units: int = 0, tile_cost: float = 1.0) -> float:
    """The busiest of persistent_cta_blocks's CTAs over the mean (1.0: all end at once), each
    tile's fixed cost (its Q load and epilogue) counted as ``tile_cost`` key blocks."""
    total = cdiv(n_q, 2 * config.BLOCK_M) * units
    loads = persistent_cta_blocks(n_q, n_k, units, config, n_prog, causal=causal, lpt_units=lpt_units)
    work = [w + tile_cost * len(persistent_tiles(p, n_prog, total)) for p, w in enumerate(loads)]
    return max(work) / (sum(work) / len(work))


def persistent_lpt_units(n_q: int, n_k: int, units: int, config: GluonFwdConfig, n_prog: int, *, causal: bool,
                         plain: bool) -> int:
    """LPT_UNITS of a persistent launch: 0 (unit-major: a unit's tiles together, its last query
    block first) or ``units`` (block-major: every unit's last query block, then every unit's next,
    ...), whichever the schedule's model (persistent_balance, a tile's fixed cost counted as one key
    block) balances better, unit-major unless block-major leaves the busiest CTA
    SNAKE_BLOCK_MAJOR_GAIN times less busy. 0 without causal masking or with a window."""
    if not (causal and plain) or units < 2:
        return 0
    return _block_major_units(n_q, n_k, units, config, n_prog)


@functools.lru_cache(maxsize=1024)
def _block_major_units(n_q: int, n_k: int, units: int, config: GluonFwdConfig, n_prog: int) -> int:
    def busiest(lpt: int) -> float:
        return persistent_balance(n_q, n_k, units, config, n_prog, causal=True, lpt_units=lpt)

    return units if busiest(0) > SNAKE_BLOCK_MAJOR_GAIN * busiest(units) else 0


def persistent_o_tile(config: GluonFwdConfig, head_dim: int, dtype: torch.dtype,
                      tma_store: bool) -> tuple[bool, bool]:
    """(O_TILE, EARLY_Q) of a launch (``tma_store``: the launch's): with the config's O_TILE a
    persistent config's consumers get O tiles of their own where shared memory holds them beside
    the Q tiles and the ring (with the TMA store), and release their Q tiles before the last P V
    (with the overlap) wherever O does not go through them."""
    if not (config.PERSISTENT and config.O_TILE):
        return False, False
    # V's slots beside the O tiles (D=128 with 3 x 128-key slots: 3 K and 2 V slots and the O tiles,
    # 229 KB); none fit: no O tiles
    with_o_tile = bool(tma_store) and config.fitting_v_buffers(head_dim, dtype, o_tile=True) is not None
    return with_o_tile, bool(config.OVERLAP) and (with_o_tile or not tma_store)


def persistent_v_buffers(config: GluonFwdConfig, head_dim: int, dtype: torch.dtype, tma_store: bool) -> int:
    """V's ring slots of a launch, persistent or not (arguments as persistent_o_tile's): NUM_BUFFERS,
    or one fewer where the O tiles need the room or the ring does not fit otherwise (ring_v_buffers)
    (the V loads then wait for their own slots, each freed with the release of the block VB before:
    at 3 K and 2 V slots V keeps two blocks of lead, K three)."""
    with_o_tile, _early_q = persistent_o_tile(config, head_dim, dtype, tma_store)
    if with_o_tile:
        return config.fitting_v_buffers(head_dim, dtype, o_tile=True)
    return config.ring_v_buffers(head_dim, dtype)
