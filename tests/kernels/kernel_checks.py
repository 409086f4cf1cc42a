"""Shared checks of flashtune's attention against independent references.

The rule is flashtune.tolerance's (FlashAttention's), the one the autotuner's gate uses:
the error of our kernel against a float64 reference may be at most ``factor`` times the
error of a baseline computed in the input's precision (against the same reference), plus
a small absolute slack. NaN or Inf always fails.

- The baseline here is SDPA's math backend (the autotuner's is flashtune's plain
  reference), with fp16/bf16 reductions allowed so it really computes in that dtype
  (torch otherwise upcasts to fp32 inside); for fp32 with tf32 dots on a GPU, float16
  (flashtune.tolerance.baseline_dtype). For the log-sum-exp (which SDPA does not
  return) it is ``reference_attention`` in float32: our kernels keep the LSE in fp32.
- The float64 truth is ``flashtune.kernels.reference_attention`` in float64, itself
  checked against torch SDPA (math backend) in float64 on every case.
- Packed variable-length batches (``attention_varlen``, ``check_varlen``): truth and
  baseline are ``reference_attention`` looped over the sequences (``loop_reference``),
  in float64 and in the input's precision.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import zlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from flashtune.kernels import BwdConfig, FwdConfig, attention, attention_varlen, reference_attention
from flashtune.kernels.reference import attention_mask
from philox_reference import dropout_mask, varlen_dropout_mask
from flashtune.tolerance import Tolerance, baseline_dtype, uses_tf32
from flashtune.tolerance import tolerance as shared_tolerance

# name -> (torch dtype, fp32_precision passed to attention)
DTYPES = {
    "fp32-ieee": (torch.float32, "ieee"),
    "fp32-tf32": (torch.float32, "tf32"),
    "fp16": (torch.float16, "tf32"),
    "bf16": (torch.bfloat16, "tf32"),
}
# (B, H, N, D) values laid out in memory as:
#   bhnd: contiguous; bnhd: (B, N, H, D) storage viewed as (B, H, N, D) (the usual
#   projection output); bhdn: head dim not unit-stride; padded: (B, N, H, D + 8)
#   storage sliced to D, so rows are not dense; expanded (dO only): stride 0 except
#   along D, as autograd passes for ``o.sum()``-like losses; mixed (a Case's q, k, v
#   only): q bhnd, k bnhd, v bhdn; shifted: contiguous, starting one element into its
#   storage (not 16-byte aligned: TMA descriptors cannot address it).
DENSE_LAYOUTS = ("bhnd", "bnhd", "bhdn", "mixed", "shifted")
MIXED = {"q": "bhnd", "k": "bnhd", "v": "bhdn"}
LAYOUTS = DENSE_LAYOUTS + ("padded",)


def tolerance(dtype: str, device: torch.device) -> Tolerance:
    """flashtune.tolerance's constants for one dtype name (a DTYPES key) on a device."""
    torch_dtype, precision = DTYPES[dtype]
    return shared_tolerance(torch_dtype, tf32=uses_tf32(torch_dtype, device, precision))


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention call to check: shapes, dtype, masking, configs, memory layouts."""

    dtype: str
    causal: bool
    n_q: int
    n_k: int
    head_dim: int
    heads: tuple[int, int] = (2, 2)  # (Hq, Hkv)
    batch: int = 1
    fwd: FwdConfig | None = None
    bwd: BwdConfig | None = None
    layout: str = "bhnd"
    do_layout: str = "bhnd"
    sm_scale: float | None = None
    causal_align: str = "top_left"
    softcap: float | None = None
    window: tuple[int, int] | None = None  # window_size
    dropout: float | None = None  # dropout_p, with the seed dropout_seed(case)

    def __str__(self) -> str:
        hq, hkv = self.heads
        causal = "causal" if self.causal else "full"
        if self.causal_align == "bottom_right" and (self.causal or self.window is not None):
            causal += "br"  # a window is aligned too, causal or not
        parts = [self.dtype, causal, f"q{self.n_q}k{self.n_k}", f"d{self.head_dim}",
                 f"b{self.batch}h{hq}" if hq == hkv else f"b{self.batch}h{hq}kv{hkv}"]
        parts.append("fwd" + ("default" if self.fwd is None else f"{self.fwd.BLOCK_M}x{self.fwd.BLOCK_N}"))
        if self.fwd is not None and (self.fwd.num_splits, self.fwd.pack_gqa) != (0, -1):
            parts.append(f"split{self.fwd.num_splits}pack{self.fwd.pack_gqa}")
        if self.bwd is None:
            parts.append("bwddefault")
        else:
            b = self.bwd
            parts.append(f"bwd{b.BLOCK_M1}x{b.BLOCK_N1}.{b.BLOCK_M2}x{b.BLOCK_N2}")
        if self.layout != "bhnd":
            parts.append(self.layout)
        if self.do_layout != "bhnd":
            parts.append(f"do-{self.do_layout}")
        if self.sm_scale is not None:
            parts.append(f"scale{self.sm_scale:g}")
        if self.softcap is not None:
            parts.append(f"softcap{self.softcap:g}")
        if self.window is not None:
            parts.append(f"window{self.window[0]}.{self.window[1]}")
        if self.dropout is not None:
            parts.append(f"dropout{self.dropout:g}")
        return "-".join(parts)


def dropout_seed(case) -> int:
    """The dropout seed of a case (Case, VarlenCase): from its name, below 2**63."""
    return zlib.crc32(str(case).encode()) * 0x9E3779B97F4A7C15 % 2**63


def make_tensor(shape, *, layout: str, dtype: torch.dtype, device, gen: torch.Generator) -> torch.Tensor:
    """Random (B, H, N, D) values (standard normal, from ``gen``) in the given memory layout."""
    B, H, N, D = shape
    values = torch.randn(B, H, N, D, generator=gen)
    if layout == "bhnd":
        return values.to(device=device, dtype=dtype)
    if layout == "bnhd":
        return values.transpose(1, 2).contiguous().to(device=device, dtype=dtype).transpose(1, 2)
    if layout == "bhdn":
        return values.transpose(2, 3).contiguous().to(device=device, dtype=dtype).transpose(2, 3)
    if layout == "padded":
        storage = torch.full((B, N, H, D + 8), float("nan"))  # the padding must never be read
        storage[..., :D] = values.transpose(1, 2)
        return storage.to(device=device, dtype=dtype)[..., :D].transpose(1, 2)
    if layout == "shifted":
        storage = torch.empty(B * H * N * D + 1, device=device, dtype=dtype)
        return storage[1:].view(B, H, N, D).copy_(values)
    if layout == "expanded":
        return torch.randn(D, generator=gen).to(device=device, dtype=dtype).expand(B, H, N, D)
    raise ValueError(f"layout: unknown {layout!r}")


def case_inputs(case: Case, device):
    """Leaf q, k, v (requiring grad) and dO for a case, seeded by the case's name."""
    gen = torch.Generator().manual_seed(zlib.crc32(str(case).encode()))
    dtype = DTYPES[case.dtype][0]
    hq, hkv = case.heads
    layout = MIXED if case.layout == "mixed" else dict.fromkeys("qkv", case.layout)
    q = make_tensor((case.batch, hq, case.n_q, case.head_dim), layout=layout["q"], dtype=dtype, device=device,
                    gen=gen)
    k = make_tensor((case.batch, hkv, case.n_k, case.head_dim), layout=layout["k"], dtype=dtype, device=device,
                    gen=gen)
    v = make_tensor((case.batch, hkv, case.n_k, case.head_dim), layout=layout["v"], dtype=dtype, device=device,
                    gen=gen)
    do = make_tensor((case.batch, hq, case.n_q, case.head_dim), layout=case.do_layout, dtype=dtype, device=device,
                     gen=gen)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


