"""The Gluon backward's host side: ``gluon_attention_backward`` runs a GluonBwdConfig's backward
(``BwdConfig.gluon()``; kernels/passes.py sends the calls it runs): Delta from the Triton
preprocess, dK and dV from the Gluon dK/dV kernel (backward.py; head dim 256: backward_wide.py),
dQ from the dK/dV kernel itself (DQ_FUSED), the Gluon dQ kernel (backward_dq.py) or the Triton dQ
kernel. ``compile_for_sm90`` and ``compile_wide_for_sm90`` compile the kernels without a GPU."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashtune.configs.backward import split_work
from flashtune.configs.gluon import (CONSUMER_WARPS, DQ_BLOCK_M, WIDE_BLOCK_KEYS, WIDE_HEAD_DIM, GluonBwdConfig,
                                     validate_wide)
from flashtune.device import sm_count
from flashtune.heuristics.defaults import triton_default
from flashtune.kernels import launch
from flashtune.kernels.common import LOG2E, causal_offset, cdiv, dot_precision, needs_int64, on_device
from flashtune.kernels.gluon import trace as kernel_trace
from flashtune.kernels.gluon.backward import _gluon_attn_bwd_dkdv_kernel
from flashtune.kernels.gluon.backward_dq import _gluon_attn_bwd_dq_kernel
from flashtune.kernels.gluon.backward_wide import _gluon_attn_bwd_wide_kernel
from flashtune.kernels.gluon.sm90 import (SIGNATURE_DTYPES, compile_kernel, descriptor, descriptor_type,
                                          kernel_inputs, p_tile_layout, tma_addressable)
from flashtune.kernels.schedule import key_block_lpt_units
from flashtune.kernels.triton.backward import _launch_dq, _preprocess, _sum_partials

# the dK/dV kernels (one CTA per SM, their shared memory allows no more): programs per SM their
# auto split (configs.backward.split_work) and their heaviest-first groups aim at
GLUON_DKDV_PROGRAMS_PER_SM = 1
DQ_CHUNK = 64  # head-dim columns of one reduce-add tile of the D=256 kernel's dQ (a group's half is two)


def split_exp2(head_dim: int, causal: bool) -> bool:
    """Whether the dK/dV kernel takes one of every 4 of its P^T exponentials by a polynomial on the
    FMA pipe (the others by the SFU, which both consumers' 2 x 64 x 64 scores a step keep busy about
    half of the P^T phase): at D=128 without masking, where it was faster on 5 of 6 rows
    (benchmarks/results: h100-gluon-bwd-persistent-d256-fwd); not causal (no gain there) nor at
    D=64 (slower on 4 of 5 rows, benchmarks/results: h100-gluon-bwd-defaults-poly-exp2). Its
    relative error, under 7.5e-5, is below bf16's and fp16's rounding of P^T."""
    return head_dim == 128 and not causal


def kernel_constexprs(config: GluonBwdConfig, head_dim: int, dtype: torch.dtype, causal: bool,
                      trace: bool = False, tma_dkdv: bool = False) -> dict:
    """The dK/dV kernel's constexprs (``tma_dkdv``: dK and dV through TMA, as ``_tma_dkdv``
    decides for the launch)."""
    return dict(CAUSAL=bool(causal), HEAD_DIM=head_dim, BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N,
                NUM_BUFFERS=config.NUM_BUFFERS, FUSED_DQ=config.DQ_FUSED,
                DS_LAYOUT=p_tile_layout(config.BLOCK_N, config.BLOCK_M, dtype), PRODUCER_REGS=config.PRODUCER_REGS,
                CONSUMER_REGS=config.CONSUMER_REGS, TRACE=bool(trace), DQ_FIRST=bool(config.DQ_FIRST),
                SPLIT_EXP2=split_exp2(head_dim, causal), TMA_DKDV=bool(tma_dkdv))


def _tma_dkdv(n_split: int, dk: torch.Tensor | None = None, dv: torch.Tensor | None = None) -> bool:
    """Whether a launch stores dK and dV through TMA: unsplit (a split's fp32 partials keep the
    register stores), outputs the copy engine can address (None: taken as such)."""
    return n_split == 1 and all(t is None or tma_addressable(t) for t in (dk, dv))


def dkdv_trace_shape(q_shape, k_shape, config: GluonBwdConfig, split: tuple[int, int]) -> tuple[int, int, int]:
    """The dK/dV kernel's trace shape for a call on q of ``q_shape`` (B, Hq, Nq, D) and k of
    ``k_shape`` split as ``split``: (CTAs, partitions, slots), a CTA walking at most its share of
    the group's heads x all query blocks (kernels/gluon/trace.BACKWARD)."""
    B, H, N_Q, _D = q_shape
    H_KV, N_K = k_shape[1], k_shape[2]
    split_h, split_q = split
    steps = (H // H_KV) // split_h * cdiv(cdiv(N_Q, config.BLOCK_M), split_q)
    return (cdiv(N_K, 2 * config.BLOCK_N) * B * H_KV * split_h * split_q, len(kernel_trace.PARTITIONS),
            kernel_trace.BACKWARD.slots(steps))


@functools.lru_cache(maxsize=None)
def _fp32_tile_layout(rows: int, cols: int):
    """The shared layout of an fp32 [1, 1, rows, cols] reduce-add tile of the fused dQ."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], gl.float32)


@functools.lru_cache(maxsize=None)
def _exchange_layouts(block_m: int, dtype: torch.dtype) -> tuple:
    """The D=256 kernel's shared layouts of the 16-bit P^T / dS^T slots (wgmma operands) and of the
    fp32 P^T slots, made once per (block_m, dtype) (the layouts are frozen dataclasses)."""
    return (p_tile_layout(WIDE_BLOCK_KEYS, block_m, dtype),
            gl.NVMMASharedLayout.get_default_for([WIDE_BLOCK_KEYS, block_m], gl.float32))


def _split_outputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_split: int):
    """dK and dV as the caller gets them and where a dK/dV kernel writes them: (dk, dv, parts, outs,
    strides), ``parts`` the (dK, dV) x split x (B, H_KV, N_K, D) fp32 slots of a split launch (else
    None), ``outs`` the kernel's two outputs and ``strides`` theirs (the split's first)."""
    B, _H, _N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    dk, dv = launch.empty_like(k), launch.empty_like(v)
    parts = None
    outs = (dk, dv)
    if n_split > 1:
        parts = launch.empty((2, n_split, B, H_KV, N_K, D), device=q.device, dtype=torch.float32)
        outs = (parts[0], parts[1])
    strides = [(o.stride(0) if n_split > 1 else 0, *o.stride()[-4:]) for o in outs]
    return dk, dv, parts, outs, strides


def _dq_acc_descriptor(dq_acc: torch.Tensor | None, q: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    """The fused dQ's reduce-add descriptor of ``dq_acc`` in fp32 [1, 1, rows, cols] tiles."""
    if dq_acc is None or dq_acc.dtype != torch.float32 or dq_acc.shape != q.shape or not dq_acc.is_contiguous():
        raise ValueError("dq_acc: a DQ_FUSED config needs a zeroed contiguous float32 tensor of q's shape")
    return TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), [1, 1, rows, cols],
                            _fp32_tile_layout(rows, cols))


