"""The Gluon forward's host side: ``gluon_attention_forward`` launches the kernel of
kernels/gluon/forward.py with an explicit GluonFwdConfig (``FwdConfig.gluon()``; kernels/passes.py
sends the calls it runs), ``compile_for_sm90`` compiles it without a GPU, ``trace_buffer`` makes the
buffer its instrumentation fills (kernels/gluon/trace.py reads it)."""

from __future__ import annotations

import math

import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashtune.configs.base import FP8_DTYPES
from flashtune.configs.gluon import CONSUMER_WARPS, GluonFwdConfig
from flashtune.device import sm_count
from flashtune.kernels import launch
from flashtune.kernels.common import LOG2E, causal_offset, cdiv, on_device, window_bounds
from flashtune.kernels.gluon import trace as kernel_trace
from flashtune.kernels.gluon.forward import _gluon_attn_fwd_kernel
from flashtune.kernels.gluon.persistent import persistent_lpt_units, persistent_o_tile, persistent_v_buffers
from flashtune.kernels.gluon.sm90 import (SIGNATURE_DTYPES, addressable, compile_kernel, descriptor, descriptor_type,
                                          p_tile_layout, tile_layout, tma_addressable)
from flashtune.kernels.schedule import query_lpt_units


def kernel_constexprs(config: GluonFwdConfig, head_dim: int, dtype: torch.dtype, causal: bool,
                      window: bool = False, trace: bool = False, scale_positive: bool = True,
                      tma_store: bool = False) -> dict:
    """The kernel's constexprs; ``scale_positive``: sm_scale > 0 (the softmax's scale folded into
    one multiply-add a score); ``tma_store``: O is a TMA descriptor; the O tiles: the config's
    O_TILE (persistent_o_tile)."""
    with_o_tile, early_q = persistent_o_tile(config, head_dim, dtype, tma_store)
    v_buffers = persistent_v_buffers(config, head_dim, dtype, tma_store)
    return dict(CAUSAL=bool(causal), WINDOW=bool(window), HEAD_DIM=head_dim, BLOCK_M=config.BLOCK_M,
                BLOCK_N=config.BLOCK_N, NUM_BUFFERS=config.NUM_BUFFERS, PINGPONG=bool(config.PINGPONG),
                OVERLAP=bool(config.OVERLAP), FP8=dtype in FP8_DTYPES,
                P_LAYOUT=p_tile_layout(config.BLOCK_M, config.BLOCK_N, dtype),
                PRODUCER_REGS=config.PRODUCER_REGS, CONSUMER_REGS=config.CONSUMER_REGS,
                PERSISTENT=bool(config.PERSISTENT), TRACE=bool(trace), SCALE_POSITIVE=bool(scale_positive),
                TMA_STORE=bool(tma_store), O_TILE=with_o_tile, EARLY_Q=early_q, V_BUFFERS=v_buffers)


def trace_shape(q_shape, n_k: int, config: GluonFwdConfig) -> tuple[int, int, int]:
    """The trace's shape for a call on q of ``q_shape`` (B, H, Nq, D) over ``n_k`` keys: (tiles,
    partitions, slots), a tile being one grid CTA's 2 x BLOCK_M query rows of one (batch, head)
    and its key blocks at most all of them (kernels/gluon/trace.py)."""
    B, H, N_Q, _D = q_shape
    return (cdiv(N_Q, 2 * config.BLOCK_M) * H * B, len(kernel_trace.PARTITIONS),
            kernel_trace.FORWARD.slots(cdiv(n_k, config.BLOCK_N)))


def trace_buffer(q: torch.Tensor, k: torch.Tensor, config: GluonFwdConfig) -> torch.Tensor:
    """A zeroed trace for ``gluon_attention_forward(q, k, ..., config, trace=...)``."""
    return torch.zeros(trace_shape(q.shape, k.shape[2], config), dtype=torch.int64, device=q.device)


def _tma_store(dtype: torch.dtype) -> bool:
    """Whether a kernel on inputs of ``dtype`` may store o through TMA: 16-bit only, as fp8's o
    is wider than the Q tile it would go through."""
    return dtype not in FP8_DTYPES


