"""fp8 attention for inference: ``attention_fp8()`` and its input checks; forward only.

FlashAttention-3's convention: q, k and v in float8_e4m3fn (or float8_e5m2) with per-tensor
descale factors, the real values being the fp8 ones times their descale. The plain forward
kernel's FP8 variant runs it (kernels/triton/forward.py): Q K^T as an fp8 dot with fp32
accumulation, q_descale * k_descale folded into the score scale, P cast to V's fp8 type for
the P V dot, v_descale applied once to the output (acc * v_descale / l), the output cast to
fp16 or bf16. The split-KV kernel (kernels/decode.py) does not take fp8: decode-sized calls
run the plain kernel too. A Gluon config (family=1) runs the Gluon forward's FP8 variant on
sm_90 (kernels/gluon/) when V's keys are contiguous; the heuristic default is that
kernel at D=128 for long calls on sm_90 (config.is_long; config.py, docs/fp8.md).
"""

from __future__ import annotations

import math
import numbers

import torch

from flashtune.kernels.common import LN2
from flashtune.configs.base import FP8_DTYPES
from flashtune.configs.forward import FwdConfig
from flashtune.heuristics.bands import is_long
from flashtune.kernels.passes import attention_forward
from flashtune.kernels.api import check_inputs, check_softcap, check_window
from flashtune.kernels.passes import _default, _validated

OUT_DTYPES = (torch.float16, torch.bfloat16)
# fp8 tensor cores: Ada (8.9) and Hopper (9.0) and newer
MIN_CAPABILITY = (8, 9)


def check_descale(name: str, value) -> float:
    """A per-tensor descale as a float, or ValueError naming it: a positive finite number or a
    1-element floating-point tensor (read on the host: a device sync for a CUDA tensor)."""
    if value is None:
        raise ValueError(f"{name}: required for fp8 inputs (the real values are the fp8 ones times {name}); "
                         "pass 1.0 for inputs that are not scaled")
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected one descale for the whole tensor (a number or a 1-element "
                             f"tensor), got a tensor of shape {tuple(value.shape)}")
        if not value.dtype.is_floating_point:
            raise ValueError(f"{name}: expected a floating-point tensor, got {value.dtype}")
        value = value.item()
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a positive finite number or a 1-element tensor, got "
                         f"{type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive finite descale, got {value!r}")
    return value


