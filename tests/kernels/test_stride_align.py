"""Tiles load and store in vectors when the row strides are multiples of 8 elements but
not of 16 (a head dim of 40: Stable Diffusion 1.5's attention), which triton's own
specialisation (integers divisible by 16) cannot see: the kernels' STRIDE_ALIGN
(common.stride_align on the host, common.aligned in the kernels).

Checked without a GPU by compiling for sm_90 (sm90_shared_memory.py) and counting the
16-bit global loads and stores the PTX does one element at a time; the results of the
kernels under the interpreter are the other tests' (test_attention_cpu.py, D=40 cases)."""

from __future__ import annotations

import pathlib

import torch
from kernel_checks import compile_for_sm90

from flashtune.kernels import BwdConfig, FwdConfig
from flashtune.kernels.common import stride_align

SCRIPT = pathlib.Path(__file__).with_name("sm90_shared_memory.py")


def test_stride_align_is_the_largest_power_of_two_up_to_16_dividing_the_strides():
    q = torch.empty(2, 8, 77, 40)
    assert stride_align(q) == 8  # rows of 40 elements
    assert stride_align(torch.empty(2, 8, 77, 64)) == 16
    assert stride_align(torch.empty(2, 77, 8, 40).transpose(1, 2)) == 8  # (B, N, H, D) storage
    assert stride_align(torch.empty(2, 8, 77, 41)) == 1
    assert stride_align(torch.empty(2, 8, 77, 36)) == 4
    assert stride_align(q, torch.empty(2, 8, 77, 42)) == 2  # the smallest over all tensors
    # an expanded (stride 0) dimension divides by anything; the head-dim stride is not counted
    assert stride_align(torch.empty(1, 1, 77, 40).expand(2, 8, 77, 40)) == 8
    assert stride_align(torch.empty(2, 8, 40, 77).transpose(2, 3)) == 1  # unit row stride


def test_row_strides_of_a_head_dim_of_40_load_and_store_in_vectors_on_sm90():
    fwd = FwdConfig(128, 64, 8, 3)
    bwd = BwdConfig(64, 64, 128, 64, 4, 3)
    request = [{"pass": p, "config": c.to_dict(), "head_dim": 40, "dtype": "bfloat16", "causal": False,
                "stride_align": align}
               for align in (8, 1) for p, c in (("fwd", fwd), ("bwd", bwd))]
    results = compile_for_sm90(SCRIPT, request, timeout=900, what="the D=40 kernels")
    told = {r["pass"]: r["scalar_16bit"] for r in results if r["stride_align"] == 8}
    blind = {r["pass"]: r["scalar_16bit"] for r in results if r["stride_align"] == 1}
    # without the hint every 16-bit element moves alone (the check can see it) ...
    assert all(n > 0 for n in blind["fwd"] + blind["bwd"]), blind
    # ... with it, none does, in every kernel of both passes
    assert all(n == 0 for n in told["fwd"] + told["bwd"]), told
