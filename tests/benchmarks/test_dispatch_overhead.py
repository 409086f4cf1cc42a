"""benchmarks/dispatch_overhead.py runs end to end (a smoke run under the interpreter)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "dispatch_overhead.py"


def _smoke_run(tmp_path, *extra) -> tuple[subprocess.CompletedProcess, dict]:
    """A tiny fp32 run under the interpreter with an empty store; (process, JSON result)."""
    out = tmp_path / "overhead.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "FLASHTUNE_DB": str(tmp_path / "none.db"),
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--dtype", "float32", "--seq-len", "16", "--head-dim", "16",
         "--iters", "1", "--repeats", "1", "--out", str(out), *extra],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done, json.loads(out.read_text())


def test_the_overhead_benchmark_reports_every_variant(tmp_path):
    done, result = _smoke_run(tmp_path)
    assert "[Triton interpreter: not GPU figures]" in done.stdout
    assert result["interpreter"] is True
    assert set(result["us_per_call"]) == {f"{v} {m}" for v in ("direct", "attention", "tuned", "sdpa")
                                          for m in ("fwd", "fwd+bwd")}
    us = result["us_per_call"]
    # the figures time the calls, in microseconds: a Triton launch under the interpreter takes
    # milliseconds (20 ms here), an SDPA call tens of microseconds; a loop that skips the call
    # (well under 1 us) or a figure in milliseconds (1000x smaller) falls below these
    assert all(us[f"{v} {m}"] > 1000 for v in ("direct", "attention", "tuned") for m in ("fwd", "fwd+bwd")), us
    assert all(us[f"sdpa {m}"] > 5 for m in ("fwd", "fwd+bwd")), us
    for variant in ("direct", "attention", "tuned", "sdpa"):  # the printed table is the file's figures
        assert f"{variant:<10} {us[f'{variant} fwd']:>10.2f} {us[f'{variant} fwd+bwd']:>12.2f}" in done.stdout
    assert result["choice"]["fwd_source"] == "heuristic"
    assert set(result["overhead"]) == {f"tuned vs {b} {m}" for b in ("attention", "direct") for m in ("fwd", "fwd+bwd")}
    for name, o in result["overhead"].items():  # each overhead is the tuned call's against its base's
        base, mode = name.removeprefix("tuned vs ").split(" ")
        assert o == {"extra_us": us[f"tuned {mode}"] - us[f"{base} {mode}"],
                     "ratio": us[f"tuned {mode}"] / us[f"{base} {mode}"]}
    assert "diagnose_us_per_call" not in result
    assert not (tmp_path / "none.db").exists()


def test_the_diagnose_mode_times_the_pieces_of_the_autograd_path(tmp_path):
    done, result = _smoke_run(tmp_path, "--diagnose")
    pieces = result["diagnose_us_per_call"]
    assert set(pieces) == {"bwd launcher, main thread", "bwd launcher, another thread",
                           "autograd round trip, no-op Function"}
    for name, us in pieces.items():  # the printed lines are the file's figures
        assert f"{name:<38} {us:>8.2f} us" in done.stdout


def test_the_runner_variants_time_a_call_served_by_an_sdpa_backend(tmp_path):
    """--runner: the drop-in serving an SDPA backend (as a search that found it faster stores
    it) against the same backend called directly; the CPU has SDPA's flash backend."""
    done, result = _smoke_run(tmp_path, "--runner", "sdpa-flash", "--iters", "5")
    us = result["us_per_call"]
    assert {f"{v} {m}" for v in ("served", "backend") for m in ("fwd", "fwd+bwd")} <= set(us)
    # served by SDPA, not the kernels: microseconds, not the interpreter's 20 milliseconds
    assert all(5 < us[f"{v} {m}"] < 5000 for v in ("served", "backend") for m in ("fwd", "fwd+bwd")), us
    for mode in ("fwd", "fwd+bwd"):
        o = result["overhead"][f"served vs backend {mode}"]
        assert o["extra_us"] == us[f"served {mode}"] - us[f"backend {mode}"]
    assert "served/backend: sdpa-flash" in done.stdout and result["runner"] == "sdpa-flash"


def test_the_host_breakdown_times_every_path_without_launching_a_kernel():
    """benchmarks/host_breakdown.py: each path's host time with the kernels' launches made
    no-ops. A kernel that still ran under the interpreter would take milliseconds a call;
    a loop that skipped the call would take well under a microsecond."""
    script = SCRIPT.parent / "host_breakdown.py"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, str(script), "--seq-len", "16", "--head-dim", "16", "--iters", "20"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line[:44].strip(): float(line[44:]) for line in done.stdout.splitlines()[1:]}
    assert len(rows) == 8 and "drop-in, fwd+bwd" in rows and "empty Python autograd.Function (floor)" in rows, \
        done.stdout
    assert all(1.0 < us < 1000.0 for us in rows.values()), rows
