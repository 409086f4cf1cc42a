"""The Gluon forward's configs on the CPU: GluonFwdConfig.validate (each rule raises ConfigError
naming its field), FwdConfig's Gluon family, the heuristic defaults that serve it, the calls that
go to it and those that fall back, and its persistent schedule."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

forward_launch = pytest.importorskip("flashtune.kernels.gluon.forward_launch", reason="this triton has no Gluon")
from flashtune import device as device_mod  # noqa: E402
from flashtune.configs import base as configs_base  # noqa: E402
from flashtune.configs import gluon as configs_gluon  # noqa: E402
from flashtune.configs.base import ConfigError  # noqa: E402
from flashtune.configs.gluon import GluonFwdConfig, default_gluon_config  # noqa: E402
from flashtune.kernels.gluon import persistent as gluon_persistent  # noqa: E402


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_defaults_validate(head_dim, dtype):
    cfg = default_gluon_config(head_dim)
    assert cfg.validate(head_dim, dtype) is cfg
    assert cfg.shared_memory(head_dim, dtype) <= device_mod.SM90_SHARED_MEMORY


@pytest.mark.parametrize("kwargs, head_dim, dtype, field", [
    (dict(BLOCK_M=32), 128, torch.bfloat16, "BLOCK_M"),
    (dict(BLOCK_M=96), 64, torch.bfloat16, "BLOCK_M"),
    (dict(BLOCK_M=64.0), 64, torch.bfloat16, "BLOCK_M"),
    (dict(BLOCK_N=256), 64, torch.bfloat16, "BLOCK_N"),
    (dict(BLOCK_N=True), 64, torch.bfloat16, "BLOCK_N"),
    (dict(NUM_BUFFERS=1), 64, torch.bfloat16, "NUM_BUFFERS"),
    (dict(NUM_BUFFERS=5), 64, torch.bfloat16, "NUM_BUFFERS"),
    (dict(PINGPONG=2), 64, torch.bfloat16, "PINGPONG"),
    (dict(PERSISTENT=2), 64, torch.bfloat16, "PERSISTENT"),
    (dict(PERSISTENT=True), 64, torch.bfloat16, "PERSISTENT"),
    (dict(PRODUCER_REGS=20), 64, torch.bfloat16, "PRODUCER_REGS"),
    (dict(PRODUCER_REGS=30), 64, torch.bfloat16, "PRODUCER_REGS"),
    (dict(CONSUMER_REGS=264), 64, torch.bfloat16, "CONSUMER_REGS"),
    (dict(PRODUCER_REGS=40, CONSUMER_REGS=240), 64, torch.bfloat16, "CONSUMER_REGS"),  # 520 > 512
    ({}, 96, torch.bfloat16, "head_dim"),
    ({}, 512, torch.bfloat16, "head_dim"),
    # D=256: 64 rows x (256 + 128) fp32 and two 16-bit P tiles, 288 registers a thread; 4 K and 3 V slots 290 KB
    ({}, 256, torch.bfloat16, "BLOCK_M"),
    (dict(BLOCK_N=64, NUM_BUFFERS=4), 256, torch.bfloat16, "NUM_BUFFERS"),
    ({}, 64, torch.float32, "dtype"),
    # 128 rows x (128 + 128) fp32 per warp group: 320 registers a thread, over 240
    (dict(BLOCK_M=128), 128, torch.bfloat16, "BLOCK_M"),
    (dict(CONSUMER_REGS=128), 128, torch.bfloat16, "BLOCK_M"),
    # D=128, 128-key blocks: 4 buffers need 295 KB
    (dict(NUM_BUFFERS=4), 128, torch.float16, "NUM_BUFFERS"),
])
def test_validate_names_the_field(kwargs, head_dim, dtype, field):
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        GluonFwdConfig(**kwargs).validate(head_dim, dtype)


def test_the_shared_memory_limit_is_sm90s():
    # D=128, 2 x 64 query rows, 3 buffers of 128 keys: 229480 bytes, under 232448
    assert GluonFwdConfig(NUM_BUFFERS=3).validate(128, torch.bfloat16)
    assert GluonFwdConfig(NUM_BUFFERS=3).shared_memory(128, torch.bfloat16) <= 232448


def test_device_must_be_cuda_sm90():
    with pytest.raises(ConfigError, match=r"^device:"):
        GluonFwdConfig().validate(64, torch.bfloat16, "cpu")
    if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(ConfigError, match=r"^device:"):
            GluonFwdConfig().validate(64, torch.bfloat16, "cuda")


def test_register_split():
    cfg = GluonFwdConfig()
    # 3 warp groups of 128 threads; the default partition (first consumer) gets what the
    # workers leave of maxnreg x 3
    assert cfg.maxnreg() == 168
    assert 3 * cfg.maxnreg() - cfg.CONSUMER_REGS - cfg.PRODUCER_REGS == cfg.CONSUMER_REGS
    odd = GluonFwdConfig(PRODUCER_REGS=32, CONSUMER_REGS=232)  # 496 / 3 rounds up to 168
    assert odd.maxnreg() == 168 and odd.default_partition_regs() >= odd.CONSUMER_REGS
    assert 3 * odd.maxnreg() <= 512


def test_programs_per_sm_counts_registers_and_shared_memory():
    bf16 = torch.bfloat16
    # the defaults: maxnreg 168 over 3 warp groups of 128 threads take 64512 of 65536 registers
    for d in (64, 128, 256):
        assert default_gluon_config(d).programs_per_sm(d, bf16) == 1
    # CONSUMER_REGS 104: maxnreg 80, 30720 registers a CTA; D=64 64x64 blocks take 50-99 KB
    small = GluonFwdConfig(BLOCK_N=64, OVERLAP=0, CONSUMER_REGS=104)
    assert small.maxnreg() == 80 and small.validate(64, bf16) is small
    for n in (2, 3, 4):
        for o_tile in (0, 1):
            cfg = dataclasses.replace(small, NUM_BUFFERS=n, PERSISTENT=1, O_TILE=o_tile)
            assert cfg.programs_per_sm(64, bf16) == 2, cfg.short()
    # 112 registers: maxnreg 88, two CTAs would need 67584 registers
    assert dataclasses.replace(small, CONSUMER_REGS=112).programs_per_sm(64, bf16) == 1
    # registers for two but not the shared memory: 4 K/V slots of 128 keys at D=128 (over 114 KB)
    wide = GluonFwdConfig(BLOCK_N=128, NUM_BUFFERS=2, CONSUMER_REGS=104)
    assert wide.shared_memory(128, bf16) > device_mod.SM90_SM_SHARED_MEMORY // 2
    assert wide.programs_per_sm(128, bf16) == 1
    # the overlap's second P tile does not fit 104 registers: validate refuses it, naming BLOCK_M
    with pytest.raises(ConfigError, match=r"^BLOCK_M:"):
        dataclasses.replace(small, OVERLAP=1).validate(64, bf16)


# ----------------------------------------------------------------------------------
# The Gluon kernel as a family of FwdConfig (family=1): the search's tunable
# ----------------------------------------------------------------------------------
from flashtune.configs.forward import FwdConfig  # noqa: E402
from flashtune.configs.space import candidates, valid_candidates  # noqa: E402
from flashtune.heuristics import bands, defaults, tables  # noqa: E402
from flashtune.heuristics.defaults import default_config, family_defaults  # noqa: E402
from flashtune.kernels import launch, passes, reference_attention  # noqa: E402
from flashtune.kernels.triton import forward as triton_forward  # noqa: E402


@pytest.fixture
def sm(monkeypatch):
    """sm(capability): make the CPU look like a CUDA device of that capability (the H200's
    shared memory, an H100's SMs) to the configs' checks and the heuristic tables; the cached
    Triton fallback is cleared around it."""
    def set_capability(capability):
        for module in (configs_base, configs_gluon, defaults):
            monkeypatch.setattr(module, "device_capability", lambda device: capability)
        monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: 232448)
        monkeypatch.setattr(bands, "schedule_sm_count", lambda device: 132)
        for module in (passes, sys.modules["flashtune.configs.forward"], sys.modules["flashtune.configs.backward"]):
            monkeypatch.setattr(module, "resolve_device", lambda device=None: torch.device("cuda", 0))
    defaults.triton_default.cache_clear()
    yield set_capability
    defaults.triton_default.cache_clear()


def test_a_gluon_fwd_config_round_trips_and_labels_itself():
    cfg = FwdConfig(64, 128, 4, 3, family=1, pingpong=0)
    assert FwdConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.label() == "gluon 2x64x128 b3"
    assert cfg.gluon() == GluonFwdConfig(BLOCK_M=64, BLOCK_N=128, NUM_BUFFERS=3, PINGPONG=0)
    # fields the Gluon kernel does not read are fixed in the canonical form; the Triton
    # kernel has no ping-pong
    assert FwdConfig(64, 128, 8, 3, tma=1, num_splits=4, family=1).canonical() == \
        FwdConfig(64, 128, 4, 3, num_splits=1, pack_gqa=0, family=1)
    assert FwdConfig(64, 64, 4, 2, pingpong=0).canonical() == FwdConfig(64, 64, 4, 2)
    # a config stored before the fields existed is the Triton kernel's
    old = {f: v for f, v in FwdConfig(64, 64, 4, 2).to_dict().items() if f not in ("family", "pingpong")}
    assert FwdConfig.from_dict(old).family == 0


def test_the_o_tiles_are_a_persistent_gluon_configs_field():
    cfg = FwdConfig(64, 128, 4, 3, family=1, persistent=1, o_tile=True)
    assert cfg.o_tile == 1 and cfg.gluon().O_TILE == 1 and cfg.gluon().short().endswith("Po")
    assert cfg.label() == "gluon 2x64x128 b3 pp persistent o-tile"
    assert FwdConfig.from_dict(cfg.to_dict()) == cfg
    # the grid kernel and the Triton kernel have none: their configs hold 0, one config a launch
    assert FwdConfig(64, 128, 4, 3, family=1, o_tile=1) == FwdConfig(64, 128, 4, 3, family=1)
    assert FwdConfig(64, 64, 4, 2, o_tile=1) == FwdConfig(64, 64, 4, 2)
    # a config stored before the field existed launches without them
    old = {f: v for f, v in cfg.to_dict().items() if f != "o_tile"}
    assert FwdConfig.from_dict(old) == dataclasses.replace(cfg, o_tile=0)
    with pytest.raises(ConfigError, match=r"^o_tile:"):
        FwdConfig.from_dict({**cfg.to_dict(), "o_tile": 2})


def test_occupancy_is_a_gluon_configs_field():
    bf16 = torch.bfloat16
    cfg = FwdConfig(64, 64, 4, 2, family=1, overlap=0, persistent=1, o_tile=1, occupancy=2)
    assert cfg.gluon().CONSUMER_REGS == 104 and cfg.gluon().programs_per_sm(64, bf16) == 2
    assert cfg.label() == "gluon 2x64x64 b2 pp seq persistent o-tile x2"
    assert FwdConfig.from_dict(cfg.to_dict()) == cfg and cfg.validate_anywhere(64, bf16) is cfg
    assert dataclasses.replace(cfg, occupancy=1).gluon().CONSUMER_REGS == 240
    # the Triton kernel's occupancy is its compiler's: its configs hold 1
    assert FwdConfig(64, 64, 4, 2, occupancy=2) == FwdConfig(64, 64, 4, 2)
    # a config stored before the field existed runs one CTA per SM
    old = {f: v for f, v in cfg.to_dict().items() if f != "occupancy"}
    assert FwdConfig.from_dict(old) == dataclasses.replace(cfg, occupancy=1)
    for bad in (3, 0, True, 2.0):
        with pytest.raises(ConfigError, match=r"^occupancy:"):
            FwdConfig.from_dict({**cfg.to_dict(), "occupancy": bad}).validate_anywhere(64, bf16)
    # tiles that do not fit 104 registers (128-key blocks, the overlap's second P tile, D=128) name occupancy
    for too_big, d in ((dataclasses.replace(cfg, BLOCK_N=128), 64), (dataclasses.replace(cfg, overlap=1), 64),
                       (cfg, 128)):
        with pytest.raises(ConfigError, match=r"^occupancy: 2 CTAs per SM leave 104 registers"):
            too_big.validate_anywhere(d, bf16)
    # the search's space holds it: the valid occupancy-2 candidates at D=64 are 64x64 blocks without the overlap
    twos = [c for c in candidates("fwd") if c.occupancy == 2]
    assert twos and all(c.family == 1 for c in twos)
    valid = [c for c in twos if _validates(c, 64)]
    assert valid and all((c.BLOCK_M, c.BLOCK_N, c.overlap) == (64, 64, 0) for c in valid)
    assert not [c for c in twos if _validates(c, 128)]


def _validates(cfg, head_dim) -> bool:
    try:
        cfg.validate_anywhere(head_dim, torch.bfloat16)
    except ConfigError:
        return False
    return True
    # the kernel's own config names the rule
    with pytest.raises(ConfigError, match=r"^O_TILE: .*PERSISTENT 1"):
        GluonFwdConfig(O_TILE=1).validate(128, torch.bfloat16)
    with pytest.raises(ConfigError, match=r"^O_TILE:"):
        GluonFwdConfig(PERSISTENT=1, O_TILE=2).validate(128, torch.bfloat16)
    assert GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1).validate(128, torch.bfloat16).O_TILE == 1
    # the search space offers it with the persistent grid only
    family1 = [c for c in candidates("fwd") if c.family]
    assert {(c.persistent, c.o_tile) for c in family1} == {(0, 0), (1, 0), (1, 1)}


@pytest.mark.parametrize("field, value", [("family", 2), ("pingpong", -1), ("family", 0.5)])
def test_bad_family_fields_are_named(field, value):
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        FwdConfig.from_dict({**FwdConfig(64, 64, 4, 2).to_dict(), field: value})


def test_the_search_space_has_both_families_and_the_cpu_only_the_triton_one():
    every = candidates("fwd")
    assert {c.family for c in every} == {0, 1}
    assert len({c for c in every if c.family}) == len([c for c in every if c.family])  # canonical: no repeats
    assert all(c.family == 0 for c in valid_candidates("fwd", 128, torch.bfloat16, "cpu"))
    with pytest.raises(ConfigError, match=r"^device:"):
        FwdConfig(64, 128, 4, 2, family=1).validate(128, torch.float16, "cpu")
    if not torch.cuda.is_available():  # no device: the current one, here the CPU
        with pytest.raises(ConfigError, match=r"^device:"):
            FwdConfig(64, 128, 4, 2, family=1).validate(128, torch.float16)
    assert family_defaults("fwd", 128, torch.float16, "cpu") == []


def test_on_sm90_the_gluon_default_validates_and_is_offered_first(sm):
    sm((9, 0))
    cfg, persistent, o_tiles, short_causal = family_defaults("fwd", 128, torch.bfloat16, "cuda")
    assert cfg.family == 1 and cfg.gluon() == default_gluon_config(128)
    # then the same with the persistent grid, then that with its O tiles (the search chooses per key)
    assert persistent == dataclasses.replace(cfg, persistent=1) and persistent.gluon().PERSISTENT == 1
    assert o_tiles == dataclasses.replace(persistent, o_tile=1) and o_tiles.gluon().O_TILE == 1
    # and with 64-key blocks (short causal calls)
    assert short_causal == dataclasses.replace(o_tiles, BLOCK_N=64, num_stages=3)
    assert family_defaults("fwd", 96, torch.bfloat16, "cuda") == []  # the Gluon kernel: D 64, 128 and 256
    # D=64: the same four, then two CTAs per SM on the grid and on the persistent kernel (the middle band's entries)
    d64 = family_defaults("fwd", 64, torch.bfloat16, "cuda")
    assert len(d64) == 6 and [c.occupancy for c in d64] == [1, 1, 1, 1, 2, 2]
    assert d64[-2:] == [default_config("fwd", 64, torch.bfloat16, "cuda", causal=c, seq_q=512)
                        for c in (False, True)]
    # D=256: 64-key blocks in 2 slots or 3 (V's ring then 2: what shared memory holds), grid and persistent, with
    # and without the overlap
    d256 = family_defaults("fwd", 256, torch.bfloat16, "cuda")
    assert [(c.BLOCK_N, c.num_stages, c.persistent, c.overlap, c.o_tile) for c in d256] == \
        [(64, n, p, o, 0) for n in (2, 3) for o in (1, 0) for p in (0, 1)]
    assert d256[0].gluon() == default_gluon_config(256)
    # the Gluon backward at D=256 (gluon/backward_wide.py): dQ fused with 3 and 2 slots, then the Triton dQ kernel
    fused3, fused2, wide1 = family_defaults("bwd", 256, torch.bfloat16, "cuda")
    assert [(c.family, c.BLOCK_M1, c.BLOCK_N1, c.num_stages) for c in (fused3, fused2, wide1)] == \
        [(3, 32, 64, 3), (3, 32, 64, 2), (1, 32, 64, 3)]
    assert fused3 == default_config("bwd", 256, torch.bfloat16, "cuda", causal=True, seq_q=4096)
    triton_256 = default_config("bwd", 256, torch.bfloat16, "cuda", triton_only=True)
    assert (wide1.BLOCK_M2, wide1.BLOCK_N2, wide1.dq_num_warps, wide1.dq_num_stages) == \
        (triton_256.BLOCK_M2, triton_256.BLOCK_N2, triton_256.dq_num_warps, triton_256.dq_num_stages)
    assert family_defaults("bwd", 96, torch.bfloat16, "cuda") == []  # the Gluon backward: D 64, 128 and 256
    with pytest.raises(ConfigError, match=r"^NUM_BUFFERS:.*shared memory"):  # 4 K and 3 V slots of 64 keys
        FwdConfig(64, 64, 4, 4, family=1).validate(256, torch.bfloat16, "cuda")
    with pytest.raises(ConfigError, match=r"^dtype:.*256"):
        GluonFwdConfig(BLOCK_N=64).validate(256, torch.float8_e4m3fn)
    assert family_defaults("fwd", 128, torch.float32, "cuda") == []
    # Gluon dK/dV with the Triton dQ half; both Gluon; dQ fused into the Gluon dK/dV kernel
    bwd, both, fused, fused_first, late, late_first = family_defaults("bwd", 128, torch.bfloat16, "cuda")
    assert both.family == 2 and both.gluon().DQ_BUFFERS == 3 and both.gluon().NUM_BUFFERS == 3
    assert fused.family == 3 and fused.gluon().DQ_FUSED == 1 and fused.BLOCK_M1 == 64
    assert late.family == 4 and late.gluon().DQ_FUSED == 2
    # each fused dQ with its share ahead of dV and dK too (the search chooses per key)
    for cfg, first in ((fused, fused_first), (late, late_first)):
        assert first == dataclasses.replace(cfg, dq_first=1) and first.gluon() == dataclasses.replace(
            cfg.gluon(), DQ_FIRST=1) and cfg.gluon().DQ_FIRST == 0
    triton_bwd = default_config("bwd", 128, torch.bfloat16, "cuda", triton_only=True)
    assert bwd.family == 1 and bwd.gluon() == configs_gluon.default_gluon_bwd_config(128)
    assert (bwd.BLOCK_M2, bwd.BLOCK_N2, bwd.dq_num_warps, bwd.dq_num_stages) == \
        (triton_bwd.BLOCK_M2, triton_bwd.BLOCK_N2, triton_bwd.dq_num_warps, triton_bwd.dq_num_stages)
    valid = valid_candidates("fwd", 64, torch.bfloat16, "cuda")
    assert any(c.family for c in valid) and any(not c.family for c in valid)
    with pytest.raises(ConfigError, match=r"^head_dim:"):
        FwdConfig(64, 128, 4, 2, family=1).validate(96, torch.bfloat16, "cuda")


def test_on_sm90_long_d128_backward_calls_default_to_the_gluon_families(sm):
    """From LONG_MIN_Q_BWD queries at D=128: dQ fused, under causal masking a step late (4), without
    masking in its step with the share ahead of dV and dK (3, dq_first); at D=64 a step late (4) from its own
    bounds, the share first without masking; shorter calls, other head dims and fp32 keep the Triton entries."""
    sm((9, 0))
    default = default_config
    long_q = bands.LONG_MIN_Q_BWD
    assert bands.is_long("bwd", long_q) and not bands.is_long("bwd", long_q - 1)
    causal = default("bwd", 128, torch.bfloat16, "cuda", causal=True, seq_q=long_q)
    assert (causal.family, causal.dq_first) == (4, 0) and causal.gluon().DQ_FUSED == 2
    full = default("bwd", 128, torch.float16, "cuda", causal=False, seq_q=4 * long_q)
    assert (full.family, full.dq_first) == (3, 1) and full.gluon().DQ_FIRST == 1
    assert default("bwd", 128, torch.bfloat16, "cuda", causal=True, seq_q=long_q - 1).family == 0
    # D=64: the fused family a step late from its own bounds, without masking the share first (256 queries),
    # causal in the usual order (4096); the Triton default below them; a head dim the tables pad to 64 (48)
    # shares them
    bounds = bands.LONG_MIN_Q_BWD_BY_HEAD_DIM
    full_q, causal_q = bounds[(64, False)], bounds[(64, True)]
    assert full_q < long_q < causal_q
    assert bands.long_bounds("bwd", torch.bfloat16, 48, causal=False) == (full_q, None)
    assert bands.long_bounds("bwd", torch.bfloat16, 48, causal=True) == (causal_q, None)
    assert bands.long_bounds("bwd", torch.bfloat16, 64) == (full_q, None)  # either masking: the lower
    assert bands.long_bounds("bwd", torch.bfloat16, 128, causal=True) == (long_q, None)
    for causal_, q in ((False, full_q), (True, causal_q)):
        assert bands.is_long("bwd", q, head_dim=64, causal=causal_)
        assert not bands.is_long("bwd", q - 1, head_dim=64, causal=causal_)
    assert bands.is_long("bwd", causal_q - 1, head_dim=128, causal=True)
    d64 = default("bwd", 64, torch.bfloat16, "cuda", causal=False, seq_q=full_q)
    assert (d64.family, d64.dq_first) == (4, 1) and d64.gluon().DQ_FIRST == 1
    assert default("bwd", 64, torch.float16, "cuda", causal=False, seq_q=full_q - 1).family == 0
    d64_causal = default("bwd", 64, torch.bfloat16, "cuda", causal=True, seq_q=causal_q)
    assert (d64_causal.family, d64_causal.dq_first) == (4, 0)
    assert default("bwd", 64, torch.bfloat16, "cuda", causal=True, seq_q=causal_q - 1).family == 0
    assert default("bwd", 128, torch.float32, "cuda", causal=True, seq_q=long_q).family == 0
    assert default("bwd", 128, torch.bfloat16, "cuda", causal=True, seq_q=long_q, triton_only=True).family == 0


@pytest.mark.parametrize("variant", [dict(softcap=2.0), dict(softcap=2.0, window_size=(5, 0))])
def test_a_call_the_gluon_kernel_cannot_run_runs_the_triton_default(monkeypatch, variant):
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter's check: on a GPU the Triton kernel would compile")
    launched = []
    real = triton_forward._attn_fwd_kernel.run

    def spy(*args, **kwargs):
        launched.append((kwargs["BLOCK_M"], kwargs["BLOCK_N"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(triton_forward._attn_fwd_kernel, "run", spy)
    monkeypatch.setattr(passes, "_gluon_forward",
                        lambda *a, **k: pytest.fail("the Gluon kernel has no " + str(variant)))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 37, 64, generator=gen) for _ in range(3))
    o, _ = passes.attention_forward(q, k, v, FwdConfig(16, 32, 4, 2, family=1), causal=True, sm_scale=0.125,
                                     **variant)
    ref, _ = reference_attention(q, k, v, causal=True, sm_scale=0.125, dtype=torch.float64, **variant)
    torch.testing.assert_close(o.double(), ref, atol=1e-4, rtol=0)
    triton = default_config("fwd", 64, torch.float32, "cpu", causal=True)
    assert triton.family == 0 and launched == [(triton.BLOCK_M, triton.BLOCK_N)]


def test_a_window_at_d256_runs_the_gluon_kernel(monkeypatch):
    """A D=256 call with a window and a Gluon config goes to the Gluon forward's WINDOW variant
    (test_gluon_gpu.py -k d256_window checks it on a GPU)."""
    seen = []

    def gluon(q, k, v, config, **kw):
        seen.append((q.shape[-1], kw["window_size"]))
        return torch.zeros_like(q), torch.zeros(q.shape[:3])

    monkeypatch.setattr(passes, "_gluon_forward", gluon)
    q, k, v = (torch.randn(1, 2, 33, 256) for _ in range(3))
    passes.attention_forward(q, k, v, FwdConfig(64, 64, 4, 3, family=1, persistent=1), causal=True,
                              sm_scale=0.0625, window_size=(7, 0))
    assert seen == [(256, (7, 0))]


def test_a_q_with_its_head_dim_strided_runs_the_triton_default_with_o_in_its_layout(monkeypatch):
    """o takes q's layout; the Gluon kernel writes o with its head dim contiguous, so such a q (a
    (B, H, D, N) tensor viewed as (B, H, N, D)) runs the Triton kernel (found on an H100: the test
    of that layout failed on o's strides once the defaults sent 1000-row calls to the Gluon kernel)."""
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter's check: on a GPU the Triton kernel would compile")
    monkeypatch.setattr(passes, "_gluon_forward", lambda *a, **k: pytest.fail("o's layout: the Triton kernel's"))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 64, 37, generator=gen).transpose(-1, -2)
    k, v = (torch.randn(1, 2, 37, 64, generator=gen) for _ in range(2))
    o, _ = passes.attention_forward(q, k, v, FwdConfig(16, 32, 4, 2, family=1), causal=True, sm_scale=0.125)
    assert o.stride() == q.stride()
    ref, _ = reference_attention(q, k, v, causal=True, sm_scale=0.125, dtype=torch.float64)
    torch.testing.assert_close(o.double(), ref, atol=1e-4, rtol=0)


