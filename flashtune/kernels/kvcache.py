"""Attention against a K/V cache, for inference: ``attention_kvcache``.

FlashAttention's ``flash_attn_with_kvcache`` without its cache update (no ``k=``/``v=`` to
append, no rotary): decode queries against a cache whose sequences hold different numbers
of keys, the cache either one contiguous (batch, heads_kv, capacity, head_dim) tensor or
pages addressed through a block table (vLLM's paged layout). It runs the split-KV kernel
of kernels/decode.py in its SEQLENS variant (each program reads its sequence's length)
and, for pages, its PAGED variant (tiles gathered through the block table); grouped-query
packing, split-KV chunks and the combine kernel work as for ``attention``'s decode calls.
Layouts, limits and tests: docs/performance.md ("K/V cache").
"""

from __future__ import annotations

import numbers

import torch

from flashtune.kernels.common import LN2, dot_precision, torch_fp32_precision, window_bounds
from flashtune.configs.forward import FwdConfig
from flashtune.kernels.triton.decode import kvcache_schedule, split_forward
from flashtune.kernels.api import check_inputs, check_softcap, check_window
from flashtune.kernels.passes import resolve_configs
from flashtune.kernels.launch import planned, tensor_key

# key positions are int32 in the kernels
MAX_CACHE_KEYS = 2**31 - 1


def _check_int32_tensor(name: str, t, dim: int, what: str, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of int32, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name}: expected dtype int32, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor {what}, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected the device of q ({device}), got {t.device}")


def check_kvcache_inputs(q, k_cache, v_cache, cache_seqlens, block_table=None, *, causal=False, sm_scale=None,
                         fp32_precision="tf32", max_seqlen_k=None) -> tuple[float, int, int]:
    """Raise TypeError/ValueError naming the argument for a call attention_kvcache cannot
    run, from the tensors' types, shapes, dtypes and devices alone (no device sync; the
    values of cache_seqlens and block_table are check_kvcache_values'). Returns (the softmax
    scale, the cache's capacity in keys per sequence, the keys the schedule covers:
    max_seqlen_k if given, else the capacity)."""
    # q's type, shape, dtype, device kind, head dim; causal, fp32_precision, sm_scale
    scale = check_inputs(q, q, q, causal=causal, sm_scale=sm_scale, fp32_precision=fp32_precision)
    B, Hq, _, D = q.shape
    paged = block_table is not None
    layout = "(num_pages, page_size, heads_kv, head_dim)" if paged else "(batch, heads_kv, capacity, head_dim)"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected the dtype of q ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected the device of q ({q.device}), got {t.device}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor {layout}"
                             f"{' (block_table given)' if paged else ''}, got shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name}: expected a non-empty tensor {layout}, got shape {tuple(t.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if k_cache.shape[3] != D:
        raise ValueError(f"k_cache: expected head_dim {D} like q (its last dimension), got {k_cache.shape[3]}")
    h_kv = k_cache.shape[2] if paged else k_cache.shape[1]
    if Hq % h_kv:
        raise ValueError(f"k_cache: the number of query heads ({Hq}) must be a multiple of the number of key/value "
                         f"heads ({h_kv}, k_cache.shape[{2 if paged else 1}])")
    _check_int32_tensor("cache_seqlens", cache_seqlens, 1, "(batch,) of lengths", q.device)
    if cache_seqlens.shape[0] != B:
        raise ValueError(f"cache_seqlens: expected one length per sequence, {B} like q's batch, got "
                         f"{cache_seqlens.shape[0]}")
    if paged:
        _check_int32_tensor("block_table", block_table, 2, "(batch, max_pages_per_seq)", q.device)
        if block_table.shape[0] != B:
            raise ValueError(f"block_table: expected one row per sequence, {B} like q's batch, got "
                             f"{block_table.shape[0]}")
        if block_table.shape[1] == 0:
            raise ValueError("block_table: expected at least one page per sequence, got shape "
                             f"{tuple(block_table.shape)}")
        capacity = block_table.shape[1] * k_cache.shape[1]
        where = f"block_table.shape[1] x page_size = {block_table.shape[1]} x {k_cache.shape[1]}"
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache: expected batch {B} like q (without block_table the cache is {layout}), "
                             f"got {k_cache.shape[0]}")
        capacity = k_cache.shape[2]
        where = "k_cache.shape[2]"
    if capacity > MAX_CACHE_KEYS:
        raise ValueError(f"k_cache: expected room for at most {MAX_CACHE_KEYS} keys per sequence, got {capacity} "
                         f"({where})")
    if max_seqlen_k is None:
        return scale, capacity, capacity
    if isinstance(max_seqlen_k, bool) or not isinstance(max_seqlen_k, numbers.Integral):
        raise TypeError(f"max_seqlen_k: expected an int or None, got {type(max_seqlen_k).__name__}")
    if not 0 <= max_seqlen_k <= capacity:
        raise ValueError(f"max_seqlen_k: expected an int in [0, {capacity}] (the cache's capacity, {where}), "
                         f"got {max_seqlen_k}")
    return scale, capacity, int(max_seqlen_k)


