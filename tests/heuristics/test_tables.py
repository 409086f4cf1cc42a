"""The heuristic tables as data: the files under flashtune/heuristics/tables/ load to the tables the
kernels were tuned with, entry for entry and in order (golden_tables.json holds each entry's full
JSON form as the tables had it when they moved out of the code), and every entry says why."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from flashtune.configs import BwdConfig, FwdConfig
from flashtune.heuristics import tables

GOLDEN = json.loads((pathlib.Path(__file__).parent / "golden_tables.json").read_text())
RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"
NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float8_e4m3fn: "fp8"}
ARCHS = {(9, 0): "sm90", (0, 0): "generic"}


def _text(key: tuple) -> str:
    words = [NAMES[key[0]], str(key[1])]
    rest = list(key[2:])
    if rest[:2] == ["decode", "full"]:
        words.append("decode-fills")
        rest = rest[2:]
    words += [r if isinstance(r, str) else ("causal" if r else "full") for r in rest]
    return " ".join(words)


@pytest.mark.parametrize("cap", sorted(ARCHS))
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_the_data_files_hold_the_golden_tables_entry_for_entry(cap, pass_):
    table = tables.HEURISTICS[cap][0 if pass_ == "fwd" else 1]
    cls = FwdConfig if pass_ == "fwd" else BwdConfig
    loaded = [[_text(key), cfg.to_dict()] for key, cfg in table.items()]
    assert loaded == GOLDEN[f"{ARCHS[cap]} {pass_}"]
    assert all(type(cfg) is cls for cfg in table.values())


def test_every_entry_says_why_and_names_a_result_file_that_exists():
    for cap, pair in tables.ENTRIES.items():
        for table in pair:
            for key, entry in table.items():
                assert entry.why.strip(), key
                if entry.evidence:
                    assert list(RESULTS.glob(f"{entry.evidence}.*")), (key, entry.evidence)


@pytest.mark.parametrize("text, key", [
    ("bf16 128", (torch.bfloat16, 128)),
    ("bf16 64 causal", (torch.bfloat16, 64, True)),
    ("bf16 128 decode-fills", (torch.bfloat16, 128, "decode", "full")),
    ("fp8 128 long", (torch.float8_e4m3fn, 128, "long")),
    ("bf16 64 mid full", (torch.bfloat16, 64, "mid", False)),
])
def test_keys_read_as_the_lookup_builds_them(text, key):
    assert tables.parse_key(text) == key


@pytest.mark.parametrize("text", ["bf16", "f16 64", "bf16 64 sideways", "bf16 64 long causal extra", "bf16 x64"])
def test_a_bad_key_is_named(text):
    with pytest.raises(ValueError, match="heuristic table key"):
        tables.parse_key(text)
