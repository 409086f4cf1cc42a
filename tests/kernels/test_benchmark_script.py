"""The pieces of benchmarks/attention.py that need no GPU: FLOPs, grid, configs, table."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "attention.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("attention")


def test_flops(bench):
    # D=128, N=4096: B=4, H=16 -> 4 * 4 * 16 * 4096^2 * 128 = 549.76 GFLOP forward
    assert bench.grid_shape(128, 4096) == (4, 16)
    fwd = bench.attention_flops("fwd", 4, 16, 4096, 128, causal=False)
    assert fwd == 4 * 4 * 16 * 4096 ** 2 * 128 == 549755813888
    assert bench.attention_flops("fwd", 4, 16, 4096, 128, causal=True) == fwd / 2
    assert bench.attention_flops("bwd", 4, 16, 4096, 128, causal=False) == 2.5 * fwd
    assert bench.attention_flops("bwd", 4, 16, 4096, 128, causal=True) == 1.25 * fwd
    # the standard grid keeps the work per N constant in tokens: FLOPs grow linearly in N
    f = [bench.attention_flops("fwd", *bench.grid_shape(64, n), n, 64, False) for n in (512, 1024)]
    assert f[1] == 2 * f[0]
    with pytest.raises(ValueError):
        bench.attention_flops("both", 1, 1, 1, 1, False)


def test_tflops_ratio_geomean(bench):
    assert bench.tflops(1e12, 1.0) == pytest.approx(1000.0)  # 1 TFLOP in 1 ms
    assert bench.tflops(1e12, None) is None
    assert bench.ratio(2.0, 4.0) == 0.5 and bench.ratio(None, 4.0) is None and bench.ratio(1.0, None) is None
    assert bench.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert bench.geomean([None, 3.0]) == pytest.approx(3.0)
    assert bench.geomean([]) is None


def test_pick_config_most_specific_wins(bench, tmp_path):
    fwd_any = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    fwd_d128 = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    fwd_exact = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2}
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({"entries": [
        {"fwd": fwd_any},
        {"head_dim": 128, "fwd": fwd_d128},
        {"head_dim": 128, "seq_len": 4096, "causal": True, "dtype": "bf16", "fwd": fwd_exact},
    ]}))
    entries = bench.load_configs(str(path))
    pick = bench.pick_config
    assert pick(entries, "fwd", head_dim=128, seq_len=4096, causal=True, dtype="bfloat16") == fwd_exact
    assert pick(entries, "fwd", head_dim=128, seq_len=4096, causal=False, dtype="bf16") == fwd_d128
    assert pick(entries, "fwd", head_dim=128, seq_len=4096, causal=True, dtype="fp16") == fwd_d128
    assert pick(entries, "fwd", head_dim=64, seq_len=512, causal=False, dtype="bf16") == fwd_any
    assert pick(entries, "bwd", head_dim=64, seq_len=512, causal=False, dtype="bf16") is None


def test_load_configs_rejects_unknown_keys(bench, tmp_path):
    path = tmp_path / "configs.json"
    path.write_text(json.dumps([{"headdim": 64}]))
    with pytest.raises(SystemExit, match="unknown keys"):
        bench.load_configs(str(path))


def test_table_and_summary(bench):
    row = bench.Row("fwd", 128, 4096, 4, 16, True, "bf16", 2.0e12, config={"BLOCK_M": 128, "BLOCK_N": 64})
    row.tflops = {"flashtune": 400.0, "cudnn": 500.0, "flash": 320.0}
    assert row.ratios() == {"cudnn": 0.8, "flash": 1.25}
    line = bench.format_row(row)
    assert "400.0" in line and "0.800" in line and "1.250" in line
    assert len(bench.TABLE_HEADER.split("|")) == len(line.split("|"))
    aborted = bench.Row("bwd", 64, 512, 32, 32, False, "bf16", 1.0, error="flashtune disagrees with cuDNN: o")
    assert "ABORTED" in bench.format_row(aborted)
    row2 = bench.Row("fwd", 64, 512, 32, 32, False, "bf16", 1.0)
    row2.tflops = {"flashtune": 100.0, "cudnn": 400.0, "flash": 100.0}
    summary = bench.summarize([row, row2, aborted])
    assert summary["fwd"]["cudnn"] == pytest.approx(math.sqrt(0.8 * 0.25))
    assert summary["fwd"]["flash"] == pytest.approx(math.sqrt(1.25 * 1.0))
    assert summary["fwd"]["rows"] == 2 and "bwd" not in summary  # aborted rows are left out
    assert "vs cuDNN" in bench.format_summary(summary)


def test_args(bench):
    args = bench.parse_args(["--quick"])
    assert args.seq_lens == [1024, 4096] and args.head_dims == [64, 128] and args.dtype == "bf16"
    assert bench.parse_args([]).seq_lens == [512, 1024, 2048, 4096, 8192, 16384]
    with pytest.raises(SystemExit):
        bench.parse_args(["--seq-lens", "1000"])


def test_help_runs_as_a_script():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], check=False, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--quick" in out.stdout and "--configs" in out.stdout and "--out" in out.stdout



def test_rounds_interleave_the_backends_and_keep_each_ones_median(bench, capsys):
    calls = []
    slow = {("cudnn", "fwd", 1): 9.0}  # one slow moment, in round 1

    def time_one(run, pass_):
        r = sum(1 for c in calls if c[:2] == (run, pass_))
        calls.append((run, pass_, r))
        if run == "flash" and pass_ == "bwd":
            raise RuntimeError("no kernel for this shape")
        return slow.get((run, pass_, r), {"flashtune": 1.0, "cudnn": 2.0, "flash": 3.0}[run] + 0.01 * r)

    runners = {name: name for name in ("flashtune", "cudnn", "flash")}
    times = bench.time_rounds(runners, ["fwd", "bwd"], 3, time_one)
    # round by round, every backend and pass once; the failing one is not tried again
    assert [c[:2] for c in calls[:6]] == [("flashtune", "fwd"), ("flashtune", "bwd"), ("cudnn", "fwd"),
                                          ("cudnn", "bwd"), ("flash", "fwd"), ("flash", "bwd")]
    assert len(calls) == 6 + 5 + 5
    assert times["cudnn", "fwd"] == [2.0, 9.0, 2.02] and times["flash", "bwd"] == []
    assert capsys.readouterr().err.count("flash bwd failed") == 1
    import statistics
    assert statistics.median(times["cudnn", "fwd"]) == 2.02  # the slow round does not count
    args = bench.parse_args(["--rounds", "5"])
    assert args.rounds == 5 and bench.parse_args([]).rounds == 3
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])


def test_rounds_disturbed_by_a_busy_host_are_outvoted_by_more_rounds(bench):
    """Two slow rounds of three (the H200 run of 2026-12-02: a drop-in at 0.193, 0.108 and
    0.058 ms) would make the median a disturbed round; more rounds run until the slow ones
    are a minority, and no more than max_rounds."""
    seen = {}
    plan = {"dropin": [0.193, 0.108, 0.058, 0.058, 0.058, 0.058], "cudnn": [0.15, 0.064, 0.064, 0.064, 0.064, 0.064]}

    def time_one(run, pass_):
        i = seen[run] = seen.get(run, -1) + 1
        return plan[run][i]

    runners = {"dropin": "dropin", "cudnn": "cudnn"}
    times = bench.time_rounds(runners, ["fwd"], 3, time_one, max_rounds=7)
    import statistics
    # 3 rounds, then 2 more: 2 slow of 5 is a minority
    assert times["dropin", "fwd"] == [0.193, 0.108, 0.058, 0.058, 0.058]
    assert statistics.median(times["dropin", "fwd"]) == 0.058
    assert statistics.median(times["cudnn", "fwd"]) == 0.064
    # without max_rounds (or with it at rounds) exactly the rounds asked for
    seen.clear()
    assert len(bench.time_rounds(runners, ["fwd"], 3, time_one)["dropin", "fwd"]) == 3
    # a host that stays busy: max_rounds bounds it
    seen.clear()
    plan["dropin"] = [0.3, 0.3, 0.1] + [0.3, 0.1] * 10
    assert len(bench.time_rounds(runners, ["fwd"], 3, time_one, max_rounds=7)["dropin", "fwd"]) == 7
    # one slow round of three is outvoted already: no extra round
    seen.clear()
    plan["dropin"] = [0.2, 0.1, 0.1, 0.1]
    plan["cudnn"] = [0.1] * 4
    assert len(bench.time_rounds(runners, ["fwd"], 3, time_one, max_rounds=7)["dropin", "fwd"]) == 3
