"""The one place that decides how a call runs: which config (the given one, validated, or the
heuristic default of the call's band), which kernel family (the Gluon kernels on sm_90 where they
run the call, else the Triton kernels) and which Triton kernel (the split-KV kernel for calls whose
query blocks do not fill the GPU). Each public launcher records its launches once per call
signature and replays them (kernels/launch.py)."""

from __future__ import annotations

import functools

import torch

from flashtune.configs.backward import BwdConfig
from flashtune.configs.base import DECODE_MAX_Q, FP8_DTYPES, ConfigError
from flashtune.configs.forward import FwdConfig
from flashtune.device import resolve_device, schedule_sm_count
from flashtune.heuristics.bands import decode_fills, is_long, is_mid, long_bounds, mid_bounds
from flashtune.heuristics.defaults import default_config, triton_default
from flashtune.kernels.common import Dropout, Varlen, call_geometry, dot_precision, window_blocks
from flashtune.kernels.gluon.backward_launch import gluon_attention_backward
from flashtune.kernels.gluon.forward_launch import gluon_attention_forward
from flashtune.kernels.launch import planned, tensor_key
from flashtune.kernels.triton.backward import triton_backward
from flashtune.kernels.triton.decode import plan_schedule, split_forward
from flashtune.kernels.triton.forward import triton_forward


def as_triton(config, head_dim: int, dtype: torch.dtype, device=None, causal: bool | None = None):
    """The config that runs a call the Gluon kernels cannot (a softcap, a window in the backward,
    packed sequences, dropout, an fp8 V with its head dim contiguous): the Triton kernels'
    heuristic default for the head dim, dtype, device and masking (never a Gluon entry); a
    Triton config itself."""
    if not config.family:
        return config
    return triton_default(config.PASS, head_dim, dtype, resolve_device(device), causal)


def validate(config, head_dim: int, dtype: torch.dtype, device=None, dropout: bool = False):
    """``config.validate``; a Gluon config of a call with dropout also needs the Triton fallbacks
    that run it instead (``as_triton``, both maskings) to fit their DROPOUT kernels."""
    config.validate(head_dim, dtype, device, dropout=dropout)
    if dropout and config.family:
        for causal in (False, True):
            as_triton(config, head_dim, dtype, device, causal).validate(head_dim, dtype, device, dropout=True)
    return config




@functools.lru_cache(maxsize=1024)
def _validated(config, head_dim: int, dtype: torch.dtype, device: torch.device, dropout: bool = False):
    return validate(config, head_dim, dtype, device, dropout)


@functools.lru_cache(maxsize=1024)
def dropout_fwd_config(config: FwdConfig, head_dim: int, dtype: torch.dtype, device: torch.device,
                       causal: bool) -> FwdConfig:
    """A forward config (tuned for the call without dropout) whose DROPOUT kernel fits the
    device: ``config`` itself, or the heuristic default where the mask's extra shared memory
    (FwdConfig.shared_memory) would not fit."""
    try:
        return validate(config, head_dim, dtype, device, dropout=True)
    except ConfigError:
        return _default("fwd", head_dim, dtype, device, causal)


@functools.lru_cache(maxsize=1024)
def _default(pass_: str, head_dim: int, dtype: torch.dtype, device: torch.device, causal: bool,
             bucket: str | None = None):
    """The heuristic config of a bucket: "decode", "decode-full" (a decode call that fills
    the SMs, bands.decode_fills), "long", "mid" (the forward's middle band, bands.is_mid) or
    None (none of them)."""
    lengths = {"decode": (1, None), "decode-full": (1, None), None: (None, None)}
    seq_q, seq_k = (long_bounds(pass_, dtype, head_dim, causal) if bucket == "long"
                    else mid_bounds(dtype, head_dim) if bucket == "mid" else lengths[bucket])
    fills = schedule_sm_count(device) if bucket == "decode-full" else None  # batch x K/V heads that fill the SMs
    return default_config(pass_, head_dim, dtype, device, causal=causal, seq_q=seq_q, seq_k=seq_k,
                          batch_heads_kv=fills)


