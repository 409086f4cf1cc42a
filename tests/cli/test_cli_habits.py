"""What users expect of a command line (issue 17's "CLI habits"), with exact output:
progress as log lines where stderr is no terminal, Ctrl-C exits 130, export does not
overwrite without --force, CSV booleans as true/false, TFLOPS with one decimal, "1 key",
reading commands leave the disk as it was, delete and db reset ask first, db upgrade
makes a missing directory."""

from __future__ import annotations

import dataclasses

import pytest
from exchange_samples import H200, key, result

from flashtune.autotuner.search import KeyResult, Progress, SearchSummary
from flashtune.kernels import FwdConfig
from flashtune.keys import GpuInfo, TuningKey
from flashtune.outcome import Outcome
from flashtune.store import Store, head_revision

INTERPRETER = GpuInfo.interpreter().key
HEADER = "(the Triton interpreter: a CPU demo)"


# -- search progress -------------------------------------------------------------------------

def _fake_search(monkeypatch, ticks):
    """search() that reports two trials of one key, 10 s of ``ticks`` apart, then a skipped key."""
    from flashtune.cli import progress

    clock = iter(ticks)
    monkeypatch.setattr(progress.TrialLog, "clock", staticmethod(lambda: next(clock)))
    calls = {}

    def search(keys, *, progress=None, **kwargs):
        calls.update(progress=progress)
        first, second = keys
        done = KeyResult(first, "tuned", FwdConfig(32, 32, 4, 2), 0.5, 1.211e-06, 0.75, n_trials=2,
                         outcomes={"ok": 1, "incorrect": 1}, wall_s=20.0, timer="interpreter-wall-clock")
        if progress is not None:
            progress(Progress(first, 0, 2, 2, 0))
            progress(Progress(first, 0, 2, 2, 1, 0.5, trial=(FwdConfig(32, 32, 4, 2), Outcome("ok", time_ms=0.5))))
            progress(Progress(first, 0, 2, 2, 2, 0.5, trial=(FwdConfig(16, 32, 4, 1), Outcome("incorrect"))))
            progress(Progress(first, 0, 2, 2, 2, 0.5, 0.75, done=True, result=done))
            already = KeyResult(second, "already_tuned", n_trials=2)
            progress(Progress(second, 1, 2, 2, 0, done=True, result=already))
        return SearchSummary([done, KeyResult(second, "already_tuned", n_trials=2)], True, "journal.log")

    monkeypatch.setattr("flashtune.autotuner.search", search)
    return calls


TWO_KEYS = ["--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len", "16,32", "--full", "--pass", "fwd",
            "--trials", "2"]
LOG = """\
searching 2 keys on triton-interpreter@sm00 (the Triton interpreter: a CPU demo), 2 trials per key
[1/4 trials] fwd float32 d16 n16 full: trial 1/2 32x32 w4 s2: 0.5 ms, best 0.5 ms, ETA 0:00:30
[2/4 trials] fwd float32 d16 n16 full: trial 2/2 16x32 w4 s1: incorrect, best 0.5 ms, ETA 0:00:20
[1/2 keys] fwd float32 d16 n16 full: tuned, 0.5 ms (1.50x the default) in 0:00:20, ETA 0:00:20
[2/2 keys] fwd float32 d16 n32 full: already tuned, ETA 0:00:00
"""
SUMMARY = """\
key                        status          winner         ms   TFLOPS   vs default   trials   rejected   runner
───────────────────────────────────────────────────────────────────────────────────────────────────────────────
fwd float32 d16 n16 full   tuned           32x32 w4 s2   0.5     <0.1        1.50x        2          1   triton
fwd float32 d16 n32 full   already_tuned   -               -        -            -        2          0   -
1 of 2 keys tuned on triton-interpreter@sm00; Optuna storage: journal.log
timings: interpreter-wall-clock (Triton interpreter on the CPU, wall clock: not GPU performance)
rejected trials: 1 incorrect
"""