def test_a_gluon_config_goes_to_the_gluon_kernel(monkeypatch):
    seen = []
    monkeypatch.setattr(passes, "_gluon_forward", lambda q, k, v, config, **kw: seen.append((config, kw)) or "o")
    q = torch.randn(1, 2, 8, 64)
    cfg = FwdConfig(64, 128, 4, 2, family=1)
    assert passes.attention_forward(q, q, q, cfg, causal=True, sm_scale=0.5, causal_align="bottom_right") == "o"
    assert seen == [(cfg, dict(causal=True, sm_scale=0.5, compile_only=False, causal_align="bottom_right",
                               window_size=None, v_descale=1.0, out_dtype=None))]


def test_a_window_goes_to_the_gluon_kernel_with_its_sides(monkeypatch):
    """The Gluon kernel runs sliding windows (its WINDOW variant): a window call with a
    Gluon config goes to it, the checked (left, right) passed on."""
    seen = []
    monkeypatch.setattr(passes, "_gluon_forward", lambda q, k, v, config, **kw: seen.append((config, kw)) or "o")
    q = torch.randn(1, 2, 8, 64)
    cfg = FwdConfig(64, 128, 4, 2, family=1)
    assert passes.attention_forward(q, q, q, cfg, causal=True, sm_scale=0.5, window_size=(4, 0)) == "o"
    assert seen == [(cfg, dict(causal=True, sm_scale=0.5, compile_only=False, causal_align="top_left",
                               window_size=(4, 0), v_descale=1.0, out_dtype=None))]


