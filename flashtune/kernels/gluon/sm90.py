"""What the Gluon kernels for sm_90 share: the Gluon dtypes, the TMA tiles' shared layouts and
descriptors, the bulk reduce-add, the heaviest-first tile walk, the dK/dV kernels' walk over
(query head, query block) steps and their Q/dO ring, the trace's stamps, and compiling a kernel for
sm_90 without a GPU. The configs and their limits are in flashtune/configs/gluon.py."""

from __future__ import annotations

import functools

import torch
import triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashtune.configs.gluon import CONSUMER_WARPS
from flashtune.kernels import launch
from flashtune.kernels.gluon import trace as kernel_trace

# the kernels' input dtypes as Gluon's
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv,
             torch.float8_e5m2: gl.float8e5}
# the same as the compile signatures spell them
SIGNATURE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8e4nv",
                    torch.float8_e5m2: "fp8e5"}


# ----------------------------------------------------------------------------------
# TMA tiles
# ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def tile_layout(rows: int, head_dim: int, dtype: torch.dtype):
    """The shared layout of a [1, 1, rows, head_dim] TMA tile (one head's rows); made once
    per (rows, head_dim, dtype): gluon builds it in about 6 us, three times per launch
    (the layout is a frozen dataclass, so sharing one object is safe)."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], GL_DTYPES[dtype])


@functools.lru_cache(maxsize=None)
def p_tile_layout(rows: int, cols: int, dtype: torch.dtype):
    """The shared layout of a [rows, cols] wgmma operand tile of ``dtype`` staged through shared
    memory (the forward's fp8 P, the backward's dS^T and P^T slots)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], GL_DTYPES[dtype])


def tma_addressable(t: torch.Tensor) -> bool:
    """Whether the copy engine can address ``t``: its last dim unit-stride, its base and other
    strides 16-byte aligned."""
    e = t.element_size()
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s > 0 and s * e % 16 == 0 for s in t.stride()[:-1])


def addressable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a dense copy of it where the copy engine cannot address it (a fresh copy:
    .contiguous() of a dense tensor off a 16-byte boundary is the same tensor). A copy is tensor
    work a launch plan does not repeat (kernels/launch.py): such a call runs its launcher every
    time."""
    if tma_addressable(t):
        return t
    launch.unplannable()
    return t.clone(memory_format=torch.contiguous_format)


def descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """The TMA descriptor of (B, H, N, D) ``t`` in [1, 1, rows, D] tiles."""
    D = t.shape[-1]
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, D], tile_layout(rows, D, t.dtype))


def kernel_inputs(q, k, v, do, lse2, delta) -> tuple:
    """The backward kernels' operands: q, k, v, dO as the copy engine can address them (a dense
    copy where not: such a call gets no launch plan) and the row statistics contiguous."""
    def contiguous(t):
        if not t.is_contiguous():
            launch.unplannable()
        return t.contiguous()

    return (*(addressable(t) for t in (q, k, v, do)), contiguous(lse2), contiguous(delta))


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """A TMA bulk reduce-add of shared-memory tile ``src`` into ``tensor_desc``'s tensor at
    ``coord`` (cp.reduce.async.bulk.tensor .add; completion as tma.store_wait counts it).
    Triton 3.6's Gluon builder has the op (``create_async_tma_reduce``), its Hopper ``tma``
    module no wrapper for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


# ----------------------------------------------------------------------------------
# Tile walks
# ----------------------------------------------------------------------------------
@gluon.jit
def lpt_tile(pid, n_blocks, n_units, LPT_UNITS):
    """(block, unit) of CTA ``pid`` of a 1-D grid of n_blocks x n_units CTAs. LPT_UNITS 0:
    blocks fastest (unit-major). Else heaviest first (kernels/schedule.py's lpt_group; the
    Triton kernels' triton.common.lpt_tile is the same walk): the units in groups of LPT_UNITS,
    within a group block 0 (the caller's heaviest: the dK/dV kernel's first key block, the
    forward's last query block) of every unit first, then block 1, and so on."""
    blk = pid % n_blocks
    unit = pid // n_blocks
    if LPT_UNITS > 0:
        per_group = n_blocks * LPT_UNITS
        group = pid // per_group
        units_here = gl.minimum(LPT_UNITS, n_units - group * LPT_UNITS)
        r = pid % per_group
        blk = r // units_here
        unit = group * LPT_UNITS + r % units_here
    return blk, unit


