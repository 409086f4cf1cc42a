"""The drop-in runs each call with the runner its key stored: the Triton kernels, or the SDPA
backend the search measured faster (a call without gradients: its fwd key's runner; with
them: its bwd key's), and falls back to the kernels where that backend cannot run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dispatch_samples import BWD_A, FWD_A, qkv

from flashtune import dispatch, runners
from flashtune.dispatch import DispatchWarning, get_tuned_attention
from flashtune.runners import RunnerTime


@pytest.fixture
def calls(monkeypatch):
    """The runners each call ran: an SDPA backend's name, or "triton" for the kernels."""
    ran = []
    real_sdpa, real_apply, real_forward = runners.sdpa, dispatch.FlashAttentionFunction.apply, dispatch.attention_forward

    def sdpa(name, *args, **kwargs):
        ran.append(name)
        return real_sdpa(name, *args, **kwargs)

    def kernels(real):
        def run(*args, **kwargs):
            ran.append("triton")
            return real(*args, **kwargs)
        return run

    monkeypatch.setattr(runners, "sdpa", sdpa)
    monkeypatch.setattr(dispatch.FlashAttentionFunction, "apply", kernels(real_apply))
    monkeypatch.setattr(dispatch, "attention_forward", kernels(real_forward))
    return ran


def test_inference_calls_run_the_fwd_keys_runner_and_training_calls_the_bwd_keys(write, db_path, calls):
    write(32, "fwd", FWD_A, runner="sdpa-flash")
    write(32, "bwd", BWD_A)
    fn = get_tuned_attention(db_path)
    q, k, v = qkv(32)
    choice = fn.explain(q, k, v)
    assert (choice.runner, choice.train_runner, choice.fwd_config) == ("sdpa-flash", "triton", FWD_A)
    assert "runs: sdpa-flash without gradients, triton with them" in str(choice)
    with torch.no_grad():
        o = fn(q, k, v)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)
    q, k, v = qkv(32, grad=True)
    o = fn(q, k, v)
    o.sum().backward()
    assert calls == ["sdpa-flash", "triton"] and q.grad is not None


def test_a_training_runner_of_sdpa_runs_forward_and_backward_in_sdpa(write, db_path, calls):
    write(32, "fwd", FWD_A)
    write(32, "bwd", BWD_A, runner="sdpa-flash")
    fn = get_tuned_attention(db_path)
    q, k, v = qkv(32, grad=True)
    fn(q, k, v, is_causal=False).sum().backward()
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qs, ks, vs).sum().backward()
    torch.testing.assert_close(q.grad, qs.grad, atol=1e-5, rtol=1e-5)
    assert calls == ["sdpa-flash"]


def test_a_runner_that_cannot_run_the_call_falls_back_to_the_kernels(write, db_path, calls):
    write(32, "fwd", FWD_A, runner="sdpa-cudnn")  # tuned on a GPU; this CPU has no cuDNN attention
    fn = get_tuned_attention(db_path)
    q, k, v = qkv(32)
    with pytest.warns(DispatchWarning, match="tuned runner sdpa-cudnn cannot run a call"):
        with torch.no_grad():
            o = fn(q, k, v)
        with torch.no_grad():
            fn(q, k, v)  # the signature runs the kernels from now on: the backend is not tried again
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v), atol=1e-4, rtol=1e-4)
    assert calls == ["sdpa-cudnn", "triton", "triton"]
    choice = fn.explain(q, k, v)
    assert (choice.runner, choice.runner_source) == ("triton",
                                                     "triton: the tuned runner sdpa-cudnn cannot run this call")


def test_a_stored_runner_must_be_known_and_timed(write):
    with pytest.raises(Exception, match="runner: expected one of triton"):
        write(32, "fwd", FWD_A, runner="sdpa-math")


def test_explain_says_which_timing_chose_each_runner(write, db_path):
    write(32, "fwd", FWD_A, runner="sdpa-flash", chosen_by="gpu",
          runner_times={"triton": RunnerTime(0.25, 0.3), "sdpa-flash": RunnerTime(0.125, 0.1875)})
    write(32, "bwd", BWD_A, runner="sdpa-flash", chosen_by="host-bound",
          runner_times={"triton": RunnerTime(0.5, 1.0), "sdpa-flash": RunnerTime(0.625, 0.75)})
    choice = get_tuned_attention(db_path).explain(*qkv(32))
    assert choice.runner_source == ("sdpa-flash, chosen by GPU time (CUDA-graph replay); GPU / eager ms: "
                                    "sdpa-flash 0.125 / 0.1875, triton 0.25 / 0.3")
    assert choice.train_runner_source == ("sdpa-flash, chosen by eager time (host-bound: triton's eager time 2.00x "
                                          "its GPU time, over 1.5x); GPU / eager ms: sdpa-flash 0.625 / 0.75, "
                                          "triton 0.5 / 1")
    text = str(choice)
    assert f"runner without gradients: {choice.runner_source}" in text
    assert f"runner with gradients: {choice.train_runner_source}" in text
    # dropout runs the kernels whatever runner the key has, and says so
    dropped = get_tuned_attention(db_path).explain(*qkv(32), dropout_p=0.5)
    assert dropped.runner_source == dropped.train_runner_source == \
        "triton: dropout runs the kernels, whatever runner the key has"


def test_explain_of_a_key_raced_with_the_flag_or_before_runners_had_both_times(write, db_path):
    write(32, "fwd", FWD_A, chosen_by="forced",
          runner_times={"triton": RunnerTime(0.25, 0.3), "sdpa-flash": RunnerTime(0.125, 0.5)})
    write(32, "bwd", BWD_A, runner="sdpa-flash", runner_times={"triton": 1.0, "sdpa-flash": 0.5})  # an older row
    choice = get_tuned_attention(db_path).explain(*qkv(32))
    assert choice.runner_source == ("triton, chosen by eager time (searched with --host-bound); GPU / eager ms: "
                                    "triton 0.25 / 0.3, sdpa-flash 0.125 / 0.5")
    assert choice.train_runner_source == ("sdpa-flash, chosen by one timing per runner (a search before runners had "
                                          "GPU and eager times); GPU / eager ms: sdpa-flash 0.5 / -, triton 1 / -")


def test_a_key_tuned_without_a_race_says_nothing_of_runners(write, db_path):
    write(32, "fwd", FWD_A)
    choice = get_tuned_attention(db_path).explain(*qkv(32))
    assert (choice.runner_source, choice.train_runner_source) == ("", "")  # the bwd pass: the heuristic
    assert "runner with" not in str(choice) and "runner without" not in str(choice)