def resolve_configs(q: torch.Tensor, fwd_config, bwd_config, causal: bool = False, *, varlen: bool = False,
                    dropout: bool = False, seq_k: int | None = None,
                    heads_kv: int | None = None) -> tuple[FwdConfig, BwdConfig]:
    """The configs to launch with: the given ones, validated (the forward's for its DROPOUT
    kernel with ``dropout``), or the heuristic defaults (the forward's decode entry for at
    most DECODE_MAX_Q queries, its "decode full" entry first where the batch x ``heads_kv``
    K/V heads fill the SMs (None: unknown, never), its long entry for ``bands.is_long``
    calls of ``seq_k`` keys (None: as many as queries), its middle band's for ``bands.is_mid``
    ones (a causal one's by q's batch x heads); none of them for a packed ``varlen`` q or
    with dropout, which run the plain Triton forward kernel); the backward's long entry from
    LONG_MIN_Q_BWD queries (LONG_MIN_Q_BWD_BY_HEAD_DIM where its head dim and masking have a bound of their own;
    no decode entry: its decode-sized calls are few)."""
    D, dtype, device = q.shape[-1], q.dtype, q.device
    n_q = q.shape[2]
    buckets = {"fwd": None, "bwd": None}
    if not varlen and not dropout:
        if n_q <= DECODE_MAX_Q:
            # asked only where the default is read (a given config, as the tuned drop-in's, skips it)
            fills = fwd_config is None and heads_kv is not None and decode_fills(q.shape[0] * heads_kv, device)
            buckets["fwd"] = "decode-full" if fills else "decode"
        elif is_long("fwd", n_q, seq_k, dtype, head_dim=D, causal=bool(causal)):
            buckets["fwd"] = "long"
        elif fwd_config is None and is_mid("fwd", n_q, seq_k, dtype, head_dim=D, causal=bool(causal),
                                           batch_heads=q.shape[0] * q.shape[1], device=device):
            buckets["fwd"] = "mid"  # asked only where the default is read (a causal call's asks the SMs)
        buckets["bwd"] = "long" if is_long("bwd", n_q, dtype=dtype, head_dim=D, causal=bool(causal)) else None
    resolved = []
    for name, cfg, cls, pass_ in (("fwd_config", fwd_config, FwdConfig, "fwd"),
                                  ("bwd_config", bwd_config, BwdConfig, "bwd")):
        if cfg is None:
            resolved.append(_default(pass_, D, dtype, device, bool(causal), buckets[pass_]))
        elif not isinstance(cfg, cls):
            raise TypeError(f"{name}: expected a {cls.__name__} or None, got {type(cfg).__name__}")
        else:
            drop = bool(dropout)
            try:
                resolved.append(_validated(cfg, D, dtype, device, drop))
            except TypeError:  # an unhashable field: validate() names it
                resolved.append(validate(cfg, D, dtype, device, drop))
    return resolved[0], resolved[1]


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: FwdConfig, *,
                      causal: bool, sm_scale: float, fp32_precision: str = "tf32",
                      compile_only: bool = False, causal_align: str = "top_left",
                      softcap: float = 0.0, window_size: tuple[int, int] | None = None,
                      varlen: Varlen | None = None, v_descale: float = 1.0,
                      out_dtype: torch.dtype | None = None, dropout: Dropout | None = None,
                      plan_key: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel with an explicit config on already-checked inputs.

    ``softcap`` > 0 caps the scaled scores at ``softcap * tanh(scores / softcap)`` (Gemma-2);
    0 leaves them as they are. ``window_size`` (left, right), FlashAttention's sliding window
    (-1: unbounded; None: none), in causal_align's frame (common.window_bounds): the key
    blocks outside it are skipped.

    ``causal_align``: "top_left" (SDPA's is_causal) or "bottom_right" (common.causal_offset).
    The split kernel of triton/decode.py runs instead when the config's schedule asks
    for it on this shape (triton.decode.plan_schedule).

    ``varlen`` (common.Varlen): q is a packed (total_q, Hq, D) batch of sequences, k and v
    (total_k, Hkv, D); causal and the window align bottom-right in each sequence
    (``causal_align`` is ignored); always the plain kernel through pointer loads (the
    config's num_splits, pack_gqa and tma are ignored).

    fp8 inputs (float8_e4m3fn or float8_e5m2, checked by fp8.check_fp8_inputs): ``sm_scale``
    already carries q_descale * k_descale, ``v_descale`` multiplies the output, which comes in
    ``out_dtype`` (fp16 or bf16); always the plain kernel (the config's num_splits and pack_gqa
    are ignored), never varlen. P @ V reads V fastest with the keys contiguous on Hopper
    (fp8.attention_fp8's ``relayout_v``); any strides work.

    ``dropout`` (common.Dropout; None: none) drops elements of P by its seeded mask, which
    the backward regenerates; always the plain kernel (the split kernel of a decode step has
    no dropout: one is not trained).

    ``compile_only`` compiles (or, inside triton's AsyncCompileMode, queues the compile
    of) the kernel without launching it; the outputs are then left uninitialised.

    ``plan_key``: forward_key() of this call, where the caller has it already.

    Returns ``(o, lse2)``: o in q's layout and dtype (``out_dtype`` if given), lse2 (B, Hq,
    Nq) float32 holding the log-sum-exp of the scaled scores in base 2 (multiply by ln 2 for
    natural log); with ``varlen``, (Hq, total_q).
    """
    if compile_only or varlen is not None or dropout is not None:
        return _forward(q, k, v, config, causal, sm_scale, fp32_precision, compile_only, causal_align, softcap,
                        window_size, varlen, v_descale, out_dtype, dropout)
    # one launch plan per call signature (kernels/launch.py): what follows runs once per signature
    if plan_key is None:
        plan_key = forward_key(q, k, v, config, causal, sm_scale, fp32_precision, causal_align, softcap, window_size,
                               v_descale, out_dtype)
    return planned(_FWD_PLANS, plan_key, (q, k, v),
                   lambda: _forward(q, k, v, config, causal, sm_scale, fp32_precision, False, causal_align, softcap,
                                    window_size, None, v_descale, out_dtype, None))


_FWD_PLANS: dict = {}


def forward_key(q, k, v, config: FwdConfig, causal, sm_scale, fp32_precision="tf32", causal_align="top_left",
                softcap=0.0, window_size=None, v_descale=1.0, out_dtype=None) -> tuple:
    """The launch-plan signature of an attention_forward call (without varlen or dropout):
    everything its launches depend on but the data. It also fixes the layouts of the
    outputs (o, lse2), so a backward of the same call keys its plan on it
    (backward.attention_backward's ``plan_key``)."""
    return (config, causal, sm_scale, fp32_precision, causal_align, softcap, window_size, v_descale, out_dtype,
            tensor_key(q), tensor_key(k), tensor_key(v))


def _forward(q, k, v, config: FwdConfig, causal, sm_scale, fp32_precision, compile_only, causal_align, softcap,
             window_size, varlen, v_descale, out_dtype, dropout) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_forward's launches: the Gluon kernel, the split kernel or the plain one."""
    if config.family:
        # fp8: V with its keys contiguous (attention_fp8's default re-layout), the operand the
        # Gluon kernel's fp8 P V wgmma reads
        fp8_v = q.dtype not in FP8_DTYPES or v.stride(2) == 1 or v.shape[2] == 1
        # o takes q's layout; the Gluon kernel writes it with its head dim contiguous, so a q whose head
        # dim is strided (a (B, H, D, N) tensor viewed as (B, H, N, D)) runs the Triton kernel
        o_layout = q.stride(-1) == 1 or q.shape[-1] == 1
        if not softcap and varlen is None and dropout is None and fp8_v and o_layout:
            return _gluon_forward(q, k, v, config, causal=causal, sm_scale=sm_scale, compile_only=compile_only,
                                  causal_align=causal_align, window_size=window_size, v_descale=v_descale,
                                  out_dtype=out_dtype)
        config = as_triton(config, q.shape[-1], q.dtype, q.device, bool(causal))
    # the split kernel has no dropout (a decode step does not train) nor fp8: those run the plain kernel
    if varlen is None and dropout is None and q.dtype not in FP8_DTYPES:
        B, H, _, N_Q, N_K, _D, window, off = call_geometry(q, k, varlen, causal, causal_align, window_size)
        key_blocks = None
        if window:  # the split kernel chunks only the key blocks some query reaches
            lo, _, _, hi = window_blocks(0, N_Q - 1, N_K, config.BLOCK_N, off, *window)
            key_blocks = (lo, hi)
        schedule = plan_schedule(config, B, H, k.shape[1], N_Q, N_K, q.device, key_blocks)
        if schedule is not None:
            return split_forward(q, k, v, config, schedule, causal=causal, causal_off=off, sm_scale=sm_scale,
                                 precision=dot_precision(q.dtype, fp32_precision), compile_only=compile_only,
                                 softcap=softcap, window=window)
    return triton_forward(q, k, v, config, causal, sm_scale, fp32_precision, compile_only, causal_align, softcap,
                          window_size, varlen, v_descale, out_dtype, dropout)


def _gluon_forward(q, k, v, config: FwdConfig, *, causal: bool, sm_scale: float, compile_only: bool,
                   causal_align: str, window_size=None, v_descale: float = 1.0,
                   out_dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A Gluon config's launch (kernels/gluon/). ``compile_only`` leaves the compile to the first launch: Gluon's
    launcher has no warmup entry (the outputs are uninitialised either way)."""
    if compile_only:
        return (torch.empty_like(q, dtype=out_dtype or q.dtype),
                torch.empty(q.shape[:3], device=q.device, dtype=torch.float32))
    return gluon_attention_forward(q, k, v, config.gluon(), causal=causal, sm_scale=sm_scale,
                                   causal_align=causal_align, window_size=window_size, v_descale=v_descale,
                                   out_dtype=out_dtype)


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse2: torch.Tensor, config: BwdConfig, *, causal: bool, sm_scale: float,
                       fp32_precision: str = "tf32", compile_only: bool = False, causal_align: str = "top_left",
                       softcap: float = 0.0, window_size: tuple[int, int] | None = None,
                       varlen: Varlen | None = None, dropout: Dropout | None = None,
                       plan_key: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward kernels with an explicit config on already-checked inputs
    (``softcap``, ``window_size``, ``varlen`` and ``dropout`` as the forward had them: the
    dropout mask is regenerated from its seed, common.Dropout).

    ``varlen`` (common.Varlen): packed (total, heads, D) tensors as attention_forward
    takes them, lse2 (Hq, total_q); pointer loads only (the config's tma is ignored) and
    one program per key block (dkdv_split is ignored); atomic dQ works as without it.

    ``compile_only``: compile (or queue in triton's AsyncCompileMode) without launching.

    ``lse2`` is the forward's base-2 log-sum-exp. Returns (dq, dk, dv) in the layouts
    and dtypes of q, k and v.

    With ``config.atomic_dq`` the dK/dV kernel also accumulates dQ (fp32 atomic adds into
    a zeroed buffer, cast at the end; with ``config.tma`` on sm_90+ one TMA bulk reduce-add
    per tile) and the dQ kernel does not run, unless torch's deterministic algorithms are on.

    ``plan_key``: forward_key() of the forward that made ``o`` and ``lse2`` from these
    q, k, v with these arguments (autograd's backward has it): it fixes every tensor's layout
    but dO's, so the launch plan's signature need not read them again.
    """
    if compile_only or varlen is not None or dropout is not None:
        return _backward(do, q, k, v, o, lse2, config, causal, sm_scale, fp32_precision, compile_only, causal_align,
                         softcap, window_size, varlen, dropout)
    # one launch plan per call signature (kernels/launch.py): what follows runs once per signature
    deterministic = torch.are_deterministic_algorithms_enabled()
    if plan_key is not None:
        key = ("after forward", plan_key, config, deterministic, tensor_key(do))
    else:
        key = (config, causal, sm_scale, fp32_precision, causal_align, softcap, window_size, deterministic,
               tensor_key(do), tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(o), tensor_key(lse2))
    return planned(_BWD_PLANS, key, (do, q, k, v, o, lse2),
                   lambda: _backward(do, q, k, v, o, lse2, config, causal, sm_scale, fp32_precision, False,
                                     causal_align, softcap, window_size, None, None))


_BWD_PLANS: dict = {}


def _backward(do, q, k, v, o, lse2, config: BwdConfig, causal, sm_scale, fp32_precision, compile_only, causal_align,
              softcap, window_size, varlen, dropout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention_backward's launches: the Gluon kernels or the Triton ones."""
    if config.family:
        if not softcap and window_size is None and varlen is None and dropout is None \
                and q.dtype in (torch.float16, torch.bfloat16):
            return _gluon_backward(do, q, k, v, o, lse2, config, causal=causal, sm_scale=sm_scale,
                                   compile_only=compile_only, causal_align=causal_align)
        config = as_triton(config, q.shape[-1], q.dtype, q.device, bool(causal))
    return triton_backward(do, q, k, v, o, lse2, config, causal, sm_scale, fp32_precision, compile_only,
                           causal_align, softcap, window_size, varlen, dropout)


def _gluon_backward(do, q, k, v, o, lse2, config: BwdConfig, *, causal: bool, sm_scale: float, compile_only: bool,
                    causal_align: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Gluon config's backward (kernels/gluon/): the Gluon dK/dV kernel with this config's dQ half (family 2: the Gluon dQ
    kernel, else the Triton one). ``compile_only``
    leaves the compile to the first launch (Gluon's launcher has no warmup entry)."""
    if compile_only:
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    return gluon_attention_backward(do, q, k, v, o, lse2, config.gluon(), causal=causal, sm_scale=sm_scale,
                                    causal_align=causal_align, dq_config=None if config.family >= 3 else config,
                                    gluon_dq=config.family == 2,
                                    dkdv_split=config.dkdv_split)
