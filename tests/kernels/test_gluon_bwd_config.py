"""The Gluon backward's kernels (kernels/gluon/: dK/dV and dQ) on the CPU: their config classes'
checks (GluonBwdConfig; BwdConfig's families 1 to 4), the routing of attention_backward, and their
compile for sm_90 (ptxas, no GPU) within the budgets the checks assume.

Nothing here runs the kernel: its numbers are checked by test_gluon_bwd_gpu.py on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import torch
from kernel_checks import compile_for_sm90

backward_launch = pytest.importorskip("flashtune.kernels.gluon.backward_launch", reason="this triton has no Gluon")
from flashtune.configs.base import ConfigError  # noqa: E402
from flashtune.configs.gluon import GluonBwdConfig, default_gluon_bwd_config  # noqa: E402
from flashtune.kernels.gluon import backward as gluon_backward  # noqa: E402

C = GluonBwdConfig
SCRIPT = pathlib.Path(__file__).with_name("gluon_compile_sm90.py")
SM90_SHARED_MEMORY = 232448


@pytest.mark.parametrize("cfg,d,dtype,field", [
    (C(BLOCK_M=16), 128, torch.bfloat16, "BLOCK_M"),
    (C(BLOCK_N=128), 128, torch.bfloat16, "BLOCK_N"),
    (C(NUM_BUFFERS=1), 128, torch.bfloat16, "NUM_BUFFERS"),
    (C(NUM_BUFFERS=5), 64, torch.bfloat16, "NUM_BUFFERS"),
    (C(BLOCK_M=128), 128, torch.bfloat16, "BLOCK_M"),  # registers: 2 accumulators + 128-wide S^T, dP^T
    (C(BLOCK_M=128), 64, torch.bfloat16, "BLOCK_M"),
    (C(BLOCK_M=64.0), 64, torch.bfloat16, "BLOCK_M"),
    (C(DQ_FUSED=True), 64, torch.bfloat16, "DQ_FUSED"),
    (C(), 256, torch.bfloat16, "BLOCK_M"),  # the D=256 kernel's rules (validate_wide: 32 query rows a step)
    (C(), 96, torch.bfloat16, "head_dim"),
    (C(), 128, torch.float32, "dtype"),
    (C(), 128, torch.float8_e4m3fn, "dtype"),
    (C(DQ_BLOCK_N=32), 128, torch.bfloat16, "DQ_BLOCK_N"),
    (C(DQ_BLOCK_N=128), 128, torch.bfloat16, "DQ_BLOCK_N"),  # two dS tiles with the overlap (ptxas spills)
    (C(BLOCK_M=32, DQ_BLOCK_N=128), 128, torch.bfloat16, "DQ_BLOCK_N"),
    (C(DQ_BUFFERS=1), 128, torch.bfloat16, "DQ_BUFFERS"),
    (C(DQ_BUFFERS=5), 64, torch.bfloat16, "DQ_BUFFERS"),
])
def test_invalid_configs_name_their_field(cfg, d, dtype, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        cfg.validate(d, dtype)


def test_the_kernel_is_refused_off_sm90():
    with pytest.raises(ConfigError, match="^device:"):
        C().validate(128, torch.bfloat16, "cpu")


@pytest.mark.parametrize("d", [64, 128])
def test_defaults_validate(d):
    cfg = default_gluon_bwd_config(d)
    assert cfg.validate(d, torch.bfloat16) is cfg
    assert cfg.validate(d, torch.float16) is cfg


def test_the_register_split_is_every_configs():
    """The dK/dV and dQ kernels' registers are no field: every config has the same split."""
    assert (C.PRODUCER_REGS, C.CONSUMER_REGS) == (24, 240) and C().maxnreg() == 168
    assert "PRODUCER_REGS" not in C().to_dict() and "CONSUMER_REGS" not in C().to_dict()
    with pytest.raises(TypeError):
        C(CONSUMER_REGS=232)


