"""The tuning key and the identity of a GPU.

A tuned result belongs to one ``TuningKey``: (gpu, dtype, head_dim, seq_q, seq_k, causal,
pass, group, batch_heads). ``gpu`` is the device name plus compute capability, so an H100
and an H200 are different keys even though they share a compute die; seq_q and seq_k tell a
decode step, a chunked prefill and a cross-attention from a square call; group (query heads
per key/value head) and the batch x heads bucket tell a B=1 grouped-query prefill from a
batch-64 training step.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime
from typing import Any, Mapping

from flashtune.protocol import grid_shape

PASSES: tuple[str, ...] = ("fwd", "bwd")
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
# how a key's masking is written in labels, names and tables: causal=False, causal=True
MASKS: tuple[str, str] = ("full", "causal")


def mask_name(causal: bool) -> str:
    """``"causal"`` or ``"full"``."""
    return MASKS[bool(causal)]


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """What identifies a GPU for tuning, and what we record about it."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    total_memory: int  # bytes

    @property
    def key(self) -> str:
        """The GPU part of a tuning key, e.g. ``"NVIDIA H200@sm90"``."""
        return f"{self.name}@sm{self.capability[0]}{self.capability[1]}"

    @classmethod
    def from_device(cls, device=None) -> "GpuInfo":
        """Describe a CUDA device, or the CPU running the Triton interpreter."""
        import torch

        dev = torch.device(device) if device is not None else None
        if dev is None or dev.type == "cuda":
            if not torch.cuda.is_available():
                return cls.interpreter()
            props = torch.cuda.get_device_properties(dev if dev is not None else torch.cuda.current_device())
            return cls(
                name=props.name,
                capability=(props.major, props.minor),
                sm_count=props.multi_processor_count,
                total_memory=props.total_memory,
            )
        return cls.interpreter()

    @classmethod
    def interpreter(cls) -> "GpuInfo":
        """The pseudo-GPU of the Triton interpreter (CPU tensors, TRITON_INTERPRET=1)."""
        import os

        return cls(name="triton-interpreter", capability=(0, 0), sm_count=os.cpu_count() or 1, total_memory=0)


# How a key's batch x query heads is bucketed: to the nearest power of two in log space
# (a tie goes up). The best config follows the number of programs per SM, which moves in
# steps of whole waves; between a B*H and its double the program count doubles too, so one
# bucket per factor of two keeps the keys of a model's batch sizes apart (B=1, 16, 64) while
# B*H = 24 and 32 share one.
def batch_heads_bucket(batch_heads: int) -> int:
    """``batch * heads_q`` rounded to the nearest power of two in log2 space (ties up)."""
    if not isinstance(batch_heads, int) or isinstance(batch_heads, bool) or batch_heads < 1:
        raise ValueError(f"batch_heads: expected a positive integer, got {batch_heads!r}")
    low = 1 << (batch_heads.bit_length() - 1)
    # log2(x / low) < log2(2 low / x)  <=>  x * x < 2 low * low
    return low if batch_heads * batch_heads < 2 * low * low else 2 * low


INTERPRETER_GPU = "triton-interpreter@sm00"


def grid_batch_heads(gpu: str, head_dim: int, seq_len: int) -> int:
    """The batch x heads bucket of the standard grid's shape for (head_dim, seq_len)
    (``protocol.grid_shape``; the interpreter's demo shape for the interpreter): what a key
    written before the key had that dimension (schema 0001, export format 1) was tuned at."""
    batch, heads = grid_shape(head_dim, seq_len, interpreter=gpu == INTERPRETER_GPU)
    return batch_heads_bucket(batch * heads)


_POSITIVE = ("head_dim", "seq_q", "seq_k", "group", "batch_heads")


