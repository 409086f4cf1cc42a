"""Autotuner tests: the search runs under Triton's interpreter on CPU tensors, tiny shapes.

The trial worker is a spawned child process, so monkeypatching in a test reaches only
the parent: the search space, ``validate()``'s limits, the sampler and the worker's
parent-side methods. The child only receives configs.

Every test here must leave no child process behind (no worker, no zombie).
"""

from __future__ import annotations

import os

import pytest
from autotuner_helpers import child_pids


@pytest.fixture(autouse=True)
def _no_default_store(tmp_path, monkeypatch):
    """No test may touch the user's real default store."""
    monkeypatch.setenv("FLASHTUNE_DB", str(tmp_path / "default-store" / "tuned.db"))


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    before = set(child_pids())
    yield
    left = set(child_pids()) - before
    assert not left, f"the test left child processes behind: {sorted(left)} (pid {os.getpid()})"
