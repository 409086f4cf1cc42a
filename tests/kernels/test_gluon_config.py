"""GluonFwdConfig.validate on CPU: each rule raises ConfigError naming its field."""

from __future__ import annotations

import pytest
import torch

gluon_forward = pytest.importorskip("flashtune.kernels.gluon_forward", reason="this triton has no Gluon")
from flashtune.kernels.config import ConfigError  # noqa: E402

GluonFwdConfig = gluon_forward.GluonFwdConfig


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_defaults_validate(head_dim, dtype):
    cfg = gluon_forward.default_gluon_config(head_dim)
    assert cfg.validate(head_dim, dtype) is cfg
    assert cfg.shared_memory(head_dim, dtype) <= gluon_forward.SM90_SHARED_MEMORY


@pytest.mark.parametrize("kwargs, head_dim, dtype, field", [
    (dict(BLOCK_M=32), 128, torch.bfloat16, "BLOCK_M"),
    (dict(BLOCK_M=96), 64, torch.bfloat16, "BLOCK_M"),
    (dict(BLOCK_M=64.0), 64, torch.bfloat16, "BLOCK_M"),
    (dict(BLOCK_N=256), 64, torch.bfloat16, "BLOCK_N"),
    (dict(BLOCK_N=True), 64, torch.bfloat16, "BLOCK_N"),
    (dict(NUM_BUFFERS=1), 64, torch.bfloat16, "NUM_BUFFERS"),
    (dict(NUM_BUFFERS=5), 64, torch.bfloat16, "NUM_BUFFERS"),
    (dict(PINGPONG=2), 64, torch.bfloat16, "PINGPONG"),
    (dict(PRODUCER_REGS=20), 64, torch.bfloat16, "PRODUCER_REGS"),
    (dict(PRODUCER_REGS=30), 64, torch.bfloat16, "PRODUCER_REGS"),
    (dict(CONSUMER_REGS=264), 64, torch.bfloat16, "CONSUMER_REGS"),
    (dict(PRODUCER_REGS=40, CONSUMER_REGS=240), 64, torch.bfloat16, "CONSUMER_REGS"),  # 520 > 512
    ({}, 96, torch.bfloat16, "head_dim"),
    ({}, 256, torch.bfloat16, "head_dim"),
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