@pytest.mark.parametrize("keys_contiguous", [True, False])
def test_fp8_goes_to_the_gluon_kernel_when_v_has_its_keys_contiguous(monkeypatch, keys_contiguous):
    """fp8 with a Gluon config: the Gluon kernel's FP8 variant where V's keys are contiguous
    (the P V wgmma's K-major operand), the Triton kernel's default otherwise."""
    from flashtune.kernels.fp8 import keys_contiguous as relayout

    seen = []
    monkeypatch.setattr(passes, "_gluon_forward", lambda q, k, v, config, **kw: seen.append(kw) or ("o", None))
    q = torch.randn(1, 2, 40, 64).to(torch.float8_e4m3fn)
    v = relayout(q) if keys_contiguous else q
    cfg = FwdConfig(64, 128, 4, 2, family=1)
    if keys_contiguous:
        passes.attention_forward(q, q, v, cfg, causal=False, sm_scale=0.5, v_descale=0.25,
                                  out_dtype=torch.float16)
        assert seen == [dict(causal=False, sm_scale=0.5, compile_only=False, causal_align="top_left",
                             window_size=None, v_descale=0.25, out_dtype=torch.float16)]
    else:
        launched = []
        monkeypatch.setattr(launch, "launch", lambda kernel, *a, **kw: launched.append(kw["BLOCK_M"]))
        passes.attention_forward(q, q, v, cfg, causal=False, sm_scale=0.5, v_descale=0.25,
                                  out_dtype=torch.float16)
        assert seen == [] and len(launched) == 1