def test_the_exp2_polynomial_keeps_its_error_bound():
    """EXP2_POLY evaluated in fp32 as the PTX does (round x to the nearest integer j, 2^(x - j) by
    Horner's rule, j added to the exponent field): relative error under 7.5e-5 against 2^x from
    -125 up (normal results), and at and past the clamp at -126 a tiny positive number (the
    exponent add cannot wrap into the sign)."""
    c0, c1, c2, c3 = (torch.tensor(c, dtype=torch.float32) for c in gluon_backward.EXP2_POLY)
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


def test_the_split_exponential_runs_at_d128_without_masking_only():
    def split(d, causal):
        return backward_launch.kernel_constexprs(C(), d, torch.bfloat16, causal=causal)["SPLIT_EXP2"]

    assert [split(128, False), split(128, True), split(64, False), split(64, True)] == [True, False, False, False]


def test_the_exp2_split_asm_takes_the_last_lanes_to_the_polynomial():
    for poly in (0, 1, 2):
        asm = gluon_backward.exp2_split_asm(poly)
        assert asm.count("ex2.approx.ftz.f32") == 4 - poly and asm.count("shl.b32") == poly
        assert all(f"ex2.approx.ftz.f32 ${i}, ${i + 4};" in asm for i in range(4 - poly))
        assert all(f"mov.b32 ${i}, %pi;" in asm for i in range(4 - poly, 4))
    for bad in (3, -1, True):
        with pytest.raises(ValueError, match="poly: expected 0, 1 or 2"):
            gluon_backward.exp2_split_asm(bad)


def test_shared_memory_counts_the_tiles_and_the_ring():
    # K and V of both consumers (4 tiles of 64 x D) and NUM_BUFFERS (Q, dO) pairs of BLOCK_M x D;
    # both consumers' exchange of a step's row statistics, a BLOCK_M fp32 vector each
    e = 2
    d = 128
    for cfg in (C(), C(BLOCK_M=32, NUM_BUFFERS=4)):
        tiles = 4 * 64 * d * e + 2 * cfg.NUM_BUFFERS * cfg.BLOCK_M * d * e + 2 * cfg.BLOCK_M * 4
        assert tiles < cfg.shared_memory(d, torch.bfloat16) <= tiles + 1024


def test_a_trace_of_the_wrong_shape_is_refused_by_name():
    cfg = C(DQ_FUSED=1)
    q, k, v, do = (torch.zeros(1, 2, 100, 128, dtype=torch.bfloat16) for _ in range(4))
    stats = torch.zeros(1, 2, 100)
    trace = torch.zeros(backward_launch.dkdv_trace_shape(q.shape, k.shape, cfg, (1, 1)), dtype=torch.int64)
    # one CTA of 128 keys a K/V head, 2 query blocks of 64: 2 steps of 14 stamps beside the header
    assert tuple(trace.shape) == (2, 3, 16 + 14 * 2)
    with pytest.raises(ValueError, match=r"^trace: expected a contiguous int64 tensor of shape \(2, 3, 44\)"):
        backward_launch.gluon_dkdv(q, k, v, do, stats, stats, cfg, causal=True, sm_scale=0.1, trace=trace[:, :, 1:])


# every config here is one validate() accepts; both causal modes, bf16 and fp16
ITEMS = ((C(BLOCK_M=32), (64, 128)), (C(BLOCK_M=64), (64, 128)), (C(BLOCK_M=64, NUM_BUFFERS=3), (64, 128)),
         (C(BLOCK_M=32, NUM_BUFFERS=4), (128, )), (C(DQ_FUSED=1), (64, 128)), (C(DQ_FUSED=1, NUM_BUFFERS=3), (64, 128)),
         (C(DQ_FUSED=2), (64, 128)))