def check_kvcache_values(cache_seqlens: torch.Tensor, block_table: torch.Tensor | None, limit: int, limit_name: str,
                         num_pages: int = 0, page_size: int = 1) -> None:
    """Raise ValueError naming the argument where cache_seqlens holds a length outside
    [0, limit] or block_table a page index outside [0, num_pages) among the pages a sequence
    uses (the first ceil(length / page_size) of its row; the rest are never read and may hold
    anything). A few small device operations and one device sync (``.tolist()``), more
    only to name the offending entry."""
    bad_len = (cache_seqlens < 0) | (cache_seqlens > limit)
    counts = [bad_len.sum()]
    if block_table is not None:
        used = (cache_seqlens.clamp(0, limit).to(torch.int64) + page_size - 1) // page_size
        slots = torch.arange(block_table.shape[1], device=block_table.device)
        bad_page = (slots[None, :] < used[:, None]) & ((block_table < 0) | (block_table >= num_pages))
        counts.append(bad_page.sum())
    n_bad = torch.stack(counts).tolist()
    if n_bad[0]:
        b = int(bad_len.nonzero()[0, 0])
        raise ValueError(f"cache_seqlens: expected lengths in [0, {limit}] ({limit_name}), got "
                         f"{int(cache_seqlens[b])} at index {b} ({n_bad[0]} out of range)")
    if block_table is not None and n_bad[1]:
        b, i = (int(x) for x in bad_page.nonzero()[0])
        raise ValueError(f"block_table: expected page indices in [0, {num_pages}) (k_cache.shape[0]) for the "
                         f"{int(used[b])} pages sequence {b} uses (cache_seqlens[{b}] = {int(cache_seqlens[b])}, "
                         f"page_size {page_size}), got {int(block_table[b, i])} at [{b}, {i}] "
                         f"({n_bad[1]} out of range)")


_KVCACHE_PLANS: dict = {}


