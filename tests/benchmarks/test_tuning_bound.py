"""benchmarks/tuning_bound.py: the backward's fastest config found by halves, and a smoke run."""

from __future__ import annotations

import itertools
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from flashtune.configs.backward import BwdConfig
from flashtune.configs.space import BWD_SPACE

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "tuning_bound.py"


@pytest.fixture(scope="module")
def bound(script):
    return script("tuning_bound")


class AdditiveTimes:
    """Stands in for Measured: a plain config's time is its dK/dV half's plus its dQ half's
    (two independent kernels), an atomic config's its own; counts what it was asked."""

    def __init__(self, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.cost = {}
        self.gen = gen
        self.times, self.asked = {}, set()

    def _draw(self, what) -> float:
        if what not in self.cost:
            self.cost[what] = float(torch.rand((), generator=self.gen)) + 0.1
        return self.cost[what]

    def time_of(self, c: BwdConfig) -> float:
        dkdv = (c.BLOCK_M1, c.BLOCK_N1, c.num_warps, c.num_stages, c.tma)
        if c.atomic_dq:
            return 0.5 * self._draw(("atomic", *dkdv))
        return self._draw(("dkdv", *dkdv)) + self._draw(("dq", c.BLOCK_M2, c.BLOCK_N2, c.dq_num_warps,
                                                          c.dq_num_stages, c.tma))

    def __call__(self, configs) -> dict:
        out = {}
        for c in configs:
            c = c.canonical()
            self.asked.add(c)
            self.times[c] = out[c] = self.time_of(c)
        return out


@pytest.mark.parametrize("seed", range(5))
def test_the_backward_by_halves_finds_the_fastest_config_of_the_space(bound, seed):
    space = dict(BWD_SPACE, BLOCK_M1=[16, 32], BLOCK_N1=[32, 64], num_stages=[1, 2], dq_num_stages=[1, 2])
    valid = list(dict.fromkeys(BwdConfig(**dict(zip(space, v))).canonical()
                               for v in itertools.product(*space.values())))
    times = AdditiveTimes(seed)
    default = valid[len(valid) // 2]
    found = bound.search_space_bwd(valid, default, times)
    truth = min(valid, key=times.time_of)
    assert found == truth
    assert len(times.asked) < len(valid) / 3  # far fewer than the whole space


def test_smoke_run_under_the_interpreter(tmp_path):
    out = tmp_path / "bound.json"
    space = {"BLOCK_M1": [16], "BLOCK_N1": [16, 32], "BLOCK_M2": [16, 32], "BLOCK_N2": [16], "num_warps": [4],
             "num_stages": [1], "dq_num_warps": [4], "dq_num_stages": [1], "atomic_dq": [0, 1], "tma": [0, 1]}
    single = {"BLOCK_M1": 16, "BLOCK_N1": 16, "BLOCK_M2": 16, "BLOCK_N2": 16, "num_warps": 4, "num_stages": 1}
    done = subprocess.run([sys.executable, str(SCRIPT), "--pass", "bwd", "--device", "cpu", "--dtype", "float16",
                           "--head-dim", "16", "--seq-len", "33", "--causal", "yes", "--rounds", "1",
                           "--space", json.dumps(space), "--single", json.dumps(single), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["failed"] == 0 and row["measured"] >= 10
    assert set(row["times_ms"]) == {"fastest", "default", "single"}
    fastest = BwdConfig.from_dict(row["fastest"])
    assert all(getattr(fastest, f) in space[f] for f in space)
    assert result["summary"]["keys"] == 1 and result["summary"]["single_vs_fastest"] > 0
    assert "interpreter" in result["timer"]


def test_unknown_space_fields_are_named(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--pass", "fwd", "--device", "cpu", "--space",
                           '{"BLOCK_Q": [16]}'], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "BLOCK_Q" in done.stderr and "Traceback" not in done.stderr


def test_quick_forward_sweep_retimes_its_finalists(tmp_path):
    out = tmp_path / "bound.json"
    space = {"BLOCK_M": [16, 32], "BLOCK_N": [16], "num_warps": [4], "num_stages": [1], "tma": [0]}
    done = subprocess.run([sys.executable, str(SCRIPT), "--pass", "fwd", "--device", "cpu", "--dtype", "float16",
                           "--head-dim", "16", "--seq-len", "40", "--causal", "no", "--rounds", "1", "--quick",
                           "--finalists", "2", "--space", json.dumps(space), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["measured"] >= 2 and row["failed"] == 0  # the space, and the default it is compared with
    assert row["fastest"]["BLOCK_M"] in (16, 32) and set(row["times_ms"]) == {"fastest", "default"}
    assert row["single_vs_fastest"] is None and row["default_vs_fastest"] > 0


def test_shape_file_rows_are_bounded_at_their_own_shape(tmp_path):
    """--shapes: a shape file's rows of the pass, each key once at its first row's (B, Hq, Hkv);
    a file without a row of the pass is refused with the file named."""
    rows = [{"B": 3, "Hq": 4, "Hkv": 2, "Nq": 1, "Nk": 40, "D": 16, "dtype": "float16", "name": "decode"},
            {"B": 3, "Hq": 4, "Hkv": 2, "Nq": 1, "Nk": 40, "D": 16, "dtype": "float16", "name": "same key"},
            {"B": 1, "Hq": 2, "Hkv": 2, "Nq": 24, "D": 16, "dtype": "float16", "passes": "bwd", "name": "train"}]
    shapes = tmp_path / "rows.json"
    shapes.write_text(json.dumps(rows))
    out = tmp_path / "bound.json"
    space = {"BLOCK_M": [16], "BLOCK_N": [16, 32], "num_warps": [4], "num_stages": [1], "tma": [0],
             "num_splits": [0, 2], "pack_gqa": [-1]}
    done = subprocess.run([sys.executable, str(SCRIPT), "--pass", "fwd", "--device", "cpu", "--shapes", str(shapes),
                           "--rounds", "1", "--space", json.dumps(space), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["seq_len"], row["seq_k"], row["shape"]) == (1, 40, [3, 4, 2])
    assert row["measured"] >= 4 and row["failed"] == 0
    shapes.write_text(json.dumps(rows[2:]))
    done = subprocess.run([sys.executable, str(SCRIPT), "--pass", "fwd", "--device", "cpu", "--shapes", str(shapes)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "no row" in done.stderr and "Traceback" not in done.stderr