def gluon_dkdv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse2: torch.Tensor,
               delta: torch.Tensor, config: GluonBwdConfig, *, causal: bool, sm_scale: float,
               causal_off: int = 0, split: tuple[int, int] = (1, 1), lpt: int | None = None,
               dq_acc: torch.Tensor | None = None,
               trace: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """dK and dV (in k's and v's dtype and layout, as torch.empty_like makes them) from the
    Gluon kernel, given the forward's lse2 and Delta = rowsum(dO * O), both (B, Hq, Nq)
    float32; head dim 256 from the D=256 kernel (which has no trace). Inputs the copy engine
    cannot address are copied dense first. ``split``: (head splits, query chunks) of each key
    block's work over CTAs, as ``config.dkdv_split`` gives them (the head splits divide the
    group); their fp32 partials are summed by the Triton backward's sum kernel. ``lpt``:
    LPT_UNITS (None: schedule.key_block_lpt_units). A DQ_FUSED config also adds sm_scale dS K
    into ``dq_acc``, a zeroed contiguous (B, Hq, Nq, D) float32 tensor. ``trace``: a zeroed
    contiguous int64 tensor of ``dkdv_trace_shape``, filled by the kernel's own instrumentation
    (kernels/gluon/trace.BACKWARD's layout)."""
    B, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    wide = D == WIDE_HEAD_DIM
    split_h, split_q = split
    group = H // H_KV
    if split_h < 1 or split_q < 1 or group % split_h:
        raise ValueError(f"split: expected (head splits dividing the group of {group}, query chunks >= 1), "
                         f"got {split}")
    if wide and trace is not None:
        raise ValueError("trace: the D=256 backward has no instrumentation")
    if trace is not None:
        want = dkdv_trace_shape(q.shape, k.shape, config, split)
        if trace.dtype != torch.int64 or tuple(trace.shape) != want or not trace.is_contiguous() \
                or trace.device != q.device:
            raise ValueError(f"trace: expected a contiguous int64 tensor of shape {want} on {q.device} "
                             f"(dkdv_trace_shape), got {trace.dtype} {tuple(trace.shape)} on {trace.device}")
        launch.unplannable()  # a caller's buffer: nothing a plan can place
    n_split = split_h * split_q
    dk, dv, parts, outs, strides = _split_outputs(q, k, v, n_split)
    n_units = B * H_KV * n_split
    # the D=256 kernel's two groups share the CTA's 64 keys; the other one's take BLOCK_N each
    kv_rows = WIDE_BLOCK_KEYS if wide else config.BLOCK_N
    keys_per_cta = kv_rows if wide else 2 * kv_rows
    q, k, v, do, lse2, delta = kernel_inputs(q, k, v, do, lse2, delta)
    desc_q, desc_do = descriptor(q, config.BLOCK_M), descriptor(do, config.BLOCK_M)
    desc_k, desc_v = descriptor(k, kv_rows), descriptor(v, kv_rows)
    if lpt is None:
        lpt = key_block_lpt_units(q, heads_per_unit=group // split_h, units=n_units,
                                  key_blocks=cdiv(N_K, keys_per_cta), programs_per_sm=GLUON_DKDV_PROGRAMS_PER_SM,
                                  causal=causal)
    desc_dqa = desc_q  # not read without DQ_FUSED
    if config.DQ_FUSED:
        desc_dqa = _dq_acc_descriptor(dq_acc, q, config.BLOCK_M, DQ_CHUNK if wide else D // 2)
    grid = (cdiv(N_K, keys_per_cta) * n_units, )
    with on_device(q):
        if wide:
            launch.launch(_gluon_attn_bwd_wide_kernel, desc_q, desc_do, desc_k, desc_v, *outs, lse2, delta,
                          sm_scale * LOG2E, sm_scale, *strides[0], *strides[1], H, H_KV, group, N_Q, N_K, causal_off,
                          split_h, split_q, lpt, n_units, desc_dqa, grid=grid,
                          **wide_kernel_constexprs(config, q.dtype, causal), num_warps=CONSUMER_WARPS,
                          maxnreg=config.maxnreg())
        else:
            tma_dkdv = _tma_dkdv(n_split, dk, dv)
            if tma_dkdv:  # the outputs as descriptors of the K/V tiles' kind (same dtype, rows and shared layout)
                outs = (descriptor(dk, config.BLOCK_N), descriptor(dv, config.BLOCK_N))
            launch.launch(_gluon_attn_bwd_dkdv_kernel, desc_q, desc_do, desc_k, desc_v, *outs, lse2, delta,
                          sm_scale * LOG2E, sm_scale, *strides[0], *strides[1], H, H_KV, group, N_Q, N_K, causal_off,
                          split_h, split_q, lpt, n_units, desc_dqa, lse2 if trace is None else trace,
                          0 if trace is None else trace.shape[2], grid=grid,
                          **kernel_constexprs(config, D, q.dtype, causal, trace is not None, tma_dkdv),
                          num_warps=CONSUMER_WARPS, maxnreg=config.maxnreg())
        if parts is not None:
            _sum_partials(parts, dk, dv, int64=needs_int64(parts, dk, dv))
    return dk, dv


def wide_kernel_constexprs(config: GluonBwdConfig, dtype: torch.dtype, causal: bool) -> dict:
    """The D=256 kernel's constexprs."""
    x_layout, x32_layout = _exchange_layouts(config.BLOCK_M, dtype)
    return dict(CAUSAL=bool(causal), HEAD_DIM=WIDE_HEAD_DIM, BLOCK_M=config.BLOCK_M, BLOCK_N=WIDE_BLOCK_KEYS,
                NUM_BUFFERS=config.NUM_BUFFERS, FUSED_DQ=bool(config.DQ_FUSED), X_LAYOUT=x_layout,
                X32_LAYOUT=x32_layout, PRODUCER_REGS=config.PRODUCER_REGS, CONSUMER_REGS=config.CONSUMER_REGS)


def dq_kernel_constexprs(config: GluonBwdConfig, head_dim: int, causal: bool) -> dict:
    """The Gluon dQ kernel's constexprs."""
    return dict(CAUSAL=bool(causal), HEAD_DIM=head_dim, BLOCK_M=DQ_BLOCK_M, BLOCK_N=config.DQ_BLOCK_N,
                NUM_BUFFERS=config.DQ_BUFFERS, PRODUCER_REGS=config.PRODUCER_REGS,
                CONSUMER_REGS=config.CONSUMER_REGS)


def gluon_dq_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse2: torch.Tensor,
                    delta: torch.Tensor, config: GluonBwdConfig, *, causal: bool, sm_scale: float,
                    causal_off: int = 0) -> torch.Tensor:
    """dQ (in q's dtype and layout, as torch.empty_like makes it) from the Gluon dQ kernel,
    given lse2 and Delta as ``gluon_dkdv`` takes them."""
    B, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    dq = launch.empty_like(q)
    q, k, v, do, lse2, delta = kernel_inputs(q, k, v, do, lse2, delta)
    desc_q, desc_do = descriptor(q, DQ_BLOCK_M), descriptor(do, DQ_BLOCK_M)
    desc_k, desc_v = descriptor(k, config.DQ_BLOCK_N), descriptor(v, config.DQ_BLOCK_N)
    grid = (cdiv(N_Q, 2 * DQ_BLOCK_M), H, B)
    with on_device(q):
        launch.launch(_gluon_attn_bwd_dq_kernel, desc_q, desc_do, desc_k, desc_v, dq, lse2, delta, sm_scale * LOG2E,
                      sm_scale, *dq.stride(), H, H // H_KV, N_Q, N_K, causal_off, grid=grid,
                      **dq_kernel_constexprs(config, D, causal), num_warps=CONSUMER_WARPS, maxnreg=config.maxnreg())
    return dq