@pytest.mark.parametrize("flag", [[], ["--progress"]], ids=["default", "--progress"])
def test_a_search_whose_stderr_is_no_terminal_logs_a_line_per_trial_and_key(invoke, monkeypatch, tmp_path, flag):
    calls = _fake_search(monkeypatch, [0.0, 10.0, 20.0, 20.0, 20.0])
    out = invoke("search", *TWO_KEYS, "--db", tmp_path / "t.db", *flag)
    assert (out.exit_code, out.stderr, out.stdout) == (0, LOG, SUMMARY)
    # no bar: on 3a7812e --progress in a pipe printed only its last frame
    assert type(calls["progress"]).__name__ == "TrialLog"


def test_no_progress_prints_the_summary_only(invoke, monkeypatch, tmp_path):
    calls = _fake_search(monkeypatch, [0.0])
    out = invoke("search", *TWO_KEYS, "--db", tmp_path / "t.db", "--no-progress")
    assert (out.exit_code, out.stderr, out.stdout) == (0, LOG.splitlines(keepends=True)[0], SUMMARY)
    assert calls == {"progress": None}


def test_one_key_and_one_trial_are_singular(invoke, monkeypatch, tmp_path):
    def search(keys, **kwargs):
        return SearchSummary([KeyResult(keys[0], "no_valid_config", n_trials=1, outcomes={"incorrect": 1})], True,
                             "journal.log")

    monkeypatch.setattr("flashtune.autotuner.search", search)
    out = invoke("search", "--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len", "16", "--full",
                 "--pass", "fwd", "--trials", "1", "--db", tmp_path / "t.db", "--no-progress")
    assert out.exit_code == 1
    assert out.stderr == (f"searching 1 key on {INTERPRETER} {HEADER}, 1 trial per key\n"
                          "Error: 1 of 1 key was not tuned (no_valid_config): `flashtune show` with a key's options "
                          "lists its trials and their errors\n")
    assert "0 of 1 key tuned on" in out.stdout


# -- Ctrl-C ----------------------------------------------------------------------------------

def test_ctrl_c_exits_130(invoke, db, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Store, "list_results", interrupted)
    out = invoke("list", "--db", db)
    assert (out.exit_code, out.stdout, out.stderr) == (130, "", "interrupted\n")  # 3a7812e: 1, "Aborted!"


# -- export ----------------------------------------------------------------------------------

def test_export_does_not_overwrite_a_file_without_force(invoke, db, tmp_path):
    target = tmp_path / "h200.json"
    target.write_text("precious")
    out = invoke("export", "-o", target, "--db", db)
    assert (out.exit_code, out.output) == (1, f"Error: {target} exists: pass --force to overwrite it, or export to "
                                              "another file\n")
    assert target.read_text() == "precious"
    out = invoke("export", "-o", target, "--db", db, "--force")
    assert out.exit_code == 0 and target.read_text().startswith("{")


# -- formats ---------------------------------------------------------------------------------

def test_csv_booleans_are_true_and_false_as_documented(invoke, db):
    out = invoke("list", "--db", db, "--csv", "--gpu", H200.key, "--seq-len", "1024", "--pass", "fwd")
    assert out.exit_code == 0
    rows = [line.split(",")[:9] for line in out.stdout.splitlines()]
    assert rows == [["gpu", "dtype", "head_dim", "seq_q", "seq_k", "group", "batch_heads", "causal", "pass"],
                    [H200.key, "bfloat16", "64", "1024", "1024", "1", "512", "true", "fwd"],
                    [H200.key, "float16", "128", "1024", "1024", "1", "256", "false", "fwd"]]
    assert "booleans as true/false" in invoke("list", "--help").output


def test_tflops_print_with_one_decimal(invoke, tmp_path):
    path = tmp_path / "t.db"
    with Store(path) as store:
        for n, figure in ((512, 1.211e-06), (1024, 456.74)):
            store.save_result(dataclasses.replace(result(key(n)), tflops=figure))
    out = invoke("list", "--db", path)
    assert out.exit_code == 0
    assert [line.split()[-4] for line in out.stdout.splitlines()[2:]] == ["<0.1", "456.7"]  # was 1.211e-06
    shown = invoke("show", "--db", path, "--seq-len", "512")
    assert "  TFLOPS        <0.1\n" in shown.stdout


# -- reading commands leave the disk as it was ----------------------------------------------