# ----------------------------------------------------------------------------------
# The three computations: ours, the float64 truth, torch in the input dtype.
# ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Outputs:
    o: torch.Tensor
    lse: torch.Tensor | None
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def flashtune_outputs(q, k, v, do, *, causal, sm_scale, fwd_config, bwd_config, fp32_precision,
                      causal_align="top_left", softcap=None, window=None, dropout=None, seed=None) -> Outputs:
    o, lse = attention(q, k, v, causal=causal, sm_scale=sm_scale, fwd_config=fwd_config, bwd_config=bwd_config,
                       return_lse=True, fp32_precision=fp32_precision, causal_align=causal_align, softcap=softcap,
                       window_size=window, dropout_p=dropout or 0.0, dropout_seed=seed)
    # autograd.grad returns the backward's tensors as they are (no .grad accumulation),
    # so their strides are the kernel's.
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return Outputs(o.detach(), lse.detach(), dq, dk, dv)


def _leaves(q, k, v, dtype):
    return tuple(x.detach().to(dtype).requires_grad_() for x in (q, k, v))


def reference_outputs(q, k, v, do, *, causal, sm_scale, dtype=torch.float64, causal_align="top_left",
                      softcap=None, window=None, dropout=None, mask=None) -> Outputs:
    """``reference_attention`` in ``dtype`` (float64: the truth), grads through autograd;
    ``dropout`` (p) with its ``mask``."""
    qr, kr, vr = _leaves(q, k, v, dtype)
    o, lse = reference_attention(qr, kr, vr, causal=causal, sm_scale=sm_scale, dtype=dtype,
                                 causal_align=causal_align, softcap=softcap, window_size=window,
                                 dropout_mask=mask if dropout else None, dropout_p=dropout or 0.0)
    dq, dk, dv = torch.autograd.grad(o, (qr, kr, vr), do.to(dtype))
    return Outputs(o.detach(), lse.detach(), dq, dk, dv)


