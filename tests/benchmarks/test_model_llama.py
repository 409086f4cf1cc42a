"""benchmarks/model_llama.py: the tiny model end to end under the interpreter, and the profile's
classification of kernels and host ranges on made-up events (no GPU here)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "model_llama.py"


def test_the_tiny_model_times_checks_and_profiles_both_implementations(tmp_path):
    out = tmp_path / "model.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "FLASHTUNE_DB": str(tmp_path / "none.db"),
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--train", "1x32", "--gen-batch", "2",
                           "--strict", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["implementations"] == {"sdpa": "sdpa", "ftune": "ftune"}
    assert result["model"]["layers"] == 2 and result["model"]["hidden_size"] == 64
    assert result["model"]["num_attention_heads"] == 4 and result["model"]["num_key_value_heads"] == 2
    cases = {c["name"]: c for c in result["cases"]}
    assert list(cases) == ["train-1x32", "generate-b2-p32-n4"]
    for case in cases.values():
        assert case["errors"] == {}  # --strict: a call that flashtune's kernels did not run would be one
        ms = case["ms"]
        assert ms["sdpa"] > 0 and ms["ftune"] > 0
        assert case["ratio_sdpa_over_ftune"] == pytest.approx(ms["sdpa"] / ms["ftune"])
        assert f"sdpa/ftune {case['ratio_sdpa_over_ftune']:6.3f}" in done.stdout
        assert case["check"]["ok"] is True
    train, gen = cases["train-1x32"]["check"], cases["generate-b2-p32-n4"]["check"]
    # fp32 on both sides: flashtune's model agrees with SDPA's to rounding, far inside the 5 %
    assert train["logits_rel_err"] < 1e-4 and train["layer0_grad_rel_err"] < 1e-4
    assert train["loss"] == pytest.approx(train["sdpa_loss"], rel=1e-5)
    assert gen["tokens_equal"] is True and gen["tokens_equal_fraction"] == 1.0
    assert gen["first_differing_step"] == [None, None] and gen["prompt_logits_rel_err"] < 1e-4
    assert cases["generate-b2-p32-n4"]["tokens_per_s"]["ftune"] == pytest.approx(2 * 4 / (
        cases["generate-b2-p32-n4"]["ms"]["ftune"] * 1e-3))
    # each layer's attention once in the step; generate(): the prefill and 3 decode steps
    for name, calls, backward in (("train-1x32", 2, 2), ("generate-b2-p32-n4", 8, 0)):
        ftune, sdpa = cases[name]["breakdown"]["ftune"], cases[name]["breakdown"]["sdpa"]
        assert ftune["host_calls"] == {"attention_function": calls, "flashtune_dispatcher": calls,
                                       "attention_backward_nodes": backward}
        assert sdpa["host_calls"] == {"attention_function": calls, "flashtune_dispatcher": 0,
                                      "attention_backward_nodes": backward}
        host = ftune["host_ms"]
        assert 0 < host["flashtune_dispatcher"] <= host["attention_function"] < ftune["step_ms_profiled"]
        assert ftune["gpu_profiled"] is False and ftune["gpu_ms_launched_in_attention"] is None
    assert not (tmp_path / "none.db").exists()


def test_bad_case_lists_are_refused_naming_the_argument(script, capsys):
    module = script("model_llama")
    for argv, name in ((["--train", "8192"], "--train"), (["--gen-batch", "1,0"], "--gen-batch"),
                       (["--prompt", "0"], "--prompt"), (["--train", "", "--gen-batch", ""], "--train/--gen-batch")):
        with pytest.raises(SystemExit) as done:
            module.main(["--device", "cpu", *argv])
        assert done.value.code == 2
        assert f"error: {name}" in capsys.readouterr().err
    assert module.parse_train("1x8192, 4x2048") == [(1, 8192), (4, 2048)]


def test_kernels_are_told_apart_by_whose_they_are(script):
    module = script("model_llama")
    names = frozenset({"_attn_fwd_kernel", "_bwd_dq_kernel", "_gluon_attn_fwd_kernel"})
    assert module.kernel_class("_attn_fwd_kernel", names) == "flashtune"
    assert module.kernel_class("_gluon_attn_fwd_kernel", names) == "flashtune"
    for sdpa in ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)",
                 "fmha_cutlassB_bf16_aligned_64x64_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)",
                 "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0"):
        assert module.kernel_class(sdpa, names) == "sdpa", sdpa
    assert module.kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", names) == "other"
    assert module.kernel_class("void at::native::elementwise_kernel<128, 2>(int, Func)", names) == "other"


def test_the_summary_sums_gpu_time_by_class_and_what_attention_launched(script):
    from torch.autograd import DeviceType

    module = script("model_llama")
    ids = iter(range(1, 100))

    def event(name, us, device=DeviceType.CPU, parent=None, launched_by=None):
        span = types.SimpleNamespace(elapsed_us=lambda: us)
        return types.SimpleNamespace(name=name, time_range=span, device_type=device, id=next(ids), cpu_parent=parent,
                                     linked_correlation_id=launched_by.id if launched_by else 0)

    step = event(module.STEP_RANGE, 1000)
    attention = event(module.ATTENTION_RANGE, 300, parent=step)
    dispatch = event(module.DISPATCH_RANGE, 200, parent=attention)
    copy = event("aten::copy_", 10, parent=attention)  # the output's transpose, inside the function
    node = event("autograd::engine::evaluate_function: FlashAttentionFunctionBackward", 150)
    other_node = event("autograd::engine::evaluate_function: MmBackward0", 50)
    mm = event("aten::mm", 20, parent=step)
    gpu = DeviceType.CUDA
    kernels = [event("_attn_fwd_kernel", 40, gpu, launched_by=dispatch),
               event("_bwd_dq_kernel", 60, gpu, launched_by=node),
               event("void at::native::copy_kernel", 5, gpu, launched_by=copy),
               event("sm90_gemm_bf16", 100, gpu, launched_by=mm),
               event("sm90_gemm_bf16", 100, gpu, launched_by=other_node),
               event("flash_fwd_splitkv_kernel", 20, gpu, launched_by=mm)]
    got = module.summarize([step, attention, dispatch, copy, node, other_node, mm, *kernels],
                           frozenset({"_attn_fwd_kernel", "_bwd_dq_kernel"}))
    assert got["step_ms_profiled"] == pytest.approx(1.0)
    assert got["host_ms"] == pytest.approx({"attention_function": 0.3, "flashtune_dispatcher": 0.2,
                                            "attention_backward_nodes": 0.15})
    assert got["host_calls"] == {"attention_function": 1, "flashtune_dispatcher": 1, "attention_backward_nodes": 1}
    assert got["gpu_ms"] == pytest.approx({"flashtune": 0.1, "sdpa": 0.02, "other": 0.205, "total": 0.325})
    assert got["gpu_share"]["flashtune"] == pytest.approx(0.1 / 0.325)
    assert got["top_kernels"]["other"][0] == {"kernel": "sm90_gemm_bf16", "ms": pytest.approx(0.2), "launches": 2}
    # the forward's kernel and copy (under the function's range) and the backward node's kernel
    assert got["gpu_ms_launched_in_attention"] == pytest.approx(0.105)
    assert got["gpu_profiled"] is True
