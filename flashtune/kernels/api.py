"""The public kernel entry: input checks, the autograd Functions, ``attention()``,
``attention_varlen()`` and ``attention_jvp()``."""

from __future__ import annotations

import math
import numbers

import torch
from torch.autograd import forward_ad as _forward_ad

from flashtune.configs.backward import BwdConfig
from flashtune.configs.base import FP8_DTYPES, MAX_HEAD_DIM
from flashtune.configs.forward import FwdConfig
from flashtune.device import INTERPRETER
from flashtune.kernels.common import CAUSAL_ALIGNS, Dropout, LN2, PRECISIONS, Varlen, torch_fp32_precision
from flashtune.kernels.ops import compiled_attention
from flashtune.kernels.passes import attention_backward, attention_forward, forward_key, resolve_configs
from flashtune.kernels.triton.jvp import attention_jvp_forward, attention_jvp_op, default_jvp_config, validate_jvp_config


SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_softcap(softcap) -> float:
    """``softcap`` as the kernels take it (0.0: off), or ValueError/TypeError naming it."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap: expected a positive number or None, got {type(softcap).__name__}")
    if not math.isfinite(softcap) or softcap <= 0:
        raise ValueError(f"softcap: expected a positive finite number or None, got {softcap!r}")
    return float(softcap)


def check_window(window_size) -> tuple[int, int] | None:
    """``window_size`` as the kernels take it, FlashAttention's (left, right) with -1 an
    unbounded side (None: (-1, -1), no window), or ValueError/TypeError naming it."""
    if window_size is None:
        return None
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        got = f"{type(window_size).__name__} of length {len(window_size)}" \
            if isinstance(window_size, (tuple, list)) else type(window_size).__name__
        raise TypeError(f"window_size: expected a (left, right) pair of ints or None, got {got}")
    for side, size in zip(("left", "right"), window_size):
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise TypeError(f"window_size: expected a (left, right) pair of ints or None, got {type(size).__name__} "
                            f"for {side}")
        if size < -1:
            raise ValueError(f"window_size: expected sizes >= 0, or -1 for an unbounded side, got {side} {size}")
    left, right = (int(size) for size in window_size)
    return None if (left, right) == (-1, -1) else (left, right)


def check_dropout_p(dropout_p) -> float:
    """``dropout_p`` as a float in [0, 1), or ValueError/TypeError naming it."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p: expected a number in [0, 1), got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:  # NaN fails too
        raise ValueError(f"dropout_p: expected a probability in [0, 1), got {dropout_p!r}")
    return float(dropout_p)


def draw_rng(device: torch.device) -> torch.Tensor:
    """A fresh (seed, offset) for common.Dropout from torch's default generator of ``device``
    (CUDA's Philox state on a GPU, so ``torch.manual_seed`` makes a run repeatable and a
    captured CUDA graph draws anew on each replay): one int64 tensor of two, on the device."""
    return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)


def check_dropout(dropout_p, dropout_seed, device: torch.device) -> Dropout | None:
    """The kernels' dropout for ``dropout_p`` (0: None, the kernels without it) and
    ``dropout_seed``: None draws (seed, offset) from torch's generator (draw_rng); an int in
    [0, 2**63) is the seed, offset 0; an int64 tensor of two on ``device`` is (seed, offset)
    as it is (read by the kernels when they run: CUDA graphs and torch.compile). Raises
    ValueError/TypeError naming the argument."""
    p = check_dropout_p(dropout_p)
    if dropout_seed is None:
        rng = None
    elif isinstance(dropout_seed, torch.Tensor):
        if dropout_seed.dtype != torch.int64 or dropout_seed.shape != (2,):
            raise ValueError(f"dropout_seed: expected an int64 tensor of shape (2,) (seed, offset), got "
                             f"{dropout_seed.dtype} of shape {tuple(dropout_seed.shape)}")
        if dropout_seed.device != device:
            raise ValueError(f"dropout_seed: expected the device of q ({device}), got {dropout_seed.device}")
        rng = dropout_seed.contiguous()
    elif isinstance(dropout_seed, bool) or not isinstance(dropout_seed, numbers.Integral):
        raise TypeError(f"dropout_seed: expected an int, an int64 tensor (seed, offset) or None, got "
                        f"{type(dropout_seed).__name__}")
    elif not 0 <= dropout_seed < 2**63:
        raise ValueError(f"dropout_seed: expected an int in [0, 2**63), got {dropout_seed}")
    else:
        rng = torch.tensor([int(dropout_seed), 0], dtype=torch.int64, device=device)
    if not p:
        return None
    return Dropout(p, draw_rng(device) if rng is None else rng)


