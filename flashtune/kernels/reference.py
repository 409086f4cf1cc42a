"""A plain attention, computed in float32 (or float64), as the reference for checks."""

from __future__ import annotations

import math

import torch


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                        sm_scale: float | None = None, dtype: torch.dtype = torch.float32):
    """Return (o, lse) computed as written in the paper, in ``dtype``.

    Follows torch SDPA's conventions: grouped-query heads (query head h uses key head
    h // (Hq // Hkv)), causal mask aligned top-left (query i sees keys j <= i).
    lse is the natural-log log-sum-exp of the scaled scores, (B, Hq, Nq).
    """
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        n_q, n_k = q.shape[2], k.shape[2]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    return torch.matmul(p, v), lse
