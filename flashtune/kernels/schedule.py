"""The heaviest-first (longest-processing-time) launch order of causal calls: which kernels take it
and how their units are grouped, so the short programs fill the SMs at the end of a launch."""

from __future__ import annotations

import torch

from flashtune.device import sm_count


# Heaviest-first launch order of the causal backward's kernels (lpt_group): the programs
# running together should share at most this many bytes of walked tiles in L2 (half of the
# H200's 50 MB), yet a group of units should cover at least LPT_WAVES waves of the GPU
# The programs of a heaviest-first group share at most this many bytes of walked tiles in L2 (half of
# the H200's 50 MB), yet a group covers at least LPT_WAVES waves of the GPU.
LPT_L2_BYTES = 24 << 20
LPT_WAVES = 2
# The query-block kernels (the forwards, the dQ kernel) take the order only where the tail it removes
# is a large part of the launch: at 2-4 heavy waves the forward gained 1.08-1.19x and the dQ kernel
# 1.04-1.20x, at 7-17 both moved within 0.92-1.03x, the L2 reuse of the per-head order weighing
# against the shorter tail (benchmarks/results: h200-lpt-cap-decode-combine).
LPT_MAX_WAVES = 6.0


def lpt_waves(units: int, programs_per_unit: int, slots: int) -> float:
    """The causal work of ``units`` of ``programs_per_unit`` programs (the i-th walking about
    i + 1 tiles) per slot of the GPU, counted in the heaviest program's work: how many of
    the heaviest programs each slot runs. Few (2-4): the last heavy programs started in grid
    order decide the launch's end, and the heaviest-first order shortens it."""
    return units * (programs_per_unit + 1) / (2 * max(1, slots))


def lpt_pays(units: int, programs_per_unit: int, slots: int) -> bool:
    """Whether a query-block kernel's launch takes the heaviest-first order: lpt_waves at
    most LPT_MAX_WAVES (read at each call, so a benchmark can lift it)."""
    return lpt_waves(units, programs_per_unit, slots) <= LPT_MAX_WAVES


def lpt_group(units: int, programs_per_unit: int, bytes_per_unit: int, *, slots: int) -> int:
    """Units per group of a heaviest-first (longest-processing-time) launch order: the
    backward kernels under causal masking run their programs group by group, and within a
    group the heaviest block of every unit first, so the short programs fill the SMs at the
    end. A group holds as many units as keep the tiles they walk within LPT_L2_BYTES, but at
    least as many as give LPT_WAVES waves of ``slots`` programs (fewer leave SMs idle while
    the group's last heavy programs run: llama3-70b-tp8's dK/dV kernel took 1.25x as long in
    groups of 6 and 2 units as in one group of 8); and
    the groups are made equal, within one unit, so no small group runs last."""
    if units < 1 or programs_per_unit < 1:
        raise ValueError(f"lpt_group: expected units and programs_per_unit >= 1, got {units}, {programs_per_unit}")
    cap = max(1, LPT_L2_BYTES // max(1, bytes_per_unit))
    fill = -(-LPT_WAVES * slots // programs_per_unit)
    size = min(units, max(cap, fill))
    groups = -(-units // size)
    return -(-units // groups)


def query_lpt_units(q: torch.Tensor, k: torch.Tensor, query_blocks: int, *, causal: bool, plain: bool) -> int:
    """LPT_UNITS of a kernel with one program per block of queries of one (batch, query head),
    the dQ kernel's and the forward's (0: their 3-D grid, per head heaviest first): for a
    causal call without a window or packed sequences, the (batch, query head) units of
    ``query_blocks`` programs in groups of config.lpt_group's size over the K and V they walk
    (a K/V head's bytes shared by the query heads of its group, neighbours in the order);
    only where config.lpt_pays."""
    if not (causal and plain):  # (packed sequences: q is 3-D)
        return 0
    B, H, _, D = q.shape
    slots = sm_count(q.device)
    if not lpt_pays(B * H, query_blocks, slots):
        return 0
    per_unit = 2 * k.shape[2] * D * k.element_size() * k.shape[1] // H
    return lpt_group(B * H, query_blocks, per_unit, slots=slots)


def key_block_lpt_units(q: torch.Tensor, *, heads_per_unit: int, units: int, key_blocks: int, programs_per_sm: int,
                        causal: bool) -> int:
    """LPT_UNITS of a dK/dV kernel (the Triton one's, the Gluon one's), with one program per
    key block of one (batch, K/V head, split) unit (0: grid order, without masking): for a
    causal launch, its ``units`` of ``key_blocks`` programs in groups of config.lpt_group's
    size over the Q and dO each unit walks (``heads_per_unit`` query heads), at
    ``programs_per_sm`` programs per SM."""
    if not causal:
        return 0
    per_unit = 2 * heads_per_unit * q.shape[2] * q.shape[3] * q.element_size()
    return lpt_group(units, key_blocks, per_unit, slots=programs_per_sm * sm_count(q.device))