def check_fp8_inputs(q, k, v, *, q_descale, k_descale, v_descale, out_dtype, causal=False, sm_scale=None,
                     causal_align="top_left") -> tuple[float, tuple[float, float, float]]:
    """Raise TypeError/ValueError naming the argument for fp8 inputs the kernel cannot run;
    else return the softmax scale and the three descales as floats."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if q.dtype not in FP8_DTYPES:
        raise ValueError(f"q: expected dtype float8_e4m3fn or float8_e5m2, got {q.dtype} (attention() takes "
                         "16- and 32-bit inputs)")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: expected the dtype of q ({q.dtype}), got {t.dtype}: q, k and v share one "
                             "fp8 dtype")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.requires_grad:
            raise ValueError(f"{name}: requires grad, but attention_fp8 is forward only (no autograd); pass "
                             f"{name}.detach(), or train with attention() in bf16")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: expected torch.float16 or torch.bfloat16, got {out_dtype!r}")
    scale = check_inputs(q, k, v, causal=causal, sm_scale=sm_scale, causal_align=causal_align, dtypes=FP8_DTYPES)
    check_fp8_device(q.dtype, q.device)
    descales = tuple(check_descale(name, d) for name, d in
                     (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)))
    return scale, descales


def check_fp8_device(dtype: torch.dtype, device: torch.device) -> None:
    """ValueError naming the dtype and the GPU when ``device`` is a CUDA device without fp8
    tensor cores (compute capability below 8.9); the CPU (the interpreter) passes."""
    if device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise ValueError(f"q: {dtype} attention needs fp8 tensor cores, compute capability "
                         f"{'.'.join(map(str, MIN_CAPABILITY))} or newer (Ada, Hopper); "
                         f"{torch.cuda.get_device_name(device)} ({device}) has {'.'.join(map(str, capability))}")


def keys_contiguous(v: torch.Tensor) -> torch.Tensor:
    """``v`` (B, H, N, D) copied so that the keys are contiguous (strides (H*D*N, D*N, 1, N)):
    the layout Hopper's fp8 tensor cores read P @ V's V operand in (K-major). Same shape and
    values; one read and one write of V."""
    return v.transpose(2, 3).contiguous().transpose(2, 3)


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, q_descale=None, k_descale=None,
                  v_descale=None, causal: bool = False, sm_scale: float | None = None,
                  out_dtype: torch.dtype = torch.bfloat16, config: FwdConfig | None = None,
                  return_lse: bool = False, causal_align: str = "top_left", softcap: float | None = None,
                  window_size: tuple[int, int] | None = None, relayout_v: bool = True):
    """FlashAttention forward on fp8 inputs (inference: no autograd), in torch SDPA's layout.

    q (batch, heads_q, seq_q, head_dim), k and v (batch, heads_kv, seq_k, head_dim), all
    float8_e4m3fn or all float8_e5m2, heads_q a multiple of heads_kv; any strides.
    ``q_descale``, ``k_descale``, ``v_descale`` (required): per-tensor descale factors,
    positive finite numbers or 1-element tensors (FlashAttention-3's convention: the real q is
    ``q.float() * q_descale``); a tensor is read on the host, one device sync each, so pass
    Python floats on a hot path. The scores are ``sm_scale * (q_descale * k_descale) * q k^T``,
    ``sm_scale`` defaulting to 1/sqrt(head_dim); the output is ``v_descale * softmax(...) @ v``
    in ``out_dtype`` (torch.bfloat16 by default, or torch.float16), in q's layout.

    Accuracy: the probabilities P are cast to V's fp8 type for the P V dot (e4m3: 3 mantissa
    bits, a relative error up to 2^-4 per probability; e5m2: 2^-3), so expect errors of about
    a percent of |v| against attention on the dequantized inputs (docs/performance.md, fp8).

    ``causal``, ``causal_align``, ``softcap``, ``window_size``: as ``attention()``.
    ``config``: a FwdConfig (BLOCK_N >= 32, tma=0; num_splits and pack_gqa are ignored: the
    plain kernel runs, also for decode-sized calls; ``family=1``: the Gluon kernel's FP8
    variant on sm_90, where V's keys are contiguous, else the Triton default) or None for
    the heuristic default (on sm_90 at D=128 on long calls, config.is_long, the Gluon kernel, measured;
    elsewhere the Triton kernel, untuned). ``relayout_v`` (default True): a V whose keys are
    not contiguous (the usual (B, H, N, D) layout, head dim contiguous) is first copied into
    the key-contiguous layout (``keys_contiguous``), the one Hopper's fp8 tensor cores read
    P V's V in; pass V in that layout to skip the copy, or False to run on V as given.

    fp8 needs compute capability 8.9 or newer (ValueError otherwise), or CPU tensors under the
    Triton interpreter. Bad input raises ValueError naming the argument (check_fp8_inputs);
    not under torch.compile.

    Returns o, or (o, lse) with ``return_lse=True``: lse (batch, heads_q, seq_q) float32, the
    natural-log log-sum-exp of each row's (dequantized) scaled scores.
    """
    if torch.compiler.is_compiling():
        raise NotImplementedError("attention_fp8: not supported under torch.compile (it reads the descales on the "
                                  "host); call it outside the compiled region")
    scale, (q_scale, k_scale, v_scale) = check_fp8_inputs(
        q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype,
        causal=causal, sm_scale=sm_scale, causal_align=causal_align)
    cap = check_softcap(softcap)
    window = check_window(window_size)
    D = q.shape[-1]
    if config is None:
        # the long bucket for long calls (on sm_90 at D=128 the Gluon kernel's FP8
        # variant, config.py); no decode bucket: fp8 runs the plain kernel at every length
        config = _default("fwd", D, q.dtype, q.device, bool(causal),
                          "long" if is_long("fwd", q.shape[2], k.shape[2], q.dtype) else None)
    elif not isinstance(config, FwdConfig):
        raise TypeError(f"config: expected a FwdConfig or None, got {type(config).__name__}")
    else:
        config = _validated(config, D, q.dtype, q.device)
    if relayout_v and v.stride(2) != 1 and v.shape[2] > 1:
        v = keys_contiguous(v)
    o, lse2 = attention_forward(q, k, v, config, causal=causal, sm_scale=scale * q_scale * k_scale,
                                causal_align=causal_align, softcap=cap, window_size=window, v_descale=v_scale,
                                out_dtype=out_dtype)
    if return_lse:
        return o, lse2 * LN2
    return o
