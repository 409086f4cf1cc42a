"""The D=256 Gluon dK/dV kernel (kernels/gluon/backward_wide.py) on the CPU: its config checks
(configs/gluon.validate_wide), its shared-memory count, its compile for sm_90 (ptxas, no GPU:
registers, spills, shared memory, the matmuls and copies it issues) and which BwdConfig families
reach it.

Nothing here runs the kernel: its numbers are checked by test_gluon_bwd_wide_gpu.py on a GPU.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
import torch
from kernel_checks import compile_for_sm90

backward_launch = pytest.importorskip("flashtune.kernels.gluon.backward_launch", reason="this triton has no Gluon")
from flashtune.configs import gluon as wide  # noqa: E402  (validate_wide, wide_shared_memory, default_wide_config)
from flashtune.configs.backward import BwdConfig  # noqa: E402
from flashtune.configs.base import ConfigError  # noqa: E402

C = wide.GluonBwdConfig
SCRIPT = pathlib.Path(__file__).with_name("gluon_compile_sm90.py")
SM90_SHARED_MEMORY = 232448
W = wide.default_wide_config()


@pytest.mark.parametrize("cfg,dtype,field", [
    (dataclasses.replace(W, BLOCK_M=64), torch.bfloat16, "BLOCK_M"),
    (dataclasses.replace(W, BLOCK_N=128), torch.bfloat16, "BLOCK_N"),
    (dataclasses.replace(W, DQ_FUSED=2), torch.bfloat16, "DQ_FUSED"),
    (dataclasses.replace(W, DQ_FIRST=1), torch.bfloat16, "DQ_FIRST"),
    (dataclasses.replace(W, NUM_BUFFERS=1), torch.bfloat16, "NUM_BUFFERS"),
    (dataclasses.replace(W, NUM_BUFFERS=4), torch.bfloat16, "NUM_BUFFERS"),  # 4 x 32 KiB of Q/dO: too much
    (W, torch.float32, "dtype"),
    (dataclasses.replace(W, BLOCK_M=32.0), torch.bfloat16, "BLOCK_M"),
    (dataclasses.replace(W, DQ_FUSED=True), torch.bfloat16, "DQ_FUSED"),
])
def test_invalid_wide_configs_name_their_field(cfg, dtype, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        wide.validate_wide(cfg, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("buffers,fused", [(2, 0), (2, 1), (3, 0), (3, 1)])
def test_the_wide_configs_that_fit_validate(dtype, buffers, fused):
    cfg = dataclasses.replace(W, NUM_BUFFERS=buffers, DQ_FUSED=fused)
    assert wide.validate_wide(cfg, dtype) is cfg
    assert wide.wide_shared_memory(cfg, dtype) <= SM90_SHARED_MEMORY


def test_the_shared_memory_count():
    # K and V (2 x 64 x 256 x 2), a slot of Q and dO (2 x 32 x 256 x 2), the exchange (two slots of a
    # 16-bit P^T, an fp32 P^T and a 16-bit dS^T of 64 x 32), the dQ staging (2 groups x 32 x 128 x 4)
    base = dataclasses.replace(W, NUM_BUFFERS=2, DQ_FUSED=0)
    e = wide.wide_shared_memory(base, torch.bfloat16)
    assert wide.wide_shared_memory(dataclasses.replace(base, NUM_BUFFERS=3), torch.bfloat16) - e == 2 * 32 * 256 * 2 \
        + 3 * 8
    assert wide.wide_shared_memory(dataclasses.replace(base, DQ_FUSED=1), torch.bfloat16) - e == 2 * 32 * 128 * 4
    assert e >= 2 * 64 * 256 * 2 + 2 * 2 * 32 * 256 * 2 + 2 * (64 * 32 * 2 + 64 * 32 * 4 + 64 * 32 * 2)


def test_the_wide_kernel_is_refused_off_sm90():
    with pytest.raises(ConfigError, match="^device:"):
        wide.validate_wide(W, torch.bfloat16, torch.device("cpu"))


def _bwd(family, **fields):
    base = dict(BLOCK_M1=32, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, num_warps=4, num_stages=3, family=family)
    return BwdConfig(**{**base, **fields})


def test_head_dim_256_is_the_d256_kernels_in_families_1_and_3():
    """Families 1 and 3 at D=256 are the D=256 kernel's configs (validate_wide's rules: 32 query rows,
    dQ in the step or by the Triton kernel); families 2 and 4 and other blocks are refused by name."""
    for family in (1, 3):
        cfg = _bwd(family)
        assert cfg.validate_anywhere(256, torch.bfloat16) is cfg
        assert cfg.gluon().DQ_FUSED == (1 if family == 3 else 0)
        assert cfg.shared_memory(256, torch.bfloat16) >= wide.wide_shared_memory(cfg.gluon(), torch.bfloat16)
    for cfg, field in ((_bwd(4), "DQ_FUSED"), (_bwd(2), "family"), (_bwd(3, BLOCK_M1=64), "BLOCK_M"),
                       (_bwd(3, dq_first=1), "DQ_FIRST"), (_bwd(3, num_stages=4), "NUM_BUFFERS")):
        with pytest.raises(ConfigError, match=f"^{field}:"):
            cfg.validate_anywhere(256, torch.bfloat16)
    # D=128 keeps its own rules
    assert _bwd(3, BLOCK_M1=64, num_stages=2).validate_anywhere(128, torch.bfloat16)
    with pytest.raises(ConfigError, match="^family:"):
        _bwd(2).validate_anywhere(256, torch.bfloat16)


def test_the_kernel_is_hashed():
    from flashtune import provenance

    assert provenance._PACKAGE / "kernels" / "gluon" / "backward_wide.py" in provenance.hashed_files()


def test_a_wide_call_with_the_gluon_dq_kernel_or_a_trace_is_refused_by_name():
    q = torch.zeros(1, 2, 32, 256, dtype=torch.bfloat16)
    stats = torch.zeros(1, 2, 32)
    with pytest.raises(ValueError, match="^gluon_dq:"):
        backward_launch.gluon_attention_backward(q, q, q, q, q, stats, W, causal=True, gluon_dq=True)
    with pytest.raises(ValueError, match="^trace:"):
        backward_launch.gluon_attention_backward(q, q, q, q, q, stats, W, causal=True, trace=[])
    with pytest.raises(ValueError, match="^trace:"):
        backward_launch.gluon_dkdv(q, q, q, q, stats, stats, W, causal=True, sm_scale=0.1,
                                   trace=torch.zeros(1, 3, 16, dtype=torch.int64))


def test_the_wide_kernel_compiles_for_sm90_without_spills():
    items = [{"kernel": "bwd", "bwd_kernel": "wide", "config": dataclasses.replace(W, NUM_BUFFERS=nb,
                                                                                  DQ_FUSED=fused).to_dict(),
              "head_dim": 256, "dtype": dt, "causal": causal, "ptxas": True}
             for nb, fused, dtypes in ((3, 1, ("bfloat16", "float16")), (2, 0, ("bfloat16", "float16")),
                                       (2, 1, ("bfloat16", )), (3, 0, ("bfloat16", )))
             for dt in dtypes for causal in (False, True)]
    results = compile_for_sm90(SCRIPT, items, timeout=900, what="the D=256 dK/dV kernel")
    for r in results:
        cfg = C(**r["config"])
        where = f"{cfg.short()} {r['dtype']} causal={r['causal']}"
        assert r["shared"] <= wide.wide_shared_memory(cfg, getattr(torch, r["dtype"])) <= SM90_SHARED_MEMORY, where
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, where
        # the wgmmas pipelined: one completion wait a chain, not one an HGMMA (ptxas serializes them all,
        # silently, where a wgmma left in flight crosses a runtime branch)
        assert 0 < r["hgmma_waited"] * 4 <= r["hgmma"], where
        assert r["registers"] <= cfg.CONSUMER_REGS, where
        assert r["maxnreg"] == cfg.maxnreg(), where
        assert {cfg.PRODUCER_REGS, cfg.CONSUMER_REGS} <= set(r["setmaxnreg"]), where  # the partitions' split
        # per step and group: S^T or dP^T (256 / 16 k-steps), dV and dK (32 / 16 each), dQ^T (two chunks of 64
        # rows, 64 keys: 4 each)
        assert r["wgmma"] >= 2 * (16 + 2 + 2 + (8 if cfg.DQ_FUSED else 0)), where
        assert r["tma_reduces"] == (4 if cfg.DQ_FUSED else 0), where  # two per group
        assert r["tma_loads"] == 4 * 4, where  # K, V, Q, dO: each in four 64-column boxes (128-byte swizzle)
