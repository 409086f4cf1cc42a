"""flashtune's attention as PyTorch operators, for torch.compile.

``torch.ops.flashtune.attention(q, k, v, causal, sm_scale, fwd_config, bwd_config,
fp32_precision, causal_align, table, softcap, window_left, window_right, dropout_p,
dropout_rng)`` (from softcap on optional) returns ``(o, lse2)`` and is differentiable: its backward is
``torch.ops.flashtune.attention_backward``. Both have fake (meta) implementations, so
torch.compile traces a call as one node per pass with no graph break, dynamic shapes
included, and Inductor schedules around it.

``fp32_precision=""`` follows torch's matmul precision setting at run time (the drop-in's
rule). Configs travel as JSON strings, "" meaning "choose at run time": from the tuned table of
the drop-in named by ``table`` (a token from ``table_token()``: the ``get_tuned_attention()``
whose call was traced) or, with ``table=""``, the heuristic defaults. The choice is made inside the operator, on
the real shapes, so a graph traced with dynamic sequence lengths is traced once and every
call still gets the config of its own shape; the lookup is the dispatcher's dict hit per
call signature.

Eager calls of ``flashtune.attention`` and the drop-in keep their direct path (an
operator call costs host time per call); they go through these operators while
``torch.compiler.is_compiling()``.
"""

from __future__ import annotations

import functools
import json

import torch

from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig
from flashtune.kernels.common import Dropout, torch_fp32_precision
from flashtune.kernels.passes import attention_backward, attention_forward, dropout_fwd_config, resolve_configs


@torch.compiler.assume_constant_result
def config_json(config) -> str:
    """A config as the operators take it: "" for None (chosen at run time). A constant of
    the traced graph: the config object itself never enters it."""
    return "" if config is None else json.dumps(config.to_dict(), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _parse(cls, text: str):
    return cls.from_dict(json.loads(text))


def _configs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float, fwd_config: str, bwd_config: str,
             table: str, dropout: bool = False) -> tuple[FwdConfig, BwdConfig]:
    """The configs a call runs: the given ones, else the table's choice for this shape (with
    ``dropout`` one whose DROPOUT kernel fits), else the defaults."""
    fwd = _parse(FwdConfig, fwd_config) if fwd_config else None
    bwd = _parse(BwdConfig, bwd_config) if bwd_config else None
    attention = _TABLES.get(table) if table else None  # absent: a graph from another process; defaults
    if attention is not None and (fwd is None or bwd is None):
        choice = attention.explain(q, k, v, is_causal=causal, scale=sm_scale, enable_gqa=True)
        if fwd is None and dropout:
            fwd = dropout_fwd_config(choice.fwd_config, q.shape[-1], q.dtype, q.device, causal)
        fwd = fwd or choice.fwd_config
        bwd = bwd or choice.bwd_config
    return resolve_configs(q, fwd, bwd, causal, dropout=dropout, seq_k=k.shape[2], heads_kv=k.shape[1])


# the drop-ins whose tables traced graphs name, by token (never a URL: a graph is no place for a password)
_TABLES: dict[str, object] = {}


@torch.compiler.assume_constant_result
def table_token(attention) -> str:
    """The name under which the operators find ``attention``'s tuned table (a TunedAttention)."""
    token = f"table-{id(attention):x}"
    _TABLES[token] = attention  # held for the process: a graph may outlive its drop-in's other owners
    return token


