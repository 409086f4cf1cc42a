"""benchmarks/race_timing.py without a GPU: its arguments, its rows and its report's figures."""

from __future__ import annotations

import pytest


def test_the_default_rows_are_the_short_keys_each_with_its_pass_and_model(script):
    race_timing = script("race_timing")
    args, rows = race_timing.parse_args([])
    assert (args.device, args.layers, args.rounds, args.db, args.out) == ("cuda", 4, 3, None, None)
    got = [(r.shape.name, r.pass_, r.model) for r in rows]
    assert got == [("train-b8-h12-1024-d64-causal", "bwd", "llama"), ("gpt2-train-512", "bwd", "llama"),
                   ("bert-base-512", "bwd", "bert"), ("vit-l16-257", "bwd", "bert"),
                   ("decode-b32-4k", "fwd", "llama-decode"), ("decode-b1-64k", "fwd", "llama-decode")]
    first = rows[0].shape
    assert (first.batch, first.heads_q, first.seq_q, first.head_dim, first.causal, first.dtype) == \
        (8, 12, 1024, 64, True, "bfloat16")


def test_rows_by_name_and_shape_are_sized_for_the_interpreter_on_the_cpu(script):
    race_timing = script("race_timing")
    args, rows = race_timing.parse_args(["--device", "cpu", "--rows", "decode-b1-64k",
                                         "--shape", "2,8,8,4096,77,40", "--shape", "2,8,2,64,64,64,causal"])
    assert args.rounds == 1
    decode, cross, causal = rows
    assert (decode.shape.batch, decode.shape.seq_q, decode.shape.seq_k, decode.shape.dtype) == (1, 1, 40, "float16")
    assert (decode.pass_, decode.model) == ("fwd", "llama-decode")
    # what no self-attention stack runs has no model, and says why
    assert cross.model is None and "cross attention" in cross.note
    assert (causal.pass_, causal.model, causal.shape.heads_kv) == ("bwd", "llama", 1)


@pytest.mark.parametrize("argv, message", [
    (["--rows", "gpt2-train-512,nope"], "--rows: unknown row 'nope'"),
    (["--layers", "0"], "--layers: expected a positive number, got 0"),
    (["--rounds", "0"], "--rounds: expected a positive number, got 0"),
    (["--rows", ""], "--rows/--shape: no row to run"),
    (["--shape", "1,2,3"], "--shape"),
])
def test_bad_arguments_are_named(script, capsys, argv, message):
    with pytest.raises(SystemExit) as done:
        script("race_timing").parse_args(argv)
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_the_report_says_what_each_way_of_choosing_costs_in_the_model(script):
    from flashtune.runners import RunnerTime

    race_timing = script("race_timing")
    _, rows = race_timing.parse_args(["--rows", "gpt2-train-512"])
    # the kernels win on GPU time but are host-bound: the rule goes by eager time, to cuDNN
    race = {"triton": RunnerTime(0.2, 0.34), "sdpa-cudnn": RunnerTime(0.21, 0.22), "sdpa-flash": None,
            "sdpa-efficient": RunnerTime(0.4, 0.41)}
    model = {"triton": 5.0, "sdpa-cudnn": 4.0, "sdpa-flash": 3.0, "sdpa-efficient": None}
    row = race_timing.report_row(rows[0], race, model, ["a note"])
    assert (row["rule"], row["chosen_by"], row["gpu_choice"], row["eager_choice"]) == \
        ("sdpa-cudnn", "host-bound", "triton", "sdpa-cudnn")
    assert row["host_bound_ratio"] == pytest.approx(1.7)
    # sdpa-flash failed the race's check: no candidate, however fast in the model
    assert (row["model_fastest"], row["rule_agrees"]) == ("sdpa-cudnn", True)
    assert row["model_slowdown"] == {"rule": 1.0, "gpu_choice": 1.25, "eager_choice": 1.0}
    assert row["race"]["triton"] == {"gpu_ms": 0.2, "eager_ms": 0.34} and row["race"]["sdpa-flash"] is None
    skipped = race_timing.report_row(rows[0], {}, {}, ["race: it did not fit"])
    assert (skipped["rule"], skipped["model_fastest"], skipped["rule_agrees"]) == (None, None, None)
    summary = race_timing.summary([row, skipped])
    assert summary["rows_judged"] == 1
    assert summary["rule"] == {"agrees": 1, "geomean_slowdown": 1.0}
    assert summary["gpu_choice"] == {"agrees": 0, "geomean_slowdown": pytest.approx(1.25)}
