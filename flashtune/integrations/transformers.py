"""Hugging Face transformers: flashtune's tuned kernels as an attention implementation.

    import flashtune.integrations.transformers as flashtune_hf
    flashtune_hf.register()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="ftune")

``register()`` adds an implementation named "ftune" to transformers'
``AttentionInterface`` and, under the same name, a mask builder to its
``AttentionMaskInterface``: SDPA's (``sdpa_mask``), so models build the masks they would
build for ``attn_implementation="sdpa"`` (no mask at all when a call is plainly causal or
plainly full, a 4-D boolean mask otherwise), which also notes on the mask which query rows
the 2-D padding mask marks as padding. The calls then run as follows:

- no mask: on flashtune's kernels through ``get_tuned_attention()`` (the tuned table of the
  GPU, grouped-query heads without repeating K/V, the causal flag as the model means it);
  a batch of one row whose ``position_ids`` restart (documents packed end to end, the
  convention of transformers' FlashAttention-2 path), or FlashAttention's own kwargs
  ``cu_seq_lens_q/k`` and ``max_length_q/k``, on ``flashtune.attention_varlen``;
- a mask that attention_varlen represents exactly (left or right padding of a decoder,
  prefill and decode steps against the cache; padding of an encoder; the block mask of a
  packed row; a sliding window in any of them): on ``flashtune.attention_varlen``, the
  valid tokens gathered into its packed layout and the output scattered back, 0 at the
  padding query rows (as FlashAttention-2's path gives; SDPA gives other values there,
  which no valid position reads). ``flashtune.integrations.packing`` checks the mask by
  building the plan's own mask and comparing: anything else is never served on varlen;
- anything else (another mask, dropout, what the kernels cannot run) goes to torch SDPA
  through the same drop-in, with its one-time warning (or raises with ``strict=True``).

The varlen path runs the heuristic default configs (attention_varlen has no tuned table
yet). Its host cost: the plan of a mask is made once per forward (a few device syncs) and
kept on the mask tensor, which every layer shares; each layer's attention_varlen call then
checks its offsets on the host (one sync per layer).

transformers is an optional dependency: ``pip install flashtune[transformers]``.
"""

from __future__ import annotations

import functools
import threading
import warnings

import torch

from flashtune.integrations import packing

# Not "flashtune": transformers 5 takes every implementation whose name contains "flash" for a
# FlashAttention build and loads flash_attn's varlen functions (or a hub kernel) for it
# (transformers.utils.generic.is_flash_attention_requested, 5.17).
NAME = "ftune"


def register(name: str = NAME, *, db=None, strict: bool = False) -> str:
    """Make ``attn_implementation=name`` run flashtune in transformers models; returns the name.

    ``db``: the store whose tuned table is served (default: ``FLASHTUNE_DB`` or the user's
    store, as for ``get_tuned_attention()``), read on the first attention call, not here.
    ``strict=True``: a call the kernels cannot run raises ``ValueError`` instead of running
    torch SDPA. Registering a name again replaces what it ran before.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected an identifier such as {NAME!r}, got {name!r}")
    if "flash" in name:
        raise ValueError(f"name: {name!r} contains 'flash', which transformers reserves for FlashAttention "
                         f"builds (it would load flash_attn for it); use another name, such as {NAME!r}")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:  # not installed, or too old to have the interfaces
        raise ImportError("flashtune's transformers integration needs transformers >= 4.56 "
                          "(pip install 'flashtune[transformers]')") from e
    forward = functools.partial(attention_forward, _LazyAttention(db, strict))
    forward.__name__ = f"{name}_attention_forward"  # type: ignore[attr-defined]
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, padding_noting_mask)
    return name


class _LazyAttention:
    """One ``get_tuned_attention()`` per registration, made on the first call (the store is
    not opened at import or registration time)."""

    def __init__(self, db, strict: bool) -> None:
        self._db, self._strict = db, strict
        self._attention = None
        self._lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        attention = self._attention
        if attention is None:
            with self._lock:
                if self._attention is None:
                    from flashtune.dispatch import get_tuned_attention

                    self._attention = get_tuned_attention(self._db, strict=self._strict)
                attention = self._attention
        return attention(*args, **kwargs)


def padding_noting_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                        attention_mask: torch.Tensor | None = None, **kwargs):
    """transformers' ``sdpa_mask``, the 4-D mask it builds noting which query rows the 2-D
    padding mask marks valid (``QUERY_VALID``, (batch, q_length) bool), for the varlen path;
    read only for causal self-attention, where the padding mask's positions are the queries'."""
    from transformers.masking_utils import prepare_padding_mask, sdpa_mask

    mask = sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, attention_mask=attention_mask, **kwargs)
    if isinstance(mask, torch.Tensor) and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 \
            and isinstance(q_offset, int) and not torch.compiler.is_compiling():
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding.shape[0] == batch_size and q_offset + q_length <= padding.shape[1]:
            setattr(mask, QUERY_VALID, padding[:, q_offset:q_offset + q_length].to(torch.bool))
    return mask


QUERY_VALID = "_flashtune_query_valid"


def attention_forward(attention, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None,
                      position_bias: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: (B, H, N, D) inputs, (B, N, H, D) output.

    A padding or packing mask, restarting ``position_ids`` or FlashAttention's varlen kwargs
    run on attention_varlen where the plan is exact (module docstring); the rest as follows.
    The model's causal flag holds only where the model built no mask and the query is longer
    than one token: a one-token query (a decode step) sees every cached key, which is the
    bottom-right causal row. With no mask, a causal query block longer than one token and
    more keys than queries happens only for a prefill into an empty static cache, whose keys
    past the queries are not written yet: they are left out.
    """
    if kwargs.get("output_attentions"):
        raise ValueError("flashtune does not return attention weights (output_attentions=True): "
                         "use attn_implementation='eager' for them")
    n_q, n_k = query.shape[2], key.shape[2]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    if not dropout and position_bias is None and not torch.compiler.is_compiling():
        plan = _varlen_plan(query, key, value, attention_mask, bool(causal), kwargs)
        if plan is not None:
            return _run_varlen(plan, query, key, value, scaling, bool(causal), kwargs), None
    causal = bool(causal) and attention_mask is None and n_q > 1
    if causal and n_k > n_q:
        key, value = key[:, :, :n_q], value[:, :, :n_q]
        if position_bias is not None:
            position_bias = position_bias[..., :n_q]
    if position_bias is not None:  # an additive score bias: a float mask for SDPA
        attention_mask = _bias_mask(position_bias, attention_mask, causal, n_q, key.shape[2], query.device)
        causal = False
    softcap = kwargs.get("softcap")
    if softcap:  # Gemma-2's logit softcapping, which SDPA has not: never dropped
        out = _softcapped(query, key, value, attention_mask, dropout, scaling, causal, float(softcap))
    else:
        out = attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                        is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _window_left(causal: bool, kwargs) -> int | None:
    """The left size of the model's sliding window (transformers' ``sliding_window``: query i
    sees keys i - sliding_window < j <= i), None without one."""
    size = kwargs.get("sliding_window")
    return int(size) - 1 if causal and isinstance(size, int) and size > 0 else None


