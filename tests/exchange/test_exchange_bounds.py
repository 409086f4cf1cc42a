"""Values that validate but would break output or mislead (issue 17, items 6 and 7): every
number bounded by what the kernels run and the store holds, names printable, only
regular files read, long numbers shown shortened."""

from __future__ import annotations

import json
import os
import threading

import pytest
from exchange_samples import H200, key, result, table

from flashtune.runners import RunnerTime
from flashtune.store.exchange import ExchangeError, checksum, export_document, parse_export, read_export


def _document() -> dict:
    return export_document(table())


def _entry(document, e=0):
    return document["tables"][0]["entries"][e]


def _parse(document, rehash=True):
    if rehash:
        document["sha256"] = checksum(document["tables"])
    return parse_export(json.dumps(document).encode())


def _rename_gpu(document, name):
    document["tables"][0]["gpu"].update(name=name, key=f"{name}@sm90")


CASES = {
    # the speed-up default/time overflowed to inf and `list --json` failed for the whole store
    "denormal time": (lambda d: _entry(d).update(time_ms=5e-324),
                      "tables[0].entries[0]: time_ms: expected a finite number >= 1e-06 and <= 1e+07, got 5e-324"),
    "huge default time": (lambda d: _entry(d).update(default_time_ms=1e300),
                          "default_time_ms: expected a finite number >= 1e-06 and <= 1e+07, got 1e+300"),
    "huge tflops": (lambda d: _entry(d).update(tflops=1e300), "tflops: expected a finite number >= 0 and <= 100000, got 1e+300"),
    "format_version true": (lambda d: d.update(format_version=True), "format_version: expected the integer 3, got true"),
    "format_version 1.0": (lambda d: d.update(format_version=1.0), "format_version: expected the integer 3, got 1.0"),
    "head_dim 1024": (lambda d: _entry(d).update(head_dim=1024),
                      "tables[0].entries[0]: head_dim: the kernels run head dims up to 256, got 1024"),
    "tma on fp32": (lambda d: _entry(d).update(dtype="float32") or _entry(d)["config"].update(tma=1),
                    "tables[0].entries[0]: config: tma: supported for float16/bfloat16 up to head_dim 128, got "
                    "torch.float32"),
    "C1 control in the GPU name": (lambda d: _rename_gpu(d, "NVIDIA H200\x85"),
                                   "tables[0].gpu.key: String should match pattern"),
    "zero-width space in the GPU name": (lambda d: _rename_gpu(d, "NVIDIA H\u200b200"),
                                         "entries[0]: gpu: expected printable text, got the character U+200B"),
    "bidi override in the GPU name": (lambda d: _rename_gpu(d, "NVIDIA \u202e002H"),
                                      "entries[0]: gpu: expected printable text, got the character U+202E"),
    "zero-width joiner in a version": (lambda d: _entry(d)["provenance"].update(torch_version="2.13\u200d.0"),
                                       "provenance.torch_version: expected printable text, got the character U+200D"),
    "n_trials past INTEGER": (lambda d: _entry(d).update(n_trials=2**31),
                              "n_trials: expected an integer from 0 to 2147483647, got 2147483648"),
    "huge eager time": (lambda d: _entry(d).update(runner_times={"triton": {"gpu_ms": 0.25, "eager_ms": 1e300}}),
                        "runner_times[triton].eager_ms: expected a finite number >= 1e-06 and <= 1e+07, got 1e+300"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_value_that_would_break_output_is_refused(case):
    mutate, message = CASES[case]
    document = _document()
    mutate(document)
    with pytest.raises(ExchangeError) as raised:
        _parse(document)
    assert message in str(raised.value)


def test_the_store_refuses_them_too(tmp_path):
    import dataclasses

    from flashtune.store import Store

    with Store(tmp_path / "t.db") as store:
        with pytest.raises(ValueError, match="time_ms: expected a finite number >= 1e-06"):
            store.save_result(dataclasses.replace(result(key()), time_ms=5e-324))
        with pytest.raises(ValueError, match=r"runner_times\[triton\].eager_ms: expected a finite number >= 1e-06"):
            store.save_result(dataclasses.replace(result(key()), runner_times={"triton": RunnerTime(0.25, 5e-324)}))
        with pytest.raises(ValueError, match="chosen_by: expected one of gpu, host-bound, forced, got 'wall'"):
            store.save_result(dataclasses.replace(result(key()), runner_times={"triton": RunnerTime(0.25, 0.3)},
                                                  chosen_by="wall"))
        assert store.list_results() == []


def test_a_4001_digit_number_is_shown_shortened():
    document = _document()
    _entry(document)["config"]["BLOCK_M"] = 10**4000
    with pytest.raises(ExchangeError) as raised:
        _parse(document)
    message = str(raised.value)
    assert "... (4001 digits)" in message and len(message) < 300, message  # 3a7812e: all 4001 digits


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    outcome = []

    def read():
        try:
            read_export(fifo)
        except ExchangeError as e:
            outcome.append(str(e))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # 3a7812e: blocked in open() for ever; a writer lets the thread end
        with open(fifo, "wb"):
            pass
        pytest.fail("read_export blocked on a FIFO")
    assert outcome == [f"{fifo} is not a regular file (a pipe, a device or a socket): save the export to a file "
                       "and import that"]


def test_a_device_is_refused_by_what_it_is_not_by_its_size():
    with pytest.raises(ExchangeError, match=r"^/dev/zero is not a regular file"):  # 3a7812e: "16777217 bytes"
        read_export("/dev/zero")


def test_a_directory_is_refused_as_a_directory(tmp_path):
    folder = tmp_path / "table.json"
    folder.mkdir()
    with pytest.raises(ExchangeError, match=r" is a directory, not an export file$"):
        read_export(folder)


def test_search_refuses_a_head_dim_the_kernels_cannot_run(tmp_path):
    from click.testing import CliRunner

    from flashtune.cli import cli

    out = CliRunner().invoke(cli, ["search", "--interpreter", "--head-dim", "300", "--dtype", "float32", "--seq-len",
                                   "16", "--full", "--pass", "fwd", "--trials", "1", "--db", str(tmp_path / "t.db"),
                                   "--no-progress"], prog_name="flashtune")
    assert out.exit_code == 1
    assert out.stderr.endswith("Error: keys: fwd float32 d300 n16 full: the kernels run head dims up to 256\n")
    assert not (tmp_path / "t.db").exists()
    assert H200  # the samples' GPU is the table's
