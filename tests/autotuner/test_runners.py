"""SDPA's backends as runners: the search times them beside the Triton winner under the same
correctness gate and timer, stores the fastest as the key's runner, and keeps the Triton
figures apart (flashtune.runners)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from autotuner_helpers import key, tiny_space

from flashtune import runners
from flashtune.runners import RunnerTime
from flashtune.autotuner import search
from flashtune.autotuner.trial import KeyBench
from flashtune.configs.forward import FwdConfig
from flashtune.store import Store

CPU = torch.device("cpu")
FAST = dict(device="cpu", trial_timeout=120, finalists=2, rounds=1)


@pytest.mark.parametrize(("times", "expected"), [
    ({"triton": 1.0, "sdpa-cudnn": 0.5, "sdpa-flash": 0.7}, "sdpa-cudnn"),
    ({"triton": 0.4, "sdpa-cudnn": 0.5}, "triton"),
    ({"triton": 0.5, "sdpa-cudnn": 0.5}, "triton"),  # a tie keeps the kernels
    ({"triton": None, "sdpa-flash": 0.5}, "sdpa-flash"),
    ({"triton": 1.0, "sdpa-flash": None}, "triton"),
    ({}, "triton"),
])
def test_the_fastest_runner_wins_and_triton_keeps_ties(times, expected):
    assert runners.fastest(times) == expected


# (gpu_ms, eager_ms) per runner: flashtune's host cost per eager call is about twice SDPA's
GPU_BOUND = {"triton": (0.20, 0.24), "sdpa-cudnn": (0.21, 0.22), "sdpa-flash": (0.30, 0.31)}
HOST_BOUND = {"triton": (0.20, 0.34), "sdpa-cudnn": (0.21, 0.22), "sdpa-flash": (0.30, 0.31)}


def _times(pairs: dict) -> dict:
    return {name: RunnerTime(*pair) for name, pair in pairs.items()}


@pytest.mark.parametrize(("pairs", "host_bound", "expected"), [
    (GPU_BOUND, False, ("triton", "gpu")),  # eager 1.2x its GPU time: the GPU time decides
    (HOST_BOUND, False, ("sdpa-cudnn", "host-bound")),  # 1.7x: the eager time decides
    (GPU_BOUND, True, ("sdpa-cudnn", "forced")),  # --host-bound: the eager time always decides
    # the factor is the GPU winner's own: a host-bound runner that does not win on GPU time decides nothing
    ({"triton": (0.20, 0.22), "sdpa-cudnn": (0.25, 0.90)}, False, ("triton", "gpu")),
    # eager the GPU winner's again: by eager time it keeps the key
    ({"triton": (0.20, 0.31), "sdpa-cudnn": (0.40, 0.41)}, False, ("triton", "host-bound")),
    # a row of an older search: one time per runner (its GPU time), no eager time to choose by
    ({"triton": (0.20, None), "sdpa-cudnn": (0.10, None)}, False, ("sdpa-cudnn", "gpu")),
    ({"triton": (0.20, None), "sdpa-cudnn": (0.10, None)}, True, ("triton", "forced")),
])
def test_the_gpu_time_chooses_unless_the_call_is_host_bound_or_the_flag_says_so(pairs, host_bound, expected):
    assert runners.choose(_times(pairs), host_bound=host_bound) == expected


def test_host_bound_starts_past_the_factor():
    factor = runners.HOST_BOUND_FACTOR
    at = {"triton": RunnerTime(1.0, factor), "sdpa-cudnn": RunnerTime(1.1, 1.2)}
    past = {"triton": RunnerTime(1.0, factor * 1.01), "sdpa-cudnn": RunnerTime(1.1, 1.2)}
    assert runners.choose(at) == ("triton", "gpu")
    assert runners.choose(past) == ("sdpa-cudnn", "host-bound")


def test_a_stored_time_of_either_form_reads_as_a_runner_time():
    assert runners.runner_times({"triton": 0.5, "sdpa-flash": {"gpu_ms": 0.4, "eager_ms": 0.6}}) == {
        "triton": RunnerTime(0.5, None), "sdpa-flash": RunnerTime(0.4, 0.6)}
    assert runners.runner_time({"gpu": 1}) == {"gpu": 1}  # left for the store's check to name
    assert runners.runner_times(None) is None


def test_a_bad_runner_is_named():
    with pytest.raises(ValueError, match="runner: expected one of triton, sdpa-cudnn, sdpa-flash, sdpa-efficient"):
        runners.check_runner("sdpa-math")


def _flags():
    c = torch.backends.cuda
    return c.flash_sdp_enabled(), c.mem_efficient_sdp_enabled(), c.math_sdp_enabled(), c.cudnn_sdp_enabled()


@pytest.mark.parametrize("runner", list(runners.SDPA_BACKENDS))
def test_an_sdpa_runner_runs_its_backend_alone_and_restores_the_switches(runner, monkeypatch):
    """runners.sdpa sets torch's backend switches for the call (not sdpa_kernel: its host
    cost) and puts back what the caller had, after a failure too."""
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(_flags())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q = torch.randn(1, 2, 8, 16)
    before = _flags()
    try:
        out = runners.sdpa(runner, q, q, q)
    except RuntimeError:  # this backend does not run on the CPU
        out = None
    assert seen == [runners.SDPA_BACKENDS[runner]] and _flags() == before
    if out is not None:
        torch.testing.assert_close(out, real(q, q, q), atol=1e-5, rtol=1e-5)
    torch.backends.cuda.enable_math_sdp(False)  # a caller's own setting is what comes back
    try:
        # on the CPU only the flash backend runs; the others raise
        with pytest.raises(RuntimeError) if runner != "sdpa-flash" else contextlib.nullcontext():
            runners.sdpa(runner, q, q, q)
        assert _flags() == (before[0], before[1], False, before[3])
    finally:
        torch.backends.cuda.enable_math_sdp(before[2])


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_race_times_the_backends_that_run_and_pass_the_check(pass_):
    k = dataclasses.replace(key(pass_, "float32", seq_len=16, causal=True), group=2, batch_heads=2)
    bench = KeyBench(k, CPU)
    winner = FwdConfig(16, 16, 4, 1) if pass_ == "fwd" else None
    if winner is None:
        from flashtune.configs.backward import BwdConfig

        winner = BwdConfig(16, 16, 16, 16, 4, 1)
    times = bench.race(winner, FwdConfig(16, 16, 4, 1) if pass_ == "bwd" else None, rounds=2)
    assert set(times) == set(runners.RUNNERS)
    # the CPU has SDPA's flash backend, not cuDNN's or the memory-efficient one
    assert times["sdpa-cudnn"] is None and times["sdpa-efficient"] is None
    for name in ("triton", "sdpa-flash"):
        t = times[name]
        # both times of each runner; under the interpreter one wall-clock figure is both
        assert isinstance(t, runners.RunnerTime) and t.gpu_ms > 0 and t.eager_ms == t.gpu_ms


def test_race_refuses_a_backend_that_gets_the_answer_wrong(monkeypatch):
    bench = KeyBench(key("fwd", "float32", seq_len=16, causal=False), CPU)
    real = runners.sdpa

    def wrong(name, q, k, v, **kwargs):
        return real(name, q, k, v, **kwargs) * 1.01  # 1 % off: far outside fp32's allowance

    monkeypatch.setattr(runners, "sdpa", wrong)
    times = bench.race(FwdConfig(16, 16, 4, 1), None, rounds=1)
    assert times["triton"].gpu_ms > 0 and times["sdpa-flash"] is None


def test_a_search_stores_the_fastest_runner_and_the_triton_figures_apart(tmp_path, monkeypatch):
    tiny_space(monkeypatch, "fwd", {"BLOCK_M": [16], "BLOCK_N": [16], "num_warps": [4], "num_stages": [1]})
    tiny_space(monkeypatch, "bwd", {"BLOCK_M1": [16], "BLOCK_N1": [16], "BLOCK_M2": [16], "BLOCK_N2": [16],
                                    "num_warps": [4], "num_stages": [1]})
    keys = [key("fwd", "float32", seq_len=16, causal=True), key("bwd", "float32", seq_len=16, causal=True)]
    summary = search(keys, db=tmp_path / "t.db", trials=2, sdpa=True, **FAST)
    with Store(tmp_path / "t.db") as store:
        table = store.load_table(keys[0].gpu)
    for r in summary.results:
        stored = table[r.key]
        assert r.status == "tuned" and stored.runner == r.runner
        assert set(stored.runner_times) == {"triton", "sdpa-flash"}  # what runs on the CPU
        assert all(t.gpu_ms > 0 and t.eager_ms > 0 for t in stored.runner_times.values())  # both times stored
        assert stored.runner_times == r.runner_times and stored.chosen_by == r.chosen_by == "gpu"
        assert stored.runner == runners.fastest({n: t.gpu_ms for n, t in stored.runner_times.items()})
        assert isinstance(stored.config, type(r.winner)) and stored.time_ms == r.time_ms  # Triton's own figures
    # without sdpa (the interpreter's default), only the kernels run
    plain = search([key("fwd", "float32", seq_len=16, causal=False)], db=tmp_path / "t.db", trials=1, **FAST)
    (r,) = plain.results
    assert (r.runner, r.runner_times, r.chosen_by) == ("triton", None, None)


def test_an_inference_keys_triton_time_in_the_race_is_never_below_its_re_timing(tmp_path, monkeypatch):
    """A race that times the Triton winner faster than the key's own re-timing does not keep
    it against a backend that is faster than that re-timing (fwd keys: the same launch); a
    training key's race times a whole step, which no kernel time bounds."""
    from flashtune.autotuner.worker import TrialWorker

    tiny_space(monkeypatch, "fwd", {"BLOCK_M": [16], "BLOCK_N": [16], "num_warps": [4], "num_stages": [1]})
    tiny_space(monkeypatch, "bwd", {"BLOCK_M1": [16], "BLOCK_N1": [16], "BLOCK_M2": [16], "BLOCK_N2": [16],
                                    "num_warps": [4], "num_stages": [1]})
    race = {"triton": RunnerTime(1e-6, 1e-6), "sdpa-flash": RunnerTime(2e-6, 2e-6)}
    monkeypatch.setattr(TrialWorker, "race", lambda self, *args, **kwargs: race)
    keys = [key("fwd", "float32", seq_len=16, causal=True), key("bwd", "float32", seq_len=16, causal=True)]
    fwd, bwd = search(keys, db=tmp_path / "t.db", trials=1, sdpa=True, **FAST).results
    assert fwd.time_ms > 2e-6  # the interpreter's re-timing: milliseconds
    assert fwd.runner == "sdpa-flash" and fwd.runner_times == {"triton": RunnerTime(fwd.time_ms, 1e-6),
                                                               "sdpa-flash": race["sdpa-flash"]}
    assert bwd.runner == "triton" and bwd.runner_times == race