@contextlib.contextmanager
def torch_precision(dtype: torch.dtype, tf32: bool):
    """SDPA's math backend computing in ``dtype`` itself; TF32 matmuls if ``tf32``."""
    matmul = torch.backends.cuda.matmul
    # torch >= 2.9 has fp32_precision and raises when it is mixed with the legacy allow_tf32
    setting, value = ("fp32_precision", "tf32" if tf32 else "ieee") if hasattr(matmul, "fp32_precision") \
        else ("allow_tf32", tf32)
    reduce_prev = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    matmul_prev = getattr(matmul, setting)
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(dtype in (torch.float16, torch.bfloat16))
    setattr(matmul, setting, value)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(reduce_prev)
        setattr(matmul, setting, matmul_prev)


def sdpa_outputs(q, k, v, do, *, causal, sm_scale, dtype, tf32=False, causal_align="top_left",
                 window=None) -> Outputs:
    """torch SDPA (math backend) in ``dtype``; lse from ``reference_attention`` in fp32.
    Bottom-right causal through torch's ``causal_lower_right`` mask; a window (which SDPA
    has not) through reference.attention_mask's boolean mask (SDPA's math backend gives
    rows without a key 0, and gradients 0)."""
    qs, ks, vs = _leaves(q, k, v, dtype)
    mask, is_causal = None, causal
    if window is not None:
        mask, is_causal = attention_mask(q.shape[2], k.shape[2], causal=causal, causal_align=causal_align,
                                         window_size=window, device=q.device), False
    elif causal and causal_align == "bottom_right":
        mask, is_causal = causal_lower_right(q.shape[2], k.shape[2]), False
    with torch_precision(dtype, tf32):
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=is_causal, scale=sm_scale, attn_mask=mask,
                                           enable_gqa=q.shape[1] != k.shape[1])
        dq, dk, dv = torch.autograd.grad(o, (qs, ks, vs), do.to(dtype))
        lse = None
        if dtype != torch.float64:
            lse = reference_attention(q.detach(), k.detach(), v.detach(), causal=causal, sm_scale=sm_scale,
                                      dtype=torch.float32, causal_align=causal_align, window_size=window)[1]
    return Outputs(o.detach(), lse, dq, dk, dv)


# ----------------------------------------------------------------------------------
# Comparison
# ----------------------------------------------------------------------------------
def _index(flat_index: int, shape) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), shape))


