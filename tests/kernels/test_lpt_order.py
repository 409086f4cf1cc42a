"""The causal backward's heaviest-first launch order (config.lpt_group): the rule's group
sizes, and the Triton dK/dV and dQ kernels' 1-D grids in that order computing what their
3-D grids do.

The order only decides which program starts when; every program still computes one fixed
block, so dQ, dK and dV must come out bitwise equal for every group size. On the CPU the
kernels run under Triton's interpreter.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashtune.kernels import BwdConfig, FwdConfig, attention_forward, backward, common, forward, launch
from flashtune.kernels import config
from flashtune.kernels.config import LPT_L2_BYTES, LPT_WAVES, lpt_group, lpt_waves


@pytest.mark.parametrize("units", [1, 2, 7, 8, 28, 64, 200])
@pytest.mark.parametrize("programs_per_unit", [1, 3, 32, 128])
@pytest.mark.parametrize("bytes_per_unit", [0, 1 << 20, 4 << 20, 64 << 20])
def test_groups_are_even_fill_the_gpu_and_respect_l2(units, programs_per_unit, bytes_per_unit):
    slots = 132
    size = lpt_group(units, programs_per_unit, bytes_per_unit, slots=slots)
    assert 1 <= size <= units
    groups = math.ceil(units / size)
    last = units - (groups - 1) * size
    # equal groups within one unit: no small group runs last
    assert size - last <= groups - 1 or groups == 1
    waves = LPT_WAVES * slots
    cap = max(1, LPT_L2_BYTES // max(1, bytes_per_unit))
    if size * programs_per_unit < waves and size < units:
        # a group smaller than the waves only where the L2 bound asked for smaller groups
        # still: then the size is at least what that bound allows, evened out
        assert size >= min(cap, units) // 2
    if units * programs_per_unit <= waves:  # everything fits two waves: one group
        assert size == units


def test_the_measured_rows_get_one_even_group_each():
    # llama3-70b-tp8-train-4k's Gluon dK/dV launch: 8 units (B 2 x split 4) of 32 key blocks,
    # 4 MB of Q and dO each: one group of 8 (the rule before gave 6, then 2 units last)
    assert lpt_group(8, 32, 4 << 20, slots=132) == 8
    # qwen-28h-train-4k (split 7: 28 units of 32 blocks, 2 MB each): 3 groups of 10, 10, 8
    assert lpt_group(28, 32, 2 << 20, slots=132) == 10
    # mistral-7b-train-2k (32 units of 16 blocks, 4 MB each): 2 groups of 16
    assert lpt_group(32, 16, 4 << 20, slots=132) == 16


# (B, Hq, Hkv, N, D) of the causal rows the heaviest-first order was measured on (H200, 2026-12-03)
_GAINED = {"llama3-70b-tp8-train-4k": (2, 8, 1, 4096, 128), "qwen-28h-train-4k": (1, 28, 4, 4096, 128),
           "llama3-8b-prefill-2k": (1, 32, 8, 2048, 128)}
_MOVED_WITHIN_NOISE = {"llama3-8b-train-8k": (1, 32, 8, 8192, 128), "mistral-7b-train-2k": (4, 32, 8, 2048, 128),
                       "grid-d128-1024": (16, 16, 16, 1024, 128), "grid-d128-16384": (1, 16, 16, 16384, 128)}


def test_the_cap_serves_the_order_where_it_was_measured_to_pay():
    # the query blocks of the measured D=128 launches on sm_90: the Gluon forward's CTA covers
    # two warp groups of BLOCK_M rows, the Triton dQ kernel's program BLOCK_M2 rows
    fwd = config._SM90_FWD[(torch.bfloat16, 128, "long")]
    # the Triton dQ kernel of the D=128 entry (family 1's dQ half: the causal long entry's when
    # the order was measured, 2026-12-03; the dQ is fused into the Gluon kernel there since)
    bwd = config._SM90_BWD[(torch.bfloat16, 128)]
    assert fwd.family == 1 and bwd.family == 0 and bwd.BLOCK_M2 == 128
    for rows_per_program in (2 * fwd.BLOCK_M, bwd.BLOCK_M2):
        for name, (B, H, _, N, _) in {**_GAINED, **_MOVED_WITHIN_NOISE}.items():
            waves = lpt_waves(B * H, -(-N // rows_per_program), 132)
            assert (waves <= config.LPT_MAX_WAVES) == (name in _GAINED), (name, rows_per_program, waves)


def test_the_query_kernels_take_the_order_only_under_the_cap(monkeypatch):
    # a CPU tensor stands for the H200 (common.sm_count: 132); only shapes are read
    long_ = torch.empty(1, 16, 16384, 8, dtype=torch.float16), torch.empty(1, 16, 16384, 8, dtype=torch.float16)
    short = torch.empty(2, 8, 4096, 8, dtype=torch.float16), torch.empty(2, 1, 4096, 8, dtype=torch.float16)
    assert lpt_waves(16, 256, 132) > config.LPT_MAX_WAVES >= lpt_waves(16, 64, 132)
    assert common.query_lpt_units(*long_, 256, causal=True, plain=True) == 0
    assert common.query_lpt_units(*short, 64, causal=True, plain=True) == 16  # one group: all units
    monkeypatch.setattr(config, "LPT_MAX_WAVES", math.inf)  # the cap lifted
    assert common.query_lpt_units(*long_, 256, causal=True, plain=True) > 0


def test_bad_counts_are_named():
    with pytest.raises(ValueError, match="units"):
        lpt_group(0, 4, 0, slots=132)


@pytest.mark.parametrize("causal_align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("split", [1, 3])
def test_the_kernels_in_heaviest_first_order_give_the_grid_order_bits(monkeypatch, kernel_device, causal_align,
                                                                       split):
    dtype = torch.float32 if kernel_device.type == "cpu" else torch.float16
    g = torch.Generator(device=kernel_device).manual_seed(7)
    B, Hq, Hkv, Nq, Nk, D = 2, 6, 2, 75, 90, 32
    q = torch.randn(B, Hq, Nq, D, device=kernel_device, dtype=dtype, generator=g)
    k, v = (torch.randn(B, Hkv, Nk, D, device=kernel_device, dtype=dtype, generator=g) for _ in range(2))
    do = torch.randn(B, Hq, Nq, D, device=kernel_device, dtype=dtype, generator=g)
    scale = 1 / math.sqrt(D)
    o, lse2 = attention_forward(q, k, v, FwdConfig(16, 16, 4, 1), causal=True, sm_scale=scale,
                                fp32_precision="ieee", causal_align=causal_align)
    config = BwdConfig(16, 16, 16, 16, 4, 1, dkdv_split=split)
    # every call below runs its launcher (a launch plan would replay the first call's grid)
    monkeypatch.setattr(launch, "ENABLED", False)
    monkeypatch.setitem(common.LPT_ON, "triton_dkdv", True)
    rule = backward.query_lpt_units
    assert rule(q, k, math.ceil(Nq / 16), causal=True, plain=True) > 0
    assert rule(q, k, math.ceil(Nq / 16), causal=False, plain=True) == 0
    assert rule(q, k, math.ceil(Nq / 16), causal=True, plain=False) == 0
    assert backward.dkdv_lpt_units(q, 3, 4, math.ceil(Nk / 16), causal=True, plain=True) > 0
    assert backward.dkdv_lpt_units(q, 3, 4, math.ceil(Nk / 16), causal=True, plain=False) == 0
    launched = []
    real_launch = launch.launch
    monkeypatch.setattr(launch, "launch", lambda fn, *a, **kw: (launched.append((fn, kw["grid"])),
                                                                real_launch(fn, *a, **kw))[1])
    grads = {}
    for units in (0, 1, 5, 12):  # 0: the 3-D grids; 5 leaves a last group of 2 (dQ: 12 units)
        monkeypatch.setattr(backward, "query_lpt_units", lambda *a, units=units, **kw: units)
        monkeypatch.setattr(backward, "dkdv_lpt_units", lambda *a, units=units, **kw: units)
        grads[units] = backward.attention_backward(do, q, k, v, o, lse2, config, causal=True, sm_scale=scale,
                                                   fp32_precision="ieee", causal_align=causal_align)
    for units in (1, 5, 12):
        for a, b in zip(grads[units], grads[0]):
            assert torch.equal(a, b), units
    # the 1-D grids did run: 2 kernels with 3-D grids for units 0, 1-D ones after
    grids = [grid for fn, grid in launched if fn in (backward._bwd_dkdv_kernel, backward._bwd_dq_kernel)]
    assert [len(g) for g in grids] == [3, 3] + [1, 1] * 3
    # and the grid order's dQ is the right one (a float64 reference's, within fp32 rounding)
    ref = q.double().detach().requires_grad_()
    kk, vv = (x.double().repeat_interleave(Hq // Hkv, dim=1) for x in (k, v))
    s = ref @ kk.transpose(-1, -2) * scale
    off = Nk - Nq if causal_align == "bottom_right" else 0
    mask = torch.arange(Nk, device=kernel_device)[None, :] > torch.arange(Nq, device=kernel_device)[:, None] + off
    out = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1).nan_to_num() @ vv
    out.backward(do.double())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(grads[0][0].double(), ref.grad, atol=tol, rtol=tol)


@pytest.mark.parametrize("causal_align", ["top_left", "bottom_right"])
def test_the_forward_in_heaviest_first_order_gives_the_grid_order_bits(monkeypatch, kernel_device, causal_align):
    dtype = torch.float32 if kernel_device.type == "cpu" else torch.float16
    g = torch.Generator(device=kernel_device).manual_seed(11)
    B, Hq, Hkv, Nq, Nk, D = 2, 6, 3, 70, 83, 32
    q = torch.randn(B, Hq, Nq, D, device=kernel_device, dtype=dtype, generator=g)
    k, v = (torch.randn(B, Hkv, Nk, D, device=kernel_device, dtype=dtype, generator=g) for _ in range(2))
    monkeypatch.setattr(launch, "ENABLED", False)
    monkeypatch.setitem(common.LPT_ON, "fwd", False)
    assert common.fwd_lpt_units(q, k, 5, causal=True, plain=True) == 0
    monkeypatch.setitem(common.LPT_ON, "fwd", True)
    assert common.fwd_lpt_units(q, k, 5, causal=True, plain=True) > 0
    assert common.fwd_lpt_units(q, k, 5, causal=False, plain=True) == 0
    launched = []
    real_launch = launch.launch
    monkeypatch.setattr(launch, "launch", lambda fn, *a, **kw: (launched.append(kw["grid"]),
                                                                real_launch(fn, *a, **kw))[1])
    outs = {}
    for units in (0, 1, 5, 12):
        monkeypatch.setattr(forward, "fwd_lpt_units", lambda *a, units=units, **kw: units)
        outs[units] = attention_forward(q, k, v, FwdConfig(16, 16, 4, 1, num_splits=1), causal=True,
                                        sm_scale=0.2, fp32_precision="ieee", causal_align=causal_align)
    for units in (1, 5, 12):
        for a, b in zip(outs[units], outs[0]):
            assert torch.equal(a, b), units
    assert [len(grid) for grid in launched] == [3, 1, 1, 1]
