"""Forward-mode JVP of attention: the output and its tangent in one flash-style pass.

Given q, k, v and tangents tq, tk, tv (each of its primal's shape; None: zero), with
s = scale * q k^T, p = softmax(s) and o = p v, the tangent of o is

    ts  = scale * (tq k^T + q tk^T)
    t_o = sum_j p_j (ts_j - mu) v_j + sum_j p_j tv_j,    mu = sum_j p_j ts_j

(the tangent of the softmax is p (ts - mu)). One program holds a BLOCK_M block of queries
and walks the keys in blocks of BLOCK_N with the forward's online softmax (base 2, running
max m): alongside the forward's acc = sum_j e_j v_j and l = sum_j e_j, e_j = exp(s_j - m),
it keeps acc_t = sum_j e_j (ts_j v_j + tv_j) and c = sum_j e_j ts_j, all rescaled by the
same factor when the running max moves. At the end o = acc / l and
t_o = acc_t / l - (c / l) o. Never an N x N matrix; fp32 accumulators (e_j ts_j is rounded
to the input dtype for its dot with V, as e_j is: with fp16 inputs |ts| must stay within
fp16's range); the log-sum-exp
comes out as the forward's (base 2, fp32, (B, Hq, Nq)), so a caller can keep (o, lse2) as
the primal for the backward.

Supported: causal masks aligned top-left or bottom-right (common.causal_offset, the
forward's mask arithmetic; queries that see no key get o = 0, t_o = 0, lse2 = -inf),
Nq != Nk, grouped-query heads (tk and tv have k's and v's shapes), any strides (tangents
included: their own strides, e.g. stride 0 from an expanded zero), head dims up to 256
padded to a power of two, fp32 / fp16 / bf16 inputs, any finite sm_scale. Not supported
with tangents: softcap, sliding windows, dropout, packed variable-length sequences
(api.py refuses them naming the argument). The kernel runs FwdConfig's BLOCK_M,
BLOCK_N, num_warps and num_stages only: no TMA loads, no split-KV schedule, no Gluon
family (those fields are ignored; a Gluon config takes this kernel's default). Its
default blocks (``default_jvp_config``) are not tuned or measured on a GPU.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from flashtune.kernels import launch
from flashtune.kernels.common import LOG2E, causal_offset, dot_precision, needs_int64, on_device
from flashtune.kernels.triton.common import block_offsets, key_range, load_tile, store_tile
from flashtune.configs.base import ConfigError, padded_head_dim
from flashtune.configs.forward import FwdConfig
from flashtune.device import shared_memory_limit
from flashtune.kernels.launch import planned, tensor_key


@triton.jit
def _jvp_inner(acc, acc_t, c_i, l_i, m_i, q, tq, k_base, tk_base, v_base, tv_base,
               stride_kn, stride_tkn, stride_vn, stride_tvn, diag, offs_nb, offs_d, lo, hi, N_K,
               qk_scale, sm_scale,
               MASK: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
               HAS_TQ: tl.constexpr, HAS_TK: tl.constexpr, HAS_TV: tl.constexpr):
    # diag: each row's last visible key (causal); the scores' tangent ts is in natural units
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_nb
        k = load_tile(k_base + offs_n[:, None] * stride_kn, offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # base-2 units
        if HAS_TQ or HAS_TK:
            if HAS_TQ:
                ts = tl.dot(tq, tl.trans(k), input_precision=PRECISION)
                if HAS_TK:
                    tk = load_tile(tk_base + offs_n[:, None] * stride_tkn, offs_n, N_K, offs_d, MASK, HEAD_DIM,
                                   BLOCK_D)
                    ts = tl.dot(q, tl.trans(tk), ts, input_precision=PRECISION)
            else:
                tk = load_tile(tk_base + offs_n[:, None] * stride_tkn, offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
                ts = tl.dot(q, tl.trans(tk), input_precision=PRECISION)
            ts = ts * sm_scale
        if MASK:
            valid = offs_n[None, :] < N_K
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= diag[:, None])
            s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
        if MASK and CAUSAL:
            # a row that sees no key so far (bottom-right with Nq > Nk) keeps m = -inf:
            # subtract 0 instead, so e = 0, not NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.math.exp2(s - m_use[:, None])  # 0 where masked; ts there is finite (zero-filled loads)
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(e, 1)
        v = load_tile(v_base + offs_n[:, None] * stride_vn, offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
        acc = tl.dot(e.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        acc_t = acc_t * alpha[:, None]
        if HAS_TQ or HAS_TK:
            ets = e * ts
            c_i = c_i * alpha + tl.sum(ets, 1)
            acc_t = tl.dot(ets.to(v.dtype), v, acc_t, input_precision=PRECISION)
        if HAS_TV:
            tv = load_tile(tv_base + offs_n[:, None] * stride_tvn, offs_n, N_K, offs_d, MASK, HEAD_DIM, BLOCK_D)
            acc_t = tl.dot(e.to(tv.dtype), tv, acc_t, input_precision=PRECISION)
        m_i = m_new
    return acc, acc_t, c_i, l_i, m_i


@triton.jit
def _attn_jvp_kernel(Q, K, V, TQ, TK, TV, O, TO, LSE, qk_scale, sm_scale,
                     stride_qb, stride_qh, stride_qn, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_tqb, stride_tqh, stride_tqn, stride_tqd,
                     stride_tkb, stride_tkh, stride_tkn, stride_tkd,
                     stride_tvb, stride_tvh, stride_tvn, stride_tvd,
                     stride_ob, stride_oh, stride_on, stride_od,
                     stride_tob, stride_toh, stride_ton, stride_tod,
                     H, GROUP, N_Q, N_K, causal_off,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
                     HAS_TQ: tl.constexpr, HAS_TK: tl.constexpr, HAS_TV: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks have the most keys: start them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    off_h = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    off_hk = off_h // GROUP
    start_m = pid_m * BLOCK_M

    offs_m = block_offsets(start_m, BLOCK_M, INT64)
    offs_nb = block_offsets(0, BLOCK_N, INT64)
    offs_d = block_offsets(0, BLOCK_D, INT64)

    q_base = Q + off_b * stride_qb + off_h * stride_qh + offs_d[None, :] * stride_qd
    k_base = K + off_b * stride_kb + off_hk * stride_kh + offs_d[None, :] * stride_kd
    v_base = V + off_b * stride_vb + off_hk * stride_vh + offs_d[None, :] * stride_vd
    tk_base = TK + off_b * stride_tkb + off_hk * stride_tkh + offs_d[None, :] * stride_tkd
    tv_base = TV + off_b * stride_tvb + off_hk * stride_tvh + offs_d[None, :] * stride_tvd
    q = load_tile(q_base + offs_m[:, None] * stride_qn, offs_m, N_Q, offs_d, True, HEAD_DIM, BLOCK_D)
    if HAS_TQ:
        tq_ptrs = TQ + off_b * stride_tqb + off_h * stride_tqh + offs_m[:, None] * stride_tqn \
            + offs_d[None, :] * stride_tqd
        tq = load_tile(tq_ptrs, offs_m, N_Q, offs_d, True, HEAD_DIM, BLOCK_D)
    else:
        tq = q  # unused

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    c_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # keys [0, full_hi) need no mask, [full_hi, hi) the causal and/or sequence-end mask
    full_hi, hi = key_range(start_m, N_K, CAUSAL, BLOCK_M, BLOCK_N, causal_off)
    diag = offs_m + causal_off
    acc, acc_t, c_i, l_i, m_i = _jvp_inner(acc, acc_t, c_i, l_i, m_i, q, tq, k_base, tk_base, v_base, tv_base,
                                           stride_kn, stride_tkn, stride_vn, stride_tvn, diag, offs_nb, offs_d,
                                           0, full_hi, N_K, qk_scale, sm_scale,
                                           False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION,
                                           HAS_TQ, HAS_TK, HAS_TV)
    acc, acc_t, c_i, l_i, m_i = _jvp_inner(acc, acc_t, c_i, l_i, m_i, q, tq, k_base, tk_base, v_base, tv_base,
                                           stride_kn, stride_tkn, stride_vn, stride_tvn, diag, offs_nb, offs_d,
                                           full_hi, hi, N_K, qk_scale, sm_scale,
                                           True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION,
                                           HAS_TQ, HAS_TK, HAS_TV)

    if CAUSAL:  # rows that saw no key (bottom-right, Nq > Nk): o = t_o = 0, lse2 = -inf
        inv_l = 1.0 / tl.where(l_i == 0.0, 1.0, l_i)
    else:
        inv_l = 1.0 / l_i
    o = acc * inv_l[:, None]
    t_o = acc_t * inv_l[:, None]
    if HAS_TQ or HAS_TK:
        t_o = t_o - (c_i * inv_l)[:, None] * o  # minus mu * o
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    store_tile(o_ptrs, o.to(O.dtype.element_ty), offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D)
    to_ptrs = TO + off_b * stride_tob + off_h * stride_toh + offs_m[:, None] * stride_ton \
        + offs_d[None, :] * stride_tod
    store_tile(to_ptrs, t_o.to(TO.dtype.element_ty), offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D)
    tl.store(LSE + (off_b * H + off_h) * N_Q + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < N_Q)


# --- configs -------------------------------------------------------------------------

def jvp_shared_memory(config: FwdConfig, head_dim: int, dtype: torch.dtype) -> int:
    """An estimate of the JVP kernel's shared memory (not measured on a GPU): the Q and TQ
    tiles plus num_stages buffers of the K, TK, V and TV tiles, FwdConfig.shared_memory's
    rule with twice the tiles."""
    d, e = padded_head_dim(head_dim), torch.empty((), dtype=dtype).element_size()
    return e * d * (2 * config.BLOCK_M + 4 * config.num_stages * config.BLOCK_N)


def validate_jvp_config(config, head_dim: int, dtype: torch.dtype, device=None) -> FwdConfig:
    """``config`` as the JVP kernel runs it (a FwdConfig; its tma, num_splits and pack_gqa
    ignored), or ConfigError naming the field (TypeError for another type); a Gluon config
    (``family=1``) is not run by this kernel: its default (``default_jvp_config``) instead."""
    if not isinstance(config, FwdConfig):
        raise TypeError(f"fwd_config: expected a FwdConfig or None, got {type(config).__name__}")
    config.check_fields()
    if config.family:
        return default_jvp_config(head_dim, dtype, device)
    needed = jvp_shared_memory(config, head_dim, dtype)
    limit = shared_memory_limit(device)
    if needed > limit:
        raise ConfigError(f"fwd_config: the JVP kernel needs about {needed} bytes of shared memory with "
                          f"{config.label()}, the device allows {limit}; use smaller blocks or fewer stages")
    return config


# the default's candidates by padded head dim, the first that fits the device's shared memory
# (jvp_shared_memory) taken: the forward's accumulator doubled and two more tiles loaded per
# key block, so smaller blocks than the forward's defaults (not tuned, not measured on a GPU)
_DEFAULT_CANDIDATES = {
    64: ((64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 1)),
    128: ((64, 32, 4, 2), (32, 32, 4, 2), (32, 32, 4, 1)),
    256: ((32, 32, 4, 1), (16, 32, 4, 1), (16, 16, 4, 1)),
}


@functools.lru_cache(maxsize=256)
def default_jvp_config(head_dim: int, dtype: torch.dtype, device=None) -> FwdConfig:
    """The JVP kernel's default config for a head dim, dtype and device (None: the CPU's
    interpreter limits): the first of ``_DEFAULT_CANDIDATES`` whose shared memory fits,
    else the smallest."""
    d = padded_head_dim(head_dim)
    candidates = next(c for bound, c in sorted(_DEFAULT_CANDIDATES.items()) if d <= bound)
    limit = shared_memory_limit(device if device is not None else "cpu")
    configs = [FwdConfig(m, n, num_warps=w, num_stages=s) for m, n, w, s in candidates]
    return next((c for c in configs if jvp_shared_memory(c, head_dim, dtype) <= limit), configs[-1])


# --- the launcher ----------------------------------------------------------------------

def attention_jvp_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tq: torch.Tensor | None,
                          tk: torch.Tensor | None, tv: torch.Tensor | None, config: FwdConfig, *, causal: bool,
                          sm_scale: float, fp32_precision: str = "tf32", causal_align: str = "top_left"
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the JVP kernel with a validated config (``validate_jvp_config``) on checked
    inputs (function.check_inputs; the tangents by function.check_tangents): tangents of
    q, k, v with their primal's shape and dtype, any strides, None for a zero tangent.

    Returns ``(o, t_o, lse2)``: o and t_o in q's layout and dtype, lse2 (B, Hq, Nq) float32,
    the base-2 log-sum-exp of the scaled scores (attention_forward's)."""
    has = (tq is not None, tk is not None, tv is not None)  # the kernel's HAS_* constexprs
    tangents = tuple(t for t in (tq, tk, tv) if t is not None)
    key = (config, causal, sm_scale, fp32_precision, causal_align, has, tensor_key(q), tensor_key(k), tensor_key(v),
           *(tensor_key(t) for t in tangents))
    return planned(_JVP_PLANS, key, (q, k, v, *tangents),
                   lambda: _jvp(q, k, v, tq, tk, tv, config, causal, sm_scale, fp32_precision, causal_align))


