"""Session setup that must run before anything imports triton.

Without a GPU the Triton kernels run under Triton's interpreter on CPU tensors, and the
interpreter must be switched on before triton is first imported (triton decides when a
@triton.jit function is decorated). A TRITON_INTERPRET already set by the caller wins.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import contextlib  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def operator_forward_configs(monkeypatch):
    """The forward configs torch.ops.flashtune.attention launches, in call order (kernels/ops.py)."""
    from flashtune.kernels import ops

    seen = []
    real = ops.attention_forward

    def spy(q, k, v, config, **kwargs):
        seen.append(config)
        return real(q, k, v, config, **kwargs)

    monkeypatch.setattr(ops, "attention_forward", spy)
    return seen


@pytest.fixture(autouse=True)
def _gpu_memory_back_after_gpu_tests(request):
    """After a GPU test, its cached GPU memory goes back to the driver: under pytest-xdist
    every worker is a process of its own, and on the H200 fourteen workers each keeping
    12-15 GiB cached left none for a large test (7 out-of-memory failures of 212)."""
    yield
    if request.node.get_closest_marker("gpu") is not None and torch.cuda.is_available() \
            and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture
def gpu_memory_turn(tmp_path_factory):
    """A context manager factory: ``with gpu_memory_turn(heavy):`` makes the memory-heavy GPU
    tests take turns across pytest-xdist workers (a file lock in the run's shared temporary
    directory), while the light ones (``heavy`` false) run side by side. Serialising every
    case made `pytest -m gpu` run past 5 minutes at 43 % on the H200 (2026-12-02)."""
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # the same directory for every worker of a run

    @contextlib.contextmanager
    def turn(heavy: bool = True):
        if not heavy:
            yield
            return
        with open(shared / "flashtune-gpu-memory.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    return turn
