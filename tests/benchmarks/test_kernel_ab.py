"""benchmarks/kernel_ab.py: a copy of flashtune loaded beside the current tree under its own name,
both trees' attention checked against each other and timed, under the interpreter."""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW = "1,2,2,16,16,16,causal"


@pytest.fixture(scope="module")
def kernel_ab(script):
    return script("kernel_ab")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """A folder holding a copy of the current flashtune/ package, as `git archive` leaves one."""
    folder = tmp_path_factory.mktemp("old")
    shutil.copytree(ROOT / "flashtune", folder / "flashtune", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_the_imports_are_rewritten_to_the_baselines_name(kernel_ab):
    source = "\n".join([
        "import flashtune",
        "    import flashtune.kernels.forward as fw",
        "import flashtune as ft",
        "from flashtune import attention",
        "from flashtune.kernels.config import FwdConfig",
        '@torch.library.custom_op("flashtune::attention", mutates_args=())',
        "out = torch.ops.flashtune.attention(q)",
        "print(f\"flashtune's {flashtune.__version__}\")",
        "import flashtune_baseline.x; my_flashtune.x = 1",
    ])
    assert kernel_ab.rewrite(source, "old").splitlines() == [
        "import old; flashtune = old",
        "    import old.kernels.forward as fw",
        "import old as ft",
        "from old import attention",
        "from old.kernels.config import FwdConfig",
        '@torch.library.custom_op("old::attention", mutates_args=())',
        "out = torch.ops.old.attention(q)",
        "print(f\"flashtune's {old.__version__}\")",
        "import flashtune_baseline.x; my_flashtune.x = 1",
    ]


def test_the_baseline_folder_or_package_is_found_and_a_wrong_one_named(kernel_ab, baseline, tmp_path):
    assert kernel_ab.package_dir(baseline) == kernel_ab.package_dir(baseline / "flashtune") == baseline / "flashtune"
    with pytest.raises(ValueError, match="expected a folder holding a flashtune/ package"):
        kernel_ab.package_dir(tmp_path)


def test_a_copy_of_the_tree_runs_beside_it_and_agrees_bit_for_bit(kernel_ab, baseline, tmp_path, capsys):
    out = tmp_path / "ab.json"
    code = kernel_ab.main(["--baseline", str(baseline), "--device", "cpu", "--rows", "", "--shape", ROW,
                           "--rounds", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    # the copy is a package of its own: its kernels come from the copy, not from the current tree
    copy = pathlib.Path(sys.modules["flashtune_baseline"].__file__).parent
    kernels = [m for name, m in sys.modules.items() if name.startswith("flashtune_baseline.kernels.")]
    assert kernels and all(pathlib.Path(m.__file__).is_relative_to(copy) for m in kernels)
    assert not copy.is_relative_to(ROOT)
    assert hasattr(torch.ops.flashtune_baseline, "attention")  # its operators registered under its name
    result = json.loads(out.read_text())
    assert result["environment"]["baseline"]["path"] == str(baseline / "flashtune")
    rows = {r["pass_"]: r for r in result["rows"]}
    assert set(rows) == {"fwd", "bwd"}
    for row in rows.values():
        assert row["error"] is None and row["bitwise"] and set(row["max_diff"].values()) == {0.0}
        assert len(row["max_diff"]) == (1 if row["pass_"] == "fwd" else 4)
        assert len(row["rounds_ms"]["baseline"]) == len(row["rounds_ms"]["current"]) == 1
        assert row["ratio"] == pytest.approx(row["ms"]["baseline"] / row["ms"]["current"])
        assert row["within"] == (abs(row["ratio"] - 1) <= 0.02)
    for p, summary in result["summary"].items():
        assert summary["rows"] == 1 and summary["geomean"] == pytest.approx(rows[p]["ratio"])
        assert summary["bitwise"] == 1 and not summary["errors"]
    assert "geometric mean of baseline/current" in printed and "interpreter" in printed


def test_a_tree_that_computes_something_else_is_refused(kernel_ab, baseline, tmp_path):
    wrong = tmp_path / "wrong"
    shutil.copytree(baseline, wrong)
    with open(wrong / "flashtune" / "__init__.py", "a") as f:  # its attention 1 % off, whatever its layout
        f.write("\n_attention = globals().get('attention') or __getattr__('attention')\n\n\n"
                "def attention(*args, **kwargs):\n    return _attention(*args, **kwargs) * 1.01\n")
    tree = kernel_ab.load_tree(wrong, name="flashtune_wrong")
    import flashtune
    import harness

    args = argparse.Namespace(tolerance=None, rounds=1, max_rounds=1, timer="eager", quick=True, within=2.0)
    shape = harness.tiny(harness.parse_shape(ROW))
    shape = shape.__class__(**{**shape.as_dict(), "dtype": "float16", "passes": ("fwd", "bwd")})
    rows = kernel_ab.compare_row(args, torch.device("cpu"), shape, "contiguous",
                                 {"baseline": tree.attention, "current": flashtune.attention})
    assert [r["pass_"] for r in rows] == ["fwd", "bwd"]
    for row in rows:
        assert row["error"].startswith("the trees disagree") and not row["bitwise"] and "ms" not in row
        assert row["max_diff"]["o"] > 2 * torch.finfo(torch.float16).eps
    with pytest.raises(ValueError, match="another tree is loaded as flashtune_wrong"):
        kernel_ab.load_tree(baseline, name="flashtune_wrong")


def test_a_missing_baseline_is_named(kernel_ab, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        kernel_ab.main(["--baseline", str(tmp_path / "nope"), "--device", "cpu", "--rows", "", "--shape", ROW])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "nope" in err and "flashtune/ package" in err
