"""An upgrade, end to end under the Triton interpreter: a store tuned under this flashtune's kernel
sources, then the sources change (a copy of the package with one kernel file edited, hashed as an
upgraded installation's would be). No stale row is served; `flashtune revalidate` brings the rows
back, with a handful of trials; an export made before the upgrade imports without --force, stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from flashtune import __version__, dispatch, provenance
from flashtune.cli import cli
from flashtune.dispatch import get_tuned_attention
from flashtune.keys import GpuInfo, TuningKey
from flashtune.store import Store

INTERPRETER = GpuInfo.interpreter().key
KEY = TuningKey(INTERPRETER, "float32", 16, 16, False, "fwd")
TINY = ["--interpreter", "--head-dim", "16", "--dtype", "fp32", "--seq-len", "16", "--full", "--pass", "fwd",
        "--trials", "3"]


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="flashtune")


def _qkv():
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, 16, 16, generator=gen) for _ in range(3))


def _source(db) -> str:
    dispatch._TABLES.clear()
    return get_tuned_attention(db).explain(*_qkv()).fwd_source


@pytest.fixture
def upgrade(tmp_path, monkeypatch):
    """``upgrade()``: from now on this process hashes a package whose forward kernel file changed."""
    monkeypatch.setattr(dispatch, "_TABLES", {})
    monkeypatch.setattr(dispatch, "_WARNED", set())

    def upgrade() -> str:
        package = Path(provenance.__file__).resolve().parent
        copy = tmp_path / "upgraded" / "flashtune"
        shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
        forward = copy / "kernels" / "triton" / "forward.py"
        forward.write_text(forward.read_text() + "\n# the next release's forward kernel\n")
        monkeypatch.setattr(provenance, "_PACKAGE", copy)
        provenance.kernel_source_hash.cache_clear()
        return provenance.kernel_source_hash()

    yield upgrade
    provenance.kernel_source_hash.cache_clear()


@pytest.mark.slow
def test_an_upgrade_keeps_the_tuning_and_serves_nothing_unchecked(tmp_path, upgrade):
    db, journal, before = tmp_path / "tuned.db", tmp_path / "journal.log", tmp_path / "before.json"
    searched = _invoke("search", *TINY, "--db", db, "--storage", journal)
    assert searched.exit_code == 0, searched.output
    assert _invoke("export", "--db", db, "-o", before).exit_code == 0
    assert _source(db) == "tuned exact"
    with Store(db) as store:
        tuned = store.load_table(INTERPRETER)[KEY]
        trials_before = len(store.trials_for(KEY))
    old_hash = provenance.kernel_source_hash()

    new_hash = upgrade()
    assert new_hash != old_hash
    # not served: the heuristic default, and the source says why and what fixes it
    with pytest.warns(dispatch.DispatchWarning, match="are stale .* not served until `flashtune revalidate"):
        source = _source(db)
    assert source.startswith(f"heuristic (the tuned fwd config of {KEY.label()} is stale, tuned with kernel "
                             f"sources {old_hash}") and source.endswith("`flashtune revalidate` checks it again)")
    listed = _invoke("list", "--db", db, "--json")
    assert [r["stale"] for r in json.loads(listed.stdout)] == [f"kernel sources {old_hash} (flashtune {__version__})"]
    info = json.loads(_invoke("info", "--db", db, "--json").stdout)
    assert (info["store"]["tuned_results"], info["store"]["stale_results"]) == (1, 1)

    out = _invoke("revalidate", "--interpreter", "--db", db, "--json", "--no-progress")
    assert out.exit_code == 0, out.output
    [key] = json.loads(out.stdout)["keys"]
    assert key["status"] == "revalidated" and key["trials"] == tuned.n_trials  # the search's count, kept
    with Store(db) as store:
        row = store.load_table(INTERPRETER)[KEY]
        new_trials = store.trials_for(KEY)[trials_before:]
    # the winner, its runners-up of the search and the default, each checked once: no search
    assert 1 <= len(new_trials) <= 4 and all(t.kernel_hash == new_hash for t in new_trials)
    assert tuned.config.canonical() in {t.config.canonical() for t in new_trials}
    assert row.provenance.kernel_hash == new_hash and row.n_trials == tuned.n_trials
    assert _source(db) == "tuned exact"
    again = _invoke("revalidate", "--interpreter", "--db", db)
    assert (again.exit_code, again.stdout) == (0, "")
    assert again.stderr == f"nothing to revalidate: no stale result for {INTERPRETER} matches (everything)\n"
    # a search with the same budget finds the key done
    resumed = _invoke("search", *TINY, "--db", db, "--storage", journal, "--json", "--no-progress")
    assert [k["status"] for k in json.loads(resumed.stdout)["keys"]] == ["already_tuned"]

    # the export made before the upgrade: imported without --force, stale, then revalidated too
    fresh = tmp_path / "fresh.db"
    imported = _invoke("import", before, "--db", fresh)
    assert imported.exit_code == 0, imported.output
    assert "note: 1 of 1 result is stale" in imported.stderr
    assert _source(fresh).startswith("heuristic (the tuned fwd config")
    assert _invoke("revalidate", "--interpreter", "--db", fresh, "--no-progress").exit_code == 0
    assert _source(fresh) == "tuned exact"
    assert not (tmp_path / "optuna-journal.log").exists()  # a revalidation asks no Optuna study
