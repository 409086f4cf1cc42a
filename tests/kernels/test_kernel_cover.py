"""The backward's kernel cover (test_attention_gpu.kernel_cover), on the CPU with an H200's
properties: the GPU test of every search-space config launches only the cover, so the cover
must launch every kernel that some valid config of the space launches, and few configs."""

from __future__ import annotations

import types

import torch
from test_attention_gpu import SPACE_DTYPE, _bwd_kernels, _valid, kernel_cover

from flashtune.configs.space import candidates

H200 = types.SimpleNamespace(shared_memory_per_block_optin=232448, major=9, minor=0, multi_processor_count=132,
                             name="NVIDIA H200")


def test_kernel_cover_launches_every_kernel_of_the_space(monkeypatch):
    if not torch.cuda.is_available():  # validate() reads the device: give it an sm_90 one
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: H200)
    configs = candidates("bwd")
    cover = kernel_cover(configs, 64, SPACE_DTYPE)
    valid = [c for c in configs if _valid(c, 64)]
    assert any(c.family for c in valid), "no Gluon config validated: the device is not an sm_90 one"
    wanted = {k for c in valid for k in _bwd_kernels(c) if k is not None}
    launched = [c for c in cover if _valid(c, 64)]
    got = {k for c in launched for k in _bwd_kernels(c) if k is not None}
    assert wanted == got, f"kernels no config of the cover launches: {sorted(wanted - got)}"
    # each launched config brings a kernel not yet launched, and the kernels are far fewer than the
    # valid configs. The bound is on the cover's launches, not on its size: the rejected configs it
    # keeps launch nothing, and once the space grew they outnumbered a tenth of it, which failed
    # the GPU suite's version of this test (len(cover) < len(configs) / 10) from the space's growth on.
    assert len(launched) <= len(wanted) < len(valid) / 10, (len(launched), len(wanted), len(valid))
    assert len(cover) - len(launched) == len(configs) - len(valid)  # every rejected config is kept