def check_inputs(q, k, v, *, causal=False, sm_scale=None, fp32_precision="tf32", causal_align="top_left",
                 dtypes=SUPPORTED_DTYPES) -> float:
    """Raise TypeError/ValueError naming the argument for anything the kernels cannot run.
    ``dtypes``: those accepted (fp8.check_fp8_inputs passes the fp8 ones, checked first).

    Returns the softmax scale to use.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor (batch, heads, seq_len, head_dim), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in dtypes:
            hint = " (fp8 inputs: flashtune.attention_fp8, forward only)" if t.dtype in FP8_DTYPES else ""
            raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {t.dtype}{hint}")
        if t.numel() == 0:
            raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected the dtype of q ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected the device of q ({q.device}), got {t.device}")
    if q.device.type == "cpu" and not INTERPRETER:
        raise ValueError("q: CPU tensors need the Triton interpreter; set TRITON_INTERPRET=1 before importing "
                         "flashtune, or move the tensors to a CUDA device")
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        raise TypeError("q: bfloat16 is not computed correctly by the Triton interpreter; use float16 or float32 on "
                        "the CPU, or a CUDA device for bfloat16")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q: expected a CUDA tensor, got device {q.device}")
    B, Hq, _, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"k, v: expected batch size {B} like q, got {k.shape[0]} and {v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"v: expected the heads and seq_len of k {tuple(k.shape[1:3])}, got {tuple(v.shape[1:3])}")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"k, v: expected head_dim {D} like q, got {k.shape[3]} and {v.shape[3]}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"q: head_dim must be in [1, {MAX_HEAD_DIM}], got {D}")
    if Hq % k.shape[1] != 0:
        raise ValueError(f"k: the number of query heads ({Hq}) must be a multiple of the number of key/value "
                         f"heads ({k.shape[1]})")
    if not isinstance(causal, bool):
        kind = type(causal)
        raise TypeError(f"causal: expected a bool, got {kind.__module__}.{kind.__qualname__} {causal!r}")
    if fp32_precision not in PRECISIONS:
        raise ValueError(f"fp32_precision: expected one of {PRECISIONS}, got {fp32_precision!r}")
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align: expected one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    if sm_scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real) or not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale: expected a finite number, got {sm_scale!r}")
    return float(sm_scale)


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, fwd_config, bwd_config, fp32_precision, causal_align="top_left",
                softcap=0.0, window_size=None, varlen=None, dropout=None):
        # the launch plans' signature (kernels/launch.py), computed once for both passes
        key = None
        if varlen is None and dropout is None:
            key = forward_key(q, k, v, fwd_config, causal, sm_scale, fp32_precision, causal_align, softcap,
                              window_size)
        o, lse2 = attention_forward(q, k, v, fwd_config, causal=causal, sm_scale=sm_scale,
                                    fp32_precision=fp32_precision, causal_align=causal_align, softcap=softcap,
                                    window_size=window_size, varlen=varlen, dropout=dropout, plan_key=key)
        _keep_for_backward(ctx, q, k, v, o, lse2, causal, sm_scale, bwd_config, fp32_precision, causal_align, softcap,
                           window_size, varlen, dropout, key)
        return o, lse2

    @staticmethod
    def backward(ctx, do, _dlse2):
        return _gradients(ctx, do)


def _keep_for_backward(ctx, q, k, v, o, lse2, causal, sm_scale, bwd_config, fp32_precision, causal_align, softcap,
                       window_size, varlen, dropout, plan_key) -> None:
    """What the backward of both autograd Functions reads (``_gradients``)."""
    ctx.plan_key = plan_key
    ctx.save_for_backward(q, k, v, o, lse2)
    ctx.causal, ctx.sm_scale, ctx.causal_align, ctx.softcap = causal, sm_scale, causal_align, softcap
    ctx.window_size, ctx.varlen, ctx.dropout = window_size, varlen, dropout  # the mask: its seed, never stored
    ctx.bwd_config, ctx.fp32_precision = bwd_config, fp32_precision
    ctx.mark_non_differentiable(lse2)
    ctx.set_materialize_grads(False)  # lse2 has no gradient: no zero tensor per backward


def _gradients(ctx, do) -> tuple:
    """The gradients of an autograd Function's 13 inputs (q, k, v first) from dO."""
    if do is None:  # o took no part in the loss
        return (None,) * 13
    q, k, v, o, lse2 = ctx.saved_tensors
    dq, dk, dv = attention_backward(do, q, k, v, o, lse2, ctx.bwd_config, causal=ctx.causal, sm_scale=ctx.sm_scale,
                                    fp32_precision=ctx.fp32_precision, causal_align=ctx.causal_align,
                                    softcap=ctx.softcap, window_size=ctx.window_size, varlen=ctx.varlen,
                                    dropout=ctx.dropout, plan_key=ctx.plan_key)
    return (dq, dk, dv) + (None,) * 10


