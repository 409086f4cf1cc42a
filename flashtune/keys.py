"""The tuning key and the identity of a GPU.

A tuned result belongs to one ``TuningKey``: (gpu, dtype, head_dim, seq_len, causal,
pass). ``gpu`` is the device name plus compute capability, so an H100 and an H200 are
different keys even though they share a compute die.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

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


@dataclasses.dataclass(frozen=True, order=True)
class TuningKey:
    """One point of the tuning space."""

    gpu: str
    dtype: str
    head_dim: int
    seq_len: int
    causal: bool
    pass_: str  # "fwd" or "bwd" ("pass" is a keyword)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.pass_ not in PASSES:
            raise ValueError(f"pass: expected 'fwd' or 'bwd', got {self.pass_!r}")
        if not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise ValueError(f"head_dim: expected a positive integer, got {self.head_dim!r}")
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {self.seq_len!r}")

    @property
    def mask(self) -> str:
        return mask_name(self.causal)

    @property
    def family(self) -> tuple[str, str, int, bool, str]:
        """Everything but seq_len: the search's warm start and the dispatcher's nearest-key
        lookup both stay inside one family."""
        return (self.gpu, self.dtype, self.head_dim, self.causal, self.pass_)

    def label(self) -> str:
        return f"{self.pass_} {self.dtype} d{self.head_dim} n{self.seq_len} {self.mask}"

    def as_dict(self, *, gpu: bool = True) -> dict[str, Any]:
        """The key as JSON (``"pass"`` for ``pass_``): in exports, CLI output and reports.
        ``gpu=False`` leaves the GPU out (an export entry's GPU is its table's)."""
        out = {"gpu": self.gpu} if gpu else {}
        return {**out, "dtype": self.dtype, "head_dim": self.head_dim, "seq_len": self.seq_len,
                "causal": self.causal, "pass": self.pass_}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, gpu: str | None = None) -> "TuningKey":
        """The key of ``as_dict``'s form (``gpu`` given when the dict has none)."""
        return cls(data["gpu"] if gpu is None else gpu, data["dtype"], data["head_dim"], data["seq_len"],
                   data["causal"], data["pass"])


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")
