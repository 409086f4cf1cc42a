"""On the GPU: the feature matrix at realistic sizes, bf16, and every search-space config.

All tests here are marked ``gpu`` and skip without CUDA. The tolerance rule is the one
of kernel_checks.py: error vs float64 <= factor x torch's own error in the input dtype
+ slack (fp16 2x + 1e-3, bf16 2x + 1e-2, fp32 ieee 2x + 1e-5, fp32 with tf32 dots
3x torch-with-TF32 + 1e-3; LSE slack 1e-4, 1e-3 for tf32).

Run with ``python -m pytest -m gpu tests/kernels -q``. Compiles dominate the time;
the every-config test compiles its configs in parallel (triton's AsyncCompileMode).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
import os
import time
from dataclasses import replace

import pytest
import torch
from kernel_checks import (
    Case,
    VarlenCase,
    assert_close_to_reference,
    case_inputs,
    check_attention,
    check_varlen,
    reference_outputs,
    run_case,
    sdpa_outputs,
    tolerance,
)

from flashtune.kernels import (BwdConfig, ConfigError, FwdConfig, attention, attention_backward, attention_forward,
                               default_config)
from flashtune.kernels.common import LN2
from flashtune.kernels.triton.decode import plan_schedule
from flashtune.configs.space import candidates

pytestmark = pytest.mark.gpu

# Beyond this many scores per head the float64 cross-check of reference_attention
# against SDPA is skipped (it is done on every smaller case): it doubles the memory.
CROSS_CHECK_MAX_SCORES = 1024 * 1024
# Cases with this many scores (batch x query heads x Nq x Nk) take turns on the GPU's memory.
HEAVY_SCORES = 2 * 8 * 4096 * 1000


def _realistic() -> list[Case]:
    cases = []
    for dtype, causal, d, n in itertools.product(("bf16", "fp16"), (False, True), (64, 80, 128, 256),
                                                 (1, 17, 1000, 1024, 4096)):
        cases.append(Case(dtype, causal, n, n, d, heads=(8, 8), batch=2))
    for dtype, causal, d, n in itertools.product(("fp32-tf32", "fp32-ieee"), (False, True), (64, 128),
                                                 (17, 1000, 4096)):
        cases.append(Case(dtype, causal, n, n, d, heads=(8, 8), batch=2))
    # q length != kv length, both ways (causal aligned top-left, as torch SDPA)
    for (n_q, n_k), causal in itertools.product(((1000, 4096), (4096, 1000), (1, 1024), (1024, 1)), (False, True)):
        cases.append(Case("bf16", causal, n_q, n_k, 128, heads=(8, 8), batch=2))
    # grouped-query and multi-query
    for heads, d, causal in itertools.product(((8, 2), (8, 1)), (64, 128), (False, True)):
        cases.append(Case("bf16", causal, 1000, 1000, d, heads=heads, batch=2))
    cases += [Case("fp16", causal, 1024, 1000, 80, heads=(8, 2), batch=2) for causal in (False, True)]
    # strided layouts: (B, N, H, D) storage; head dim not unit-stride; padded rows; dO
    for d, causal in itertools.product((64, 128), (False, True)):
        cases.append(Case("bf16", causal, 1024, 1024, d, heads=(8, 2), batch=2, layout="bnhd", do_layout="bnhd"))
    cases += [Case("bf16", True, 1000, 1000, 128, heads=(8, 8), batch=2, layout=layout)
              for layout in ("bhdn", "padded")]
    cases += [Case("fp16", True, 1000, 1000, 64, heads=(8, 8), batch=2, do_layout="expanded")]
    # sm_scale
    cases += [Case("bf16", causal, 1000, 1000, 128, heads=(8, 8), batch=2, sm_scale=0.5) for causal in (False, True)]
    # TMA loads in both passes (padded head dim 80, GQA, Nq != Nk, a strided layout the
    # copy engine can address), with dQ both ways
    for d, atomic, causal in itertools.product((64, 80, 128), (0, 1), (False, True)):
        cases.append(Case("fp16" if d == 80 else "bf16", causal, 1000, 1000 + 24 * atomic, d, heads=(8, 2), batch=2,
                          fwd=FwdConfig(128, 64, 8, 3, tma=1),
                          bwd=BwdConfig(64, 128, 128, 64, 8, 3, 8, 3, atomic_dq=atomic, tma=1),
                          layout="bnhd" if d == 64 else "bhnd"))
    # TMA configs on tensors the copy engine cannot address (pointer loads instead)
    cases += [Case("bf16", True, 1000, 1000, 128, heads=(8, 2), batch=2, fwd=FwdConfig(64, 128, 4, 1, tma=1),
                   bwd=BwdConfig(64, 64, 128, 64, 4, 3, tma=1), layout=layout) for layout in ("shifted", "bhdn")]
    return cases


def _dkdv_splits() -> list[Case]:
    """dK/dV spread over programs (BwdConfig.dkdv_split) at real sizes: the schedules the
    auto value picks for grouped heads and small batch (the whole group, a divisor of it,
    query chunks for MHA), explicit ones that do not divide the group, with atomic dQ, in a
    strided layout, Nq != Nk both ways, head dims 40 to 256."""
    d128 = BwdConfig(64, 128, 128, 64, 8, 3, 8, 3)
    cases = [Case("bf16", causal, 1000, 1000, 128, heads=(8, 1), batch=1, bwd=replace(d128, dkdv_split=split))
             for split in (0, 8) for causal in (False, True)]
    cases += [Case("bf16", True, 1024, 1024, 128, heads=(28, 4), batch=1, bwd=d128),  # auto: 7 heads
              Case("bf16", True, 1000, 1000, 128, heads=(8, 2), batch=2, bwd=d128, layout="bnhd", do_layout="bnhd"),
              Case("bf16", True, 1000, 1024, 128, heads=(8, 1), batch=1,
                   bwd=BwdConfig(64, 128, 128, 64, 8, 3, atomic_dq=1, tma=1, dkdv_split=8)),
              Case("bf16", True, 1000, 1500, 64, heads=(8, 2), batch=1, bwd=BwdConfig(64, 64, 128, 64, 4, 3, tma=1,
                                                                                   dkdv_split=4)),
              Case("bf16", False, 1500, 1000, 96, heads=(8, 4), batch=2, bwd=BwdConfig(64, 64, 128, 64, 4, 3,
                                                                                    dkdv_split=3)),
              Case("bf16", True, 2000, 2000, 40, heads=(4, 4), batch=1, bwd=BwdConfig(64, 64, 128, 64, 4, 3,
                                                                                   dkdv_split=4)),
              Case("bf16", True, 1024, 1024, 256, heads=(16, 8), batch=1),  # the D=256 default, split by 2
              Case("bf16", False, 1000, 777, 256, heads=(8, 1), batch=1),
              Case("fp16", True, 1000, 1000, 256, heads=(8, 1), batch=1,
                   bwd=BwdConfig(64, 64, 64, 64, 8, 2, 4, 2, dkdv_split=16))]
    return cases


@pytest.mark.parametrize("case", _dkdv_splits(), ids=lambda c: f"{c}-split{c.bwd.dkdv_split if c.bwd else 'auto'}")
def test_dkdv_split(case):
    q, k, v, do = case_inputs(case, torch.device("cuda"))
    errors = check_attention(q, k, v, do, dtype_name=case.dtype, causal=case.causal, fwd_config=case.fwd,
                             bwd_config=case.bwd, cross_check_reference=case.n_q * case.n_k <= CROSS_CHECK_MAX_SCORES)
    print(case, {name: f"{e:.2e}" for name, e in errors.items()})


@pytest.mark.parametrize("case", _realistic(), ids=str)
def test_realistic(case, gpu_memory_turn):
    # the fp32 references of a case with this many scores hold several GiB: those take turns
    heavy = case.batch * case.heads[0] * case.n_q * case.n_k >= HEAVY_SCORES
    with gpu_memory_turn(heavy):
        q, k, v, do = case_inputs(case, torch.device("cuda"))
        errors = check_attention(q, k, v, do, dtype_name=case.dtype, causal=case.causal, sm_scale=case.sm_scale,
                                 fwd_config=case.fwd, bwd_config=case.bwd, check_strides=case.layout != "padded",
                                 cross_check_reference=case.n_q * case.n_k <= CROSS_CHECK_MAX_SCORES)
    print(case, {name: f"{e:.2e}" for name, e in errors.items()})


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_deterministic(dtype, deterministic):
    """Two runs of the defaults give bit-identical outputs and gradients. The one exception is dQ
    where the default backward adds it up in any order (the Gluon fused dQ's TMA reduce-adds, the
    sm_90 D=128 default from config.LONG_MIN_Q_BWD queries); under torch.use_deterministic_algorithms
    that too is bit for bit (a dQ kernel runs instead)."""
    from flashtune.kernels.passes import resolve_configs

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 1000, 128, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    k, v = (torch.randn(2, 2, 1000, 128, device="cuda", dtype=dtype, generator=gen).requires_grad_()
            for _ in range(2))
    do = torch.randn(2, 8, 1000, 128, device="cuda", dtype=dtype, generator=gen)
    adds_dq = resolve_configs(q, None, None, causal=True)[1].family in (3, 4)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        runs = []
        for _ in range(2):
            o, lse = attention(q, k, v, causal=True, return_lse=True)
            runs.append((o, lse, *torch.autograd.grad(o, (q, k, v), do)))
    finally:
        torch.use_deterministic_algorithms(was)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), *runs):
        if name == "dq" and adds_dq and not deterministic:
            torch.testing.assert_close(a, b)  # the same sums in another order
            continue
        assert torch.equal(a, b), f"{name} differs between two identical runs"


def test_batch_times_heads_beyond_grid_y_limit():
    """B * H = 66560 programs along grid axis 1, past CUDA's 65535 limit for gridDim.y:
    many short sequences (batched inference) must still run."""
    case = Case("bf16", True, 16, 16, 64, heads=(64, 64), batch=1040)
    q, k, v, do = case_inputs(case, torch.device("cuda"))
    check_attention(q, k, v, do, dtype_name=case.dtype, causal=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_a_device_other_than_the_current_one():
    """Tensors on cuda:1 while cuda:0 is current: the kernels must launch on the tensors'
    device (triton launches on the current device unless told otherwise)."""
    assert torch.cuda.current_device() == 0
    case = Case("bf16", True, 1000, 1000, 128, heads=(8, 2), batch=2)
    q, k, v, do = case_inputs(case, torch.device("cuda", 1))
    check_attention(q, k, v, do, dtype_name=case.dtype, causal=True)


# ----------------------------------------------------------------------------------
# Every config of the default search space: correct, or rejected by validate().
# ----------------------------------------------------------------------------------
SPACE_SHAPE = (1, 2, 256)  # B, H, N
SPACE_DTYPE = torch.bfloat16


def _precompile(launch, configs) -> None:
    """Compile the configs in parallel so the launches below hit triton's cache.

    Errors are ignored here: a config that fails to compile fails again, with its
    message, at its own launch.
    """
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # an older triton: the launches compile one by one
        return
    workers = max(1, min(32, os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for cfg in configs:
            with contextlib.suppress(Exception):  # a failure recurs, reported, at the real launch
                launch(cfg, compile_only=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_every_search_space_config(pass_, head_dim, causal):
    """Launch every config of ``candidates(pass_)`` (backward: a subset that launches every
    distinct dK/dV and dQ kernel of the space, see ``kernel_cover``): each must be rejected
    by validate() before launch, or compile, launch and give correct results. A config
    that validate() accepts but that fails to compile, runs out of resources or computes
    wrong values fails the test, by name."""
    configs = candidates(pass_)
    assert configs, f"candidates({pass_!r}) is empty"
    if pass_ == "bwd":
        configs = kernel_cover(configs, head_dim, SPACE_DTYPE)
    else:
        configs = fwd_kernel_cover(configs)
    summary, failures = check_configs(pass_, configs, head_dim=head_dim, causal=causal, device=torch.device("cuda"))
    print(summary)
    assert not failures, summary + "\n" + "\n".join(failures)


def fwd_kernel_cover(configs):
    """The forward space's schedule fields (num_splits, pack_gqa) multiply it without new
    kernels: keep, in order, each config whose launch on SPACE_SHAPE (its kernel, row
    block and whether it splits) is not yet kept; the default schedule (0, -1) and the
    forced plain kernel (1, 0) of every block config are among them."""
    B, H, N = SPACE_SHAPE
    seen, out = set(), []
    for cfg in configs:
        plan = plan_schedule(cfg, B, H, H, N, N, torch.device("cuda"))
        launch = (cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps, cfg.num_stages, cfg.tma,
                  None if plan is None else (plan.block_m, plan.splits > 1))
        if launch not in seen:
            seen.add(launch)
            out.append(cfg)
    return out


def _bwd_kernels(cfg) -> tuple[tuple, tuple | None]:
    """The two kernel launches of a backward config: (dK/dV, dQ or None)."""
    # a split dK/dV (dkdv_split != 1; 0 splits at SPACE_SHAPE) writes fp32 partials: another kernel
    # the kernel family (BwdConfig.family): 1-4 launch the Gluon dK/dV kernel, 2 the Gluon dQ kernel too
    # (families 1 and 2 share one Gluon dK/dV kernel; 3 and 4 fuse dQ into theirs)
    dkdv = (cfg.BLOCK_M1, cfg.BLOCK_N1, cfg.num_warps, cfg.num_stages, cfg.atomic_dq, cfg.tma, cfg.dkdv_split != 1,
            min(cfg.family, 1) if cfg.family < 3 else cfg.family)
    fused = cfg.atomic_dq or cfg.family >= 3  # no dQ kernel
    return dkdv, None if fused else (cfg.BLOCK_M2, cfg.BLOCK_N2, cfg.dq_num_warps, cfg.dq_num_stages, cfg.tma,
                                             cfg.family == 2)


def kernel_cover(configs, head_dim, dtype):
    """The backward space has thousands of configs but far fewer distinct kernels: keep,
    in order, each config that validates and launches a dK/dV or dQ kernel not yet kept,
    plus every config validate() rejects (those cost nothing). Every kernel of the space
    that some valid config launches is launched."""
    seen, out = set(), []
    for cfg in configs:
        try:
            cfg.validate(head_dim, dtype, torch.device("cuda"))
        except ConfigError:
            out.append(cfg)
            continue
        kernels = {k for k in _bwd_kernels(cfg) if k is not None}
        if kernels - seen:
            seen |= kernels
            out.append(cfg)
    return out


def _valid(cfg, head_dim) -> bool:
    try:
        cfg.validate(head_dim, SPACE_DTYPE, torch.device("cuda"))
        return True
    except ConfigError:
        return False


def check_configs(pass_, configs, *, head_dim, causal, device, shape=SPACE_SHAPE, dtype=SPACE_DTYPE):
    """Validate, precompile, launch and check each config; returns (summary, failures)."""
    B, H, N = shape
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32-ieee"}[dtype]
    gen = torch.Generator(device=device).manual_seed(head_dim + causal)
    q, k, v, do = (torch.randn(B, H, N, head_dim, device=device, dtype=dtype, generator=gen) for _ in range(4))
    scale = 1.0 / math.sqrt(head_dim)
    tol = tolerance(dtype_name, device)
    truth = reference_outputs(q, k, v, do, causal=causal, sm_scale=scale)
    torch_low = sdpa_outputs(q, k, v, do, causal=causal, sm_scale=scale, dtype=dtype)
    precision = "ieee" if dtype == torch.float32 else "tf32"
    # the backward runs on the forward of the heuristic config
    o_default, lse2_default = attention_forward(q, k, v, default_config("fwd", head_dim, dtype, device),
                                                causal=causal, sm_scale=scale, fp32_precision=precision)

    def launch(cfg, compile_only=False):
        if pass_ == "fwd":
            return attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale, fp32_precision=precision,
                                     compile_only=compile_only)
        return attention_backward(do, q, k, v, o_default, lse2_default, cfg, causal=causal, sm_scale=scale,
                                  fp32_precision=precision, compile_only=compile_only)

    def check(result):
        if pass_ == "fwd":
            o, lse2 = result
            assert_close_to_reference("o", o, truth.o, torch_low.o, tol=tol)
            assert_close_to_reference("lse", lse2 * LN2, truth.lse, torch_low.lse, tol=tol, lse=True)
        else:
            for name, got in zip(("dq", "dk", "dv"), result):
                assert_close_to_reference(name, got, getattr(truth, name), getattr(torch_low, name), tol=tol)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    accepted, rejected = [], 0
    for cfg in configs:
        try:
            cfg.validate(head_dim, dtype, device)
            accepted.append(cfg)
        except ConfigError:
            rejected += 1
    t0 = time.perf_counter()
    if device.type == "cuda":
        _precompile(launch, accepted)
    t1 = time.perf_counter()

    failures = []
    for cfg in accepted:
        try:
            result = launch(cfg)
            synchronize()
        except Exception as e:  # noqa: BLE001 - every launch failure is a finding
            first_line = str(e).splitlines()[0] if str(e) else ""
            failures.append(f"{cfg.short()}: validate() accepted it, but the launch failed: "
                            f"{type(e).__name__}: {first_line}")
            try:
                synchronize()
            except Exception:  # noqa: BLE001
                failures.append("the CUDA context is lost after this config: the remaining configs were not run")
                break
            continue
        try:
            check(result)
        except AssertionError as e:
            failures.append(f"{cfg.short()}: wrong result: {e}")
    summary = (f"{pass_} head_dim={head_dim} causal={causal} {dtype_name} B,H,N={shape}: {len(configs)} configs, "
               f"{rejected} rejected by validate(), {len(accepted) - len(failures)} correct, "
               f"{len(failures)} failed; compile {t1 - t0:.0f} s, launches and checks "
               f"{time.perf_counter() - t1:.0f} s")
    return summary, failures


def _softcaps() -> list[Case]:
    """Gemma-2's cap (50) on its head dim, a tight cap, decode through the split kernel."""
    return [Case("bf16", True, 1000, 1000, 256, heads=(8, 4), softcap=50.0),
            Case("bf16", False, 777, 1024, 128, heads=(8, 2), softcap=5.0,
                 bwd=BwdConfig(64, 128, 128, 64, 8, 3, atomic_dq=1)),
            Case("fp16", True, 1024, 1024, 64, heads=(4, 4), softcap=20.0,
                 bwd=BwdConfig(64, 64, 128, 64, 4, 3, dkdv_split=4)),
            Case("bf16", False, 1, 8192, 256, heads=(8, 1), softcap=50.0, batch=4)]


