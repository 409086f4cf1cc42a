"""benchmarks/kernel_ab.py under the interpreter: a kernel file against another version of it."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "kernel_ab.py"


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("pass_, module", [("fwd", "forward"), ("bwd", "backward")])
def test_a_copy_of_the_kernel_runs_against_the_current_one(tmp_path, pass_, module):
    baseline = tmp_path / f"{module}_copy.py"
    shutil.copy(ROOT / "flashtune" / "kernels" / f"{module}.py", baseline)
    out = tmp_path / "ab.json"
    done = _run("--pass", pass_, "--baseline", baseline, "--head-dims", 16, "--seq-lens", 40, "--causal", "yes",
                "--dtype", "float16", "--rounds", 2, "--out", out)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["max_rel_diff"] == 0.0  # the same kernel: the same bits
    assert len(row["rounds_ms"]["baseline"]) == len(row["rounds_ms"]["current"]) == 2
    assert row["speedup"] > 0 and result["timer"] == "interpreter-wall-clock"
    assert "geometric mean of baseline/current" in done.stdout


def test_a_baseline_that_computes_something_else_is_refused(tmp_path):
    text = (ROOT / "flashtune" / "kernels" / "forward.py").read_text()
    wrong = text.replace("acc = acc / l_i[:, None]", "acc = acc / l_i[:, None] * 1.01")
    assert wrong != text
    baseline = tmp_path / "forward_wrong.py"
    baseline.write_text(wrong)
    done = _run("--pass", "fwd", "--baseline", baseline, "--head-dims", 16, "--seq-lens", 40, "--causal", "no",
                "--dtype", "float32", "--rounds", 1)
    assert done.returncode != 0 and "disagree" in done.stderr and "Traceback" not in done.stderr


def test_a_missing_baseline_is_named(tmp_path):
    done = _run("--pass", "fwd", "--baseline", tmp_path / "nope.py", timeout=300)
    assert done.returncode != 0 and "nope.py" in done.stderr and "Traceback" not in done.stderr
