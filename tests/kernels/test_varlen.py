"""Packed variable-length sequences (``flashtune.attention_varlen``, FlashAttention's varlen
convention): q (total_q, Hq, D), k and v (total_k, Hkv, D), sequence b the rows
[cu_seqlens[b], cu_seqlens[b + 1]); causal and a window aligned bottom-right per sequence.

Checked against a loop over the sequences of reference_attention (float64 truth; the
same loop in the input's dtype as the baseline of flashtune.tolerance's rule, as
kernel_checks judges the padded kernels): o, the log-sum-exp and every gradient, on odd
lengths, empty sequences (no queries, no keys, both), grouped heads, causal and not, a
window, a softcap, several configs (those whose split, TMA or dK/dV-split fields varlen
ignores included). Also: equal lengths give exactly flashtune.attention's padded batch;
NaN in the memory around the pack and in the head-dim padding never reaches a result
(nothing outside a sequence's rows is read); a sequence starting past 2^31 elements is
addressed in 64 bits; bad input is refused with an error naming the argument, before any
kernel runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from kernel_checks import VarlenCase, check_varlen, loop_reference, offsets

import flashtune
from flashtune.kernels import BwdConfig, FwdConfig, api, attention, attention_varlen

F, B = FwdConfig, BwdConfig
PLAIN = (F(16, 16, 4, 1), B(16, 16, 16, 16, 4, 1))
WIDE = (F(32, 16, 4, 2), B(16, 32, 32, 16, 4, 1))
ATOMIC = (F(16, 32, 4, 1), B(32, 16, 16, 32, 4, 1, atomic_dq=1))
# fields varlen ignores: the split forward's schedule, TMA, the split dK/dV
IGNORED = (F(16, 32, 4, 1, tma=1, num_splits=3, pack_gqa=1), B(32, 16, 16, 32, 4, 1, tma=1, dkdv_split=2))
IGNORED_FP32 = (F(16, 32, 4, 1, num_splits=4, pack_gqa=0), B(32, 16, 16, 32, 4, 1, dkdv_split=3))  # tma: 16-bit only

ODD = (5, 0, 17, 1, 33)
# against ODD: more keys, keys without queries, queries without keys, one query, more queries
OTHER = (9, 3, 0, 20, 12)


def _cases() -> list[VarlenCase]:
    def V(*args, configs=PLAIN, **kwargs):
        return VarlenCase(*args, configs=configs, **kwargs)

    return [
        V("fp32-ieee", False, ODD, ODD, 16),
        V("fp32-ieee", True, ODD, ODD, 16),
        V("fp16", False, ODD, ODD, 32),
        V("fp16", True, ODD, ODD, 32),
        V("fp32-ieee", False, ODD, OTHER, 32),
        V("fp32-ieee", True, ODD, OTHER, 16, heads=(4, 1)),
        V("fp16", False, ODD, OTHER, 16, heads=(2, 2)),
        V("fp16", True, ODD, OTHER, 32),
        V("fp32-ieee", True, (64, 31, 1, 0, 47), (64, 31, 1, 0, 47), 16, heads=(2, 2), configs=WIDE),
        V("fp32-ieee", False, (40, 7, 0), (3, 50, 0), 16, configs=WIDE),  # the last sequence empty on both sides
        V("fp32-ieee", True, ODD, OTHER, 16, configs=ATOMIC),
        V("fp16", True, ODD, ODD, 16, configs=ATOMIC),
        V("fp16", True, ODD, OTHER, 16, configs=IGNORED),
        V("fp32-ieee", False, ODD, ODD, 16, configs=IGNORED_FP32),
        V("fp32-ieee", True, ODD, OTHER, 16, configs=None),  # the defaults
        V("fp16", False, ODD, ODD, 32, configs=None),
        V("fp32-ieee", True, (1, 1, 1), (1, 1, 1), 16),
        V("fp32-ieee", False, (70,), (45,), 16),  # one sequence
        V("fp32-ieee", False, ODD, OTHER, 16, window=(4, 2)),
        V("fp16", True, ODD, ODD, 16, window=(6, -1)),
        V("fp32-ieee", True, ODD, OTHER, 32, window=(3, 0), configs=ATOMIC),
        V("fp32-ieee", True, ODD, OTHER, 16, softcap=5.0),
        V("fp16", False, ODD, ODD, 16, softcap=2.0, configs=ATOMIC),
    ]


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_varlen_matches_the_loop_over_sequences(case, kernel_device):
    check_varlen(case, kernel_device)


def test_the_loop_reference_holds_empty_sequences():
    """The reference itself: an empty query sequence adds no row, an empty key sequence
    gives 0 and -inf, and a key sequence without queries gets zero gradients."""
    q, k, v = torch.randn(6, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    ref = loop_reference(q, k, v, torch.randn(6, 2, 8), (2, 0, 4), (3, 2, 0), causal=True)
    assert ref.o.shape == (6, 2, 8) and ref.lse.shape == (2, 6)
    assert (ref.o[2:] == 0).all() and torch.isneginf(ref.lse[:, 2:]).all() and (ref.dq[2:] == 0).all()
    assert (ref.dk[3:] == 0).all() and (ref.dv[3:] == 0).all()
    assert torch.isfinite(ref.lse[:, :2]).all()


# ----------------------------------------------------------------------------------
# Against the padded kernels, and nothing outside the pack read
# ----------------------------------------------------------------------------------
def _run(q, k, v, do, cu_q, cu_k, max_q, max_k, **kwargs):
    o, lse = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True, fp32_precision="ieee",
                              fwd_config=PLAIN[0], bwd_config=PLAIN[1], **kwargs)
    return (o, lse, *torch.autograd.grad(o, (q, k, v), do))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("n_q", "n_k"), [(24, 24), (20, 29), (29, 20)])
def test_equal_lengths_are_the_padded_batch(kernel_device, causal, n_q, n_k):
    """Three sequences of n_q queries and n_k keys: the same bits as flashtune.attention
    on the (3, H, n, D) batch, bottom-right, with the same configs."""
    batch, hq, hkv, d = 3, 4, 2, 16
    gen = torch.Generator().manual_seed(n_q * 100 + n_k)
    q, do = (torch.randn(batch, hq, n_q, d, generator=gen).to(kernel_device) for _ in range(2))
    k, v = (torch.randn(batch, hkv, n_k, d, generator=gen).to(kernel_device) for _ in range(2))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o, lse = attention(q, k, v, causal=causal, causal_align="bottom_right", return_lse=True, fp32_precision="ieee",
                       fwd_config=dataclasses.replace(PLAIN[0], num_splits=1, pack_gqa=0),
                       bwd_config=dataclasses.replace(PLAIN[1], dkdv_split=1))  # varlen's schedule: never split
    padded = (o, lse, *torch.autograd.grad(o, (q, k, v), do))

    def pack(x):  # (B, H, n, D) -> (B * n, H, D)
        return x.detach().transpose(1, 2).reshape(-1, x.shape[1], d)

    qp, kp, vp = (pack(x).requires_grad_() for x in (q, k, v))
    packed = _run(qp, kp, vp, pack(do), offsets([n_q] * batch, kernel_device), offsets([n_k] * batch, kernel_device),
                  n_q, n_k, causal=causal)
    o_p, lse_p, dq_p, dk_p, dv_p = packed
    unpacked = (o_p.reshape(batch, n_q, hq, d).transpose(1, 2), lse_p.reshape(hq, batch, n_q).transpose(0, 1),
                *(g.reshape(batch, -1, g.shape[1], d).transpose(1, 2) for g in (dq_p, dk_p, dv_p)))
    for name, got, want in zip(("o", "lse", "dq", "dk", "dv"), unpacked, padded):
        assert torch.equal(got, want.detach()), name


def _in_nan_buffer(x: torch.Tensor, pad_rows: int = 9, pad_d: int = 8) -> torch.Tensor:
    """``x`` (n, H, D) as a view into a larger buffer of NaN: pad_rows rows before and
    after, pad_d columns past the head dim."""
    n, h, d = x.shape
    buf = torch.full((n + 2 * pad_rows, h, d + pad_d), float("nan"), dtype=x.dtype, device=x.device)
    view = buf[pad_rows:pad_rows + n, :, :d]
    view.copy_(x.detach())
    return view


@pytest.mark.parametrize("configs", [PLAIN, ATOMIC], ids=["plain", "atomic_dq"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nothing_outside_the_pack_is_read(kernel_device, causal, configs):
    """q, k, v and dO as views into buffers of NaN (rows around the pack, the head-dim
    padding): every result is finite and the same as from dense copies. A kernel that read
    a row outside its sequence at the pack's ends, or a padding column, would spread NaN."""
    lens_q, lens_k = ODD, OTHER
    gen = torch.Generator().manual_seed(7)
    dense = [torch.randn(sum(n), h, 16, generator=gen).to(kernel_device)
             for n, h in ((lens_q, 4), (lens_k, 2), (lens_k, 2), (lens_q, 4))]
    cu_q, cu_k = offsets(lens_q, kernel_device), offsets(lens_k, kernel_device)
    run = dict(causal=causal)

    def results(q, k, v, do):
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        o, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True,
                                  fp32_precision="ieee", fwd_config=configs[0], bwd_config=configs[1], **run)
        return (o, lse, *torch.autograd.grad(o, (q, k, v), do))

    clean = results(*(x.clone() for x in dense))
    dirty = results(*(_in_nan_buffer(x) for x in dense))
    for name, got, want in zip(("o", "lse", "dq", "dk", "dv"), dirty, clean):
        assert not torch.isnan(got).any(), name
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)