@pytest.mark.parametrize("case", _softcaps(), ids=str)
def test_softcap(case):
    q, k, v, do = case_inputs(case, torch.device("cuda"))
    errors = check_attention(q, k, v, do, dtype_name=case.dtype, causal=case.causal, fwd_config=case.fwd,
                             bwd_config=case.bwd, softcap=case.softcap)
    print(case, {name: f"{e:.2e}" for name, e in errors.items()})


def _windows() -> list[Case]:
    """Sliding windows at real sizes: 256 to the left, causal and not, both sides, Mistral's
    4096 at N=8192, bottom-right chunked prefill, rows that see no key (top-left, Nq > Nk),
    TMA with atomic dQ, a split dK/dV, decode through the split kernel."""
    d128 = BwdConfig(64, 128, 128, 64, 8, 3, 8, 3)
    return [Case("bf16", False, 1000, 1000, 64, heads=(8, 2), batch=2, window=(256, -1)),
            Case("bf16", True, 1000, 1000, 64, heads=(8, 2), batch=2, window=(256, -1)),
            Case("bf16", True, 4096, 4096, 128, heads=(8, 2), batch=2, window=(256, -1)),
            Case("bf16", False, 4096, 4096, 128, heads=(8, 8), batch=2, window=(256, 256)),
            Case("bf16", True, 8192, 8192, 128, heads=(8, 2), batch=1, window=(4096, -1)),  # Mistral
            Case("bf16", True, 1000, 4096, 64, heads=(8, 2), batch=2, causal_align="bottom_right",
                 window=(256, -1)),
            Case("fp16", False, 4096, 1000, 64, heads=(8, 2), batch=2, window=(100, 100)),
            Case("bf16", True, 4096, 4096, 128, heads=(8, 2), batch=2, window=(256, -1),
                 fwd=FwdConfig(128, 64, 8, 3, tma=1), bwd=replace(d128, atomic_dq=1, tma=1)),
            Case("bf16", True, 4096, 4096, 128, heads=(8, 1), batch=1, window=(512, -1),
                 bwd=replace(d128, dkdv_split=8)),
            Case("bf16", True, 1, 8192, 128, heads=(32, 8), batch=4, causal_align="bottom_right",
                 window=(4096, -1)),
            Case("bf16", False, 4, 8192, 128, heads=(32, 8), batch=2, causal_align="bottom_right",
                 window=(1000, -1), fwd=FwdConfig(64, 64, 4, 3, num_splits=16, pack_gqa=1))]


