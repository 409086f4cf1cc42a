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
        "bench", "db", "db current", "db reset", "db upgrade", "delete", "export", "import", "info", "list", "search",
        "show"]


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
    for name in ("search", "list", "show", "export", "import", "bench", "db", "info"):
        assert f"\n  {name} " in result.output


def test_version(invoke):
    result = invoke("--version")
    assert (result.exit_code, result.output) == (0, f"flashtune {__version__}\n")


@pytest.mark.parametrize("args, message", [
    (["frobnicate"], "No such command 'frobnicate'"),
    (["list", "--bogus"], "No such option '--bogus'"),
    (["list", "--dtype", "float8"], "Invalid value for '--dtype'"),
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