def test_empty_sequences_give_exact_zeros(kernel_device):
    """Queries of a sequence without keys: o and dq exactly 0, lse -inf; keys of a
    sequence without queries: dk and dv exactly 0."""
    lens_q, lens_k = (3, 0, 6, 4), (5, 7, 0, 2)
    gen = torch.Generator().manual_seed(3)
    q, do = (torch.randn(13, 2, 16, generator=gen).to(kernel_device) for _ in range(2))
    k, v = (torch.randn(14, 2, 16, generator=gen).to(kernel_device).requires_grad_() for _ in range(2))
    q = q.requires_grad_()
    for causal in (False, True):
        o, lse, dq, dk, dv = _run(q, k, v, do, offsets(lens_q, kernel_device), offsets(lens_k, kernel_device), 6, 7,
                                  causal=causal)
        no_keys = slice(3, 9)  # the third sequence's queries
        assert (o[no_keys] == 0).all() and (dq[no_keys] == 0).all() and torch.isneginf(lse[:, no_keys]).all()
        assert (dk[5:12] == 0).all() and (dv[5:12] == 0).all()  # the second sequence's keys
        assert torch.isfinite(lse[:, :3]).all() and (dk[:5] != 0).any()
        # bottom-right causal with 4 queries over 2 keys: the first two see none
        assert torch.isneginf(lse[:, 9:11]).all() == causal and torch.isfinite(lse[:, 11:]).all()