_JVP_PLANS: dict = {}


def _jvp(q, k, v, tq, tk, tv, config: FwdConfig, causal, sm_scale, fp32_precision, causal_align):
    """attention_jvp_forward's launch."""
    B, H, N_Q, D = q.shape
    N_K = k.shape[2]
    off = causal_offset(causal_align, N_Q, N_K) if causal else 0
    o = launch.empty_like(q)
    t_o = launch.empty_like(q)
    lse2 = launch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    # a missing tangent: its primal stands in for the pointer (never read: its HAS_* is off)
    TQ, TK, TV = (t if t is not None else p for t, p in ((tq, q), (tk, k), (tv, v)))
    grid = (-(-N_Q // config.BLOCK_M), H, B)
    with on_device(q):
        launch.launch(
            _attn_jvp_kernel, q, k, v, TQ, TK, TV, o, t_o, lse2, sm_scale * LOG2E, sm_scale,
            *q.stride(), *k.stride(), *v.stride(), *TQ.stride(), *TK.stride(), *TV.stride(), *o.stride(),
            *t_o.stride(),
            H, H // k.shape[1], N_Q, N_K, off,
            CAUSAL=bool(causal), HEAD_DIM=D, BLOCK_D=padded_head_dim(D), BLOCK_M=config.BLOCK_M,
            BLOCK_N=config.BLOCK_N, PRECISION=dot_precision(q.dtype, fp32_precision),
            INT64=needs_int64(q, k, v, TQ, TK, TV, o, t_o),
            HAS_TQ=tq is not None, HAS_TK=tk is not None, HAS_TV=tv is not None,
            num_warps=config.num_warps, num_stages=config.num_stages, grid=grid,
        )
    return o, t_o, lse2


# --- as an operator ----------------------------------------------------------------------
# FlashAttentionJvpFunction.jvp calls the kernel through this operator: under torch.func
# the jvp staticmethod sees functorch's wrapped tensors (no storage), and an operator call is
# how torch unwraps them to the tensors the kernel reads and wraps the outputs back.

@torch.library.custom_op("flashtune::attention_jvp", mutates_args=())
def attention_jvp_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tq: torch.Tensor | None,
                     tk: torch.Tensor | None, tv: torch.Tensor | None, causal: bool, sm_scale: float,
                     fp32_precision: str, causal_align: str, block_m: int, block_n: int, num_warps: int,
                     num_stages: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``attention_jvp_forward`` with the config as its four fields: (o, t_o, lse2)."""
    config = FwdConfig(block_m, block_n, num_warps=num_warps, num_stages=num_stages)
    return attention_jvp_forward(q, k, v, tq, tk, tv, config, causal=causal, sm_scale=sm_scale,
                                 fp32_precision=fp32_precision, causal_align=causal_align)


@attention_jvp_op.register_fake
def _attention_jvp_fake(q, k, v, tq, tk, tv, causal, sm_scale, fp32_precision, causal_align, block_m, block_n,
                        num_warps, num_stages):
    return torch.empty_like(q), torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
