"""fp8 forward (attention_fp8, the forward kernel's FP8 variant) against a float64 attention on
the dequantized inputs, with an error bound derived from fp8's precision; its input checks.

The bound. The kernel computes the scores exactly up to fp32 rounding (fp8 x fp8 products are
exact in fp32) and the softmax sums l from unrounded probabilities, but casts each probability
to V's fp8 type for the P V dot. With round-to-nearest a probability p <= 1 comes back as
p(1 + d) + e, |d| <= u = 2^-(mantissa bits + 1) (e4m3 2^-4, e5m2 2^-3) and |e| <= eta, half
the subnormal spacing (e4m3 2^-10, e5m2 2^-17), which covers the probabilities below the
smallest normal number; the online softmax casts p times a factor >= 1 (the running max is
below the final one) and scales the result back down, which keeps both bounds. Hence, per
output element (query i, column d), with P the exact softmax and v the dequantized values:

    |o - o_ref| <= u (P |v|)_id + eta max_j P_ij sum_j |v_jd| + r |o_ref| + fp32 slack,

r the output's rounding (fp16 2^-11; bf16 2^-7, the interpreter truncates) and the slack
(D a x the largest |score| term sum, twice, for the scores, a = 2^-24 for fp32 and 2^-13 on
a GPU, whose fp8 tensor cores accumulate with about 14 bits (DeepSeek-V3's report, section
3.3.2); (Nk + 16) 2^-24 for the accumulations and exp2) far below the rest. Every element
must be within it (the worst is printed). The errors of different keys are independent with variance at most u^2 p^2 / 3
(e: eta^2 / 3), so the root-mean-square error must also stay within twice the
root-mean-square of that per-element deviation: a bias (truncation instead of rounding, a
wrong descale) fails it even where the worst-case bound is loose.

Triton 3.6's interpreter rounds fp32 -> fp8 casts wrongly (a round-up that carries out of
the mantissa is lost: relative errors up to 1/2; its fp8 dots, converted to fp16 first, are
exact): the fixture below replaces its conversion by torch's round-to-nearest-even, the
rounding of the GPU's cvt.rn.satfinite, for fp8 targets only. On a GPU it does nothing.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import zlib

import numpy as np
import pytest
import torch
import triton.runtime.interpreter as interpreter
from kernel_checks import compile_for_sm90

import flashtune
from flashtune import device
from flashtune.heuristics import tables
from flashtune.kernels import FwdConfig, attention, attention_fp8
from flashtune.configs.base import ConfigError, padded_head_dim
from flashtune.heuristics.defaults import default_config
from flashtune.kernels.reference import attention_mask, reference_attention

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# round-to-nearest unit roundoff and half the subnormal spacing of each fp8 type
UNIT = {E4M3: 2.0 ** -4, E5M2: 2.0 ** -3}
HALF_SUBNORMAL = {E4M3: 2.0 ** -10, E5M2: 2.0 ** -17}
OUT_ROUNDING = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -7}
SM90_SCRIPT = pathlib.Path(__file__).with_name("sm90_shared_memory.py")
UNPATCHED_CONVERT = interpreter._convert_float  # before exact_fp8_casts replaces it


@pytest.fixture(autouse=True)
def exact_fp8_casts(monkeypatch):
    """Under the interpreter: fp32/fp16 -> fp8 conversions rounded as torch (and the GPU) do."""
    if not device.INTERPRETER:
        return
    import triton.language as tl

    real = UNPATCHED_CONVERT
    targets = {tl.float8e4nv: E4M3, tl.float8e5: E5M2}
    sources = {32: np.float32, 16: np.float16}

    def convert(data, input_dtype, output_dtype, rounding_mode):
        if output_dtype not in targets or input_dtype.primitive_bitwidth not in sources or input_dtype.is_bf16():
            return real(data, input_dtype, output_dtype, rounding_mode)
        values = np.frombuffer(data.tobytes(), dtype=sources[input_dtype.primitive_bitwidth]).astype(np.float32)
        out = torch.from_numpy(values).to(targets[output_dtype]).view(torch.uint8).numpy()
        return out.reshape(np.shape(data))

    monkeypatch.setattr(interpreter, "_convert_float", convert)


@dataclasses.dataclass(frozen=True)
class Fp8Case:
    dtype: torch.dtype
    causal: bool
    n_q: int
    n_k: int
    head_dim: int
    heads: tuple[int, int] = (2, 2)
    batch: int = 1
    config: FwdConfig | None = None
    out_dtype: torch.dtype = torch.float16
    descales: tuple[float, float, float] = (0.02, 0.03, 0.01)
    q_gain: float = 1.0  # > 1: peakier softmax rows
    v_layout: str = "bhnd"  # "bhdn": keys contiguous, as relayout_v makes it
    relayout_v: bool = True
    q_layout: str = "bhnd"
    causal_align: str = "top_left"
    softcap: float | None = None
    window: tuple[int, int] | None = None

    def __str__(self) -> str:
        hq, hkv = self.heads
        parts = ["e4m3" if self.dtype == E4M3 else "e5m2", "causal" if self.causal else "full",
                 f"q{self.n_q}k{self.n_k}", f"d{self.head_dim}", f"b{self.batch}h{hq}kv{hkv}",
                 "default" if self.config is None else self.config.label().replace(" ", ""),
                 str(self.out_dtype).replace("torch.", ""), f"v-{self.v_layout}"]
        if not self.relayout_v:
            parts.append("as-given")
        if self.q_layout != "bhnd":
            parts.append(f"q-{self.q_layout}")
        if self.q_gain != 1.0:
            parts.append(f"gain{self.q_gain:g}")
        if self.causal_align != "top_left":
            parts.append("br")
        if self.softcap is not None:
            parts.append(f"softcap{self.softcap:g}")
        if self.window is not None:
            parts.append(f"window{self.window[0]}.{self.window[1]}")
        return "-".join(parts)


def _layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x (B, H, N, D) with the same values in another memory layout."""
    if layout == "bhnd":
        return x.contiguous()
    if layout == "bnhd":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "bhdn":
        return x.transpose(2, 3).contiguous().transpose(2, 3)
    raise ValueError(layout)