def assert_close_to_reference(name: str, actual: torch.Tensor, truth: torch.Tensor, baseline: torch.Tensor, *,
                              tol: Tolerance, lse: bool = False, extra: float = 0.0) -> float:
    """flashtune.tolerance's rule: max|actual - truth| <= tol.allowance(max|baseline - truth|)
    (+ ``extra``).

    ``truth`` is the float64 reference, ``baseline`` torch's own attention in the input
    dtype. NaN/Inf in ``actual`` fail. On failure the message gives the count of
    elements over the bound and the worst index with both values. Returns the error.
    """
    assert actual.shape == truth.shape, f"{name}: shape {tuple(actual.shape)}, expected {tuple(truth.shape)}"
    a, t = actual.detach().to(torch.float64), truth.detach().to(torch.float64)
    assert torch.isfinite(t).all(), f"{name}: the float64 reference itself is not finite"
    finite = torch.isfinite(a)
    if not finite.all():
        n_bad = int((~finite).sum())
        first = _index(int((~finite).flatten().nonzero()[0]), a.shape)
        raise AssertionError(f"{name}: {n_bad} of {a.numel()} values are NaN/Inf, first at index {first} "
                             f"(value {a[first].item()}, expected {t[first].item():.6g})")
    err = (a - t).abs()
    base_err = (baseline.detach().to(torch.float64) - t).abs().max().item()
    allowed = tol.allowance(base_err, lse=lse) + extra
    worst = err.max().item()
    if worst > allowed:
        n_bad = int((err > allowed).sum())
        idx = _index(int(err.argmax()), a.shape)
        raise AssertionError(
            f"{name}: max abs error {worst:.3g} > allowed {allowed:.3g} "
            f"(= {tol.factor:g} x the baseline's error {base_err:.3g} + {allowed - tol.factor * base_err:.3g}); "
            f"{n_bad} of {a.numel()} elements over; worst at index {idx}: "
            f"got {a[idx].item():.6g}, expected {t[idx].item():.6g}")
    return worst


def check_attention(q, k, v, do, *, dtype_name: str, causal: bool, sm_scale=None, fwd_config=None,
                    bwd_config=None, check_strides: bool = True, cross_check_reference: bool = True,
                    causal_align: str = "top_left", softcap=None, window=None, dropout=None, seed=None) -> dict:
    """Run flashtune forward+backward and check O, LSE, dQ, dK, dV and output layouts.

    With ``dropout`` (p, and the int ``seed``) the truth and the baseline apply the mask that
    philox_reference builds on its own (no code shared with the kernels), with
    ``reference_attention`` in the input's precision as the baseline (as for softcap).

    With ``softcap`` (which SDPA has not) the same-dtype baseline is ``reference_attention``
    in that dtype, with the cap, instead of SDPA's math backend. A ``window`` (window_size)
    goes to SDPA as a boolean mask. Rows that see no key (a window or bottom-right with
    Nq > Nk) must have log-sum-exp -inf, as the reference's; the others are compared.

    Returns the max errors by name (for reporting).
    """
    dtype, precision = DTYPES[dtype_name]
    tol = tolerance(dtype_name, q.device)
    ours = flashtune_outputs(q, k, v, do, causal=causal, sm_scale=sm_scale, fwd_config=fwd_config,
                             bwd_config=bwd_config, fp32_precision=precision, causal_align=causal_align,
                             softcap=softcap, window=window, dropout=dropout, seed=seed)

    B, Hq, Nq, _ = q.shape
    assert ours.o.dtype == q.dtype and ours.o.shape == q.shape
    assert ours.lse.dtype == torch.float32 and ours.lse.shape == (B, Hq, Nq), (ours.lse.dtype, ours.lse.shape)
    for name, grad, inp in (("dq", ours.dq, q), ("dk", ours.dk, k), ("dv", ours.dv, v)):
        assert grad.dtype == inp.dtype and grad.shape == inp.shape, (name, grad.dtype, grad.shape)
    if check_strides:
        for name, out, inp in (("o", ours.o, q), ("dq", ours.dq, q), ("dk", ours.dk, k), ("dv", ours.dv, v)):
            assert out.stride() == inp.stride(), f"{name}: strides {out.stride()}, expected the input's {inp.stride()}"

    align = dict(causal_align=causal_align, window=window)
    drop = {}
    if dropout:
        drop = dict(dropout=dropout, mask=dropout_mask(seed, dropout, B, Hq, Nq, k.shape[2]).to(q.device))
    truth = reference_outputs(q, k, v, do, causal=causal, sm_scale=sm_scale, softcap=softcap, **align, **drop)
    if cross_check_reference and not softcap and not dropout:
        sdpa64 = sdpa_outputs(q, k, v, do, causal=causal, sm_scale=sm_scale, dtype=torch.float64, **align)
        for name in ("o", "dq", "dk", "dv"):
            torch.testing.assert_close(getattr(truth, name), getattr(sdpa64, name), rtol=1e-7, atol=1e-9,
                                       msg=lambda m, name=name: f"reference_attention vs SDPA float64, {name}: {m}")
    tf32 = uses_tf32(dtype, q.device, precision)
    if softcap or dropout:
        torch_low = reference_outputs(q, k, v, do, causal=causal, sm_scale=sm_scale, softcap=softcap,
                                      dtype=baseline_dtype(dtype, tf32=tf32), **align, **drop)
    else:
        torch_low = sdpa_outputs(q, k, v, do, causal=causal, sm_scale=sm_scale,
                                 dtype=baseline_dtype(dtype, tf32=tf32), **align)

    empty = torch.isneginf(truth.lse)  # rows that see no key
    assert torch.equal(torch.isneginf(ours.lse), empty), "lse: -inf exactly on the rows that see no key"
    errors = {"lse": assert_close_to_reference("lse", *(x.masked_fill(empty, 0.0) for x in
                                                        (ours.lse, truth.lse, torch_low.lse)), tol=tol, lse=True)}
    s_max = max_visible_score(q, k, sm_scale, causal, causal_align, window) if dtype == torch.float32 else 0.0
    if softcap:
        s_max = min(s_max, softcap)  # the capped scores are what the backward recomputes
    for name in ("o", "dq", "dk", "dv"):
        slack = 0.0 if name == "o" else recompute_slack(s_max, getattr(truth, name))
        errors[name] = assert_close_to_reference(name, getattr(ours, name), getattr(truth, name),
                                                 getattr(torch_low, name), tol=tol, extra=slack)
    return errors


