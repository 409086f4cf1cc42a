"""A worker child that dies while idle (the OOM killer) costs nothing: the next trial
starts a fresh child, which builds the key's inputs again (issue 17, item 1)."""

from __future__ import annotations

import os
import signal
import time

from autotuner_helpers import key

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
