"""benchmarks/compare.py: its arguments, and runs under the interpreter on tiny rows that check
each runner, time it and write the ratios and their geometric means."""

from __future__ import annotations

import json

import pytest

ROW = "1,2,2,16,16,16,causal"


@pytest.fixture(scope="module")
def compare(script):
    return script("compare")


def test_a_run_writes_every_row_checked_timed_and_its_ratios(compare, tmp_path, capsys):
    out = tmp_path / "compare.json"
    code = compare.main(["--device", "cpu", "--rows", "", "--shape", ROW, "--layout", "both",
                         "--anchors", "math,flash,cudnn", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(out.read_text())
    assert result["anchors_skipped"] == {"cudnn": "SDPA's cudnn backend needs a CUDA GPU"}
    assert result["environment"]["interpreter"] and result["environment"]["flashtune"]
    rows = {(r["name"], r["layout"], r["pass_"]): r for r in result["rows"]}
    train = "1x2x2-16x16-d16-causal"
    assert set(rows) == {(train, layout, p) for layout in ("contiguous", "transformers") for p in ("fwd", "bwd")}
    for row in rows.values():
        assert row["error"] is None and not row["failed"]
        assert set(row["check"]) == {"math", "flash", "flashtune"} and row["check"]["math"]["anchor"]
        assert all(row["ms"][name] > 0 and len(row["rounds_ms"][name]) == 1 for name in row["check"])
        # the speed ratio: time(anchor) / time(flashtune); "best": against the row's fastest anchor
        ratios = row["ratios"]["flashtune"]
        assert ratios["math"] == pytest.approx(row["ms"]["math"] / row["ms"]["flashtune"])
        assert row["best_anchor"] == min(("math", "flash"), key=row["ms"].get)
        assert ratios["best"] == min(ratios["math"], ratios["flash"])
    for key, by_variant in result["summary"].items():  # one row each: its ratio
        p, layout, group = key.split()
        assert group == "all" and set(by_variant["flashtune"]) == {"math", "flash", "best"}
        for anchor, mean in by_variant["flashtune"].items():
            assert mean["rows"] == 1
            assert mean["geomean"] == pytest.approx(rows[train, layout, p]["ratios"]["flashtune"][anchor])
    assert "geometric mean of time(anchor) / time(flashtune)" in printed and "anchor cudnn skipped" in printed


def test_the_variants_of_configs_and_a_store_and_a_decode_row(compare, tmp_path, capsys):
    """--configs runs the file's configs; --db the drop-in beside the kernels (a store without the
    row's key serves the heuristic default, and says so; the tuned variant has nothing tuned to
    run; a second --db is a second drop-in); a decode row is also read against the copy bandwidth."""
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps({"*": {"fwd": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}}}))
    out = tmp_path / "compare.json"
    with pytest.warns(UserWarning, match="no tuned configs"):
        code = compare.main(["--device", "cpu", "--rows", "", "--shape", "1,4,2,1,40,16", "--pass", "fwd",
                             "--anchors", "math", "--flashtune", "default,tuned", "--db", str(tmp_path / "none.db"),
                             "--db", str(tmp_path / "other.db"), "--configs", str(configs), "--out", str(out)])
    assert code == 0, capsys.readouterr().out
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert set(row["ms"]) == {"math", "flashtune", "flashtune-configs", "dropin", "dropin-2"} and all(row["ms"].values())
    assert "heuristic" in row["configs"]["dropin-2"]
    assert row["configs"]["flashtune-configs"].startswith("16x16 w4 s1") and "heuristic" in row["configs"]["dropin"]
    assert row["failed"] == {"flashtune-tuned": "the store has no tuned config for this row"}
    assert result["copy_bandwidth"] > 0 and row["copy_fraction"]["flashtune"] > 0
    assert row["copy_fraction"]["dropin"] == pytest.approx(
        row["shape"]["batch"] * 2 * 2 * 40 * 16 * 2 / (row["ms"]["dropin"] * 1e-3) / result["copy_bandwidth"])


@pytest.mark.parametrize("argv, message", [
    (["--flashtune", "tuned"], "--flashtune dropin/tuned: needs --db"),
    (["--flashtune", "default,fast"], "--flashtune: expected some of"),
    (["--flashtune", "configs"], "needs --configs"),
    (["--anchors", "cudnn,fa3"], "--anchors: unknown 'fa3'"),
    (["--layout", "bnhd"], "--layout: expected contiguous, transformers or both"),
    (["--rows", "grid,llama"], "--rows: unknown row 'llama'"),
    (["--rounds", "0"], "--rounds: expected a positive number"),
    (["--rounds", "3", "--max-rounds", "2"], "--max-rounds: expected at least --rounds (3)"),
])
def test_bad_arguments_are_named(compare, argv, message, capsys):
    with pytest.raises(SystemExit) as done:
        compare.main(["--device", "cpu", *argv])
    assert done.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ({"no-such-row": {"fwd": {}}}, "'no-such-row' is none of the rows run"),
    ({"*": {"fwd": {"BLOCK_Q": 16}}}, "*: "),
    ({"*": {"both": {}}}, "expected {\"fwd\""),
])
def test_a_bad_configs_file_is_named(compare, tmp_path, content, message, capsys):
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(content))
    with pytest.raises(SystemExit):
        compare.main(["--device", "cpu", "--rows", "", "--shape", ROW, "--configs", str(path)])
    err = capsys.readouterr().err
    assert "--configs" in err and message in err and "Traceback" not in err
