"""Hugging Face transformers: flashtune's tuned kernels as an attention implementation.

    import flashtune.integrations.transformers as flashtune_hf
    flashtune_hf.register()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="ftune")

``register()`` adds an implementation named "ftune" to transformers'
``AttentionInterface`` and, under the same name, SDPA's mask builder to its
``AttentionMaskInterface``: models then build the masks they would build for
``attn_implementation="sdpa"``, which is no mask at all when a call is plainly causal or
plainly full (no padding, no packing), and a 4-D boolean mask otherwise. Mask-free calls
run on flashtune's kernels through ``get_tuned_attention()`` (the tuned table of the GPU,
grouped-query heads without repeating K/V, the causal flag as the model means it); a call
with a mask, dropout or anything else the kernels cannot run goes to torch SDPA through the
same drop-in, with its one-time warning (or raises with ``strict=True``).

transformers is an optional dependency: ``pip install flashtune[transformers]``.
"""

from __future__ import annotations

import functools
import threading
import warnings

import torch

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
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:  # not installed, or too old to have the interfaces
        raise ImportError("flashtune's transformers integration needs transformers >= 4.56 "
                          "(pip install 'flashtune[transformers]')") from e
    forward = functools.partial(attention_forward, _LazyAttention(db, strict))
    forward.__name__ = f"{name}_attention_forward"  # type: ignore[attr-defined]
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
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


def attention_forward(attention, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None,
                      position_bias: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: (B, H, N, D) inputs, (B, N, H, D) output.

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