def test_without_grad_and_lse(kernel_device):
    """No input requiring grad: the launcher alone, the same output; return_lse off: o alone;
    a max length above the longest sequence, or offsets in a strided view, change nothing."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(sum(ODD), h, 16, generator=gen).to(kernel_device) for h in (4, 2, 2))
    cu = offsets(ODD, kernel_device)
    plain = attention_varlen(q, k, v, cu, cu, 33, 33, causal=True, fp32_precision="ieee")
    assert isinstance(plain, torch.Tensor) and plain.shape == q.shape
    longer = attention_varlen(q, k, v, cu, cu, 100, 64, causal=True, fp32_precision="ieee")
    with_grad = attention_varlen(q.clone().requires_grad_(), k, v, cu, cu, 33, 33, causal=True,
                                 fp32_precision="ieee")
    strided = torch.stack([cu, torch.full_like(cu, -7)], dim=1)[:, 0]  # offsets every other int32
    assert strided.stride() == (2,)
    from_strided = attention_varlen(q, k, v, strided, strided, 33, 33, causal=True, fp32_precision="ieee")
    for other in (longer, with_grad.detach(), from_strided):
        assert torch.equal(plain, other)


# In a child process: a wrong 32-bit offset reads unmapped memory, which kills the process.
LARGE_OFFSET_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from flashtune.kernels import BwdConfig, FwdConfig, attention_varlen, reference_attention

    device, dtype = sys.argv[1], getattr(torch, sys.argv[2])
    N, D, STRIDE = 80, 16, 1 << 25  # rows 2^25 elements apart: the second sequence starts 70 * 2^25 > 2^31 in
    lens = (70, 10)
    gen = torch.Generator().manual_seed(0)

    def strided():
        # the untouched storage between the rows is never committed
        storage = torch.empty(N * STRIDE, dtype=dtype, device=device)
        t = torch.as_strided(storage, (N, 1, D), (STRIDE, STRIDE, 1))
        return t.copy_(torch.randn(N, 1, D, generator=gen)).requires_grad_()

    q, v = strided(), strided()
    k = torch.randn(N, 1, D, generator=gen).to(device, dtype).requires_grad_()
    do = torch.randn(N, 1, D, generator=gen).to(device, dtype)
    cu = torch.tensor([0, 70, 80], dtype=torch.int32, device=device)
    o = attention_varlen(q, k, v, cu, cu, 70, 70, causal=True, fwd_config=FwdConfig(16, 16, 4, 1),
                         bwd_config=BwdConfig(16, 16, 16, 16, 4, 1))
    grads = torch.autograd.grad(o, (q, k, v), do)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = torch.cat([reference_attention(*(x[a:b].transpose(0, 1)[None] for x in leaves), causal=True,
                                         dtype=torch.float64)[0][0].transpose(0, 1) for a, b in ((0, 70), (70, 80))])
    ref_grads = torch.autograd.grad(ref, leaves, do.double())
    for name, a, b in zip(("o", "dq", "dk", "dv"), (o, *grads), (ref, *ref_grads)):
        err = (a.double() - b).abs().max().item()
        print(name, err)
        assert err < 2e-2, (name, err)
    print("OK")
""")


