"""Bad input gives a clear TypeError/ValueError naming the argument, before any launch."""

from __future__ import annotations

import dataclasses

import math
import re

import pytest
import torch

from flashtune.configs import base as configs_base
from flashtune.heuristics import defaults as heuristics_defaults, tables
from flashtune.kernels import BwdConfig, ConfigError, FwdConfig, api, attention, default_config, passes
from flashtune.configs.backward import dkdv_split

F, B = FwdConfig, BwdConfig


def qkv(shape_q=(1, 2, 17, 16), shape_kv=None, dtype=torch.float32, device="cpu"):
    shape_kv = shape_kv or shape_q
    return (torch.randn(shape_q, dtype=dtype, device=device), torch.randn(shape_kv, dtype=dtype, device=device),
            torch.randn(shape_kv, dtype=dtype, device=device))


def raises(exc, *words):
    """pytest.raises for ``exc`` whose message contains every word (case-sensitive)."""
    return pytest.raises(exc, match="".join(f"(?=.*{re.escape(w)})" for w in words))


@pytest.fixture(autouse=True)
def _no_launch(monkeypatch):
    """A rejected input must never reach a kernel: make any launch fail loudly."""
    def launched(*args, **kwargs):
        raise AssertionError("a kernel was launched for an input that should have been rejected")

    monkeypatch.setattr(api, "attention_forward", launched)
    monkeypatch.setattr(api, "attention_backward", launched)
    # validated configs are cached: start and end with an empty cache, so a test that
    # shrinks the shared-memory limit sees its own verdict
    passes._validated.cache_clear()
    passes._default.cache_clear()
    yield
    passes._validated.cache_clear()
    passes._default.cache_clear()


# ----------------------------------------------------------------------------------
# Tensors
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_not_a_tensor(name):
    args = dict(zip("qkv", qkv()))
    args[name] = args[name].tolist()
    with raises(TypeError, f"{name}:", "torch.Tensor", "list"):
        attention(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("shape", [(2, 17, 16), (1, 1, 2, 17, 16)], ids=["3d", "5d"])
def test_wrong_rank(name, shape):
    args = dict(zip("qkv", qkv()))
    args[name] = torch.randn(shape)
    with raises(ValueError, f"{name}:", "4-D", str(shape)):
        attention(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64, torch.bool, torch.complex64])
def test_unsupported_dtype(dtype):
    q, k, v = (torch.ones(1, 2, 17, 16, dtype=dtype) for _ in range(3))
    with raises(TypeError, "q:", "float16, bfloat16 or float32", str(dtype)):
        attention(q, k, v)