class FlashAttentionJvpFunction(torch.autograd.Function):
    """FlashAttentionFunction with forward-mode AD, run by attention() inside a dual level
    (torch.autograd.forward_ad's dual tensors, torch.func.jvp): the same forward and
    backward, and a ``jvp`` that runs the JVP kernel (kernels/jvp.py) on the inputs'
    tangents (a missing one is zero). The primal comes from the forward kernel as without
    tangents; the JVP kernel computes o again with its tangent (one extra forward's work),
    with its own default config (jvp.default_jvp_config; ``fwd_config`` is the forward's).
    In the setup_context form torch.func needs. Tangents with softcap, a window, dropout or
    packed sequences raise ValueError naming the argument."""

    @staticmethod
    def forward(q, k, v, causal, sm_scale, fwd_config, bwd_config, fp32_precision, causal_align="top_left",
                softcap=0.0, window_size=None, varlen=None, dropout=None):
        return attention_forward(q, k, v, fwd_config, causal=causal, sm_scale=sm_scale,
                                 fp32_precision=fp32_precision, causal_align=causal_align, softcap=softcap,
                                 window_size=window_size, varlen=varlen, dropout=dropout)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (q, k, v, causal, sm_scale, fwd_config, bwd_config, fp32_precision, causal_align, softcap, window_size, varlen,
         dropout) = inputs
        o, lse2 = output
        _keep_for_backward(ctx, q, k, v, o, lse2, causal, sm_scale, bwd_config, fp32_precision, causal_align, softcap,
                           window_size, varlen, dropout, None)
        ctx.save_for_forward(q, k, v)

    @staticmethod
    def backward(ctx, do, _dlse2):
        return _gradients(ctx, do)

    @staticmethod
    def jvp(ctx, tq, tk, tv, *_):
        from torch._functorch import eager_transforms

        if getattr(eager_transforms, "JVP_NESTING", 0) > 1:
            # the operator's outputs carry no derivative of their own: a jvp of this jvp would
            # get its second-order term as zero
            raise NotImplementedError("flashtune.attention: nested forward-mode AD (a torch.func.jvp of a jvp) is "
                                      "not supported; the JVP kernel gives first-order tangents only")
        q, k, v = ctx.saved_tensors
        check_jvp_options(softcap=ctx.softcap, window_size=ctx.window_size, dropout=ctx.dropout, varlen=ctx.varlen)
        tq, tk, tv = check_tangents(q, k, v, tq, tk, tv)
        # the forward's config was chosen for the forward kernel: the JVP kernel's default here
        config = default_jvp_config(q.shape[-1], q.dtype, q.device)
        # through the operator: under torch.func the tensors here are functorch's wrappers
        _, t_o, _ = attention_jvp_op(q, k, v, tq, tk, tv, ctx.causal, ctx.sm_scale, ctx.fp32_precision,
                                     ctx.causal_align, config.BLOCK_M, config.BLOCK_N, config.num_warps,
                                     config.num_stages)
        return t_o, None