def gluon_attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                             lse2: torch.Tensor, config: GluonBwdConfig, *, causal: bool,
                             sm_scale: float | None = None, causal_align: str = "top_left",
                             dq_config=None, gluon_dq: bool = False,
                             dkdv_split: int = 0, lpt: int | None = None,
                             trace: list | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) as the Triton backward returns them: dK and dV from the Gluon kernel, Delta
    and dQ from the Triton preprocess and dQ kernel (``dq_config``: a BwdConfig whose dQ half
    runs, with its ``tma``; default the device's Triton default, its dQ kernel kept apart), or
    with ``gluon_dq`` from the Gluon dQ kernel (the config's DQ_ fields), or with
    ``config.DQ_FUSED`` from the dK/dV kernel itself (but under
    ``torch.use_deterministic_algorithms``, where the dQ kernel named runs).
    ``dkdv_split``: BwdConfig.dkdv_split's value for the dK/dV kernel (0: chosen from the
    shape); ``lpt`` as ``gluon_dkdv``'s. dq, dk and dv come in q's, k's and v's layouts where
    those are dense. ``trace``: a list the dK/dV kernel's trace of this call is appended to (an
    int64 tensor, kernels/gluon/trace.BACKWARD's layout; the kernel then runs instrumented,
    its results unchanged)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or do.shape != q.shape or o.shape != q.shape:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"o {tuple(o.shape)}, do {tuple(do.shape)}")
    B, H, N_Q, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or H % k.shape[1]:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if len({q.dtype, k.dtype, v.dtype, do.dtype, o.dtype}) != 1:
        raise ValueError(f"dtypes: q {q.dtype}, k {k.dtype}, v {v.dtype}, o {o.dtype}, do {do.dtype}")
    wide = D == WIDE_HEAD_DIM  # the D=256 kernel, which takes its own configs
    if wide:
        if gluon_dq:
            raise ValueError("gluon_dq: the Gluon dQ kernel does not run head dim 256 (the D=256 backward fuses dQ, "
                             "DQ_FUSED 1, or leaves it to the Triton dQ kernel)")
        if trace is not None:
            raise ValueError("trace: the D=256 backward has no instrumentation")
        validate_wide(config, q.dtype, q.device)
    else:
        config.validate(D, q.dtype, q.device)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    off = causal_offset(causal_align, N_Q, k.shape[2]) if causal else 0
    if dq_config is None:
        dq_config = triton_default("bwd", D, q.dtype, q.device, bool(causal))
    if dq_config.atomic_dq:
        dq_config = dataclasses.replace(dq_config, atomic_dq=0)
    if config.DQ_FUSED and torch.are_deterministic_algorithms_enabled():
        config = dataclasses.replace(config, DQ_FUSED=0)  # dQ by its own kernel: a fixed order of adds
    delta = launch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    int64 = needs_int64(q, k, v, o, do)
    # the fused dQ's fp32 accumulator, zeroed by the kernel that computes Delta
    dq_acc = launch.empty(q.shape, device=q.device, dtype=torch.float32) if config.DQ_FUSED else None
    with on_device(q):
        _preprocess(o, do, delta, int64=int64, zero=dq_acc)
        # config.dkdv_split's rule for this kernel: 2 x BLOCK_N keys a CTA (the D=256 kernel's: BLOCK_N), one
        # CTA per SM
        split = split_work(dkdv_split, block_m=config.BLOCK_M,
                           keys_per_program=config.BLOCK_N if wide else 2 * config.BLOCK_N,
                           programs_per_sm=GLUON_DKDV_PROGRAMS_PER_SM, batch=B, heads_q=H, heads_kv=k.shape[1],
                           n_q=N_Q, n_k=k.shape[2], sm_count=sm_count(q.device))
        buf = None
        if trace is not None:
            buf = torch.zeros(dkdv_trace_shape(q.shape, k.shape, config, split), dtype=torch.int64, device=q.device)
            trace.append(buf)
        dk, dv = gluon_dkdv(q, k, v, do, lse2, delta, config, causal=causal, sm_scale=sm_scale, causal_off=off,
                            split=split, lpt=lpt, dq_acc=dq_acc, trace=buf)
        if dq_acc is not None:  # cast to q's dtype
            return launch.copy_(launch.empty_like(q), dq_acc), dk, dv
        if gluon_dq:
            dq = gluon_dq_kernel(q, k, v, do, lse2, delta, config, causal=causal, sm_scale=sm_scale, causal_off=off)
            return dq, dk, dv
        dq = launch.empty_like(q)
        _launch_dq(q, k, v, do, dq, lse2, delta, dq_config, causal=causal, sm_scale=sm_scale,
                   precision=dot_precision(q.dtype, "tf32"), int64=int64 or needs_int64(dq), causal_off=off)
    return dq, dk, dv


