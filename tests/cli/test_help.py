"""Help on every command, --version, usage errors, and an instant ``flashtune --help``."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from flashtune import __version__
from flashtune.cli import cli

HEAVY = ("torch", "triton", "sqlalchemy", "optuna", "pydantic", "matplotlib")


def _walk(group: click.Group, prefix=()):
    for name, command in sorted(group.commands.items()):
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _walk(command, (*prefix, name))


COMMANDS = list(_walk(cli))


def test_the_group_has_every_command_of_the_issue():
    assert [" ".join(path) for path, _ in COMMANDS] == [
        "bench", "db", "db current", "db reset", "db upgrade", "delete", "export", "import", "info", "list",
        "revalidate", "search", "show"]


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help(invoke, path, flag):
    command = dict(COMMANDS)[path]
    assert command.help and command.help.strip(), f"{' '.join(path)} has no help text"
    result = invoke(*path, flag)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: flashtune {' '.join(path)} ")
    assert command.help.strip().splitlines()[0] in result.output
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{' '.join(path)} {param.opts[0]} has no help"


def test_top_level_help_lists_the_commands(invoke):
    result = invoke("-h")
    assert result.exit_code == 0
    for name in ("search", "revalidate", "list", "show", "export", "import", "bench", "db", "info"):
        assert f"\n  {name} " in result.output


def test_version(invoke):
    result = invoke("--version")
    assert (result.exit_code, result.output) == (0, f"flashtune {__version__}\n")


@pytest.mark.parametrize("args, message", [
    (["frobnicate"], "No such command 'frobnicate'"),
    (["list", "--bogus"], "No such option '--bogus'"),
    (["list", "--dtype", "float8"], "Invalid value for '--dtype': 'float8' is not a dtype: expected one of float16 "
                                    "(fp16, half), bfloat16 (bf16), float32 (fp32)"),
    (["search", "--dtype", "fp16,fp8"], "Invalid value for '--dtype': 'fp8' is not a dtype"),
    (["list", "--head-dim", "0"], "Invalid value for '--head-dim'"),
    (["list", "--json", "--csv"], "--json and --csv exclude each other"),
    (["search", "--seq-len", "1k"], "Invalid value for '--seq-len': '1k' is not an integer"),
    (["search", "--pass", "fwd,sideways"], "'sideways' is not one of fwd, bwd"),
    (["search", "--trials", "0"], "Invalid value for '--trials'"),
    (["import"], "Missing argument 'FILE'"),
    (["export"], "Missing option '-o' / '--output'"),
    (["db"], "Usage: flashtune db"),
])
def test_usage_errors_exit_2(invoke, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


LEAVES = [(path, command) for path, command in COMMANDS if not isinstance(command, click.Group)]


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=" ".join)
def test_every_command_has_json_output_and_its_usage_errors_come_as_json(invoke, path):
    command = dict(COMMANDS)[path]
    assert "--json" in {opt for param in command.params for opt in getattr(param, "opts", [])}, " ".join(path)
    result = invoke(*path, "--json", "--no-such-option")
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"error": {"message": "No such option '--no-such-option'.", "kind": "usage",
                                                   "exit_code": 2}}


@pytest.mark.parametrize("args", [["list"], ["show"], ["info"], ["delete", "--head-dim", "16", "-y"],
                                  ["export", "-o", "x.json"], ["db", "current"], ["db", "reset", "-y"],
                                  ["revalidate", "--interpreter"], ["search", "--interpreter", "--revalidate"]])
def test_errors_under_json_are_a_json_object_with_the_exit_code(invoke, args):
    result = invoke(*args, "--db", "mysql://nobody@nowhere/db", "--json")
    assert result.exit_code == 1, result.output
    error = json.loads(result.stdout)["error"]
    assert (error["kind"], error["exit_code"]) == ("error", 1)
    assert error["message"].startswith("unsupported database URL scheme 'mysql' in 'mysql://nobody@nowhere/db'")
    assert "Error:" not in result.output


def test_dtype_aliases(invoke, tmp_path):
    out = invoke("search", "--interpreter", "--dtype", "fp16,half,float16,fp32", "--seq-len", "16", "--full",
                 "--pass", "fwd", "--list-models", "--json")
    assert out.exit_code == 0  # --list-models lists and ends: the aliases parsed
    from flashtune.cli._common import dtype_of

    assert [dtype_of(a) for a in ("fp16", "half", "FP16", "float16", "bf16", "bfloat16", "fp32", "float32")] == \
        ["float16"] * 4 + ["bfloat16"] * 2 + ["float32"] * 2
    listed = invoke("list", "--dtype", "bf16", "--db", tmp_path / "none.db")
    assert listed.exit_code == 1 and "no flashtune store" in listed.output  # parsed, then the missing store


def _modules_after(args: list[str]) -> list[str]:
    code = (
        "import sys, json\n"
        "from flashtune.cli import cli\n"
        f"try:\n    cli.main({args!r}, prog_name='flashtune')\n"
        "except SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_imports_nothing_heavy():
    """`flashtune --help` (and every command's --help) stays instant: no torch, triton, sqlalchemy, optuna."""
    assert _modules_after(["--help"]) == []
    assert _modules_after(["--version"]) == []
    for path, _ in COMMANDS:
        assert _modules_after([*path, "--help"]) == [], " ".join(path)
