"""The pieces of benchmarks/variants.py that need no GPU: the documents, FLOPs, ratios, table."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "variants.py"


@pytest.fixture(scope="module")
def variants(load_benchmark):
    return load_benchmark("variants")


def test_documents_are_mixed_fixed_and_sum_to_the_tokens(variants):
    lengths = variants.document_lengths(16384)
    assert sum(lengths) == 16384 and lengths == variants.document_lengths(16384)
    assert len(lengths) >= 4 and max(lengths) <= 4096 and min(lengths[:-1]) >= 128
    assert len(set(lengths)) > len(lengths) // 2  # mixed, not one length
    assert sum(variants.document_lengths(4096, longest=4096)) == 4096


def test_flops_count_the_visible_work(variants):
    # one document of N tokens: the causal FLOPs of the grid's formula
    assert variants.causal_flops([4096], 32, 128) == variants.grid_bench.attention_flops("fwd", 1, 32, 4096, 128, True)
    assert variants.causal_flops([1, 2], 1, 1) == 2.0 * (1 + 4)
    # a window as wide as the sequence is causal: n (n + 1) / 2 pairs; window 0 keeps the diagonal
    assert variants.window_pairs(10, 9) == variants.window_pairs(10, 100) == 55
    assert variants.window_pairs(10, 0) == 10
    assert variants.window_pairs(16384, 4096) == sum(min(i, 4096) + 1 for i in range(16384))


def test_rows_report_speedups_and_goals(variants):
    row = variants.Row("fp8", "case", "fwd", "fp8", 1e12,
                       ms={"fp8": 1.0, "fp8+relayout": 1.25, "flashtune-bf16": 1.5, "cudnn-bf16": None})
    assert row.speedups() == {"fp8+relayout": 1.25, "flashtune-bf16": 1.5}
    assert row.tflops()["fp8"] == pytest.approx(1000.0)
    line = variants.format_row(row)
    assert "fp8=1.000ms(1000)" in line and "cudnn-bf16=n/a " in line
    assert "[goal vs flashtune-bf16 >= 1.3: met]" in line and "fp8+relayout vs flashtune-bf16: 1.20x" in line
    row.ms["fp8"] = 1.4
    assert "MISSED" in variants.format_row(row)
    assert "ABORTED: boom" in variants.format_row(variants.Row("window", "c", "fwd", "flashtune", 1.0, error="boom"))


def test_quick_shrinks_and_help_runs_without_a_gpu(variants):
    quick, full = variants.parse_args(["--quick"]), variants.parse_args([])
    assert (quick.rounds, full.rounds) == (1, 3)
    assert quick.varlen_tokens < full.varlen_tokens == 16384
    assert (full.window_seq, full.window) == (16384, 4096) and full.fp8_shape == (4, 16, 4096, 128)
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--quick" in out.stdout and "varlen" in out.stdout