def _racing(monkeypatch, pairs: dict) -> None:
    """Every race of the search measures ``pairs`` (the interpreter's figures cannot be host-bound)."""
    from flashtune.autotuner.worker import TrialWorker

    monkeypatch.setattr(TrialWorker, "race", lambda self, *args, **kwargs: _times(pairs))


@pytest.mark.parametrize(("pairs", "host_bound", "runner", "chosen_by"), [
    (GPU_BOUND, False, "triton", "gpu"),
    (HOST_BOUND, False, "sdpa-cudnn", "host-bound"),
    (GPU_BOUND, True, "sdpa-cudnn", "forced"),
])
def test_a_search_stores_both_times_and_what_chose_the_runner(tmp_path, monkeypatch, pairs, host_bound, runner,
                                                               chosen_by):
    tiny_space(monkeypatch, "bwd", {"BLOCK_M1": [16], "BLOCK_N1": [16], "BLOCK_M2": [16], "BLOCK_N2": [16],
                                    "num_warps": [4], "num_stages": [1]})
    _racing(monkeypatch, pairs)
    k = key("bwd", "float32", seq_len=16, causal=True)
    (r,) = search([k], db=tmp_path / "t.db", trials=1, sdpa=True, host_bound=host_bound, **FAST).results
    assert (r.runner, r.chosen_by, r.runner_times) == (runner, chosen_by, _times(pairs))
    with Store(tmp_path / "t.db") as store:
        stored = store.load_table(k.gpu)[k]
    assert (stored.runner, stored.chosen_by, stored.runner_times) == (runner, chosen_by, _times(pairs))


