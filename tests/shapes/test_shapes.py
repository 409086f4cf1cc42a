"""Shape files and model presets: what they expand to, and every malformed input refused by name."""

from __future__ import annotations

import json
import os

import pytest

from flashtune.shapes import MODELS, Shape, ShapeError, load_shapes, model_shapes


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_json_file_with_aliases_and_defaults(tmp_path):
    path = write(tmp_path, "s.json", json.dumps([
        {"B": 1, "Hq": 32, "Hkv": 8, "Nq": 1, "Nk": 65536, "D": 128, "name": "decode"},
        {"batch": 2, "heads": 8, "seq_len": 4096, "head_dim": 128, "causal": True, "passes": "fwd+bwd"},
    ]))
    decode, train = load_shapes(path)
    assert decode == Shape(1, 32, 8, 1, 65536, 128, False, "bfloat16", ("fwd",), "decode")
    assert train == Shape(2, 8, 8, 4096, 4096, 128, True, "bfloat16", ("fwd", "bwd"))
    assert decode.group == 4 and decode.kv_bytes() == 2 * 8 * 65536 * 128 * 2
    assert train.flops("fwd") == 4 * 2 * 8 * 4096 * 4096 * 128 / 2 and train.flops("bwd") == 2.5 * train.flops()


def test_a_yaml_file_under_a_shapes_key_and_duplicates_once(tmp_path):
    path = write(tmp_path, "s.yaml", "shapes:\n  - {B: 2, Hq: 8, Nq: 4096, Nk: 77, D: 40, causal: no}\n"
                                     "  - {B: 2, Hq: 8, Nq: 4096, Nk: 77, D: 40}\n")
    assert load_shapes(path) == [Shape(2, 8, 8, 4096, 77, 40)]


@pytest.mark.parametrize("text, message", [
    ("{}", "expected a non-empty list of shape rows"),
    ("[]", "expected a non-empty list of shape rows"),
    ("[1]", "row 1: expected an object of fields, got int"),
    ('[{"B": 1, "Hq": 8, "Nq": 16}]', "row 1: head_dim: missing"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64, "heads_kv": 3}]', "row 1: heads_kv: expected a divisor of heads_q (8), got 3"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 300}]', "row 1: head_dim: expected an integer in [1, 256], got 300"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64}, {"B": 0, "Hq": 8, "Nq": 16, "D": 64}]',
     "row 2: batch: expected an integer in [1, 65536], got 0"),
    ('[{"B": 1.5, "Hq": 8, "Nq": 16, "D": 64}]', "row 1: batch: expected an integer in [1, 65536], got 1.5"),
    ('[{"B": true, "Hq": 8, "Nq": 16, "D": 64}]', "row 1: batch: expected an integer in [1, 65536], got True"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64, "passes": "fwd+dq"}]', "row 1: passes: expected 'fwd', 'bwd' or both"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64, "passes": 3}]', "row 1: passes: expected 'fwd', 'bwd', 'fwd+bwd'"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64, "dtype": "fp8"}]', "row 1: dtype: expected one of float16, bfloat16"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64, "causal": 1}]', "row 1: causal: expected true or false, got 1"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64, "window": 3}]', "row 1: window: not a shape field"),
    ('[{"B": 1, "batch": 2, "Hq": 8, "Nq": 16, "D": 64}]', "row 1: batch: given twice (as batch)"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64, "B": 2}]', "row 1: B: given twice"),
    ('{"shapes": [{"B": 1, "Hq": 8, "Nq": 16, "D": 64}], "shapes": []}', "'shapes' is given twice"),
    ('[{"B": 1, "Hq": 8, "Nq": 16, "D": 64, "name": "a\\u202eb"}]', "row 1: name: expected printable text"),
    ('[{"B": 1, "Hq": 8, "Nq": 99999999999999999999999999999999999999999, "D": 64}]',
     "row 1: seq_q: expected an integer in [1, 4194304], got 9999999999999999999999999999999999999..."),
    ("[{", "not valid JSON"),
])
def test_malformed_files_are_refused_naming_the_row_and_field(tmp_path, text, message):
    path = write(tmp_path, "bad.json", text)
    with pytest.raises(ShapeError) as caught:
        load_shapes(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value), str(caught.value)


@pytest.mark.parametrize("text, message", [
    ("shapes:\n  - {B: 1, Hq: 8, Nq: 16, D: 64, B: 2}\n", "row 1: B: given twice"),
    ("- B: 1\n  Hq: 8\n  Nq: 16\n  D: 64\n- {B: 1, Hq: 8, Nq: 16, D: 64, D: 128}\n", "row 2: D: given twice"),
    ("shapes: []\nshapes:\n  - {B: 1, Hq: 8, Nq: 16, D: 64}\n", "'shapes' is given twice"),
    ("- {? [1, 2] : 3}\n", "not valid YAML: found an unhashable key"),
])
def test_a_yaml_field_given_twice_is_refused_not_overwritten(tmp_path, text, message):
    with pytest.raises(ShapeError) as caught:
        load_shapes(write(tmp_path, "twice.yaml", text))
    assert message in str(caught.value), str(caught.value)


