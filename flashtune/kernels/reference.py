"""A plain attention, computed in float32 (or float64), as the reference for checks."""

from __future__ import annotations

import math
import warnings

import torch


def attention_mask(n_q: int, n_k: int, *, causal: bool = False, causal_align: str = "top_left",
                   window_size: tuple[int, int] | None = None, device=None) -> torch.Tensor | None:
    """The (n_q, n_k) bool mask of the keys each query sees (None: all), built densely and
    on its own (not from the kernels' helpers): causal keeps j <= diag, a window
    (FlashAttention's (left, right), -1 unbounded) diag - left <= j <= diag + right, where
    query i's diagonal is i, or i + n_k - n_q with ``causal_align="bottom_right"``."""
    window = window_size is not None and tuple(window_size) != (-1, -1)
    if not causal and not window:
        return None
    diagonal = n_k - n_q if causal_align == "bottom_right" else 0
    keep = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if causal:
        keep = keep.tril(diagonal)
    if window:
        left, right = window_size
        # key minus diagonal, per (query, key)
        dist = torch.arange(n_k, device=device)[None, :] - torch.arange(n_q, device=device)[:, None] - diagonal
        if left >= 0:
            keep &= dist >= -left
        if right >= 0:
            keep &= dist <= right
    return keep


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                        sm_scale: float | None = None, dtype: torch.dtype = torch.float32,
                        causal_align: str = "top_left", softcap: float | None = None,
                        window_size: tuple[int, int] | None = None, dropout_mask: torch.Tensor | None = None,
                        dropout_p: float = 0.0):
    """Return (o, lse) computed as written in the paper, in ``dtype``.

    ``dropout_mask`` (bool, broadcastable to (B, Hq, Nq, Nk); None: no dropout) with
    ``dropout_p``: o = (mask * P / (1 - dropout_p)) V, FlashAttention's dropout with a given
    mask; lse stays that of the undropped scores.

    ``window_size``: FlashAttention's sliding window (left, right), -1 unbounded, in the
    ``causal_align`` frame, also with causal (attention_mask).

    ``softcap``: the scaled scores become ``softcap * tanh(scores / softcap)`` before the
    mask and the softmax (Gemma-2's logit softcapping); lse is then over those.

    Follows torch SDPA's conventions: grouped-query heads (query head h uses key head
    h // (Hq // Hkv)), causal mask aligned top-left (query i sees keys j <= i), or with
    ``causal_align="bottom_right"`` query i sees keys j <= i + Nk - Nq (a query that sees
    no key, there or through a window, gets o = 0, lse = -inf and gradients 0).
    lse is the natural-log log-sum-exp of the scaled scores, (B, Hq, Nq).
    """
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = attention_mask(q.shape[2], k.shape[2], causal=causal, causal_align=causal_align,
                          window_size=window_size, device=q.device)
    empty = None
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
        empty = ~keep.any(dim=-1, keepdim=True)
        if empty.any():
            # rows without a key: scores 0 until the end, where p and lse are set, so that no
            # exp(-inf - -inf) = NaN enters the forward or autograd's backward
            s = s.masked_fill(empty, 0.0)
        else:
            empty = None
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    if empty is not None:
        p = p.masked_fill(~keep, 0.0)
        lse = lse.masked_fill(empty[..., 0], float("-inf"))
    if dropout_mask is not None:
        p = p * dropout_mask.to(device=p.device, dtype=p.dtype) / (1.0 - dropout_p)
    return torch.matmul(p, v), lse


def reference_with_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, *,
                         causal: bool = False, sm_scale: float | None = None,
                         dtype: torch.dtype = torch.float32, max_bytes: int = 1 << 31):
    """(o, lse, dq, dk, dv) of ``reference_attention`` in ``dtype``, computed a few
    batch entries and key heads at a time so the score matrices stay under ``max_bytes``.

    Results come back in ``dtype``; inputs are not modified.
    """
    B, Hq, Nq, _ = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    per_head = group * Nq * Nk * torch.empty((), dtype=dtype).element_size() * 4  # s, p and their grads
    step = max(1, int(max_bytes // max(per_head, 1)))
    outs = [torch.empty(q.shape, dtype=dtype, device=q.device), torch.empty((B, Hq, Nq), dtype=dtype, device=q.device),
            torch.empty(q.shape, dtype=dtype, device=q.device), torch.empty(k.shape, dtype=dtype, device=q.device),
            torch.empty(v.shape, dtype=dtype, device=q.device)]
    o, lse, dq, dk, dv = outs
    for b in range(B):
        for h0 in range(0, Hkv, step):
            h1 = min(Hkv, h0 + step)
            qs = q[b:b + 1, h0 * group:h1 * group].to(dtype).requires_grad_()
            ks = k[b:b + 1, h0:h1].to(dtype).requires_grad_()
            vs = v[b:b + 1, h0:h1].to(dtype).requires_grad_()
            with torch.enable_grad(), warnings.catch_warnings():
                # torch's autograd thread sets the CUDA context it finds missing itself;
                # its warning about it would show on every search and bench
                warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there was no current CUDA")
                o_s, lse_s = reference_attention(qs, ks, vs, causal=causal, sm_scale=sm_scale, dtype=dtype)
                g = torch.autograd.grad(o_s, (qs, ks, vs), do[b:b + 1, h0 * group:h1 * group].to(dtype))
            o[b:b + 1, h0 * group:h1 * group] = o_s.detach()
            lse[b:b + 1, h0 * group:h1 * group] = lse_s.detach()
            dq[b:b + 1, h0 * group:h1 * group] = g[0]
            dk[b:b + 1, h0:h1] = g[1]
            dv[b:b + 1, h0:h1] = g[2]
    return o, lse, dq, dk, dv