def max_visible_score(q, k, sm_scale, causal, causal_align="top_left", window=None) -> float:
    """max |S| over the scores a query sees, exact on small (CPU) shapes; 0 on large ones,
    where the Cauchy-Schwarz bound would be loose and the scores are small anyway."""
    if q.shape[2] * k.shape[2] * q.shape[0] * q.shape[1] > 1 << 22:
        return 0.0
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    kk = k.detach().double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q.detach().double() @ kk.transpose(-1, -2)).abs() * abs(scale)
    keep = attention_mask(q.shape[2], k.shape[2], causal=causal, causal_align=causal_align, window_size=window,
                          device=s.device)
    if keep is not None:
        s = s * keep
    return s.max().item()


def recompute_slack(s_max: float, grad_truth) -> float:
    """The backward recomputes P = exp(S - LSE) with S rounded afresh (another dot order
    than the forward's), where torch's autograd reuses the forward's P. In fp32 a rounding
    of S relative to eps moves P by |S| * eps relative, which only matters once scores are
    large (|S| ~ 100+, the overflow cases): allow 2 * eps32 * max|S| * max|grad|."""
    return 2 * torch.finfo(torch.float32).eps * s_max * grad_truth.abs().max().item()


def run_case(case: Case, device) -> dict:
    q, k, v, do = case_inputs(case, device)
    return check_attention(q, k, v, do, dtype_name=case.dtype, causal=case.causal, sm_scale=case.sm_scale,
                           fwd_config=case.fwd, bwd_config=case.bwd, check_strides=case.layout in DENSE_LAYOUTS,
                           causal_align=case.causal_align, softcap=case.softcap, window=case.window,
                           dropout=case.dropout, seed=dropout_seed(case) if case.dropout else None)


def smoke_in_subprocess(code: str, *, what: str, hang_hint: str, timeout: float = 180) -> None:
    """Run ``code`` in a process of its own under a timeout and fail the calling test (a
    module fixture's, so every test of the module) at once if it hangs or fails: a kernel
    with mbarrier rings that has never run can hang rather than fail, and a hang would hold
    the GPU run until its limit."""
    import subprocess
    import sys

    import pytest

    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not return within {timeout:g} s ({hang_hint})", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"{what}'s smoke call failed:\n{done.stderr[-3000:]}", pytrace=False)


def compile_for_sm90(script, request: list[dict], *, timeout: float, what: str) -> list[dict]:
    """The result line per requested item of a script that compiles kernels for sm_90 without
    a GPU (sm90_shared_memory.py, gluon_compile_sm90.py: JSON items on stdin, one JSON line
    each on stdout), run with the interpreter off; skips the test where this triton cannot
    compile for sm_90 here (the script's first line then says why)."""
    import json
    import os
    import subprocess
    import sys

    import pytest

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(script)], input=json.dumps(request), check=False,
                         capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0, f"compiling {what} for sm_90 failed:\n{out.stderr[-4000:]}"
    results = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    if results and "skip" in results[0]:
        pytest.skip(results[0]["skip"])
    assert len(results) == len(request)
    return results


