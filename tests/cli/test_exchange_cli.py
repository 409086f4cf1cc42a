"""``flashtune export`` and ``flashtune import``: round trip, reports, and refusals."""

from __future__ import annotations

import json

import pytest
from exchange_samples import (
    A100,
    H200,
    key,
    result,
    snapshot,
    table,
    without_timestamps,
)

from flashtune import __version__
from flashtune.store import Store
from flashtune.store.exchange import MAX_BYTES, dump_export, parse_export

GPUS = f"{A100.key}, {H200.key}"  # the store lists GPUs by key


def _listing(invoke, db) -> list[dict]:
    records = json.loads(invoke("list", "--db", db, "--json").output)
    for record in records:
        del record["created_at"], record["updated_at"]
    return records


def test_export_then_import_into_a_fresh_store_reproduces_the_table(invoke, db, tmp_path):
    out_file = tmp_path / "table.json"
    exported = invoke("export", "--db", db, "-o", out_file)
    assert (exported.exit_code, exported.output) == (0, f"exported 6 results ({GPUS}) to {out_file}\n")

    fresh = tmp_path / "fresh.db"
    imported = invoke("import", out_file, "--db", fresh)
    assert imported.exit_code == 0, imported.output
    export = parse_export(out_file.read_bytes())
    assert imported.output == (
        f"{out_file}: 6 entries for 2 GPUs ({GPUS}), exported by flashtune {__version__} at {export.exported_at}\n"
        "imported: 6 added, 0 replaced, 0 kept\n"
    )
    assert _listing(invoke, fresh) == _listing(invoke, db)
    with Store(db) as a, Store(fresh) as b:
        assert without_timestamps(a.list_results()) == without_timestamps(b.list_results())
        assert a.list_gpus() == b.list_gpus()


def test_export_with_filters_and_to_stdout(invoke, db):
    out = invoke("export", "--db", db, "-o", "-", "--gpu", A100.key, "--pass", "bwd")
    assert out.exit_code == 0
    assert out.stderr == f"exported 1 result ({A100.key})\n"
    [only] = parse_export(out.stdout_bytes).results
    assert (only.key.gpu, only.key.pass_, only.key.seq_q) == (A100.key, "bwd", 512)


def test_export_errors(invoke, db, tmp_path):
    out = invoke("export", "--db", db, "-o", tmp_path / "x.json", "--seq-len", "99")
    assert out.exit_code == 1
    assert out.output == ("Error: nothing to export: no tuned result matches (seq_q=99); "
                          "`flashtune list` shows what is stored\n")
    out = invoke("export", "--db", tmp_path / "missing.db", "-o", tmp_path / "x.json")
    assert out.exit_code == 1 and out.output.startswith("Error: no flashtune store at ")
    target = tmp_path / "no-such-dir" / "x.json"
    out = invoke("export", "--db", db, "-o", target)
    assert (out.exit_code, out.output) == (1, f"Error: cannot write {target}: No such file or directory\n")
    assert not (tmp_path / "x.json").exists()


@pytest.fixture
def incoming(tmp_path):
    """A file with one faster, one slower and one new result for the sample store."""
    path = tmp_path / "incoming.json"
    path.write_bytes(dump_export([result(key(1024), 0.125, block=32), result(key(2048), 1.0, block=32),
                                  result(key(8192), 2.0)]))
    return path


@pytest.mark.parametrize("policy, report", [
    ([], "imported: 1 added, 1 replaced, 1 kept\n1 key kept the store's result (it was at least as fast)\n"),
    (["--on-conflict", "replace"], "imported: 1 added, 2 replaced, 0 kept\n"),
    (["--on-conflict", "skip"], ("imported: 1 added, 0 replaced, 2 kept\n"
                                 "2 keys kept the store's result (--on-conflict skip)\n")),
])
def test_import_conflict_policies(invoke, db, incoming, policy, report):
    out = invoke("import", incoming, "--db", db, *policy)
    assert out.exit_code == 0, out.output
    assert out.output.split("\n", 1)[1] == report
    with Store(db) as store:
        stored = store.load_table(H200.key)
    assert stored[key(8192)].time_ms == 2.0
    assert stored[key(1024)].time_ms == (0.25 if "skip" in policy else 0.125)
    assert stored[key(2048)].time_ms == (1.0 if "replace" in policy else 0.75)


