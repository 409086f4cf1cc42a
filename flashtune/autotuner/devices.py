"""Which devices a search runs on: ``search(devices=...)`` and ``flashtune search --devices``.

``"all"`` is every CUDA device of the host; ``"0,2"`` or ``[0, 2]`` are CUDA device
indices; ``["cuda:0", "cuda:1"]`` names them. Without a GPU the search runs under the
Triton interpreter, and the host pretends to have ``FLASHTUNE_INTERPRETER_DEVICES``
devices (default 1), named ``cpu:0``, ``cpu:1``, ...: each is a worker process of its
own on CPU tensors, so the multi-device search is tested without a GPU.
"""

from __future__ import annotations

import os
from typing import Sequence

PRETEND_ENV = "FLASHTUNE_INTERPRETER_DEVICES"
# Each pretend device is a worker process: a bound keeps a typo from starting thousands.
MAX_PRETEND = 64


def pretend_count() -> int:
    """How many devices the interpreter pretends the host has."""
    value = os.environ.get(PRETEND_ENV, "1")
    try:
        count = int(value)  # past 4300 digits a ValueError too
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_PRETEND:
        shown = repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
        raise ValueError(f"{PRETEND_ENV}: expected an integer from 1 to {MAX_PRETEND}, got {shown}")
    return count


def _parse(devices) -> list:
    """The items of a ``devices`` argument: "all", ints, or device names."""
    if isinstance(devices, str):
        text = devices.strip()
        if text == "all":
            return ["all"]
        items: list = [part.strip() for part in text.split(",")]
        if not text or any(not part for part in items):
            raise ValueError(f"devices: expected 'all', device indices such as '0,1' or device names such as "
                             f"'cuda:0,cuda:1', got {devices!r}")
        return [int(part) if part.isdigit() else part for part in items]
    if isinstance(devices, Sequence) and not isinstance(devices, (bytes, bytearray)) and devices:
        return list(devices)
    raise ValueError(f"devices: expected 'all', a list of device indices or names, got {devices!r}")


def resolve_devices(devices, *, interpreter: bool | None = None) -> list[str]:
    """Device names ("cuda:N", or "cpu:N" under the interpreter) for a ``devices`` argument.

    ``interpreter``: None decides as ``resolve_device(None)`` does (the interpreter where
    torch sees no GPU). Raises ValueError naming ``devices`` for a malformed value, a
    device this host does not have, or a device given twice."""
    import torch

    items = _parse(devices)
    names = [item for item in items if isinstance(item, str) and item != "all"]
    if interpreter is None:
        interpreter = any(n.startswith("cpu") for n in names) or (
            not any(n.startswith("cuda") for n in names) and not torch.cuda.is_available())
    kind = "cpu" if interpreter else "cuda"
    count = pretend_count() if interpreter else torch.cuda.device_count()
    where = (f"under the interpreter this host pretends to have {count} (set {PRETEND_ENV}=N for N)"
             if interpreter else f"this host has {count} CUDA device{'' if count == 1 else 's'}")
    if not interpreter and count == 0:
        raise ValueError("devices: no CUDA GPU is available; run under the interpreter (device 'cpu') for a demo")
    if items == ["all"]:
        return [f"{kind}:{i}" for i in range(count)]
    out = []
    for item in items:
        index = _index(item, kind, devices)
        if not 0 <= index < count:
            raise ValueError(f"devices: device {item!r} does not exist: {where} "
                             f"({', '.join(f'{kind}:{i}' for i in range(count))})")
        name = f"{kind}:{index}"
        if name in out:
            raise ValueError(f"devices: {name} is given twice")
        out.append(name)
    return out


def _index(item, kind: str, devices) -> int:
    if isinstance(item, bool):
        raise ValueError(f"devices: expected device indices or names, got {devices!r}")
    if isinstance(item, int):
        return item
    if isinstance(item, str):
        head, _, tail = item.partition(":")
        if head == kind and tail.isdigit():
            return int(tail)
        if head in ("cpu", "cuda") and tail.isdigit():
            other = "the interpreter (cpu:N)" if head == "cpu" else "CUDA (cuda:N)"
            raise ValueError(f"devices: {item!r} is for {other}, the others are {kind}:N; give one kind")
    raise ValueError(f"devices: {item!r} is not a device: expected 'all', an index such as 0, or a name such as "
                     f"{kind}:0")


def worker_device(name: str) -> str:
    """The torch device a pretend interpreter device computes on (CPU tensors), or the CUDA device."""
    return "cpu" if name.startswith("cpu") else name