# the dQ kernel (its DQ_ fields)
DQ_ITEMS = ((C(), (64, 128)), (C(DQ_BUFFERS=3), (64, 128)), (C(DQ_BLOCK_N=128, DQ_BUFFERS=3), (64, )))
# the dK/dV kernel with its instrumentation (TRACE, kernels/gluon/trace.BACKWARD), bf16
TRACE_ITEMS = ((C(), (128, )), (C(DQ_FUSED=1), (128, )), (C(DQ_FUSED=2), (64, 128)))
# the fused dQ's share issued ahead of dV and dK (DQ_FIRST 1), bf16; (config, head dims, traced too)
DQ_FIRST_ITEMS = ((C(DQ_FUSED=1, DQ_FIRST=1), (64, 128), True), (C(DQ_FUSED=2, DQ_FIRST=1), (64, 128), True),
                  (C(DQ_FUSED=1, NUM_BUFFERS=3, DQ_FIRST=1), (128, ), False))
# dK and dV stored from the registers (a split launch's partials, outputs the copy engine cannot address; the
# other items send them as TMA bulk stores through the K and V tiles), both maskings: (config, head dims, dtypes)
REGISTER_STORE_ITEMS = ((C(), (64, 128), ("bfloat16", )), (C(DQ_FUSED=1), (128, ), ("bfloat16", "float16")),
                        (C(DQ_FUSED=2, DQ_FIRST=1), (128, ), ("bfloat16", )),
                        (C(DQ_FUSED=1, DQ_FIRST=1), (64, ), ("bfloat16", )))