@gluon.jit
def walk_step(it, n_qb, first_qb, head0):
    """A dK/dV CTA's step ``it``: (query head, query block) of its heads x blocks."""
    return head0 + it // n_qb, first_qb + it % n_qb


@gluon.jit
def dkdv_tile(tile, n_kb, N_UNITS, LPT_UNITS, H_KV, GROUP, SPLIT_H, SPLIT_Q, N_Q, causal_off,
              CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Tile ``tile`` of a dK/dV kernel's n_kb x N_UNITS (a unit being one (batch, K/V head,
    split) in that order; the key block, of 2 x BLOCK_N keys, and the unit from the index,
    lpt_tile): (split, batch, K/V head, first key, first query block, query blocks per head,
    first query head, steps). The query blocks it walks, per query head of its share of the
    group: causal starts at the block of the first query that sees its first key (key <= query
    + causal_off); a split takes GROUP // SPLIT_H heads and one of SPLIT_Q chunks of the blocks."""
    kb, unit = lpt_tile(tile, n_kb, N_UNITS, LPT_UNITS)
    split = unit % (SPLIT_H * SPLIT_Q)
    off_hk = (unit // (SPLIT_H * SPLIT_Q)) % H_KV
    off_b = unit // (SPLIT_H * SPLIT_Q * H_KV)
    start_n = kb * (2 * BLOCK_N)
    end_qb = gl.cdiv(N_Q, BLOCK_M)
    first_qb = 0
    if CAUSAL:
        first_qb = gl.minimum(gl.maximum(start_n - causal_off, 0) // BLOCK_M, end_qb)
    chunk = gl.cdiv(end_qb - first_qb, SPLIT_Q)
    first_qb = gl.minimum(first_qb + (split % SPLIT_Q) * chunk, end_qb)
    n_qb = gl.minimum(chunk, end_qb - first_qb)
    heads = GROUP // SPLIT_H
    head0 = off_hk * GROUP + (split // SPLIT_Q) * heads
    return split, off_b, off_hk, start_n, first_qb, n_qb, head0, heads * n_qb


# ----------------------------------------------------------------------------------
# The trace's stamps (kernels/gluon/trace.py)
# ----------------------------------------------------------------------------------
T_HEAD = gl.constexpr(kernel_trace.HEAD)
T_GT_START = gl.constexpr(kernel_trace.H_GT_START)
T_CLK_START = gl.constexpr(kernel_trace.H_CLK_START)
T_SMID = gl.constexpr(kernel_trace.H_SMID)
T_PID = gl.constexpr(kernel_trace.H_PID)
T_CLK_Q = gl.constexpr(kernel_trace.H_CLK_Q)
T_CLK_BLOCKS = gl.constexpr(kernel_trace.H_CLK_BLOCKS)
T_CLK_END = gl.constexpr(kernel_trace.H_CLK_END)
T_GT_END = gl.constexpr(kernel_trace.H_GT_END)
T_N_BLOCKS = gl.constexpr(kernel_trace.H_N_BLOCKS)
T_TILE_I = gl.constexpr(kernel_trace.H_TILE_I)
T_LO = gl.constexpr(kernel_trace.H_LO)
T_CLK_LAST_V = gl.constexpr(kernel_trace.H_CLK_LAST_V)


@gluon.jit
def _clock():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _global_timer():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def stamp(trace, slot, TRACE: gl.constexpr):
    """TRACE: the SM's cycle counter into the partition's trace slot (one thread stores)."""
    if TRACE:
        gl.store(trace + slot, _clock())


@gluon.jit
def trace_start(trace, pid, n_blocks, tile_i, lo, TRACE: gl.constexpr):
    """TRACE: a tile's header at its start in this partition."""
    if TRACE:
        gl.store(trace + T_GT_START, _global_timer())
        gl.store(trace + T_CLK_START, _clock())
        smid = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.store(trace + T_SMID, smid.to(gl.int64))
        gl.store(trace + T_PID, gl.to_tensor(pid).to(gl.int64))
        gl.store(trace + T_N_BLOCKS, gl.to_tensor(n_blocks).to(gl.int64))
        gl.store(trace + T_TILE_I, gl.to_tensor(tile_i).to(gl.int64))
        gl.store(trace + T_LO, gl.to_tensor(lo).to(gl.int64))


@gluon.jit
def trace_end(trace, TRACE: gl.constexpr):
    if TRACE:
        gl.store(trace + T_CLK_END, _clock())
        gl.store(trace + T_GT_END, _global_timer())


@gluon.jit
def trace_slots(TRACE_PTR, TRACE_SLOTS, tile, part, TRACE: gl.constexpr):
    """The slots of (tile, partition) in the trace (its [tiles, 3, slots] layout)."""
    if TRACE:
        return TRACE_PTR + (gl.to_tensor(tile).to(gl.int64) * 3 + part) * TRACE_SLOTS
    else:
        return TRACE_PTR


# ----------------------------------------------------------------------------------
# The dK/dV kernels' Q/dO ring (the D=64/128 kernel's and the D=256 one's)
# ----------------------------------------------------------------------------------
T_STEP = gl.constexpr(kernel_trace.BACKWARD.events)  # trace slots per step


@gluon.jit
def load_q_do_ring(desc_q, desc_do, q_bufs, do_bufs, q_ready, do_ready, q_empty, off_b, first_qb, n_qb, n_steps,
                   head0, trace, BLOCK_M: gl.constexpr, NUM_BUFFERS: gl.constexpr, TRACE: gl.constexpr):
    """The producer's steps: each step's Q and dO tiles into ring slot it % NUM_BUFFERS once the
    consumers have freed it (``trace`` is read only with TRACE)."""
    for it in range(n_steps):
        h, qb = walk_step(it, n_qb, first_qb, head0)
        s = it % NUM_BUFFERS
        ev = trace + T_HEAD + T_STEP * it
        stamp(ev, 0, TRACE)
        # a fresh mbarrier counts as having completed the phase before its first
        mbarrier.wait(q_empty.index(s), ((it // NUM_BUFFERS) & 1) ^ 1)
        stamp(ev, 1, TRACE)
        mbarrier.expect(q_ready.index(s), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [off_b, h, qb * BLOCK_M, 0], q_ready.index(s), q_bufs.index(s))
        mbarrier.expect(do_ready.index(s), desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_do, [off_b, h, qb * BLOCK_M, 0], do_ready.index(s), do_bufs.index(s))
        stamp(ev, 2, TRACE)
    trace_end(trace, TRACE)


# ----------------------------------------------------------------------------------
# Compiling for sm_90 without a GPU (tests/kernels/gluon_compile_sm90.py)
# ----------------------------------------------------------------------------------
def descriptor_type(dtype: torch.dtype, rows: int, cols: int, layout=None) -> str:
    """A compile signature's type of a [1, 1, rows, cols] TMA descriptor of ``dtype``
    (float32 included; ``layout`` None: tile_layout's)."""
    name = "fp32" if dtype == torch.float32 else SIGNATURE_DTYPES[dtype]
    return f"tensordesc<{name}[1,1,{rows},{cols}],{layout if layout is not None else tile_layout(rows, cols, dtype)!r}>"


def compile_kernel(fn, constexprs: dict, types: dict, aligned: tuple[str, ...], maxnreg: int):
    """Compile Gluon kernel ``fn`` for sm_90 (ptxas; no GPU needed): ``constexprs`` its
    constexpr arguments, ``types`` the signature types of the others (i32 where not named), the
    pointers ``aligned`` and every stride 16-divisible, as a launch on contiguous inputs
    specialises them; returns triton's CompiledKernel (``.metadata.shared``, ``.asm``)."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = types.get(name, "i32")
            if name in aligned or name.startswith("stride"):
                attrs[(i, )] = [["tt.divisibility", 16]]
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": CONSUMER_WARPS, "maxnreg": maxnreg})
