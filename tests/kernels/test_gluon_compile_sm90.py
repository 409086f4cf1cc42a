"""The Gluon forward compiles for sm_90 (H100/H200) without a GPU, within its budgets.

triton compiles kernels/gluon_forward.py's kernel for sm_90 in a child process
(gluon_compile_sm90.py, TRITON_INTERPRET unset; ptxas assembles it) for head dims 64 and
128, causal and full, bf16 and fp16, several configs; each must compile, need no more
shared memory than the device's 232448 bytes and than GluonFwdConfig.shared_memory()
estimates, and carry the warp specialisation (setmaxnreg to the config's register
split). Skipped where this triton cannot compile Gluon for sm_90. Nothing here runs the
kernel: its numbers are checked by test_gluon_gpu.py on an H200.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from kernel_checks import compile_for_sm90

gluon_forward = pytest.importorskip("flashtune.kernels.gluon_forward", reason="this triton has no Gluon")
GluonFwdConfig = gluon_forward.GluonFwdConfig

SCRIPT = pathlib.Path(__file__).with_name("gluon_compile_sm90.py")
SM90_SHARED_MEMORY = 232448

C = GluonFwdConfig
ITEMS = (
    # (config, head dims); every one for causal and full, bf16 and fp16
    (C(), (64, 128)),  # 2 x 64 rows, 128 keys, 2 buffers, ping-pong
    (C(NUM_BUFFERS=3), (64, 128)),  # D=128: 229480 bytes estimated, just under the limit
    (C(BLOCK_N=64, PINGPONG=0), (64, 128)),
    (C(BLOCK_M=128, BLOCK_N=64, NUM_BUFFERS=3), (64, )),
    (C(PRODUCER_REGS=32, CONSUMER_REGS=232), (128, )),
    (C(OVERLAP=0), (64, 128)),  # S and PV of a block one after the other (no intra-warpgroup overlap)
    # persistent: one CTA per SM walking tiles, the ring and its barriers carried across them
    (C(NUM_BUFFERS=3, PERSISTENT=1), (128, )),
    (C(OVERLAP=0, PERSISTENT=1), (64, )),
    # D=256: 64-key blocks in 2 slots, the grid and the persistent kernel (family_defaults' first two)
    (C(BLOCK_N=64), (256, )),
    (C(BLOCK_N=64, PERSISTENT=1), (256, )),
    (C(BLOCK_N=64, NUM_BUFFERS=3, PERSISTENT=1), (256, )),  # 3 K slots, 2 V slots (ring_v_buffers)
)


# the sliding-window variant (WINDOW: its own block range and edge masks) of the two default
# configs, causal (Mistral's window) and not
WINDOW_ITEMS = ((C(NUM_BUFFERS=3), (128, )), (C(OVERLAP=0), (64, )), (C(NUM_BUFFERS=3, PERSISTENT=1), (128, )))
# the fp8 variant (FP8: V^T tiles; P through shared memory with the overlap, in registers without)
FP8_ITEMS = ((C(NUM_BUFFERS=3), (128, )), (C(NUM_BUFFERS=4), (128, )), (C(OVERLAP=0), (64, 128)),
             (C(NUM_BUFFERS=3, PERSISTENT=1), (128, )))
# the traced kernel (TRACE: the kernel's own instrumentation, kernels/kernel_trace.py), bf16, both
# loops, persistent, a window
TRACE_ITEMS = ((C(NUM_BUFFERS=3), (128, ), False), (C(OVERLAP=0), (64, ), False),
               (C(NUM_BUFFERS=3, PERSISTENT=1), (128, ), False), (C(NUM_BUFFERS=3), (128, ), True))
# the softmax with one multiply-add a score (FMA_SOFTMAX: SCALE_POSITIVE), both loops, bf16 and fp8
FMA_ITEMS = ((C(NUM_BUFFERS=3), (128, )), (C(OVERLAP=0), (64, )))
# the persistent kernel's other tile order than the module's (PERSISTENT_SNAKE), D 128 and 64
OTHER_ORDER_ITEMS = ((C(NUM_BUFFERS=3, PERSISTENT=1), (128, )), (C(OVERLAP=0, PERSISTENT=1), (64, )))
# the output's other store than the module's (TMA_STORE_O: through its Q tile and a TMA bulk store, or
# from registers), 16-bit: both loops, persistent
OTHER_STORE_ITEMS = ((C(NUM_BUFFERS=3), (128, )), (C(OVERLAP=0), (64, )), (C(NUM_BUFFERS=3, PERSISTENT=1), (128, )))
# the persistent kernel's O tiles (O_TILE 1: O tiles of its own where they fit, the Q tile released
# before the last P V): D=128 with 2 buffers (fits) and 3 (fits with V's ring a slot shorter than
# K's: persistent_v_buffers), D=64 without the overlap; (config, head dims, tma_store)
O_TILE_ITEMS = ((C(NUM_BUFFERS=2, PERSISTENT=1, O_TILE=1), (128, ), None),
                (C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), (128, ), None),
                (C(OVERLAP=0, PERSISTENT=1, O_TILE=1), (64, ), None),
                (C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), (128, ), False),
                (C(NUM_BUFFERS=3, OVERLAP=0, PERSISTENT=1, O_TILE=1), (128, ), None))


# the causal mask as one compare a score against each row's limit (ROW_LIMIT_MASK, on by default),
# bf16 causal: both loops, persistent with O tiles, 64-key blocks, fp8, a window (which keeps the
# two-test mask)
ROW_LIMIT_ITEMS = ((C(NUM_BUFFERS=3), (128, ), "bfloat16", False), (C(OVERLAP=0), (64, ), "bfloat16", False),
                   (C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), (128, ), "bfloat16", False),
                   (C(BLOCK_N=64, NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), (128, ), "bfloat16", False),
                   (C(PINGPONG=0, OVERLAP=0), (128, ), "float8_e4m3fn", False),
                   (C(NUM_BUFFERS=3), (128, ), "bfloat16", True))

# the softmax's exponentials partly by the polynomial (POLY_EXP2, of every 8), 16-bit: both loops, the
# persistent kernel with O tiles, D=256, fp8 (which never takes it); (config, head dims, dtype, POLY_EXP2)
POLY_ITEMS = ((C(OVERLAP=0), (64, ), "bfloat16", 1), (C(NUM_BUFFERS=3), (128, ), "float16", 2),
              (C(OVERLAP=0, PERSISTENT=1, O_TILE=1), (64, ), "bfloat16", 4),
              (C(BLOCK_N=64, NUM_BUFFERS=3, PERSISTENT=1), (256, ), "bfloat16", 1),
              (C(PINGPONG=0, OVERLAP=0), (128, ), "float8_e4m3fn", 1))


def _request():
    return [{"config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": causal}
            for cfg, dims in ITEMS for d in dims for dt in ("bfloat16", "float16") for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": causal, "window": True}
         for cfg, dims in WINDOW_ITEMS for d in dims for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": causal}
         for cfg, dims in FP8_ITEMS for d in dims for dt in ("float8_e4m3fn", "float8_e5m2")
         for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": causal, "window": window,
          "trace": True} for cfg, dims, window in TRACE_ITEMS for d in dims for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": causal, "fma_softmax": True}
         for cfg, dims in FMA_ITEMS for d in dims for dt in ("bfloat16", "float8_e4m3fn")
         for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": causal,
          "tma_store": not gluon_forward.TMA_STORE_O}
         for cfg, dims in OTHER_STORE_ITEMS for d in dims for dt in ("bfloat16", "float16")
         for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": causal,
          "snake": not gluon_forward.PERSISTENT_SNAKE}
         for cfg, dims in OTHER_ORDER_ITEMS for d in dims for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": causal,
          **({} if tma is None else {"tma_store": tma})}
         for cfg, dims, tma in O_TILE_ITEMS for d in dims for causal in (False, True)] + \
        [{"config": C(NUM_BUFFERS=3).to_dict(), "head_dim": 128, "dtype": "bfloat16", "causal": True, "window": True,
          "tma_store": not gluon_forward.TMA_STORE_O}] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": True, "window": window,
          "row_limit": not gluon_forward.ROW_LIMIT_MASK} for cfg, dims, dt, window in ROW_LIMIT_ITEMS for d in dims] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": causal, "fwd_poly_exp2": poly}
         for cfg, dims, dt, poly in POLY_ITEMS for d in dims for causal in (False, True)]


def _compile_for_sm90(request: list[dict]) -> list[dict]:
    return compile_for_sm90(SCRIPT, request, timeout=1800, what="the Gluon forward")


def test_gluon_forward_compiles_for_sm90_within_budgets():
    request = _request()
    for item in request:  # every config here is one validate() accepts
        GluonFwdConfig(**item["config"]).validate(item["head_dim"], getattr(torch, item["dtype"]))
    problems = []
    for res in _compile_for_sm90(request):
        cfg = GluonFwdConfig(**res["config"])
        d, dtype = res["head_dim"], getattr(torch, res["dtype"])
        tma_store = res.get("tma_store", gluon_forward.TMA_STORE_O) and "float8" not in res["dtype"]
        o_tile, early_q = gluon_forward.persistent_o_tile(cfg, d, dtype, tma_store)
        v_buffers = gluon_forward.persistent_v_buffers(cfg, d, dtype, tma_store)
        estimate = cfg.shared_memory(d, dtype, o_tile=o_tile, v_buffers=v_buffers)
        where = (f"{cfg.short()} D={d} {res['dtype']} causal={res['causal']}{' window' if res.get('window') else ''}"
                 f"{' traced' if res.get('trace') else ''}{' fma-softmax' if res.get('fma_softmax') else ''}"
                 f"{' tma-store' if res.get('tma_store') else ''}"
                 f"{' register-store' if res.get('tma_store') is False else ''}"
                 f"{'' if 'snake' not in res else ' snake' if res['snake'] else ' strided'}"
                 f"{' o-tile' if o_tile else ''}{' early-q' if early_q else ''}"
                 f"{'' if 'row_limit' not in res else ' row-limit' if res['row_limit'] else ' two-test mask'}"
                 f"{' v%d' % v_buffers if v_buffers != cfg.NUM_BUFFERS else ''}"
                 f"{' poly-exp2 %d' % res['fwd_poly_exp2'] if res.get('fwd_poly_exp2') else ''}")
        print(f"{where}: shared {res['shared']} (estimate {estimate}), maxnreg {res['maxnreg']}, "
              f"setmaxnreg {res['setmaxnreg']}, {res['wgmma']} wgmma, {res['tma_loads']} TMA copies")
        if res["shared"] > SM90_SHARED_MEMORY:
            problems.append(f"{where}: needs {res['shared']} bytes of shared memory, sm_90 has {SM90_SHARED_MEMORY}")
        if res["shared"] > estimate:
            problems.append(f"{where}: shared_memory() estimates {estimate}, the kernel needs {res['shared']}")
        if res["maxnreg"] != cfg.maxnreg():
            problems.append(f"{where}: .maxnreg {res['maxnreg']}, expected {cfg.maxnreg()}")
        # the producer's, the consumer worker's and the default partition's register counts
        for regs in (cfg.PRODUCER_REGS, cfg.CONSUMER_REGS, cfg.default_partition_regs()):
            if regs not in res["setmaxnreg"]:
                problems.append(f"{where}: no setmaxnreg {regs} among {res['setmaxnreg']}")
        # the trace's stamps are in the traced kernel only: the untraced one reads no cycle counter
        if bool(res["clock_reads"]) != bool(res.get("trace")):
            problems.append(f"{where}: {res['clock_reads']} cycle-counter reads")
        # TMA_STORE_O: one bulk store of O a consumer; else none (the items leave the switch as it is)
        if res["tma_stores"] != (2 if tma_store else 0):
            problems.append(f"{where}: {res['tma_stores']} TMA bulk stores")
        # a wait for the bulk store a consumer: after it (O through Q), or before the next tile's
        # and at the end (O_TILE)
        if res["store_waits"] != (2 * (2 if o_tile else 1) if tma_store else 0):
            problems.append(f"{where}: {res['store_waits']} bulk-store waits")
        if not res["wgmma"] or not res["tma_loads"]:
            problems.append(f"{where}: expected wgmma and TMA instructions, got {res['wgmma']} and "
                            f"{res['tma_loads']}")
        # POLY_EXP2: polynomial exponentials in 16-bit kernels that ask for them, in no other
        poly = res.get("fwd_poly_exp2", 0) if "float8" not in res["dtype"] else 0
        if bool(res["poly_exp2s"]) != bool(poly):
            problems.append(f"{where}: {res['poly_exp2s']} polynomial exponentials")
    assert not problems, "\n".join(problems)


def _long_default_items() -> list[tuple[str, dict]]:
    """Each Gluon entry of the sm_90 tables (16-bit; the long calls' defaults, forward and backward, D=64,
    128 and 256) for each masking it serves, with the kernel modules' switches as they ship."""
    from flashtune.kernels import config as config_mod, gluon_backward

    fwd_table, bwd_table = config_mod.HEURISTICS[(9, 0)]
    bwd_switches = dict(compact_stats=gluon_backward.COMPACT_STATS, turns=gluon_backward.CONSUMER_TURNS,
                        scale_in_p=gluon_backward.SCALE_IN_P, step_counters=gluon_backward.STEP_COUNTERS,
                        skip_dead=gluon_backward.SKIP_DEAD_STEPS, tma_dkdv=gluon_backward.TMA_STORE_DKDV)
    items = []
    for pass_, table in (("fwd", fwd_table), ("bwd", bwd_table)):
        for (dtype, d, *rest), cfg in table.items():
            if not cfg.family or dtype != torch.bfloat16:
                continue
            masks = [rest[1]] if len(rest) > 1 else [False, True]
            for causal in masks:
                item = {"config": cfg.gluon().to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": causal,
                        "ptxas": True}
                if pass_ == "bwd" and d == 256:
                    item.update(kernel="bwd", bwd_kernel="wide")
                elif pass_ == "bwd":
                    item.update(kernel="bwd", poly_exp2=gluon_backward._poly_exp2(d, causal), **bwd_switches)
                items.append((f"{pass_} {cfg.label()} D={d} causal={causal}", item))
    return items


def test_the_long_defaults_keep_their_wgmmas_pipelined():
    """ptxas serializes a kernel's wgmmas without a word where it cannot prove a pipelined one safe
    (every HGMMA then waits for its own completion: gsb0 on each): the D=256 backward's first late
    prefetch did (2026-12-06, docs/gluon.md). Every Gluon default of the sm_90 tables compiles with one
    completion wait a chain of HGMMAs, not one each."""
    named = _long_default_items()
    assert len(named) >= 9 and {item["head_dim"] for _, item in named} == {64, 128, 256}
    results = compile_for_sm90(SCRIPT, [item for _, item in named], timeout=1800, what="the Gluon defaults")
    for (where, _), res in zip(named, results):
        assert 0 < res["hgmma_waited"] * 4 <= res["hgmma"], (where, res["hgmma_waited"], res["hgmma"])
