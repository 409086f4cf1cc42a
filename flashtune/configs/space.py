"""The default search space of each pass, as data next to the config classes.

The autotuner samples from these values; ``valid_candidates`` drops the combinations
that ``validate()`` rejects for a shape and device, so they never cost a compile.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import torch

from flashtune.configs.backward import BwdConfig
from flashtune.configs.base import ConfigError
from flashtune.configs.forward import FwdConfig

FWD_SPACE: dict[str, list[int]] = {
    "BLOCK_M": [16, 32, 64, 128, 256],
    "BLOCK_N": [16, 32, 64, 128],
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3, 4],
    "tma": [0, 1],
    # the schedule (the split kernel): 0 / -1 are "auto" (chosen at launch from the shape), so
    # few explicit values
    "num_splits": [0, 1, 4, 16],
    "pack_gqa": [-1, 0, 1],
    # the kernel family: 0 Triton, 1 the Gluon warp-specialised kernel (sm_90, D 64/128/256,
    # 16-bit; FwdConfig's docstring); pingpong, overlap and persistent are the Gluon kernel's
    "family": [0, 1],
    "pingpong": [0, 1],
    "overlap": [0, 1],
    # the Gluon kernel's persistent grid (one program per SM walking the tiles)
    "persistent": [0, 1],
    # its O tiles of their own and early Q release (persistent configs only; GluonFwdConfig.O_TILE)
    "o_tile": [0, 1],
    # CTAs per SM (Gluon: 2 leaves each consumer 104 registers; D=64 64x64 blocks without the overlap)
    "occupancy": [1, 2],
}

# dK/dV holds keys (BLOCK_N1) and walks queries (BLOCK_M1); dQ holds queries (BLOCK_M2)
# and walks keys (BLOCK_N2): the held block is the larger one in good configs. The dQ
# kernel has its own warps and stages; atomic_dq=1 drops it for atomic adds of dQ in the
# dK/dV kernel (the better of the two depends on the head dim: docs/tune-your-model.md).
BWD_SPACE: dict[str, list[int]] = {
    "BLOCK_M1": [16, 32, 64],
    "BLOCK_N1": [32, 64, 128],
    "BLOCK_M2": [32, 64, 128],
    "BLOCK_N2": [16, 32, 64],
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3],
    "dq_num_warps": [4, 8],
    "dq_num_stages": [1, 2, 3],
    "atomic_dq": [0, 1],
    "tma": [0, 1],
    # 0: chosen at launch from the shape (the tuning key cannot tell the batch and heads
    # apart); explicit values for a sweep at one shape
    "dkdv_split": [0, 1, 2, 4, 8],
    # the kernel family: 0 Triton, 1 the Gluon warp-specialised dK/dV kernel with the Triton
    # dQ kernel, 2 both Gluon, 3 and 4 the Gluon dK/dV kernel with dQ fused (sm_90, D 64/128,
    # 16-bit, BLOCK_N1 64; BwdConfig's docstring)
    "family": [0, 1, 2, 3, 4],
    # the fused dQ share's wgmmas ahead of the step's dV and dK (families 3 and 4;
    # GluonBwdConfig.DQ_FIRST)
    "dq_first": [0, 1],
}

SPACES = {"fwd": (FwdConfig, FWD_SPACE), "bwd": (BwdConfig, BWD_SPACE)}


def search_space(pass_: str) -> dict[str, list]:
    """The values the autotuner samples for each field of the pass's config."""
    if pass_ not in SPACES:
        raise ValueError(f"pass_: expected 'fwd' or 'bwd', got {pass_!r}")
    return SPACES[pass_][1]


def candidates(pass_: str) -> list:
    """Every distinct config of the pass's search space, in a fixed order (canonical
    forms: combinations that differ only in fields the launch does not use count once).
    Each kernel family's combinations are enumerated with the fields it fixes held at their
    fixed values (the canonical forms are the same; the enumeration is smaller)."""
    if pass_ not in SPACES:
        raise ValueError(f"pass_: expected 'fwd' or 'bwd', got {pass_!r}")
    cls, space = SPACES[pass_]
    # cached per space as it is now (a test or a sweep may replace SPACES[pass_])
    return list(_candidates(cls, tuple((name, tuple(values)) for name, values in space.items())))


@functools.lru_cache(maxsize=16)
def _candidates(cls, frozen_space: tuple) -> tuple:
    space = {name: list(values) for name, values in frozen_space}
    out: dict = {}
    for family in space.get("family", [None]):
        sub = dict(space)
        if family is not None:
            sub["family"] = [family]
        for name, (value, _valid) in cls.UNUSED_BY_FAMILY.get(family, {}).items():
            if name in sub:
                sub[name] = [value]
        for values in itertools.product(*sub.values()):
            out.setdefault(cls(**dict(zip(sub, values))).canonical(), None)
    return tuple(out)


def valid_candidates(pass_: str, head_dim: int, dtype: torch.dtype, device=None) -> list:
    """The configs of the search space that validate for this head dim, dtype and device."""
    out = []
    for cfg in candidates(pass_):
        try:
            out.append(cfg.validate(head_dim, dtype, device))
        except ConfigError:
            pass
    return out


def default_neighbours(cfg) -> list:
    """Configs one structural step from a default that a sampler with a small budget is
    unlikely to try early, measured right after it: the same blocks with the tiles loaded
    the other way (TMA vs pointers) and, for the backward, with dQ computed the other way
    (atomic vs dQ kernel); the better choice of each depends on the key (docs/tune-your-model.md)."""
    out = [dataclasses.replace(cfg, tma=1 - cfg.tma)]
    if isinstance(cfg, BwdConfig):
        out.append(dataclasses.replace(cfg, atomic_dq=1 - cfg.atomic_dq))
    return out
