"""``flashtune search --devices``: bad values are one-line usage errors; under the
interpreter, pretend devices (FLASHTUNE_INTERPRETER_DEVICES) each search keys."""

from __future__ import annotations

import re

import pytest

from flashtune.autotuner.devices import PRETEND_ENV
from flashtune.keys import GpuInfo, TuningKey
from flashtune.store import Store

INTERPRETER = GpuInfo.interpreter().key
TINY = ["--interpreter", "--head-dim", "16", "--dtype", "float32", "--seq-len", "16", "--full", "--trials", "2"]


@pytest.mark.parametrize("value, message", [
    ("7", "Invalid value for '--devices': device 7 does not exist: under the interpreter this host pretends to "
          "have 1 (set FLASHTUNE_INTERPRETER_DEVICES=N for N) (cpu:0)"),
    ("foo", "Invalid value for '--devices': 'foo' is not a device: expected 'all', an index such as 0, or a name "
            "such as cpu:0"),
    ("0,", "Invalid value for '--devices': expected 'all', device indices such as '0,1'"),
    ("0,0", "Invalid value for '--devices': cpu:0 is given twice"),
])
def test_a_bad_devices_value_is_a_usage_error_naming_it(invoke, tmp_path, value, message):
    out = invoke("search", *TINY, "--devices", value, "--db", tmp_path / "t.db")
    assert out.exit_code == 2, out.output
    assert message in out.output and "Traceback" not in out.output
    assert not (tmp_path / "t.db").exists()


def test_device_and_devices_together_are_refused(invoke, tmp_path):
    out = invoke("search", "--device", "cpu", "--devices", "0", "--db", tmp_path / "t.db")
    assert out.exit_code == 2 and "give --device or --devices, not both" in out.output


@pytest.mark.parametrize("value", ["many", "0", "65", "99999999999999", "9" * 5000])
def test_a_bad_pretend_count_names_the_variable(invoke, tmp_path, monkeypatch, value):
    monkeypatch.setenv(PRETEND_ENV, value)
    for devices in ("all", "3"):  # neither lists (nor starts) that many devices
        out = invoke("search", *TINY, "--devices", devices, "--db", tmp_path / "t.db")
        assert out.exit_code == 2, out.output
        assert "FLASHTUNE_INTERPRETER_DEVICES: expected an integer from 1 to 64, got '" in out.output
        assert len(out.output) < 400
    assert not (tmp_path / "t.db").exists()


def test_search_on_two_pretend_devices_shows_each_device(invoke, tmp_path, monkeypatch):
    monkeypatch.setenv(PRETEND_ENV, "2")
    db = tmp_path / "t.db"
    out = invoke("search", *TINY, "--devices", "all", "--db", db, "--storage", tmp_path / "journal.log")
    assert out.exit_code == 0, out.output
    header, *log = out.stderr.splitlines()
    assert header == (f"searching 2 keys on {INTERPRETER} (2 devices: cpu:0, cpu:1; the Triton interpreter: a CPU "
                      "demo), 2 trials per key")
    devices = {m.group(1) for line in log for m in [re.search(r" on (cpu:\d): ", line)] if m}
    assert devices == {"cpu:0", "cpu:1"}, log  # a free device takes the next key
    assert sum("keys] " in line for line in log) == 2
    keys = [TuningKey(INTERPRETER, "float32", 16, 16, False, p) for p in ("fwd", "bwd")]
    with Store(db) as store:
        assert sorted(store.load_table(INTERPRETER)) == sorted(keys)
        assert [len(store.trials_for(k)) for k in keys] == [2, 2]
