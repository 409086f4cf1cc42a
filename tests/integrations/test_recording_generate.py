"""Recording a model's generate() on a fresh machine: the decode loop makes a handful of keys.

A one-layer Llama with one head of 16 runs a 500-token greedy generate() as a script under
FLASHTUNE_RECORD=1, with no store anywhere (the Triton interpreter without a GPU). Every
decode step is a call of its own cache length, about 500 signatures; the store, made by the
first write at the user data directory's default location, must end with one key per factor
of two of those lengths, the calls of each bucket summed, written when the script exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashtune.recording import buckets
from flashtune.store import Store

REPO = Path(__file__).resolve().parents[2]
PROMPT, NEW = 16, 500
SCRIPT = f"""
import torch, transformers
import flashtune.integrations.transformers as flashtune_hf

name = flashtune_hf.register(strict=True)  # every call on flashtune's kernels, or the script fails
config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                  num_attention_heads=1, num_key_value_heads=1, head_dim=16,
                                  max_position_embeddings={PROMPT + NEW + 8})
torch.manual_seed(20261207)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = transformers.LlamaForCausalLM(config).to(device).eval()
model.set_attn_implementation(name)
prompt = torch.randint(1, 32, (1, {PROMPT}), device=device)  # no pad token (0): no padding mask
with torch.no_grad():
    out = model.generate(prompt, max_new_tokens={NEW}, min_new_tokens={NEW}, do_sample=False, pad_token_id=0)
print(out.shape[1])
"""


@pytest.mark.slow
def test_a_500_token_generate_records_at_most_eight_decode_keys_into_a_new_store(tmp_path):
    home = tmp_path / "data-home"  # no store, not even its directory
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHTUNE_")}
    env.update(XDG_DATA_HOME=str(home), FLASHTUNE_RECORD="1", PYTHONPATH=str(REPO))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == str(PROMPT + NEW)
    assert "cannot record" not in done.stderr, done.stderr[-3000:]
    store = home / "flashtune" / "tuned.db"
    with Store(store) as s:
        calls = s.recorded_calls()
    decode = [b for b in buckets(calls) if b.key.seq_q == 1]
    lengths = sorted({c.key.seq_k for c in calls if c.key.seq_q == 1})
    assert set(lengths) <= {16, 32, 64, 128, 256, 512} and len(decode) <= 8, lengths
    assert sum(b.calls for b in decode) == NEW - 1  # each decode step counted once, in its bucket
    assert {b.shape for b in decode} == {(1, 1, 1)}
