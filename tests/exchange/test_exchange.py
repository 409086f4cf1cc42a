"""Export files: round trip, every validation rule, the size cap, kernel hashes, conflicts."""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import datetime, timezone

import pytest
from exchange_samples import (
    A100,
    H200,
    TRITON,
    key,
    result,
    snapshot,
    table,
    without_timestamps,
)

from flashtune import __version__
from flashtune.configs.forward import FwdConfig
from flashtune.provenance import kernel_source_hash
from flashtune.runners import RunnerTime
from flashtune.store import ImportSummary, Store, StoreError
from flashtune.store.exchange import (
    FORMAT,
    MAX_BYTES,
    ExchangeError,
    checksum,
    dump_export,
    export_document,
    import_export,
    parse_export,
    read_export,
    write_export,
)

MOMENT = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


def _bytes(document: dict, *, rehash: bool = True) -> bytes:
    if rehash:
        document["sha256"] = checksum(document["tables"])
    return json.dumps(document).encode()


def _document() -> dict:
    return export_document(table(), exported_at=MOMENT)


# -- round trip ---------------------------------------------------------------------------


def test_export_then_import_into_a_fresh_store_reproduces_the_table(tmp_path, store):
    store.import_results(table())
    write_export(tmp_path / "t.json", store.list_results())
    with Store(tmp_path / "fresh.db") as fresh:
        summary = import_export(fresh, read_export(tmp_path / "t.json"))
        assert summary == ImportSummary(inserted=6)
        assert without_timestamps(fresh.list_results()) == without_timestamps(store.list_results())
        assert fresh.list_gpus() == store.list_gpus()


def test_a_version_1_file_imports_as_the_grid_keys_it_was_tuned_on(store):
    document = _document()
    document["format_version"] = 1
    for t in document["tables"]:
        for entry in t["entries"]:
            seq = entry.pop("seq_q")
            del entry["seq_k"], entry["group"], entry["batch_heads"], entry["runner"], entry["runner_times"]
            del entry["chosen_by"]
            entry["seq_len"] = seq
    export = parse_export(_bytes(document))
    assert [r.key for r in export.results] == [r.key for r in table()]
    assert all(r.key.is_grid for r in export.results)
    assert import_export(store, export) == ImportSummary(inserted=6)


RACED = {"triton": RunnerTime(0.25, 0.34), "sdpa-cudnn": RunnerTime(0.3125, 0.1875)}


def test_both_times_of_each_runner_and_what_chose_it_round_trip(store):
    raced = dataclasses.replace(result(key(1024)), runner="sdpa-cudnn", runner_times=RACED, chosen_by="host-bound")
    data = dump_export([raced, result(key(2048))], exported_at=MOMENT)
    entry = json.loads(data)["tables"][0]["entries"][0]
    assert (entry["chosen_by"], entry["runner_times"]) == ("host-bound", {
        "triton": {"gpu_ms": 0.25, "eager_ms": 0.34}, "sdpa-cudnn": {"gpu_ms": 0.3125, "eager_ms": 0.1875}})
    import_export(store, parse_export(data))
    back = store.load_table(H200.key)[key(1024)]
    assert (back.runner, back.runner_times, back.chosen_by) == ("sdpa-cudnn", RACED, "host-bound")
    assert store.load_table(H200.key)[key(2048)].runner_times is None


def test_a_version_2_file_imports_its_runner_times_as_gpu_times(store):
    """Version 2 held one time per runner (its race's): read as the GPU time, the eager time
    unknown, and nothing recorded as what chose the runner."""
    document = _document()
    document["format_version"] = 2
    for t in document["tables"]:
        for entry in t["entries"]:
            del entry["chosen_by"]
    _entry(document).update(runner="sdpa-cudnn", runner_times={"triton": 0.25, "sdpa-cudnn": 0.125})
    export = parse_export(_bytes(document))
    first = export.results[0]
    assert (first.runner, first.chosen_by) == ("sdpa-cudnn", None)
    assert first.runner_times == {"triton": RunnerTime(0.25, None), "sdpa-cudnn": RunnerTime(0.125, None)}
    import_export(store, export)
    assert store.load_table(H200.key)[first.key].runner_times == first.runner_times
    _entry(document)["runner_times"] = {"triton": {"gpu_ms": 0.25, "eager_ms": 0.3}, "sdpa-cudnn": 0.125}
    with pytest.raises(ExchangeError, match="runner_times.triton: Input should be a valid number"):
        parse_export(_bytes(document))  # a version 2 file holds numbers only