@dataclasses.dataclass(frozen=True, order=True)
class TuningKey:
    """One point of the tuning space: the GPU, dtype, head dim, the query and key lengths,
    causal, the pass, the grouped-query ratio (query heads per key/value head) and the
    bucket of batch x query heads (``batch_heads_bucket``).

    ``TuningKey(gpu, dtype, head_dim, seq_len, causal, pass_)`` is a key of the standard
    grid: seq_k = seq_q, group 1, the grid's batch x heads. ``for_call`` makes the key of
    one attention call's shape.
    """

    gpu: str
    dtype: str
    head_dim: int
    seq_q: int
    causal: bool
    pass_: str  # "fwd" or "bwd" ("pass" is a keyword)
    seq_k: int = 0  # 0: seq_q
    group: int = 1
    batch_heads: int = 0  # 0: the grid's bucket for (head_dim, seq_q)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.pass_ not in PASSES:
            raise ValueError(f"pass: expected 'fwd' or 'bwd', got {self.pass_!r}")
        if self.seq_k == 0:
            object.__setattr__(self, "seq_k", self.seq_q)
        if isinstance(self.head_dim, int) and isinstance(self.seq_q, int) and self.batch_heads == 0 \
                and self.head_dim >= 1 and self.seq_q >= 1:
            object.__setattr__(self, "batch_heads", grid_batch_heads(self.gpu, self.head_dim, self.seq_q))
        for name in _POSITIVE:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal: expected true or false, got {self.causal!r}")
        if self.batch_heads != batch_heads_bucket(self.batch_heads):
            raise ValueError(f"batch_heads: expected a power of two (the bucket of batch x query heads), "
                             f"got {self.batch_heads!r}")

    @classmethod
    def for_call(cls, gpu: str, dtype: str, *, batch: int, heads_q: int, heads_kv: int, seq_q: int, seq_k: int,
                 head_dim: int, causal: bool, pass_: str) -> "TuningKey":
        """The key of one attention call: q (batch, heads_q, seq_q, head_dim), k/v (batch, heads_kv, seq_k, ...)."""
        if heads_kv < 1 or heads_q % heads_kv:
            raise ValueError(f"heads_kv: expected a divisor of heads_q ({heads_q}), got {heads_kv!r}")
        return cls(gpu, dtype, head_dim, seq_q, causal, pass_, seq_k=seq_k, group=heads_q // heads_kv,
                   batch_heads=batch_heads_bucket(batch * heads_q))

    @classmethod
    def for_shape(cls, gpu: str, shape, pass_: str) -> "TuningKey":
        """The key of a ``flashtune.shapes.Shape``'s call of one pass."""
        return cls.for_call(gpu, shape.dtype, batch=shape.batch, heads_q=shape.heads_q, heads_kv=shape.heads_kv,
                            seq_q=shape.seq_q, seq_k=shape.seq_k, head_dim=shape.head_dim, causal=shape.causal,
                            pass_=pass_)

    @property
    def mask(self) -> str:
        return mask_name(self.causal)

    @property
    def family(self) -> tuple[str, str, int, bool, str]:
        """What a key shares with the keys whose configs may stand in for it: the search's
        warm start and the dispatcher's nearest-key lookup both stay inside one family."""
        return (self.gpu, self.dtype, self.head_dim, self.causal, self.pass_)

    @property
    def point(self) -> tuple[int, int, int, int]:
        """The numeric dimensions within a family, compared in log2 space: (seq_q, seq_k,
        group, batch_heads)."""
        return (self.seq_q, self.seq_k, self.group, self.batch_heads)

    @property
    def is_grid(self) -> bool:
        """A key of the standard grid's form (square, no grouped heads, the grid's batch x heads)."""
        return (self.seq_k == self.seq_q and self.group == 1
                and self.batch_heads == grid_batch_heads(self.gpu, self.head_dim, self.seq_q))

    def trial_shape(self, *, interpreter: bool = False) -> tuple[int, int, int]:
        """(batch, heads_q, heads_kv) a search times this key at: batch x heads_q close to
        ``batch_heads``, heads_q = group x heads_kv. On a GPU the heads fill the grid's model
        width (2048 / head_dim) where the bucket allows, so a grid key runs the grid's shape;
        under the interpreter at most 2 query heads per group (tiny shapes)."""
        width = grid_shape(self.head_dim, self.seq_q, interpreter=interpreter)[1]  # the grid's heads
        heads_kv = max(1, min(self.batch_heads, width) // self.group)
        heads_q = self.group * heads_kv
        return max(1, self.batch_heads // heads_q), heads_q, heads_kv

    def label(self) -> str:
        lengths = f"n{self.seq_q}" if self.seq_k == self.seq_q else f"q{self.seq_q} k{self.seq_k}"
        extra = "" if self.is_grid else f" g{self.group} bh{self.batch_heads}"
        return f"{self.pass_} {self.dtype} d{self.head_dim} {lengths} {self.mask}{extra}"

    def as_dict(self, *, gpu: bool = True) -> dict[str, Any]:
        """The key as JSON (``"pass"`` for ``pass_``): in exports, CLI output, reports and the
        store's columns. ``gpu=False`` leaves the GPU out (an export entry's GPU is its table's)."""
        out = {"gpu": self.gpu} if gpu else {}
        return {**out, "dtype": self.dtype, "head_dim": self.head_dim, "seq_q": self.seq_q, "seq_k": self.seq_k,
                "group": self.group, "batch_heads": self.batch_heads, "causal": self.causal, "pass": self.pass_}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, gpu: str | None = None) -> "TuningKey":
        """The key of ``as_dict``'s form (``gpu`` given when the dict has none). The form
        written before the key had seq_k, group and batch_heads (``seq_len``: a grid key)
        reads as the grid key it was."""
        gpu = data["gpu"] if gpu is None else gpu
        if "seq_len" in data and "seq_q" not in data:
            return cls(gpu, data["dtype"], data["head_dim"], data["seq_len"], data["causal"], data["pass"])
        return cls(gpu, data["dtype"], data["head_dim"], data["seq_q"], data["causal"], data["pass"],
                   seq_k=data["seq_k"], group=data["group"], batch_heads=data["batch_heads"])


def key_distance(a: TuningKey, b: TuningKey) -> float:
    """How far apart two keys of one family are: the squared distance of their points
    (seq_q, seq_k, group, batch_heads) in log2 space (a factor of two in one dimension is 1)."""
    return sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a.point, b.point))


