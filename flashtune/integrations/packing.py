"""Padded and packed batches as flashtune.attention_varlen calls (torch only, no transformers).

A ``VarlenPlan`` says which query rows and key rows of a (batch, seq, heads, dim) call form
which packed sequences: ``run()`` gathers them into attention_varlen's layout, runs it and
scatters the output back, with zeros at the query rows it leaves out. Three ways to make one:

- ``plan_from_mask(mask, query_valid, causal, window_left)``: a 4-D boolean mask (or an
  additive float one of zeros and "minus infinity") checked to be *exactly* what the plan
  computes. Its segments come from the mask: in each batch row, kept query rows in order,
  a new sequence where a row's first visible key lies past the previous row's last one
  (or before its first); each sequence's keys are one contiguous range. The plan's own
  mask (varlen's: causal bottom-right in each sequence, the sliding window in that frame)
  is built and compared with the given one; any difference gives None, so a mask that
  varlen cannot represent is never served. ``query_valid`` (batch, seq_q), from the 2-D
  padding mask, names the padding queries: their rows are left out (0 in the output, as
  transformers' FlashAttention-2 path gives), whatever the mask says for them. Rows
  without a visible key get 0 (torch SDPA's math backend gives 0 there too).
- ``plan_from_positions(position_ids)``: one row of documents packed end to end, each
  restarting its positions (transformers' packed-sequence convention: a new document
  wherever a position is not its predecessor + 1); None for a row without a restart.
- ``plan_from_cu_seqlens(...)``: FlashAttention's own kwargs, given by the caller.

Making a plan reads the mask (or positions) on the host: a few device syncs, once per plan;
callers cache the plan per mask tensor (``cached``), so a model's layers share one. Each
attention_varlen call checks its offsets on the host (one sync per call, per layer).
"""

from __future__ import annotations

import dataclasses

import torch

_CACHE_ATTR = "_flashtune_varlen_plans"


@dataclasses.dataclass(frozen=True)
class VarlenPlan:
    """Packed rows of a (batch, seq_q) x (batch, seq_k) call: ``q_rows`` index the flattened
    batch * seq_q query rows, ``k_rows`` the batch * seq_k key rows, in packed order."""

    batch: int
    seq_q: int
    seq_k: int
    q_rows: torch.Tensor | None  # None: every query row, in order (nothing to gather)
    k_rows: torch.Tensor | None
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def sequences(self) -> int:
        return self.cu_seqlens_q.numel() - 1

    def fits(self, query: torch.Tensor, key: torch.Tensor) -> bool:
        """Whether the plan was made for calls of these (batch, heads, seq, dim) shapes."""
        return (query.shape[0], query.shape[2], key.shape[2]) == (self.batch, self.seq_q, self.seq_k)

    def run(self, attention_varlen, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            **options) -> torch.Tensor:
        """The (batch, seq_q, heads_q, dim) output of (batch, heads, seq, dim) inputs."""
        batch, heads_q, seq_q, dim = query.shape
        q = _rows(query, self.q_rows)
        k, v = _rows(key, self.k_rows), _rows(value, self.k_rows)
        out = attention_varlen(q, k, v, self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q,
                               self.max_seqlen_k, **options)
        if self.q_rows is not None:  # the rows left out stay 0
            out = out.new_zeros(batch * seq_q, heads_q, dim).index_copy(0, self.q_rows, out)
        return out.view(batch, seq_q, heads_q, dim)


def _rows(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """(batch, heads, seq, dim) -> the packed (rows, heads, dim)."""
    flat = x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])
    return flat if rows is None else flat.index_select(0, rows)


def _offsets(lengths: list[int], device) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def cached(tensor: torch.Tensor, key: tuple, make):
    """``make()``'s plan, remembered on ``tensor`` under ``key`` until the tensor changes in place."""
    plans = getattr(tensor, _CACHE_ATTR, None)
    if plans is None or plans[0] != tensor._version:
        plans = (tensor._version, {})
        setattr(tensor, _CACHE_ATTR, plans)
    if key not in plans[1]:
        plans[1][key] = make()
    return plans[1][key]


def boolean_mask(mask: torch.Tensor) -> torch.Tensor | None:
    """A (batch, seq_q, seq_k) boolean "may attend" of a 4-D bool mask or an additive float one
    whose entries are 0 or at most half the dtype's lowest (exp of that is 0); None for any other."""
    if mask.dim() != 4 or mask.shape[1] < 1:
        return None
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.is_floating_point():
        allowed = mask == 0
        if not bool((allowed | (mask <= torch.finfo(mask.dtype).min / 2)).all()):
            return None
    else:
        return None
    first = allowed[:, 0]
    if allowed.shape[1] > 1 and not torch.equal(allowed, first.unsqueeze(1).expand_as(allowed)):
        return None  # differs per head: varlen has one mask for all heads
    return first