def test_yaml_anchors_and_merge_keys_still_load(tmp_path):
    path = write(tmp_path, "s.yaml", "base: &b {Hq: 8, Nq: 16, D: 64}\nshapes:\n  - {<<: *b, B: 1}\n"
                                     "  - {<<: *b, B: 2, D: 128}\n")
    with pytest.raises(ShapeError, match="expected a non-empty list"):  # two top-level fields
        load_shapes(path)
    path = write(tmp_path, "s.yaml", "- &b {B: 1, Hq: 8, Nq: 16, D: 64}\n- {<<: *b, B: 2}\n")
    assert load_shapes(path) == [Shape(1, 8, 8, 16, 16, 64), Shape(2, 8, 8, 16, 16, 64)]


def test_bad_yaml_and_files_that_are_not_regular_files_are_refused(tmp_path):
    with pytest.raises(ShapeError, match="not valid YAML"):
        load_shapes(write(tmp_path, "bad.yml", "- {B: 1, Hq: [\n"))
    with pytest.raises(ShapeError, match="expected a regular file"):
        load_shapes(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ShapeError, match="expected a regular file"):  # never opened: no hang
        load_shapes(fifo)
    big = write(tmp_path, "big.json", " " * (1 << 20) + "[]")
    with pytest.raises(ShapeError, match="larger than"):
        load_shapes(big)


def test_a_decoder_preset_expands_to_training_prefill_and_decode():
    shapes = model_shapes("llama3-8b", seq_lens=[2048], batch_sizes=[1, 32])
    assert [s.name for s in shapes] == ["llama3-8b-train-b4-2048x2048", "llama3-8b-prefill-b1-2048x2048",
                                        "llama3-8b-decode-b1-1x2048", "llama3-8b-decode-b32-1x2048"]
    train, prefill, decode, _ = shapes
    assert (train.heads_q, train.heads_kv, train.head_dim, train.causal, train.passes) == (32, 8, 128, True,
                                                                                        ("fwd", "bwd"))
    assert prefill.passes == ("fwd",) and prefill.causal
    assert (decode.seq_q, decode.seq_k, decode.causal) == (1, 2048, False)


def test_tensor_parallel_splits_the_heads_and_replicates_kv_heads_past_their_count():
    assert {(s.heads_q, s.heads_kv) for s in model_shapes("llama3-70b", tp=8)} == {(8, 1)}
    assert {(s.heads_q, s.heads_kv) for s in model_shapes("llama3-70b", tp=16)} == {(4, 1)}
    assert all(s.name.startswith("llama3-70b-tp8-") for s in model_shapes("llama3-70b", tp=8))
    with pytest.raises(ShapeError, match="tp: expected a divisor of qwen2.5-7b's 28 query heads, got 8"):
        model_shapes("qwen2.5-7b", tp=8)


def test_encoder_whisper_and_diffusion_presets():
    assert {(s.seq_q, s.seq_k, s.causal, s.passes) for s in model_shapes("vit-l16")} == {(257, 257, False,
                                                                                           ("fwd", "bwd"))}
    whisper = model_shapes("whisper-large", batch_sizes=[4])
    assert [(s.seq_q, s.seq_k) for s in whisper] == [(1500, 1500), (1, 1500)]
    sd = model_shapes("sd15", batch_sizes=[2])
    assert [(s.seq_q, s.seq_k, s.head_dim) for s in sd] == [(4096, 4096, 40), (4096, 77, 40), (1024, 1024, 80),
                                                             (1024, 77, 80), (256, 256, 160), (256, 77, 160)]


def test_every_preset_expands_to_valid_distinct_shapes():
    for name, model in MODELS.items():
        shapes = model_shapes(name)
        assert shapes and len(set(shapes)) == len(shapes), name
        assert all(s.heads_q == model.heads_q for s in shapes), name


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="llama4"), "model: unknown 'llama4'; expected one of llama3-8b"),
    (dict(name="gpt2", seq_lens=[]), "seq_lens: expected positive integers"),
    (dict(name="gpt2", batch_sizes=[0]), "batch_sizes: expected positive integers"),
    (dict(name="gpt2", tp=0), "tp: expected a divisor"),
])
def test_preset_arguments_are_checked(kwargs, message):
    with pytest.raises(ShapeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model_shapes(**kwargs)
