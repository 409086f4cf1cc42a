"""``flashtune list`` and ``flashtune show``: table, JSON and CSV output, filters, errors."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re

import pytest
from exchange_samples import A100, H200, TRITON, key, result

from flashtune.outcome import Outcome
from flashtune.kernels import BwdConfig, FwdConfig
from flashtune.provenance import kernel_source_hash
from flashtune.runners import RunnerTime
from flashtune.store import Store

LIST_TABLE = """\
gpu                          pass   dtype        d     nq     nk   g     bh   mask     config                 ms   TFLOPS   vs default   trials   runner
────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────
NVIDIA A100-SXM4-80GB@sm80   bwd    bfloat16    64    512    512   1   1024   causal   32x32/32x32 w8 s2   0.625    512.5        2.00x       16   triton
NVIDIA A100-SXM4-80GB@sm80   fwd    bfloat16    64    512    512   1   1024   causal   64x32 w4 s3         0.125    512.5        2.00x       16   triton
NVIDIA H200@sm90             bwd    bfloat16    64   1024   1024   1    512   causal   32x64/64x32 w8 s2     0.5    512.5        2.00x       16   triton
NVIDIA H200@sm90             fwd    bfloat16    64   1024   1024   1    512   causal   64x32 w4 s3          0.25    512.5        2.00x       16   triton
NVIDIA H200@sm90             fwd    bfloat16    64   2048   2048   1    256   causal   128x32 w4 s3         0.75    512.5        2.00x       16   triton
NVIDIA H200@sm90             fwd    float16    128   1024   1024   1    256   full     64x32 w4 s3         0.375    512.5            -       16   triton
"""


def test_list_prints_the_table(invoke, db):
    result_ = invoke("list", "--db", db)
    assert (result_.exit_code, result_.output) == (0, LIST_TABLE)


@pytest.mark.parametrize("args, rows", [
    (["--gpu", A100.key], [0, 1]),
    (["--pass", "bwd"], [0, 2]),
    (["--dtype", "float16"], [5]),
    (["--head-dim", "64", "--seq-len", "1024"], [2, 3]),
    (["--full"], [5]),
    (["--causal", "--gpu", H200.key, "--pass", "fwd"], [3, 4]),
])
def test_list_filters(invoke, db, args, rows):
    out = invoke("list", "--db", db, *args)
    lines = LIST_TABLE.splitlines()
    assert out.exit_code == 0
    assert [line.split() for line in out.output.splitlines()[2:]] == [lines[2 + i].split() for i in rows]


def test_list_json(invoke, db):
    out = invoke("list", "--db", db, "--json", "--gpu", H200.key, "--seq-len", "2048")
    assert out.exit_code == 0
    [record] = json.loads(out.output)
    assert record["created_at"] and record["updated_at"]
    del record["created_at"], record["updated_at"]
    assert record == {
        "gpu": H200.key, "dtype": "bfloat16", "head_dim": 64, "seq_q": 2048, "seq_k": 2048, "group": 1,
        "batch_heads": 256, "causal": True, "pass": "fwd",
        "config": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3, "tma": 0, "num_splits": 0,
                   "pack_gqa": -1, "family": 0, "pingpong": 1, "overlap": 1, "persistent": 0, "o_tile": 0, "occupancy": 1},
        "time_ms": 0.75, "tflops": 512.5, "default_time_ms": 1.5, "error": 0.125, "n_trials": 16, "speedup": 2.0,
        "runner": "triton", "chosen_by": None, "runner_times": None, "stale": None,
        "provenance": {"flashtune_version": "0.1.0", "kernel_hash": kernel_source_hash(), "triton_version": TRITON,
                       "torch_version": "2.11.0+cu130", "cuda_version": "13.0",
                       "driver_version": "cuda-driver-api 13.0"},
    }


def test_list_csv(invoke, db):
    out = invoke("list", "--db", db, "--csv", "--dtype", "float16")
    assert out.exit_code == 0
    rows = list(csv.DictReader(io.StringIO(out.output)))
    assert len(rows) == 1
    row = rows[0]
    assert (row["gpu"], row["pass"], row["causal"], row["time_ms"], row["default_time_ms"], row["speedup"]) == \
        (H200.key, "fwd", "false", "0.375", "", "")
    assert json.loads(row["config"]) == {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3, "tma": 0,
                                         "num_splits": 0, "pack_gqa": -1, "family": 0, "pingpong": 1, "overlap": 1,
                                         "persistent": 0, "o_tile": 0, "occupancy": 1}
    assert out.output.splitlines()[0].startswith("gpu,dtype,head_dim,seq_q,seq_k,group,batch_heads,causal,pass,config,time_ms,")


def _raced_store(tmp_path) -> str:
    """Four keys: two raced with both times (one chosen by GPU time, one by eager time, host-bound),
    one raced before runners had both times (its one time per runner a GPU time), one not raced."""
    path = tmp_path / "raced.db"
    by_gpu = {"triton": RunnerTime(0.25, 0.34), "sdpa-cudnn": RunnerTime(0.3125, 0.1875)}
    host_bound = {"triton": RunnerTime(0.125, 0.34), "sdpa-cudnn": RunnerTime(0.1875, 0.25)}
    with Store(path) as store:
        store.import_results([
            dataclasses.replace(result(key(512)), runner="triton", runner_times=by_gpu, chosen_by="gpu"),
            dataclasses.replace(result(key(1024)), runner="sdpa-cudnn", runner_times=host_bound,
                                chosen_by="host-bound"),
            dataclasses.replace(result(key(2048)), runner="sdpa-cudnn",
                                runner_times={"triton": 0.75, "sdpa-cudnn": 0.5}),
            result(key(4096)),
        ])
    return str(path)


def test_list_shows_each_raced_runners_two_times_and_what_chose_it(invoke, tmp_path):
    db = _raced_store(tmp_path)
    lines = invoke("list", "--db", db).output.splitlines()
    assert lines[0].split()[-3:] == ["runner", "gpu/eager", "ms"]
    # the speed-up of an SDPA runner over the kernels is on the timing that chose it: eager for host-bound
    assert [re.split(r" {3,}", line)[-2:] for line in lines[2:]] == [
        ["triton (by GPU)", "0.25/0.34"], ["sdpa-cudnn (1.36x, by eager: host-bound)", "0.1875/0.25"],
        ["sdpa-cudnn (1.50x)", "0.5/-"], ["triton", "-"]]
    records = json.loads(invoke("list", "--db", db, "--json").output)
    assert [(r["runner"], r["chosen_by"]) for r in records] == [
        ("triton", "gpu"), ("sdpa-cudnn", "host-bound"), ("sdpa-cudnn", None), ("triton", None)]
    assert records[1]["runner_times"] == {"triton": {"gpu_ms": 0.125, "eager_ms": 0.34},
                                          "sdpa-cudnn": {"gpu_ms": 0.1875, "eager_ms": 0.25}}
    assert records[2]["runner_times"] == {"triton": {"gpu_ms": 0.75, "eager_ms": None},
                                          "sdpa-cudnn": {"gpu_ms": 0.5, "eager_ms": None}}
    rows = list(csv.DictReader(io.StringIO(invoke("list", "--db", db, "--csv").output)))
    assert [(r["runner"], r["chosen_by"], r["runner_gpu_ms"], r["runner_eager_ms"]) for r in rows] == [
        ("triton", "gpu", "0.25", "0.34"), ("sdpa-cudnn", "host-bound", "0.1875", "0.25"),
        ("sdpa-cudnn", "", "0.5", ""), ("triton", "", "", "")]


def test_show_gives_every_runners_two_times_and_what_chose_the_runner(invoke, tmp_path):
    db = _raced_store(tmp_path)

    def runner_line(seq_len: int) -> str:
        out = invoke("show", "--db", db, "--seq-len", seq_len)
        assert out.exit_code == 0, out.output
        return next(line for line in out.output.splitlines() if line.startswith("  runner"))

    raced = ", each runner's whole call (a training key: forward + backward), GPU / eager ms: "
    assert runner_line(512) == ("  runner        triton, chosen by GPU time (CUDA-graph replay); raced" + raced
                                + "triton 0.25 / 0.34, sdpa-cudnn 0.3125 / 0.1875")
    assert runner_line(1024) == ("  runner        sdpa-cudnn, chosen by eager time (host-bound: triton's eager time "
                                 "2.72x its GPU time, over 1.5x); raced" + raced
                                 + "triton 0.125 / 0.34, sdpa-cudnn 0.1875 / 0.25")
    assert runner_line(2048) == ("  runner        sdpa-cudnn, chosen by one timing per runner (a search before runners "
                                 "had GPU and eager times); raced" + raced + "sdpa-cudnn 0.5 / -, triton 0.75 / -")
    assert runner_line(4096) == "  runner        triton"


def test_list_of_nothing(invoke, db):
    out = invoke("list", "--db", db, "--seq-len", "99")
    assert (out.exit_code, out.stdout, out.stderr) == (0, "", "no tuned results (seq_q=99)\n")
    assert json.loads(invoke("list", "--db", db, "--seq-len", "99", "--json").output) == []
    assert invoke("list", "--db", db, "--seq-len", "99", "--csv").output.count("\n") == 1  # the header


def test_list_marks_stale_results_and_names_the_command_that_fixes_them(invoke, tmp_path):
    path = tmp_path / "old.db"
    with Store(path) as store:
        store.import_results([result(key(512), kernel_hash="0000000000000000"), result(key(1024)),
                              result(key(2048), triton="3.5.0")])
    out = invoke("list", "--db", path)
    assert out.exit_code == 0
    lines = out.stdout.splitlines()
    assert lines[0].split()[-2:] == ["runner", "stale"]
    assert [line.split("triton", 1)[1].strip() for line in lines[2:]] == [
        "kernel sources 0000000000000000", "-", "triton 3.5.0"]
    assert out.stderr == ("note: 2 of 3 results are stale (tuned under other kernel sources or another triton): "
                          f"get_tuned_attention() serves them once `flashtune revalidate --db {path}` has checked "
                          "them again here\n")
    records = json.loads(invoke("list", "--db", path, "--json").stdout)
    assert [r["stale"] for r in records] == ["kernel sources 0000000000000000", None, "triton 3.5.0"]
    rows = list(csv.DictReader(io.StringIO(invoke("list", "--db", path, "--csv").stdout)))
    assert [r["stale"] for r in rows] == ["kernel sources 0000000000000000", "", "triton 3.5.0"]


def test_list_without_a_store_says_what_to_do(invoke, tmp_path):
    missing = tmp_path / "none.db"
    out = invoke("list", "--db", missing)
    assert out.exit_code == 1
    assert out.output == (f"Error: no flashtune store at {missing}: tune with `flashtune search`, import a file with "
                          "`flashtune import FILE`, or point --db at another store\n")
    assert not missing.exists()


def test_list_of_an_empty_database_says_what_to_do(invoke, tmp_path):
    """An empty file, as a search creating the store leaves it for a moment: no store yet."""
    path = tmp_path / "new.db"
    path.touch()
    out = invoke("list", "--db", path)
    assert out.exit_code == 1
    assert out.output == (f"Error: no flashtune store at sqlite:///{path} yet: the database is empty (a search or "
                          "import may be creating it now); tune with `flashtune search`, import a file with "
                          "`flashtune import FILE`, or point --db at another store\n")
    assert path.read_bytes() == b""


@pytest.mark.parametrize("content, message", [
    (b"this is not a database" * 100, "file is not a database"),
])
def test_list_of_a_corrupt_file_is_one_line(invoke, tmp_path, content, message):
    path = tmp_path / "bad.db"
    path.write_bytes(content)
    out = invoke("list", "--db", path)
    assert out.exit_code == 1
    assert out.output.startswith("Error: ") and message in out.output and out.output.count("\n") == 1


def test_list_of_a_bad_url(invoke):
    out = invoke("list", "--db", "mysql://nobody@nowhere/db")
    assert out.exit_code == 1
    assert out.output.startswith("Error: unsupported database URL scheme 'mysql'")


# -- show ---------------------------------------------------------------------------------

SHOW_TEXT = """\
bwd bfloat16 d64 n1024 causal on NVIDIA H200@sm90
  config        BLOCK_M1=32 BLOCK_N1=64 BLOCK_M2=64 BLOCK_N2=32 num_warps=8 num_stages=2 dq_num_warps=8 dq_num_stages=2 atomic_dq=0 tma=0 dkdv_split=0 family=0 dq_first=0
  time          0.5 ms, re-timed (the median of interleaved rounds with the other finalists and the default, after the trials or at revalidation)
  TFLOPS        512.5
  default time  1 ms, re-timed with it
  speed-up      2.00x
  error         0.125 (worst error / allowance; <= 1 passes)
  trials        16
  runner        triton
  tuned with    flashtune 0.1.0, kernels {hash}, triton {triton}, torch 2.11.0+cu130, CUDA 13.0, driver cuda-driver-api 13.0
  GPU           NVIDIA H200, compute capability 9.0, 132 SMs