def plan_from_mask(mask: torch.Tensor, query_valid: torch.Tensor | None, causal: bool,
                   window_left: int | None = None) -> VarlenPlan | None:
    """The plan that computes exactly ``mask`` (see the module docstring), or None."""
    allowed = boolean_mask(mask)
    if allowed is None:
        return None
    batch, seq_q, seq_k = allowed.shape
    device = allowed.device
    kept = allowed.any(-1)
    if query_valid is not None:
        if query_valid.shape != (batch, seq_q):
            return None
        kept = kept & query_valid.to(device=device, dtype=torch.bool)
    q_rows = kept.reshape(-1).nonzero().squeeze(1)
    if q_rows.numel() == 0:
        return None
    rows = allowed.reshape(batch * seq_q, seq_k).index_select(0, q_rows)
    keys = torch.arange(seq_k, device=device)
    first = torch.where(rows, keys, seq_k).amin(-1)
    last = torch.where(rows, keys, -1).amax(-1)
    b = q_rows // seq_q
    starts = torch.ones(q_rows.numel(), dtype=torch.bool, device=device)
    starts[1:] = (b[1:] != b[:-1]) | (first[1:] > last[:-1]) | (first[1:] < first[:-1])
    segment = starts.cumsum(0) - 1
    count = int(segment[-1]) + 1
    k_start = first[starts]
    k_end = torch.zeros(count, dtype=last.dtype, device=device).scatter_reduce(0, segment, last + 1, "amax")
    len_q = torch.bincount(segment, minlength=count)
    len_k = k_end - k_start
    # the plan's own mask, row by row: varlen's rule in each sequence's frame
    q_begin = torch.cumsum(len_q, 0) - len_q
    position = torch.arange(q_rows.numel(), device=device) - q_begin[segment]
    rel = keys.unsqueeze(0) - k_start[segment].unsqueeze(1)
    mine = (rel >= 0) & (rel < len_k[segment].unsqueeze(1))
    if causal:
        diagonal = (position + len_k[segment] - len_q[segment]).unsqueeze(1)
        mine &= rel <= diagonal
        if window_left is not None:
            mine &= rel >= diagonal - window_left
    elif window_left is not None:
        return None  # a two-sided window: not planned
    if not torch.equal(mine, rows):
        return None
    lengths_q, lengths_k = len_q.tolist(), len_k.tolist()
    cu_q, cu_k = _offsets(lengths_q, device), _offsets(lengths_k, device)
    # key rows: each sequence's contiguous range, in order
    seq_of_key = torch.repeat_interleave(torch.arange(count, device=device), len_k)
    k_begin = cu_k[:-1].to(torch.long)
    k_rows = (b[starts] * seq_k + k_start)[seq_of_key] + torch.arange(int(cu_k[-1]), device=device) \
        - k_begin[seq_of_key]
    return VarlenPlan(batch, seq_q, seq_k, q_rows, k_rows, cu_q, cu_k, max(lengths_q), max(lengths_k))


def plan_from_positions(position_ids: torch.Tensor) -> VarlenPlan | None:
    """The plan of documents packed in one row (positions restart where a document begins), or
    None: not one row of integer positions, or no restart."""
    if position_ids.dim() != 2 or position_ids.shape[0] != 1 or position_ids.shape[1] < 2 \
            or position_ids.is_floating_point() or position_ids.dtype == torch.bool:
        return None
    positions = position_ids[0]
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    begins = starts.nonzero().squeeze(1).tolist()
    if len(begins) == 1:
        return None
    n = positions.numel()
    lengths = [end - begin for begin, end in zip(begins, begins[1:] + [n])]
    cu = _offsets(lengths, positions.device)
    return VarlenPlan(1, n, n, None, None, cu, cu, max(lengths), max(lengths))


def plan_from_cu_seqlens(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q, max_seqlen_k,
                         seq_q: int, seq_k: int) -> VarlenPlan:
    """The plan of FlashAttention's varlen kwargs for a batch of one packed row."""
    cu_q, cu_k = (cu.to(torch.int32) for cu in (cu_seqlens_q, cu_seqlens_k))
    return VarlenPlan(1, seq_q, seq_k, None, None, cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k))