def _varlen_plan(query, key, value, mask, causal: bool, kwargs) -> packing.VarlenPlan | None:
    """The varlen plan of this call (see the module docstring), or None: run it as before."""
    window = _window_left(causal, kwargs)
    if kwargs.get("sliding_window") is not None and window is None:
        return None  # a window this path does not plan (two-sided, or not an int)
    if isinstance(mask, torch.Tensor):
        # the 2-D padding names the query rows of causal self-attention only: a cross-attention
        # mask carries the encoder's padding (its full rows are planned from the 4-D mask alone)
        valid = getattr(mask, QUERY_VALID, None) if causal else None
        batch = query.shape[0]
        if mask.dim() == 4 and mask.shape[0] == 1 < batch:  # one mask for every batch row
            plan = packing.cached(mask, ("mask", causal, window, batch), lambda: packing.plan_from_mask(
                mask.expand(batch, *mask.shape[1:]), valid, causal, window))
        else:
            plan = packing.cached(mask, ("mask", causal, window),
                                  lambda: packing.plan_from_mask(mask, valid, causal, window))
    elif mask is not None or query.shape[0] != 1:
        return None
    elif all(kwargs.get(name) is not None for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                                                       "max_length_k")):
        plan = packing.plan_from_cu_seqlens(kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"], kwargs["max_length_q"],
                                            kwargs["max_length_k"], query.shape[2], key.shape[2])
    elif isinstance(kwargs.get("position_ids"), torch.Tensor) and query.shape[2] == key.shape[2] > 1:
        positions = kwargs["position_ids"]
        plan = packing.cached(positions, ("positions",), lambda: packing.plan_from_positions(positions))
    else:
        return None
    if plan is None or not plan.fits(query, key):
        return None
    from flashtune.kernels import check_inputs

    try:  # what the kernels cannot run goes the drop-in's way, which says why
        check_inputs(query, key, value)
    except (TypeError, ValueError):
        return None
    return plan


def _run_varlen(plan: packing.VarlenPlan, query, key, value, scaling, causal: bool, kwargs) -> torch.Tensor:
    from flashtune.kernels import attention_varlen

    window = _window_left(causal, kwargs)
    return plan.run(attention_varlen, query, key, value, causal=causal, sm_scale=scaling,
                    softcap=kwargs.get("softcap") or None, window_size=None if window is None else (window, 0))


_WARNED: set[str] = set()


def _softcapped(query, key, value, mask, dropout: float, scaling, causal: bool, softcap: float) -> torch.Tensor:
    """Softcapped attention: flashtune's kernels (``attention(softcap=)``) where there is no
    mask and no dropout; else the dense computation with the cap, the mask and the dropout
    (as transformers' eager attention does it), with one warning."""
    from flashtune.kernels import attention

    if mask is None and not dropout:
        return attention(query, key, value, causal=causal, sm_scale=scaling, softcap=softcap)
    reason = "an attention mask" if mask is not None else "dropout"
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"flashtune runs softcapped attention with {reason} densely in torch (its kernels take a "
                      "softcap, not a mask or dropout, with it)", stacklevel=3)
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    scores = softcap * torch.tanh(scores / softcap)
    # masked scores get the dtype's lowest value, not -inf, as transformers' eager path: a row
    # with no key (a padded query) stays finite instead of spreading NaN through 0 x NaN
    lowest = torch.finfo(scores.dtype).min
    if mask is not None:
        scores = scores.masked_fill(~mask, lowest) if mask.dtype == torch.bool else scores + mask
    elif causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, lowest)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=bool(dropout))
    return torch.matmul(probs, value)


def _bias_mask(bias: torch.Tensor, mask: torch.Tensor | None, causal: bool, n_q: int, n_k: int,
               device) -> torch.Tensor:
    """The bias as an additive mask, with the model's mask or the causal mask folded in."""
    lowest = torch.finfo(bias.dtype).min
    if mask is None and causal:
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, lowest)
    return bias + mask