def check_jvp_options(*, softcap=0.0, window_size=None, dropout=None, varlen=None) -> None:
    """ValueError naming the first option the JVP kernel does not have (kernels/jvp.py)."""
    for name, value in (("softcap", softcap), ("window_size", window_size), ("dropout_p", dropout),
                        ("varlen", varlen)):
        if value:
            if name == "varlen":
                what = "packed sequences (attention_varlen)"
            elif name == "dropout_p":
                what = f"dropout_p={value.p!r}"
            else:
                what = f"{name}={value!r}"
            raise ValueError(f"{name}: not supported with forward-mode tangents (jvp): the JVP kernel has no "
                             f"{what}; call without tangents, or without {name}")


def check_tangents(q, k, v, tq, tk, tv) -> tuple:
    """The tangents as the JVP kernel takes them (None: zero), in their primal's dtype, or
    ValueError/TypeError naming the tangent."""
    out = []
    for name, t, p in (("tq", tq, q), ("tk", tk, k), ("tv", tv, v)):
        if t is None:
            out.append(None)
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
        if t.shape != p.shape:
            raise ValueError(f"{name}: expected the shape of {name[1]} {tuple(p.shape)}, got {tuple(t.shape)}")
        if t.device != p.device:
            raise ValueError(f"{name}: expected the device of {name[1]} ({p.device}), got {t.device}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
        out.append(t if t.dtype == p.dtype else t.to(p.dtype))
    return tuple(out)


def attention_jvp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tq: torch.Tensor | None = None,
                  tk: torch.Tensor | None = None, tv: torch.Tensor | None = None, *, causal: bool = False,
                  sm_scale: float | None = None, fwd_config: FwdConfig | None = None,
                  fp32_precision: str | None = None, causal_align: str = "top_left", return_lse: bool = False):
    """Attention and its forward-mode tangent in one pass (kernels/jvp.py), without autograd.

    q, k, v as ``attention`` (SDPA's layout, grouped-query heads, any strides); tq, tk, tv
    their tangents, each of its primal's shape (None: zero; another float dtype is cast
    to the primal's). With s = sm_scale q k^T, p = softmax(s), o = p v: t_o = p (ts - mu) v
    + p tv, ts = sm_scale (tq k^T + q tk^T), mu = sum_j p_j ts_j (per query). ``causal``,
    ``causal_align``, ``sm_scale``, ``fp32_precision``: as ``attention``. ``fwd_config``:
    its BLOCK_M, BLOCK_N, num_warps and num_stages (default: ``jvp.default_jvp_config``;
    tma, the split schedule and the Gluon family are not used). No softcap, window,
    dropout or packed sequences with tangents.

    The outputs carry no autograd history: inputs that require grad while grad is enabled
    are refused (for gradients of the primal use ``attention`` under
    ``torch.func.jvp`` or ``torch.autograd.forward_ad``).

    Returns (o, t_o), or (o, t_o, lse) with ``return_lse=True``: lse (B, Hq, Nq) float32,
    the natural-log log-sum-exp as ``attention`` returns it.
    """
    if fp32_precision is None:
        fp32_precision = torch_fp32_precision(q.dtype) if isinstance(q, torch.Tensor) else "tf32"
    scale = check_inputs(q, k, v, causal=causal, sm_scale=sm_scale, fp32_precision=fp32_precision,
                         causal_align=causal_align)
    tq, tk, tv = check_tangents(q, k, v, tq, tk, tv)
    if torch.is_grad_enabled():
        for name, t in (("q", q), ("k", k), ("v", v), ("tq", tq), ("tk", tk), ("tv", tv)):
            if t is not None and t.requires_grad:
                raise ValueError(f"{name}: requires grad, but attention_jvp has no autograd; use attention() under "
                                 f"torch.func.jvp or torch.autograd.forward_ad, or pass {name}.detach()")
    config = default_jvp_config(q.shape[-1], q.dtype, q.device) if fwd_config is None else \
        validate_jvp_config(fwd_config, q.shape[-1], q.dtype, q.device)
    o, t_o, lse2 = attention_jvp_forward(q, k, v, tq, tk, tv, config, causal=causal, sm_scale=scale,
                                         fp32_precision=fp32_precision, causal_align=causal_align)
    if return_lse:
        return o, t_o, lse2 * LN2
    return o, t_o


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              sm_scale: float | None = None, fwd_config: FwdConfig | None = None,
              bwd_config: BwdConfig | None = None, return_lse: bool = False,
              fp32_precision: str | None = None, causal_align: str = "top_left", softcap: float | None = None,
              window_size: tuple[int, int] | None = None, dropout_p: float = 0.0, dropout_seed=None):
    """FlashAttention, differentiable, in torch SDPA's layout.

    q is (batch, heads_q, seq_q, head_dim); k and v are (batch, heads_kv, seq_k, head_dim)
    with heads_q a multiple of heads_kv (grouped-query attention). Any strides work,
    and outputs come back in q's layout. ``causal`` follows SDPA's ``is_causal``: query i
    sees keys j <= i, aligned top-left when seq_q != seq_k; with
    ``causal_align="bottom_right"`` query i sees keys j <= i + seq_k - seq_q (FlashAttention's
    convention, torch's ``causal_lower_right``; queries that see no key, when seq_q > seq_k,
    get 0). ``sm_scale`` defaults to 1/sqrt(head_dim). ``fwd_config``/``bwd_config``
    default to the heuristic table for this GPU.

    float32 inputs follow torch's fp32 matmul precision unless ``fp32_precision`` says
    otherwise: ``torch.backends.cuda.matmul.fp32_precision`` "tf32" or
    ``torch.get_float32_matmul_precision()`` "high"/"medium" give "tf32" dots (10-bit
    mantissa, fastest); otherwise (torch's default, "highest") fp32-accurate "ieee" dots
    (see common.torch_fp32_precision). ``fp32_precision`` is one of "tf32", "tf32x3"
    (three tf32 products per dot), "ieee".

    ``softcap`` (a positive number; None: off) caps the scaled scores at
    ``softcap * tanh(scores / softcap)`` before the softmax, in the forward and backward
    (Gemma-2's attention logit softcapping).

    ``window_size=(left, right)`` is FlashAttention's sliding window (Mistral's, Gemma-2's
    local layers): query i sees key j iff diag - left <= j <= diag + right, diag being i's
    diagonal in the ``causal_align`` frame (i, or i + seq_k - seq_q bottom-right); -1 leaves
    a side unbounded, None or (-1, -1) is no window. With ``causal`` right is capped at 0.
    Key blocks outside the window are skipped, not masked; queries that see no key get 0
    as above.

    ``dropout_p`` in [0, 1) drops each attention probability with that probability and
    scales the rest by 1 / (1 - dropout_p), FlashAttention's dropout: o = (mask * P / (1 -
    p)) V with P = softmax(scores), the log-sum-exp of the undropped scores. It is applied
    whenever dropout_p > 0 (as SDPA does: pass 0 in eval). The mask comes from Philox4x32
    (common.Dropout), is regenerated in the backward and never stored, and depends on the
    seed, the element's (batch, head, query, key) and the shape only, not on the configs.
    ``dropout_seed``: None draws the seed from torch's generator of q's device (so
    ``torch.manual_seed`` repeats a run, and a captured CUDA graph draws anew per replay);
    an int fixes it (the same int, the same mask; a host-to-device copy per call, which CUDA
    graph capture refuses); an int64 tensor (seed, offset) of two on q's device is read when
    the kernels run (for CUDA graphs). Decode-sized calls with dropout run the plain forward kernel, not the split one.

    Returns o, or (o, lse) with ``return_lse=True``: lse is (batch, heads_q, seq_q) float32,
    the natural-log log-sum-exp of the scaled scores of each query row. Gradients flow
    through o only: lse is returned for inspection and is not differentiable.
    """
    compiling = torch.compiler.is_compiling()
    checked = None
    if not compiling and dropout_seed is None and type(dropout_p) in (float, int) and dropout_p == 0:
        # a signature whose arguments passed the checks below before: its checked values (the
        # signature holds everything the checks read: shapes, dtypes, devices, the values and
        # types of the arguments; an unhashable or non-tensor argument takes the full path)
        try:
            checked = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
                       type(causal), causal, type(sm_scale), sm_scale, fwd_config, bwd_config, fp32_precision,
                       causal_align, type(softcap), softcap, window_size, INTERPRETER)
            hit = _CHECKED.get(checked)
        except (AttributeError, TypeError):
            checked = hit = None
        if hit is not None:
            scale, cap, window, fwd, bwd = hit
            if fp32_precision is None:
                fp32_precision = torch_fp32_precision(q.dtype)
            o, lse2 = _run(q, k, v, fwd, bwd, causal, scale, fp32_precision, causal_align, cap, window)
            return (o, lse2 * LN2) if return_lse else o
    if fp32_precision is None and not compiling:  # compiled: the operator reads torch's setting when it runs
        fp32_precision = torch_fp32_precision(q.dtype) if isinstance(q, torch.Tensor) else "tf32"
    scale = check_inputs(q, k, v, causal=causal, sm_scale=sm_scale, fp32_precision="tf32" if fp32_precision is None else fp32_precision,
                         causal_align=causal_align)
    cap = check_softcap(softcap)
    window = check_window(window_size)
    dropout = check_dropout(dropout_p, dropout_seed, q.device)
    if compiling:  # one traceable operator per pass, configs resolved in it on the real shapes (kernels/ops.py)
        o, lse2 = compiled_attention(q, k, v, causal=causal, sm_scale=scale, fwd_config=fwd_config,
                                     bwd_config=bwd_config, fp32_precision="" if fp32_precision is None else fp32_precision,
                                     causal_align=causal_align, softcap=cap, window_size=window, dropout=dropout)
    else:
        fwd, bwd = resolve_configs(q, fwd_config, bwd_config, causal, dropout=dropout is not None, seq_k=k.shape[2],
                                   heads_kv=k.shape[1])
        if checked is not None:  # every argument of the signature passed the checks above
            if len(_CHECKED) >= 4096:
                _CHECKED.clear()
            _CHECKED[checked] = (scale, cap, window, fwd, bwd)
        o, lse2 = _run(q, k, v, fwd, bwd, causal, scale, fp32_precision, causal_align, cap, window, dropout=dropout)
    if return_lse:
        return o, lse2 * LN2
    return o


