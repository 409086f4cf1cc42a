"""Optuna's storage under faults (issue 17, items 2 and 9): a journal whose last write was
cut short (disk full) is repaired with a warning naming the file; an RDB storage that
cannot be reached is one error line, password hidden, before any trial."""

from __future__ import annotations

import warnings

import optuna
import pytest
from autotuner_helpers import GPU
from click.testing import CliRunner

from flashtune.autotuner.search import open_storage
from flashtune.cli import cli


def _journal_with_a_torn_last_line(path):
    """A journal holding one study with one finished trial, then half of a write."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    study = optuna.create_study(study_name="before", storage=storage)
    study.add_trial(optuna.trial.create_trial(value=1.0, params={}, distributions={}))
    whole = path.read_bytes()
    last = whole.splitlines(keepends=True)[-1]
    with path.open("ab") as f:
        f.write(last[: len(last) // 2])  # what a full disk leaves
    return len(whole), len(whole.splitlines())


def _open(path):
    storage, _ = open_storage(str(path), None)
    return storage


def test_a_torn_last_line_is_cut_off_with_a_warning_naming_the_file(tmp_path):
    path = tmp_path / "optuna-journal.log"
    size, lines = _journal_with_a_torn_last_line(path)
    torn = path.read_bytes()[size:]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        storage = _open(path)
    aside = next(tmp_path.glob("optuna-journal.log.damaged-*"), None)  # 3a7812e: no repair, no warning
    assert [str(w.message) for w in record if w.category.__name__ == "JournalRepaired"] == [(
        f"the Optuna journal {path} was damaged at line {lines + 1} (a write cut short, e.g. by a full disk): the "
        f"journal now ends before it, and the {len(torn)} bytes from there are kept in {aside}; the trials they held "
        "are taken back from the store")]
    assert aside.read_bytes() == torn and path.stat().st_size == size
    optuna.create_study(study_name="after", storage=storage)  # an append after the cut
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # whole again: nothing to repair
        again = _open(path)  # 3a7812e: json.JSONDecodeError "Expecting ..." naming no file
    assert [s.study_name for s in optuna.study.get_all_study_summaries(storage=again)] == ["before", "after"]
    assert len(optuna.load_study(study_name="before", storage=again).trials) == 1


def test_a_search_on_a_torn_journal_says_so_and_runs(tmp_path):
    journal = tmp_path / "journal.log"
    _journal_with_a_torn_last_line(journal)
    out = CliRunner().invoke(cli, ["search", "--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len",
                                   "16", "--full", "--pass", "fwd", "--trials", "1", "--db", str(tmp_path / "t.db"),
                                   "--storage", str(journal), "--no-progress"], prog_name="flashtune")
    assert out.exit_code == 0, out.output
    assert out.stderr.splitlines()[1].startswith(f"warning: the Optuna journal {journal} was damaged at line ")
    assert f"1 of 1 key tuned on {GPU}" in out.stdout
    assert _open(journal) is not None


def test_an_unreachable_storage_is_one_line_with_the_password_hidden(tmp_path):
    url = "postgresql+psycopg://user:s3cret@127.0.0.1:5999/x"  # no server there
    out = CliRunner().invoke(cli, ["search", "--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len",
                                   "16", "--full", "--pass", "fwd", "--trials", "1", "--db", str(tmp_path / "t.db"),
                                   "--storage", url, "--no-progress"], prog_name="flashtune")
    assert out.exit_code == 1 and "Traceback" not in out.output and "s3cret" not in out.output
    error = out.stderr.splitlines()[-1]
    assert error.startswith("Error: storage: cannot open the Optuna storage "
                            "postgresql+psycopg://user:***@127.0.0.1:5999/x: ")
    assert "127.0.0.1" in error and error.endswith("check the URL and that its server runs, or leave --storage out "
                                                   "for a journal file next to the store")
    assert out.stderr.count("\n") == 2  # the header and the error, nothing else
