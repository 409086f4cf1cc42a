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
    assert fn.explain(q, k, v).runner == "triton"


def test_a_stored_runner_must_be_known_and_timed(write):
    with pytest.raises(Exception, match="runner: expected one of triton"):
        write(32, "fwd", FWD_A, runner="sdpa-math")
