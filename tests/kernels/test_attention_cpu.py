"""Forward and backward against float64 references on small odd shapes.

Runs everywhere: under Triton's interpreter on the CPU in CI (fp32 and fp16; bf16 is
wrong in the interpreter and is checked on the GPU), and on CUDA when there is one.
Each case checks O, LSE, dQ, dK, dV with FlashAttention's tolerance rule (see
kernel_checks.py) and that outputs come back in the inputs' memory layout.

Explicit small configs put every code path of the kernels on these shapes: blocks
smaller and larger than the sequence, BLOCK_M != BLOCK_N both ways in all three
kernels (so the causal diagonal straddles blocks differently), full and partial blocks.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from kernel_checks import Case, case_inputs, run_case

from flashtune.kernels import BwdConfig, FwdConfig, attention

F, B = FwdConfig, BwdConfig
# (fwd, bwd) pairs; bwd blocks are (M1, N1, M2, N2): dK/dV walks BLOCK_M1 queries per
# BLOCK_N1 keys, dQ walks BLOCK_N2 keys per BLOCK_M2 queries.
# atomic_dq=1: dQ accumulated by the dK/dV kernel (no dQ kernel).
SMALL_CONFIGS = [
    (F(16, 16, 4, 1), B(16, 16, 16, 16, 4, 1)),
    (F(32, 16, 4, 1), B(16, 32, 32, 16, 4, 1)),
    (F(16, 32, 4, 1), B(32, 16, 16, 32, 4, 1)),  # BLOCK_N1 < BLOCK_M1: the kernels need no rule between them
    (F(64, 32, 4, 2), B(32, 64, 64, 32, 4, 2, dq_num_warps=8, dq_num_stages=1)),
    (F(16, 16, 4, 1), B(16, 32, 32, 16, 4, 1, atomic_dq=1)),
    (F(32, 32, 4, 1), B(32, 16, 16, 32, 4, 2, atomic_dq=1)),
]
ATOMIC_BWD = SMALL_CONFIGS[4][1]
MORE_CONFIGS = SMALL_CONFIGS + [
    (F(64, 16, 4, 1), B(16, 64, 64, 16, 4, 1)),
    (F(16, 64, 4, 1), B(64, 16, 16, 64, 4, 1)),
    (F(64, 64, 4, 1), B(64, 64, 64, 64, 4, 1)),
    (F(128, 32, 8, 3), B(32, 128, 128, 32, 8, 3)),
]
# tma=1: the walked tiles come through TMA descriptors (16-bit dtypes only)
TMA_CONFIGS = [
    (F(32, 16, 4, 1, tma=1), B(16, 32, 32, 16, 4, 1, tma=1)),
    (F(16, 32, 4, 1, tma=1), B(32, 16, 16, 32, 4, 2, atomic_dq=1, tma=1)),
    (F(64, 32, 4, 2, tma=1), B(32, 64, 64, 32, 4, 2, dq_num_warps=8, dq_num_stages=1, tma=1)),
]
SEQ_LENS = [(1, 1), (17, 17), (69, 69), (33, 69), (69, 33), (1, 17), (17, 1)]
HEAD_DIMS = [16, 32, 48, 64, 80]
HEADS = [(2, 2), (4, 2), (4, 1)]  # MHA, GQA, MQA
CPU_DTYPES = ["fp32-ieee", "fp32-tf32", "fp16"]


def _matrix() -> list[Case]:
    """dtype x (Nq, Nk) x causal, each cell with a rotating head dim, head grouping,
    batch and config pair so that every value of each meets many of the others."""
    cases = []
    for i, (dtype, (n_q, n_k), causal) in enumerate(itertools.product(CPU_DTYPES, SEQ_LENS, (False, True))):
        fwd, bwd = SMALL_CONFIGS[i % len(SMALL_CONFIGS)]
        cases.append(Case(dtype, causal, n_q, n_k, HEAD_DIMS[i % len(HEAD_DIMS)], heads=HEADS[i % len(HEADS)],
                          batch=1 + i % 2, fwd=fwd, bwd=bwd))
    return cases


def _head_dims() -> list[Case]:
    # powers of two, padded ones (1, 8, 48, 80, 96, 200), and the 256 maximum
    fwd, bwd = SMALL_CONFIGS[1]
    return [Case(dtype, causal, 33, 69, d, fwd=fwd, bwd=bwd)
            for d in (1, 8, 16, 32, 48, 64, 80, 96, 128, 200, 256)
            for dtype in ("fp32-ieee", "fp16") for causal in (False, True)]


def _grouped_heads() -> list[Case]:
    # dK/dV sum over every query head of the group; Nq < Nk and Nq > Nk; with atomic dQ,
    # each query head's dQ gets the adds of its own head only
    fwd, bwd = SMALL_CONFIGS[2]
    cases = [Case(dtype, causal, n_q, n_k, 48, heads=heads, batch=2 if heads == (4, 2) else 1, fwd=fwd, bwd=bwd)
             for heads in ((4, 2), (4, 1), (6, 2)) for (n_q, n_k) in ((69, 33), (33, 69))
             for dtype in ("fp32-ieee", "fp16") for causal in (False, True)]
    cases += [Case("fp32-ieee", causal, n_q, n_k, 48, heads=heads, batch=2, fwd=fwd, bwd=ATOMIC_BWD)
              for heads in ((4, 2), (6, 2)) for (n_q, n_k) in ((69, 33), (33, 69)) for causal in (False, True)]
    return cases


def _layouts() -> list[Case]:
    fwd, bwd = SMALL_CONFIGS[1]
    cases = [Case(dtype, causal, 69, 33, 40, heads=(4, 2), fwd=fwd, bwd=bwd, layout=layout)
             for layout in ("bnhd", "bhdn", "padded", "mixed") for dtype in ("fp32-ieee", "fp16")
             for causal in (False, True)]
    cases += [Case("fp32-ieee", causal, 33, 69, 32, heads=(4, 2), fwd=fwd, bwd=bwd, layout="bnhd", do_layout=do)
              for do in ("bnhd", "expanded") for causal in (False, True)]
    return cases


def _scales() -> list[Case]:
    fwd, bwd = SMALL_CONFIGS[0]
    return [Case(dtype, causal, 69, 69, 32, fwd=fwd, bwd=bwd, sm_scale=scale)
            for dtype, scale in (("fp32-ieee", 0.05), ("fp32-ieee", 0.3), ("fp32-ieee", 2.0), ("fp16", 0.3),
                                 ("fp32-ieee", -0.5), ("fp32-ieee", 0.0))
            for causal in (False, True)] + [
        # scores with a spread of ~45: exp overflows in fp32 unless the running max is subtracted
        Case(dtype, causal, 69, 69, 128, fwd=fwd, bwd=bwd, sm_scale=4.0)
        for dtype in ("fp32-ieee", "fp16") for causal in (False, True)]


def _configs() -> list[Case]:
    return [Case("fp32-ieee", causal, n_q, n_k, 48, fwd=fwd, bwd=bwd)
            for fwd, bwd in MORE_CONFIGS for (n_q, n_k) in ((69, 69), (33, 69), (69, 33)) for causal in (False, True)]


def _tma() -> list[Case]:
    # head dims with and without padding (the copy engine zero-fills columns past D and
    # rows past N), GQA/MQA, Nq != Nk both ways, and layouts it can address (bnhd, a
    # NaN-padded row) or cannot (bhdn: head dim not unit-stride; mixed), which fall back
    # to pointer loads
    cases, i = [], 0
    for d, causal in itertools.product((16, 40, 64, 80, 128), (False, True)):
        fwd, bwd = TMA_CONFIGS[i % len(TMA_CONFIGS)]
        n_q, n_k = ((69, 33), (33, 69), (1, 17))[i % 3]
        cases.append(Case("fp16", causal, n_q, n_k, d, heads=HEADS[i % len(HEADS)], batch=1 + i % 2, fwd=fwd, bwd=bwd))
        i += 1
    for (layout, causal), (fwd, bwd) in zip(itertools.product(("bnhd", "padded", "bhdn", "mixed", "shifted"),
                                                              (False, True)), itertools.cycle(TMA_CONFIGS)):
        cases.append(Case("fp16", causal, 69, 33, 40, heads=(4, 2), fwd=fwd, bwd=bwd, layout=layout))
    # dO with stride 0 (autograd's gradient of a sum): the dK/dV kernel loads it through pointers
    cases += [Case("fp16", causal, 33, 69, 32, heads=(4, 2), fwd=TMA_CONFIGS[1][0], bwd=TMA_CONFIGS[1][1],
                   do_layout="expanded") for causal in (False, True)]
    return cases


def _dkdv_splits() -> list[Case]:
    # dK/dV of a key block spread over programs (BwdConfig.dkdv_split): query heads of the
    # group (groups 1, 2, 4, 8: MHA, GQA, MQA), then query-block chunks (3 and 16 do not divide
    # the group; 16 leaves chunks empty), 0 chosen at launch; fp32 partials summed afterwards
    cases = []
    for i, (heads, causal) in enumerate(itertools.product(((2, 2), (4, 2), (4, 1), (8, 1)), (False, True))):
        n_q, n_k = ((69, 69), (33, 69), (69, 33), (100, 37))[i % 4]
        bwd = B(32, 32, 32, 32, 4, 1, atomic_dq=int(i == 5), dkdv_split=(2, 3, 4, 8, 0, 16, 2, 4)[i])
        cases.append(Case(("fp32-ieee", "fp16")[i % 2], causal, n_q, n_k, (40, 64, 96, 128, 256, 40, 64, 96)[i],
                          heads=heads, batch=1 + (i % 3 == 0), fwd=F(32, 32, 4, 1), bwd=bwd,
                          layout=("bhnd", "bnhd", "mixed", "bhnd")[i % 4]))
    return cases


def _defaults() -> list[Case]:
    # fwd_config/bwd_config None: the heuristic table's configs for this device
    return [Case(dtype, causal, 69, 69, d) for dtype in ("fp32-tf32", "fp16") for d in (64, 80)
            for causal in (False, True)]


@pytest.mark.parametrize("case", _matrix(), ids=str)
def test_matrix(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _head_dims(), ids=str)
def test_head_dims(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _grouped_heads(), ids=str)
def test_grouped_query_heads(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _layouts(), ids=str)
def test_strided_layouts(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _scales(), ids=str)
def test_sm_scale(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _tma(), ids=str)
def test_tma_loads(case, kernel_device):
    run_case(case, kernel_device)


def test_tma_configs_load_through_descriptors_where_the_tensors_allow(kernel_device, monkeypatch):
    """A tma=1 config hands descriptors to all three kernels for contiguous inputs, and
    none (pointer loads) for a head dim that is not unit-stride; tma=0 never does."""
    from flashtune.kernels.triton import backward, forward

    made = []

    def recording(real):
        def wrapper(enabled, tensors, rows, block_d):
            out = real(enabled, tensors, rows, block_d)
            made.append(out is not None)
            return out
        return wrapper

    monkeypatch.setattr(forward, "tma_descriptors", recording(forward.tma_descriptors))
    monkeypatch.setattr(backward, "tma_descriptors", recording(backward.tma_descriptors))
    fwd, bwd = TMA_CONFIGS[0]
    for layout, cfgs, expected in (("bhnd", (fwd, bwd), [True] * 3), ("bhdn", (fwd, bwd), [False] * 3),
                                   ("shifted", (fwd, bwd), [False] * 3),
                                   ("bhnd", (dataclasses.replace(fwd, tma=0), dataclasses.replace(bwd, tma=0)),
                                    [False] * 3)):
        made.clear()
        case = Case("fp16", True, 33, 33, 32, heads=(2, 2), fwd=cfgs[0], bwd=cfgs[1], layout=layout)
        q, k, v, do = case_inputs(case, kernel_device)
        o = attention(q, k, v, causal=True, fwd_config=case.fwd, bwd_config=case.bwd)
        torch.autograd.grad(o, (q, k, v), do)
        assert made == expected, (layout, cfgs)


@pytest.mark.parametrize("case", _configs(), ids=str)
def test_block_configs(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _dkdv_splits(), ids=lambda c: f"{c}-split{c.bwd.dkdv_split}")
def test_dkdv_split(case, kernel_device):
    run_case(case, kernel_device)


def test_dkdv_split_is_deterministic_and_matches_the_unsplit_kernel(kernel_device):
    """The partials are summed in a fixed order: two runs agree bit for bit, and the split
    gradients equal the unsplit ones to fp32 rounding."""
    case = Case("fp32-ieee", True, 69, 69, 32, heads=(4, 1), fwd=F(32, 32, 4, 1), bwd=B(32, 32, 32, 32, 4, 1))
    q, k, v, do = case_inputs(case, kernel_device)

    def grads(split):
        o = attention(q, k, v, causal=True, fwd_config=case.fwd,
                      bwd_config=dataclasses.replace(case.bwd, dkdv_split=split))
        return torch.autograd.grad(o, (q, k, v), do)

    split = grads(4)
    assert all(torch.equal(a, b) for a, b in zip(split, grads(4)))
    for a, b in zip(split, grads(1)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", _defaults(), ids=str)
def test_default_configs(case, kernel_device):
    run_case(case, kernel_device)


def test_causal_keys_past_last_query_get_zero_grad(kernel_device):
    """Nq < Nk, causal: keys after the last query are seen by nobody, so dK = dV = 0 there
    exactly (and O does not depend on them)."""
    case = Case("fp32-ieee", True, 17, 69, 32, fwd=SMALL_CONFIGS[1][0], bwd=SMALL_CONFIGS[1][1])
    q, k, v, do = case_inputs(case, kernel_device)
    o = attention(q, k, v, causal=True, fwd_config=case.fwd, bwd_config=case.bwd)
    dk, dv = torch.autograd.grad(o, (k, v), do)
    assert dk[:, :, 17:].abs().max().item() == 0.0
    assert dv[:, :, 17:].abs().max().item() == 0.0
    assert dv[:, :, :17].abs().max().item() > 0.0


def test_atomic_dq_falls_back_to_the_dq_kernel_under_deterministic_algorithms(kernel_device):
    """Atomic adds make dQ's last bits vary with their order: with torch's deterministic
    algorithms on, an atomic config runs the dQ kernel (with its dQ fields) instead, and
    gives exactly what the same config with atomic_dq=0 gives."""
    case = Case("fp32-ieee", True, 69, 33, 32, heads=(4, 2), fwd=SMALL_CONFIGS[0][0], bwd=ATOMIC_BWD)
    q, k, v, do = case_inputs(case, kernel_device)
    separate = dataclasses.replace(ATOMIC_BWD, atomic_dq=0)

    def grads(bwd):
        o = attention(q, k, v, causal=True, fwd_config=case.fwd, bwd_config=bwd)
        return torch.autograd.grad(o, (q, k, v), do)

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        det = grads(ATOMIC_BWD)
    finally:
        torch.use_deterministic_algorithms(previous)
    for a, b in zip(det, grads(separate)):
        assert torch.equal(a, b)
    # and the atomic path itself agrees with the dQ kernel to rounding
    for a, b in zip(grads(ATOMIC_BWD), det):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_return_lse_false_returns_only_o(kernel_device):
    case = Case("fp32-ieee", False, 17, 17, 16)
    q, k, v, _ = case_inputs(case, kernel_device)
    o = attention(q, k, v)
    assert isinstance(o, torch.Tensor) and o.shape == q.shape
    o2, lse = attention(q, k, v, return_lse=True)
    assert torch.equal(o, o2) and lse.shape == q.shape[:3]


def test_no_grad_forward(kernel_device):
    case = Case("fp16", True, 33, 33, 48)
    q, k, v, _ = case_inputs(case, kernel_device)
    with torch.no_grad():
        o = attention(q, k, v, causal=True)
    assert not o.requires_grad
    assert torch.equal(o, attention(q, k, v, causal=True).detach())


# Run in a child process: a wrong 32-bit offset reads unmapped memory, which kills the
# process (a segfault under the interpreter, an illegal address on the GPU).
LARGE_OFFSET_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from flashtune.kernels import BwdConfig, FwdConfig, attention, reference_attention

    device, dtype, tma = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3])
    N, D, STRIDE = 80, 16, 1 << 25  # the last rows sit 79 * 2^25 > 2^31 elements from the start
    gen = torch.Generator().manual_seed(0)

    def strided():
        # rows 2^25 elements apart; the untouched storage between them is never committed
        storage = torch.empty(N * STRIDE, dtype=dtype, device=device)
        t = torch.as_strided(storage, (1, 1, N, D), (N * STRIDE, N * STRIDE, STRIDE, 1))
        return t.copy_(torch.randn(1, 1, N, D, generator=gen)).requires_grad_()

    q, v = strided(), strided()
    k = torch.randn(1, 1, N, D, generator=gen).to(device, dtype).requires_grad_()
    do = torch.randn(1, 1, N, D, generator=gen).to(device, dtype)
    o = attention(q, k, v, causal=True, fwd_config=FwdConfig(16, 16, 4, 1, tma=tma),
                  bwd_config=BwdConfig(16, 16, 16, 16, 4, 1, tma=tma))
    grads = torch.autograd.grad(o, (q, k, v), do)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref, _ = reference_attention(*leaves, causal=True, dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, leaves, do.double())
    for name, a, b in zip(("o", "dq", "dk", "dv"), (o, *grads), (ref, *ref_grads)):
        err = (a.double() - b).abs().max().item()
        print(name, err)
        assert err < 2e-2, (name, err)
    print("OK")
""")