def compile_for_sm90(config: GluonBwdConfig, head_dim: int, dtype: torch.dtype, causal: bool, kernel: str = "dkdv",
                     trace: bool = False, tma_dkdv: bool = True):
    """Compile the dK/dV kernel (or, ``kernel="dq"``, the Gluon dQ kernel) for sm_90 (ptxas; no GPU
    needed) as an unsplit launch on contiguous inputs would (``trace``: the dK/dV kernel with its
    instrumentation; ``tma_dkdv``: outputs the copy engine can address, dK and dV through TMA);
    returns triton's CompiledKernel (``.metadata.shared``, ``.asm``)."""
    el = SIGNATURE_DTYPES[dtype]
    if kernel == "dq":
        fn = _gluon_attn_bwd_dq_kernel
        constexprs = dq_kernel_constexprs(config, head_dim, causal)
        n = config.DQ_BLOCK_N
        types = {"desc_q": descriptor_type(dtype, DQ_BLOCK_M, head_dim), "desc_k": descriptor_type(dtype, n, head_dim),
                 "desc_do": descriptor_type(dtype, DQ_BLOCK_M, head_dim), "desc_v": descriptor_type(dtype, n, head_dim),
                 "DQ": f"*{el}"}
        constexprs["stride_dqd"] = 1
        aligned = ("DQ", "LSE", "DELTA")
    else:
        fn = _gluon_attn_bwd_dkdv_kernel
        constexprs = kernel_constexprs(config, head_dim, dtype, causal, trace, tma_dkdv)
        m, n = config.BLOCK_M, config.BLOCK_N
        out = descriptor_type(dtype, n, head_dim) if tma_dkdv else f"*{el}"
        types = {"desc_q": descriptor_type(dtype, m, head_dim), "desc_do": descriptor_type(dtype, m, head_dim),
                 "desc_k": descriptor_type(dtype, n, head_dim), "desc_v": descriptor_type(dtype, n, head_dim),
                 "DK": out, "DV": out, "TRACE_PTR": "*i64" if trace else "*fp32",
                 "desc_dqa": descriptor_type(torch.float32, m, head_dim // 2, _fp32_tile_layout(m, head_dim // 2))
                 if config.DQ_FUSED else descriptor_type(dtype, m, head_dim)}
        constexprs["stride_dkd"] = 1
        constexprs["stride_dvd"] = 1
        aligned = ("LSE", "DELTA", "TRACE_PTR") if tma_dkdv else ("DK", "DV", "LSE", "DELTA", "TRACE_PTR")
    types.update({"LSE": "*fp32", "DELTA": "*fp32", "qk_scale": "fp32", "sm_scale": "fp32"})
    return compile_kernel(fn, constexprs, types, aligned, config.maxnreg())


def compile_wide_for_sm90(config: GluonBwdConfig, dtype: torch.dtype, causal: bool):
    """Compile the D=256 kernel for sm_90 (ptxas; no GPU needed) as an unsplit launch on
    contiguous inputs would; returns triton's CompiledKernel (``.metadata.shared``, ``.asm``)."""
    el = SIGNATURE_DTYPES[dtype]
    constexprs = wide_kernel_constexprs(config, dtype, causal)
    constexprs["stride_dkd"] = 1
    constexprs["stride_dvd"] = 1
    m, d, n = config.BLOCK_M, WIDE_HEAD_DIM, WIDE_BLOCK_KEYS
    types = {"desc_q": descriptor_type(dtype, m, d), "desc_do": descriptor_type(dtype, m, d),
             "desc_k": descriptor_type(dtype, n, d), "desc_v": descriptor_type(dtype, n, d),
             "DK": f"*{el}", "DV": f"*{el}", "LSE": "*fp32", "DELTA": "*fp32", "qk_scale": "fp32", "sm_scale": "fp32",
             "desc_dqa": descriptor_type(torch.float32, m, DQ_CHUNK, _fp32_tile_layout(m, DQ_CHUNK))
             if config.DQ_FUSED else descriptor_type(dtype, m, d)}
    return compile_kernel(_gluon_attn_bwd_wide_kernel, constexprs, types, ("DK", "DV", "LSE", "DELTA"),
                          config.maxnreg())
