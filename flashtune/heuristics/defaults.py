"""The heuristic defaults: the config a call runs when nothing is tuned for it.

Lookup walks the tables (tables.py) from the device's architecture down to the generic one, the
most specific entry for the call first (its band, then its masking), and returns the first that
validates on the device, as PyTorch FlexAttention's per-device tables do.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from flashtune.configs.backward import BwdConfig
from flashtune.configs.base import DECODE_MAX_Q, FP8_DTYPES, ConfigError, config_class, padded_head_dim
from flashtune.configs.forward import FwdConfig
from flashtune.configs.gluon import (GLUON_BWD_HEAD_DIMS, GLUON_FWD_HEAD_DIMS, default_gluon_bwd_config,
                                     default_gluon_config)
from flashtune.device import device_capability
from flashtune.heuristics.bands import decode_fills, is_long, is_mid
from flashtune.heuristics.tables import HEURISTICS

_bf, _fp, _f8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
# Last resort when no table entry is valid on the device.
_SMALLEST_FWD = FwdConfig(16, 16, 4, 1)
_SMALLEST_BWD = BwdConfig(16, 16, 16, 16, 4, 1)


def portfolio(pass_: str, head_dim: int, dtype: torch.dtype, device=None) -> list:
    """The heuristic tables' other entries for the device's architecture and this dtype's
    class (every head dim, both maskings, decode) that validate for ``head_dim``: configs
    chosen from measurements on neighbouring shapes, a search's cheap first guesses.
    Entries of this head dim come first, then the nearest head dims; no duplicates."""
    config_class(pass_)
    cap = device_capability(device)
    kind = _bf if dtype in (_bf, _fp) else dtype
    tables = [t[0 if pass_ == "fwd" else 1] for c, t in sorted(HEURISTICS.items(), reverse=True) if c <= cap][:1]
    entries = [(k, cfg) for table in tables for k, cfg in table.items() if k[0] == kind]
    entries.sort(key=lambda e: abs(math.log2(e[0][1]) - math.log2(padded_head_dim(head_dim))))
    out: dict = {}
    for _, cfg in entries:
        try:
            cfg = cfg.validate(head_dim, dtype, device)
        except ConfigError:
            continue
        out.setdefault(cfg.canonical(), cfg)
    return list(out.values())


def family_defaults(pass_: str, head_dim: int, dtype: torch.dtype, device=None) -> list:
    """The starting config of each other kernel family that runs this head dim and dtype on
    the device: on sm_90 the Gluon forward's default (configs.gluon.default_gluon_config), then
    the same with its persistent grid, then that with its O tiles, and that with 64-key blocks
    (the short causal rows'); at head dim 64 also two CTAs per SM (occupancy 2) on the grid and on
    the persistent kernel (the middle band's entries); for the backward the Gluon dK/dV kernel's
    (configs.gluon.default_gluon_bwd_config) with the Triton default's dQ half (family 1), then
    with the Gluon dQ kernel (family 2), then with dQ fused into it (families 3 and 4), each with
    its share in the step's usual order and ahead of dV and dK; at head dim 256 the D=256
    kernel's: dQ fused with 3 and 2 Q/dO slots, then with the Triton default's dQ kernel. Each of
    these wins on some keys and loses on others, so the search times them first
    (key_search.warm_start) and the family is chosen per key by measurement. Configs the device
    refuses are left out."""
    config_class(pass_)
    if device_capability(device) != (9, 0) or dtype not in (_bf, _fp):
        return []
    if pass_ == "fwd":
        if head_dim not in GLUON_FWD_HEAD_DIMS:
            return []
        g = default_gluon_config(head_dim)
        base = FwdConfig(g.BLOCK_M, g.BLOCK_N, 4, g.NUM_BUFFERS, family=1, pingpong=g.PINGPONG, overlap=g.OVERLAP)
        if head_dim == 256:  # 64-key blocks in 2 slots, or 3 K and 2 V slots, no O tiles (shared memory): the grid
            # and the persistent kernel, each with and without the softmax/matmul overlap
            configs = [dataclasses.replace(base, overlap=o, num_stages=n, persistent=p) for n in (2, 3)
                       for o in (1, 0) for p in (0, 1)]
        else:
            configs = [dataclasses.replace(base, persistent=p, o_tile=o) for p, o in ((0, 0), (1, 0), (1, 1))]
            # and the same with 64-key blocks and 3 slots: on short causal calls fewer keys of each
            # diagonal block are masked work
            configs.append(dataclasses.replace(configs[-1], BLOCK_N=64, num_stages=3))
            if head_dim == 64:  # two CTAs per SM, the grid and the persistent kernel (the middle band's entries)
                two = FwdConfig(64, 64, 4, 2, family=1, overlap=0, occupancy=2)
                configs += [dataclasses.replace(two, pingpong=0), dataclasses.replace(two, persistent=1, o_tile=1)]
    else:
        wide = head_dim == 256
        if head_dim not in GLUON_BWD_HEAD_DIMS and not wide:
            return []
        t = default_config("bwd", head_dim, dtype, device, triton_only=True)
        if wide:
            # the D=256 kernel (32 queries a step over 64 keys): dQ fused with 3 and
            # 2 Q/dO slots (family 3), and with the Triton default's dQ kernel (family 1)
            configs = [BwdConfig(32, 64, 64, 64, 4, n, family=3) for n in (3, 2)]
            configs.append(BwdConfig(32, 64, t.BLOCK_M2, t.BLOCK_N2, 4, 3, t.dq_num_warps, t.dq_num_stages,
                                     tma=t.tma, family=1))
        else:
            # family 1 (the Gluon dK/dV kernel with the Triton default's dQ half) and family 2
            # (both Gluon, 3-slot rings)
            g = default_gluon_bwd_config(head_dim)
            configs = [BwdConfig(g.BLOCK_M, g.BLOCK_N, t.BLOCK_M2, t.BLOCK_N2, 4, g.NUM_BUFFERS, t.dq_num_warps,
                                 t.dq_num_stages, tma=t.tma, family=1),
                       BwdConfig(g.BLOCK_M, g.BLOCK_N, 64, 64, 4, 3, 4, 3, family=2),
                       *(BwdConfig(64, g.BLOCK_N, 64, 64, 4, 2, family=f, dq_first=first) for f in (3, 4)
                         for first in (0, 1))]
    out = []
    for cfg in configs:
        try:
            out.append(cfg.validate(head_dim, dtype, device))
        except ConfigError:
            pass
    return out


@functools.lru_cache(maxsize=256)
def triton_default(pass_: str, head_dim: int, dtype: torch.dtype, device: torch.device, causal: bool | None):
    """The heuristic config of the pass without the long bucket and without Gluon entries
    (never a Gluon kernel, also where a table serves one for all lengths, as fp8's forward on
    sm_90 may): what runs a call the Gluon kernels cannot (kernels/passes.as_triton)."""
    return default_config(pass_, head_dim, dtype, device, causal=causal, triton_only=True)


def default_config(pass_: str, head_dim: int, dtype: torch.dtype, device=None, causal: bool | None = None,
                   seq_q: int | None = None, triton_only: bool = False, seq_k: int | None = None,
                   batch_heads_kv: int | None = None, batch_heads: int | None = None):
    """The heuristic config for a pass ("fwd" or "bwd") on ``device``.

    Walks the tables from the device's architecture down to the generic one and
    returns the first entry that validates on the device; within a table an entry for
    decode ((dtype, head_dim, "decode"), forward calls with ``seq_q`` at most
    DECODE_MAX_Q; before it (dtype, head_dim, "decode", "full") where ``batch_heads_kv``,
    the call's batch x K/V heads, fills the SMs: ``decode_fills``) or for long calls
    ((dtype, head_dim, "long", causal), then (dtype, head_dim, "long");
    ``is_long(pass_, seq_q, seq_k, dtype, head_dim, causal)``, seq_k None for seq_q) or for the
    forward's middle band below them (the same with "mid": ``is_mid``, a causal call's by its
    ``batch_heads``, batch x query heads, None: unknown) comes first,
    then one for this masking ((dtype, head_dim, causal)), then the one for both.
    ``triton_only``: entries of another kernel family (the Gluon kernels) are passed over (the
    Triton fallback, ``triton_default``).
    """
    config_class(pass_)  # a bad pass raises ValueError
    cap = device_capability(device)
    key = (_bf if dtype == _fp else _f8 if dtype in FP8_DTYPES else dtype, padded_head_dim(head_dim, dtype))
    keys = [key] if causal is None else [(*key, bool(causal)), key]
    if pass_ == "fwd" and seq_q is not None and seq_q <= DECODE_MAX_Q:
        keys.insert(0, (*key, "decode"))
        if decode_fills(batch_heads_kv, device):
            keys.insert(0, (*key, "decode", "full"))
    band = ("long" if is_long(pass_, seq_q, seq_k, dtype, head_dim, causal)
            else "mid" if is_mid(pass_, seq_q, seq_k, dtype, head_dim, causal, batch_heads, device) else None)
    if band is not None:
        keys.insert(0, (*key, band))
        if causal is not None:  # an entry of the band with this masking first
            keys.insert(0, (*key, band, bool(causal)))
    candidates = [tables[0 if pass_ == "fwd" else 1].get(k)
                  for c, tables in sorted(HEURISTICS.items(), reverse=True) if c <= cap for k in keys]
    candidates.append(_SMALLEST_FWD if pass_ == "fwd" else _SMALLEST_BWD)
    last_error: ConfigError | None = None
    for cfg in candidates:
        if cfg is None or (triton_only and getattr(cfg, "family", 0)):
            continue
        try:
            return cfg.validate(head_dim, dtype, device)
        except ConfigError as e:
            last_error = e
    raise ConfigError(f"no valid default {pass_} config for head_dim={head_dim} dtype={dtype}: {last_error}")