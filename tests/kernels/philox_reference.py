"""Philox4x32-10 in numpy, written from Random123's definition (Salmon et al., SC'11), and
the dropout mask that flashtune's kernels document (kernels.common.Dropout) built from it:
the tests' independent source of the mask, sharing no code with the kernels.

Element (b, h, i, j) of P (h the query head, i the query, j the key) is kept iff the 31 high
bits of lane j % 4 of Philox4x32-10(counter = offset + ((b*Hq + h)*Nq + i) * ceil(Nk / 4) +
j // 4 as (low, high) 32-bit words, 0, 0; key = the seed's (low, high) 32-bit words) are at
least floor(p * 2^31).
"""

from __future__ import annotations

import numpy as np
import torch

_M32 = np.uint64(0xFFFFFFFF)
_MUL = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_WEYL = (np.uint64(0x9E3779B9), np.uint64(0xBB67AE85))


def philox4x32_10(counter, key) -> list[np.ndarray]:
    """The four 32-bit output words (as uint64 arrays) of Philox4x32 with 10 rounds for
    counters ``counter`` (four uint32 arrays or ints) and ``key`` (two ints)."""
    c = [np.asarray(x, dtype=np.uint64) & _M32 for x in counter]
    k0, k1 = (np.uint64(x) & _M32 for x in key)
    for _ in range(10):
        hi_lo0 = _MUL[0] * c[0]  # 32 x 32 -> 64 bits: exact in uint64
        hi_lo1 = _MUL[1] * c[2]
        c = [((hi_lo1 >> np.uint64(32)) ^ c[1] ^ k0) & _M32, hi_lo1 & _M32,
             ((hi_lo0 >> np.uint64(32)) ^ c[3] ^ k1) & _M32, hi_lo0 & _M32]
        k0, k1 = (k0 + _WEYL[0]) & _M32, (k1 + _WEYL[1]) & _M32
    return c


def keep_rows(seed: int, offset: int, rows: np.ndarray, n_k: int, p: float) -> np.ndarray:
    """The kept elements (bool, (len(rows), n_k)) of P's global rows ``rows`` over n_k keys."""
    words = (n_k + 3) // 4
    row = np.asarray(rows, dtype=np.uint64)[:, None]
    j = np.arange(n_k, dtype=np.uint64)[None, :]
    counter = (np.uint64(offset) + row * np.uint64(words) + j // np.uint64(4)) & np.uint64(2**64 - 1)
    out = philox4x32_10((counter & _M32, counter >> np.uint64(32), 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
    lane = np.broadcast_to((j % np.uint64(4)).astype(np.int64), counter.shape)
    word = np.choose(lane, out)
    return (word >> np.uint64(1)).astype(np.int64) >= int(p * 2**31)


def dropout_mask(seed: int, p: float, batch: int, heads_q: int, n_q: int, n_k: int, offset: int = 0) -> torch.Tensor:
    """The (batch, heads_q, n_q, n_k) bool mask of ``attention(..., dropout_p=p, dropout_seed=seed)``."""
    rows = np.arange(batch * heads_q * n_q)
    return torch.from_numpy(keep_rows(seed, offset, rows, n_k, p)).view(batch, heads_q, n_q, n_k)


def varlen_dropout_mask(seed: int, p: float, heads_q: int, total_q: int, max_seqlen_k: int,
                        offset: int = 0) -> torch.Tensor:
    """The (heads_q, total_q, max_seqlen_k) bool mask of ``attention_varlen``: rows numbered
    (query head, packed query row), keys within the sequence."""
    rows = np.arange(heads_q * total_q)
    return torch.from_numpy(keep_rows(seed, offset, rows, max_seqlen_k, p)).view(heads_q, total_q, max_seqlen_k)