_POINT = ("seq_q", "seq_k", "group", "batch_heads")


def neighbour_gap(tuned: TuningKey, wanted: TuningKey) -> str | None:
    """Why ``tuned``'s config does not carry over to a call of key ``wanted``, or None where it does.

    The rule: a tuned key of the same family serves a call of another key only if, in every
    dimension of the point (seq_q, seq_k, group, batch_heads), the two are within a factor of 2
    (|log2 ratio| <= 1); if both group 1 (one query head per K/V head) or both group 2 and up;
    and if both decode (seq_q 1) or neither. Else the heuristic default serves the call.

    Why: a tuned config is the winner measured at its own point, and the heuristic defaults are
    chosen per band of lengths, head dims and batch x heads; far from its point a tuned winner is
    no better a guess than they are (a 71-group MQA prefill, N=3000, D=64, causal, served from the
    nearest tuned key at any distance ran 1.00x the best SDPA backend where the heuristic default
    ran 1.09x). Grouped heads are packed as rows of one tile where a head's queries do not fill it
    (kernels/triton/decode.py), one query head per K/V head never is, so their configs are tuned
    for other tiles; a decode step (one query per head) reads all of K and V, bound by memory,
    where a prefill is bound by its matmuls. The factor 2 agrees with recording
    (``recording.bucket_key``): a bucket holds the calls whose lengths round to its powers of two
    in log2 space (within a factor of sqrt 2 of them), its group and its batch x heads bucket, and
    seq_q 1 alone, so every call of a bucket carries over from the bucket's tuned key, and any
    two keys of one bucket are less than a factor 2 apart (a call in the bucket of a served row,
    which recording does not note, has a tuned key to serve it).
    """
    if tuned.family != wanted.family:
        return f"another family ({tuned.label()} for {wanted.label()})"
    if (tuned.seq_q == 1) != (wanted.seq_q == 1):
        return (f"a decode key (seq_q 1) for a call of {wanted.seq_q} queries" if tuned.seq_q == 1 else
                f"a key of {tuned.seq_q} queries for a decode call (seq_q 1)")
    if (tuned.group > 1) != (wanted.group > 1):
        return (f"group {tuned.group} for a call of group {wanted.group} (grouped heads pack into one tile, "
                "a single head per K/V head does not)")
    for name, have, want in zip(_POINT, tuned.point, wanted.point):
        if max(have, want) > 2 * min(have, want):
            return f"{name} {have} for a call of {want}, more than a factor of 2 apart"
    return None


def carries_over(tuned: TuningKey, wanted: TuningKey) -> bool:
    """Whether ``tuned``'s config may serve a call of key ``wanted`` (``neighbour_gap``'s rule)."""
    return neighbour_gap(tuned, wanted) is None


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True)
class RecordedCall:
    """A call signature the dispatcher served without a tuned key of its own, as recorded
    (flashtune.recording) and stored."""

    key: TuningKey
    batch: int
    heads_q: int
    heads_kv: int
    calls: int
    first_seen: datetime | None = None
    last_seen: datetime | None = None