@pytest.mark.parametrize("capability", [(9, 0), (10, 0)])
def test_long_d128_forward_calls_default_to_the_gluon_kernel_on_sm90_only(sm, capability):
    """Long forward calls: at least LONG_MIN_Q queries against at least LONG_MIN_K keys (a
    square call from LONG_MIN_K, a chunk of 1024 queries over 16k keys)."""
    from flashtune.heuristics.bands import LONG_MIN_K, LONG_MIN_Q

    sm(capability)
    bf16 = torch.bfloat16
    for seq_q, seq_k in ((LONG_MIN_K, None), (LONG_MIN_Q, 16 * LONG_MIN_Q), (16384, 16384)):
        long = default_config("fwd", 128, bf16, "cuda", causal=True, seq_q=seq_q, seq_k=seq_k)
        assert long.family == (capability == (9, 0)), (seq_q, seq_k)
        if long.family:  # the default's shape with the persistent grid (its snake order) and O tiles, both maskings
            assert long.gluon() == dataclasses.replace(default_gluon_config(128), PERSISTENT=1,
                                                       O_TILE=1)
            full = default_config("fwd", 128, bf16, "cuda", causal=False, seq_q=seq_q, seq_k=seq_k)
            assert full == long
            assert default_config("fwd", 128, bf16, "cuda", seq_q=seq_q, seq_k=seq_k) == long  # either masking
    # below the thresholds, another head dim or dtype, unknown length: Triton's
    for cfg in (default_config("fwd", 128, bf16, "cuda", causal=True, seq_q=LONG_MIN_K - 1),
                default_config("fwd", 128, bf16, "cuda", causal=True, seq_q=LONG_MIN_Q, seq_k=LONG_MIN_K - 1),
                default_config("fwd", 128, bf16, "cuda", causal=True, seq_q=LONG_MIN_Q - 1, seq_k=16384),
                default_config("fwd", 128, torch.float32, "cuda", causal=False, seq_q=16384),
                default_config("fwd", 128, bf16, "cuda", causal=True)):
        assert cfg.family == 0