# ----------------------------------------------------------------------------------
# Packed variable-length sequences (attention_varlen): a loop over the sequences
# ----------------------------------------------------------------------------------
def offsets(lengths, device="cpu") -> torch.Tensor:
    """cu_seqlens of ``lengths``: int32, 0 first."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


@dataclasses.dataclass(frozen=True)
class VarlenCase:
    """One attention_varlen call to check: the sequence lengths of the pack, dtype,
    masking, configs."""

    dtype: str
    causal: bool
    lens_q: tuple[int, ...]
    lens_k: tuple[int, ...]
    head_dim: int
    heads: tuple[int, int] = (4, 2)
    configs: tuple[FwdConfig, BwdConfig] | None = None  # None: the defaults
    window: tuple[int, int] | None = None
    softcap: float | None = None
    dropout: float | None = None  # dropout_p, with the seed dropout_seed(case)

    def __str__(self) -> str:
        parts = [self.dtype, "causal" if self.causal else "full", "q" + ".".join(map(str, self.lens_q)),
                 "k" + ".".join(map(str, self.lens_k)), f"d{self.head_dim}", "h{}kv{}".format(*self.heads)]
        if self.configs is None:
            parts.append("default")
        else:
            fwd, bwd = self.configs
            parts.append(f"fwd{fwd.BLOCK_M}x{fwd.BLOCK_N}-"
                         f"bwd{bwd.BLOCK_M1}x{bwd.BLOCK_N1}.{bwd.BLOCK_M2}x{bwd.BLOCK_N2}")
            if bwd.atomic_dq:
                parts.append("atomic")
            if fwd.tma or fwd.num_splits > 1 or bwd.tma or bwd.dkdv_split > 1:
                parts.append("ignored-fields")
        if self.window is not None:
            parts.append("window{}.{}".format(*self.window))
        if self.softcap is not None:
            parts.append(f"softcap{self.softcap:g}")
        if self.dropout is not None:
            parts.append(f"dropout{self.dropout:g}")
        return "-".join(parts)


def varlen_inputs(case: VarlenCase, device):
    """Leaf packed q, k, v (requiring grad) and dO for a case, seeded by its name."""
    gen = torch.Generator().manual_seed(zlib.crc32(str(case).encode()))
    dtype = DTYPES[case.dtype][0]
    hq, hkv = case.heads
    tq, tk, d = sum(case.lens_q), sum(case.lens_k), case.head_dim
    scale = 3.0 if case.softcap else 1.0  # scores past the cap
    q, k, v, do = (torch.randn(n, h, d, generator=gen) * s for n, h, s in
                   ((tq, hq, scale), (tk, hkv, scale), (tk, hkv, 1.0), (tq, hq, 1.0)))
    q, k, v, do = (x.to(device=device, dtype=dtype) for x in (q, k, v, do))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    """(n, H, D) rows of one sequence as a (1, H, n, D) batch."""
    return t.transpose(0, 1).unsqueeze(0)


def loop_reference(q, k, v, do, lens_q, lens_k, *, causal, sm_scale=None, dtype=torch.float64, window=None,
                   softcap=None, grads: bool = True, dropout=None, mask=None) -> Outputs:
    """reference_attention per sequence (bottom-right), in ``dtype``, concatenated; lse
    (Hq, total_q); ``dropout`` (p) with its (Hq, total_q, max_seqlen_k) ``mask``. A sequence
    without queries adds nothing; queries without keys get o 0, lse -inf and dq 0; keys
    without queries dk = dv = 0. ``grads=False``: o and lse only (the gradients None)."""
    qr, kr, vr = (x.detach().to(dtype).requires_grad_(grads) for x in (q, k, v))
    cq, ck = offsets(lens_q).tolist(), offsets(lens_k).tolist()
    outs, lses = [], []
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        if nq == 0:
            continue
        if nk == 0:
            outs.append(torch.zeros(nq, q.shape[1], q.shape[2], dtype=dtype, device=q.device))
            lses.append(torch.full((q.shape[1], nq), -math.inf, dtype=dtype, device=q.device))
            continue
        keep = mask[:, cq[b]:cq[b + 1], :nk].unsqueeze(0) if dropout else None
        o, lse = reference_attention(*(_heads_first(x[c[b]:c[b + 1]]) for x, c in ((qr, cq), (kr, ck), (vr, ck))),
                                     causal=causal, sm_scale=sm_scale, dtype=dtype, causal_align="bottom_right",
                                     window_size=window, softcap=softcap, dropout_mask=keep,
                                     dropout_p=dropout or 0.0)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    o, lse = torch.cat(outs), torch.cat(lses, dim=1)
    if not grads:
        return Outputs(o.detach(), lse.detach(), None, None, None)
    g = torch.autograd.grad(o, (qr, kr, vr), do.to(dtype), allow_unused=True)
    dq, dk, dv = (torch.zeros_like(x) if g_x is None else g_x for g_x, x in zip(g, (qr, kr, vr)))
    return Outputs(o.detach(), lse.detach(), dq, dk, dv)


def _max_score(q, k, case: VarlenCase) -> float:
    """max |S| a query sees over the sequences (fp32 cases; kernel_checks.recompute_slack)."""
    cq, ck = offsets(case.lens_q).tolist(), offsets(case.lens_k).tolist()
    scores = [max_visible_score(_heads_first(q[cq[b]:cq[b + 1]]), _heads_first(k[ck[b]:ck[b + 1]]), None,
                                case.causal, "bottom_right", case.window)
              for b, (nq, nk) in enumerate(zip(case.lens_q, case.lens_k)) if nq and nk]
    return max(scores, default=0.0)


def check_varlen(case: VarlenCase, device) -> dict:
    """attention_varlen forward and backward against ``loop_reference`` by the rule of
    ``check_attention``: float64 truth, the same loop in the input's dtype as baseline
    (float16 for tf32 dots), for the log-sum-exp (kept in fp32 by the kernels) in float32;
    the log-sum-exp (Hq, total_q) -inf exactly on the rows without keys. Returns the max
    errors by name."""
    q, k, v, do = varlen_inputs(case, device)
    dtype, precision = DTYPES[case.dtype]
    fwd, bwd = case.configs or (None, None)
    o, lse = attention_varlen(q, k, v, offsets(case.lens_q, device), offsets(case.lens_k, device),
                              max(case.lens_q), max(case.lens_k), causal=case.causal, fwd_config=fwd, bwd_config=bwd,
                              return_lse=True, fp32_precision=precision, window_size=case.window,
                              softcap=case.softcap, dropout_p=case.dropout or 0.0,
                              dropout_seed=dropout_seed(case) if case.dropout else None)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    hq = case.heads[0]
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    for grad, x in ((dq, q), (dk, k), (dv, v)):
        assert grad.shape == x.shape and grad.dtype == x.dtype

    args = dict(causal=case.causal, window=case.window, softcap=case.softcap)
    if case.dropout:
        args.update(dropout=case.dropout, mask=varlen_dropout_mask(dropout_seed(case), case.dropout, hq, q.shape[0],
                                                                   max(case.lens_k)).to(device))
    truth = loop_reference(q, k, v, do, case.lens_q, case.lens_k, **args)
    low = loop_reference(q, k, v, do, case.lens_q, case.lens_k,
                         dtype=baseline_dtype(dtype, tf32=uses_tf32(dtype, device, precision)), **args)
    lse32 = low.lse if low.o.dtype == torch.float32 else \
        loop_reference(q, k, v, do, case.lens_q, case.lens_k, dtype=torch.float32, grads=False, **args).lse
    tol = tolerance(case.dtype, device)
    empty = torch.isneginf(truth.lse)
    assert torch.equal(torch.isneginf(lse), empty), "lse: -inf exactly on the rows that see no key"
    errors = {"lse": assert_close_to_reference("lse", *(x.masked_fill(empty, 0.0) for x in (lse, truth.lse, lse32)),
                                               tol=tol, lse=True)}
    s_max = _max_score(q, k, case) if dtype == torch.float32 else 0.0
    if case.softcap:
        s_max = min(s_max, case.softcap)
    for name, ours in (("o", o), ("dq", dq), ("dk", dk), ("dv", dv)):
        slack = 0.0 if name == "o" else recompute_slack(s_max, getattr(truth, name))
        errors[name] = assert_close_to_reference(name, ours, getattr(truth, name), getattr(low, name), tol=tol,
                                                 extra=slack)
    return errors