@pytest.mark.parametrize("case", _windows(), ids=str)
def test_window(case, gpu_memory_turn):
    heavy = case.batch * case.heads[0] * case.n_q * case.n_k >= HEAVY_SCORES
    with gpu_memory_turn(heavy):
        q, k, v, do = case_inputs(case, torch.device("cuda"))
        errors = check_attention(q, k, v, do, dtype_name=case.dtype, causal=case.causal, fwd_config=case.fwd,
                                 bwd_config=case.bwd, causal_align=case.causal_align, window=case.window,
                                 cross_check_reference=case.n_q * case.n_k <= CROSS_CHECK_MAX_SCORES)
    print(case, {name: f"{e:.2e}" for name, e in errors.items()})


def _dropouts() -> list[Case]:
    """Dropout at real sizes against the float64 reference with philox_reference's mask:
    bf16 and fp16, D=64/128, grouped heads, causal and not, Nq != Nk bottom-right, the default
    configs, TMA with atomic dQ, a split dK/dV, a decode-sized call (the plain forward)."""
    d128 = BwdConfig(64, 128, 128, 64, 8, 3, 8, 3)
    return [Case("bf16", True, 1024, 1024, 128, heads=(8, 2), batch=2, dropout=0.1),
            Case("bf16", False, 1000, 1000, 64, heads=(8, 8), batch=2, dropout=0.3),
            Case("fp16", True, 777, 2048, 128, heads=(8, 2), batch=1, causal_align="bottom_right", dropout=0.2),
            Case("bf16", True, 2048, 2048, 128, heads=(8, 2), batch=1, dropout=0.1,
                 fwd=FwdConfig(128, 64, 8, 3, tma=1), bwd=replace(d128, atomic_dq=1, tma=1)),
            Case("bf16", True, 2048, 2048, 128, heads=(8, 1), batch=1, dropout=0.5, bwd=replace(d128, dkdv_split=8)),
            Case("bf16", False, 4, 4096, 128, heads=(32, 8), batch=2, dropout=0.1)]


