"""The heuristic tables, read from the data files beside this module (tables/<arch>.toml).

Each architecture's file holds a forward and a backward table; an entry maps a key (dtype, padded
head dim, and optionally a band and a masking) to a config, with the reason it was chosen and the
result file that supports it. The tables are read once, at import.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from typing import Any

import torch

from flashtune.configs.backward import BwdConfig
from flashtune.configs.base import ConfigError
from flashtune.configs.forward import FwdConfig

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# the data file of each architecture, newest first; (0, 0) serves every other device and the interpreter
ARCHITECTURES = {(9, 0): "sm90", (0, 0): "generic"}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}
BANDS = ("decode", "long", "mid")
MASKINGS = {"causal": True, "full": False}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One table entry: the config, why it was chosen, and the id of its result file (or '')."""

    config: Any
    why: str
    evidence: str = ""


def parse_key(text: str) -> tuple:
    """``"bf16 128 long causal"`` -> (torch.bfloat16, 128, "long", True); "decode-fills" reads as
    ("decode", "full"), the key of decode calls that fill the SMs."""
    words = text.split()
    if len(words) < 2 or words[0] not in DTYPES or not words[1].isdigit():
        raise ValueError(f"heuristic table key {text!r}: expected '<dtype> <head dim> [band] [masking]' with dtype "
                         f"one of {sorted(DTYPES)}")
    key: list = [DTYPES[words[0]], int(words[1])]
    rest = words[2:]
    if rest and rest[0] == "decode-fills":
        key += ["decode", "full"]
        rest = rest[1:]
    elif rest and rest[0] in BANDS:
        key.append(rest[0])
        rest = rest[1:]
    if rest and rest[0] in MASKINGS:
        key.append(MASKINGS[rest[0]])
        rest = rest[1:]
    if rest:
        raise ValueError(f"heuristic table key {text!r}: unexpected {' '.join(rest)!r}")
    return tuple(key)


def _read(name: str) -> tuple[dict, dict]:
    data = tomllib.loads(resources.files(__package__).joinpath("tables", f"{name}.toml").read_text())
    out = []
    for pass_, cls in (("fwd", FwdConfig), ("bwd", BwdConfig)):
        table = {}
        for text, entry in data.get(pass_, {}).items():
            try:
                table[parse_key(text)] = Entry(cls.from_dict(entry["config"]), entry["why"],
                                               entry.get("evidence", ""))
            except (ConfigError, KeyError, TypeError) as e:
                raise ValueError(f"tables/{name}.toml [{pass_}] {text!r}: {e}") from e
        out.append(table)
    return out[0], out[1]


ENTRIES: dict[tuple[int, int], tuple[dict, dict]] = {cap: _read(name) for cap, name in ARCHITECTURES.items()}
# capability -> (fwd table, bwd table) of configs; fp16 shares bf16's entries, e5m2 e4m3's
HEURISTICS: dict[tuple[int, int], tuple[dict, dict]] = {
    cap: tuple({k: e.config for k, e in table.items()} for table in tables) for cap, tables in ENTRIES.items()}