@pytest.mark.parametrize("capability", [(9, 0), (10, 0)])
def test_the_d64_forward_defaults_by_masking_and_length(sm, monkeypatch, capability):
    """D=64 (the sm_90 table's D=64 entries), three bands on sm_90: from 192 queries
    against 192 keys (the middle band) two CTAs per SM (the grid kernel without masking, the persistent one with
    O tiles causal, where its tiles fill the SMs), from 4096 queries against 512 keys (the long band, both
    maskings) the one-CTA persistent kernel; below, and on other devices, the Triton entries (128x64 w8 s3,
    causal 64x64 w4 s3, causal from 4096 128x64 again)."""
    from flashtune.heuristics.bands import (LONG_MIN_K, MID_MIN_TILES_PER_SM_CAUSAL, is_long, is_mid, long_bounds,
                                            mid_bounds)

    sm(capability)  # (an H100's 132 SMs)
    bf16 = torch.bfloat16
    for causal in (True, False, None):
        assert long_bounds("fwd", bf16, 64, causal=causal) == long_bounds("fwd", bf16, 48, causal=causal) == \
            (4096, LONG_MIN_K)
    assert mid_bounds(bf16, 64) == mid_bounds(torch.float16, 33) == (192, 192)
    assert mid_bounds(bf16, 128) is mid_bounds(torch.float8_e4m3fn, 64) is mid_bounds(bf16) is None
    for causal in (True, False):
        assert not is_mid("fwd", 191, dtype=bf16, head_dim=64, causal=causal)
        assert is_mid("fwd", 192, dtype=bf16, head_dim=64, causal=causal)
        assert is_mid("fwd", 4095, dtype=bf16, head_dim=64, causal=causal)
        assert not is_mid("fwd", 192, 191, dtype=bf16, head_dim=64, causal=causal)  # too few keys
        assert is_mid("fwd", 4096, 511, dtype=bf16, head_dim=64, causal=causal)  # too few keys for the long band
        assert not is_mid("fwd", 4096, dtype=bf16, head_dim=64, causal=causal)  # the long band's
        assert is_long("fwd", 4096, dtype=bf16, head_dim=64, causal=causal)
        assert not is_long("fwd", 4095, dtype=bf16, head_dim=64, causal=causal)
        assert not is_mid("bwd", 1024, dtype=bf16, head_dim=64, causal=causal)  # the forward's band only
        assert not is_mid("fwd", 1024, dtype=bf16, head_dim=128, causal=causal)  # D=128: no middle band
    triton_d64, short_causal = FwdConfig(128, 64, 8, 3), FwdConfig(64, 64, 4, 3)
    mid_full = FwdConfig(64, 64, 4, 2, family=1, pingpong=0, overlap=0, occupancy=2)
    mid_causal = FwdConfig(64, 64, 4, 2, family=1, overlap=0, persistent=1, o_tile=1, occupancy=2)
    long_gluon = FwdConfig(64, 128, 4, 3, family=1, pingpong=0, persistent=1, o_tile=1)
    sm90 = capability == (9, 0)
    cases = [  # (seq_q, seq_k, causal, sm_90's default, another device's)
        *((q, k, False, mid_full, triton_d64) for q, k in ((192, None), (257, 257), (512, 16384), (4095, None),
                                                            (4096, 511))),
        *((q, k, True, mid_causal, short_causal) for q, k in ((192, None), (512, None), (2048, None), (4095, 4095))),
        *((q, k, c, long_gluon, triton_d64) for q, k in ((4096, None), (4096, 512), (16384, None)) for c in (False, True)),
        *((q, k, False, triton_d64, triton_d64) for q, k in ((191, None), (16384, 191), (17, None), (None, None))),
        *((q, k, True, short_causal, short_causal) for q, k in ((191, None), (16384, 191), (None, None))),
    ]
    for seq_q, seq_k, causal, want_sm90, want_other in cases:
        got = default_config("fwd", 64, bf16, "cuda", causal=causal, seq_q=seq_q, seq_k=seq_k)
        assert got == (want_sm90 if sm90 else want_other), (seq_q, seq_k, causal)
    # a causal call's tiles of 128 query rows: at least MID_MIN_TILES_PER_SM_CAUSAL per SM for the band (batch x
    # query heads unknown: the lengths decide); without masking any number
    fill = MID_MIN_TILES_PER_SM_CAUSAL * 132
    for seq_q, tiles in ((512, 4), (2048, 16), (4095, 32)):  # of a head
        heads = -(-fill // tiles)  # the fewest batch x heads that fill
        assert is_mid("fwd", seq_q, dtype=bf16, head_dim=64, causal=True, batch_heads=heads, device="cuda")
        assert not is_mid("fwd", seq_q, dtype=bf16, head_dim=64, causal=True, batch_heads=heads - 1, device="cuda")
        assert is_mid("fwd", seq_q, dtype=bf16, head_dim=64, causal=False, batch_heads=1, device="cuda")
        few = default_config("fwd", 64, bf16, "cuda", causal=True, seq_q=seq_q, batch_heads=heads - 1)
        assert few == short_causal
        assert default_config("fwd", 64, bf16, "cuda", causal=True, seq_q=seq_q, batch_heads=heads) == \
            (mid_causal if sm90 else short_causal)
    # the launch path (passes.resolve_configs) reads the same band's entries (CPU tensors: the Gluon ones do not
    # validate there, the Triton ones serve)
    buckets = []
    default = passes._default

    def recording(pass_, head_dim, dtype, device, causal, bucket=None):
        buckets.append((pass_, bucket))
        return default(pass_, head_dim, dtype, device, causal, bucket)

    passes._default.cache_clear()
    monkeypatch.setattr(passes, "_default", recording)
    try:
        for n, heads, causal, bucket, want in ((191, 2, True, None, short_causal),
                                               (512, fill // 4, True, "mid", short_causal),
                                               (512, fill // 4 - 1, True, None, short_causal),  # too few tiles
                                               (512, 2, False, "mid", triton_d64), (4095, 2, False, "mid", triton_d64),
                                               (4096, 2, True, "long", triton_d64), (8, 2, True, "decode", None)):
            buckets.clear()
            got = passes.resolve_configs(torch.empty(1, heads, n, 64, dtype=bf16), None, None, causal=causal)[0]
            assert ("fwd", bucket) in buckets, (n, buckets)
            assert want is None or got == want.validate(64, bf16, "cpu"), n
    finally:
        default.cache_clear()
    # a call the Gluon kernels cannot run: the Triton default of its masking
    for cfg in (mid_full, mid_causal, long_gluon):
        assert passes.as_triton(cfg, 64, bf16, "cuda", causal=False) == triton_d64
        assert passes.as_triton(cfg, 64, bf16, "cuda", causal=True) == short_causal


@pytest.mark.parametrize("capability", [(9, 0), (10, 0)])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_long_d128_fp8_calls_default_to_the_gluon_kernel_on_sm90_only(sm, capability, dtype):
    """fp8 at D=128 on long calls: the Gluon kernel's FP8 variant on sm_90 (measured,
    docs/fp8.md); its fallback (V with the head dim contiguous, a softcap) and every other
    fp8 call: the Triton fp8 default of the sm_90 table (not the generic table's)."""
    from flashtune.heuristics.bands import LONG_MIN_K, LONG_MIN_K_FP8

    sm(capability)
    triton = FwdConfig(128, 128, 8, 3)
    for causal in (False, True):
        long = default_config("fwd", 128, dtype, "cuda", causal=causal, seq_q=LONG_MIN_K_FP8)
        if capability == (9, 0):
            assert long == FwdConfig(64, 128, 4, 2, family=1, pingpong=0, overlap=0)
        else:
            assert long == triton
        assert passes.as_triton(FwdConfig(64, 128, 4, 2, family=1), 128, dtype, "cuda", causal) == triton
        # fp8 has longer bounds than 16-bit calls: a call long for bf16 is not for fp8
        for cfg in (default_config("fwd", 128, dtype, "cuda", causal=causal, seq_q=LONG_MIN_K_FP8 // 2),
                    default_config("fwd", 128, dtype, "cuda", causal=causal, seq_q=LONG_MIN_K),
                    default_config("fwd", 128, dtype, "cuda", causal=causal),
                    default_config("fwd", 64, dtype, "cuda", causal=causal, seq_q=LONG_MIN_K_FP8)):
            assert cfg == triton


def test_the_triton_fallback_passes_over_a_gluon_entry_at_any_key(sm, monkeypatch):
    """as_triton's default never is a Gluon entry, also one a table serves for all lengths
    (not only from the long bucket): the Triton entry after it."""
    sm((9, 0))
    e4m3 = torch.float8_e4m3fn
    gluon = FwdConfig(64, 128, 4, 3, family=1, overlap=0)
    monkeypatch.setitem(tables.HEURISTICS[(9, 0)][0], (e4m3, 128, True), gluon)
    assert default_config("fwd", 128, e4m3, "cuda", causal=True) == gluon
    assert passes.as_triton(gluon, 128, e4m3, "cuda", True) == FwdConfig(128, 128, 8, 3)


def test_fp8_forward_calls_have_longer_bounds_than_16_bit_ones():
    from flashtune.heuristics.bands import LONG_MIN_K_FP8, LONG_MIN_Q, LONG_MIN_Q_FP8, is_long, long_bounds

    assert long_bounds("fwd", torch.float8_e5m2) == (LONG_MIN_Q_FP8, LONG_MIN_K_FP8) != long_bounds("fwd")
    for dtype in (None, torch.bfloat16, torch.float16):
        assert is_long("fwd", LONG_MIN_Q, dtype=dtype) and not is_long("fwd", LONG_MIN_Q - 1, dtype=dtype)
    assert not is_long("fwd", LONG_MIN_Q_FP8, LONG_MIN_K_FP8 - 1, torch.float8_e4m3fn)
    assert is_long("fwd", LONG_MIN_Q_FP8, LONG_MIN_K_FP8, torch.float8_e4m3fn)
    assert not is_long("fwd", LONG_MIN_Q_FP8 - 1, 16384, torch.float8_e4m3fn)


@pytest.mark.parametrize("n, n_k, bucket", [(2048, 2048, "long"), (5000, 5000, "long"), (1024, 16384, "long"),
                                           (2047, 2047, None), (1023, 16384, None), (1, 1, None)])
def test_attention_fp8_reads_the_long_entry_for_long_calls_only(monkeypatch, n, n_k, bucket):
    from flashtune.kernels import fp8

    asked = []
    monkeypatch.setattr(fp8, "_default", lambda pass_, d, dtype, device, causal, bucket=None:
                        asked.append(bucket) or FwdConfig(16, 32, 4, 1))
    monkeypatch.setattr(fp8, "attention_forward", lambda q, k, v, cfg, **kw: (q, None))
    q = torch.zeros(1, 1, n, 32, dtype=torch.float8_e4m3fn)
    k = torch.zeros(1, 1, n_k, 32, dtype=torch.float8_e4m3fn)
    fp8.attention_fp8(q, k, k, q_descale=1.0, k_descale=1.0, v_descale=1.0, causal=True)
    assert asked == [bucket]


def test_attention_defaults_read_the_long_entry_for_long_calls_only(monkeypatch):
    """flashtune.attention()'s heuristic configs: the long bucket (the Gluon kernel's forward
    entry on sm_90) for long calls (bands.is_long: queries and keys), unless packed or with
    dropout; the backward's long bucket from LONG_MIN_Q_BWD queries, never its decode one."""
    from flashtune.configs.base import DECODE_MAX_Q
    from flashtune.heuristics.bands import LONG_MIN_K, LONG_MIN_Q, LONG_MIN_Q_BWD

    asked = []
    monkeypatch.setattr(passes, "default_config",
                        lambda pass_, *a, seq_q=None, seq_k=None, **kw: asked.append((pass_, seq_q, seq_k))
                        or FwdConfig(16, 16, 4, 1))
    passes._default.cache_clear()
    fwd_long, bwd_long, decode = ("fwd", LONG_MIN_Q, LONG_MIN_K), ("bwd", LONG_MIN_Q_BWD, None), ("fwd", 1, None)
    neither = {p: (p, None, None) for p in ("fwd", "bwd")}
    # the cases below take the bounds as they are: one for the queries of both passes, the keys' no longer
    assert LONG_MIN_Q == LONG_MIN_Q_BWD and LONG_MIN_K <= LONG_MIN_Q
    try:
        for n, kwargs, fwd, bwd in ((4096, {}, fwd_long, bwd_long),
                                    (LONG_MIN_Q, {}, fwd_long, bwd_long),
                                    (LONG_MIN_Q, {"seq_k": 16384}, fwd_long, bwd_long),
                                    (LONG_MIN_Q, {"seq_k": LONG_MIN_K - 1}, neither["fwd"], bwd_long),
                                    (LONG_MIN_Q - 1, {"seq_k": 16384}, neither["fwd"], neither["bwd"]),
                                    (4096 + 3, {"dropout": True}, neither["fwd"], neither["bwd"]),
                                    (4096, {"varlen": True}, neither["fwd"], neither["bwd"]),
                                    (DECODE_MAX_Q, {"seq_k": 65536}, decode, neither["bwd"]),
                                    (100, {}, neither["fwd"], neither["bwd"])):
            asked.clear()
            passes._default.cache_clear()
            passes.resolve_configs(torch.empty(1, 2, n, 16), None, None, **kwargs)
            # the backward reads the long bucket only
            assert asked == [fwd, bwd], (n, kwargs)
    finally:
        passes._default.cache_clear()


def test_the_drop_in_reads_a_head_dims_own_backward_bound(monkeypatch):
    """resolve_configs buckets a backward call by its head dim's and masking's bound
    (LONG_MIN_Q_BWD_BY_HEAD_DIM): a D=64 call below its masking's bound reads no long entry, one at
    it reads the long entry at that bound (asked with its masking); a D=128 call of the same length
    reads the long entry at LONG_MIN_Q_BWD."""
    from flashtune.heuristics.bands import LONG_MIN_Q_BWD, LONG_MIN_Q_BWD_BY_HEAD_DIM

    asked = []
    monkeypatch.setattr(passes, "default_config",
                        lambda pass_, *a, causal=None, seq_q=None, seq_k=None, **kw:
                        asked.append((pass_, seq_q, causal)) or FwdConfig(16, 16, 4, 1))
    try:
        for causal in (False, True):
            d64_q = LONG_MIN_Q_BWD_BY_HEAD_DIM[(64, causal)]
            for n, d, bwd in ((d64_q - 1, 64, None), (d64_q, 64, d64_q), (d64_q, 48, d64_q),
                              (max(d64_q - 1, LONG_MIN_Q_BWD), 128, LONG_MIN_Q_BWD)):
                asked.clear()
                passes._default.cache_clear()
                passes.resolve_configs(torch.empty(1, 2, n, d), None, None, causal=causal)
                assert asked[1] == ("bwd", bwd, causal), (n, d, causal)
    finally:
        passes._default.cache_clear()


def test_persistent_config_counts_its_q_barriers():
    # two Q-empty mbarriers (8 bytes each) on top of the grid kernel's shared memory; D=128 with
    # 3 buffers still fits sm_90
    grid, persistent = GluonFwdConfig(NUM_BUFFERS=3), GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1)
    assert persistent.shared_memory(128, torch.bfloat16) == grid.shared_memory(128, torch.bfloat16) + 16
    assert persistent.validate(128, torch.bfloat16) is persistent
    assert persistent.short() == grid.short() + "P"


@pytest.mark.parametrize("cfg, head_dim, dtype, tma_store, expected", [
    # D=128: 2 x 16 KiB of O tiles fit beside 2 buffers (197 KB); beside 3 (262 KB) only with V's
    # ring a slot shorter (3 K, 2 V: 230 KB; persistent_v_buffers)
    (GluonFwdConfig(NUM_BUFFERS=2, PERSISTENT=1), 128, torch.bfloat16, True, (True, True)),
    (GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1), 128, torch.bfloat16, True, (True, True)),
    # 64-key blocks at D=128 fit the O tiles beside 4 slots of each
    (GluonFwdConfig(BLOCK_N=64, NUM_BUFFERS=4, PERSISTENT=1), 128, torch.bfloat16, True, (True, True)),
    # the register store never goes through Q: the Q tile is released early wherever the overlap runs
    (GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1), 128, torch.bfloat16, False, (False, True)),
    (GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1), 128, torch.float8_e4m3fn, False, (False, True)),
    # D=64 fits them at every ring; without the overlap Q is released after the blocks as before
    (GluonFwdConfig(NUM_BUFFERS=4, PERSISTENT=1), 64, torch.float16, True, (True, True)),
    (GluonFwdConfig(OVERLAP=0, PERSISTENT=1), 64, torch.bfloat16, True, (True, False)),
    (GluonFwdConfig(NUM_BUFFERS=2), 128, torch.bfloat16, True, (False, False)),  # the grid kernel: never
])
def test_persistent_o_tiles_where_shared_memory_holds_them(cfg, head_dim, dtype, tma_store, expected):
    without = cfg
    cfg = dataclasses.replace(cfg, O_TILE=1)
    assert gluon_persistent.persistent_o_tile(cfg, head_dim, dtype, tma_store) == expected
    assert gluon_persistent.persistent_o_tile(without, head_dim, dtype, tma_store) == (False, False)
    o_tile, _early = expected
    e = torch.empty((), dtype=dtype).element_size()
    assert cfg.shared_memory(head_dim, dtype, o_tile=True) == \
        cfg.shared_memory(head_dim, dtype) + 2 * cfg.BLOCK_M * head_dim * e
    v_buffers = gluon_persistent.persistent_v_buffers(cfg, head_dim, dtype, tma_store)
    assert gluon_persistent.persistent_v_buffers(without, head_dim, dtype, tma_store) == cfg.NUM_BUFFERS
    # V's ring is shortened only for the O tiles, by one slot, and only where the full ring has no room
    assert v_buffers == cfg.NUM_BUFFERS or (o_tile and v_buffers == cfg.NUM_BUFFERS - 1 and cfg.shared_memory(
        head_dim, dtype, o_tile=True) > device_mod.SM90_SHARED_MEMORY)
    assert (cfg.shared_memory(head_dim, dtype, o_tile=True, v_buffers=v_buffers)
            <= device_mod.SM90_SHARED_MEMORY) >= o_tile


