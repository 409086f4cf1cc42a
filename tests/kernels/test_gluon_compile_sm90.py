"""The Gluon forward compiles for sm_90 (H100/H200) without a GPU, within its budgets.

triton compiles kernels/gluon/forward.py's kernel for sm_90 in a child process
(gluon_compile_sm90.py, TRITON_INTERPRET unset; ptxas assembles it) for head dims 64 and
128, causal and full, bf16 and fp16, several configs; each must compile, need no more
shared memory than the device's 232448 bytes and than GluonFwdConfig.shared_memory()
estimates, and carry the warp specialisation (setmaxnreg to the config's register
split). Skipped where this triton cannot compile Gluon for sm_90. Nothing here runs the
kernel: its numbers are checked by test_gluon_gpu.py on a GPU.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from kernel_checks import compile_for_sm90

pytest.importorskip("flashtune.kernels.gluon.forward_launch", reason="this triton has no Gluon")
from flashtune.configs.gluon import GluonFwdConfig  # noqa: E402
from flashtune.kernels.gluon.persistent import persistent_o_tile, persistent_v_buffers  # noqa: E402

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
# the fp8 variant (FP8: V^T tiles; P through shared memory with the overlap, in registers without;
# the last: the long fp8 calls' default)
FP8_ITEMS = ((C(NUM_BUFFERS=3), (128, )), (C(NUM_BUFFERS=4), (128, )), (C(OVERLAP=0), (64, 128)),
             (C(NUM_BUFFERS=3, PERSISTENT=1), (128, )), (C(PINGPONG=0, OVERLAP=0), (128, )))
# the traced kernel (TRACE: the kernel's own instrumentation, kernels/gluon/trace.py), bf16, both
# loops, persistent, a window
TRACE_ITEMS = ((C(NUM_BUFFERS=3), (128, ), False), (C(OVERLAP=0), (64, ), False),
               (C(NUM_BUFFERS=3, PERSISTENT=1), (128, ), False), (C(NUM_BUFFERS=3), (128, ), True))
# the softmax of a negative sm_scale (SCALE_POSITIVE off: every score scaled before the row max; the
# other items take one multiply-add a score), both loops, bf16 and fp8
NEGATIVE_SCALE_ITEMS = ((C(NUM_BUFFERS=3), (128, )), (C(OVERLAP=0), (64, )))
# the output stored from registers (an output the copy engine cannot address; the other 16-bit items
# store it through TMA), 16-bit: both loops, persistent
REGISTER_STORE_ITEMS = ((C(NUM_BUFFERS=3), (128, )), (C(OVERLAP=0), (64, )), (C(NUM_BUFFERS=3, PERSISTENT=1), (128, )))
# the persistent kernel's O tiles (O_TILE 1: O tiles of its own where they fit, the Q tile released
# before the last P V): D=128 with 2 buffers (fits) and 3 (fits with V's ring a slot shorter than
# K's: persistent_v_buffers), with 64-key blocks (the short causal calls'), D=64 without the overlap;
# (config, head dims, tma_store)
O_TILE_ITEMS = ((C(NUM_BUFFERS=2, PERSISTENT=1, O_TILE=1), (128, ), None),
                (C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), (128, ), None),
                (C(BLOCK_N=64, NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), (128, ), None),
                (C(OVERLAP=0, PERSISTENT=1, O_TILE=1), (64, ), None),
                (C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), (128, ), False),
                (C(NUM_BUFFERS=3, OVERLAP=0, PERSISTENT=1, O_TILE=1), (128, ), None))


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
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": causal, "scale_positive": False}
         for cfg, dims in NEGATIVE_SCALE_ITEMS for d in dims for dt in ("bfloat16", "float8_e4m3fn")
         for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": causal, "tma_store": False}
         for cfg, dims in REGISTER_STORE_ITEMS for d in dims for dt in ("bfloat16", "float16")
         for causal in (False, True)] + \
        [{"config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16", "causal": causal,
          **({} if tma is None else {"tma_store": tma})}
         for cfg, dims, tma in O_TILE_ITEMS for d in dims for causal in (False, True)] + \
        [{"config": C(NUM_BUFFERS=3).to_dict(), "head_dim": 128, "dtype": "bfloat16", "causal": True, "window": True,
          "tma_store": False}]


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
        tma_store = res.get("tma_store", True) and "float8" not in res["dtype"]
        o_tile, early_q = persistent_o_tile(cfg, d, dtype, tma_store)
        v_buffers = persistent_v_buffers(cfg, d, dtype, tma_store)
        estimate = cfg.shared_memory(d, dtype, o_tile=o_tile, v_buffers=v_buffers)
        where = (f"{cfg.short()} D={d} {res['dtype']} causal={res['causal']}{' window' if res.get('window') else ''}"
                 f"{' traced' if res.get('trace') else ''}"
                 f"{' negative scale' if res.get('scale_positive') is False else ''}"
                 f"{' register-store' if res.get('tma_store') is False else ''}"
                 f"{' o-tile' if o_tile else ''}{' early-q' if early_q else ''}"
                 f"{' v%d' % v_buffers if v_buffers != cfg.NUM_BUFFERS else ''}")
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
        # the TMA store: one bulk store of O a consumer; else none
        if res["tma_stores"] != (2 if tma_store else 0):
            problems.append(f"{where}: {res['tma_stores']} TMA bulk stores")
        # a wait for the bulk store a consumer: after it (O through Q), or before the next tile's
        # and at the end (O_TILE)
        if res["store_waits"] != (2 * (2 if o_tile else 1) if tma_store else 0):
            problems.append(f"{where}: {res['store_waits']} bulk-store waits")
        if not res["wgmma"] or not res["tma_loads"]:
            problems.append(f"{where}: expected wgmma and TMA instructions, got {res['wgmma']} and "
                            f"{res['tma_loads']}")
        # every exponential of the forward by the SFU: no polynomial ones
        if res["poly_exp2s"]:
            problems.append(f"{where}: {res['poly_exp2s']} polynomial exponentials")
    assert not problems, "\n".join(problems)


def _long_default_items() -> list[tuple[str, dict]]:
    """Each Gluon entry of the sm_90 tables (16-bit; the long calls' defaults, forward and backward, D=64,
    128 and 256) for each masking it serves."""
    from flashtune.heuristics.tables import HEURISTICS

    fwd_table, bwd_table = HEURISTICS[(9, 0)]
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
                    item.update(kernel="bwd")
                items.append((f"{pass_} {cfg.label()} D={d} causal={causal}", item))
    return items


def test_the_long_defaults_keep_their_wgmmas_pipelined():
    """ptxas serializes a kernel's wgmmas without a word where it cannot prove a pipelined one safe
    (every HGMMA then waits for its own completion: gsb0 on each), as a wgmma left in flight across a
    branch makes it do. Every Gluon default of the sm_90 tables compiles with one completion wait a
    chain of HGMMAs, not one each."""
    named = _long_default_items()
    assert len(named) >= 9 and {item["head_dim"] for _, item in named} == {64, 128, 256}
    results = compile_for_sm90(SCRIPT, [item for _, item in named], timeout=1800, what="the Gluon defaults")
    for (where, _), res in zip(named, results):
        assert 0 < res["hgmma_waited"] * 4 <= res["hgmma"], (where, res["hgmma_waited"], res["hgmma"])