@pytest.mark.parametrize("tma", [0, 1], ids=["pointers", "tma"])
def test_offsets_beyond_int32(kernel_device, tma):
    """Element offsets past 2^31 inside one (batch, head): e.g. (B, N, H, D) storage with
    N * H * D >= 2^31, as long contexts with many heads have. The row offset
    ``offs_m * stride_n`` must be computed in 64 bits (and TMA descriptors take the
    strides as they are)."""
    dtype = "float16" if kernel_device.type == "cpu" else "bfloat16"
    env = dict(os.environ)
    if kernel_device.type == "cpu":
        env["TRITON_INTERPRET"] = "1"
    out = subprocess.run([sys.executable, "-c", LARGE_OFFSET_SCRIPT, kernel_device.type, dtype, str(tma)],
                         check=False, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and "OK" in out.stdout, (
        f"attention with row offsets beyond 2^31 elements failed: exit code {out.returncode}"
        f"{' (SIGSEGV)' if out.returncode == -11 else ''}\nstdout: {out.stdout[-2000:]}\nstderr: {out.stderr[-2000:]}")


# -- the rule itself (flashtune.tolerance), as the test suite applies it -------------------

@pytest.mark.parametrize("scale, passes", [(0.98, True), (1.02, False)])
def test_fp16_rule_rejects_just_outside_and_accepts_just_inside(scale, passes):
    """A wrong result planted at 0.98 / 1.02 x (2 x torch's fp16 error + slack): the factor
    is written out here, so raising it in flashtune.tolerance fails this test."""
    from kernel_checks import assert_close_to_reference, reference_outputs, sdpa_outputs, tolerance

    gen = torch.Generator().manual_seed(7)
    q, k, v, do = (torch.randn(1, 2, 24, 16, generator=gen).half() for _ in range(4))
    truth = reference_outputs(q, k, v, do, causal=True, sm_scale=0.25)
    low = sdpa_outputs(q, k, v, do, causal=True, sm_scale=0.25, dtype=torch.float16)
    tol = tolerance("fp16", torch.device("cpu"))
    allowed = 2.0 * (low.o.double() - truth.o).abs().max().item() + tol.atol
    planted = truth.o.clone()
    planted[0, 1, 7, 3] += scale * allowed
    if passes:
        assert assert_close_to_reference("o", planted, truth.o, low.o, tol=tol) == pytest.approx(scale * allowed)
    else:
        with pytest.raises(AssertionError, match="max abs error"):
            assert_close_to_reference("o", planted, truth.o, low.o, tol=tol)


@pytest.mark.parametrize("d", [64, 80])
def test_the_preprocess_zeroes_the_fused_dq_accumulator_beside_delta(d, kernel_device):
    """backward._preprocess(zero=...): the kernel that computes Delta also zeroes a float32
    tensor of o's shape (the fused dQ's accumulator, which then needs no fill kernel): every
    row, a length that ends inside a block, a head dim the kernel pads (80 -> 128), Delta as
    without it; a tensor of another shape, dtype or layout is refused before any launch."""
    from flashtune.kernels.triton import backward

    gen = torch.Generator().manual_seed(d)
    o, do = (torch.randn(2, 3, 77, d, generator=gen).to(kernel_device) for _ in range(2))
    delta, delta_alone = (torch.full((2, 3, 77), float("nan"), device=kernel_device) for _ in range(2))
    acc = torch.full((2, 3, 77, d), float("nan"), device=kernel_device)
    backward._preprocess(o, do, delta, int64=False, zero=acc)
    backward._preprocess(o, do, delta_alone, int64=False)
    assert torch.equal(acc, torch.zeros_like(acc))
    assert torch.equal(delta, delta_alone)
    torch.testing.assert_close(delta, (o.double() * do.double()).sum(-1).float(), rtol=1e-5, atol=1e-5)
    for bad in (torch.zeros(2, 3, 76, d, device=kernel_device), acc.to(torch.float16),
                torch.zeros(2, 3, d, 77, device=kernel_device).transpose(2, 3)):
        with pytest.raises(ValueError, match="zero: expected a contiguous float32 tensor of shape"):
            backward._preprocess(o, do, delta, int64=False, zero=bad)