def test_offsets_beyond_int32(kernel_device):
    """A packed sequence whose first row sits past 2^31 elements (rows 2^25 apart): its
    start ``cu_seqlens[b] * stride`` must be computed in 64 bits (common.packed_sequence)."""
    dtype = "float16" if kernel_device.type == "cpu" else "bfloat16"
    env = dict(os.environ)
    if kernel_device.type == "cpu":
        env["TRITON_INTERPRET"] = "1"
    out = subprocess.run([sys.executable, "-c", LARGE_OFFSET_SCRIPT, kernel_device.type, dtype],
                         check=False, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and "OK" in out.stdout, (
        f"attention_varlen with a sequence past 2^31 elements failed: exit code {out.returncode}"
        f"{' (SIGSEGV)' if out.returncode == -11 else ''}\nstdout: {out.stdout[-2000:]}\nstderr: {out.stderr[-2000:]}")


def test_exported():
    assert flashtune.attention_varlen is attention_varlen
    assert "attention_varlen" in flashtune.__all__


# ----------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------
@pytest.fixture
def no_launch(monkeypatch):
    """A rejected input must never reach a kernel."""
    def launched(*args, **kwargs):
        raise AssertionError("a kernel was launched for an input that should have been rejected")

    monkeypatch.setattr(api, "attention_forward", launched)
    monkeypatch.setattr(api.FlashAttentionFunction, "apply", launched)
    # the bad inputs are CPU tensors; with a GPU (interpreter off) they would all be
    # refused as CPU tensors first, before the check each case is about
    monkeypatch.setattr(api, "INTERPRETER", True)


def _good():
    q, k, v = torch.randn(56, 4, 16), torch.randn(56, 2, 16), torch.randn(56, 2, 16)
    cu = offsets(ODD)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu.clone(), max_seqlen_q=33, max_seqlen_k=33)


def _bad(**changes):
    args = _good()
    args.update(changes)
    return args


