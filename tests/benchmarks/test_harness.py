"""benchmarks/harness.py: rows, layouts, the correctness check, the interleaved rounds, the
environment; on the CPU (torch ops and, where a flashtune call is made, the interpreter)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import subprocess

import pytest
import torch
import torch.nn.functional as F

import harness
from flashtune.shapes import REALISTIC_GRID


def test_the_grid_has_the_protocols_rows():
    rows = harness.grid_rows()
    assert len(rows) == 24 and len({r.name for r in rows}) == 24
    row = {r.name: r for r in rows}["grid-d128-4096-causal"]
    assert (row.batch, row.heads_q, row.heads_kv, row.seq_q, row.head_dim, row.causal) == (4, 16, 16, 4096, 128, True)
    assert row.passes == ("fwd", "bwd") and row.dtype == "bfloat16"
    # 16k tokens at width 2048 on every row: the forward's FLOPs grow linearly in N
    full = [r for r in rows if r.head_dim == 64 and not r.causal]
    assert all(r.batch * r.seq_q == 16384 and r.heads_q * r.head_dim == 2048 for r in rows)
    assert full[1].flops("fwd") == 2 * full[0].flops("fwd") and row.flops("bwd") == 2.5 * row.flops("fwd")


def test_rows_are_named_by_set_name_or_grid_row_without_its_masking():
    shapes = harness.select_rows(["shapes"])
    assert [s.name for s in shapes] == [s.name for s in REALISTIC_GRID]
    both = harness.select_rows(["grid-d64-1024", "bert-base-512", "grid-d64-1024-full"], dtype="float16")
    assert [s.name for s in both] == ["grid-d64-1024-full", "grid-d64-1024-causal", "bert-base-512"]
    assert all(s.dtype == "float16" for s in both)
    heads = harness.select_rows(["headdims"])
    assert {s.head_dim for s in heads} == {40, 80, 96, 112, 192, 256} and len({s.name for s in heads}) == 6
    with pytest.raises(ValueError, match="unknown row 'grid-d65'"):
        harness.select_rows(["grid-d65"])


@pytest.mark.parametrize("text, want", [
    ("2,8,2,100,300,64", (2, 8, 2, 100, 300, 64, False)),
    ("1,4,4,17,17,16,causal", (1, 4, 4, 17, 17, 16, True)),
])
def test_a_shape_option_is_a_row_of_both_passes(text, want):
    s = harness.parse_shape(text)
    assert (s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim, s.causal) == want
    assert s.passes == ("fwd", "bwd") and s.name.endswith("causal" if want[-1] else "full")


@pytest.mark.parametrize("text, message", [("1,2,3", "expected B,Hq,Hkv"), ("1,4,3,8,8,16", "heads_kv"),
                                           ("1,4,4,8,8,16,yes", "causal or full"), ("1,4,4,0,8,16", "seq_q")])
def test_a_bad_shape_option_is_named(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        harness.parse_shape(text)


def _args(argv):
    ap = argparse.ArgumentParser()
    harness.add_row_args(ap)
    ap.add_argument("--device", default="cuda")
    return ap, ap.parse_args(argv)


def test_the_row_options_keep_the_passes_asked_for_and_shrink_rows_for_the_interpreter(capsys):
    ap, args = _args(["--rows", "whisper-enc-1500,gpt2-train-512", "--pass", "bwd", "--dtype", "bf16"])
    (row,) = harness.rows_from_args(ap, args)  # whisper has no backward: left out
    assert (row.name, row.passes, row.dtype, row.batch) == ("gpt2-train-512", ("bwd",), "bfloat16", 32)
    ap, args = _args(["--rows", "decode-b1-64k", "--shape", "2,8,2,100,300,64", "--device", "cpu"])
    decode, shape = harness.rows_from_args(ap, args)
    assert (decode.seq_q, decode.seq_k, decode.heads_q // decode.heads_kv, decode.dtype) == (1, 40, 4, "float16")
    assert (shape.batch, shape.seq_q, shape.seq_k, shape.head_dim) == (1, 17, 40, 64)
    ap, args = _args(["--rows", "sd15-cross-4096x77", "--pass", "bwd"])
    with pytest.raises(SystemExit):
        harness.rows_from_args(ap, args)
    assert "no row to run" in capsys.readouterr().err


def test_the_interpreter_is_chosen_from_the_device_argument(monkeypatch):
    for argv, chosen in ((["--device", "cpu"], True), (["--device=cpu"], True), (["--device", "cuda:1"], False),
                         (["--rows", "cpu"], False)):
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        assert harness.use_interpreter_for_cpu(argv) is chosen
        assert (os.environ.get("TRITON_INTERPRET") == "1") is chosen


def test_the_transformers_layout_is_views_of_sequence_major_storage():
    shape = harness.parse_shape("2,4,2,5,7,8,causal")
    q, k, v, do = harness.make_inputs(shape, "cpu", "transformers")
    assert q.shape == do.shape == (2, 4, 5, 8) and k.shape == v.shape == (2, 2, 7, 8)
    assert not q.is_contiguous() and q.transpose(1, 2).is_contiguous() and k.transpose(1, 2).is_contiguous()
    assert all(x.is_contiguous() for x in harness.make_inputs(shape, "cpu", "contiguous"))
    again = harness.make_inputs(shape, "cpu", "transformers")
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, do), again))  # seeded
    with pytest.raises(ValueError, match="layout"):
        harness.make_inputs(shape, "cpu", "bnhd")


def test_the_reference_is_attention_on_batch_0_and_kv_head_0():
    # grouped-query, causal with more keys than queries (top-left, as SDPA's is_causal)
    gen = torch.Generator().manual_seed(3)
    q, do = (torch.randn(2, 6, 5, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, 2, 9, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
    want = harness.reference_slice([o.detach(), *torch.autograd.grad(o, leaves, do)], q, k)
    got = harness.reference(q, k, v, do, True, grads=True, dtype=torch.float64)
    assert [g.shape for g in got] == [(1, 3, 5, 8), (1, 3, 5, 8), (1, 1, 9, 8), (1, 1, 9, 8)]
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-12)


def test_the_check_passes_right_runners_and_names_wrong_and_failing_ones():
    shape = dataclasses.replace(harness.parse_shape("1,4,2,9,9,16,causal"), dtype="float32")
    q, k, v, do = harness.make_inputs(shape, "cpu")
    math_ = harness.anchor("math", "cpu")

    def fails(q, k, v, causal):
        raise RuntimeError("no kernel for this shape")

    runs = {"math": math_, "same": lambda q, k, v, c: math_(q, k, v, c),
            "off": lambda q, k, v, c: math_(q, k, v, c) * 1.05,
            "noisy": lambda q, k, v, c: math_(q, k, v, c) + 0.01 * torch.randn_like(q), "fails": fails}
    passed, failed = harness.check(runs, {"same", "off", "noisy"}, q, k, v, do, True, grads=True)
    assert set(passed) == {"math", "same"} and passed["math"]["anchor"]
    assert passed["same"]["rel_vs_anchor"] == {n: 0.0 for n in harness.NAMES}
    assert "o: max error" in failed["off"] and "o: max error" in failed["noisy"]
    assert "against the check's anchor > 0.05" not in failed["noisy"]  # 1 % noise: within the sanity bound
    assert failed["fails"] == "RuntimeError: no kernel for this shape"
    # not strict: only the 5 % sanity bound against the anchor applies
    passed, failed = harness.check({"math": math_, "off": runs["off"]}, set(), q, k, v, do, True, grads=False)
    assert set(passed) == {"math", "off"}


def test_the_check_takes_the_next_anchor_when_the_first_cannot_run():
    shape = harness.parse_shape("1,2,2,5,5,16")
    q, k, v, do = harness.make_inputs(shape, "cpu")
    runs = {"cudnn": lambda *a: (_ for _ in ()).throw(RuntimeError("no GPU")), "math": harness.anchor("math", "cpu"),
            "flash": harness.anchor("flash", "cpu")}
    passed, failed = harness.check(runs, {"flash"}, q, k, v, do, False, grads=False)
    assert passed["math"]["anchor"] and "rel_vs_anchor" in passed["flash"] and set(failed) == {"cudnn"}


def test_anchors_that_cannot_run_here_say_why():
    runs, notes = harness.anchors(["cudnn", "math", "fa2", "efficient"], "cpu")
    assert set(runs) == {"math"} and set(notes) == {"cudnn", "fa2", "efficient"}
    assert "CUDA GPU" in notes["cudnn"]
    ap = argparse.ArgumentParser()
    assert harness.parse_anchors(ap, "sdpa-cudnn,fa4,cudnn") == ["cudnn", "fa4"]
    with pytest.raises(SystemExit):
        harness.parse_anchors(ap, "cudnn,fa3")


def test_rounds_interleave_rotate_and_drop_a_failing_runner():
    calls = []
    slow = {("cudnn", "fwd", 1): 9.0}  # one slow moment, in round 1

    def time_one(run, pass_):
        r = sum(1 for c in calls if c[:2] == (run, pass_))
        calls.append((run, pass_, r))
        if run == "flash" and pass_ == "bwd":
            raise RuntimeError("no kernel for this shape")
        return slow.get((run, pass_, r), {"flashtune": 1.0, "cudnn": 2.0, "flash": 3.0}[run] + 0.01 * r)

    runners = {name: name for name in ("flashtune", "cudnn", "flash")}
    times, failed = harness.time_rounds(runners, ["fwd", "bwd"], 3, time_one)
    order = [c[0] for c in calls if c[1] == "fwd"]
    assert order == ["flashtune", "cudnn", "flash", "cudnn", "flash", "flashtune", "flash", "flashtune", "cudnn"]
    assert len(calls) == 6 + 5 + 5  # the failing pass is not tried again
    assert times["cudnn", "fwd"] == [2.0, 9.0, 2.02] and times["flash", "bwd"] == []
    assert failed == {("flash", "bwd"): "RuntimeError: no kernel for this shape"}
    assert statistics.median(times["cudnn", "fwd"]) == 2.02  # the slow round does not count


def test_rounds_disturbed_by_a_busy_host_are_outvoted_by_more_rounds():
    seen = {}
    plan = {"dropin": [0.193, 0.108, 0.058, 0.058, 0.058, 0.058], "cudnn": [0.15, 0.064, 0.064, 0.064, 0.064, 0.064]}

    def time_one(run, pass_):
        i = seen[run] = seen.get(run, -1) + 1
        return plan[run][i]

    runners = {"dropin": "dropin", "cudnn": "cudnn"}
    times, _ = harness.time_rounds(runners, ["fwd"], 3, time_one, max_rounds=7)
    assert times["dropin", "fwd"] == [0.193, 0.108, 0.058, 0.058, 0.058]  # 2 slow of 5: a minority
    seen.clear()
    assert len(harness.time_rounds(runners, ["fwd"], 3, time_one)[0]["dropin", "fwd"]) == 3
    seen.clear()
    plan["dropin"] = [0.3, 0.3, 0.1] + [0.3, 0.1] * 10  # a host that stays busy: max_rounds bounds it
    assert len(harness.time_rounds(runners, ["fwd"], 3, time_one, max_rounds=7)[0]["dropin", "fwd"]) == 7


def test_a_pass_call_times_the_forward_or_the_backward_alone():
    shape = harness.parse_shape("1,2,2,6,6,8,causal")
    q, k, v, do = harness.make_inputs(shape, "cpu")
    forwards = []

    def run(q, k, v, causal):
        forwards.append(torch.is_grad_enabled())
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    fwd = harness.pass_call(run, "fwd", q, k, v, do, True)
    assert fwd().shape == q.shape and forwards == [False]
    bwd = harness.pass_call(run, "bwd", q, k, v, do, True)
    first, second = bwd(), bwd()  # the kept forward's graph, used again: one forward in all
    assert forwards == [False, True] and all(torch.equal(a, b) for a, b in zip(first, second))
    ms, timer = harness.time_ms(bwd, torch.device("cpu"))
    assert ms > 0 and timer == "interpreter wall clock"
    with pytest.raises(ValueError, match="timer"):
        harness.time_ms(bwd, torch.device("cpu"), "events")


def test_the_environment_names_the_software_and_the_commit(tmp_path):
    env = harness.environment("cpu")
    for key in ("date", "command", "torch", "triton", "flashtune", "flashtune_commit", "cudnn", "driver", "gpu"):
        assert key in env
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["gpu"] is None
    line = harness.environment_line(env)
    assert f"torch {torch.__version__}" in line and "interpreter" in line and env["command"] in line
    assert harness.cudnn_version(91900) == "9.19.0" and harness.cudnn_version(None) is None
    assert harness.git_commit(tmp_path) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    commit = harness.git_commit(tmp_path)
    assert len(commit) == 40 and not commit.endswith("+dirty")
    (tmp_path / "a.py").write_text("x = 2\n")
    assert harness.git_commit(tmp_path) == commit + "+dirty"


def test_figures():
    assert harness.tflops(1e12, 1.0) == pytest.approx(1000.0) and harness.tflops(1e12, None) is None
    assert harness.ratio(2.0, 4.0) == 0.5 and harness.ratio(None, 4.0) is None and harness.ratio(1.0, 0) is None
    assert harness.geomean([2.0, 8.0, None]) == pytest.approx(4.0) and harness.geomean([]) is None
    assert harness.fmt(None, "8.3f") == "     n/a" and harness.fmt(math.nan, "5.1f") == "  n/a"
    assert harness.fmt(1.23456, "6.2f") == "  1.23"