@pytest.mark.parametrize("case", _dropouts(), ids=str)
def test_dropout(case, gpu_memory_turn):
    with gpu_memory_turn(case.batch * case.heads[0] * case.n_q * case.n_k >= HEAVY_SCORES):
        run_case(case, torch.device("cuda"))
    print(case)


# documents of a packed batch, 100..3000 tokens, odd lengths (and one of a single token)
DOCS = (100, 3000, 517, 1999, 1, 2048, 777, 1234)
# chunked prefill: new queries over their documents' cached keys; a document without new
# queries, one without keys, one decode step
CHUNKS_Q = (100, 0, 300, 1, 512, 64, 2000, 7)
CHUNKS_K = (1000, 50, 300, 1024, 512, 3000, 2000, 0)


def _varlen() -> list[VarlenCase]:
    """Packed variable-length batches at real sizes (attention_varlen): 8 documents of
    100..3000 tokens, D=64/128, grouped heads, causal and not, the default configs and an
    atomic-dQ one (whose tma varlen ignores), chunked prefill (fewer queries than keys,
    empty sequences), a sliding window, a softcap, fp16."""
    atomic = (FwdConfig(128, 64, 8, 3), BwdConfig(64, 128, 128, 64, 8, 3, 8, 3, atomic_dq=1, tma=1))
    return [VarlenCase("bf16", True, DOCS, DOCS, 128, heads=(32, 8)),
            VarlenCase("bf16", False, DOCS, DOCS, 128, heads=(32, 8)),
            VarlenCase("bf16", True, DOCS, DOCS, 64, heads=(16, 2)),
            VarlenCase("bf16", False, DOCS, DOCS, 64, heads=(8, 8)),
            VarlenCase("bf16", True, DOCS, DOCS, 128, heads=(32, 8), configs=atomic),
            VarlenCase("bf16", True, CHUNKS_Q, CHUNKS_K, 128, heads=(16, 2)),
            VarlenCase("bf16", False, CHUNKS_Q, CHUNKS_K, 64, heads=(8, 1)),
            VarlenCase("bf16", True, DOCS, DOCS, 128, heads=(32, 8), window=(256, -1)),
            VarlenCase("bf16", True, DOCS, DOCS, 128, heads=(16, 8), softcap=50.0),
            VarlenCase("fp16", True, DOCS, DOCS, 64, heads=(8, 2))]


@pytest.mark.parametrize("case", _varlen(), ids=str)
def test_varlen(case, gpu_memory_turn):
    # the float64 loop holds one document's scores at a time: a few GiB at most
    with gpu_memory_turn(True):
        errors = check_varlen(case, torch.device("cuda"))
    print(case, {name: f"{e:.2e}" for name, e in errors.items()})