@pytest.mark.parametrize("name", ["k", "v"])
def test_mismatched_dtypes(name):
    args = dict(zip("qkv", qkv()))
    args[name] = args[name].half()
    with raises(TypeError, f"{name}:", "torch.float32", "torch.float16"):
        attention(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("name", ["k", "v"])
def test_mismatched_devices(name):
    # a 'meta' tensor stands in for "a tensor on another device" on a machine without a GPU
    args = dict(zip("qkv", qkv()))
    args[name] = args[name].to("meta")
    with raises(ValueError, f"{name}:", "device", "meta"):
        attention(args["q"], args["k"], args["v"])


def test_unsupported_device():
    q, k, v = (t.to("meta") for t in qkv())
    with raises(ValueError, "q:", "CUDA", "meta"):
        attention(q, k, v)


def test_cpu_tensors_without_interpreter(monkeypatch):
    monkeypatch.setattr(api, "INTERPRETER", False)
    with raises(ValueError, "q:", "CPU", "TRITON_INTERPRET=1"):
        attention(*qkv())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for a cpu-vs-cuda mismatch")
def test_cpu_vs_cuda():
    q, k, v = qkv()
    with raises(ValueError, "k:", "cuda"):
        attention(q, k.cuda(), v)


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_empty_tensor(name):
    args = dict(zip("qkv", qkv()))
    args[name] = args[name][:, :, :0]
    with raises(ValueError, f"{name}:", "non-empty"):
        attention(args["q"], args["k"], args["v"])


def test_head_dim_zero():
    q, k, v = qkv((1, 2, 17, 0))
    with raises(ValueError, "q:", "non-empty"):
        attention(q, k, v)


@pytest.mark.parametrize("d", [257, 320, 512])
def test_head_dim_too_large(d):
    with raises(ValueError, "head_dim", "256", str(d)):
        attention(*qkv((1, 2, 5, d)))


@pytest.mark.parametrize("d_kv", [8, 32])
def test_mismatched_head_dim(d_kv):
    with raises(ValueError, "k, v:", "head_dim 16", str(d_kv)):
        attention(*qkv((1, 2, 17, 16), (1, 2, 17, d_kv)))


def test_mismatched_head_dim_of_v_only():
    q, k, _ = qkv()
    v = torch.randn(1, 2, 17, 32)
    with raises(ValueError, "head_dim 16", "32"):
        attention(q, k, v)


@pytest.mark.parametrize("hq,hkv", [(4, 3), (3, 2), (2, 4)])
def test_heads_not_a_multiple(hq, hkv):
    with raises(ValueError, "k:", f"({hq})", f"({hkv})", "multiple"):
        attention(*qkv((1, hq, 17, 16), (1, hkv, 17, 16)))


def test_mismatched_batch():
    with raises(ValueError, "batch size 2", "1"):
        attention(*qkv((2, 2, 17, 16), (1, 2, 17, 16)))


def test_k_v_seq_len_mismatch():
    q, k, _ = qkv()
    v = torch.randn(1, 2, 18, 16)
    with raises(ValueError, "v:", "seq_len", "(2, 17)", "(2, 18)"):
        attention(q, k, v)


def test_k_v_heads_mismatch():
    q, k, _ = qkv((1, 4, 17, 16), (1, 2, 17, 16))
    v = torch.randn(1, 4, 17, 16)
    with raises(ValueError, "v:", "heads"):
        attention(q, k, v)


# ----------------------------------------------------------------------------------
# Scalars
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, "x", True, [0.5]], ids=repr)
def test_bad_sm_scale(scale):
    with raises((TypeError, ValueError), "sm_scale:", "finite number"):
        attention(*qkv(), sm_scale=scale)


def test_numpy_scalar_sm_scale_is_a_number():
    import numpy as np

    scale = api.check_inputs(*qkv(), sm_scale=np.float32(0.5))
    assert scale == 0.5 and type(scale) is float


def test_a_numpy_bool_causal_is_named_in_the_error():
    import numpy as np

    with raises(TypeError, "causal:", "expected a bool", "numpy"):
        attention(*qkv(), causal=np.bool_(True))


@pytest.mark.parametrize("precision", ["fp32", "TF32", "highest", "tf32x2", ""], ids=repr)
def test_bad_fp32_precision(precision):
    with raises(ValueError, "fp32_precision:", "'tf32'", "'tf32x3'", "'ieee'"):
        attention(*qkv(), fp32_precision=precision)


@pytest.mark.parametrize("causal", [1, 0, "yes", None], ids=repr)
def test_non_bool_causal(causal):
    with raises(TypeError, "causal:", "bool"):
        attention(*qkv(), causal=causal)