def test_import_dry_run_writes_nothing(invoke, db, incoming, tmp_path):
    with Store(db) as store:
        before = snapshot(store)
    out = invoke("import", incoming, "--db", db, "--dry-run")
    assert out.exit_code == 0
    assert out.output.split("\n", 1)[1] == ("dry run: 1 to add, 1 to replace, 1 to keep; nothing was written\n"
                                            "1 key would keep the store's result (it was at least as fast)\n")
    with Store(db) as store:
        assert snapshot(store) == before
    fresh = tmp_path / "fresh.db"
    out = invoke("import", incoming, "--db", fresh, "--dry-run", "--json")
    assert out.exit_code == 0
    assert {k: v for k, v in json.loads(out.output).items() if k in ("added", "replaced", "kept", "dry_run")} == \
        {"added": 3, "replaced": 0, "kept": 0, "dry_run": True}
    assert not fresh.exists()  # a dry run creates no store


def test_import_json_report(invoke, db, incoming):
    out = invoke("import", incoming, "--db", db, "--json")
    assert out.exit_code == 0
    report = json.loads(out.output)
    assert report["exported_at"]
    del report["exported_at"]
    assert report == {"file": str(incoming), "entries": 3, "gpus": [H200.key], "dry_run": False, "added": 1,
                      "replaced": 1, "kept": 1, "stale": 0, "stale_versions": [], "exported_by": __version__}


def test_import_takes_other_kernel_sources_as_stale_rows(invoke, tmp_path):
    """An export of an older flashtune imports without --force; its rows are stale until revalidated."""
    path = tmp_path / "old.json"
    path.write_bytes(dump_export([result(key(1024), kernel_hash="0123456789abcdef"), result(key(2048))]))
    fresh = tmp_path / "fresh.db"
    out = invoke("import", path, "--db", fresh)
    assert out.exit_code == 0, out.output
    assert out.stdout.endswith("imported: 2 added, 0 replaced, 0 kept\n")
    assert out.stderr == (f"note: 1 of 2 results is stale (tuned under other kernel sources or another triton): "
                          f"get_tuned_attention() serves it once `flashtune revalidate --db {fresh}` has checked it "
                          "again here (the file's were tuned with kernel sources 0123456789abcdef)\n")
    listed = json.loads(invoke("list", "--db", fresh, "--json").stdout)
    assert [(r["seq_q"], r["stale"]) for r in listed] == [(1024, "kernel sources 0123456789abcdef"), (2048, None)]
    again = invoke("import", path, "--db", tmp_path / "other.db", "--force", "--json")  # --force: a no-op now
    assert again.exit_code == 0 and json.loads(again.stdout)["stale"] == 1


def test_import_notes_another_triton(invoke, tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(dump_export([result(key(1024), triton="3.5.0")]))
    out = invoke("import", path, "--db", tmp_path / "x.db")
    assert out.exit_code == 0
    assert "note: 1 of 1 result is stale" in out.stderr and "tuned with triton 3.5.0)" in out.stderr


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[: len(data) // 2], "the file is not valid JSON"),
    (lambda data: data.replace(b'"time_ms": 0.25', b'"time_ms": 0.5', 1), "the sha256 checksum does not match"),
    (lambda data: data.replace(b'"time_ms": 0.25', b'"time_ms": NaN', 1), "holds NaN"),
    (lambda data: b"\x80\x04K\x01.", "not UTF-8 text"),
    (lambda data: data + b" " * (MAX_BYTES + 1 - len(data)), f"over the {MAX_BYTES}-byte limit"),
])
def test_a_bad_file_is_rejected_and_the_store_is_unchanged(invoke, db, tmp_path, damage, message):
    path = tmp_path / "bad.json"
    path.write_bytes(damage(dump_export(table())))
    with Store(db) as store:
        before = snapshot(store)
    out = invoke("import", path, "--db", db, "--on-conflict", "replace")
    assert out.exit_code == 1
    assert out.output.startswith(f"Error: {path}: ") and message in out.output
    assert out.output.count("\n") == 1 and "Traceback" not in out.output
    with Store(db) as store:
        assert snapshot(store) == before


def test_import_of_a_missing_file_is_a_usage_error(invoke, tmp_path):
    out = invoke("import", tmp_path / "nope.json")
    assert out.exit_code == 2
    assert "does not exist" in out.output