def test_gluon_dkdv_and_dq_kernels_compile_for_sm90_within_budgets():
    request = [{"kernel": "bwd", "bwd_kernel": which, "config": cfg.to_dict(), "head_dim": d, "dtype": dt,
                "causal": causal}
               for which, items in (("dkdv", ITEMS), ("dq", DQ_ITEMS)) for cfg, dims in items for d in dims
               for dt in ("bfloat16", "float16") for causal in (False, True)] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
          "causal": causal, "trace": True}
         for cfg, dims in TRACE_ITEMS for d in dims for causal in (False, True)] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": "bfloat16",
          "causal": causal, "trace": trace}
         for cfg, dims, traced in DQ_FIRST_ITEMS for d in dims for causal in (False, True)
         for trace in ((False, True) if traced and d == 128 and causal else (False, ))] + \
        [{"kernel": "bwd", "bwd_kernel": "dkdv", "config": cfg.to_dict(), "head_dim": d, "dtype": dt,
          "causal": causal, "tma_dkdv": False}
         for cfg, dims, dtypes in REGISTER_STORE_ITEMS for d in dims for dt in dtypes for causal in (False, True)]
    for item in request:
        item.setdefault("tma_dkdv", True)
        C(**item["config"]).validate(item["head_dim"], getattr(torch, item["dtype"]))
    problems = []
    waits = {}  # the untraced dK/dV kernels' mbarrier waits, per (config, head dim, dtype, causal, TMA store)
    results = list(compile_for_sm90(SCRIPT, request, timeout=1800, what="the Gluon dK/dV kernel"))
    for res in results:
        if res["bwd_kernel"] == "dkdv" and not res.get("trace"):
            waits[(json.dumps(res["config"], sort_keys=True), res["head_dim"], res["dtype"], res["causal"],
                   res["tma_dkdv"])] = res["mbarrier_waits"]
    for res in results:
        cfg = C(**res["config"])
        d, dtype = res["head_dim"], getattr(torch, res["dtype"])
        dq = res["bwd_kernel"] == "dq"
        estimate = cfg.dq_shared_memory(d, dtype) if dq else cfg.shared_memory(d, dtype)
        where = (f"{res['bwd_kernel']} {cfg.short()} D={d} {res['dtype']} causal={res['causal']}"
                 f"{' traced' if res.get('trace') else ''}{'' if res['tma_dkdv'] else ' register-store'}")
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
        # the split exponential (D=128 without masking): of each 4 of a thread's P^T exponentials the last by
        # the polynomial, the others by ex2; every other kernel none by the polynomial
        split = not dq and backward_launch.split_exp2(d, res["causal"])
        if split != (res["poly_exp2s"] > 0) or (split and res["ex2"] != 3 * res["poly_exp2s"]):
            problems.append(f"{where}: {res['ex2']} ex2 and {res['poly_exp2s']} polynomial exponentials")
        # a causal walk peels its first step where every query precedes a group's keys: that step's own
        # waits come on top of the unmasked kernel's
        if not dq and res["causal"] and not res.get("trace"):
            key = (json.dumps(res["config"], sort_keys=True), d, res["dtype"], False, res["tma_dkdv"])
            if key in waits and res["mbarrier_waits"] <= waits[key]:
                problems.append(f"{where}: {res['mbarrier_waits']} mbarrier waits, {waits[key]} without masking")
        # dK and dV as one bulk store each per consumer group (none with the register stores, nor in the dQ kernel)
        bulk = 4 if res["tma_dkdv"] and not dq else 0
        if res["tma_stores"] != bulk:
            problems.append(f"{where}: {res['tma_stores']} TMA bulk stores, expected {bulk}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------
# BwdConfig's family 1: the Gluon dK/dV kernel through attention_backward
# ----------------------------------------------------------------------------------
from flashtune.configs.backward import BwdConfig  # noqa: E402
from flashtune.heuristics.defaults import default_config  # noqa: E402
from flashtune.kernels import passes, reference_attention  # noqa: E402
from flashtune.kernels.triton import backward as triton_backward  # noqa: E402


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
    from flashtune.configs.space import candidates, valid_candidates

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
    real = triton_backward._bwd_dkdv_kernel.run

    def spy(*args, **kwargs):
        launched.append((kwargs["BLOCK_M"], kwargs["BLOCK_N"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(triton_backward._bwd_dkdv_kernel, "run", spy)
    monkeypatch.setattr(passes, "_gluon_backward",
                        lambda *a, **k: pytest.fail("the Gluon kernel has no " + str(variant)))
    from flashtune.kernels import attention_forward

    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 37, 64, generator=gen, dtype=torch.float64).float() for _ in range(4))
    fwd = default_config("fwd", 64, torch.float32, "cpu", causal=True)
    o, lse2 = attention_forward(q, k, v, fwd, causal=True, sm_scale=0.125, **variant)
    dq, dk, dv = passes.attention_backward(do, q, k, v, o, lse2, BwdConfig(64, 64, 32, 32, 4, 2, family=1),
                                             causal=True, sm_scale=0.125, fp32_precision="ieee", **variant)
    qr, kr, vr = (x.double().requires_grad_() for x in (q, k, v))
    ref, _ = reference_attention(qr, kr, vr, causal=True, sm_scale=0.125, dtype=torch.float64, **variant)
    want = torch.autograd.grad(ref, (qr, kr, vr), do.double())
    for got, w in zip((dq, dk, dv), want):
        torch.testing.assert_close(got.double(), w, atol=2e-4, rtol=0)
    triton = default_config("bwd", 64, torch.float32, "cpu", causal=True)
    assert triton.family == 0 and launched == [(triton.BLOCK_M1, triton.BLOCK_N1)]


def test_a_gluon_bwd_config_goes_to_the_gluon_kernel(monkeypatch):
    seen = []
    monkeypatch.setattr(passes, "_gluon_backward",
                        lambda do, q, k, v, o, lse2, config, **kw: seen.append((config, kw)) or "grads")
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    lse2 = torch.zeros(1, 2, 8)
    cfg = BwdConfig(64, 64, 128, 64, 4, 2, family=1)
    assert passes.attention_backward(q, q, q, q, q, lse2, cfg, causal=True, sm_scale=0.5,
                                       causal_align="bottom_right") == "grads"
    assert seen == [(cfg, dict(causal=True, sm_scale=0.5, compile_only=False, causal_align="bottom_right"))]