# ----------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------
BAD_FWD = [
    (F(24, 16, 4, 1), "BLOCK_M"), (F(16, 512, 4, 1), "BLOCK_N"), (F(8, 16, 4, 1), "BLOCK_M"),
    (F(0, 16, 4, 1), "BLOCK_M"), (F(-16, 16, 4, 1), "BLOCK_M"),
    (F(16, 16, 3, 1), "num_warps"), (F(16, 16, 32, 1), "num_warps"), (F(16, 16, 0, 1), "num_warps"),
    (F(16, 16, 4, 0), "num_stages"), (F(16, 16, 4, 9), "num_stages"),
    (F(16.0, 16, 4, 1), "BLOCK_M"), (F(16, "16", 4, 1), "BLOCK_N"), (F(True, 16, 4, 1), "BLOCK_M"),
    (F(16, 16, 4.0, 1), "num_warps"), (F(16, 16, True, 1), "num_warps"), (F(16, 16, 4, 1.0), "num_stages"),
    (F(16, 16, 4, True), "num_stages"), (F([16], 16, 4, 1), "BLOCK_M"),
    (F(16, 16, 4, 1, tma=2), "tma"), (F(16, 16, 4, 1, tma="1"), "tma"), (F(16, 16, 4, 1, tma=1.0), "tma"),
]
BAD_BWD = [
    (B(24, 16, 16, 16, 4, 1), "BLOCK_M1"), (B(16, 512, 16, 16, 4, 1), "BLOCK_N1"),
    (B(16, 16, 48, 16, 4, 1), "BLOCK_M2"), (B(16, 16, 16, 4, 4, 1), "BLOCK_N2"),
    (B(16, 16, 16, 16, 3, 1), "num_warps"), (B(16, 16, 16, 16, 4, 0), "num_stages"),
    (B(16, 16, 16, 16.0, 4, 1), "BLOCK_N2"), (B(16, 16, 16, 16, 4, None), "num_stages"),
    (B(16, 16, 16, 16, 4, 1, dq_num_warps=3), "dq_num_warps"), (B(16, 16, 16, 16, 4, 1, dq_num_stages=0), "dq_num_stages"),
    (B(16, 16, 16, 16, 4, 1, dq_num_stages=2.0), "dq_num_stages"), (B(16, 16, 16, 16, 4, 1, atomic_dq=2), "atomic_dq"),
    (B(16, 16, 16, 16, 4, 1, atomic_dq="yes"), "atomic_dq"), (B(16, 16, 16, 16, 4, 1, atomic_dq=1.0), "atomic_dq"),
    (B(16, 16, 16, 16, 4, 1, tma=-1), "tma"), (B(16, 16, 16, 16, 4, 1, tma=None), "tma"),
    (B(16, 16, 16, 16, 4, 1, dkdv_split=-1), "dkdv_split"), (B(16, 16, 16, 16, 4, 1, dkdv_split=17), "dkdv_split"),
    (B(16, 16, 16, 16, 4, 1, dkdv_split=2.0), "dkdv_split"), (B(16, 16, 16, 16, 4, 1, dkdv_split=True), "dkdv_split"),
    (B(16, 16, 16, 16, 4, 1, dkdv_split=None), "dkdv_split"),
]


def _cfg_id(x):
    return x.short() if isinstance(x, (FwdConfig, BwdConfig)) else str(x)


@pytest.mark.parametrize("cfg,field", BAD_FWD + BAD_BWD, ids=_cfg_id)
def test_invalid_config_validate(cfg, field):
    with raises(ConfigError, f"{field}:"):
        cfg.validate(16, torch.float16, "cpu")


@pytest.mark.parametrize("cfg,field", BAD_FWD + BAD_BWD, ids=_cfg_id)
def test_invalid_config_attention(cfg, field):
    kw = {"fwd_config" if isinstance(cfg, FwdConfig) else "bwd_config": cfg}
    with raises(ConfigError, f"{field}:"):
        attention(*qkv(), **kw)


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("kw,expected", [
    ({"fwd_config": B(16, 16, 16, 16, 4, 1)}, "fwd_config: expected a FwdConfig"),
    ({"bwd_config": F(16, 16, 4, 1)}, "bwd_config: expected a BwdConfig"),
    ({"fwd_config": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}}, "fwd_config:"),
    ({"bwd_config": (16, 16, 16, 16, 4, 1)}, "bwd_config:"),
], ids=["bwd-as-fwd", "fwd-as-bwd", "dict", "tuple"])
def test_config_of_wrong_type(kw, expected):
    with raises(TypeError, expected):
        attention(*qkv(), **kw)


@pytest.mark.parametrize("cfg", [F(256, 128, 8, 4), B(64, 128, 128, 64, 8, 3)], ids=_cfg_id)
def test_shared_memory_rejected(cfg, monkeypatch):
    head_dim, dtype = 128, torch.bfloat16
    need = cfg.shared_memory(head_dim, dtype)
    cfg.validate(head_dim, dtype, "cpu")  # the interpreter has no limit
    monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: need - 1)
    with raises(ConfigError, "shared memory", str(need), str(need - 1)):
        cfg.validate(head_dim, dtype, "cpu")
    kw = {"fwd_config" if isinstance(cfg, FwdConfig) else "bwd_config": cfg}
    with raises(ConfigError, "shared memory"):
        attention(*qkv((1, 2, 17, head_dim), dtype=torch.float16), **kw)
    monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: need)
    assert cfg.validate(head_dim, dtype, "cpu") is cfg