def test_a_revalidation_keeps_a_key_searched_host_bound_on_its_eager_choice(tmp_path, monkeypatch):
    tiny_space(monkeypatch, "bwd", {"BLOCK_M1": [16], "BLOCK_N1": [16], "BLOCK_M2": [16], "BLOCK_N2": [16],
                                    "num_warps": [4], "num_stages": [1]})
    _racing(monkeypatch, GPU_BOUND)
    db, k = tmp_path / "t.db", key("bwd", "float32", seq_len=16, causal=True)
    search([k], db=db, trials=1, sdpa=True, host_bound=True, **FAST)
    (r,) = search([k], db=db, revalidate=True, sdpa=True, **FAST).results
    assert (r.status, r.runner, r.chosen_by) == ("revalidated", "sdpa-cudnn", "forced")
    search([k], db=db, trials=1, sdpa=True, force=True, **FAST)  # searched again without the flag
    (r,) = search([k], db=db, revalidate=True, sdpa=True, **FAST).results
    assert (r.runner, r.chosen_by) == ("triton", "gpu")


def test_host_bound_must_be_a_bool(tmp_path):
    with pytest.raises(ValueError, match="host_bound: expected True or False, got 'yes'"):
        search([key()], db=tmp_path / "t.db", host_bound="yes", **FAST)
