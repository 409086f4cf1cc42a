"""Which configs a call uses and why: tuned exact, tuned nearest, heuristic, SDPA fallback."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from dispatch_samples import BWD_A, FWD_A, FWD_B, device, qkv
from hypothesis import given
from hypothesis import strategies as st

from flashtune.dispatch import Choice, DispatchWarning, get_tuned_attention, nearest_first
from flashtune.kernels import FwdConfig, default_config
from flashtune.keys import GpuInfo, TuningKey, batch_heads_bucket

H200 = GpuInfo("NVIDIA H200", (9, 0), 132, 150_754_820_096)


@pytest.fixture
def no_warnings():
    """Fails the test on any DispatchWarning raised inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        yield


# -- nearest keys ----------------------------------------------------------------------

def _key(seq_q, seq_k=None, group=1, batch_heads=2, gpu="g@sm90") -> TuningKey:
    return TuningKey(gpu, "bfloat16", 128, seq_q, False, "fwd", seq_k=seq_k or seq_q, group=group,
                     batch_heads=batch_heads)


def _nearest(keys, key):
    return keys[nearest_first(keys, key)[0]]


@pytest.mark.parametrize(("seq_len", "expected"), [
    (1, 512), (512, 512), (700, 512), (724, 512), (725, 1024),  # 724^2 < 512 * 1024 < 725^2
    (2048, 4096),  # 2048 is 1 octave from 1024 and from 4096: the larger wins
    (3000, 4096), (4096, 4096), (1 << 20, 4096),
])
def test_nearest_is_measured_in_log2_and_ties_go_to_the_larger(seq_len, expected):
    keys = [_key(n) for n in (512, 1024, 4096)]
    assert _nearest(keys, _key(seq_len)).seq_q == expected


def test_nearest_weighs_every_dimension_in_log2():
    decode, prefill = _key(1, 8192, group=4, batch_heads=32), _key(8192, group=4, batch_heads=32)
    grid, batch = _key(8192, batch_heads=32), _key(1, 8192, group=4, batch_heads=2048)
    keys = [prefill, decode, grid, batch]
    # a decode step with another cache length stays with the decode key, not the prefill of its length
    assert _nearest(keys, _key(1, 4096, group=4, batch_heads=32)) == decode
    assert _nearest(keys, _key(2, 8192, group=4, batch_heads=32)) == decode
    assert _nearest(keys, _key(1, 8192, group=4, batch_heads=1024)) == batch  # 1 octave, not 5
    assert _nearest(keys, _key(8192, group=1, batch_heads=32)) == grid  # exact wins
    assert _nearest(keys, _key(8192, group=2, batch_heads=32)) == prefill  # a tie of one octave: the larger


@given(st.lists(st.tuples(st.integers(1, 1 << 17), st.integers(1, 1 << 17), st.sampled_from([1, 2, 4, 8]),
                          st.integers(0, 16)), min_size=1, unique=True),
       st.tuples(st.integers(1, 1 << 17), st.integers(1, 1 << 17), st.sampled_from([1, 2, 4, 8]), st.integers(0, 16)))
def test_nearest_matches_brute_force(points, point):
    keys = [_key(q, k, g, 1 << b) for q, k, g, b in points]
    wanted = _key(point[0], point[1], point[2], 1 << point[3])

    def distance(t):
        return sum(math.log2(max(Fraction(a, b), Fraction(b, a))) ** 2 for a, b in zip(t.point, wanted.point))

    order = [keys[i] for i in nearest_first(keys, wanted)]
    assert sorted(order) == sorted(keys)
    best = min(distance(t) for t in keys)
    assert math.isclose(distance(order[0]), best, abs_tol=1e-9)
    if wanted in keys:
        assert order[0] == wanted
    # from nearest to farthest
    assert all(distance(a) <= distance(b) + 1e-9 for a, b in zip(order, order[1:]))


@pytest.mark.parametrize("value", [1, 2, 3, 5, 6, 7, 11, 12, 23, 24, 45, 46, 1000, 1 << 20])
def test_the_batch_heads_bucket_is_the_nearest_power_of_two_in_log2(value):
    bucket = batch_heads_bucket(value)
    assert bucket & (bucket - 1) == 0
    powers = [1 << i for i in range(25)]
    best = min(abs(math.log2(value / p)) for p in powers)
    assert math.isclose(abs(math.log2(value / bucket)), best) and (bucket >= value or 2 * bucket > value)


# -- choices from the store ------------------------------------------------------------


def _choice(fn, n_q, n_k=None, **kwargs) -> Choice:
    is_causal = kwargs.pop("is_causal", False)
    return fn.explain(*qkv(n_q, n_k, **kwargs), is_causal=is_causal)


