"""``flashtune search`` and ``flashtune bench`` end to end under the Triton interpreter.

One tiny search (head dim 16, float32, n=16, full attention, both passes, 2 trials per
key) runs once per module into a temporary store; the tests then list, show, re-run,
revalidate and benchmark it. Without a GPU both commands must say so and point at
--interpreter.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from click.testing import CliRunner

from flashtune.cli import cli
from flashtune import device as common
from flashtune.keys import GpuInfo, TuningKey
from flashtune.store import Store

INTERPRETER = GpuInfo.interpreter().key
TINY = ["--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len", "16", "--full", "--trials", "2"]
KEYS = [TuningKey(INTERPRETER, "float32", 16, 16, False, p) for p in ("fwd", "bwd")]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
# bench runs the kernels in this process: under the interpreter only if triton was imported with it
in_process_interpreter = pytest.mark.skipif(not common.INTERPRETER, reason="the kernels were imported for the GPU "
                                            "in this process (TRITON_INTERPRET unset); CPU CI runs these")


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="flashtune")


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """(store path, journal path, the search's Result) after the tiny interpreter search."""
    root = tmp_path_factory.mktemp("search")
    db, journal = root / "tuned.db", root / "journal.log"
    out = _invoke("search", *TINY, "--db", db, "--storage", journal)
    return db, journal, out


def _copy(searched, tmp_path):
    db, journal, _ = searched
    shutil.copy(db, tmp_path / "tuned.db")
    shutil.copy(journal, tmp_path / "journal.log")
    return tmp_path / "tuned.db", tmp_path / "journal.log"


def test_search_tunes_the_keys_and_prints_a_summary(searched):
    db, journal, out = searched
    assert out.exit_code == 0, out.output
    header, *log = out.stderr.splitlines()
    assert header == f"searching 2 keys on {INTERPRETER} (the Triton interpreter: a CPU demo), 2 trials per key"
    # stderr is no terminal here: one line per trial and per key, as they happen
    ms, eta = r"[0-9.e+-]+ ms", r"ETA \d:\d\d:\d\d"
    trial = rf"\[{{}}/4 trials\] {{}}: trial {{}}/2 [^:]+: ({ms}|[a-z_]+)(, best {ms})?, {eta}"
    key_line = rf"\[{{}}/2 keys\] {{}}: tuned, {ms} \([0-9.]+x the default\) in \d:\d\d:\d\d, {eta}"
    fwd, bwd = "fwd float32 d16 n16 full on cpu", "bwd float32 d16 n16 full on cpu"  # the key, on its device
    patterns = [trial.format(1, fwd, 1), trial.format(2, fwd, 2), key_line.format(1, fwd), trial.format(3, bwd, 1),
                trial.format(4, bwd, 2), key_line.format(2, bwd)]
    assert len(log) == len(patterns) and all(re.fullmatch(p, line) for p, line in zip(patterns, log)), log
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["key", "status", "winner", "ms", "TFLOPS", "vs", "default", "trials", "rejected",
                                "runner"]
    assert [line.split()[:6] for line in lines[2:4]] == [["fwd", "float32", "d16", "n16", "full", "tuned"],
                                                        ["bwd", "float32", "d16", "n16", "full", "tuned"]]
    assert [line.split()[-3:] for line in lines[2:4]] == [["2", "0", "triton"], ["2", "0", "triton"]]
    assert lines[4:] == [
        f"2 of 2 keys tuned on {INTERPRETER}; Optuna storage: {journal}",
        "timings: interpreter-wall-clock (Triton interpreter on the CPU, wall clock: not GPU performance)",
    ]
    with Store(db) as store:
        assert sorted(store.load_table(INTERPRETER)) == sorted(KEYS)
        assert [len(store.trials_for(k)) for k in KEYS] == [2, 2]


def test_list_and_show_the_search(searched):
    db, _, _ = searched
    out = _invoke("list", "--db", db)
    assert out.exit_code == 0
    rows = [line.split()[:9] for line in out.output.splitlines()[2:]]
    assert rows == [[INTERPRETER, pass_, "float32", "16", "16", "16", "1", "2", "full"] for pass_ in ("bwd", "fwd")]
    out = _invoke("show", "--db", db, "--pass", "fwd")
    assert out.exit_code == 0
    assert out.output.startswith(f"fwd float32 d16 n16 full on {INTERPRETER}\n")
    assert "\n2 trials (each config checked, then timed once; the times above are the re-timing's):\n" in out.output


def test_search_again_skips_finished_keys(searched, tmp_path):
    db, journal = _copy(searched, tmp_path)
    out = _invoke("search", *TINY, "--db", db, "--storage", journal, "--json")
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout)
    assert summary["interpreter"] is True
    assert [(k["pass"], k["status"]) for k in summary["keys"]] == [("fwd", "already_tuned"), ("bwd", "already_tuned")]
    with Store(db) as store:
        assert [len(store.trials_for(k)) for k in KEYS] == [2, 2]