def test_shared_memory_grows_with_blocks_stages_and_head_dim():
    base = F(64, 64, 4, 2)
    m = base.shared_memory(64, torch.float16)
    assert F(128, 64, 4, 2).shared_memory(64, torch.float16) > m
    assert F(64, 128, 4, 2).shared_memory(64, torch.float16) > m
    assert F(64, 64, 4, 3).shared_memory(64, torch.float16) > m
    assert base.shared_memory(128, torch.float16) > m
    assert base.shared_memory(64, torch.float32) > m
    assert base.shared_memory(48, torch.float16) == m  # padded to 64


@pytest.mark.parametrize("cls,data,words", [
    (F, {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4}, ["missing", "num_stages"]),
    (F, {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "BLOCK_D": 64}, ["unknown", "BLOCK_D"]),
    (B, {"BLOCK_M1": 16, "BLOCK_N1": 16, "BLOCK_M2": 16, "num_warps": 4, "num_stages": 1},
     ["missing", "BLOCK_N2"]),
    (B, {}, ["missing", "BLOCK_M1", "num_stages"]),
    (F, [16, 16, 4, 1], ["mapping"]),
    (F, {"BLOCK_M": 24, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}, ["BLOCK_M:"]),
], ids=["fwd-missing", "fwd-unknown", "bwd-missing", "bwd-empty", "not-a-mapping", "bad-value"])
def test_from_dict_errors(cls, data, words):
    with raises(ConfigError, *words):
        cls.from_dict(data)


@pytest.mark.parametrize("cfg", [F(32, 16, 4, 2), F(64, 64, 4, 3, tma=1), B(16, 32, 64, 16, 8, 3),
                                 B(16, 32, 64, 16, 8, 3, 4, 1), B(64, 128, 128, 64, 8, 3, atomic_dq=1),
                                 B(64, 128, 128, 64, 8, 3, atomic_dq=1, tma=1)], ids=_cfg_id)
def test_from_dict_round_trip(cfg):
    assert type(cfg).from_dict(cfg.to_dict()) == cfg