def test_keys_that_tell_shapes_apart_round_trip(store):
    from flashtune.keys import TuningKey

    decode = TuningKey.for_call(H200.key, "bfloat16", batch=1, heads_q=32, heads_kv=8, seq_q=1, seq_k=65536,
                                head_dim=128, causal=False, pass_="fwd")
    results = [result(decode, 0.09), result(key(1024), 0.25)]
    export = parse_export(dump_export(results))
    assert [r.key for r in export.results] == [decode, key(1024)]
    import_export(store, export)
    assert store.load_table(H200)[decode].time_ms == 0.09


def test_the_file_layout(tmp_path):
    data = dump_export(table(), exported_at=MOMENT)
    document = json.loads(data)
    assert list(document) == ["format", "format_version", "flashtune_version", "exported_at", "tables", "sha256"]
    assert (document["format"], document["format_version"], document["exported_at"]) == \
        (FORMAT, 3, "2026-11-30T12:00:00Z")
    assert [t["gpu"] for t in document["tables"]] == [
        {"key": H200.key, "name": "NVIDIA H200", "capability": [9, 0], "sm_count": 132, "total_memory": 150754820096},
        {"key": A100.key, "name": A100.name, "capability": [8, 0], "sm_count": 108, "total_memory": 85899345920},
    ]
    entry = document["tables"][0]["entries"][0]
    assert entry == {
        "dtype": "bfloat16", "head_dim": 64, "seq_q": 1024, "seq_k": 1024, "group": 1, "batch_heads": 512,
        "causal": True, "pass": "fwd",
        # the config's JSON form is the config class's own (its fields; test_config_fields), so a
        # field added to FwdConfig with a default changes no line here
        "config": FwdConfig(64, 32, 4, 3).to_dict(),
        "time_ms": 0.25, "tflops": 512.5, "default_time_ms": 0.5, "error": 0.125, "n_trials": 16,
        "runner": "triton", "chosen_by": None, "runner_times": None,
        "provenance": {"flashtune_version": "0.1.0", "kernel_hash": kernel_source_hash(), "triton_version": TRITON,
                       "torch_version": "2.11.0+cu130", "cuda_version": "13.0",
                       "driver_version": "cuda-driver-api 13.0"},
    }
    assert document["sha256"] == checksum(document["tables"])
    assert len(data.splitlines()) == 6 + 2 + len(table()) + 2 + 3  # one line per entry
    assert dump_export(table(), exported_at=MOMENT) == data  # deterministic


def test_parse_gives_back_the_results_in_file_order():
    parsed = parse_export(dump_export(table(), exported_at=MOMENT))
    by_gpu = sorted(table(), key=lambda r: r.key.gpu != H200.key)
    assert list(parsed.results) == by_gpu
    assert parsed.gpus == [H200.key, A100.key]
    assert (parsed.flashtune_version, parsed.exported_at) == (__version__, "2026-11-30T12:00:00Z")


def test_an_empty_export_is_valid(store):
    parsed = parse_export(dump_export([]))
    assert parsed.results == () and import_export(store, parsed) == ImportSummary()


def test_write_export_is_atomic_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("old")
    assert write_export(path, table()) == 6
    assert parse_export(path.read_bytes()).results
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


# -- validation: each rule, with the checksum made right so the rule itself must reject ----

def _entry(document, t=0, e=0):
    return document["tables"][t]["entries"][e]


