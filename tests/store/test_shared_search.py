"""Two searches (driver processes) on one store, SQLite and PostgreSQL, split the keys:
none is tuned twice, each has one winner, and both searches tune some (issue 15)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from flashtune.keys import GpuInfo, TuningKey
from flashtune.store import ResultFilter, Store

REPO = Path(__file__).resolve().parents[2]
KEYS = [TuningKey(GpuInfo.interpreter().key, "float32", 16, n, c, "fwd") for n in (16, 32) for c in (False, True)]
TRIALS = 2

DRIVER = textwrap.dedent('''
    import json
    import pathlib
    import sys
    import time

    from flashtune.autotuner import search
    from flashtune.keys import TuningKey

    if __name__ == "__main__":
        db, storage, go, out, keys = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[4], sys.argv[5]
        keys = [TuningKey.from_dict(k) for k in json.loads(keys)]
        while not go.exists():  # both start together
            time.sleep(0.02)
        summary = search(keys, db=db, storage=storage, trials=%d, device="cpu", finalists=1, rounds=1, lease=30)
        pathlib.Path(out).write_text(json.dumps({r.key.label(): r.status for r in summary.results}))
''' % TRIALS)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="runs the interpreter's pretend GPU (CPU CI)")


def test_two_searches_on_one_store_split_the_keys(db_url, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    go = tmp_path / "go"
    keys = json.dumps([k.as_dict() for k in KEYS])
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    with Store(db_url):
        pass  # the schema, made once
    drivers = [subprocess.Popen([sys.executable, str(script), db_url, str(tmp_path / "journal.log"), str(go),
                                 str(tmp_path / f"out{i}.json"), keys], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(2)]
    try:
        time.sleep(0.5)
        go.touch()
        outputs = [proc.communicate(timeout=240)[0].decode() for proc in drivers]
    finally:
        for proc in drivers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(drivers, outputs):
        assert proc.returncode == 0, out[-3000:]
    statuses = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    tuned = [{label for label, status in s.items() if status == "tuned"} for s in statuses]
    assert not tuned[0] & tuned[1], statuses  # no key tuned by both
    assert tuned[0] | tuned[1] == {k.label() for k in KEYS}, statuses
    assert tuned[0] and tuned[1], statuses  # both searches worked
    for s, mine in zip(statuses, tuned):
        # the others: finished by the other search while this one waited, or before it looked
        assert all(s[label] in ("tuned_elsewhere", "already_tuned") for label in s.keys() - mine), statuses
    with Store(db_url) as store:
        for k in KEYS:
            trials = store.trials_for(k)
            assert len(trials) == TRIALS, (k.label(), trials)  # no trial duplicated
            assert len({t.config for t in trials}) == TRIALS
            assert len({t.study for t in trials}) == 1
            (winner,) = store.list_results(ResultFilter.for_key(k))
            ok = [t for t in trials if t.status == "ok"]
            assert winner.config in {t.config for t in ok}  # the winner was measured, once, by its search
        assert Counter(c.state for c in store.claims.all()) == {"done": len(KEYS)}