def test_reading_commands_do_not_create_the_data_directory(invoke, tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHTUNE_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    path, head = tmp_path / "xdg" / "flashtune" / "tuned.db", head_revision()
    info = invoke("info")
    assert info.exit_code == 0 and info.stderr == ""
    assert info.stdout.splitlines()[-4:] == [
        f"store          sqlite:///{path}",
        f"schema         no store yet (created by the first search or `flashtune db upgrade`; schema {head})",
        "tuned results  -",
        f"shipped table  none for {INTERPRETER} (`flashtune list --shipped` shows the GPUs flashtune ships tables "
        "for)"]
    current = invoke("db", "current")
    assert (current.exit_code, current.stdout, current.stderr) == (
        0, f"sqlite:///{path}: no flashtune store (`flashtune db upgrade` or the first search creates it; this "
           f"flashtune's schema is {head})\n", "")
    listed = invoke("list")
    assert (listed.exit_code, listed.stdout, listed.stderr) == (
        1, "", f"Error: no flashtune store at {path}: tune with `flashtune search`, import a file with `flashtune "
               "import FILE`, or point --db at another store\n")
    assert not (tmp_path / "xdg").exists()  # on 3a7812e: xdg/flashtune/ made by each


def test_db_upgrade_makes_a_missing_directory(invoke, tmp_path):
    path = tmp_path / "new" / "dir" / "tuned.db"
    out = invoke("db", "upgrade", "--db", path)
    head = head_revision()
    assert (out.exit_code, out.output) == (0, f"created the store at sqlite:///{path}: schema revision {head} "
                                              "(head)\n")


# -- delete and db reset ---------------------------------------------------------------------

def _keys(db) -> list[TuningKey]:
    with Store(db) as store:
        return [r.key for r in store.list_results()]


def test_delete_asks_then_deletes_the_matching_results(invoke, db):
    before = _keys(db)
    out = invoke("delete", "--db", db, "--gpu", H200.key, "--pass", "fwd", input="n\n")
    where = f"gpu='{H200.key}', pass='fwd'"
    assert (out.exit_code, out.output) == (1, f"delete 3 tuned results ({where}) from sqlite:///{db}? [y/N]: n\n"
                                              "Aborted!\n")
    assert _keys(db) == before
    out = invoke("delete", "--db", db, "--gpu", H200.key, "--pass", "fwd", input="y\n")
    assert out.exit_code == 0
    assert out.stdout == (f"deleted 3 tuned results ({where}); their trials stay, `flashtune search --force` tunes "
                          "these keys again\n")
    assert _keys(db) == [k for k in before if not (k.gpu == H200.key and k.pass_ == "fwd")]
    out = invoke("delete", "--db", db, "--seq-len", "512", "--pass", "bwd", "--yes")
    assert (out.exit_code, out.output) == (0, "deleted 1 tuned result (seq_q=512, pass='bwd'); their trials stay, "
                                              "`flashtune search --force` tunes these keys again\n")


def test_delete_needs_a_filter_and_a_match(invoke, db):
    out = invoke("delete", "--db", db, "--yes")
    assert out.exit_code == 2 and out.output.endswith(
        "Error: give at least one filter (--gpu, --dtype, --head-dim, --seq-len, --seq-k, --group, --batch-heads, "
        "--causal/--full, --pass); `flashtune db reset` deletes everything\n")
    out = invoke("delete", "--db", db, "--seq-len", "3", "--yes")
    assert (out.exit_code, out.output) == (1, "Error: no tuned result matches (seq_q=3): `flashtune list` shows "
                                              "what is stored\n")


def test_db_reset_asks_then_empties_the_store(invoke, db):
    out = invoke("db", "reset", "--db", db, input="\n")
    assert (out.exit_code, out.output) == (1, f"delete every tuned result and trial from sqlite:///{db}? [y/N]: \n"
                                              "Aborted!\n")
    assert len(_keys(db)) == 6
    out = invoke("db", "reset", "--db", db, input="y\n")
    assert out.exit_code == 0
    assert out.stdout == f"emptied sqlite:///{db}: 6 tuned results and every trial deleted\n"
    with Store(db) as store:
        assert store.list_results() == [] and store.list_gpus() == []