CASES = {
    "negative time": (lambda d: _entry(d).update(time_ms=-1.0),
                      "tables[0].entries[0].time_ms: Input should be greater than 0"),
    "zero time": (lambda d: _entry(d).update(time_ms=0), "greater than 0"),
    "overflowing float": (None, "finite number"),  # 1e999, written as text below
    "unknown dtype": (lambda d: _entry(d).update(dtype="float8"), "tables[0].entries[0].dtype: Input should be"),
    "unknown pass": (lambda d: _entry(d).update({"pass": "both"}), "entries[0].pass"),
    "int as bool": (lambda d: _entry(d).update(causal=1), "causal: Input should be a valid boolean"),
    "string as int": (lambda d: _entry(d).update(head_dim="64"), "head_dim: Input should be a valid integer"),
    "float as int": (lambda d: _entry(d).update(seq_q=1024.0), "seq_q: Input should be a valid integer"),
    "bool as int": (lambda d: _entry(d).update(n_trials=True), "n_trials: Input should be a valid integer"),
    "string as float": (lambda d: _entry(d).update(tflops="512"), "tflops: Input should be a valid number"),
    "head dim zero": (lambda d: _entry(d).update(head_dim=0), "greater than or equal to 1"),
    "seq len too big": (lambda d: _entry(d).update(seq_k=2**40), "less than or equal to"),
    "group zero": (lambda d: _entry(d).update(group=0), "entries[0].group: Input should be greater than or equal to 1"),
    "batch_heads not a bucket": (lambda d: _entry(d).update(batch_heads=24),
                                 "tables[0].entries[0]: batch_heads: expected a power of two"),
    "seq_len in a version 2 file": (lambda d: _entry(d).update(seq_len=1024), "entries[0].seq_len: Extra inputs"),
    "unknown runner": (lambda d: _entry(d).update(runner="sdpa-math"), "entries[0].runner: Input should be"),
    "runner without its time": (lambda d: _entry(d).update(runner="sdpa-cudnn"),
                                "tables[0].entries[0]: runner_times: 'sdpa-cudnn' serves the key but has no time"),
    "runner time of nothing": (lambda d: _entry(d).update(runner_times={"sdpa-cudnn": {"gpu_ms": 0.0,
                                                                                       "eager_ms": 0.1}}),
                               "runner_times['sdpa-cudnn'].gpu_ms: Input should be greater than 0"),
    "runner time a plain number": (lambda d: _entry(d).update(runner_times={"triton": 0.25}),
                                   "runner_times.triton: Input should be a valid dictionary"),
    "runner time without its eager time": (lambda d: _entry(d).update(runner_times={"triton": {"gpu_ms": 0.25}}),
                                           "runner_times.triton.eager_ms: Field required"),
    "unknown chosen_by": (lambda d: _entry(d).update(chosen_by="wall"), "entries[0].chosen_by: Input should be"),
    "chosen_by without a race": (lambda d: _entry(d).update(chosen_by="gpu"),
                                 "chosen_by: 'gpu' names what chose a runner, but none was raced"),
    "config not a power of two": (lambda d: _entry(d)["config"].update(BLOCK_M=48), "BLOCK_M: expected a power of two"),
    "config of the other pass": (lambda d: _entry(d).update(config=_entry(d, 0, 2)["config"]), "missing fields"),
    "config unknown field": (lambda d: _entry(d)["config"].update(extra=1), "unknown fields ['extra']"),
    "config bool field": (lambda d: _entry(d)["config"].update(num_warps=True), "config.num_warps"),
    "config not an object": (lambda d: _entry(d).update(config=[64, 32, 4, 3]),
                             "config: Input should be a valid dictionary"),
    "missing field": (lambda d: _entry(d).pop("error"), "entries[0].error: Field required"),
    "extra entry field": (lambda d: _entry(d).update(note="hi"), "note: Extra inputs are not permitted"),
    "extra top-level field": (lambda d: d.update(code="import os"), "code: Extra inputs are not permitted"),
    "long version": (lambda d: _entry(d)["provenance"].update(kernel_hash="x" * 65), "at most 64 characters"),
    "gpu key mismatch": (lambda d: d["tables"][0]["gpu"].update(key="NVIDIA H100@sm90"), "does not match name"),
    "gpu capability length": (lambda d: d["tables"][0]["gpu"].update(capability=[9, 0, 1]), "capability"),
    "duplicate key": (lambda d: d["tables"][0]["entries"].append(copy.deepcopy(_entry(d))),
                      ("tables[0].entries[4]: fwd bfloat16 d64 n1024 causal on NVIDIA H200@sm90 is also "
                       "tables[0].entries[0]")),
    "duplicate gpu table": (lambda d: d["tables"].append(copy.deepcopy(d["tables"][0])),
                            "tables[2]: GPU 'NVIDIA H200@sm90' already has tables[0]"),
    "tables not a list": (lambda d: d.update(tables={}), "tables: Input should be a valid list"),
    "bad sha256 form": (lambda d: d.update(sha256="abc"), "sha256: String should match pattern"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_rejects_a_file(case):
    mutate, message = CASES[case]
    document = _document()
    if mutate is None:  # json.loads reads 1e999 as inf, which the schema refuses (before the checksum)
        data = _bytes(document).replace(b'"time_ms": 0.25', b'"time_ms": 1e999')
    else:
        mutate(document)
        data = json.dumps(document).encode() if case == "bad sha256 form" else _bytes(document)
    with pytest.raises(ExchangeError) as raised:
        parse_export(data)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("text, message", [
    (b'{"time_ms": NaN}', "holds NaN, which is not a finite number"),
    (b'{"time_ms": -Infinity}', "holds -Infinity"),
    (b'{"format": "flashtune-tuned-table", "format": "x"}', "names 'format' twice in one object"),
    (b'{"format": "flashtune-tuned-table", "tables": [', "not valid JSON (line 1, column 48: Expecting value); was it truncated?"),
    (b"", "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8 text (byte 0)"),
    (b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]\x94.", "not UTF-8"),  # a pickle
    (b"[1, 2]", "not a flashtune export file"),
    (b'{"format": "csv"}', "not a flashtune export file"),
    (b'{"format": "flashtune-tuned-table", "format_version": 4}',
     "format version 4, this flashtune reads version 3: it was written by a newer flashtune"),
    (b'{"format": "flashtune-tuned-table", "format_version": "1"}', "format_version: Input should be 3"),
    (b"[" * 100_000 + b"]" * 100_000, "cannot be read as JSON: RecursionError"),
    (b'{"n": ' + b"9" * 5000 + b"}", "cannot be read as JSON: ValueError"),
])
def test_malformed_json_is_rejected_with_a_one_line_reason(text, message):
    with pytest.raises(ExchangeError) as raised:
        parse_export(text)
    assert message in str(raised.value)


def test_a_changed_value_breaks_the_checksum():
    data = dump_export(table(), exported_at=MOMENT).replace(b'"time_ms": 0.25', b'"time_ms": 0.125', 1)
    with pytest.raises(ExchangeError, match="sha256 checksum does not match"):
        parse_export(data)


def test_the_checksum_covers_the_gpu_too():
    data = dump_export(table(), exported_at=MOMENT).replace(b'"sm_count": 132', b'"sm_count": 133', 1)
    with pytest.raises(ExchangeError, match="sha256 checksum does not match"):
        parse_export(data)


def test_size_cap_is_checked_before_reading(tmp_path, monkeypatch):
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: costs nothing
    monkeypatch.setattr("flashtune.store.exchange._load_json", lambda data: pytest.fail("parsed a file over the cap"))
    with pytest.raises(ExchangeError, match=f"the file is {MAX_BYTES + 1} bytes, over the {MAX_BYTES}-byte limit"):
        read_export(big)
    with pytest.raises(ExchangeError, match="over the 10-byte limit"):
        parse_export(b"{" * 11, max_bytes=10)


def test_a_file_that_cannot_be_read(tmp_path):
    with pytest.raises(ExchangeError, match="cannot read"):
        read_export(tmp_path / "missing.json")


# -- kernel hashes, conflicts, one transaction ----------------------------------------------


def test_other_kernel_sources_and_tritons_import_as_stale_rows(store):
    results = [result(key(1024), kernel_hash="feedfacefeedface"), result(key(2048)),
               result(key(4096), triton="3.5.0")]
    export = parse_export(dump_export(results))
    assert [r.key.seq_q for r in export.stale()] == [1024, 4096]
    assert import_export(store, export) == ImportSummary(inserted=3)
    by_len = {r.key.seq_q: r for r in store.list_results()}
    assert by_len[1024].provenance.kernel_hash == "feedfacefeedface"  # stored as tuned: stale
    assert by_len[4096].provenance.triton_version == "3.5.0"
    assert by_len[2048].provenance.kernel_hash == kernel_source_hash()


@pytest.mark.parametrize("on_conflict, expected", [
    ("keep_faster", ImportSummary(inserted=1, replaced=1, kept=2)),
    ("replace", ImportSummary(inserted=1, replaced=3)),
    ("skip", ImportSummary(inserted=1, kept=3)),
])
def test_dry_run_plans_exactly_what_the_import_does(store, on_conflict, expected):
    store.import_results([result(key(512), 0.5), result(key(1024), 0.25), result(key(2048), 0.25)])
    incoming = parse_export(dump_export([result(key(512), 0.25, block=32), result(key(1024), 0.5, block=32),
                                         result(key(2048), 0.25, block=32), result(key(4096), 1.0)]))
    before = snapshot(store)
    assert import_export(store, incoming, on_conflict=on_conflict, dry_run=True) == expected
    assert snapshot(store) == before
    assert import_export(store, incoming, on_conflict=on_conflict) == expected
    # and again, now that every key is there
    again = ImportSummary(replaced=4 if on_conflict == "replace" else 0, kept=0 if on_conflict == "replace" else 4)
    before = snapshot(store)
    assert import_export(store, incoming, on_conflict=on_conflict, dry_run=True) == again
    assert snapshot(store) == before


def test_a_conflict_under_error_writes_nothing(store):
    store.import_results([result(key(2048))])
    incoming = parse_export(dump_export([result(key(1024)), result(key(2048), 0.125)]))
    before = snapshot(store)
    with pytest.raises(StoreError, match="already has a result"):
        import_export(store, incoming, on_conflict="error", dry_run=True)
    with pytest.raises(StoreError, match="already has a result"):
        import_export(store, incoming, on_conflict="error")
    assert snapshot(store) == before  # the first result was rolled back with the failing one


def test_files_from_several_gpus_import_together(store):
    assert import_export(store, parse_export(dump_export(table()))).inserted == 6
    assert {g.key for g in store.list_gpus()} == {H200.key, A100.key}
    assert len(store.load_table(A100.key)) == 2