def test_configs_stored_before_the_tma_field_load_pointer_loads():
    fwd = F.from_dict({"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3})
    assert fwd == F(64, 32, 4, 3) and fwd.tma == 0 and fwd.to_dict()["tma"] == 0
    bwd = B.from_dict({"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "num_warps": 8,
                       "num_stages": 2, "dq_num_warps": 4, "dq_num_stages": 1, "atomic_dq": 1})
    assert bwd.tma == 0 and bwd == B(32, 64, 64, 32, 8, 2, 4, 1, atomic_dq=1)
    assert F(64, 32, 4, 3, tma=True).tma == 1 and B(16, 16, 16, 16, 4, 1, tma=True).tma == 1


def test_configs_stored_before_the_dkdv_split_field_split_at_launch():
    bwd = B.from_dict({"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "num_warps": 8,
                       "num_stages": 2, "dq_num_warps": 4, "dq_num_stages": 1, "atomic_dq": 0, "tma": 1})
    assert bwd.dkdv_split == 0 and bwd == B(32, 64, 64, 32, 8, 2, 4, 1, tma=1)
    assert B.from_dict(B(32, 64, 64, 32, 8, 2, dkdv_split=4).to_dict()).dkdv_split == 4


@pytest.mark.parametrize("shape,split,expected", [
    # (B, Hq, Hkv, N), with BLOCK_M1=64 BLOCK_N1=128 and 132 SMs (target 528 programs)
    ((2, 8, 1, 4096), 0, (8, 1)),  # 64 programs: the whole group of 8
    ((1, 32, 8, 8192), 0, (2, 1)),  # 512 programs: the smallest divisor that reaches 528
    ((1, 28, 4, 4096), 0, (7, 1)),  # group 7: 2 and 4 do not divide it
    ((4, 32, 8, 4096), 0, (1, 1)),  # 1024 programs: no split
    ((1, 8, 1, 1024), 0, (8, 2)),  # 8 programs x 8 heads: still under half full, query chunks of 8 blocks
    ((1, 4, 4, 8192), 0, (1, 2)),  # MHA, 256 programs: query chunks only
    ((1, 2, 2, 256), 0, (1, 1)),  # 4 query blocks: too few to chunk
    ((1, 32, 1, 4096), 0, (16, 1)),  # group 32: at most 16 programs per key block
    ((2, 8, 1, 4096), 3, (1, 3)),  # explicit: gcd with the group, the rest in query chunks
    ((2, 8, 2, 4096), 8, (4, 2)),
    ((2, 8, 1, 50), 16, (8, 1)),  # no more chunks than query blocks (one here)
    ((2, 8, 1, 4096), 1, (1, 1)),
    ((2, 8, 1, 4096), 16, (8, 2)),  # 64 programs x 16 = 1024, within twice the target
    ((16, 32, 8, 8192), 8, (1, 1)),  # 8192 programs: an explicit split is lowered, here to none
    ((4, 32, 8, 2048), 8, (2, 1)),  # 512 programs: lowered to 2
])
def test_dkdv_split_choice(shape, split, expected):
    b, hq, hkv, n = shape
    cfg = B(64, 128, 128, 64, 8, 3, dkdv_split=split)
    assert dkdv_split(cfg, batch=b, heads_q=hq, heads_kv=hkv, n_q=n, n_k=n, sm_count=132) == expected


@pytest.mark.parametrize("cfg", [F(16, 16, 4, 1, tma=1), B(16, 16, 16, 16, 4, 1, tma=1)], ids=_cfg_id)
def test_tma_is_limited_to_what_ran_on_the_gpu(cfg, monkeypatch):
    """TMA loads: 16-bit dtypes, head dims up to 128, compute capability 9.0 or newer."""
    for dtype in (torch.float16, torch.bfloat16):
        assert cfg.validate(128, dtype, "cpu") is cfg and cfg.validate(40, dtype, "cpu") is cfg
    with raises(ConfigError, "tma:", "head_dim 129", "tma=0"):
        cfg.validate(129, torch.float16, "cpu")
    with raises(ConfigError, "tma:", "float32", "tma=0"):
        cfg.validate(64, torch.float32, "cpu")
    monkeypatch.setattr(configs_base, "device_capability", lambda device: (8, 0))
    monkeypatch.setattr(heuristics_defaults, "device_capability", lambda device: (8, 0))
    with raises(ConfigError, "tma:", "compute capability 9.0", "8.0"):
        cfg.validate(64, torch.float16, "cuda")
    kw = {"fwd_config" if isinstance(cfg, FwdConfig) else "bwd_config": cfg}
    with raises(ConfigError, "tma:"):
        attention(*qkv((1, 2, 17, 64)), **kw)  # float32


def test_tma_adds_its_barriers_to_the_shared_memory_estimate():
    for plain in (F(128, 128, 8, 3), B(64, 128, 128, 64, 8, 3)):
        tma = dataclasses.replace(plain, tma=1)
        assert tma.shared_memory(128, torch.bfloat16) == plain.shared_memory(128, torch.bfloat16) + 1024


def test_atomic_dq_through_tma_stages_the_fp32_dq_tile():
    """With tma=1 an atomic config's dQ goes by bulk reduce-adds from a staged fp32 tile:
    its estimate holds that tile (BLOCK_M1 x padded D x 4 bytes) besides the walked tiles."""
    cfg = B(64, 128, 128, 64, 8, 3, atomic_dq=1, tma=1)
    tiles = 2 * 128 * (2 * 128 + 2 * 3 * 64)
    assert cfg.shared_memory(128, torch.bfloat16) >= tiles + 4 * 64 * 128
    # and it still fits an H100/H200 (it ran there, 215040 bytes compiled)
    assert cfg.shared_memory(128, torch.bfloat16) <= 232448


def test_bwd_config_stored_before_the_dq_fields_launches_both_kernels_alike():
    old = {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "num_warps": 8, "num_stages": 2}
    cfg = B.from_dict(old)
    assert (cfg.dq_num_warps, cfg.dq_num_stages, cfg.atomic_dq) == (8, 2, 0)
    assert cfg == B(32, 64, 64, 32, 8, 2) == B(32, 64, 64, 32, 8, 2, 8, 2, 0)
    assert cfg.to_dict() == {**old, "dq_num_warps": 8, "dq_num_stages": 2, "atomic_dq": 0, "tma": 0, "dkdv_split": 0,
                             "family": 0, "dq_first": 0}


def test_bwd_canonical_drops_the_unused_dq_fields_of_atomic_configs():
    plain = B(32, 64, 128, 16, 8, 2, 4, 1)
    assert plain.canonical() is plain
    a, b = B(32, 64, 128, 16, 8, 2, 4, 1, atomic_dq=1), B(32, 64, 32, 64, 8, 2, 8, 3, atomic_dq=1)
    assert a != b and a.canonical() == b.canonical() == B(32, 64, 64, 32, 8, 2, 8, 2, atomic_dq=1)
    # the canonical form fits wherever the config does (its dQ kernel, run under
    # deterministic mode, needs no more shared memory than its dK/dV kernel)
    for cfg in (a, b):
        assert cfg.canonical().shared_memory(128, torch.bfloat16) <= cfg.shared_memory(128, torch.bfloat16)
    assert a.canonical().shared_memory(128, torch.bfloat16) == a.shared_memory(128, torch.bfloat16)
    # the TMA flag is part of the launch: configs differing in it stay apart
    assert dataclasses.replace(a, tma=1).canonical() == dataclasses.replace(a.canonical(), tma=1) != a.canonical()


def test_atomic_dq_is_limited_to_head_dims_it_was_measured_for():
    cfg = B(16, 16, 16, 16, 4, 1, atomic_dq=1)
    assert cfg.validate(128, torch.float16, "cpu") is cfg
    assert cfg.validate(100, torch.float16, "cpu") is cfg
    with raises(ConfigError, "atomic_dq:", "head_dim 129", "atomic_dq=0"):
        cfg.validate(129, torch.float16, "cpu")
    with raises(ConfigError, "atomic_dq:"):
        attention(*qkv((1, 2, 17, 200), dtype=torch.float16), bwd_config=cfg)


# ----------------------------------------------------------------------------------
# Heuristic defaults
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_default_config_valid_for_every_head_dim(pass_, dtype):
    cls = FwdConfig if pass_ == "fwd" else BwdConfig
    for head_dim in range(1, 257):
        cfg = default_config(pass_, head_dim, dtype, "cpu")
        assert isinstance(cfg, cls), (head_dim, cfg)
        cfg.validate(head_dim, dtype, "cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_default_config_respects_a_small_device(pass_, dtype, monkeypatch):
    # with an sm_86-sized shared memory (99 KiB) the lookup falls back to configs that fit
    limit = 101376
    monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: limit)
    for head_dim in (16, 64, 80, 128, 256):
        cfg = default_config(pass_, head_dim, dtype, "cpu")
        assert cfg.shared_memory(head_dim, dtype) <= limit, (head_dim, cfg)


def test_default_config_no_fit(monkeypatch):
    monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: 1024)
    with raises(ConfigError, "no valid default fwd config", "head_dim=64"):
        default_config("fwd", 64, torch.float16, "cpu")


def test_default_config_bad_pass():
    with raises(ValueError, "pass_:", "'fwd'", "'bwd'"):
        default_config("forward", 64, torch.float16, "cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_default_config_prefers_an_entry_for_the_masking(dtype, monkeypatch):
    # sm_90's table has a non-causal entry for bf16 (and so fp16) D=128
    monkeypatch.setattr(configs_base, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(heuristics_defaults, "device_capability", lambda device: (9, 0))
    full = default_config("fwd", 128, dtype, "cpu", causal=False)
    either = default_config("fwd", 128, dtype, "cpu")
    assert full == tables.HEURISTICS[(9, 0)][0][(torch.bfloat16, 128, False)]
    assert default_config("fwd", 128, dtype, "cpu", causal=True) == either != full
    assert default_config("fwd", 100, dtype, "cpu", causal=False) == full  # padded to 128
    # one that does not fit the device gives way to the entry for both maskings
    big = FwdConfig(256, 128, 8, 4)
    monkeypatch.setitem(tables.HEURISTICS[(9, 0)][0], (torch.bfloat16, 128, False), big)
    monkeypatch.setattr(configs_base, "shared_memory_limit", lambda device: either.shared_memory(128, dtype))
    assert big.shared_memory(128, dtype) > either.shared_memory(128, dtype)
    assert default_config("fwd", 128, dtype, "cpu", causal=False) == either
