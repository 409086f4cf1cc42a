"""flashtune's kernels inside a Hugging Face model: a tiny Llama, built from a config.

On a GPU it runs as it is (bf16 on CUDA). Without one, run it under the Triton interpreter
(slow, float32 only), which is how it is checked on machines without a GPU:

    TRITON_INTERPRET=1 python examples/transformers_tiny.py

It compares the model's logits and generated tokens with attn_implementation="ftune"
against the same weights with attn_implementation="sdpa".
"""

import copy

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import flashtune.integrations.transformers as flashtune_hf

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32

flashtune_hf.register()  # adds attn_implementation="ftune"

config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
torch.manual_seed(0)
# a pretrained model takes the same argument: AutoModelForCausalLM.from_pretrained(name, attn_implementation="ftune")
model = AutoModelForCausalLM.from_config(config, attn_implementation="ftune").to(device, dtype).eval()
reference = copy.deepcopy(model)  # the same weights...
reference.set_attn_implementation("sdpa")  # ...on torch SDPA

tokens = torch.randint(0, config.vocab_size, (2, 24), device=device)
mask = torch.ones_like(tokens)
with torch.no_grad():
    logits = model(tokens, attention_mask=mask).logits
    expected = reference(tokens, attention_mask=mask).logits
    generated = model.generate(tokens, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    generated_ref = reference.generate(tokens, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)

print(f"attention: {model.config._attn_implementation} (reference: {reference.config._attn_implementation}) "
      f"on {device}, {dtype}")
print(f"max |logits - sdpa logits|: {(logits - expected).abs().max().item():.2e}")
print(f"generated tokens equal to sdpa's: {torch.equal(generated, generated_ref)}")