_CHECKED: dict = {}  # attention()'s checked signatures: their (scale, softcap, window, configs)


def _run(q, k, v, fwd, bwd, causal, scale, fp32_precision, causal_align, cap, window, varlen=None, dropout=None):
    """(o, lse2) of checked inputs and configs: through autograd where a gradient is wanted,
    else the launcher alone, without autograd's cost per call. Inside a forward-mode AD dual
    level (torch.autograd.forward_ad, torch.func.jvp) the inputs may carry tangents, which
    only an autograd.Function with a jvp sees: FlashAttentionJvpFunction."""
    if _forward_ad._current_level >= 0:
        return FlashAttentionJvpFunction.apply(q, k, v, causal, scale, fwd, bwd, fp32_precision, causal_align, cap,
                                               window, varlen, dropout)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttentionFunction.apply(q, k, v, causal, scale, fwd, bwd, fp32_precision, causal_align, cap,
                                            window, varlen, dropout)
    return attention_forward(q, k, v, fwd, causal=causal, sm_scale=scale, fp32_precision=fp32_precision,
                             causal_align=causal_align, softcap=cap, window_size=window, varlen=varlen,
                             dropout=dropout)


# CUDA caps grid z (the varlen kernels' sequence axis) at 65535
MAX_VARLEN_BATCH = 65535


