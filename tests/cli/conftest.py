"""CLI tests: every command through click's CliRunner, each against its own store.

Without a GPU the kernels run under Triton's interpreter, which must be switched on
before triton is first imported. The sample results live with the exchange tests.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exchange"))


@pytest.fixture(autouse=True)
def _no_default_store(tmp_path, monkeypatch):
    """No CLI test may touch the user's real default store."""
    monkeypatch.setenv("FLASHTUNE_DB", str(tmp_path / "default-store" / "tuned.db"))


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def invoke(runner):
    """``invoke("list", "--json")`` -> click's Result, exceptions caught as the console script would."""
    from flashtune.cli import cli

    def run(*args, **kwargs):
        return runner.invoke(cli, [str(a) for a in args], prog_name="flashtune", **kwargs)

    return run


@pytest.fixture
def db(tmp_path) -> str:
    """A store holding the sample table (two GPUs, six results)."""
    from exchange_samples import table

    from flashtune.store import Store

    path = tmp_path / "tuned.db"
    with Store(path) as store:
        store.import_results(table())
    return str(path)