def _heuristic(pass_, head_dim=16, dtype=torch.float32):
    return default_config(pass_, head_dim, dtype, device())


def test_exact_nearest_and_heuristic_choices(write, db_path, no_warnings):
    write(16, "fwd", FWD_A)
    write(64, "fwd", FWD_B)
    write(32, "bwd", BWD_A)
    fn = get_tuned_attention(db_path)

    assert _choice(fn, 16) == Choice(FWD_A, "tuned exact", BWD_A, "tuned nearest (bwd float32 d16 n32 full)")
    assert _choice(fn, 32) == Choice(FWD_B, "tuned nearest (fwd float32 d16 n64 full)", BWD_A, "tuned exact")  # tie
    assert _choice(fn, 31).fwd_source == "tuned nearest (fwd float32 d16 n16 full)"  # 31^2 < 16 * 64
    assert _choice(fn, 33).fwd_source == "tuned nearest (fwd float32 d16 n64 full)"
    assert _choice(fn, 8).fwd_config == FWD_A and _choice(fn, 128).fwd_config == FWD_B  # a factor of 2 carries
    # the query and key lengths count apart
    assert _choice(fn, 10, 30).fwd_config == FWD_A and _choice(fn, 40, 100).fwd_config == FWD_B
    # beyond a factor of 2 the heuristic serves, and says which tuned key was too far
    assert _choice(fn, 7).fwd_source == ("heuristic (nearest tuned key fwd float32 d16 n16 full is too far: "
                                         "seq_q 16 for a call of 7, more than a factor of 2 apart)")
    assert _choice(fn, 1000).fwd_config == _heuristic("fwd")
    assert _choice(fn, 8, 64).fwd_source.startswith("heuristic (nearest tuned key fwd float32 d16 n16 full is too far")
    # another family: causal, dtype or head_dim
    heuristic = Choice(_heuristic("fwd"), "heuristic", _heuristic("bwd"), "heuristic")
    assert _choice(fn, 16, is_causal=True) == heuristic
    assert _choice(fn, 16, head_dim=32) == Choice(_heuristic("fwd", 32), "heuristic", _heuristic("bwd", 32),
                                                  "heuristic")
    assert _choice(fn, 16, dtype=torch.float16).fwd_source == "heuristic"


def test_rows_of_another_gpu_are_not_served(write, db_path):
    write(16, "fwd", FWD_A, on=H200)
    with pytest.warns(DispatchWarning, match="no tuned configs for triton-interpreter@sm00"):
        fn = get_tuned_attention(db_path)
    assert _choice(fn, 16).fwd_source == "heuristic"


def test_a_stored_config_too_big_for_this_device_is_skipped_for_the_heuristic(write, db_path, monkeypatch):
    from flashtune.configs import base as kernel_config

    big = FwdConfig(128, 128, 4, 4)  # about 73 KB of shared memory at D=16 fp32; the default needs 10 KB
    write(16, "fwd", big)
    write(16, "bwd", BWD_A)
    fn = get_tuned_attention(db_path)
    monkeypatch.setattr(kernel_config, "shared_memory_limit", lambda device: 20_000)
    with pytest.warns(DispatchWarning, match="skips a stored config .* fwd .*: FwdConfig: needs about 73728 bytes"):
        choice = _choice(fn, 16)
    assert choice.fwd_config == _heuristic("fwd")
    assert choice.fwd_source.startswith("heuristic (the tuned fwd config of fwd float32 d16 n16 full does not fit "
                                        "here: ")
    assert (choice.bwd_config, choice.bwd_source) == (BWD_A, "tuned exact")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        assert _choice(get_tuned_attention(db_path), 16) == choice  # warned once


def test_a_stored_config_that_does_not_fit_gives_way_to_the_next_nearest_that_does(write, db_path, monkeypatch):
    from flashtune.configs import base as kernel_config

    write(16, "fwd", FwdConfig(128, 128, 4, 4))  # about 73 KB of shared memory at D=16 fp32
    write(32, "fwd", FWD_B)
    write(1024, "fwd", FwdConfig(128, 64, 4, 4))
    fn = get_tuned_attention(db_path)
    monkeypatch.setattr(kernel_config, "shared_memory_limit", lambda device: 20_000)
    with pytest.warns(DispatchWarning, match="skips a stored config .* n16 .*: FwdConfig: needs about 73728 bytes"):
        choice = _choice(fn, 16)
    assert (choice.fwd_config, choice.fwd_source) == (FWD_B, "tuned nearest (fwd float32 d16 n32 full)")
    q, k, v = qkv(16)
    choice.fwd_config.validate(q.shape[3], q.dtype, q.device)  # what is served fits the call