def check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                        sm_scale=None, fp32_precision="tf32") -> tuple[float, Varlen]:
    """Raise TypeError/ValueError naming the argument for a packed batch the varlen kernels
    cannot run (attention_varlen's inputs); else return the softmax scale and the Varlen.

    The cumulative lengths are checked on the host: one ``.tolist()`` of each (a device
    sync for CUDA tensors), the price of a clear error instead of reads out of bounds.
    """
    for name, t, rows in (("q", q, "total_q"), ("k", k, "total_k"), ("v", v, "total_k")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name}: expected a 3-D packed tensor ({rows}, heads, head_dim), got shape "
                             f"{tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name}: expected at least one token, head and head_dim entry, got shape "
                             f"{tuple(t.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v: expected the shape of k (total_k, heads, head_dim) {tuple(k.shape)}, got "
                         f"{tuple(v.shape)}")
    # dtypes, devices, head dims, grouped heads, causal, sm_scale: as a batch of one sequence
    scale = check_inputs(*(t.unsqueeze(0).transpose(1, 2) for t in (q, k, v)), causal=causal, sm_scale=sm_scale,
                         fp32_precision=fp32_precision)
    batch = None
    for name, cu, t, tensor in (("cu_seqlens_q", cu_seqlens_q, q, "q"), ("cu_seqlens_k", cu_seqlens_k, k, "k")):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor of int32, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name}: expected dtype int32, got {cu.dtype}")
        if cu.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor of batch + 1 offsets, got shape {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name}: expected the device of q ({q.device}), got {cu.device}")
        if batch is None:
            if cu.numel() < 2:
                raise ValueError(f"{name}: expected batch + 1 >= 2 offsets, got {cu.numel()}")
            batch = cu.numel() - 1
            if batch > MAX_VARLEN_BATCH:
                raise ValueError(f"{name}: expected at most {MAX_VARLEN_BATCH} sequences, got {batch}")
        elif cu.numel() != batch + 1:
            raise ValueError(f"{name}: expected batch + 1 = {batch + 1} offsets like cu_seqlens_q, got {cu.numel()}")
        offsets = cu.tolist()
        if offsets[0] != 0:
            raise ValueError(f"{name}: expected 0 as the first offset, got {offsets[0]}")
        for i in range(1, len(offsets)):
            if offsets[i] < offsets[i - 1]:
                raise ValueError(f"{name}: expected non-decreasing offsets, got {offsets[i - 1]} then {offsets[i]} "
                                 f"at index {i}")
        if offsets[-1] != t.shape[0]:
            raise ValueError(f"{name}: expected the last offset to be {tensor}'s total tokens {t.shape[0]} "
                             f"({tensor}.shape[0]), got {offsets[-1]}")
        longest = max(b - a for a, b in zip(offsets, offsets[1:]))
        max_name, given = ("max_seqlen_q", max_seqlen_q) if tensor == "q" else ("max_seqlen_k", max_seqlen_k)
        if isinstance(given, bool) or not isinstance(given, numbers.Integral):
            raise TypeError(f"{max_name}: expected an int, got {type(given).__name__}")
        if not longest <= given < 2**31:
            raise ValueError(f"{max_name}: expected at least the longest sequence of {name} ({longest}) and below "
                             f"2**31, got {given}")
    # the kernels read offset b at CU + b: a strided view is copied
    return scale, Varlen(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), int(max_seqlen_q), int(max_seqlen_k))


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     sm_scale: float | None = None, fwd_config: FwdConfig | None = None,
                     bwd_config: BwdConfig | None = None, return_lse: bool = False,
                     fp32_precision: str | None = None, softcap: float | None = None,
                     window_size: tuple[int, int] | None = None, dropout_p: float = 0.0, dropout_seed=None):
    """FlashAttention over packed variable-length sequences, differentiable, in
    FlashAttention's varlen layout (``flash_attn_varlen_func``).

    q is (total_q, heads_q, head_dim), k and v (total_k, heads_kv, head_dim), heads_q a
    multiple of heads_kv (grouped-query attention), any strides. ``cu_seqlens_q`` and
    ``cu_seqlens_k`` are int32 tensors of batch + 1 offsets on q's device, starting at 0,
    non-decreasing, ending at total_q (total_k): sequence b is the rows
    [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q attending to the rows
    [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v, and nothing else. ``max_seqlen_q``
    and ``max_seqlen_k`` are at least the longest sequence's lengths (they size the
    grid). Sequences may be empty: no query, no output; queries with no key get 0.

    ``causal`` follows FlashAttention's varlen convention, aligned bottom-right in each
    sequence: query i of a sequence with lq queries and lk keys sees keys j <= i + lk - lq
    (lq = lk: j <= i; queries with i < lq - lk see no key and get 0).
    ``window_size=(left, right)`` (-1 unbounded) is FlashAttention's sliding window in that
    same frame: query i sees keys [i + lk - lq - left, i + lk - lq + right], right capped
    at 0 with causal. ``softcap``, ``sm_scale``, ``fp32_precision``, ``dropout_p`` and
    ``dropout_seed``, the configs: as ``attention`` (the dropout mask's rows numbered (query
    head, packed query row), its keys within the sequence, common.Dropout); the forward
    always runs the plain kernel (the config's num_splits and pack_gqa are ignored), both passes load through pointers (tma is ignored) and the
    dK/dV kernel is never split (dkdv_split is ignored); atomic_dq works.

    Bad input raises TypeError/ValueError naming the argument (check_varlen_inputs; the
    offsets are checked on the host, one device sync per call). Not under torch.compile.

    Returns o (total_q, heads_q, head_dim) in q's dtype, or (o, lse) with
    ``return_lse=True``: lse is (heads_q, total_q) float32 (FlashAttention's varlen
    layout), the natural-log log-sum-exp of each query row's scaled scores, -inf for a
    row without keys; not differentiable.
    """
    if torch.compiler.is_compiling():
        raise NotImplementedError("attention_varlen: not supported under torch.compile yet (it checks the "
                                  "cu_seqlens offsets on the host); call it outside the compiled region")
    if fp32_precision is None:
        fp32_precision = torch_fp32_precision(q.dtype) if isinstance(q, torch.Tensor) else "tf32"
    scale, varlen = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        causal=causal, sm_scale=sm_scale, fp32_precision=fp32_precision)
    cap = check_softcap(softcap)
    window = check_window(window_size)
    dropout = check_dropout(dropout_p, dropout_seed, q.device)
    fwd, bwd = resolve_configs(q.unsqueeze(0).transpose(1, 2), fwd_config, bwd_config, causal, varlen=True,
                               dropout=dropout is not None)
    o, lse2 = _run(q, k, v, fwd, bwd, causal, scale, fp32_precision, "bottom_right", cap, window, varlen, dropout)
    if return_lse:
        return o, lse2 * LN2
    return o
