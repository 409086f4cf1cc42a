"""``flashtune db upgrade``, ``flashtune db current`` and ``flashtune info``."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch
import triton

from flashtune import __version__
from flashtune.provenance import kernel_source_hash
from flashtune.store import VERSION_TABLE, head_revision

HEAD = head_revision()


def _url(path) -> str:
    return f"sqlite:///{path}"


def test_db_upgrade_creates_then_finds_nothing_to_do(invoke, tmp_path):
    path = tmp_path / "new.db"
    out = invoke("db", "current", "--db", path)
    assert out.exit_code == 0
    assert out.output == (f"{_url(path)}: no flashtune store (`flashtune db upgrade` or the first search creates "
                          f"it; this flashtune's schema is {HEAD})\n")
    assert not path.exists()
    out = invoke("db", "upgrade", "--db", path)
    assert (out.exit_code, out.output) == (0, f"created the store at {_url(path)}: schema revision {HEAD} (head)\n")
    out = invoke("db", "upgrade", "--db", path)
    assert (out.exit_code, out.output) == (0, f"{_url(path)} is already at schema revision {HEAD} (head)\n")
    out = invoke("db", "current", "--db", path)
    assert (out.exit_code, out.output) == (0, f"{_url(path)}: schema revision {HEAD} (head)\n")


def test_db_commands_use_flashtune_db_by_default(invoke, tmp_path, monkeypatch):
    path = tmp_path / "env.db"
    monkeypatch.setenv("FLASHTUNE_DB", str(path))
    assert invoke("db", "upgrade").exit_code == 0
    assert invoke("db", "current").output == f"{_url(path)}: schema revision {HEAD} (head)\n"


@pytest.fixture
def newer_db(db):
    """The sample store, marked as written by a newer flashtune."""
    with sqlite3.connect(db) as connection:
        connection.execute(f"UPDATE {VERSION_TABLE} SET version_num = 'f00d_from_the_future'")
    return db


def test_a_store_from_a_newer_flashtune(invoke, newer_db):
    out = invoke("db", "current", "--db", newer_db)
    assert out.exit_code == 0
    assert out.output.splitlines()[0] == (f"{_url(newer_db)}: schema revision f00d_from_the_future (unknown: "
                                          f"written by a newer flashtune; this flashtune's is {HEAD})")
    assert out.output.splitlines()[1].endswith("it was written by a newer flashtune; upgrade flashtune")
    for args in (["list"], ["db", "upgrade"], ["export", "-o", "x.json"]):
        out = invoke(*args, "--db", newer_db)
        assert out.exit_code == 1, args
        assert out.output.startswith("Error: ") and out.output.rstrip().endswith("upgrade flashtune"), out.output
        assert out.output.count("\n") == 1


def test_db_upgrade_of_a_file_that_is_not_a_database(invoke, tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"junk" * 1000)
    out = invoke("db", "upgrade", "--db", path)
    assert out.exit_code == 1
    assert "file is not a database" in out.output and out.output.count("\n") == 1


def test_info_without_a_store(invoke, tmp_path):
    out = invoke("info", "--db", tmp_path / "none.db")
    assert out.exit_code == 0
    lines = dict(line.split("  ", 1) for line in out.output.splitlines())
    lines = {name.strip(): value.strip() for name, value in lines.items()}
    assert lines["flashtune"] == f"{__version__} (kernel source hash {kernel_source_hash()})"
    assert lines["torch"] == f"{torch.__version__} (supported: torch>=2.11,<2.14)"
    assert lines["triton"] == f"{triton.__version__} (supported: triton>=3.6,<3.7)"
    assert lines["store"] == _url(tmp_path / "none.db")
    assert lines["schema"].startswith("no store yet")
    assert lines["tuned results"] == "-"
    if not torch.cuda.is_available():
        assert lines["GPU"] == ("none: torch sees no CUDA GPU (`--interpreter` demos run as "
                                "triton-interpreter@sm00)")
    assert not (tmp_path / "none.db").exists()  # info never creates a store


def test_info_with_a_store(invoke, db):
    out = invoke("info", "--db", db, "--json")
    assert out.exit_code == 0
    info = json.loads(out.output)
    assert info["store"] == {"location": _url(db), "revision": HEAD, "head_revision": HEAD, "tuned_results": 0,
                             "stale_results": 0, "total_results": 6, "problem": None}
    assert info["shipped_table"] is None  # flashtune ships no table for this machine's GPU
    assert info["supported"] == {"torch": "torch>=2.11,<2.14", "triton": "triton>=3.6,<3.7"}
    assert info["versions"]["flashtune"] == __version__ and info["versions"]["kernel_hash"] == kernel_source_hash()
    text = invoke("info", "--db", db).output
    this_gpu = info["gpu"]["key"] if info["gpu"] else info["interpreter_gpu_key"]
    assert f"tuned results  0 for {this_gpu} (6 in all)\n" in text
    assert f"schema         {HEAD} (head)\n" in text


def test_info_reports_an_unusable_store_without_failing(invoke, newer_db):
    out = invoke("info", "--db", newer_db)
    assert out.exit_code == 0
    assert f"schema         f00d_from_the_future (this flashtune's is {HEAD}: `flashtune db current` says what to do)" \
        in out.output