# -- SDPA fallback ---------------------------------------------------------------------


def _dispatch_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DispatchWarning)]


def test_attn_mask_and_a_dropout_p_of_1_go_to_sdpa_with_one_warning_per_reason(db_path, tuned_elsewhere):
    """dropout_p in (0, 1) runs the kernels (tests/kernels/test_dropout.py); 1 (all dropped), which
    the kernels refuse, and any other mask go to SDPA."""
    fn = get_tuned_attention(db_path)
    q, k, v = qkv(8)
    mask = torch.rand(8, 8) > 0.3
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(fn(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            out = fn(q, k, v, dropout_p=1.0)
            assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, dropout_p=1.0))
    assert _dispatch_warnings(record) == [
        "flashtune runs torch's scaled_dot_product_attention instead: attn_mask is not supported",
        "flashtune runs torch's scaled_dot_product_attention instead: dropout_p outside [0, 1) is not supported",
    ]
    assert record[0].filename == __file__  # the warning points at the caller
    assert fn.explain(q, k, v, attn_mask=mask) == Choice.sdpa("attn_mask is not supported")
    assert fn.explain(q, k, v, dropout_p=1.0).fwd_source == "sdpa fallback: dropout_p outside [0, 1) is not supported"
    # dropout_p in (0, 1): the kernels, with the configs the call has without it
    assert fn.explain(q, k, v, dropout_p=0.1) == fn.explain(q, k, v)


def _unsupported_inputs():
    q3 = torch.randn(2, 8, 16, device=device())
    q64, k64, v64 = qkv(8, dtype=torch.float64)
    q_wide, k_wide, v_wide = qkv(8, head_dim=320)
    q_b2, k_b1 = torch.randn(2, 2, 8, 16, device=device()), torch.randn(1, 2, 8, 16, device=device())
    q_empty = torch.randn(1, 2, 0, 16, device=device())
    return [
        pytest.param((q3, q3, q3), "q: expected a 4-D tensor", id="3-D"),
        pytest.param((q64, k64, v64), "q: expected dtype float16, bfloat16 or float32", id="float64"),
        pytest.param((q_wide, k_wide, v_wide), "q: head_dim must be in", id="head_dim 320"),
        pytest.param((q_b2, k_b1, k_b1), "k, v: expected batch size 2", id="batch broadcast"),
        pytest.param((q_empty, q_empty, q_empty), "q: expected a non-empty tensor", id="empty"),
    ]


@pytest.mark.parametrize(("inputs", "reason"), _unsupported_inputs())
def test_inputs_the_kernels_cannot_run_go_to_sdpa(db_path, tuned_elsewhere, inputs, reason):
    fn = get_tuned_attention(db_path)
    with pytest.warns(DispatchWarning, match=f"scaled_dot_product_attention instead: {reason}"):
        out = fn(*inputs, is_causal=True)
    assert torch.equal(out, F.scaled_dot_product_attention(*inputs, is_causal=True))
    assert fn.explain(*inputs).fwd_source.startswith(f"sdpa fallback: {reason}")


def test_strict_raises_instead_of_falling_back(db_path, tuned_elsewhere):
    fn = get_tuned_attention(db_path, strict=True)
    q, k, v = qkv(8)
    with pytest.raises(ValueError, match=r"strict=True\): attn_mask is not supported"):
        fn(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"strict=True\): dropout_p outside \[0, 1\)"):
        fn(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match=r"float64"):
        fn(q.double(), k.double(), v.double())
    assert fn.explain(q, k, v, dropout_p=1.0).bwd_source == "sdpa fallback: dropout_p outside [0, 1) is not supported"
    fn(q, k, v, dropout_p=0.1)  # the kernels run it: nothing to refuse


def test_differing_head_counts_need_enable_gqa_as_in_sdpa(db_path, tuned_elsewhere):
    fn = get_tuned_attention(db_path)
    q, k, v = qkv(8, heads=4, kv_heads=2)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError, match="enable_gqa=True"):
        fn(q, k, v)
    with pytest.raises(RuntimeError, match="enable_gqa=True"):
        fn.explain(q, k, v)
    assert fn.explain(q, k, v, enable_gqa=True).fwd_source == "heuristic"
    # one key/value head broadcasts in SDPA without enable_gqa, and runs on the kernels here
    q, k, v = qkv(8, heads=4, kv_heads=1)
    assert fn.explain(q, k, v).fwd_source == "heuristic"
    torch.testing.assert_close(fn(q, k, v), F.scaled_dot_product_attention(q, k, v))
