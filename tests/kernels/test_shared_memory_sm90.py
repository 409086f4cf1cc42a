"""A config that validate() accepts on an H100/H200 must fit in its shared memory.

Checked without a GPU: triton compiles the kernels for sm_90 in a child process
(sm90_shared_memory.py) and reports each compiled kernel's shared memory, which is
compared with the device's 232448-byte limit (what triton checks at launch, raising
OutOfResources). Covers the sm_90 heuristic defaults at the largest head dims,
configs of the default search space whose estimate is close to the real need, and
configs whose estimate must be an upper bound of the compiled kernels' need.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from kernel_checks import compile_for_sm90

from flashtune.kernels import BwdConfig, FwdConfig
from flashtune.heuristics import tables

SM90_SHARED_MEMORY = 232448  # bytes per block, opt-in maximum of the H100/H200
SCRIPT = pathlib.Path(__file__).with_name("sm90_shared_memory.py")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _items():
    fwd_table, bwd_table = tables.HEURISTICS[(9, 0)]
    items = []
    names = {v: k for k, v in DTYPES.items()}
    for pass_, table in (("fwd", fwd_table), ("bwd", bwd_table)):
        # every entry at the largest head dims, the causal-specific ones included
        for (dtype, head_dim, *_), cfg in table.items():
            if head_dim >= 128 and dtype in names:
                items.append(("sm90 default", pass_, cfg, head_dim, names[dtype]))
    # TMA forward at the limit: estimated 230400 bytes (accepted), and one stage more (rejected)
    items += [("search space", "fwd", FwdConfig(128, 128, 8, stages, tma=1), 128, "bfloat16") for stages in (3, 4)]
    # default search space, fp32 head_dim 256: estimated 204800 bytes (accepted)
    items.append(("search space", "bwd", BwdConfig(64, 32, 32, 16, 4, 1), 256, "float32"))
    items.append(("search space", "bwd", BwdConfig(64, 32, 64, 32, 8, 1), 256, "float32"))
    # the estimate is an upper bound: atomic-dQ kernels of each query-block height, TMA ones
    for m1, n1 in ((16, 128), (32, 64), (64, 128)):
        for tma in (0, 1):
            items.append(("bound", "bwd", BwdConfig(m1, n1, n1, m1, 4, 3, atomic_dq=1, tma=tma), 128, "bfloat16"))
    # atomic dQ with TMA sends dQ by bulk reduce-adds, staged in shared memory
    for m1, n1, stages, d in ((64, 64, 3, 128), (128, 64, 3, 64), (128, 128, 2, 64)):
        items.append(("bound", "bwd", BwdConfig(m1, n1, n1, m1, 8, stages, atomic_dq=1, tma=1), d, "bfloat16"))
    items.append(("bound", "bwd", BwdConfig(16, 64, 64, 16, 4, 2, atomic_dq=1), 128, "float32"))
    items.append(("bound", "fwd", FwdConfig(64, 64, 4, 3, tma=1), 128, "bfloat16"))
    return items


def _compile_for_sm90(request: list[dict]) -> list[dict]:
    return compile_for_sm90(SCRIPT, request, timeout=900, what="flashtune's kernels")


def test_accepted_configs_fit_sm90_shared_memory():
    items = _items()
    results = _compile_for_sm90([{"pass": p, "config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": True}
                                 for _, p, cfg, d, dt in items])

    too_big, underestimated = [], []
    for (origin, pass_, cfg, head_dim, dtype), res in zip(items, results):
        estimate = cfg.shared_memory(head_dim, DTYPES[dtype])
        accepted = estimate <= SM90_SHARED_MEMORY
        print(f"{origin} {pass_} {dtype} D={head_dim} {cfg.short()}: estimate {estimate}, "
              f"compiled {res['shared']}, accepted={accepted}")
        if accepted and max(res["shared"]) > SM90_SHARED_MEMORY:
            too_big.append(f"{origin} {pass_} {dtype} head_dim={head_dim} {cfg.short()}: validate() estimates "
                           f"{estimate} bytes and accepts it, the compiled kernels need {res['shared']} "
                           f"(limit {SM90_SHARED_MEMORY})")
        if origin == "bound" and max(res["shared"]) > estimate:
            underestimated.append(f"{pass_} {dtype} head_dim={head_dim} {cfg.short()}: estimate {estimate}, "
                                  f"compiled {res['shared']}")
    assert not too_big, "configs accepted on sm_90 that cannot launch there:\n" + "\n".join(too_big)
    assert not underestimated, "shared_memory() below what the compiled kernels need:\n" + "\n".join(underestimated)



def test_the_softcap_kernels_compile_for_sm90_within_the_estimate():
    """The softcap variants (a tanh per score, a derivative factor in the backward) of the
    sm_90 defaults at D=128/256 and of an atomic-dQ TMA config compile for the H200 without
    a GPU, and need no more shared memory than validate() allows for."""
    fwd_table, bwd_table = tables.HEURISTICS[(9, 0)]
    items = [(p, cfg, d) for p, table in (("fwd", fwd_table), ("bwd", bwd_table))
             for (dtype, d, *rest), cfg in table.items() if dtype == torch.bfloat16 and d in (128, 256) and not rest]
    items.append(("bwd", BwdConfig(64, 64, 64, 64, 8, 3, atomic_dq=1, tma=1), 128))
    assert len(items) >= 5
    results = _compile_for_sm90([{"pass": p, "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
                                  "causal": True, "softcap": True} for p, cfg, d in items])
    for (p, cfg, d), res in zip(items, results):
        assert max(res["shared"]) <= SM90_SHARED_MEMORY, (p, d, cfg.short(), res["shared"])


def test_the_window_kernels_compile_for_sm90_within_the_estimate():
    """The sliding-window variants (window_range's loop bounds, a third walk for the
    window's left edge, the edge masks) of the sm_90 defaults at D=128/256 and of an
    atomic-dQ TMA config compile for the H200 without a GPU, causal and not, with softcap
    too, and need no more shared memory than validate() allows for."""
    fwd_table, bwd_table = tables.HEURISTICS[(9, 0)]
    items = [(p, cfg, d) for p, table in (("fwd", fwd_table), ("bwd", bwd_table))
             for (dtype, d, *rest), cfg in table.items() if dtype == torch.bfloat16 and d in (128, 256) and not rest]
    items.append(("bwd", BwdConfig(64, 64, 64, 64, 8, 3, atomic_dq=1, tma=1), 128))
    assert len(items) >= 5
    request = [{"pass": p, "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": i % 2 == 0,
                "window": True, "softcap": i % 3 == 0} for i, (p, cfg, d) in enumerate(items)]
    results = _compile_for_sm90(request)
    for (p, cfg, d), res in zip(items, results):
        assert max(res["shared"]) <= SM90_SHARED_MEMORY, (p, d, cfg.short(), res["shared"])


def test_the_varlen_kernels_compile_for_sm90_within_the_estimate():
    """The packed variable-length variants (VARLEN: each program's sequence bounds read
    from cu_seqlens, an early exit past its end, pointer loads only, no split dK/dV) of the
    sm_90 defaults at D=64/128/256 and of an atomic-dQ config compile for the H200 without a
    GPU, causal and not, with a window and softcap on some, and need no more shared memory
    than validate() allows for."""
    fwd_table, bwd_table = tables.HEURISTICS[(9, 0)]
    items = [(p, cfg, d) for p, table in (("fwd", fwd_table), ("bwd", bwd_table))
             for (dtype, d, *rest), cfg in table.items() if dtype == torch.bfloat16 and d in (64, 128, 256)
             and not rest]
    items.append(("bwd", BwdConfig(64, 64, 64, 64, 8, 3, atomic_dq=1, tma=1), 128))  # tma ignored
    assert len(items) >= 7
    request = [{"pass": p, "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": i % 2 == 0,
                "window": i % 3 == 1, "softcap": i % 4 == 3, "varlen": True} for i, (p, cfg, d) in enumerate(items)]
    results = _compile_for_sm90(request)
    for (p, cfg, d), res in zip(items, results):
        assert len(res["shared"]) == (1 if p == "fwd" else 2)  # no partial-sum dK/dV kernel
        assert max(res["shared"]) <= SM90_SHARED_MEMORY, (p, d, cfg.short(), res["shared"])


def test_the_dropout_kernels_compile_for_sm90_within_the_estimate():
    """The DROPOUT variants (Philox per four keys, the mask interleaved into the scores'
    layout, transposed in the dK/dV kernel) of the sm_90 defaults at D=128/256 and of a TMA
    forward and an atomic-dQ TMA backward compile for the H200 without a GPU, need no more
    shared memory than validate(dropout=True) allows for, and the forward's estimate with
    dropout is exact where the one without is (stages >= 2: its mask tile, BLOCK_M x BLOCK_N
    bytes)."""
    fwd_table, bwd_table = tables.HEURISTICS[(9, 0)]
    items = [(p, cfg, d) for p, table in (("fwd", fwd_table), ("bwd", bwd_table))
             for (dtype, d, *rest), cfg in table.items() if dtype == torch.bfloat16 and d in (128, 256) and not rest]
    items += [("fwd", FwdConfig(128, 64, 8, 3, tma=1), 128),
              ("bwd", BwdConfig(64, 64, 64, 64, 8, 3, atomic_dq=1, tma=1), 128)]
    assert len(items) >= 5
    request = [{"pass": p, "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": i % 2 == 0,
                "dropout": True, "varlen": i == 1} for i, (p, cfg, d) in enumerate(items)]
    results = _compile_for_sm90(request)
    for (p, cfg, d), res in zip(items, results):
        estimate = (cfg.shared_memory(d, torch.bfloat16, dropout=True) if p == "fwd"
                    else cfg.shared_memory(d, torch.bfloat16))
        assert estimate <= SM90_SHARED_MEMORY, (p, d, cfg.short(), estimate)
        assert max(res["shared"]) <= estimate, (p, d, cfg.short(), res["shared"], estimate)