def test_revalidate_retimes_the_stored_keys(searched, tmp_path):
    db, journal = _copy(searched, tmp_path)
    with Store(db) as store:
        before = store.load_table(INTERPRETER)
    out = _invoke("search", "--interpreter", "--revalidate", "--trials", "2", "--pass", "fwd", "--db", db,
                  "--storage", journal)
    assert out.exit_code == 0, out.output
    assert out.stderr.startswith(f"revalidating 1 key on {INTERPRETER}")
    lines = out.stdout.splitlines()
    assert lines[0].split()[-2:] == ["was", "ms"]
    assert lines[2].split()[:6] == ["fwd", "float32", "d16", "n16", "full", "revalidated"]
    assert float(lines[2].split()[-1]) == pytest.approx(before[KEYS[0]].time_ms, rel=1e-3)
    with Store(db) as store:
        after = store.load_table(INTERPRETER)
        # both finalists checked and timed again (two more trials), nothing searched anew
        fwd_trials = store.trials_for(KEYS[0])
        assert [len(fwd_trials), len(store.trials_for(KEYS[1]))] == [4, 2]
        assert sorted(str(t.config) for t in fwd_trials[2:]) == sorted(str(t.config) for t in fwd_trials[:2])
        assert [t.status for t in fwd_trials[2:]] == ["ok", "ok"]
    assert after[KEYS[0]].updated_at > before[KEYS[0]].updated_at  # fwd re-timed and stored again
    assert after[KEYS[1]] == before[KEYS[1]]  # bwd was not asked for


def test_revalidate_with_nothing_stored(tmp_path):
    out = _invoke("search", "--interpreter", "--revalidate", "--db", tmp_path / "empty.db")
    assert out.exit_code == 1
    assert out.output.endswith(f"Error: no flashtune store at {tmp_path / 'empty.db'}: tune with `flashtune search`, "
                               "import a file with `flashtune import FILE`, or point --db at another store\n")
    Store(tmp_path / "empty.db").close()
    out = _invoke("search", "--interpreter", "--revalidate", "--db", tmp_path / "empty.db")
    assert out.exit_code == 1
    assert out.output == (f"Error: nothing to revalidate: the store has no tuned results for {INTERPRETER} that "
                          "match the key options; run `flashtune search` first\n")



def test_revalidate_says_when_the_store_keeps_a_faster_result_written_meanwhile(tmp_path, monkeypatch):
    """A search that held the key's claim, or an import, stored a faster current row after the
    command read the stale one: the summary says the store keeps it, as `list` then shows."""
    from exchange_samples import key, result

    from flashtune.cli import revalidate

    here, db = GpuInfo.interpreter(), tmp_path / "tuned.db"
    k = key(16, gpu=here, dtype="float32", head_dim=16, causal=False)
    faster = result(k, 2**-14, gpu=here, block=32)
    with Store(db) as store:
        store.save_result(result(k, 0.5, gpu=here, block=16, kernel_hash="00000000deadbeef"))
    read = revalidate._rows_to_check

    def then_a_faster_one_lands(*args, **kwargs):
        rows = read(*args, **kwargs)
        with Store(db) as store:
            store.save_result(faster)
        return rows

    monkeypatch.setattr(revalidate, "_rows_to_check", then_a_faster_one_lands)
    out = _invoke("revalidate", "--interpreter", "--no-progress", "--db", db)
    assert out.exit_code == 0, out.output
    assert f"{k.label()} revalidated: the store keeps a faster result written while this key was searched" \
        in out.stdout.splitlines()
    with Store(db) as store:
        assert store.load_table(here.key)[k].config == faster.config

def test_a_key_without_a_valid_config_fails_the_command(tmp_path):
    # bf16 is computed wrongly by the interpreter, so its one trial fails the correctness check
    out = _invoke("search", "--interpreter", "--dtype", "bfloat16", "--seq-len", "16", "--full", "--pass", "fwd",
                  "--trials", "1", "--db", tmp_path / "t.db", "--storage", tmp_path / "j.log")
    assert out.exit_code == 1
    assert out.stderr.startswith("warning: bfloat16 gives wrong results under the Triton interpreter")
    assert "no_valid_config" in out.stdout and "rejected trials: 1 incorrect\n" in out.stdout
    assert out.stderr.endswith("Error: 1 of 1 key was not tuned (no_valid_config): `flashtune show` with a key's "
                               "options lists its trials and their errors\n")


