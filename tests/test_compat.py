"""Unsupported torch or triton: `import flashtune` and the command line say which versions are
needed, without a traceback. The installed version is faked the way pip would leave it: a
distribution's metadata (``triton-3.1.0.dist-info``) found first on the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from flashtune import compat

REPO = Path(__file__).resolve().parents[1]


def _fake_distribution(root: Path, name: str, version: str) -> Path:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def _run(code_or_args, fake: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FLASHTUNE_"))}
    env["PYTHONPATH"] = f"{fake}{os.pathsep}{REPO}"
    args = [sys.executable, "-c", code_or_args] if isinstance(code_or_args, str) else [sys.executable, *code_or_args]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


@pytest.mark.parametrize("command", ["import flashtune", ["-m", "flashtune", "info"]], ids=["import", "info"])
def test_triton_3_1_is_refused_with_the_versions_to_install_and_no_traceback(tmp_path, command):
    fake = _fake_distribution(tmp_path / "site", "triton", "3.1.0")
    done = _run(command, fake, tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("UnsupportedVersionError: flashtune needs triton>=3.6,<3.7 (flashtune's kernels "
                                  "import triton.tools.tensor_descriptor and Gluon, both new in triton 3.6), found "
                                  "triton 3.1.0: pip install 'triton>=3.6,<3.7'; tested: torch 2.11.0 + triton 3.6.0")
    assert done.stderr.count("\n") == 1


def test_an_old_torch_is_refused_too(tmp_path):
    fake = _fake_distribution(tmp_path / "site", "torch", "2.4.1")
    done = _run("import flashtune", fake, tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "flashtune needs torch>=2.11,<2.14 (the oldest torch flashtune has been tested with), found torch 2.4.1" \
        in done.stderr


def test_an_in_process_command_says_the_same_and_under_json_as_a_json_error(monkeypatch):
    from click.testing import CliRunner

    from flashtune.cli import cli

    real = compat.installed_version
    monkeypatch.setattr(compat, "installed_version", lambda name: "3.1.0" if name == "triton" else real(name))
    out = CliRunner().invoke(cli, ["info"])
    assert out.exit_code == 1
    assert out.output.startswith("Error: flashtune needs triton>=3.6,<3.7") and "Traceback" not in out.output
    out = CliRunner().invoke(cli, ["info", "--json"])
    assert out.exit_code == 1
    error = json.loads(out.stdout)["error"]
    assert error["exit_code"] == 1 and error["message"].startswith("flashtune needs triton>=3.6,<3.7")


def test_a_newer_triton_than_tested_warns(monkeypatch):
    real = compat.installed_version
    monkeypatch.setattr(compat, "installed_version", lambda name: "3.9.0" if name == "triton" else real(name))
    errors, untested = compat.version_problems()
    assert errors == []
    assert untested == ["triton 3.9.0 is newer than any flashtune was tested with (triton>=3.6,<3.7)"]
    with pytest.warns(UserWarning, match="triton 3.9.0 is newer than any flashtune was tested with"):
        compat.check_installed()


def test_a_missing_triton_is_named(monkeypatch):
    real = compat.installed_version
    monkeypatch.setattr(compat, "installed_version", lambda name: None if name == "triton" else real(name))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # check_installed sets its own: undone after
    errors, _ = compat.version_problems()
    assert errors[0] == "triton is not installed: pip install 'triton>=3.6,<3.7'"
    with pytest.raises(compat.UnsupportedVersionError, match="^triton is not installed"):
        compat.check_installed()


@pytest.mark.parametrize("version, release", [("2.13.0+cpu", (2, 13, 0)), ("3.6.0", (3, 6, 0)),
                                              ("2.11.0a0+git1234", (2, 11, 0)), ("3.6", (3, 6)), ("nightly", ())])
def test_release_numbers(version, release):
    assert compat.release(version) == release


def test_pyproject_declares_the_supported_ranges():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {d.split(">")[0].split("<")[0].split("=")[0]: d for d in project["dependencies"]}
    for dependency in compat.SUPPORTED:
        assert declared[dependency.package] == dependency.spec
    # the tested pairs lie in the ranges
    for torch_version, triton_version, _ in compat.TESTED:
        for dependency, version in zip(compat.SUPPORTED, (torch_version, triton_version)):
            assert dependency.minimum <= compat.release(version) < dependency.below