def fp8_inputs(case: Fp8Case, device):
    """q, k, v in the case's fp8 dtype: standard normal real values quantized with the case's
    descales (about 150-450 in fp8 units at 3 sigma: e4m3's range ends at 448, e5m2's at 57344)."""
    gen = torch.Generator().manual_seed(zlib.crc32(str(case).encode()))
    hq, hkv = case.heads
    shapes = [(case.batch, hq, case.n_q, case.head_dim)] + [(case.batch, hkv, case.n_k, case.head_dim)] * 2
    real = [torch.randn(s, generator=gen) for s in shapes]
    real[0] = real[0] * case.q_gain
    fp8 = [(x / d).clamp(-400, 400).to(case.dtype) for x, d in zip(real, case.descales)]
    layouts = (case.q_layout, "bhnd", case.v_layout)
    return [_layout(x, layout).to(device) for x, layout in zip(fp8, layouts)]


def dequantized(x: torch.Tensor, descale: float) -> torch.Tensor:
    return x.cpu().to(torch.float64) * descale


def probabilities(q, k, *, sm_scale, causal, causal_align="top_left", softcap=None, window=None):
    """The exact softmax (B, Hq, Nq, Nk) in float64 of float64 inputs (rows without keys: 0)."""
    group = q.shape[1] // k.shape[1]
    s = sm_scale * q @ k.repeat_interleave(group, dim=1).transpose(-1, -2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    keep = attention_mask(q.shape[2], k.shape[2], causal=causal, causal_align=causal_align, window_size=window)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def fp8_error_bound(p, v_abs, *, dtype, out_dtype, o_ref, score_terms, n_k, gpu: bool):
    """(per-element bound, per-element rms deviation) of the fp8 kernel's output (module doc)."""
    u, eta, r = UNIT[dtype], HALF_SUBNORMAL[dtype], OUT_ROUNDING[out_dtype]
    score_unit = 2.0 ** -13 if gpu else 2.0 ** -24
    pv = p @ v_abs
    p_max = p.amax(dim=-1, keepdim=True)
    v_sum = p.new_ones(p.shape) @ v_abs  # sum_j |v_jd| per row
    fp32 = 2 * score_terms * score_unit + (n_k + 16) * 2.0 ** -24
    bound = u * pv + eta * p_max * v_sum + r * o_ref.abs() + fp32 * pv + 1e-30
    var = (u ** 2 / 3) * ((p ** 2) @ v_abs ** 2) + (eta ** 2 / 3) * p_max ** 2 * (p.new_ones(p.shape) @ v_abs ** 2) \
        + (r * o_ref) ** 2 / 3
    return bound, var


def check_fp8(case: Fp8Case, device) -> dict:
    q, k, v = fp8_inputs(case, device)
    qd, kd, vd = case.descales
    sm_scale = 1.0 / math.sqrt(case.head_dim)
    o, lse = attention_fp8(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, causal=case.causal,
                           out_dtype=case.out_dtype, config=case.config, return_lse=True,
                           causal_align=case.causal_align, softcap=case.softcap, window_size=case.window,
                           relayout_v=case.relayout_v)
    assert o.dtype == case.out_dtype and o.shape == q.shape and o.device == q.device
    assert o.stride() == torch.empty_like(q, dtype=case.out_dtype).stride()  # q's layout
    q64, k64, v64 = dequantized(q, qd), dequantized(k, kd), dequantized(v, vd)
    o_ref, lse_ref = reference_attention(q64, k64, v64, causal=case.causal, sm_scale=sm_scale, dtype=torch.float64,
                                         causal_align=case.causal_align, softcap=case.softcap,
                                         window_size=case.window)
    p = probabilities(q64, k64, sm_scale=sm_scale, causal=case.causal, causal_align=case.causal_align,
                      softcap=case.softcap, window=case.window)
    group = case.heads[0] // case.heads[1]
    v_abs = v64.abs().repeat_interleave(group, dim=1)
    k_abs = k64.abs().repeat_interleave(group, dim=1)
    # the largest sum of |score terms| per query row (the fp32 rounding of the scores)
    score_terms = case.head_dim * sm_scale * (q64.abs() @ k_abs.transpose(-1, -2)).amax(dim=-1, keepdim=True)
    bound, var = fp8_error_bound(p, v_abs, dtype=case.dtype, out_dtype=case.out_dtype, o_ref=o_ref,
                                 score_terms=score_terms, n_k=case.n_k, gpu=o.is_cuda)
    err = (o.cpu().double() - o_ref).abs()
    ratio = err / bound
    worst = int(ratio.argmax())
    idx = np.unravel_index(worst, tuple(err.shape))
    rms, rms_allowed = err.pow(2).mean().sqrt().item(), 2 * var.mean().sqrt().item() + 1e-12
    figures = {"max_err": err.max().item(), "mean_err": err.mean().item(), "mean_abs_o": o_ref.abs().mean().item(),
               "worst_ratio": ratio.max().item(),
               "rms": rms, "rms_allowed": rms_allowed, "over_bound": int((ratio > 1).sum())}
    print(case, figures)
    assert torch.isfinite(o).all()
    assert figures["over_bound"] == 0, (f"{figures['over_bound']} of {err.numel()} elements over the fp8 bound; "
                                        f"worst at {idx}: error {err[idx].item():.4g} > bound {bound[idx].item():.4g}")
    assert rms <= rms_allowed, f"rms error {rms:.4g} > allowed {rms_allowed:.4g}: a bias beyond fp8 rounding"
    # the log-sum-exp of the real scores, from unrounded fp32 probabilities
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    lse_err = (lse.cpu().double() - lse_ref)[seen].abs()
    # each score is off by at most its terms' rounding in the accumulator (Hopper's fp8 wgmma
    # keeps about 13 bits: fp8_error_bound), and the log-sum-exp by at most the largest of them
    score_unit = 2.0 ** -13 if o.is_cuda else 2.0 ** -24
    allowed = 1e-4 + 1e-5 * lse_ref[seen].abs() + 2 * score_terms.squeeze(-1).expand_as(lse_ref)[seen] * score_unit
    assert lse_err.numel() == 0 or (lse_err <= allowed).all(), (lse_err.max(), allowed.min())
    return figures


F = FwdConfig
CASES = [
    Fp8Case(E4M3, False, 64, 64, 64),
    Fp8Case(E4M3, True, 47, 47, 40, heads=(4, 2), config=F(32, 32, 4, 1)),
    Fp8Case(E4M3, True, 33, 69, 64, heads=(4, 1), q_gain=3.0, causal_align="bottom_right"),
    Fp8Case(E4M3, False, 70, 33, 32, batch=2, config=F(16, 32, 4, 2)),
    Fp8Case(E4M3, True, 1, 69, 64, heads=(4, 1), causal_align="bottom_right"),  # decode-sized: the plain kernel
    Fp8Case(E4M3, False, 40, 70, 64, v_layout="bhdn", q_layout="bnhd"),  # V already keys-contiguous
    Fp8Case(E4M3, True, 40, 70, 64, relayout_v=False, config=F(32, 64, 4, 1)),  # V head-dim contiguous
    Fp8Case(E4M3, False, 33, 47, 16, out_dtype=torch.bfloat16, descales=(1.0, 0.5, 4.0)),  # D pads to 32
    Fp8Case(E4M3, True, 47, 69, 64, heads=(2, 1), softcap=2.0, window=(20, 0), causal_align="bottom_right"),
    Fp8Case(E5M2, False, 64, 64, 64),
    Fp8Case(E5M2, True, 47, 47, 48, heads=(4, 2), config=F(32, 32, 4, 1), q_gain=3.0),
    Fp8Case(E5M2, True, 69, 33, 64, causal_align="bottom_right"),  # the first 36 queries see no key
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fp8_matches_the_dequantized_reference(case, kernel_device):
    check_fp8(case, kernel_device)


def test_fp8_is_close_to_attention_on_the_16_bit_inputs(kernel_device):
    """Quantize 16-bit inputs per tensor (amax to e4m3's 448) and compare attention_fp8 with
    attention() on the 16-bit inputs themselves (bf16 on a GPU; fp16 under the interpreter,
    which computes bf16 wrongly). Allowed: the kernel's fp8 bound (above), plus what the
    quantization of the inputs moves: v's rounding (u P|v|), and the scores' (exactly
    computed in float64: a score moved by ds changes every probability of its row by at
    most a factor e^(2 max ds)), plus attention()'s own 16-bit error (P rounded to 16 bits
    and the output: 2 x 16-bit unit roundoff of P|v|); v's subnormals (below 2^-6 in fp8
    units) move by at most 2^-10 descale."""
    dtype = torch.bfloat16 if kernel_device.type == "cuda" else torch.float16
    gen = torch.Generator().manual_seed(19)
    B, Hq, Hkv, N, D = 1, 4, 2, 96, 64
    q16, k16, v16 = (torch.randn(B, h, N, D, generator=gen).to(dtype) for h in (Hq, Hkv, Hkv))
    fmax = torch.finfo(E4M3).max
    descales = [x.abs().max().float().item() / fmax for x in (q16, k16, v16)]
    q8, k8, v8 = ((x.float() / d).to(E4M3) for x, d in zip((q16, k16, v16), descales))
    for causal in (False, True):
        o8 = attention_fp8(*(x.to(kernel_device) for x in (q8, k8, v8)), q_descale=torch.tensor(descales[0]),
                           k_descale=descales[1], v_descale=torch.tensor([descales[2]]), causal=causal,
                           out_dtype=dtype)
        o16 = attention(*(x.to(kernel_device) for x in (q16, k16, v16)), causal=causal)
        q64, k64, v64 = (x.double() for x in (q16, k16, v16))
        qd, kd, vd = (dequantized(x, d) for x, d in zip((q8, k8, v8), descales))
        sm_scale = D ** -0.5
        p = probabilities(q64, k64, sm_scale=sm_scale, causal=causal)
        p8 = probabilities(qd, kd, sm_scale=sm_scale, causal=causal)
        o_ref = p8 @ vd.repeat_interleave(Hq // Hkv, dim=1)
        group = Hq // Hkv
        v_abs = v64.abs().repeat_interleave(group, dim=1)
        score_terms = D * sm_scale * (qd.abs() @ kd.abs().repeat_interleave(group, dim=1).transpose(-1, -2)).amax(
            dim=-1, keepdim=True)
        kernel_bound, _ = fp8_error_bound(p8, vd.abs().repeat_interleave(group, dim=1), dtype=E4M3, out_dtype=dtype,
                                          o_ref=o_ref, score_terms=score_terms, n_k=N, gpu=o8.is_cuda)
        ds = (sm_scale * (qd @ kd.repeat_interleave(group, dim=1).transpose(-1, -2)
                          - q64 @ k64.repeat_interleave(group, dim=1).transpose(-1, -2))).abs()
        ds_row = ds.masked_fill(p == 0, 0).amax(dim=-1, keepdim=True)
        u16 = torch.finfo(dtype).eps / 2
        allowed = kernel_bound + UNIT[E4M3] * (p8 @ v_abs) + HALF_SUBNORMAL[E4M3] * descales[2] \
            + (torch.exp(2 * ds_row) - 1) * (p @ v_abs) + 2 * u16 * (p @ v_abs) + 1e-6
        err = (o8.cpu().double() - o16.cpu().double()).abs()
        print(f"causal={causal}: max error {err.max().item():.4g} mean {err.mean().item():.4g}, "
              f"max error / allowed {(err / allowed).max().item():.3f}, mean |o| {o16.float().abs().mean().item():.3g}")
        assert (err <= allowed).all(), f"max error / allowed {(err / allowed).max().item():.3f}"


def test_fp8_relays_v_out_keys_contiguous_unless_told(kernel_device, monkeypatch):
    """relayout_v (default): a V with the head dim contiguous reaches the kernel with the keys
    contiguous (same values); one already so, or relayout_v=False, is passed as it is."""
    from flashtune.kernels import fp8

    seen = []
    real = fp8.attention_forward
    monkeypatch.setattr(fp8, "attention_forward", lambda q, k, v, cfg, **kw: seen.append(v) or real(q, k, v, cfg, **kw))
    q, k, v = fp8_inputs(Fp8Case(E4M3, False, 8, 40, 32), kernel_device)
    descales = {"q_descale": 1.0, "k_descale": 1.0, "v_descale": 1.0}
    o = attention_fp8(q, k, v, **descales)
    assert seen[-1].stride(2) == 1 and torch.equal(seen[-1].float(), v.float()) and v.stride(3) == 1
    keys = fp8.keys_contiguous(v)
    assert torch.equal(attention_fp8(q, k, keys, **descales), o) and seen[-1] is keys
    # another compiled kernel (V's tiles loaded otherwise): the same sums, maybe in another order on a GPU
    torch.testing.assert_close(attention_fp8(q, k, v, relayout_v=False, **descales), o, rtol=2 ** -7, atol=1e-3)
    assert seen[-1] is v


def test_attention_points_fp8_inputs_to_attention_fp8(kernel_device):
    q, k, v = fp8_inputs(Fp8Case(E5M2, False, 8, 8, 32), kernel_device)
    with pytest.raises(TypeError, match=r"q: expected dtype float16, bfloat16 or float32, got torch.float8_e5m2 "
                                        r"\(fp8 inputs: flashtune.attention_fp8, forward only\)"):
        attention(q, k, v)


def test_fp8_descales_scale_the_result(kernel_device):
    """Halving v_descale halves the output; scaling q_descale by 2 and k_descale by 1/2 changes
    nothing (only their product enters); the defaults: 1/sqrt(D), bf16 output."""
    case = Fp8Case(E4M3, False, 17, 33, 32)
    q, k, v = fp8_inputs(case, kernel_device)
    run = lambda qd, kd, vd, **kw: attention_fp8(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd,  # noqa: E731
                                                 out_dtype=torch.float16, **kw)
    o = run(0.02, 0.03, 0.01)
    # fp16 output: exact halving but in its subnormals (below 2^-14), where a step is 2^-24
    torch.testing.assert_close(run(0.02, 0.03, 0.005), o / 2, rtol=2 ** -10, atol=2 ** -24)
    torch.testing.assert_close(run(0.04, 0.015, 0.01), o, rtol=0, atol=0)
    torch.testing.assert_close(run(0.02, 0.03, 0.01, sm_scale=1 / math.sqrt(32)), o, rtol=0, atol=0)
    default = attention_fp8(q, k, v, q_descale=0.02, k_descale=0.03, v_descale=0.01)
    assert default.dtype == torch.bfloat16
    assert (default.float() - o.float()).abs().max() <= 2 ** -7 * o.float().abs().max()
    assert flashtune.attention_fp8 is attention_fp8


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"q_descale": None}, ValueError, "q_descale: required for fp8 inputs"),
    ({"v_descale": None}, ValueError, "v_descale: required"),
    ({"k_descale": 0.0}, ValueError, "k_descale: expected a positive finite descale, got 0.0"),
    ({"k_descale": -1.0}, ValueError, "k_descale: expected a positive finite descale, got -1.0"),
    ({"q_descale": float("nan")}, ValueError, "q_descale: expected a positive finite descale, got nan"),
    ({"v_descale": float("inf")}, ValueError, "v_descale: expected a positive finite descale, got inf"),
    ({"v_descale": torch.tensor([1.0, 2.0])}, ValueError, "v_descale: expected one descale for the whole tensor"),
    ({"q_descale": torch.tensor(1)}, ValueError, "q_descale: expected a floating-point tensor, got torch.int64"),
    ({"q_descale": torch.tensor(-2.0)}, ValueError, "q_descale: expected a positive finite descale, got -2.0"),
    ({"q_descale": "1"}, ValueError, "q_descale: expected a positive finite number or a 1-element tensor, got str"),
    ({"k_descale": True}, ValueError, "k_descale: expected a positive finite number or a 1-element tensor, got bool"),
    ({"out_dtype": torch.float32}, ValueError, "out_dtype: expected torch.float16 or torch.bfloat16, got "
                                               "torch.float32"),
    ({"out_dtype": E4M3}, ValueError, "out_dtype: expected torch.float16 or torch.bfloat16"),
    ({"q": "half"}, ValueError, "q: expected dtype float8_e4m3fn or float8_e5m2, got torch.float16"),
    ({"k": "half"}, ValueError, "k: expected the dtype of q (torch.float8_e4m3fn), got torch.float16"),
    ({"v": "e5m2"}, ValueError, "v: expected the dtype of q (torch.float8_e4m3fn), got torch.float8_e5m2"),
    ({"q": "grad"}, ValueError, "q: requires grad, but attention_fp8 is forward only (no autograd)"),
    ({"v": "grad"}, ValueError, "v: requires grad"),
    ({"k": "short"}, ValueError, "k, v: expected head_dim 32 like q"),
    ({"causal": 1}, TypeError, "causal: expected a bool"),
    ({"config": F(64, 16, 4, 1)}, ConfigError, "BLOCK_N: expected at least 32 for torch.float8_e4m3fn inputs"),
    ({"config": F(64, 32, 4, 1, tma=1)}, ConfigError, "tma: supported for float16/bfloat16"),
    ({"config": {"BLOCK_M": 64}}, TypeError, "config: expected a FwdConfig or None, got dict"),
])
def test_fp8_bad_input_names_the_argument(kernel_device, change, error, message):
    q, k, v = fp8_inputs(Fp8Case(E4M3, False, 8, 8, 32), kernel_device)
    args = {"q": q, "k": k, "v": v, "q_descale": 1.0, "k_descale": 1.0, "v_descale": 1.0}
    for name, value in change.items():
        t = args.get(name)
        if isinstance(value, str) and name in "qkv":
            value = {"half": lambda: t.to(torch.float16), "e5m2": lambda: t.float().to(E5M2),
                     "grad": lambda: t.to(torch.float16).requires_grad_().to(E4M3),  # a non-leaf needing grad
                     "short": lambda: t[..., :16]}[value]()
        args[name] = value
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        attention_fp8(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_the_interpreter_needs_the_fp8_rounding_fix(kernel_device):
    """The fixture's reason: Triton's interpreter casts fp32 to fp8 wrongly (when the second
    check fails, triton fixed it and the fixture can go); with the fixture a kernel's cast is
    torch's, bit for bit."""
    if kernel_device.type == "cuda":
        pytest.skip("the interpreter's casts only")
    import triton
    import triton.language as tl
    from triton._C.libtriton import ir

    @triton.jit
    def cast(X, Y, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(Y + offs, tl.load(X + offs).to(Y.dtype.element_ty))

    x = torch.linspace(0.01, 1.0, 256)
    for dtype, tl_dtype in ((E4M3, tl.float8e4nv), (E5M2, tl.float8e5)):
        y = torch.empty(256, dtype=dtype)
        cast[(1,)](x, y, 256)
        assert torch.equal(y.view(torch.uint8), x.to(dtype).view(torch.uint8))
        raw = UNPATCHED_CONVERT(x.numpy(), tl.float32, tl_dtype, ir.ROUNDING_MODE.RTNE)
        raw = torch.from_numpy(np.asarray(raw).astype(np.uint8)).view(dtype).float()
        assert ((raw - x).abs() / x).max() > 0.25, "the interpreter rounds fp8 right now: drop exact_fp8_casts"


def test_fp8_configs_follow_the_fp8_rules():
    """fp8 tiles take one byte an element (half the 16-bit shared memory), the head dim pads to
    32, BLOCK_N >= 32; the defaults validate at every head dim, on sm_90 and off it."""
    cfg = F(128, 128, 8, 3)
    assert cfg.shared_memory(128, E4M3) * 2 == cfg.shared_memory(128, torch.bfloat16) == 229376
    assert padded_head_dim(16, E4M3) == 32 and padded_head_dim(16) == 16 and padded_head_dim(80, E5M2) == 128
    assert cfg.shared_memory(16, E4M3) == 32 * (128 + 6 * 128)
    for d in (8, 16, 40, 64, 80, 128, 200, 256):
        for dtype in (E4M3, E5M2):
            default = default_config("fwd", d, dtype, "cpu")
            assert default.BLOCK_N >= 32 and not default.tma
            assert default.validate(d, dtype, "cpu") is default
    with pytest.raises(ConfigError, match="BLOCK_N: expected at least 32"):
        F(64, 16, 4, 1).validate(64, E5M2)
    F(64, 16, 4, 1).validate(64, torch.float16)  # the rule is fp8's alone


def test_fp8_needs_compute_capability_8_9(monkeypatch):
    """A CUDA device below 8.9 is refused naming the dtype and the GPU (a pretended A100 and
    H200: no GPU needed); the CPU (the interpreter) passes."""
    from flashtune.kernels import fp8

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match=r"q: torch.float8_e5m2 attention needs fp8 tensor cores, compute "
                                         r"capability 8.9 or newer \(Ada, Hopper\); NVIDIA A100-SXM4-80GB \(cuda:1\) "
                                         r"has 8.0$"):
        fp8.check_fp8_device(E5M2, torch.device("cuda", 1))
    for capability in ((8, 9), (9, 0), (10, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        fp8.check_fp8_device(E4M3, torch.device("cuda", 0))
    fp8.check_fp8_device(E4M3, torch.device("cpu"))


def test_fp8_kernels_compile_for_sm90_with_wgmma_and_within_the_estimate():
    """The fp8 defaults at D=64/128/256, e4m3 and e5m2, causal and not, compile for the H200
    without a GPU within validate()'s shared-memory estimate. With V's keys contiguous (what
    relayout_v makes) V's tiles are pipelined by async copies like K's; with V's head dim
    contiguous fewer async copies are left (triton loads V through registers to feed the
    fp8 tensor cores K-major): why attention_fp8 re-lays V out by default."""
    fwd_table = tables.HEURISTICS[(9, 0)][0]
    # the Triton kernel's entries (a Gluon one, family=1, is the Gluon compile test's)
    items = [(cfg, d, "float8_e4m3fn", causal, True) for (dtype, d, *rest), cfg in fwd_table.items()
             if dtype == E4M3 and d >= 64 and not cfg.family for causal in (False, True)]
    items += [(fwd_table[(E4M3, 128)], 128, "float8_e5m2", True, True),
              (fwd_table[(E4M3, 128)], 128, "float8_e4m3fn", False, False)]
    results = compile_for_sm90(SM90_SCRIPT, [{"pass": "fwd", "config": cfg.to_dict(), "head_dim": d, "dtype": dt,
                                              "causal": causal, "v_keys_contiguous": keys}
                                             for cfg, d, dt, causal, keys in items],
                               timeout=900, what="the fp8 forward")
    for (cfg, d, dt, causal, keys), res in zip(items, results):
        print(dt, d, causal, cfg.label(), "keys contiguous" if keys else "head dim contiguous", res["shared"],
              res["async_copies"])
        assert res["shared"][0] <= cfg.shared_memory(d, getattr(torch, dt)), (d, dt, cfg.label(), res["shared"])
    by_layout = {keys: res["async_copies"][0] for (cfg, d, dt, causal, keys), res in zip(items, results)
                 if d == 128 and dt == "float8_e4m3fn" and not causal}
    assert by_layout[True] > by_layout[False], by_layout
