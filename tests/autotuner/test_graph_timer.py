"""The autotuner's timer (protocol.graph_time_ms): a config's launches replayed from a CUDA
graph, so a short call is timed by the GPU's work and not by the host's; eager timing where
a call cannot be captured, and under the interpreter."""

from __future__ import annotations

import pytest
import torch
from autotuner_helpers import key

from flashtune.autotuner.trial import KeyBench
from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig
from flashtune.protocol import graph_time_ms

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Counted:
    """A callable that counts its Python calls (a graph replay makes none)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self):
        self.calls += 1
        return self.fn()


def test_without_a_gpu_the_call_is_timed_eagerly():
    x = torch.randn(64, 64)
    fn = Counted(lambda: x @ x)
    assert graph_time_ms(fn, torch.device("cpu")) > 0
    assert fn.calls >= 2  # time_ms's warm-up and its timed calls


@pytest.mark.gpu
@gpu
def test_a_capturable_call_is_timed_from_graph_replays():
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    fn = Counted(lambda: x @ x)
    ms = graph_time_ms(fn, x.device)
    # two warm-up calls and the capture; do_bench's many runs are replays
    assert fn.calls == 3
    assert ms > 0


@pytest.mark.gpu
@gpu
def test_a_call_that_cannot_be_captured_is_timed_eagerly():
    x = torch.randn(256, 256, device="cuda")
    fn = Counted(lambda: (x @ x).sum().item())  # .item() syncs: not capturable
    ms = graph_time_ms(fn, x.device)
    assert ms > 0
    assert fn.calls > 10  # do_bench called it
    # the failed capture left the device usable
    assert torch.isfinite((x @ x).sum()).item()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_a_trial_is_timed_from_graph_replays(pass_, monkeypatch):
    """A trial's launcher runs once for the check, twice to warm up and once under capture:
    do_bench's timed runs are replays (an eager timing would call it dozens of times)."""
    bench = KeyBench(key(pass_, "bfloat16", seq_len=128, causal=True, head_dim=64), torch.device("cuda"))
    cfg = FwdConfig(64, 64, 4, 2) if pass_ == "fwd" else BwdConfig(32, 64, 64, 32, 4, 2)
    made, launcher = [], bench.launcher

    def counted(*args, **kwargs):
        made.append(Counted(launcher(*args, **kwargs)))
        return made[-1]

    monkeypatch.setattr(bench, "launcher", counted)
    out = bench.run(cfg)
    assert out.status == "ok" and out.time_ms > 0, out
    assert [fn.calls for fn in made] == [4]
    assert bench.describe()["timer"] == "cuda-graph-replay"


def test_the_gpu_warm_up_leaves_other_devices_alone(monkeypatch):
    from flashtune import protocol

    monkeypatch.setattr(protocol, "_WARM", set())
    protocol.warm_up_gpu(torch.device("cpu"), seconds=5.0)  # returns at once: nothing to warm
    assert protocol._WARM == set()


@pytest.mark.gpu
@gpu
def test_the_gpu_is_warmed_once_per_process_before_timing(monkeypatch):
    import time

    from flashtune import protocol

    monkeypatch.setattr(protocol, "_WARM", set())
    device = torch.device("cuda", torch.cuda.current_device())
    start = time.perf_counter()
    protocol.time_ms(lambda: None, device, quick=True)
    assert time.perf_counter() - start >= 0.2 and device in protocol._WARM
    start = time.perf_counter()
    protocol.warm_up_gpu(device, seconds=5.0)
    assert time.perf_counter() - start < 0.5  # once per process and device