def test_a_shapes_row_of_bfloat16_under_the_interpreter_names_the_rows_dtype(tmp_path):
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("shapes:\n  - {B: 1, Hq: 2, Nq: 16, D: 16}\n")  # dtype left out: bfloat16
    out = _invoke("search", "--interpreter", "--shapes", shapes, "--trials", "1", "--db", tmp_path / "t.db",
                  "--storage", tmp_path / "j.log")
    assert out.exit_code == 1
    assert out.stderr.startswith("warning: bfloat16 gives wrong results under the Triton interpreter; its configs "
                                 "will fail the correctness check (give its rows `dtype: float32` (or float16))\n")


@no_gpu
@pytest.mark.parametrize("command", ["search", "bench"])
def test_without_a_gpu_the_commands_offer_the_interpreter(tmp_path, command):
    out = _invoke(command, "--db", tmp_path / "t.db")
    assert out.exit_code == 1
    assert out.output.startswith("Error: no CUDA GPU found (torch ")
    assert out.output.endswith(f"; run `flashtune {command} --interpreter` for a tiny demo under the Triton "
                               "interpreter on the CPU\n")
    assert not (tmp_path / "t.db").exists()


# -- bench --------------------------------------------------------------------------------


@in_process_interpreter
def test_bench_compares_tuned_and_default(searched, tmp_path):
    db, _, _ = searched
    plot = tmp_path / "bench.png"
    out = _invoke("bench", "--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len", "16,32", "--full",
                  "--pass", "fwd", "--db", db, "--plot", plot)
    assert out.exit_code == 0, out.output
    assert out.stderr == (f"benchmarking 2 keys x 2 implementations on {INTERPRETER} (Triton interpreter, CPU wall "
                          "clock: not GPU performance)\n")
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["key", "tuned", "TFLOPS", "default", "TFLOPS", "tuned/default", "tuned", "config"]
    assert lines[2].split()[:5] == ["fwd", "float32", "d16", "n16", "full"] and lines[2].endswith("  exact")
    assert lines[3].split()[:5] == ["fwd", "float32", "d16", "n32", "full"]
    assert lines[3].endswith("  nearest (fwd float32 d16 n16 full)")  # what get_tuned_attention serves there
    assert lines[4].startswith("geometric mean")
    assert lines[5:] == ["timer: interpreter-wall-clock; ratios are times (above 1: tuned is faster)",
                         f"plot: {plot}"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@in_process_interpreter
def test_bench_json(searched):
    db, _, _ = searched
    out = _invoke("bench", "--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len", "16", "--full",
                  "--pass", "bwd", "--db", db, "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert (report["gpu"], report["interpreter"], report["timer"]) == (INTERPRETER, True, "interpreter-wall-clock")
    assert [(m["impl"], m["pass"], m["note"]) for m in report["measurements"]] == [("tuned", "bwd", "tuned exact"),
                                                                                  ("default", "bwd", "")]
    assert all(m["time_ms"] > 0 and m["tflops"] > 0 for m in report["measurements"])
    [ratios] = report["ratios"]
    expected = report["measurements"][1]["time_ms"] / report["measurements"][0]["time_ms"]
    assert ratios["tuned/default"] == pytest.approx(expected)
    assert report["geomean"]["tuned/default"] == pytest.approx(expected)


@in_process_interpreter
def test_bench_without_tuned_results_says_so(tmp_path):
    out = _invoke("bench", "--interpreter", "--seq-len", "16", "--full", "--pass", "fwd", "--impl", "tuned",
                  "--db", tmp_path / "none.db")
    assert out.exit_code == 0, out.output
    assert out.stderr.endswith(f"note: nothing is tuned for these keys on {INTERPRETER} in this store; run "
                               "`flashtune search --interpreter` first\n")
    # the dispatcher's warning, as a note: no store is no error (a fresh install), nothing tuned is
    assert f"note: flashtune has no tuned configs for {INTERPRETER} in sqlite:///{tmp_path / 'none.db'} (and ships " \
        "none for it)" in out.stderr
    assert out.stdout.splitlines()[2].split()[-4:] == ["-", "not", "tuned", "(heuristic)"]
    assert not (tmp_path / "none.db").exists()


def test_bench_usage_errors(tmp_path):
    out = _invoke("bench", "--interpreter", "--impl", "cudnn")
    assert out.exit_code == 2
    assert "under the interpreter only --impl tuned and --impl default can run" in out.output


@pytest.mark.parametrize("error, message, code", [
    (KeyboardInterrupt(),
     "interrupted: the keys finished so far are stored; run the same command again to resume\n", 130),
    (ValueError("storage: '/x' is a directory; give the journal file's path"),
     "Error: storage: '/x' is a directory; give the journal file's path\n", 1),
])
def test_search_errors_are_one_line(monkeypatch, tmp_path, error, message, code):
    def fake_search(keys, **kwargs):
        raise error

    monkeypatch.setattr("flashtune.autotuner.search", fake_search)
    out = _invoke("search", *TINY, "--db", tmp_path / "t.db")
    assert out.exit_code == code
    assert out.stderr.endswith(message) and "Traceback" not in out.output


@in_process_interpreter
def test_bench_rounds_interleave_the_implementations(searched, monkeypatch):
    """--rounds N: every implementation timed once per round, round after round; each time
    the median of its rounds."""
    import dataclasses

    from flashtune.cli import _bench

    db, _, _ = searched
    calls, real = [], _bench._prepare

    def prepare(key, impl, device, tuned):
        timer = real(key, impl, device, tuned)
        if isinstance(timer, _bench.Measurement):
            return timer
        fake = iter([3.0, 1.0, 2.0] if impl == "tuned" else [5.0, 4.0, 6.0])
        return dataclasses.replace(timer, once=lambda: calls.append(impl) or next(fake))

    monkeypatch.setattr(_bench, "_prepare", prepare)
    out = _invoke("bench", "--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len", "16", "--full",
                  "--pass", "fwd", "--db", db, "--rounds", "3", "--json")
    assert out.exit_code == 0, out.output
    assert calls == ["tuned", "default"] * 3
    report = json.loads(out.stdout)
    assert [m["time_ms"] for m in report["measurements"]] == [2.0, 5.0]
    assert report["timer"] == "interpreter-wall-clock, median of 3 interleaved rounds"
    assert _invoke("bench", "--interpreter", "--rounds", "0").exit_code == 2


def test_host_bound_reaches_the_search_and_its_summary_says_what_chose_each_runner(monkeypatch, tmp_path):
    from flashtune.autotuner.key_search import KeyResult
    from flashtune.autotuner.search import SearchSummary
    from flashtune.configs.forward import FwdConfig
    from flashtune.runners import RunnerTime

    seen = {}
    times = {"triton": RunnerTime(0.25, 0.5), "sdpa-flash": RunnerTime(0.375, 0.3125)}

    def fake_search(keys, **kwargs):
        seen.update(kwargs)
        return SearchSummary([KeyResult(k, "tuned", winner=FwdConfig(16, 16, 4, 1), time_ms=0.25, runner="sdpa-flash",
                                        runner_times=times, chosen_by="forced") for k in keys[:1]], True, "journal")

    monkeypatch.setattr("flashtune.autotuner.search", fake_search)
    out = _invoke("search", *TINY, "--pass", "fwd", "--sdpa", "--host-bound", "--db", tmp_path / "t.db", "--json")
    assert out.exit_code == 0, out.output
    assert seen["host_bound"] is True and seen["sdpa"] is True
    [row] = json.loads(out.stdout)["keys"]
    assert (row["runner"], row["chosen_by"]) == ("sdpa-flash", "forced")
    assert row["runner_times"] == {"triton": {"gpu_ms": 0.25, "eager_ms": 0.5},
                                   "sdpa-flash": {"gpu_ms": 0.375, "eager_ms": 0.3125}}
    table = _invoke("search", *TINY, "--pass", "fwd", "--sdpa", "--db", tmp_path / "t.db")
    assert seen["host_bound"] is False
    assert table.stdout.splitlines()[2].split()[-3:] == ["sdpa-flash", "(by", "eager)"]


@pytest.mark.parametrize("extra", [[], ["--no-sdpa"]])
def test_host_bound_without_a_race_is_a_usage_error(tmp_path, extra):
    out = _invoke("search", *TINY, "--host-bound", *extra, "--db", tmp_path / "t.db")
    assert out.exit_code == 2
    assert "--host-bound chooses among the runners SDPA's backends are raced against" in out.output
    assert "Traceback" not in out.output
    as_json = _invoke("search", *TINY, "--host-bound", *extra, "--db", tmp_path / "t.db", "--json")
    assert as_json.exit_code == 2 and "--host-bound" in json.loads(as_json.output)["error"]["message"]
