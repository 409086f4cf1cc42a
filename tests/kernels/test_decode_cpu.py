"""The split-KV forward, grouped-query packing and the bottom-right causal mask, against
float64 references (kernel_checks.py's rule), forward and every gradient.

Runs under Triton's interpreter on the CPU (fp32 and fp16) and on CUDA when there is
one. Cases stay small: the interpreter is slow. The schedule rules (which kernel a call
runs, how many chunks) are checked as data: plan_schedule() is a pure function.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import flashtune.device
from kernel_checks import Case, case_inputs, run_case

from flashtune.kernels import BwdConfig, FwdConfig, attention, passes
from flashtune.kernels.triton import backward, decode, forward
from flashtune.kernels.common import ACCURATE_FP32
from flashtune.configs.base import ConfigError, DECODE_MAX_Q
from flashtune.heuristics.defaults import default_config
from flashtune.heuristics.tables import HEURISTICS
from flashtune.kernels.triton.decode import plan_schedule

F, B = FwdConfig, BwdConfig
BWD = B(16, 16, 16, 16, 4, 1)
BWD_WIDE = B(16, 32, 16, 32, 4, 1)  # fewer interpreted iterations at the wide head dims
# (num_splits, pack_gqa) schedules: auto, explicit splits (more chunks than key blocks
# leave empty ones), packing forced on and off
SCHEDULES = [(0, -1), (3, 1), (5, 0), (1, 1), (64, -1), (2, 1)]
DECODE_Q = [1, 2, 5, 16]
HEADS = [(2, 2), (4, 2), (4, 1), (8, 2), (8, 1)]  # groups 1, 2, 4, 4 (MQA), 8 (MQA)
HEAD_DIMS = [40, 64, 96, 128, 256]


def _decode() -> list[Case]:
    """Decode-sized queries over keys that are not a multiple of the block, every
    schedule, GQA groups 1..8, each head dim, fp32 and fp16, causal both ways."""
    cases = []
    for i, (n_q, (splits, pack)) in enumerate(itertools.product(DECODE_Q, SCHEDULES)):
        d = HEAD_DIMS[i % len(HEAD_DIMS)]
        heads = HEADS[(i + i // len(HEADS)) % len(HEADS)]
        if d >= 128:  # the interpreter's time grows with D x heads: keep the wide ones narrow
            heads = (heads[0] // 2, max(1, heads[1] // 2))
        n_k = (37, 70, 45)[i % 3]
        causal, align = ((False, "top_left"), (True, "bottom_right"), (True, "top_left"))[i % 3]
        fwd = F(16 if d == 256 else 32, 16, 4, 1, num_splits=splits, pack_gqa=pack)
        cases.append(Case(("fp32-ieee", "fp16")[i % 2], causal, n_q, n_k, d, heads=heads,
                          batch=1 + (i % 2) * (d < 128), fwd=fwd, bwd=BWD_WIDE if d >= 128 else BWD,
                          causal_align=align))
    return cases


def _prefill_splits() -> list[Case]:
    # longer query blocks through the split kernel: several row blocks, packed and not,
    # causal top-left and bottom-right with Nq < Nk
    return [Case(dtype, causal, n_q, 69, 32, heads=heads, fwd=F(16, 16, 4, 1, num_splits=s, pack_gqa=p), bwd=BWD,
                 causal_align=align)
            for (dtype, causal, align), n_q, heads, (s, p) in zip(
                itertools.cycle([("fp32-ieee", True, "bottom_right"), ("fp16", True, "top_left"),
                                 ("fp32-ieee", False, "top_left")]),
                (33, 40, 17, 69, 33, 20), itertools.cycle([(4, 2), (2, 2), (4, 1)]),
                [(3, 1), (4, 0), (2, 1), (3, 0), (7, -1), (1, 1)])]


def _bottom_right() -> list[Case]:
    # the plain kernels with the mask aligned bottom-right, Nq < Nk and Nq = Nk
    return [Case(dtype, True, n_q, n_k, d, heads=heads, fwd=fwd, bwd=bwd, causal_align="bottom_right")
            for (dtype, (n_q, n_k), d, heads), (fwd, bwd) in zip(
                [("fp32-ieee", (17, 69), 32, (2, 2)), ("fp16", (33, 69), 48, (4, 2)),
                 ("fp32-ieee", (40, 40), 16, (4, 1)), ("fp16", (1, 33), 64, (2, 2))],
                [(F(16, 16, 4, 1, num_splits=1), B(16, 16, 16, 16, 4, 1)),
                 (F(32, 16, 4, 1, num_splits=1), B(16, 32, 32, 16, 4, 1)),
                 (F(16, 32, 4, 1, num_splits=1), B(32, 16, 16, 32, 4, 1, atomic_dq=1)),
                 (F(16, 16, 4, 1, num_splits=1, pack_gqa=0), B(16, 32, 32, 16, 4, 1))])]


def _layouts() -> list[Case]:
    return [Case("fp32-ieee", causal, n_q, 45, 40, heads=(4, 2), fwd=F(16, 16, 4, 1, num_splits=3, pack_gqa=1),
                 bwd=BWD, layout=layout, causal_align="bottom_right")
            for layout, causal, n_q in (("bnhd", False, 3), ("bhdn", True, 4), ("padded", True, 1),
                                        ("mixed", False, 7), ("shifted", True, 2))]


@pytest.mark.parametrize("case", _decode(), ids=str)
def test_decode(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _prefill_splits(), ids=str)
def test_split_kernel_on_longer_queries(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _bottom_right(), ids=str)
def test_bottom_right_causal(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("case", _layouts(), ids=str)
def test_split_kernel_strided_layouts(case, kernel_device):
    run_case(case, kernel_device)


@pytest.mark.parametrize("causal", [False, True])
def test_split_lse_equals_the_unsplit_one(kernel_device, causal):
    """The merged log-sum-exp of a split forward is the unsplit forward's, to fp32 rounding,
    and so is the output."""
    case = Case("fp32-ieee", causal, 3, 150, 64, heads=(8, 2))
    q, k, v, _ = case_inputs(case, kernel_device)
    plain = attention(q, k, v, causal=causal, causal_align="bottom_right", return_lse=True,
                      fwd_config=F(16, 16, 4, 1, num_splits=1, pack_gqa=0), fp32_precision="ieee")
    for splits, pack in ((4, 1), (10, 0), (16, 1)):  # 16 chunks of 16 keys over 150: the last ones empty
        o, lse = attention(q, k, v, causal=causal, causal_align="bottom_right", return_lse=True,
                           fwd_config=F(16, 16, 4, 1, num_splits=splits, pack_gqa=pack), fp32_precision="ieee")
        torch.testing.assert_close(lse, plain[1], rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(o, plain[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d", [40, 128])  # a padded head dim: the last column part partly masked
def test_the_combine_cut_by_columns_merges_as_the_whole_row(monkeypatch, kernel_device, d):
    """decode.combine_parts: the combine's programs cut a row's columns (few rows, as
    decode-b1-64k's 32); every part merges its columns as one program over the row does, and
    one part writes the log-sum-exp, also for rows whose chunks are all empty."""
    case = Case("fp32-ieee", True, 2, 150, d, heads=(4, 2), batch=2)
    q, k, v, _ = case_inputs(case, kernel_device)
    cfg = F(16, 16, 4, 1, num_splits=16, pack_gqa=1)  # 16 chunks of 16 keys over 150: the last ones empty
    launched = []
    real_launch = decode.launch.launch
    monkeypatch.setattr(decode.launch, "launch", lambda fn, *a, **kw: (launched.append(kw["grid"]),
                                                                       real_launch(fn, *a, **kw))[1])
    monkeypatch.setattr(decode.launch, "ENABLED", False)
    monkeypatch.setattr(decode, "COMBINE_MIN_ELEMENTS", 1)  # rows of 16 x 64 partials: below the default
    outs = {}
    for per_sm in (0, 1000):  # one program per row; rows cut into as many parts as allowed
        monkeypatch.setattr(decode, "COMBINE_PROGRAMS_PER_SM", per_sm)
        launched.clear()
        outs[per_sm] = attention(q, k, v, causal=True, causal_align="bottom_right", return_lse=True, fwd_config=cfg,
                                 fp32_precision="ieee")
        parts = launched[-1][1]
        assert parts == (1 if per_sm == 0 else decode.padded_head_dim(d) // decode.COMBINE_MIN_COLUMNS)
    torch.testing.assert_close(outs[1000][1], outs[0][1], rtol=0, atol=0)
    torch.testing.assert_close(outs[1000][0], outs[0][0], rtol=1e-6, atol=1e-7)
    run_case(dataclasses.replace(case, fwd=cfg, bwd=BWD), kernel_device)


def test_combine_parts_share_large_rows_only():
    assert decode.combine_parts(32, 64, 128, 132) == 4  # decode-b1-64k: 32 rows of 64 x 128 -> 128 programs
    assert decode.combine_parts(32, 128, 128, 132) == 4  # ... at 128 chunks: never narrower than 32 columns
    assert decode.combine_parts(128, 8, 256, 132) == 1  # decode-mqa-d256: 8 x 256 partials a row, kept whole
    assert decode.combine_parts(128, 16, 256, 132) == 2  # ... at 16 chunks
    assert decode.combine_parts(1024, 2, 128, 132) == 1  # decode-b32-4k in 2 chunks: rows fill the GPU
    for rows, splits, block_d in itertools.product((1, 3, 32, 100, 263, 264, 5000), (2, 7, 64, 128),
                                                   (16, 64, 128, 256)):
        parts = decode.combine_parts(rows, splits, block_d, 132)
        assert parts >= 1 and parts & (parts - 1) == 0 and block_d % parts == 0
        if parts > 1:
            assert block_d // parts >= decode.COMBINE_MIN_COLUMNS
            assert splits * block_d // parts >= decode.COMBINE_MIN_ELEMENTS
            assert rows * parts // 2 < decode.COMBINE_PROGRAMS_PER_SM * 132  # no more parts than fill asks


def test_bottom_right_rows_without_keys_get_zero(kernel_device):
    """Bottom-right with Nq > Nk: the first Nq - Nk queries see no key; their output and
    gradients are 0 (as SDPA's causal_lower_right gives), their log-sum-exp -inf, and the
    other rows equal the attention of those queries alone (then Nq = Nk)."""
    case = Case("fp32-ieee", True, 40, 17, 32, heads=(4, 2))
    q, k, v, do = case_inputs(case, kernel_device)
    tail = [x.detach()[:, :, 23:].clone().requires_grad_() if x is q else x.detach().clone().requires_grad_()
            for x in (q, k, v)]
    for fwd in (F(16, 16, 4, 1, num_splits=1, pack_gqa=0), F(16, 16, 4, 1, num_splits=2, pack_gqa=1)):
        o, lse = attention(q, k, v, causal=True, causal_align="bottom_right", return_lse=True, fwd_config=fwd,
                           bwd_config=BWD, fp32_precision="ieee")
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        assert (o[:, :, :23] == 0).all() and (dq[:, :, :23] == 0).all()
        assert torch.isneginf(lse[:, :, :23]).all() and torch.isfinite(lse[:, :, 23:]).all()
        o_t, lse_t = attention(*tail, causal=True, return_lse=True, fwd_config=fwd, bwd_config=BWD,
                               fp32_precision="ieee")
        dq_t, dk_t, dv_t = torch.autograd.grad(o_t, tail, do[:, :, 23:])
        for a, b in ((o[:, :, 23:], o_t), (lse[:, :, 23:], lse_t), (dq[:, :, 23:], dq_t), (dk, dk_t), (dv, dv_t)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------
# The schedule as data
# ----------------------------------------------------------------------------------
SHAPES_DECODE = [  # (B, Hq, Hkv, Nk, D) of docs/performance.md's SHAPES decode rows
    (1, 32, 8, 65536, 128), (32, 32, 8, 4096, 128), (128, 64, 8, 2048, 128), (16, 8, 1, 8192, 256)]


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(flashtune.device, "INTERPRETER_SCHEDULE_SMS", 132)


@pytest.mark.parametrize("shape", SHAPES_DECODE, ids=str)
def test_decode_shapes_never_run_the_unsplit_kernel_by_default(h200, shape):
    b, hq, hkv, n_k, d = shape
    for table in (fwd for fwd, _ in HEURISTICS.values()):
        for dtype in (torch.bfloat16, torch.float32):
            cfg = table[(dtype, d, "decode")]
            for n_q in (1, 4, DECODE_MAX_Q):
                plan = plan_schedule(cfg, b, hq, hkv, n_q, n_k, torch.device("cpu"))
                assert plan is not None and plan.pack, (cfg, n_q)
                # every chunk holds keys, the programs fill the SMs or the chunks are as short as
                # the rule allows (decode.MIN_CHUNK_KEYS, whole key blocks)
                assert (plan.splits - 1) * plan.chunk < n_k
                programs = plan.splits * hkv * b * -(-(n_q * hq // hkv) // plan.block_m)
                shortest = -(-decode.MIN_CHUNK_KEYS // cfg.BLOCK_N) * cfg.BLOCK_N
                assert programs >= 132 or plan.chunk <= shortest
    assert default_config("fwd", d, torch.bfloat16, "cpu", causal=False, seq_q=1).num_splits == 0


def test_auto_schedule_keeps_filled_shapes_on_the_plain_kernel(h200):
    cpu = torch.device("cpu")
    cfg = F(128, 64, 8, 3)
    # training shapes (query blocks fill the GPU): the plain forward, as before the fields existed
    assert plan_schedule(cfg, 1, 32, 8, 8192, 8192, cpu) is None
    assert plan_schedule(cfg, 2, 8, 1, 4096, 4096, cpu) is None
    assert plan_schedule(cfg, 2, 8, 8, 4096, 77, cpu) is None
    # few query blocks: split; decode-sized queries: the split kernel with a shrunk row block
    few = plan_schedule(cfg, 1, 2, 2, 256, 4096, cpu)
    assert few is not None and few.splits > 1 and not few.pack and few.block_m == 128
    mha = plan_schedule(cfg, 64, 32, 32, 1, 4096, cpu)
    assert mha is not None and mha.splits == 1 and mha.block_m == 16 and not mha.pack
    assert plan_schedule(cfg, 64, 32, 32, 17, 4096, cpu) is None  # past decode size, filling the GPU
    # explicit values are taken as they are
    assert plan_schedule(dataclasses.replace(cfg, num_splits=1, pack_gqa=0), 1, 32, 8, 1, 4096, cpu) is None
    forced = plan_schedule(dataclasses.replace(cfg, num_splits=100), 1, 4, 4, 1, 640, cpu)
    assert forced.splits == 100 and forced.chunk == 64  # 10 key blocks: 90 chunks empty
    packed = plan_schedule(dataclasses.replace(cfg, pack_gqa=1), 1, 32, 8, 512, 512, cpu)
    assert packed.pack and packed.block_m == 128


def test_auto_chunks_hold_at_least_min_chunk_keys(h200):
    """Auto splits never cut the keys finer than decode.MIN_CHUNK_KEYS (1024): the MQA decode
    row of D=256 runs 8 chunks of 1024 keys (one program per SM; 16 of 512 before, 32 of 256
    before that), and a short call stays on one launch (no combine)."""
    cpu = torch.device("cpu")
    assert decode.MIN_CHUNK_KEYS == 1024
    mqa = plan_schedule(F(64, 64, 4, 3), 16, 8, 1, 1, 8192, cpu)
    assert mqa.pack and (mqa.splits, mqa.chunk) == (8, 1024)
    assert plan_schedule(F(64, 64, 4, 2), 1, 1, 1, 128, 128, cpu) is None  # was 2 chunks of 64 keys
    assert plan_schedule(F(128, 64, 8, 3), 2, 8, 8, 4096, 77, cpu) is None
    short = plan_schedule(F(64, 128, 4, 2), 1, 32, 8, 1, 1000, cpu)  # 8 key blocks of 128
    assert (short.splits, short.chunk) == (1, 1024)
    longer = plan_schedule(F(64, 128, 4, 2), 1, 32, 8, 1, 2100, cpu)  # 17 key blocks
    assert (longer.splits, longer.chunk) == (2, 1152)
    for b, hq, hkv, n_k, d in SHAPES_DECODE:
        plan = plan_schedule(F(64, 64, 4, 2), b, hq, hkv, 1, n_k, cpu)
        assert plan.chunk >= decode.MIN_CHUNK_KEYS or plan.splits == 1
    assert decode.auto_splits(1, 10, 132, min_chunk_blocks=4) == 2 and decode.auto_splits(1, 3, 132, 4) == 1


def test_old_stored_configs_load_with_the_auto_schedule():
    old = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "tma": 0}
    cfg = F.from_dict(old)
    assert (cfg.num_splits, cfg.pack_gqa) == (0, -1)
    assert F.from_dict(cfg.to_dict()) == cfg
    for bad in ({"num_splits": -1}, {"num_splits": 129}, {"num_splits": 2.0}, {"pack_gqa": 2}, {"pack_gqa": "1"}):
        field = next(iter(bad))
        with pytest.raises(ConfigError, match=field):
            F(64, 64, 4, 2, **bad).validate(64, torch.float16, "cpu")
    assert F(64, 64, 4, 2, pack_gqa=True).pack_gqa == 1


def test_the_space_holds_the_schedule_fields():
    from flashtune.configs.space import FWD_SPACE, candidates
    assert 0 in FWD_SPACE["num_splits"] and 1 in FWD_SPACE["num_splits"] and max(FWD_SPACE["num_splits"]) > 1
    assert set(FWD_SPACE["pack_gqa"]) == {-1, 0, 1}
    assert {(c.num_splits, c.pack_gqa) for c in candidates("fwd")} >= {(0, -1), (1, 0), (4, 1)}


# ----------------------------------------------------------------------------------
# fp32 precision: the interpreter ignores it, so check the value each launch receives
# ----------------------------------------------------------------------------------
@pytest.fixture
def launched_precisions(monkeypatch):
    seen = []
    kernels = [forward._attn_fwd_kernel, decode._split_fwd_kernel, backward._bwd_dkdv_kernel,
               backward._bwd_dq_kernel]
    for kernel in kernels:
        def spy(*args, _real=kernel.run, **kwargs):
            seen.append(kwargs["PRECISION"])
            return _real(*args, **kwargs)
        monkeypatch.setattr(kernel, "run", spy)
    return seen


@pytest.mark.parametrize(("setting", "expected"), [
    (("highest", None), ACCURATE_FP32), (("high", None), "tf32"), (("medium", None), "tf32"),
    (("high", "ieee"), ACCURATE_FP32), (("highest", "tf32"), "tf32")])
@pytest.mark.parametrize("n_q", [1, 17])  # the split kernel and the plain one
def test_fp32_precision_follows_torch(kernel_device, launched_precisions, setting, expected, n_q):
    matmul_precision, backend = setting
    matmul = torch.backends.cuda.matmul
    if backend is not None and not hasattr(matmul, "fp32_precision"):
        pytest.skip("torch without torch.backends.cuda.matmul.fp32_precision")
    before = torch.get_float32_matmul_precision(), getattr(matmul, "fp32_precision", None)
    q, k, v, do = case_inputs(Case("fp32-ieee", False, n_q, 20, 16, heads=(4, 2)), kernel_device)
    try:
        torch.set_float32_matmul_precision(matmul_precision)
        if backend is not None:
            matmul.fp32_precision = backend
        o = attention(q, k, v)
        torch.autograd.grad(o, (q, k, v), do)
        o = attention(q, k, v, fp32_precision="tf32x3")  # the argument wins
    finally:
        torch.set_float32_matmul_precision(before[0])
        if before[1] is not None:
            matmul.fp32_precision = before[1]
    assert launched_precisions == [expected] * 3 + ["tf32x3"], launched_precisions
    # fp16 dots have no choice
    launched_precisions.clear()
    attention(q.half(), k.half(), v.half())
    assert launched_precisions == ["ieee"]


def test_decode_fills_reads_the_current_cuda_device_when_none_is_given(monkeypatch):
    """device None means the current CUDA device where there is one (as default_config reads
    the architecture), not the CPU's interpreter count."""
    from flashtune.device import INTERPRETER_SCHEDULE_SMS
    from flashtune.heuristics import bands as config_mod

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(config_mod, "schedule_sm_count",
                        lambda device: 132 if device.type == "cuda" else INTERPRETER_SCHEDULE_SMS)
    assert not config_mod.decode_fills(64, None) and config_mod.decode_fills(132, None)
    assert config_mod.decode_fills(64, "cpu") and not config_mod.decode_fills(None, None)


def test_decode_calls_that_fill_the_sms_read_the_full_entry(h200, monkeypatch):
    """On sm_90, a D=128 decode call whose batch x K/V heads fill the SMs (one chunk, no
    combine: decode-b32-4k, decode-b128-2k-70b) takes the two-stage "decode full" entry; one
    that the auto schedule splits (decode-b1-64k) keeps the one-stage decode entry, and so does
    a caller that does not say its K/V heads."""
    from flashtune.heuristics import defaults as config_mod

    monkeypatch.setattr(config_mod, "device_capability", lambda device: (9, 0))
    passes._default.cache_clear()
    try:
        table = HEURISTICS[(9, 0)][0]
        full, split = table[(torch.bfloat16, 128, "decode", "full")], table[(torch.bfloat16, 128, "decode")]
        assert full.num_stages > split.num_stages
        pick = lambda bhkv, n_q=1: default_config("fwd", 128, torch.bfloat16, "cpu", seq_q=n_q, batch_heads_kv=bhkv)
        assert pick(32 * 8) == pick(132) == full.validate(128, torch.bfloat16, "cpu")
        assert pick(131) == pick(None) == split.validate(128, torch.bfloat16, "cpu")
        assert pick(132, n_q=DECODE_MAX_Q + 1) != full  # not decode-sized: the entries for any length
        # D=64 has no "full" entry: the decode entry serves both
        assert default_config("fwd", 64, torch.bfloat16, "cpu", seq_q=1, batch_heads_kv=1024) == \
            table[(torch.bfloat16, 64, "decode")].validate(64, torch.bfloat16, "cpu")
        # the launch path: resolve_configs reads the K/V heads
        for (b, hq, hkv, n_k, d), want in zip(SHAPES_DECODE[:3], (split, full, full)):
            q = torch.empty(b, hq, 1, d, dtype=torch.bfloat16)
            fwd, _ = passes.resolve_configs(q, None, None, False, seq_k=n_k, heads_kv=hkv)
            assert fwd == want.validate(d, torch.bfloat16, "cpu"), (b, hkv)
            fwd, _ = passes.resolve_configs(q, None, None, False, seq_k=n_k)
            assert fwd == split.validate(d, torch.bfloat16, "cpu")
            plan = plan_schedule(fwd, b, hq, hkv, 1, n_k, torch.device("cpu"))
            assert plan.splits == (1 if want is full else 64)
    finally:
        passes._default.cache_clear()
