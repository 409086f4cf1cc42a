"""``flashtune search`` and ``flashtune bench`` on a CUDA GPU (skipped without one).

One bf16 key, a few trials: the commands end to end on the GPU, with SDPA's cuDNN and
flash backends in the benchmark. The figures themselves are measured in benchmarks/,
not asserted here.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from flashtune.cli import cli
from flashtune.keys import GpuInfo

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
KEY = ["--head-dim", "64", "--dtype", "bfloat16", "--seq-len", "1024", "--causal", "--pass", "fwd"]


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="flashtune")


def test_search_then_bench_on_the_gpu(tmp_path):
    gpu = GpuInfo.from_device().key
    db = tmp_path / "tuned.db"
    out = _invoke("search", *KEY, "--trials", "3", "--db", db, "--storage", tmp_path / "journal.log")
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[2].split()[:6] == ["fwd", "bfloat16", "d64", "n1024", "causal", "tuned"]
    assert f"1 of 1 key tuned on {gpu}" in out.stdout
    assert "interpreter" not in out.stdout

    plot = tmp_path / "bench.png"
    out = _invoke("bench", *KEY, "--db", db, "--json", "--plot", plot)
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert (report["gpu"], report["interpreter"]) == (gpu, False)
    times = {m["impl"]: m["time_ms"] for m in report["measurements"]}
    assert set(times) == {"tuned", "default", "cudnn", "flash"}
    assert times["tuned"] > 0 and times["default"] > 0 and times["flash"] > 0
    assert report["measurements"][0]["note"] == "tuned exact"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
