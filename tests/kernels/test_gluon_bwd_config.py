"""The Gluon dK/dV kernel (kernels/gluon_backward.py) on the CPU: its config class's checks,
and its compile for sm_90 (ptxas, no GPU) within the budgets the checks assume.

Nothing here runs the kernel: its numbers are checked by test_gluon_bwd_gpu.py on an H200.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from kernel_checks import compile_for_sm90

gluon_backward = pytest.importorskip("flashtune.kernels.gluon_backward", reason="this triton has no Gluon")
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
    (C(), 256, torch.bfloat16, "head_dim"),
    (C(), 96, torch.bfloat16, "head_dim"),
    (C(), 128, torch.float32, "dtype"),
    (C(), 128, torch.float8_e4m3fn, "dtype"),
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


def test_shared_memory_counts_the_tiles_and_the_ring():
    # K and V of both consumers (4 tiles of 64 x D) and NUM_BUFFERS (Q, dO) pairs of BLOCK_M x D
    e = 2
    d = 128
    for cfg in (C(), C(BLOCK_M=32, NUM_BUFFERS=4)):
        tiles = 4 * 64 * d * e + 2 * cfg.NUM_BUFFERS * cfg.BLOCK_M * d * e
        assert tiles < cfg.shared_memory(d, torch.bfloat16) <= tiles + 1024


# every config here is one validate() accepts; both causal modes, bf16 and fp16
ITEMS = ((C(BLOCK_M=32), (64, 128)), (C(BLOCK_M=64), (64, 128)), (C(BLOCK_M=64, NUM_BUFFERS=3, DV_EARLY=1), (128, )),
         (C(BLOCK_M=32, NUM_BUFFERS=4), (128, )))


def test_gluon_dkdv_compiles_for_sm90_within_budgets():
    request = [{"kernel": "bwd", "config": cfg.to_dict(), "head_dim": d, "dtype": dt, "causal": causal}
               for cfg, dims in ITEMS for d in dims for dt in ("bfloat16", "float16") for causal in (False, True)]
    for item in request:
        C(**item["config"]).validate(item["head_dim"], getattr(torch, item["dtype"]))
    problems = []
    for res in compile_for_sm90(SCRIPT, request, timeout=1800, what="the Gluon dK/dV kernel"):
        cfg = C(**{k: v for k, v in res["config"].items()})
        d, dtype = res["head_dim"], getattr(torch, res["dtype"])
        estimate = cfg.shared_memory(d, dtype)
        where = f"{cfg.short()} D={d} {res['dtype']} causal={res['causal']}"
        print(f"{where}: shared {res['shared']} (estimate {estimate}), maxnreg {res['maxnreg']}, "
              f"setmaxnreg {res['setmaxnreg']}, {res['wgmma']} wgmma, {res['tma_loads']} TMA copies")
        if res["shared"] > min(estimate, SM90_SHARED_MEMORY):
            problems.append(f"{where}: needs {res['shared']} bytes of shared memory, estimated {estimate}")
        if res["maxnreg"] != cfg.maxnreg():
            problems.append(f"{where}: .maxnreg {res['maxnreg']}, expected {cfg.maxnreg()}")
        for regs in (cfg.PRODUCER_REGS, cfg.CONSUMER_REGS):
            if regs not in res["setmaxnreg"]:
                problems.append(f"{where}: no setmaxnreg {regs} among {res['setmaxnreg']}")
        # S^T, dP^T, dV, dK: four wgmma kinds; K, V, Q, dO: four TMA copies
        if res["wgmma"] < 4 or res["tma_loads"] < 4:
            problems.append(f"{where}: expected wgmma and TMA instructions, got {res['wgmma']} and "
                            f"{res['tma_loads']}")
    assert not problems, "\n".join(problems)
