"""The Gluon backward's kernels (kernels/gluon_backward.py: dK/dV and dQ) on the CPU: their
config classes' checks (GluonBwdConfig; BwdConfig's families 1 and 2), the routing of
attention_backward, and their compile for sm_90 (ptxas, no GPU) within the budgets the
checks assume.

Nothing here runs the kernel: its numbers are checked by test_gluon_bwd_gpu.py on an H200.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import torch
from kernel_checks import compile_for_sm90

gluon_backward = pytest.importorskip("flashtune.kernels.gluon_backward", reason="this triton has no Gluon")
from flashtune.kernels import gluon_forward  # noqa: E402  (EXP2_POLY, the polynomial both kernels use)
from flashtune.kernels.config import ConfigError  # noqa: E402

C = gluon_backward.GluonBwdConfig
SCRIPT = pathlib.Path(__file__).with_name("gluon_compile_sm90.py")
SM90_SHARED_MEMORY = 232448


@pytest.mark.parametrize("cfg,d,dtype,field", [
    (C(BLOCK_M=16), 128, torch.bfloat16, "BLOCK_M"),
    (C(BLOCK_N=128), 128, torch.bfloat16, "BLOCK_N"),
    (C(NUM_BUFFERS=1), 128, torch.bfloat16, "NUM_BUFFERS"),
    (C(NUM_BUFFERS=5), 64, torch.bfloat16, "NUM_BUFFERS"),
    (C(DV_EARLY=2), 64, torch.bfloat16, "DV_EARLY"),
    (C(CONSUMER_REGS=244), 64, torch.bfloat16, "CONSUMER_REGS"),
    (C(CONSUMER_REGS=248), 64, torch.bfloat16, "CONSUMER_REGS"),
    (C(PRODUCER_REGS=16), 64, torch.bfloat16, "PRODUCER_REGS"),
    (C(BLOCK_M=128), 128, torch.bfloat16, "BLOCK_M"),  # registers: 2 accumulators + 128-wide S^T, dP^T
    (C(BLOCK_M=128), 64, torch.bfloat16, "BLOCK_M"),
    (C(BLOCK_M=64.0), 64, torch.bfloat16, "BLOCK_M"),
    (C(DV_EARLY=True), 64, torch.bfloat16, "DV_EARLY"),
    (C(), 256, torch.bfloat16, "BLOCK_M"),  # the D=256 kernel's rules (gluon_backward_wide: 32 query rows a step)
    (C(), 96, torch.bfloat16, "head_dim"),
    (C(), 128, torch.float32, "dtype"),
    (C(), 128, torch.float8_e4m3fn, "dtype"),
    (C(DQ_BLOCK_N=32), 128, torch.bfloat16, "DQ_BLOCK_N"),
    (C(DQ_BLOCK_N=128), 128, torch.bfloat16, "DQ_BLOCK_N"),  # with the overlap: two dS tiles (ptxas spills)
    (C(DQ_OVERLAP=2), 128, torch.bfloat16, "DQ_OVERLAP"),
    (C(DQ_BUFFERS=1), 128, torch.bfloat16, "DQ_BUFFERS"),
    (C(DQ_BLOCK_N=128, DQ_BUFFERS=4, DQ_OVERLAP=0), 128, torch.bfloat16, "DQ_BUFFERS"),  # 64 KiB Q/dO + 256 KiB K/V ring
    (C(BLOCK_M=32, DQ_BLOCK_N=128, CONSUMER_REGS=232), 128, torch.bfloat16, "DQ_BLOCK_N"),
    (C(PERSISTENT=2), 128, torch.bfloat16, "PERSISTENT"),
    (C(PERSISTENT=True), 128, torch.bfloat16, "PERSISTENT"),
])
def test_invalid_configs_name_their_field(cfg, d, dtype, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        cfg.validate(d, dtype)


def test_the_kernel_is_refused_off_sm90():
    with pytest.raises(ConfigError, match="^device:"):
        C().validate(128, torch.bfloat16, "cpu")


@pytest.mark.parametrize("d", [64, 128])
def test_defaults_validate(d):
    cfg = gluon_backward.default_gluon_bwd_config(d)
    assert cfg.validate(d, torch.bfloat16) is cfg
    assert cfg.validate(d, torch.float16) is cfg


@pytest.mark.parametrize("turns", [3, -1, True])
def test_an_unknown_consumer_turns_value_is_refused_not_run_as_off(turns, monkeypatch):
    monkeypatch.setattr(gluon_backward, "CONSUMER_TURNS", turns)
    with pytest.raises(ValueError, match="CONSUMER_TURNS: expected 0, 1 or 2"):
        gluon_backward.kernel_constexprs(C(), 128, torch.bfloat16, causal=True)
    monkeypatch.setattr(gluon_backward, "CONSUMER_TURNS", 2)
    assert gluon_backward.kernel_constexprs(C(), 128, torch.bfloat16, causal=True)["TURNS"] == 2


@pytest.mark.parametrize("sm_scale,on", [(None, True), (0.088, True), (1.0, True), (1.5, False), (0.0, False),
                                         (-0.1, False)])
def test_the_scale_in_p_runs_only_where_p_cannot_grow(sm_scale, on, monkeypatch):
    """SCALING: 1 (P^T scaled) only with SCALE_IN_P and 0 < sm_scale <= 1; else 2 with DQ_SCALE_AT_CAST (the fused
    dQ shares unscaled, the cast scales them), else 0."""
    def scaling(scale_in_p, at_cast):
        monkeypatch.setattr(gluon_backward, "SCALE_IN_P", scale_in_p)
        monkeypatch.setattr(gluon_backward, "DQ_SCALE_AT_CAST", at_cast)
        got = gluon_backward.kernel_constexprs(C(), 128, torch.bfloat16, causal=True, sm_scale=sm_scale)["SCALING"]
        assert got == gluon_backward.scaling(sm_scale)
        return got

    assert scaling(True, False) == (1 if on else 0)
    assert scaling(True, True) == (1 if on else 2)
    assert scaling(False, True) == 2
    assert scaling(False, False) == 0


def test_the_exp2_polynomial_keeps_its_error_bound():
    """EXP2_POLY evaluated in fp32 as the PTX does (round x to the nearest integer j, 2^(x - j) by
    Horner's rule, j added to the exponent field): relative error under 7.5e-5 against 2^x from
    -125 up (normal results), and at and past the clamp at -126 a tiny positive number (the
    exponent add cannot wrap into the sign)."""
    c0, c1, c2, c3 = (torch.tensor(c, dtype=torch.float32) for c in gluon_forward.EXP2_POLY)
    x = torch.cat([torch.linspace(-30.0, 1.0, 400001), torch.arange(-126.0, 2.0), torch.tensor([-1e4, -float("inf")])])
    xc = torch.clamp(x, min=-126.0)
    magic = torch.tensor(12582912.0)
    t = xc + magic
    j = t - magic
    f = xc - j
    p = ((f * c3 + c2) * f + c1) * f + c0
    bits = p.view(torch.int32) + (t.view(torch.int32) << 23)
    got = bits.view(torch.float32).double()
    want = torch.exp2(xc.double())
    normal = x >= -125
    assert ((got[normal] / want[normal] - 1).abs().max()) < 7.5e-5
    assert bool((got > 0).all()) and bool((got[~normal] < 2.0 ** -125).all())


@pytest.mark.parametrize("poly", [3, -1, True])
def test_an_unknown_poly_exp2_value_is_refused(poly, monkeypatch):
    monkeypatch.setattr(gluon_backward, "POLY_EXP2", poly)
    with pytest.raises(ValueError, match="POLY_EXP2: expected 0, 1 or 2"):
        gluon_backward.kernel_constexprs(C(), 128, torch.bfloat16, causal=True)


def test_poly_exp2_by_head_dim_and_masking(monkeypatch):
    def poly(d, causal):
        return gluon_backward.kernel_constexprs(C(), d, torch.bfloat16, causal=causal)["POLY"]

    # the module's: 1 at D=128 without masking (timed there), 0 elsewhere
    assert isinstance(gluon_backward.POLY_EXP2, dict)
    assert [poly(128, False), poly(128, True), poly(64, False), poly(64, True)] == \
        [gluon_backward.POLY_EXP2.get(k, 0) for k in ((128, False), (128, True), (64, False), (64, True))]
    monkeypatch.setattr(gluon_backward, "POLY_EXP2", {(64, True): 2})
    assert [poly(128, False), poly(64, True)] == [0, 2]
    monkeypatch.setattr(gluon_backward, "POLY_EXP2", 1)  # an int: every launch
    assert [poly(128, False), poly(128, True), poly(64, True)] == [1, 1, 1]
    monkeypatch.setattr(gluon_backward, "POLY_EXP2", {(128, False): 3})
    with pytest.raises(ValueError, match="POLY_EXP2: expected 0, 1 or 2"):
        poly(128, False)


def test_the_exp2_split_asm_takes_the_last_lanes_to_the_polynomial():
    for poly in (0, 1, 2):
        asm = gluon_backward.exp2_split_asm(poly)
        assert asm.count("ex2.approx.ftz.f32") == 4 - poly and asm.count("shl.b32") == poly
        assert all(f"ex2.approx.ftz.f32 ${i}, ${i + 4};" in asm for i in range(4 - poly))
        assert all(f"mov.b32 ${i}, %pi;" in asm for i in range(4 - poly, 4))


def test_shared_memory_counts_the_tiles_and_the_ring(monkeypatch):
    # K and V of both consumers (4 tiles of 64 x D) and NUM_BUFFERS (Q, dO) pairs of BLOCK_M x D;
    # with the compact row statistics, both consumers' exchange of a BLOCK_M fp32 vector
    e = 2
    d = 128
    for compact in (False, True):
        monkeypatch.setattr(gluon_backward, "COMPACT_STATS", compact)
        for cfg in (C(), C(BLOCK_M=32, NUM_BUFFERS=4)):
            tiles = 4 * 64 * d * e + 2 * cfg.NUM_BUFFERS * cfg.BLOCK_M * d * e + (2 * cfg.BLOCK_M * 4 if compact else 0)
            assert tiles < cfg.shared_memory(d, torch.bfloat16) <= tiles + 1024


def test_the_persistent_walk_is_named_counted_and_has_no_trace(monkeypatch):
    cfg = C(DQ_FUSED=1, PERSISTENT=1)
    assert cfg.validate(128, torch.bfloat16) is cfg
    assert cfg.short() == "m64n2x64b2r24/240P/fused-dq" and "P" not in C(DQ_FUSED=1).short()
    # its K/V hand-back mbarrier, which the one-CTA-a-tile kernel has only for dK/dV through TMA
    # (TMA_STORE_DKDV: the K-free mbarrier, the same 8 bytes)
    monkeypatch.setattr(gluon_backward, "TMA_STORE_DKDV", False)
    assert cfg.shared_memory(128, torch.bfloat16) == C(DQ_FUSED=1).shared_memory(128, torch.bfloat16) + 8
    monkeypatch.setattr(gluon_backward, "TMA_STORE_DKDV", True)
    assert cfg.shared_memory(128, torch.bfloat16) == C(DQ_FUSED=1).shared_memory(128, torch.bfloat16)
    q, k, v, do = (torch.zeros(1, 2, 100, 128, dtype=torch.bfloat16) for _ in range(4))
    stats = torch.zeros(1, 2, 100)
    trace = torch.zeros(gluon_backward.dkdv_trace_shape(q.shape, k.shape, cfg, (1, 1)), dtype=torch.int64)
    with pytest.raises(ValueError, match="trace: the persistent dK/dV kernel"):
        gluon_backward.gluon_dkdv(q, k, v, do, stats, stats, cfg, causal=True, sm_scale=0.1, trace=trace)


# every config here is one validate() accepts; both causal modes, bf16 and fp16
ITEMS = ((C(BLOCK_M=32), (64, 128)), (C(BLOCK_M=64), (64, 128)), (C(BLOCK_M=64, NUM_BUFFERS=3, DV_EARLY=1), (128, )),
         (C(BLOCK_M=32, NUM_BUFFERS=4), (128, )), (C(DQ_FUSED=1), (64, 128)), (C(DQ_FUSED=1, NUM_BUFFERS=3), (64, 128)),
         (C(DQ_FUSED=2), (64, 128)))
# the dQ kernel (its DQ_ fields)
DQ_ITEMS = ((C(), (64, 128)), (C(DQ_OVERLAP=0), (64, 128)), (C(DQ_BLOCK_N=128, DQ_OVERLAP=0), (128, )),
            (C(DQ_BUFFERS=3), (128, )), (C(DQ_BLOCK_N=128, DQ_BUFFERS=3), (64, )))
# the dK/dV kernel with its instrumentation (TRACE, kernels/kernel_trace.BACKWARD), bf16
TRACE_ITEMS = ((C(), (128, )), (C(DQ_FUSED=1), (128, )), (C(DQ_FUSED=2), (64, 128)))
# the dK/dV kernel with the row statistics the module's switch does not choose (COMPACT_STATS,
# on: these compile the wide load, 16 values a thread live across both wgmmas), bf16; traced too
OTHER_STATS_ITEMS = ((C(), (64, 128)), (C(DQ_FUSED=1), (128, )), (C(DQ_FUSED=2), (128, )),
                     (C(NUM_BUFFERS=3, DV_EARLY=1), (128, )))
# the dK/dV kernel with its consumers taking turns (CONSUMER_TURNS 1 and 2; off by default), bf16:
# two mbarrier waits more than the same kernel in step (ITEMS), the turns' two mbarriers in its
# shared memory
TURNS_ITEMS = ((C(), (128, )), (C(DQ_FUSED=1), (64, )), (C(DQ_FUSED=2), (128, )))
# the fused dQ's share issued ahead of dV and dK (DQ_FIRST 1), bf16; (config, head dims, traced too)
DQ_FIRST_ITEMS = ((C(DQ_FUSED=1, DQ_FIRST=1), (64, 128), True), (C(DQ_FUSED=2, DQ_FIRST=1), (64, 128), True),
                  (C(DQ_FUSED=1, NUM_BUFFERS=3, DQ_FIRST=1), (128, ), False))
# the switches that change the arithmetic (SCALE_IN_P and DQ_SCALE_AT_CAST off, POLY_EXP2 on at D=128 without
# masking): (config, head dim, dtype, causal maskings), each with every (SCALE_IN_P, POLY_EXP2, DQ_SCALE_AT_CAST) of
# NUMERIC_SWITCHES
NUMERIC_SWITCHES = ((True, 0, False), (False, 1, False), (True, 2, False), (False, 0, True))
NUMERIC_ITEMS = ((C(DQ_FUSED=1), 128, "bfloat16", (False, True)), (C(DQ_FUSED=1), 128, "float16", (True, )),
                 (C(DQ_FUSED=2, DQ_FIRST=1), 128, "bfloat16", (True, )), (C(), 64, "bfloat16", (False, )))
# the consumers' walk the other way than the module's STEP_COUNTERS (counted step by step, or the
# division), bf16: (config, head dim, causal): the same wgmma as the module's
STEP_ITEMS = ((C(DQ_FUSED=1), 128, True), (C(DQ_FUSED=2, DQ_FIRST=1), 128, False), (C(), 64, True))
# the persistent walk (PERSISTENT), bf16 and fp16, both maskings: its shared memory within the
# estimate (the K/V hand-back mbarrier) and the SM's
PERSISTENT_ITEMS = ((C(DQ_FUSED=1, PERSISTENT=1), (64, 128)), (C(DQ_FUSED=2, DQ_FIRST=1, PERSISTENT=1), (128, )),
                    (C(BLOCK_M=32, PERSISTENT=1), (128, )))
# the walk's all-masked first step the other way than the module's SKIP_DEAD_STEPS (left out or computed), bf16,
# both maskings: (config, head dim, traced too); without masking the same kernel either way
SKIP_DEAD_ITEMS = ((C(), 64, False), (C(DQ_FUSED=1), 128, True), (C(DQ_FUSED=2), 128, False),
                   (C(DQ_FUSED=2, DQ_FIRST=1), 128, False))
# dK and dV the other way than the module's TMA_STORE_DKDV (TMA bulk stores through the K and V tiles, or
# the register stores), both maskings: (config, head dims, dtypes); the persistent walk keeps the register stores
TMA_DKDV_ITEMS = ((C(), (64, 128), ("bfloat16", )), (C(DQ_FUSED=1), (128, ), ("bfloat16", "float16")),
                  (C(DQ_FUSED=2, DQ_FIRST=1), (128, ), ("bfloat16", )),
                  (C(DQ_FUSED=1, DQ_FIRST=1), (64, ), ("bfloat16", )), (C(DQ_FUSED=1, PERSISTENT=1), (128, ), ("bfloat16", )))


def test_gluon_dkdv_and_dq_kernels_compile_for_sm90_within_budgets(monkeypatch):
    # every item with the module's row statistics (COMPACT_STATS), OTHER_STATS_ITEMS with the other
    default = gluon_backward.COMPACT_STATS
    steps = gluon_backward.STEP_COUNTERS
    skip = gluon_backward.SKIP_DEAD_STEPS
    tma_dkdv = gluon_backward.TMA_STORE_DKDV
    request = [{"kernel": "bwd", "bwd_kernel": which, "config": cfg.to_dict(), "head_dim": d, "dtype": dt,
                "causal": causal, "compact_stats": default}
               for which, items in (("dkdv", ITEMS), ("dq", DQ_ITEMS)) for cfg, dims in items for d in dims
               for dt in ("bfloat16", "float16") for causal in (False, True)] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
          "causal": causal, "trace": True, "compact_stats": default}
         for cfg, dims in TRACE_ITEMS for d in dims for causal in (False, True)] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
          "causal": causal, "compact_stats": not default, "trace": trace}
         for cfg, dims in OTHER_STATS_ITEMS for d in dims
         for causal in (False, True) for trace in (False, True)] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
          "causal": causal, "compact_stats": default, "turns": turns}
         for cfg, dims in TURNS_ITEMS for d in dims for causal in (False, True) for turns in (1, 2)] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
          "causal": causal, "compact_stats": default, "trace": trace}
         for cfg, dims, traced in DQ_FIRST_ITEMS for d in dims for causal in (False, True)
         for trace in ((False, True) if traced and d == 128 and causal else (False, ))] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": dt,
          "causal": causal, "compact_stats": default, "scale_in_p": scaled, "poly_exp2": poly, "dq_scale_at_cast": cast}
         for cfg, d, dt, maskings in NUMERIC_ITEMS for causal in maskings
         for scaled, poly, cast in NUMERIC_SWITCHES] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
          "causal": causal, "compact_stats": default, "step_counters": not steps} for cfg, d, causal in STEP_ITEMS] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": dt,
          "causal": causal, "compact_stats": default}
         for cfg, dims in PERSISTENT_ITEMS for d in dims for dt in ("bfloat16", "float16")
         for causal in (False, True)] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
          "causal": causal, "compact_stats": default, "skip_dead": not skip, "trace": trace}
         for cfg, d, traced in SKIP_DEAD_ITEMS for causal in (False, True)
         for trace in ((False, True) if traced and causal else (False, ))] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": dt,
          "causal": causal, "compact_stats": default, "tma_dkdv": not tma_dkdv}
         for cfg, dims, dtypes in TMA_DKDV_ITEMS for d in dims for dt in dtypes for causal in (False, True)]
    assert gluon_backward.CONSUMER_TURNS == 0, "TURNS_ITEMS compile the turns the module does not take"
    assert not gluon_backward.SCALE_IN_P, "NUMERIC_ITEMS compile the switch the module does not take"
    assert not gluon_backward.DQ_SCALE_AT_CAST, "NUMERIC_ITEMS compile the switch the module does not take"
    for item in request:  # the module's walk unless the item says
        item.setdefault("step_counters", steps)
        item.setdefault("skip_dead", skip)
        item.setdefault("tma_dkdv", tma_dkdv)
    for item in request:
        C(**item["config"]).validate(item["head_dim"], getattr(torch, item["dtype"]))
    problems = []
    waits = {}  # the in-step kernels' mbarrier waits, per (config, head dim, causal)
    ex2s, wgmmas = {}, {}  # and their ex2.approx and wgmma instructions
    results = list(compile_for_sm90(SCRIPT, request, timeout=1800, what="the Gluon dK/dV kernel"))
    for res in results:
        if res["bwd_kernel"] == "dkdv" and res["dtype"] == "bfloat16" and not res.get("trace") \
                and res["compact_stats"] == default and not res.get("turns") and not res["config"]["DQ_FIRST"] \
                and "poly_exp2" not in res and res["step_counters"] == steps and res["skip_dead"] == skip \
                and res["tma_dkdv"] == tma_dkdv:
            waits[(json.dumps(res["config"], sort_keys=True), res["head_dim"], res["causal"])] = res["mbarrier_waits"]
            ex2s[(json.dumps(res["config"], sort_keys=True), res["head_dim"], res["causal"])] = res["ex2"]
            wgmmas[(json.dumps(res["config"], sort_keys=True), res["head_dim"], res["causal"])] = res["wgmma"]
    for res in results:
        cfg = C(**{k: v for k, v in res["config"].items()})
        d, dtype = res["head_dim"], getattr(torch, res["dtype"])
        dq = res["bwd_kernel"] == "dq"
        # the compile's switches, for its estimate
        monkeypatch.setattr(gluon_backward, "COMPACT_STATS", res["compact_stats"])
        monkeypatch.setattr(gluon_backward, "CONSUMER_TURNS", res.get("turns", 0))
        estimate = cfg.dq_shared_memory(d, dtype) if dq else cfg.shared_memory(d, dtype)
        where = (f"{res['bwd_kernel']} {cfg.short()} D={d} {res['dtype']} causal={res['causal']}"
                 f"{' traced' if res.get('trace') else ''}{' compact' if res.get('compact_stats') else ''}"
                 f"{' turns %d' % res['turns'] if res.get('turns') else ''}"
                 f"{' scale-in-p' if res.get('scale_in_p') else ''}"
                 f"{' dq-scale-at-cast' if res.get('dq_scale_at_cast') else ''}"
                 f"{' poly %d' % res['poly_exp2'] if res.get('poly_exp2') else ''}"
                 f"{' step-counters' if res.get('step_counters') else ''}"
                 f"{' skip-dead' if res['skip_dead'] else ''}{' tma-dkdv' if res['tma_dkdv'] else ''}")
        print(f"{where}: shared {res['shared']} (estimate {estimate}), maxnreg {res['maxnreg']}, "
              f"setmaxnreg {res['setmaxnreg']}, {res['wgmma']} wgmma, {res['tma_loads']} TMA copies")
        if res["shared"] > min(estimate, SM90_SHARED_MEMORY):
            problems.append(f"{where}: needs {res['shared']} bytes of shared memory, estimated {estimate}")
        if res["maxnreg"] != cfg.maxnreg():
            problems.append(f"{where}: .maxnreg {res['maxnreg']}, expected {cfg.maxnreg()}")
        for regs in (cfg.PRODUCER_REGS, cfg.CONSUMER_REGS):
            if regs not in res["setmaxnreg"]:
                problems.append(f"{where}: no setmaxnreg {regs} among {res['setmaxnreg']}")
        # S^T, dP^T, dV, dK (dQ kernel: S, dP, dQ): the wgmma kinds; K, V, Q, dO: four TMA copies
        # the trace's stamps in the traced kernel only
        if bool(res["clock_reads"]) != bool(res.get("trace")):
            problems.append(f"{where}: {res['clock_reads']} cycle-counter reads")
        if res["wgmma"] < 4 or res["tma_loads"] < 4:
            problems.append(f"{where}: expected wgmma and TMA instructions, got {res['wgmma']} and "
                            f"{res['tma_loads']}")
        # the fused dQ: its two dS K wgmmas and one TMA reduce-add a step; none without it
        fused = bool(cfg.DQ_FUSED) and not dq
        if (res["tma_reduces"] > 0) != fused or (fused and res["wgmma"] < 6):
            problems.append(f"{where}: {res['tma_reduces']} TMA reduce-adds and {res['wgmma']} wgmma "
                            f"({'fused' if fused else 'not fused'})")
        # POLY_EXP2: of each 4 of a thread's P^T exponentials, that many by the polynomial (none off)
        poly = res.get("poly_exp2", 0)
        if (res["poly_exp2s"] > 0) != bool(poly):
            problems.append(f"{where}: {res['poly_exp2s']} polynomial exponentials with POLY_EXP2 {poly}")
        if poly:
            base = ex2s.get((json.dumps(res["config"], sort_keys=True), d, res["causal"]))
            if base is not None and res["ex2"] + res["poly_exp2s"] != base:
                problems.append(f"{where}: {res['ex2']} ex2 and {res['poly_exp2s']} polynomial exponentials, "
                                f"{base} ex2 without POLY_EXP2")
        if res["step_counters"] != steps:  # the other walk: the same wgmma as the module's
            key = (json.dumps(res["config"], sort_keys=True), d, res["causal"])
            if key in wgmmas and res["wgmma"] != wgmmas[key]:
                problems.append(f"{where}: {res['wgmma']} wgmma, {wgmmas[key]} with the module's walk")
        if res["skip_dead"] != skip and not res.get("trace"):  # causal: the skipped step's own waits
            key = (json.dumps(res["config"], sort_keys=True), d, res["causal"])
            if key in waits:
                pair = (res["mbarrier_waits"], waits[key])
                on, off = pair if res["skip_dead"] else pair[::-1]
                if (on > off) != res["causal"] or on < off:
                    problems.append(f"{where}: {on} mbarrier waits with SKIP_DEAD_STEPS, {off} without")
            if key in wgmmas and not res["causal"] and res["wgmma"] != wgmmas[key]:
                problems.append(f"{where}: {res['wgmma']} wgmma, {wgmmas[key]} with the module's SKIP_DEAD_STEPS")
        # TMA_STORE_DKDV: dK and dV as one bulk store each per consumer group (none with the register stores, nor in
        # the persistent walk or the dQ kernel)
        bulk = 4 if res["tma_dkdv"] and not dq and not cfg.PERSISTENT else 0
        if res["tma_stores"] != bulk:
            problems.append(f"{where}: {res['tma_stores']} TMA bulk stores, expected {bulk}")
        if res.get("turns"):  # a wait for the other consumer's turn in each consumer (and in a peeled dead step)
            base = waits[(json.dumps(res["config"], sort_keys=True), d, res["causal"])]
            if res["mbarrier_waits"] != base + (4 if res["skip_dead"] and res["causal"] else 2):
                problems.append(f"{where}: {res['mbarrier_waits']} mbarrier waits, in step {base}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------
# BwdConfig's family 1: the Gluon dK/dV kernel through attention_backward
# ----------------------------------------------------------------------------------
from flashtune.kernels import backward, reference_attention  # noqa: E402
from flashtune.kernels import config as config_mod  # noqa: E402
from flashtune.kernels.config import BwdConfig  # noqa: E402


def test_the_dq_share_first_is_a_fused_dq_configs_field():
    late = BwdConfig(64, 64, 64, 64, 4, 2, family=4, dq_first=True)
    assert late.dq_first == 1 and late.gluon() == C(BLOCK_M=64, DQ_FUSED=2, DQ_FIRST=1)
    assert late.label() == "gluon 2x64 m64 b2 fused-dQ late first"
    assert late.gluon().short().endswith("/fused-dq-late-first")
    assert BwdConfig.from_dict(late.to_dict()) == late
    assert BwdConfig(64, 64, 64, 64, 4, 2, family=3, dq_first=1).gluon().DQ_FIRST == 1
    # the families without the fused dQ hold 0: one config a launch
    for family in (0, 1, 2):
        assert BwdConfig(64, 64, 64, 64, 4, 2, family=family, dq_first=1).dq_first == 0
    # stored before the field existed: the share in the step's usual order
    old = {f: v for f, v in late.to_dict().items() if f != "dq_first"}
    assert BwdConfig.from_dict(old) == dataclasses.replace(late, dq_first=0)
    with pytest.raises(ConfigError, match=r"^dq_first:"):
        BwdConfig.from_dict({**late.to_dict(), "dq_first": 2})
    with pytest.raises(ConfigError, match=r"^DQ_FIRST: .*DQ_FUSED"):
        C(DQ_FIRST=1).validate(128, torch.bfloat16)
    assert C(DQ_FUSED=1, DQ_FIRST=1).validate(128, torch.bfloat16).DQ_FIRST == 1


def test_a_gluon_bwd_config_fixes_what_it_does_not_use():
    cfg = BwdConfig(64, 64, 128, 64, 8, 3, 8, 3, atomic_dq=1, dkdv_split=4, family=1)
    assert (cfg.num_warps, cfg.atomic_dq, cfg.dkdv_split) == (4, 0, 4)  # the split applies to it
    assert cfg.dq_num_warps == 8  # the dQ kernel's own warps stay
    assert cfg == BwdConfig(64, 64, 128, 64, 4, 3, 8, 3, dkdv_split=4, family=1) == cfg.canonical()
    assert cfg.label() == "gluon 2x64 m64 b3 / 128x64 w8 s3 dkdv_split=4"
    assert dataclasses.replace(cfg, dkdv_split=0).label() == "gluon 2x64 m64 b3 / 128x64 w8 s3"
    assert cfg.gluon() == C(BLOCK_M=64, BLOCK_N=64, NUM_BUFFERS=3)
    assert BwdConfig.from_dict(cfg.to_dict()) == cfg
    old = {k: v for k, v in BwdConfig(64, 64, 128, 64, 8, 3).to_dict().items() if k != "family"}
    assert BwdConfig.from_dict(old).family == 0  # a row stored before the field existed


@pytest.mark.parametrize("field, value", [("family", 5), ("family", -1), ("family", 0.5)])
def test_a_bad_family_is_named(field, value):
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        BwdConfig.from_dict({**BwdConfig(64, 64, 64, 64, 4, 2).to_dict(), field: value})


def test_the_fused_dq_family_fixes_the_dq_half_and_takes_64_query_rows():
    cfg = BwdConfig(64, 64, 128, 32, 8, 3, 8, 4, tma=1, dkdv_split=2, family=3)
    assert (cfg.BLOCK_M2, cfg.BLOCK_N2, cfg.dq_num_warps, cfg.dq_num_stages, cfg.tma) == (64, 64, 4, 2, 0)
    assert cfg == cfg.canonical() and BwdConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.label() == "gluon 2x64 m64 b3 fused-dQ dkdv_split=2"
    assert cfg.gluon() == C(BLOCK_M=64, NUM_BUFFERS=3, DQ_FUSED=1)
    assert cfg.validate_anywhere(128, torch.bfloat16) is cfg
    assert cfg.shared_memory(128, torch.bfloat16) == cfg.gluon().shared_memory(128, torch.bfloat16)
    with pytest.raises(ConfigError, match=r"^BLOCK_M:"):
        BwdConfig(32, 64, 64, 64, 4, 2, family=3).validate_anywhere(128, torch.bfloat16)
    with pytest.raises(ConfigError, match=r"^NUM_BUFFERS:"):  # 4 slots and the dS and dQ tiles at D=128
        BwdConfig(64, 64, 64, 64, 4, 4, family=3).validate_anywhere(128, torch.bfloat16)
    with pytest.raises(ConfigError, match=r"^DQ_FUSED:"):
        C(DQ_FUSED=3).validate(128, torch.bfloat16)
    late = dataclasses.replace(cfg, family=4)
    assert late.label() == "gluon 2x64 m64 b3 fused-dQ late dkdv_split=2" and late.gluon().DQ_FUSED == 2


def test_a_gluon_bwd_config_runs_on_sm90_only_and_checks_its_blocks():
    cfg = BwdConfig(64, 64, 128, 64, 4, 2, family=1)
    with pytest.raises(ConfigError, match=r"^device:"):
        cfg.validate(128, torch.bfloat16, "cpu")
    assert cfg.validate_anywhere(128, torch.bfloat16) is cfg  # against sm_90's limits
    with pytest.raises(ConfigError, match=r"^BLOCK_N:"):
        BwdConfig(64, 128, 128, 64, 4, 2, family=1).validate_anywhere(128, torch.bfloat16)
    with pytest.raises(ConfigError, match=r"^head_dim:"):
        cfg.validate_anywhere(96, torch.bfloat16)


def test_the_search_space_has_gluon_bwd_configs_the_cpu_never_runs():
    from flashtune.kernels.space import candidates, valid_candidates

    every = candidates("bwd")
    gluon = [c for c in every if c.family]
    assert gluon and len(set(gluon)) == len(gluon)
    assert all((c.num_warps, c.atomic_dq) == (4, 0) for c in gluon)
    assert {c.dkdv_split for c in gluon} == {c.dkdv_split for c in every if not c.family}
    assert all(c.family == 0 for c in valid_candidates("bwd", 64, torch.float32, "cpu"))


@pytest.mark.parametrize("variant", [dict(softcap=2.0), dict(window_size=(5, 0))])
def test_a_call_the_gluon_dkdv_kernel_cannot_run_runs_the_triton_default(monkeypatch, variant):
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter's check: on a GPU the Triton kernel would compile")
    launched = []
    real = backward._bwd_dkdv_kernel.run

    def spy(*args, **kwargs):
        launched.append((kwargs["BLOCK_M"], kwargs["BLOCK_N"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(backward._bwd_dkdv_kernel, "run", spy)
    monkeypatch.setattr(backward, "_gluon_backward",
                        lambda *a, **k: pytest.fail("the Gluon kernel has no " + str(variant)))
    from flashtune.kernels import attention_forward

    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 37, 64, generator=gen, dtype=torch.float64).float() for _ in range(4))
    fwd = config_mod.default_config("fwd", 64, torch.float32, "cpu", causal=True)
    o, lse2 = attention_forward(q, k, v, fwd, causal=True, sm_scale=0.125, **variant)
    dq, dk, dv = backward.attention_backward(do, q, k, v, o, lse2, BwdConfig(64, 64, 32, 32, 4, 2, family=1),
                                             causal=True, sm_scale=0.125, fp32_precision="ieee", **variant)
    qr, kr, vr = (x.double().requires_grad_() for x in (q, k, v))
    ref, _ = reference_attention(qr, kr, vr, causal=True, sm_scale=0.125, dtype=torch.float64, **variant)
    want = torch.autograd.grad(ref, (qr, kr, vr), do.double())
    for got, w in zip((dq, dk, dv), want):
        torch.testing.assert_close(got.double(), w, atol=2e-4, rtol=0)
    triton = config_mod.default_config("bwd", 64, torch.float32, "cpu", causal=True)
    assert triton.family == 0 and launched == [(triton.BLOCK_M1, triton.BLOCK_N1)]


def test_a_gluon_bwd_config_goes_to_the_gluon_kernel(monkeypatch):
    seen = []
    monkeypatch.setattr(backward, "_gluon_backward",
                        lambda do, q, k, v, o, lse2, config, **kw: seen.append((config, kw)) or "grads")
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    lse2 = torch.zeros(1, 2, 8)
    cfg = BwdConfig(64, 64, 128, 64, 4, 2, family=1)
    assert backward.attention_backward(q, q, q, q, q, lse2, cfg, causal=True, sm_scale=0.5,
                                       causal_align="bottom_right") == "grads"
    assert seen == [(cfg, dict(causal=True, sm_scale=0.5, compile_only=False, causal_align="bottom_right"))]
