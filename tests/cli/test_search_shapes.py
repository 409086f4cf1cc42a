"""`flashtune search --shapes FILE`, `--model` and `--list-models`: the calls a team runs as keys."""

from __future__ import annotations

import json

from flashtune.keys import GpuInfo
from flashtune.store import Store

INTERPRETER = GpuInfo.interpreter().key
ROWS = """\
shapes:
  - {B: 1, Hq: 4, Hkv: 1, Nq: 1, Nk: 40, D: 16, dtype: float32, name: decode}
  - {B: 1, Hq: 2, Hkv: 2, Nq: 24, Nk: 24, D: 16, causal: true, dtype: float32, passes: fwd+bwd}
"""


def test_a_shape_file_is_tuned_as_its_calls_keys(invoke, tmp_path):
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(ROWS)
    out = invoke("search", "--shapes", shapes, "--interpreter", "--trials", "1", "--db", tmp_path / "t.db",
                 "--storage", tmp_path / "journal.log", "--json", "--no-progress")
    assert out.exit_code == 0, out.output
    keys = [(k["pass"], k["seq_q"], k["seq_k"], k["group"], k["batch_heads"], k["causal"], k["status"])
            for k in json.loads(out.stdout)["keys"]]
    assert keys == [("fwd", 1, 40, 4, 4, False, "tuned"), ("fwd", 24, 24, 1, 2, True, "tuned"),
                    ("bwd", 24, 24, 1, 2, True, "tuned")]
    with Store(tmp_path / "t.db") as store:
        assert sorted((k.pass_, k.seq_q, k.seq_k, k.group) for k in store.load_table(INTERPRETER)) == [
            ("bwd", 24, 24, 1), ("fwd", 1, 40, 4), ("fwd", 24, 24, 1)]


def test_a_malformed_shape_file_is_refused_naming_the_row_and_field(invoke, tmp_path):
    shapes = tmp_path / "shapes.json"
    shapes.write_text('[{"B": 1, "Hq": 4, "Hkv": 3, "Nq": 1, "D": 16}]')
    out = invoke("search", "--shapes", shapes, "--interpreter", "--db", tmp_path / "t.db")
    assert out.exit_code == 2
    assert out.output.endswith(f"Error: Invalid value for '--shapes': {shapes}: row 1: heads_kv: expected a "
                               "divisor of heads_q (4), got 3\n")
    assert not (tmp_path / "t.db").exists()  # nothing was written


def test_shapes_and_grid_options_do_not_mix(invoke, tmp_path):
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(ROWS)
    out = invoke("search", "--shapes", shapes, "--head-dim", "64", "--interpreter")
    assert out.exit_code == 2
    assert out.output.endswith("Error: --shapes, --model and --recorded name the calls themselves; leave out "
                               "--head-dim\n")
    out = invoke("search", "--model", "llama3-8b", "--interpreter")
    assert out.exit_code == 2 and "far too large for the Triton interpreter" in out.output
    out = invoke("search", "--model", "llama3-9b", "--db", tmp_path / "t.db")
    assert out.exit_code == 2 and "model: unknown 'llama3-9b'; expected one of llama3-8b, llama3-70b" in out.output


def test_list_models_names_every_preset(invoke):
    out = invoke("search", "--list-models", "--json")
    assert out.exit_code == 0
    models = {m["name"]: m for m in json.loads(out.stdout)}
    assert {"llama3-8b", "llama3-70b", "mistral-7b", "gemma2-9b", "gpt2", "bert-base", "vit-l16", "whisper-large",
            "sd15"} <= set(models)
    llama = models["llama3-8b"]
    assert (llama["heads_q"], llama["heads_kv"], llama["head_dim"]) == (32, 8, 128)
    assert any(s["seq_q"] == 1 for s in llama["shapes"]) and any("bwd" in s["passes"] for s in llama["shapes"])


def test_a_shape_files_keys_are_timed_at_their_calls_shapes(invoke, tmp_path):
    """B=3 x 2 heads is in the batch x heads bucket of 8, whose own trial shape is 4 x 2: the
    search times the call the file names, not the bucket's stand-in."""
    from flashtune.keys import TuningKey

    shapes = tmp_path / "shapes.json"
    shapes.write_text('[{"B": 3, "Hq": 2, "Hkv": 1, "Nq": 16, "D": 16, "dtype": "float32"}]')
    out = invoke("search", "--shapes", shapes, "--interpreter", "--trials", "1", "--db", tmp_path / "t.db",
                 "--storage", tmp_path / "journal.log", "--json", "--no-progress")
    assert out.exit_code == 0, out.output
    (key,) = json.loads(out.stdout)["keys"]
    assert (key["group"], key["batch_heads"], key["status"]) == (2, 8, "tuned")
    assert key["trial_shape"] == [3, 2, 1]
    assert TuningKey.from_dict(key).trial_shape(interpreter=True) == (4, 2, 1)  # what it would have run
