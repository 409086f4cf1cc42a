"""A worker child that dies while idle (the OOM killer) costs nothing: the next trial
starts a fresh child, which builds the key's inputs again; one lost during the final
re-timing costs the key nothing either."""

from __future__ import annotations

import os
import signal
import time

import pytest
from autotuner_helpers import cid, key, stored_result, tiny_space, trials_of

from flashtune.autotuner import search
from flashtune.autotuner.worker import TrialWorker
from flashtune.configs.forward import FwdConfig


def test_a_child_killed_while_idle_is_replaced_before_the_next_trial():
    k = key("fwd", "float32", seq_len=16, causal=True)
    cfg = FwdConfig(16, 16, 4, 1)
    with TrialWorker("cpu", interpreter=True) as worker:
        first = worker.run(k, cfg, timeout=120)
        assert first.status == "ok", first.message
        pid = worker.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while worker._proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        second = worker.run(k, cfg, timeout=120)  # failed on 3a7812e: WorkerError on "run"
        assert second.status == "ok", second.message
        assert worker.pid != pid and worker.restarts == 2


class _DieWhenUnpickled:
    """Sent with a request, it kills the worker as it reads it: a worker lost mid-request."""

    def __reduce__(self):
        return (os._exit, (9,))


@pytest.mark.parametrize("loss", ["once", "by one finalist"])
def test_a_worker_lost_during_the_final_retiming_costs_the_key_nothing(loss, tmp_path, monkeypatch):
    """Killed once (the OOM killer, a signal): every finalist is timed again, alone. Lost by
    one finalist each time it runs: that one is recorded as crashed and drops out, another
    wins. Before: the key ended "failed: crashed" and stored nothing."""
    configs = tiny_space(monkeypatch, "fwd", {"BLOCK_M": [16, 32, 64], "BLOCK_N": [16], "num_warps": [4],
                                              "num_stages": [1]})
    culprit = configs[0]
    lost = []
    real_request = TrialWorker._request

    def request(worker, op, args, timeout):
        if op == "retime" and (not lost if loss == "once" else cid(culprit) in map(cid, args["configs"])):
            lost.append([cid(c) for c in args["configs"]])
            args = {**args, "die": _DieWhenUnpickled()}
        return real_request(worker, op, args, timeout)

    monkeypatch.setattr(TrialWorker, "_request", request)
    k = key("fwd", "float32", seq_len=16, causal=True)
    db = tmp_path / "t.db"
    (r,) = search([k], db=db, trials=3, device="cpu", finalists=3, rounds=1).results
    assert r.status == "tuned", r.message
    everyone = sorted(cid(c) for c in configs)
    if loss == "once":
        assert len(lost) == 1 and sorted(lost[0]) == everyone
        assert r.outcomes == {"ok": 3}
    else:
        assert sorted(lost[0]) == everyone and lost[1:] == [[cid(culprit)]]
        assert r.outcomes == {"ok": 2, "crashed": 1} and cid(r.winner) != cid(culprit)
        (crash,) = [t for t in trials_of(db, k) if t.status == "crashed"]
        assert cid(crash.config) == cid(culprit) and "re-timed" in crash.message and "exit code 9" in crash.message
    assert cid(stored_result(db, k).config) == cid(r.winner)
