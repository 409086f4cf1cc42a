"""Issue 15: a search on several (pretend) devices, searches that share a store, a driver
killed while it holds claims, and a study tied to its store."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from autotuner_helpers import FAULT_SPIN, Spy, cid, key, process_exists, rows_per_config, stored_result, trials_of

from flashtune.autotuner import search
from flashtune.autotuner.devices import PRETEND_ENV
from flashtune.store import ResultFilter, Store

REPO = Path(__file__).resolve().parents[2]
FAST = dict(trial_timeout=120, finalists=1, rounds=1)
SPACE = {"BLOCK_M": [16, 32], "BLOCK_N": [32], "num_warps": [4], "num_stages": [1, 2]}


def _no_config_twice(db, keys, trials):
    for k in keys:
        counts = rows_per_config(db, k)
        assert sum(counts.values()) == trials and max(counts.values()) == 1, (k.label(), counts)


def test_pretend_devices_split_the_keys_and_tune_none_twice(tmp_path, monkeypatch):
    monkeypatch.setenv(PRETEND_ENV, "3")
    keys = [key("fwd", "float32", seq_len=n, causal=c) for n in (16, 32) for c in (False, True)]
    pids = []
    Spy(monkeypatch, "_start", after=lambda worker, n: pids.append(worker.pid))
    reports, db = [], tmp_path / "t.db"
    summary = search(keys, db=db, devices="all", trials=2, progress=reports.append, **FAST)
    assert [r.status for r in summary.results] == ["tuned"] * len(keys)
    _no_config_twice(db, keys, 2)
    on = {k: {p.device for p in reports if p.key == k} for k in keys}
    assert all(len(devices) == 1 for devices in on.values()), on  # each key's trials on one device
    assert set().union(*on.values()) == {"cpu:0", "cpu:1", "cpu:2"}  # a free device takes the next key
    assert len(set(pids)) == 3  # a worker process each
    assert [p.completed for p in reports if p.done][-1] == len(keys) * 2
    assert max(p.completed for p in reports) <= len(keys) * 2
    with Store(db) as store:  # every claim is done
        assert [c.state for c in store.claims.all()] == ["done"] * len(keys)


def test_devices_are_checked_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(PRETEND_ENV, "2")
    db = tmp_path / "t.db"
    for devices, message in [("7", "devices: device 7 does not exist: under the interpreter this host pretends to "
                                   "have 2"), ("foo", "devices: 'foo' is not a device"),
                             ("0,0", "devices: cpu:0 is given twice"), ([], "devices: expected 'all'")]:
        with pytest.raises(ValueError, match=message):
            search([key()], db=db, devices=devices, trials=1)
    with pytest.raises(ValueError, match="devices: give device"):
        search([key()], db=db, device="cpu", devices="all", trials=1)
    with pytest.raises(ValueError, match="lease: expected a positive"):
        search([key()], db=db, devices="all", trials=1, lease=0)
    assert not db.exists()


def test_a_new_store_tunes_again_and_a_lost_winner_is_finalised_again(tmp_path, monkeypatch):
    k = key("fwd", "float32", seq_len=16, causal=False)
    db = tmp_path / "t.db"
    run = dict(db=db, trials=2, device="cpu", **FAST)
    assert search([k], **run).results[0].status == "tuned"
    assert (tmp_path / "optuna-journal.log").exists()
    for path in tmp_path.glob("t.db*"):
        path.unlink()  # the store is gone; the journal next to it stays
    again = search([k], **run).results[0]
    assert again.status == "tuned" and again.n_trials == 2  # not already_tuned with no winner
    assert len(trials_of(db, k)) == 2 and stored_result(db, k) is not None

    with Store(db) as store:  # the winner alone is deleted (flashtune delete): the trials stay
        store.delete_results(ResultFilter.for_key(k))
    runs = Spy(monkeypatch, "run")
    third = search([k], **run).results[0]
    assert third.status == "tuned" and runs.calls == []  # finalised again: re-timed, nothing measured twice
    assert cid(stored_result(db, k).config) == cid(third.winner)
    assert search([k], **run).results[0].status == "already_tuned"


DRIVER = textwrap.dedent('''
    import socket
    import sys

    from flashtune.autotuner import search
    from flashtune.autotuner.devices import resolve_devices
    from flashtune.keys import GpuInfo, TuningKey
    from flashtune.configs import space
    from flashtune.configs import FwdConfig

    if __name__ == "__main__":
        db, host, lease, ndev = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
        socket.gethostname = lambda: host  # its claims name another host: nobody here can tell it died
        space.SPACES["fwd"] = (FwdConfig, %r)
        keys = [TuningKey(GpuInfo.interpreter().key, "float32", 16, 16, c, "fwd") for c in (True, False)][:ndev]
        # the default (32, 32, 4, 2) is measured first, then the space in order: the third spins
        faults = {FwdConfig(16, 32, 4, 2): %d}
        try:
            search(keys, db=db, trials=4, devices="all" if ndev > 1 else None, device="cpu" if ndev == 1 else None,
                   trial_timeout=300, faults=faults, lease=lease)
        except KeyboardInterrupt:
            sys.exit(42)
        sys.exit(0)
''' % (SPACE, FAULT_SPIN))


def _start_driver(tmp_path, db, *, host="other-host", lease=60.0, devices=1):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**__import__("os").environ, PRETEND_ENV: str(devices)}
    return subprocess.Popen([sys.executable, str(script), str(db), host, str(lease), str(devices)], cwd=REPO,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def _wait_for_trials(proc, db, keys, n):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists() and all(sum(rows_per_config(db, k).values()) >= n for k in keys):
            break
        time.sleep(0.3)
    assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
    time.sleep(1.0)  # the third trial of each key is spinning now


def _claims(db):
    with Store(db) as store:
        return store.claims.all()


def test_a_killed_driver_s_keys_are_taken_over_when_their_lease_expires(tmp_path, monkeypatch):
    db, lease = tmp_path / "t.db", 4.0
    k = key("fwd", "float32", seq_len=16, causal=True)
    proc = _start_driver(tmp_path, db, lease=lease)
    try:
        _wait_for_trials(proc, db, [k], 2)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (held,) = _claims(db)
    assert held.state == "claimed" and held.holder.startswith("other-host:")
    expires = held.lease_expires_at
    assert expires > datetime.now(timezone.utc)  # the killed driver's lease is still running

    from autotuner_helpers import tiny_space

    tiny_space(monkeypatch, "fwd", SPACE)
    first_trial = []
    Spy(monkeypatch, "run", before=lambda worker, n, *a: first_trial.append(datetime.now(timezone.utc)))
    reports = []
    (r,) = search([k], db=db, trials=4, device="cpu", lease=lease, progress=reports.append, **FAST).results
    assert r.status == "tuned" and r.n_trials == 4
    assert first_trial[0] >= expires  # it waited for the lease, then took the key over
    assert [p.held_by for p in reports if p.held_by] == [held.holder]  # and said so, once
    assert len(first_trial) == 2  # resuming its study: the two finished trials are not measured again
    _no_config_twice(db, [k], 4)
    (done,) = _claims(db)
    assert done.state == "done" and done.holder != held.holder


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT to the process group"])
def test_stopping_a_driver_on_two_devices_keeps_its_trials_and_releases_its_claims(tmp_path, how):
    db = tmp_path / "t.db"
    keys = [key("fwd", "float32", seq_len=16, causal=c) for c in (True, False)]
    proc = _start_driver(tmp_path, db, host="vm-here", devices=2)
    try:
        _wait_for_trials(proc, db, keys, 2)
        from autotuner_helpers import child_pids

        workers = [p for p in child_pids(proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) == 2  # one worker process per device, both busy with a spinning trial
        assert {c.state for c in _claims(db)} == {"claimed"} and len(_claims(db)) == 2
        sent = time.monotonic()
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            import os

            os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0].decode()
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 42, out[-3000:]
    assert took < 10, f"{how}: the driver took {took:.1f} s to stop"
    assert "Traceback" not in out, out[-3000:]
    deadline = time.monotonic() + 10
    while any(process_exists(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_exists(p) for p in workers)
    for k in keys:
        assert sum(rows_per_config(db, k).values()) == 2  # the finished trials, nothing else
    now = datetime.now(timezone.utc)
    claims = _claims(db)
    assert len(claims) == 2 and all(c.state == "claimed" and c.lease_expires_at <= now for c in claims)


def test_one_driver_resumes_what_a_stopped_one_released(tmp_path, monkeypatch):
    """Released claims are taken at once (no lease to wait for), by any holder."""
    db = tmp_path / "t.db"
    k = key("fwd", "float32", seq_len=16, causal=True)
    proc = _start_driver(tmp_path, db, host="other-host", lease=600.0)
    try:
        _wait_for_trials(proc, db, [k], 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 42
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    from autotuner_helpers import tiny_space

    tiny_space(monkeypatch, "fwd", SPACE)
    started = time.monotonic()
    (r,) = search([k], db=db, trials=4, device="cpu", lease=600.0, **FAST).results
    assert r.status == "tuned" and time.monotonic() - started < 120
    _no_config_twice(db, [k], 4)
    assert collections.Counter(c.state for c in _claims(db)) == {"done": 1}