def fp8_v_runs(v: torch.Tensor) -> bool:
    """Whether the Gluon kernel takes this fp8 V: keys contiguous (fp8.keys_contiguous's
    layout), the K-major operand fp8 wgmma needs for P V (it cannot transpose 8-bit tiles)."""
    return v.stride(2) == 1 or v.shape[2] == 1


def _v_transposed(v: torch.Tensor) -> torch.Tensor:
    """A key-contiguous fp8 V (B, H, N, D) as the (B, H, D, N) tensor the V descriptor reads,
    copied with N padded to 16 bytes when its rows are not (TMA's stride alignment)."""
    vt = v.transpose(2, 3)
    if tma_addressable(vt):
        return vt
    B, H, D, N = vt.shape
    padded = torch.empty((B, H, D, -(-N // 16) * 16), dtype=v.dtype, device=v.device)
    padded[..., :N] = vt
    return padded[..., :N]


def gluon_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: GluonFwdConfig, *,
                            causal: bool, sm_scale: float | None = None, causal_align: str = "top_left",
                            window_size: tuple[int, int] | None = None, v_descale: float = 1.0,
                            out_dtype: torch.dtype | None = None,
                            trace: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gluon forward with an explicit config: ``(o, lse2)`` as ``attention_forward``.

    fp8 inputs (float8_e4m3fn or float8_e5m2, as ``attention_fp8`` passes them): V with its
    keys contiguous (``fp8_v_runs``; ValueError otherwise), the q and k descales folded into
    ``sm_scale`` by the caller, ``v_descale`` applied once to the output, o in ``out_dtype``
    (fp16 or bf16; default bf16); P is cast to V's fp8 type for the P V wgmma.

    ``window_size`` (left, right) is a checked sliding window (kernels.api.check_window's form:
    FlashAttention's convention, -1 an unbounded side; with ``causal`` right is capped at 0): only
    the key blocks inside it are loaded, its edge blocks masked (common.window_blocks).

    Inputs the copy engine cannot address (head dim not unit-stride, a base or a stride not
    16-byte aligned) are made contiguous first; (B, N, H, D) storage viewed as (B, H, N, D)
    goes through the descriptors as it is. o has q's strides when q is dense and its head dim
    contiguous (dense otherwise).

    ``trace``: ``trace_buffer(q, k, config)``'s zeroed int64 tensor, filled by the kernel's own
    instrumentation (kernels/gluon/trace.py reads it); the outputs are the untraced call's.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v: expected (B, H, N, D) tensors")
    B, H, N_Q, D = q.shape
    Hk, N_K = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or H % Hk:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"dtypes: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if trace is not None:
        want = trace_shape(q.shape, N_K, config)
        if trace.dtype != torch.int64 or tuple(trace.shape) != want or not trace.is_contiguous() \
                or trace.device != q.device:
            raise ValueError(f"trace: expected a contiguous int64 tensor of shape {want} on {q.device} "
                             f"(trace_buffer), got {trace.dtype} {tuple(trace.shape)} on {trace.device}")
        launch.unplannable()  # a caller's buffer: nothing a plan can place
    config.validate(D, q.dtype, q.device)
    fp8 = q.dtype in FP8_DTYPES
    if fp8 and not fp8_v_runs(v):
        raise ValueError("v: the Gluon fp8 forward reads V with its keys contiguous (fp8.keys_contiguous(v)); "
                         f"got strides {tuple(v.stride())}")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    q_in = q
    q, k = addressable(q), addressable(k)
    if fp8:
        vt = _v_transposed(v)  # a view of an input, or a copy: no plan either way
        launch.unplannable()
    else:
        v = addressable(v)
    window = window_bounds(window_size, bool(causal), N_Q, N_K)
    # the diagonal's offset: the causal mask's and the window's frame
    off = causal_offset(causal_align, N_Q, N_K) if causal or window else 0
    o_dtype = (out_dtype or torch.bfloat16) if fp8 else q.dtype
    # o in the caller's q's layout (also where q was copied to be addressable), unless its head dim
    # is strided: then dense (attention_forward sends such a q to the Triton kernel)
    if q_in.stride(-1) == 1:
        o = launch.empty_like(q_in, dtype=o_dtype)
    else:
        o = launch.empty(q.shape, dtype=o_dtype, device=q.device)
    lse2 = launch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    tma_store = _tma_store(q.dtype) and tma_addressable(o)
    desc_q = descriptor(q, config.BLOCK_M)
    desc_k = descriptor(k, config.BLOCK_N)
    if fp8:  # [D, BLOCK_N] tiles of V^T
        desc_v = TensorDescriptor(vt, list(vt.shape), list(vt.stride()), [1, 1, D, config.BLOCK_N],
                                  tile_layout(D, config.BLOCK_N, vt.dtype))
    else:
        desc_v = descriptor(v, config.BLOCK_N)
    n_m = cdiv(N_Q, 2 * config.BLOCK_M)  # common.cdiv: triton.cdiv is a jit function
    if config.PERSISTENT:  # as many CTAs as the SMs hold at once (programs_per_sm), each walking tiles
        grid = (min(n_m * H * B, sm_count(q.device) * config.programs_per_sm(D, q.dtype)), )
        lpt = persistent_lpt_units(N_Q, N_K, B * H, config, grid[0], causal=causal, plain=window is None)
    else:
        lpt = query_lpt_units(q, k, n_m, causal=causal, plain=window is None)
        grid = (n_m * H * B, ) if lpt else (n_m, H, B)
    with on_device(q):
        out = descriptor(o, config.BLOCK_M) if tma_store else o
        launch.launch(_gluon_attn_fwd_kernel, desc_q, desc_k, desc_v, out, lse2, sm_scale * LOG2E, float(v_descale),
                      *o.stride(), H, H // Hk, N_Q, N_K, off, *(window or (0, 0)), lpt, H * B,
                      lse2 if trace is None else trace, 0 if trace is None else trace.shape[2], grid=grid,
                      **kernel_constexprs(config, D, q.dtype, causal, window is not None, trace is not None,
                                          sm_scale > 0, tma_store),
                      num_warps=CONSUMER_WARPS, maxnreg=config.maxnreg())
    return o, lse2


def compile_for_sm90(config: GluonFwdConfig, head_dim: int, dtype: torch.dtype, causal: bool, window: bool = False,
                     out_dtype: torch.dtype = torch.bfloat16, trace: bool = False, scale_positive: bool = True,
                     tma_store: bool = True):
    """Compile the kernel for sm_90 (ptxas; no GPU needed) as a launch on contiguous inputs
    would (``trace``: with its instrumentation; ``scale_positive``: sm_scale > 0;
    ``tma_store``: an output the copy engine can address, stored through TMA where the dtype
    allows); returns triton's CompiledKernel (``.metadata.shared``, ``.asm``)."""
    fp8 = dtype in FP8_DTYPES
    tma_store = tma_store and _tma_store(dtype)
    constexprs = kernel_constexprs(config, head_dim, dtype, causal, window, trace, scale_positive, tma_store)
    constexprs["stride_od"] = 1
    m, n = config.BLOCK_M, config.BLOCK_N
    types = {"desc_q": descriptor_type(dtype, m, head_dim), "desc_k": descriptor_type(dtype, n, head_dim),
             "desc_v": descriptor_type(dtype, head_dim, n) if fp8 else descriptor_type(dtype, n, head_dim),
             "O": descriptor_type(dtype, m, head_dim) if tma_store
             else f"*{SIGNATURE_DTYPES[out_dtype if fp8 else dtype]}",
             "LSE": "*fp32", "qk_scale": "fp32", "v_scale": "fp32", "TRACE_PTR": "*i64" if trace else "*fp32"}
    aligned = ("LSE", "TRACE_PTR") if tma_store else ("LSE", "TRACE_PTR", "O")
    return compile_kernel(_gluon_attn_fwd_kernel, constexprs, types, aligned, config.maxnreg())