def test_a_shorter_v_ring_counts_its_slots_and_barriers():
    cfg = GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1)
    e, d, block = 2, 128, 128 * 128 * 2
    assert cfg.shared_memory(d, torch.bfloat16, v_buffers=3) == cfg.shared_memory(d, torch.bfloat16)
    assert cfg.shared_memory(d, torch.bfloat16, v_buffers=2) == \
        cfg.shared_memory(d, torch.bfloat16) - block - configs_gluon.BARRIER_BYTES
    assert cfg.shared_memory(d, torch.bfloat16, o_tile=True, v_buffers=2) == \
        cfg.shared_memory(d, torch.bfloat16) + 2 * 64 * d * e - block - configs_gluon.BARRIER_BYTES
    assert cfg.shared_memory(d, torch.bfloat16, o_tile=True, v_buffers=2) <= device_mod.SM90_SHARED_MEMORY


@pytest.mark.parametrize("total, n_prog", [(t, p) for t in (1, 6, 131, 132, 133, 264, 265, 1000)
                                           for p in (1, 2, 7, 132) if p <= t])  # min(tiles, SMs) CTAs
def test_persistent_ctas_take_every_tile_once(total, n_prog):
    taken = [gluon_persistent.persistent_tiles(p, n_prog, total) for p in range(n_prog)]
    flat = sorted(t for tiles in taken for t in tiles)
    assert flat == list(range(total))
    for tiles in taken:  # one tile a round, in round order; CTAs differ by at most one tile
        assert [t // n_prog for t in tiles] == list(range(len(tiles)))
    assert max(map(len, taken)) - min(map(len, taken)) <= 1
    # in a snake: each odd round's tiles in reverse CTA order
    if total >= 2 * n_prog:
        assert [taken[p][1] for p in range(n_prog)] == list(range(2 * n_prog - 1, n_prog - 1, -1))


def _strided_loads(n: int, units: int, cfg: GluonFwdConfig, n_prog: int) -> list[int]:
    """Key blocks per CTA of the plain strided order (CTA p takes tiles p, p + n_prog, ... of the
    unit-major order, each unit's last query block first): what the snake order is measured against."""
    n_m = -(-n // (2 * cfg.BLOCK_M))
    loads = [0] * n_prog
    for t in range(n_m * units):
        pid_m = n_m - 1 - t % n_m
        loads[t % n_prog] += -(-min((pid_m + 1) * 2 * cfg.BLOCK_M, n) // cfg.BLOCK_N)
    return loads


def test_the_snake_order_balances_the_causal_rows():
    """The schedule's model (persistent_cta_blocks): with the snake order (unit-major or
    block-major, as persistent_lpt_units picks) the busiest CTA walks within 3.5 % of the mean
    key blocks on every causal D=128 grid row and on the grouped-query rows of few units, where
    the strided order gives CTA p the same query block of every unit (1.5x at N=512 and 16k);
    the grid rows up to 8k keep the unit-major order (a unit's tiles together: the K/V they
    share read once into L2), 16k and llama3-70b-tp8 (16 units) take the block-major one."""
    from flashtune.protocol import GRID_SEQ_LENS, grid_shape

    cfg = GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1)
    worst, orders = {}, {}
    rows = [(n, b * h) for n in GRID_SEQ_LENS for b, h in [grid_shape(128, n)]] + [(4096, 2 * 8), (4096, 28)]
    for n, units in rows:
        lpt = gluon_persistent.persistent_lpt_units(n, n, units, cfg, 132, causal=True, plain=True)
        orders[n, units] = lpt
        for snake in (False, True):
            loads = gluon_persistent.persistent_cta_blocks(n, n, units, cfg, 132, causal=True, lpt_units=lpt) \
                if snake else _strided_loads(n, units, cfg, 132)
            assert sum(loads) == units * sum(-(-min((m + 1) * 128, n) // 128) for m in range(-(-n // 128)))
            worst[n, units, snake] = max(loads) / (sum(loads) / len(loads))
    assert all(worst[n, units, True] < 1.035 for n, units in rows), worst
    assert worst[512, 512, False] > 1.4 and worst[16384, 16, False] > 1.4, worst
    assert all(orders[n, b * h] == 0 for n in GRID_SEQ_LENS[:-1] for b, h in [grid_shape(128, n)]), orders
    assert orders[16384, 16] == 16 and orders[4096, 16] == 16, orders


def test_the_snake_order_is_heaviest_first_for_causal_calls_only():
    lpt = gluon_persistent.persistent_lpt_units
    cfg = GluonFwdConfig(NUM_BUFFERS=3, PERSISTENT=1)
    assert lpt(4096, 4096, 16, cfg, 132, causal=True, plain=True) == 16
    assert lpt(4096, 4096, 16, cfg, 132, causal=False, plain=True) == 0
    assert lpt(4096, 4096, 16, cfg, 132, causal=True, plain=False) == 0  # a window: its own block ranges
    assert lpt(4096, 4096, 1, cfg, 132, causal=True, plain=True) == 0  # one unit: both orders are one


def test_a_trace_of_the_wrong_shape_or_dtype_is_refused_by_name():
    q, k, v = (torch.zeros(1, 4, 300, 64, dtype=torch.bfloat16) for _ in range(3))
    cfg = GluonFwdConfig()
    good = forward_launch.trace_buffer(q, k, cfg)
    # 3 tiles of 128 rows x 4 heads; 3 partitions; the header and 8 stamps for each of 3 key blocks
    assert tuple(good.shape) == (12, 3, 16 + 8 * 3) and good.dtype == torch.int64
    expected = r"^trace: expected a contiguous int64 tensor of shape \(12, 3, 40\)"
    for bad in (good[:, :, :-1], good.to(torch.int32), good.transpose(0, 1)):
        with pytest.raises(ValueError, match=expected):
            forward_launch.gluon_attention_forward(q, k, v, cfg, causal=False, trace=bad)
    with pytest.raises(ConfigError, match=r"^device:"):  # a good trace: the config's device check is next
        forward_launch.gluon_attention_forward(q, k, v, cfg, causal=False, trace=good)


def test_the_v_ring_is_one_slot_shorter_only_where_the_full_ring_does_not_fit():
    # D=256, 3 x 64-key slots: 3 K and 2 V slots fit (229 KB), 3 and 3 do not (261 KB)
    cfg = GluonFwdConfig(BLOCK_N=64, NUM_BUFFERS=3)
    assert cfg.shared_memory(256, torch.bfloat16) > device_mod.SM90_SHARED_MEMORY
    assert cfg.ring_v_buffers(256, torch.bfloat16) == 2
    assert cfg.validate(256, torch.bfloat16) is cfg
    assert gluon_persistent.persistent_v_buffers(cfg, 256, torch.bfloat16, True) == 2
    assert forward_launch.kernel_constexprs(cfg, 256, torch.bfloat16, False)["V_BUFFERS"] == 2
    # where the whole ring fits, V has as many slots as K
    for d, c in ((128, GluonFwdConfig(NUM_BUFFERS=3)), (64, GluonFwdConfig(NUM_BUFFERS=4)),
                 (256, GluonFwdConfig(BLOCK_N=64, NUM_BUFFERS=2))):
        assert c.ring_v_buffers(d, torch.bfloat16) == c.NUM_BUFFERS
        assert forward_launch.kernel_constexprs(c, d, torch.bfloat16, False)["V_BUFFERS"] == c.NUM_BUFFERS
