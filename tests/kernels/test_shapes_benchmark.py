"""benchmarks/shapes.py: its pure pieces, and a run under the interpreter on tiny rows."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "shapes.py"


@pytest.fixture(scope="module")
def shapes(load_benchmark):
    return load_benchmark("shapes")


def test_rows_flops_and_bytes(shapes):
    assert len(shapes.SHAPES) == 16 and len(shapes.BY_NAME) == 16
    llama = shapes.BY_NAME["llama3-8b-train-8k"]
    assert llama.flops("fwd") == 4 * 32 * 8192 * 8192 * 128 / 2 and llama.flops("bwd") == 2.5 * llama.flops("fwd")
    cross = shapes.BY_NAME["sd15-cross-4096x77"]
    assert cross.flops("fwd") == 4 * 2 * 8 * 4096 * 77 * 40 and cross.passes == ("fwd",)
    decode = shapes.BY_NAME["decode-b1-64k"]
    assert decode.decode and not llama.decode
    assert decode.kv_bytes() == 268435456  # SHAPES.md: 268 MB of K/V
    tiny = shapes.tiny(decode)
    assert (tiny.seq_q, tiny.heads_q // tiny.heads_kv, tiny.head_dim) == (1, 4, 128)
    assert shapes.tiny(shapes.BY_NAME["decode-mqa-d256-b16-8k"]).heads_kv == 1


def test_configs_file(shapes, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"decode-b1-64k": {"fwd": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4,
                                                          "num_stages": 2, "num_splits": 4}}}))
    assert shapes.load_configs(str(path))["decode-b1-64k"]["fwd"]["num_splits"] == 4
    path.write_text(json.dumps({"decode-b2": {"fwd": {}}}))
    with pytest.raises(SystemExit, match="unknown row"):
        shapes.load_configs(str(path))


def test_table_and_summary(shapes):
    r = shapes.Result("gpt2-train-512", "fwd", {}, 1.0, config={"BLOCK_M": 64})
    r.tflops = {"flashtune": 100.0, "cudnn": 200.0, "flash": 50.0, "efficient": None}
    assert r.best_sdpa() == ("cudnn", 200.0) and r.ratios()["best"] == 0.5 and r.ratios()["flash"] == 2.0
    line = shapes.format_result(r)
    assert "0.500" in line and "2.000" in line
    assert len(shapes.HEADER.split("|")) == len(line.split("|"))
    d = shapes.Result("decode-b1-64k", "fwd", {}, 1.0)
    d.tflops = {"flashtune": 1.0, "flash": 2.0}
    d.copy_fraction = {"flashtune": 0.4, "flash": 0.8}
    assert "0.40" in shapes.format_result(d)
    summary = shapes.summarize([r, d])
    assert summary["fwd non-decode"]["best"] == 0.5 and summary["fwd decode"]["best"] == 0.5
    assert summary["fwd all"]["rows"] == 2


def test_best_single_with_no_other_winner_of_the_pass_is_none(shapes):
    """A pass whose rows have their tuned time but no other stored winner to compare (the
    H200 run of 2026-12-02 crashed here after timing every row)."""
    r = shapes.Result("gemma2-d256-train-4k", "bwd", {}, 1.0)
    r.singles_tuned_ms = 2.0
    assert shapes.best_single([r], "bwd") is None
    r.singles_ms = {"other": 3.0}
    assert shapes.best_single([r], "bwd")["tuned_vs_single"] == 1.5


def test_runs_under_the_interpreter(tmp_path):
    out = tmp_path / "shapes.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--rows", "vit-l16-257",
                           "decode-b32-4k", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {(r["name"], r["pass_"]): r for r in result["rows"]}
    assert set(rows) == {("vit-l16-257", "fwd"), ("vit-l16-257", "bwd"), ("decode-b32-4k", "fwd")}
    assert all(r["error"] is None and r["ms"]["flashtune"] > 0 for r in rows.values())
    decode = rows["decode-b32-4k", "fwd"]
    assert decode["copy_fraction"]["flashtune"] > 0 and "split kernel" in decode["schedule"]
    assert decode["config"]["num_splits"] == 0 and result["copy_bandwidth"] > 0
    assert "interpreter wall clock" in done.stdout and "geomean" in done.stdout


def test_passes_keep_only_those_passes_of_the_rows(shapes, tmp_path):
    args = shapes.parse_args(["--device", "cpu"])
    assert args.passes == ["fwd", "bwd"] and args.max_rounds == args.rounds  # no extra rounds on the CPU
    assert shapes.parse_args(["--rounds", "3"]).max_rounds == 7
    with pytest.raises(SystemExit):
        shapes.parse_args(["--rounds", "3", "--max-rounds", "2"])
    out = tmp_path / "shapes.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--rows", "bert-base-512",
                           "sd15-cross-4096x77", "--passes", "bwd", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [(r["name"], r["pass_"]) for r in json.loads(out.read_text())["rows"]]
    assert rows == [("bert-base-512", "bwd")]  # sd15 has no backward: left out


def test_a_tuned_store_is_measured_with_the_drop_in_and_the_best_single_config(tmp_path):
    """--db/--singles under the interpreter: a store searched over two tiny rows; each row
    reports the drop-in against SDPA, its tuned Triton config against the default, and the
    summary names the best single config of each pass (the eager timer on the CPU)."""
    rows = [{"B": 1, "Hq": 4, "Hkv": 4, "Nq": 17, "D": 64, "dtype": "float16", "passes": "fwd+bwd",
             "name": "vit-l16-257"},
            {"B": 1, "Hq": 4, "Hkv": 1, "Nq": 1, "Nk": 40, "D": 128, "dtype": "float16", "name": "decode-b32-4k"}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    db = tmp_path / "t.db"
    searched = subprocess.run([sys.executable, "-m", "flashtune", "search", "--interpreter", "--shapes",
                               str(tmp_path / "rows.json"), "--trials", "2", "--db", str(db), "--no-progress",
                               "--storage", str(tmp_path / "j.log")], capture_output=True, text=True, timeout=600)
    assert searched.returncode == 0, searched.stdout[-2000:] + searched.stderr[-2000:]
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--rows", "vit-l16-257", "decode-b32-4k",
                           "--db", str(db), "--singles", "--graph-singles", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {(r["name"], r["pass_"]): r for r in report["rows"]}
    assert set(rows) == {("vit-l16-257", "fwd"), ("vit-l16-257", "bwd"), ("decode-b32-4k", "fwd")}
    for r in rows.values():
        assert r["config_source"] == "tuned exact" and "tuned exact" in r["choice"]
        assert r["ms"]["dropin"] > 0 and r["ms"]["default"] > 0 and r["check"]["dropin"]
        assert r["singles_timer"] == "eager" and r["singles_tuned_ms"] > 0
        assert all(ms is None or ms > 0 for ms in r["singles_ms"].values()) and r["singles_ms"]
    best = report["summary"]["best_single"]
    assert set(best) == {"fwd", "bwd"} and best["fwd"]["of_rows"] == 2 and best["fwd"]["tuned_vs_single"] > 0
    assert "drop-in / best SDPA" in done.stdout and "best single Triton config, fwd" in done.stdout