"""


def test_show_one_key_with_its_trials(invoke, db):
    k = key(1024, pass_="bwd")
    stored = result(k)
    with Store(db) as store:
        store.record_trial(k, stored.config, Outcome("ok", time_ms=0.5, error=0.125), provenance=stored.provenance,
                           study="s")
        store.record_trial(k, result(k, block=128).config,
                           Outcome("incorrect", error=3.5, message="dq error is 3.5x the allowance"),
                           provenance=stored.provenance, study="s")
    out = invoke("show", "--db", db, "--pass", "bwd", "--gpu", H200.key)
    assert out.exit_code == 0, out.output
    head, _, rest = out.output.partition("  updated ")
    assert head == SHOW_TEXT.format(hash=stored.provenance.kernel_hash, triton=TRITON)
    assert rest.splitlines()[1] == "  state         current: served"
    trials = rest.split("\n\n", 1)[1]
    assert trials == (
        "2 trials (each config checked, then timed once; the times above are the re-timing's):\n"
        "id   status      config                 ms   error   message\n"
        "───────────────────────────────────────────────────────────────────────────────────\n"
        " 1   ok          32x64/64x32 w8 s2     0.5   0.125\n"
        " 2   incorrect   32x128/128x32 w8 s2     -     3.5   dq error is 3.5x the allowance\n"
    )

    as_json = json.loads(invoke("show", "--db", db, "--pass", "bwd", "--gpu", H200.key, "--json").output)
    assert as_json["key"] == {"gpu": H200.key, "dtype": "bfloat16", "head_dim": 64, "seq_q": 1024, "seq_k": 1024,
                              "group": 1, "batch_heads": 512, "causal": True,
                              "pass": "bwd"}
    assert as_json["result"]["time_ms"] == 0.5
    assert [(t["status"], t["time_ms"], t["error"]) for t in as_json["trials"]] == [("ok", 0.5, 0.125),
                                                                                   ("incorrect", None, 3.5)]
    as_csv = list(csv.DictReader(io.StringIO(invoke("show", "--db", db, "--pass", "bwd", "--gpu", H200.key,
                                                    "--csv").output)))
    assert [row["status"] for row in as_csv] == ["ok", "incorrect"]


def test_show_needs_filters_that_pick_one_key(invoke, db):
    out = invoke("show", "--db", db, "--gpu", H200.key, "--pass", "fwd")
    assert out.exit_code == 1
    assert out.output == (f"Error: 3 results match (gpu='{H200.key}', pass='fwd'): narrow them to one key with "
                          "--dtype, --head-dim, --seq-len, --seq-k, --batch-heads, --causal/--full (`flashtune list` "
                          "shows them)\n")


def test_show_of_no_match(invoke, db):
    out = invoke("show", "--db", db, "--seq-len", "99")
    assert out.exit_code == 1
    assert out.output == "Error: no tuned result matches (seq_q=99): `flashtune list` shows what is stored\n"


def test_show_a_key_whose_search_found_nothing(invoke, db):
    k = key(4096, pass_="bwd")
    with Store(db) as store:
        store.record_trial(k, result(k).config, Outcome("compile_error", message="CompilationError: boom"),
                           provenance=result(k).provenance)
    args = ["--dtype", "bfloat16", "--head-dim", "64", "--seq-len", "4096", "--causal", "--pass", "bwd"]
    out = invoke("show", "--db", db, *args)
    assert out.exit_code == 0, out.output
    assert out.output.startswith(f"bwd bfloat16 d64 n4096 causal on {H200.key}\n"
                                 "no tuned result: no config passed the correctness check\n\n1 trial (each config "
                                 "checked, then timed once; the times above are the re-timing's):\n")
    assert "compile_error" in out.output and "CompilationError: boom" in out.output
    assert json.loads(invoke("show", "--db", db, *args, "--json").output)["result"] is None


@pytest.mark.parametrize("config,label", [
    (FwdConfig(128, 64, 8, 3), "128x64 w8 s3"),
    (FwdConfig(64, 64, 4, 3, tma=1), "64x64 w4 s3 tma"),
    (BwdConfig(32, 64, 64, 32, 4, 2), "32x64/64x32 w4 s2"),
    (BwdConfig(32, 64, 64, 32, 4, 2, 8, 3), "32x64 w4 s2 / 64x32 w8 s3"),
    (BwdConfig(64, 128, 128, 64, 8, 3, atomic_dq=1, tma=1), "64x128 w8 s3 atomic-dQ tma"),
    (BwdConfig(32, 64, 64, 32, 4, 2, tma=1), "32x64/64x32 w4 s2 tma"),
], ids=str)
def test_config_label_names_every_launch_choice(config, label):
    assert config.label() == label
