"""Inputs and stored configs shared by the dispatcher tests."""

from __future__ import annotations

import torch

from flashtune.kernels import BwdConfig, FwdConfig

# Tuned configs whose blocks differ from each other and from the interpreter's fp32
# defaults (fwd 32x32, bwd 16/32/32/16), so results at seq lens above 16 tell them apart.
FWD_A = FwdConfig(16, 16, 2, 1)
FWD_B = FwdConfig(32, 64, 1, 1)
BWD_A = BwdConfig(16, 16, 16, 16, 2, 1)
BWD_B = BwdConfig(32, 64, 64, 32, 1, 1)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def qkv(n_q: int, n_k: int | None = None, *, batch: int = 1, heads: int = 2, kv_heads: int | None = None,
        head_dim: int = 16, dtype: torch.dtype = torch.float32, grad: bool = False):
    """Random (query, key, value) in SDPA's layout (batch, heads, seq_len, head_dim)."""
    n_k = n_q if n_k is None else n_k
    kv_heads = heads if kv_heads is None else kv_heads
    shapes = ((batch, heads, n_q, head_dim), (batch, kv_heads, n_k, head_dim), (batch, kv_heads, n_k, head_dim))
    return tuple(torch.randn(s, device=device(), dtype=dtype).requires_grad_(grad) for s in shapes)
