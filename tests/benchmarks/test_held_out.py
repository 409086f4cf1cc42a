"""benchmarks/held_out.py: its rows are held out from what a store is tuned on, its arguments are
checked before any GPU work, and a decode row runs under the interpreter from a tuned neighbour."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flashtune.keys import TuningKey
from flashtune.shapes import REALISTIC_GRID


@pytest.fixture(scope="module")
def held_out(script):
    return script("held_out")


def _keys(rows, gpu="NVIDIA H100 80GB HBM3@sm90"):
    return {TuningKey.for_shape(gpu, row, p) for row in rows for p in row.passes}


def test_no_held_out_row_is_a_key_of_the_shapes_rows_or_the_grid(held_out):
    import harness

    tuned_on = _keys(REALISTIC_GRID) | _keys(harness.grid_rows())
    rows = held_out.HELD_OUT
    assert len({r.name for r in rows}) == len(rows) >= 20
    for row in rows:
        assert not _keys([row]) & tuned_on, row.name
    # what the rows are meant to hold: the 71-group MQA prefill, the lengths between the grid's at
    # both head dims and maskings, groups 4 and 6, and decode at caches of 3000 and 20000
    mqa = held_out.ROWS["mqa71-prefill-3000-d64"]
    assert (mqa.batch, mqa.heads_q, mqa.heads_kv, mqa.seq_q, mqa.head_dim, mqa.causal) == (1, 71, 1, 3000, 64, True)
    assert {(r.head_dim, r.causal, r.seq_q) for r in rows if r.name.startswith("between-")} == \
        {(d, c, n) for d in (64, 128) for c in (True, False) for n in (3000, 6000, 12000)}
    assert {r.group for r in rows} >= {1, 4, 6, 71}
    assert {r.seq_k for r in rows if r.decode} == {3000, 20000}
    assert any("bwd" in r.passes for r in rows) and all("fwd" in r.passes for r in rows)


def test_the_rows_follow_the_row_pass_and_dtype_arguments(held_out):
    _, args = held_out.parse_args(["--db", "x.db", "--rows", "decode-b1-g4-20000,bh48-d128-2048-causal",
                                   "--pass", "bwd", "--dtype", "fp16"])
    assert [(r.name, r.passes, r.dtype) for r in args.row_list] == [("bh48-d128-2048-causal", ("bwd",), "float16")]
    _, args = held_out.parse_args(["--db", "x.db", "--device", "cpu", "--rows", "mqa71-prefill-3000-d64"])
    (tiny,) = args.row_list  # interpreter-sized: its grouping, head dim and masking kept
    assert (tiny.batch, tiny.heads_kv, tiny.head_dim, tiny.causal, tiny.dtype) == (1, 1, 64, True, "float16")
    _, args = held_out.parse_args(["--db", "x.db"])
    assert args.row_list == list(held_out.HELD_OUT) and args.anchor_names == ["cudnn", "flash", "efficient"]


@pytest.mark.parametrize("argv, message", [
    ([], "--db: required"),
    (["--db", "x.db", "--rows", "llama3-8b-train-8k"], "--rows: unknown row 'llama3-8b-train-8k'"),
    (["--db", "x.db", "--rows", "mqa71-prefill-3000-d64", "--pass", "bwd"], "--rows/--pass: no row to run"),
    (["--db", "x.db", "--anchors", "cudnn,fa2"], "--anchors: expected some of cudnn, flash, efficient"),
    (["--db", "MISSING", "--device", "cpu"], "--db: no store at "),
    (["--db", "nosuchdriver://x", "--device", "cpu"], "--db: "),
])
def test_a_bad_argument_is_named(held_out, tmp_path, monkeypatch, argv, message, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        held_out.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and message in err and "Traceback" not in err


def test_list_rows_prints_every_row(held_out, capsys):
    with pytest.raises(SystemExit) as done:
        held_out.main(["--list-rows"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and all(r.name in out for r in held_out.HELD_OUT)


def test_which_tuned_key_served_is_read_from_the_source(held_out):
    label = "fwd bfloat16 d64 n3000 causal g71 bh64"
    assert held_out.served_by("tuned exact", label) == label
    assert held_out.served_by("tuned exact (shipped table h100.json)", label) == label
    assert held_out.served_by("tuned nearest (fwd bfloat16 d64 n4096 causal)", label) == "fwd bfloat16 d64 n4096 causal"
    assert held_out.served_by("tuned nearest (fwd bfloat16 d64 n4096 causal; shipped table h100.json)", label) == \
        "fwd bfloat16 d64 n4096 causal"
    assert held_out.served_by("tuned nearest (fwd bfloat16 d64 n2048 causal); the tuned fwd config of x is stale",
                              label) == "fwd bfloat16 d64 n2048 causal"
    assert held_out.served_by("heuristic (nearest tuned key fwd bfloat16 d64 n4096 causal is too far: ...)",
                              label) is None


def test_a_decode_row_is_served_from_its_tuned_neighbour_and_reported(held_out, tmp_path, capsys):
    """The interpreter's decode-b8-g4-3000 (one query of 4 heads against 40 keys of one K/V head) from a
    store tuned at 32 keys: served by that key, checked, timed beside the default and SDPA's flash."""
    from flashtune.kernels import FwdConfig
    from flashtune.keys import GpuInfo
    from flashtune.provenance import current_provenance
    from flashtune.store import Store, StoredResult

    gpu = GpuInfo.interpreter()
    tuned = TuningKey(gpu.key, "float16", 128, 1, False, "fwd", seq_k=32, group=4, batch_heads=4)
    provenance = dataclasses.replace(current_provenance(), gpu_name=gpu.name, sm_count=gpu.sm_count,
                                     capability="0.0")
    db = tmp_path / "tuned.db"
    with Store(db) as store:
        store.save_result(StoredResult(key=tuned, config=FwdConfig(16, 32, 2, 1), time_ms=1.0, tflops=1.0,
                                       default_time_ms=2.0, error=0.0, n_trials=3, gpu=gpu, provenance=provenance))
    out = tmp_path / "held_out.json"
    code = held_out.main(["--db", str(db), "--device", "cpu", "--rows", "decode-b8-g4-3000", "--anchors", "flash",
                          "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["error"] is None and not row["failed"] and set(row["check"]) == {"flash", "served", "default"}
    assert row["key"] == "fwd float16 d128 q1 k40 full g4 bh4"
    assert row["served_by"] == tuned.label() and row["source"] == f"tuned nearest ({tuned.label()})"
    ms = row["ms"]
    assert all(ms[n] > 0 for n in ("served", "default", "flash")) and row["best_sdpa"] == "flash"
    assert row["served_vs_default"] == pytest.approx(ms["default"] / ms["served"])
    assert row["served_vs_best_sdpa"] == pytest.approx(ms["flash"] / ms["served"])
    summary = result["summary"]
    assert summary["min"] == summary["min_tuned"] == {"served_vs_default": row["served_vs_default"],
                                                      "name": "decode-b8-g4-3000", "pass": "fwd",
                                                      "served_by": tuned.label()}
    assert summary["served_by_a_tuned_key"] == 1 and result["environment"]["interpreter"]
    assert "decode-b8-g4-3000" in printed and tuned.label() in printed