BAD = [
    (_bad(cu_seqlens_q=offsets(ODD).long()), TypeError, "cu_seqlens_q: expected dtype int32, got torch.int64"),
    (_bad(cu_seqlens_k=offsets(ODD).tolist()), TypeError, "cu_seqlens_k: expected a torch.Tensor of int32, got list"),
    (_bad(cu_seqlens_q=offsets(ODD)[None]), ValueError, "cu_seqlens_q: expected a 1-D tensor of batch + 1 offsets"),
    (_bad(cu_seqlens_q=torch.tensor([56], dtype=torch.int32)), ValueError,
     "cu_seqlens_q: expected batch + 1 >= 2 offsets, got 1"),
    (_bad(cu_seqlens_k=offsets(ODD[:4])), ValueError,
     "cu_seqlens_k: expected batch + 1 = 6 offsets like cu_seqlens_q, got 5"),
    (_bad(cu_seqlens_q=torch.tensor([1, 5, 5, 22, 23, 56], dtype=torch.int32)), ValueError,
     "cu_seqlens_q: expected 0 as the first offset, got 1"),
    (_bad(cu_seqlens_k=torch.tensor([0, 5, 22, 5, 23, 56], dtype=torch.int32)), ValueError,
     "cu_seqlens_k: expected non-decreasing offsets, got 22 then 5 at index 3"),
    (_bad(cu_seqlens_q=offsets((5, 0, 17, 1, 30))), ValueError,
     "cu_seqlens_q: expected the last offset to be q's total tokens 56 (q.shape[0]), got 53"),
    (_bad(k=torch.randn(60, 2, 16), v=torch.randn(60, 2, 16)), ValueError,
     "cu_seqlens_k: expected the last offset to be k's total tokens 60 (k.shape[0]), got 56"),
    (_bad(cu_seqlens_k=offsets(ODD, "meta")), ValueError, "cu_seqlens_k: expected the device of q (cpu), got meta"),
    (_bad(max_seqlen_q=32), ValueError, "max_seqlen_q: expected at least the longest sequence of cu_seqlens_q (33)"),
    (_bad(max_seqlen_k=0), ValueError, "max_seqlen_k: expected at least the longest sequence of cu_seqlens_k (33)"),
    (_bad(max_seqlen_k=2**31), ValueError, "below 2**31, got 2147483648"),
    (_bad(max_seqlen_q=33.0), TypeError, "max_seqlen_q: expected an int, got float"),
    (_bad(max_seqlen_k=True), TypeError, "max_seqlen_k: expected an int, got bool"),
    (_bad(q=torch.randn(1, 56, 4, 16)), ValueError,
     "q: expected a 3-D packed tensor (total_q, heads, head_dim), got shape (1, 56, 4, 16)"),
    (_bad(v=torch.randn(56, 2)), ValueError, "v: expected a 3-D packed tensor (total_k, heads, head_dim)"),
    (_bad(q=torch.randn(0, 4, 16)), ValueError, "q: expected at least one token"),
    (_bad(v=torch.randn(56, 1, 16)), ValueError, "v: expected the shape of k (total_k, heads, head_dim) (56, 2, 16), "
                                                 "got (56, 1, 16)"),
    (_bad(q=torch.randn(56, 3, 16)), ValueError, "the number of query heads (3) must be a multiple"),
    (_bad(k=torch.randn(56, 2, 32), v=torch.randn(56, 2, 32)), ValueError, "expected head_dim 16 like q, got 32"),
    (_bad(q=torch.randn(56, 4, 16).half()), TypeError, "k: expected the dtype of q (torch.float16)"),
    (_bad(q=[1.0]), TypeError, "q: expected a torch.Tensor, got list"),
]


@pytest.mark.parametrize(("args", "error", "message"), BAD, ids=[m[:60] for _, _, m in BAD])
def test_bad_input_is_named(no_launch, args, error, message):
    with pytest.raises(error, match=re.escape(message)):
        attention_varlen(**args)


def test_bad_causal_window_softcap_are_named(no_launch):
    with pytest.raises(TypeError, match="causal: expected a bool"):
        attention_varlen(**_good(), causal=1)
    with pytest.raises(ValueError, match="window_size: expected sizes >= 0"):
        attention_varlen(**_good(), window_size=(-3, 0))
    with pytest.raises(ValueError, match="softcap: expected a positive finite number"):
        attention_varlen(**_good(), softcap=0.0)


def test_refused_under_torch_compile(no_launch, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(NotImplementedError, match="attention_varlen: not supported under torch.compile"):
        attention_varlen(**_good())
