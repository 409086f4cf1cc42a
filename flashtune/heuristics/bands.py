"""Which band of the heuristic tables a call reads: decode, the forward's middle band, or long.

A band is a range of query and key lengths where another kernel family wins: on sm_90 the Gluon
kernels take long calls (and the D=64 forward's middle band at two CTAs per SM), the Triton kernels
the rest. The bounds are where the measured winner changes; the entries they select live in
tables/*.toml with the result files that show them.
"""

from __future__ import annotations

import torch

from flashtune.configs.base import FP8_DTYPES, padded_head_dim
from flashtune.device import schedule_sm_count

# Long calls from LONG_MIN_Q queries per head against LONG_MIN_K keys (16-bit forward) and from
# LONG_MIN_Q_BWD queries (backward): the Gluon kernels beat the Triton defaults 1.16-1.35x on the
# grid's 512- and 1024-query D=128 rows (benchmarks/results: h200-gluon-row-limit-mask).
LONG_MIN_Q = 512
LONG_MIN_K = 512
LONG_MIN_Q_BWD = 512
# fp8 from 1024 queries against 2048 keys: its Gluon variant loses at 1024 causal (0.83x flashtune's
# bf16 forward against the Triton fp8 kernel's 1.18x; benchmarks/results: h200-fp8-sweep).
LONG_MIN_Q_FP8 = 1024
LONG_MIN_K_FP8 = 2048
# (padded head dim, causal) -> the forward's long bound of queries where it is not LONG_MIN_Q: at D=64
# the one-CTA Gluon kernel matches two CTAs per SM from 4096 queries (benchmarks/results: h100-gluon-fwd-d64-bands).
LONG_MIN_Q_FWD_BY_HEAD_DIM = {(64, True): 4096, (64, False): 4096}
# padded head dim -> (fewest queries, fewest keys) of the forward's middle band below its long bound: D=64
# at two CTAs per SM, 0.97-1.20x cuDNN from 192 to 2048 queries (benchmarks/results: h100-gluon-fwd-d64-bands).
MID_MIN_FWD_BY_HEAD_DIM = {64: (192, 192)}
# causal calls read the middle band only where their 128-row tiles are at least this many per SM: calls of
# one sequence that fill few SMs run faster on the Triton entry's 64-row blocks (48-192 tiles: 0.77-0.94x
# against 1.05-1.15x cuDNN; 1536 tiles, 11.6 an SM: faster; benchmarks/results: h100-gluon-fwd-d64-bands).
MID_MIN_TILES_PER_SM_CAUSAL = 4
# (padded head dim, causal) -> the backward's long bound where it is not LONG_MIN_Q_BWD: D=64 full from 256
# queries (the fused Gluon backward beats the Triton default from SHAPES.md's ViT row on), causal from 4096
# (benchmarks/results: h100-gluon-bwd-d64).
LONG_MIN_Q_BWD_BY_HEAD_DIM = {(64, False): 256, (64, True): 4096}


def decode_fills(batch_heads_kv: int | None, device) -> bool:
    """Whether a decode call (at most DECODE_MAX_Q queries per head) of ``batch_heads_kv``
    (batch x K/V heads; None: unknown) packed tiles fills the device's SMs, so that the auto
    schedule runs it in one chunk (the split kernel's auto_splits): it then reads the tables'
    (dtype, head dim, "decode", "full") entry first. ``device`` None: the current CUDA device
    where there is one, as default_config reads it, else the CPU."""
    return batch_heads_kv is not None and batch_heads_kv >= _sm_count(device)


def _sm_count(device) -> int:
    """The SMs of ``device`` (None: the current CUDA device where there is one, as default_config
    reads it, else the CPU's stand-in) as the split schedule counts them."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return schedule_sm_count(torch.device(device))


def long_bounds(pass_: str, dtype: torch.dtype | None = None, head_dim: int | None = None,
                causal: bool | None = None) -> tuple[int, int | None]:
    """The fewest queries per head and keys (None: no bound) of a long call of ``pass_`` in
    ``dtype`` (None: a 16-bit one) at ``head_dim`` (None: one with no bound of its own) with
    ``causal`` masking (None: either; the lower bound of the two); the backward's by
    LONG_MIN_Q_BWD_BY_HEAD_DIM, the 16-bit forward's queries by LONG_MIN_Q_FWD_BY_HEAD_DIM, keyed
    by the head dim the tables pad it to and the masking."""
    if pass_ == "fwd" and dtype in FP8_DTYPES:
        return LONG_MIN_Q_FP8, LONG_MIN_K_FP8
    min_q, by_head_dim, min_k = ((LONG_MIN_Q, LONG_MIN_Q_FWD_BY_HEAD_DIM, LONG_MIN_K) if pass_ == "fwd"
                                 else (LONG_MIN_Q_BWD, LONG_MIN_Q_BWD_BY_HEAD_DIM, None))
    if head_dim is None:
        return min_q, min_k
    padded = padded_head_dim(head_dim, dtype)
    masks = (False, True) if causal is None else (bool(causal), )
    return min(by_head_dim.get((padded, m), min_q) for m in masks), min_k


def mid_bounds(dtype: torch.dtype | None = None, head_dim: int | None = None) -> tuple[int, int] | None:
    """The fewest queries per head and keys of a forward call in the middle band of ``dtype`` (None:
    a 16-bit one) at ``head_dim`` (MID_MIN_FWD_BY_HEAD_DIM, keyed by the padded head dim), or None
    where it has none (fp8, head dims without a bound, an unknown head dim)."""
    if head_dim is None or dtype in FP8_DTYPES:
        return None
    return MID_MIN_FWD_BY_HEAD_DIM.get(padded_head_dim(head_dim, dtype))


def is_mid(pass_: str, seq_q: int | None, seq_k: int | None = None, dtype: torch.dtype | None = None,
           head_dim: int | None = None, causal: bool | None = None, batch_heads: int | None = None,
           device=None) -> bool:
    """Whether a forward call of ``seq_q`` queries per head against ``seq_k`` keys (None: seq_q)
    reads the tables' middle-band ("mid") entries: from ``mid_bounds`` up to its long bound
    (``is_long``, which comes first); a causal one only where its ``batch_heads`` (batch x query
    heads; None: unknown, the lengths decide) give at least MID_MIN_TILES_PER_SM_CAUSAL tiles of
    128 query rows per SM of ``device`` (None: the current CUDA device, as default_config reads it)."""
    bounds = mid_bounds(dtype, head_dim)
    if pass_ != "fwd" or bounds is None or seq_q is None:
        return False
    seq_k = seq_q if seq_k is None else seq_k
    if seq_q < bounds[0] or seq_k < bounds[1] or is_long(pass_, seq_q, seq_k, dtype, head_dim, causal):
        return False
    if causal and batch_heads is not None:
        return batch_heads * -(-seq_q // 128) >= MID_MIN_TILES_PER_SM_CAUSAL * _sm_count(device)
    return True


def is_long(pass_: str, seq_q: int | None, seq_k: int | None = None, dtype: torch.dtype | None = None,
            head_dim: int | None = None, causal: bool | None = None) -> bool:
    """Whether a call of ``seq_q`` queries per head against ``seq_k`` keys (None: seq_q)
    in ``dtype`` (None: a 16-bit one) at ``head_dim`` with ``causal`` masking (``long_bounds``)
    reads the tables' long entries."""
    if seq_q is None:
        return False
    min_q, min_k = long_bounds(pass_, dtype, head_dim, causal)
    return seq_q >= min_q and (min_k is None or (seq_q if seq_k is None else seq_k) >= min_k)