@torch.library.custom_op("flashtune::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
                 fwd_config: str, bwd_config: str, fp32_precision: str, causal_align: str, table: str,
                 softcap: float = 0.0, window_left: int = -1, window_right: int = -1, dropout_p: float = 0.0,
                 dropout_rng: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward: (o, lse2), lse2 the base-2 log-sum-exp the backward takes. ``softcap`` 0: none;
    the window's sides as ``flashtune.attention``'s window_size, (-1, -1): none. ``dropout_p``
    0: none; else ``dropout_rng`` is common.Dropout's (seed, offset) tensor, read when the
    kernels run (a graph input: a CUDA graph replays with what it holds then)."""
    fwd, _ = _configs(q, k, v, causal, sm_scale, fwd_config, bwd_config, table, bool(dropout_p))
    return attention_forward(q, k, v, fwd, causal=causal, sm_scale=sm_scale,
                             fp32_precision=fp32_precision or torch_fp32_precision(q.dtype), causal_align=causal_align,
                             softcap=softcap, window_size=_window(window_left, window_right),
                             dropout=_dropout(dropout_p, dropout_rng))


def _window(left: int, right: int) -> tuple[int, int] | None:
    return None if (left, right) == (-1, -1) else (left, right)


def _dropout(p: float, rng: torch.Tensor | None) -> Dropout | None:
    if not p:
        return None
    if rng is None:
        raise ValueError("dropout_rng: expected the (seed, offset) tensor with dropout_p > 0, got None")
    return Dropout(p, rng)


@attention_op.register_fake
def _attention_fake(q, k, v, causal, sm_scale, fwd_config, bwd_config, fp32_precision, causal_align, table,
                    softcap=0.0, window_left=-1, window_right=-1, dropout_p=0.0, dropout_rng=None):
    # the launcher's outputs: o like q (its strides too), lse2 (B, Hq, Nq) contiguous fp32
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("flashtune::attention_backward", mutates_args=())
def attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse2: torch.Tensor, causal: bool, sm_scale: float, fwd_config: str, bwd_config: str,
                          fp32_precision: str, causal_align: str, table: str, softcap: float = 0.0,
                          window_left: int = -1, window_right: int = -1, dropout_p: float = 0.0,
                          dropout_rng: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward: (dq, dk, dv) in the layouts of q, k and v (the dropout mask regenerated
    from the forward's ``dropout_rng``)."""
    _, bwd = _configs(q, k, v, causal, sm_scale, fwd_config, bwd_config, table, bool(dropout_p))
    return attention_backward(do, q, k, v, o, lse2, bwd, causal=causal, sm_scale=sm_scale,
                              fp32_precision=fp32_precision or torch_fp32_precision(q.dtype),
                              causal_align=causal_align, softcap=softcap,
                              window_size=_window(window_left, window_right), dropout=_dropout(dropout_p, dropout_rng))


@attention_backward_op.register_fake
def _attention_backward_fake(do, q, k, v, o, lse2, causal, sm_scale, fwd_config, bwd_config, fp32_precision,
                             causal_align, table, softcap=0.0, window_left=-1, window_right=-1, dropout_p=0.0,
                             dropout_rng=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, *arguments = inputs
    o, lse2 = output
    rng = None
    if len(arguments) == _ARGUMENTS:  # dropout_rng given (or its default filled in)
        arguments, rng = arguments[:-1], arguments[-1]
    ctx.save_for_backward(q, k, v, o, lse2, rng)  # rng: the dropout's (seed, offset) tensor, or None
    ctx.arguments = tuple(arguments)  # causal ... dropout_p: the backward operator's arguments after lse2
    ctx.mark_non_differentiable(lse2)


def _backward(ctx, do, _dlse2):
    q, k, v, o, lse2, rng = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(do, q, k, v, o, lse2, *ctx.arguments, rng)
    return (dq, dk, dv) + (None,) * (len(ctx.arguments) + 1)


# the forward operator's arguments after q, k, v, dropout_rng last
_ARGUMENTS = len(attention_op._opoverload._schema.arguments) - 3
attention_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_attention(q, k, v, *, causal: bool, sm_scale: float, fwd_config, bwd_config, fp32_precision: str,
                       causal_align: str = "top_left", table: str = "", softcap: float = 0.0,
                       window_size: tuple[int, int] | None = None, dropout: Dropout | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The operator call for checked inputs, configs (None: chosen, and validated, at run time),
    softcap (0: none), window (check_window's form) and dropout (check_dropout's)."""
    for name, config, cls in (("fwd_config", fwd_config, FwdConfig), ("bwd_config", bwd_config, BwdConfig)):
        if config is not None and not isinstance(config, cls):
            raise TypeError(f"{name}: expected a {cls.__name__} or None, got {type(config).__name__}")
    left, right = window_size or (-1, -1)
    return attention_op(q, k, v, causal, sm_scale, config_json(fwd_config), config_json(bwd_config),
                        fp32_precision, causal_align, table, softcap, left, right,
                        *((dropout.p, dropout.rng) if dropout is not None else ()))