def kvcache_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                    block_table: torch.Tensor | None, config: FwdConfig, *, causal: bool, sm_scale: float,
                    precision: str, softcap: float = 0.0, window: tuple[int, int] | None = None,
                    n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The launches of a checked attention_kvcache call: ``(o, lse2)``, lse2 (B, Hq, Nq)
    in base 2. ``n_keys``: the keys per sequence the schedule's chunks cover (no key past
    it is read); ``window`` as common.window_bounds gives it. Through a launch plan per
    signature (kernels/launch.py)."""
    B, H, N_Q, _ = q.shape
    h_kv = k_cache.shape[2] if block_table is not None else k_cache.shape[1]
    schedule = kvcache_schedule(config, B, H, h_kv, N_Q, n_keys, q.device)
    inputs = (q, k_cache, v_cache, cache_seqlens) + ((block_table,) if block_table is not None else ())
    key = (config, schedule, causal, sm_scale, precision, softcap, window) + tuple(tensor_key(t) for t in inputs)
    return planned(_KVCACHE_PLANS, key, inputs,
                   lambda: split_forward(q, k_cache, v_cache, config, schedule, causal=causal, causal_off=0,
                                         sm_scale=sm_scale, precision=precision, softcap=softcap, window=window,
                                         cache_seqlens=cache_seqlens, block_table=block_table))


def attention_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                      *, block_table: torch.Tensor | None = None, causal: bool = False, sm_scale: float | None = None,
                      fwd_config: FwdConfig | None = None, return_lse: bool = False,
                      fp32_precision: str | None = None, softcap: float | None = None,
                      window_size: tuple[int, int] | None = None, max_seqlen_k: int | None = None,
                      check: bool = True):
    """Attention of decode queries against a K/V cache (inference: no autograd),
    FlashAttention's ``flash_attn_with_kvcache`` without the cache update, in flashtune's
    layout for q.

    - ``q``: (batch, heads_q, seq_q, head_dim), as ``attention`` takes it (torch SDPA's
      layout; FlashAttention's (batch, seq_q, heads, head_dim) is ``q.transpose(1, 2)``).
      seq_q is typically 1 (a decode step) to 16 (speculative steps); any works.
    - Without ``block_table``: ``k_cache`` and ``v_cache`` are (batch, heads_kv, capacity,
      head_dim), sequence b's keys the first cache_seqlens[b] rows of its slice
      (FlashAttention's (batch, capacity, heads_kv, head_dim) cache is ``.transpose(1, 2)``).
    - With ``block_table``, an int32 (batch, max_pages_per_seq) tensor: ``k_cache`` and
      ``v_cache`` are (num_pages, page_size, heads_kv, head_dim) pages (vLLM's and
      FlashAttention's paged layout), and key n of sequence b is row n % page_size of page
      block_table[b, n // page_size]. Any page_size >= 1 works (FlashAttention asks for a
      multiple of 256, vLLM uses 16): where page_size is a multiple of the config's BLOCK_N
      each key tile reads one table entry, else each key reads its own. Only the first
      ceil(cache_seqlens[b] / page_size) entries of row b are read; the others, and every
      page no sequence uses, may hold anything.
    - ``cache_seqlens``: int32 (batch,), the keys each sequence holds (0 to the capacity:
      capacity, or max_pages_per_seq x page_size). Keys past a sequence's length are never
      read nor attended; a sequence of length 0 gets output 0 and log-sum-exp -inf.

    heads_q must be a multiple of heads_kv (grouped-query attention; query head h reads K/V
    head h // (heads_q // heads_kv)). Any strides work for every tensor. ``causal`` aligns
    the mask bottom-right in each sequence, as FlashAttention does: query i of seq_q sees
    keys j <= i + cache_seqlens[b] - seq_q (queries with no such key get 0).
    ``window_size`` (FlashAttention's (left, right), -1 unbounded) in that same frame;
    ``softcap``, ``sm_scale``, ``fp32_precision`` as ``attention``.

    ``fwd_config``: the split kernel's config (BLOCK_M, BLOCK_N, num_warps, num_stages,
    num_splits, pack_gqa as for ``attention``'s decode calls; tma is ignored: the loads go
    through pointers); None: the heuristic default (decode entry for seq_q <= 16). A Gluon
    config runs the Triton default. Auto splits (num_splits=0) size the chunks for
    ``max_seqlen_k`` keys per sequence when given, else for the capacity: with a large cache
    holding short sequences, ``max_seqlen_k`` avoids chunks that are all empty. Keys past
    max_seqlen_k are never read, so it must bound every length.

    ``check``: True (the default) also checks the values of cache_seqlens (each in [0,
    max_seqlen_k or the capacity]) and of the block table entries the lengths use (in [0,
    num_pages)) on the host: a few small device operations and one device sync per call
    (check_kvcache_values), the price of an error naming the entry instead of reads out of
    bounds. False skips them (no sync; CUDA graph capture needs it): out-of-range values then
    read out of bounds. Types, shapes, dtypes and devices are always checked (no sync).

    No gradient: inputs that require grad while grad mode is on are refused (call it under
    ``torch.no_grad()`` or ``torch.inference_mode()``, or pass detached tensors). Not under
    torch.compile.

    Returns o (batch, heads_q, seq_q, head_dim) in q's dtype and layout, or (o, lse) with
    ``return_lse=True``: lse (batch, heads_q, seq_q) float32, the natural-log log-sum-exp of
    each query row's scaled scores (-inf for a row that sees no key).
    """
    if torch.compiler.is_compiling():
        raise NotImplementedError("attention_kvcache: not supported under torch.compile yet; call it outside the "
                                  "compiled region")
    if fp32_precision is None:
        fp32_precision = torch_fp32_precision(q.dtype) if isinstance(q, torch.Tensor) else "tf32"
    scale, capacity, n_keys = check_kvcache_inputs(q, k_cache, v_cache, cache_seqlens, block_table, causal=causal,
                                                   sm_scale=sm_scale, fp32_precision=fp32_precision,
                                                   max_seqlen_k=max_seqlen_k)
    if not isinstance(check, bool):
        raise TypeError(f"check: expected a bool, got {type(check).__name__}")
    if torch.is_grad_enabled():
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            if t.requires_grad:
                raise ValueError(f"{name}: requires grad, but attention_kvcache is inference only (no autograd); "
                                 f"call it under torch.no_grad() or pass {name}.detach()")
    cap = check_softcap(softcap)
    window = check_window(window_size)
    paged = block_table is not None
    if check:
        limit_name = "max_seqlen_k" if max_seqlen_k is not None else \
            "the cache's capacity, " + ("block_table.shape[1] x page_size" if paged else "k_cache.shape[2]")
        check_kvcache_values(cache_seqlens, block_table, n_keys, limit_name, k_cache.shape[0],
                             k_cache.shape[1] if paged else 1)
    fwd, _ = resolve_configs(q, fwd_config, None, causal, seq_k=n_keys,
                             heads_kv=k_cache.shape[2] if paged else k_cache.shape[1])
    if fwd.family:  # the Gluon kernel has no split variant
        fwd = fwd.as_triton(q.shape[-1], q.dtype, q.device, causal)
    # the kernel reads length b at CACHE_SEQLENS + b: a strided (batch,) view is copied
    lens = cache_seqlens.contiguous()
    kernel_window = window_bounds(window, causal, q.shape[2], capacity)
    o, lse2 = kvcache_forward(q, k_cache, v_cache, lens, block_table, fwd, causal=causal, sm_scale=scale,
                              precision=dot_precision(q.dtype, fp32_precision), softcap=cap, window=kernel_window,
                              n_keys=n_keys)
    if return_lse:
        return o, lse2 * LN2
    return o
