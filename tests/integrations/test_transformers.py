"""attn_implementation="flashtune" in small randomly initialised transformers models.

Each model is built from a config (no download), copied into an "sdpa" twin with the same
weights, and both are compared against the same model in float64 with SDPA: flashtune's
error in outputs and every parameter's gradient must stay within FlashAttention's rule
(twice SDPA's own error in the same dtype, plus a small slack). The flashtune models are
registered with ``strict=True``, so a call that silently went to SDPA would raise.
Without CUDA the kernels run under the Triton interpreter (fp32, fp16); with CUDA the
same tests run in bf16.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import transformers  # noqa: E402  (the test extra installs it)

from flashtune import dispatch  # noqa: E402
from flashtune.integrations import transformers as flashtune_hf  # noqa: E402

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu] if CUDA else []  # the same tests, in bf16, in the GPU run
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.bfloat16] if CUDA else [torch.float32, torch.float16]
STRICT = "ftune_strict"  # every call must run on flashtune's kernels
LENIENT = "ftune_lenient"  # calls the kernels cannot run go to SDPA with a warning


@pytest.fixture(autouse=True)
def _registered(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTUNE_DB", str(tmp_path / "store" / "tuned.db"))
    monkeypatch.setattr(dispatch, "_TABLES", {})
    monkeypatch.setattr(dispatch, "_WARNED", set())
    flashtune_hf.register(STRICT, strict=True)
    flashtune_hf.register(LENIENT)
    torch.manual_seed(20261201)
    # an empty store: the heuristic configs serve, which is what these tests check
    warnings.filterwarnings("ignore", message="flashtune cannot read tuned configs", category=dispatch.DispatchWarning)


def llama(**overrides):
    """A two-layer grouped-query decoder: 4 query heads share 2 key/value heads, head dim 16."""
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      attention_dropout=0.0, **overrides)
    return transformers.LlamaForCausalLM(config)


def bert():
    """A two-layer encoder with 4 heads of 16 and no dropout."""
    config = transformers.BertConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=128,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertModel(config)


def twin(model, implementation: str, dtype: torch.dtype):
    """The model with the same weights, in ``dtype``, on the test device, running ``implementation``."""
    other = copy.deepcopy(model).to(device=DEVICE, dtype=dtype)
    other.set_attn_implementation(implementation)
    return other


def run(model, ids, mask=None):
    """The model's float output on ``ids`` and every parameter's gradient of a fixed loss."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask)
    value = out.logits if hasattr(out, "logits") else out.last_hidden_state
    weights = torch.linspace(-1, 1, value.numel(), device=value.device).view_as(value)
    (value.float() * weights).sum().backward()
    grads = {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}
    return value.double(), grads


def assert_within_fa_rule(got, sdpa, exact, what: str) -> None:
    """FlashAttention's rule: |flashtune - fp64| <= 2 |SDPA in the same dtype - fp64| + slack."""
    error = (got - exact).abs().max().item()
    allowed = 2 * (sdpa - exact).abs().max().item() + 1e-5 * (1 + exact.abs().max().item())
    assert error <= allowed, f"{what}: max error {error:.3g} against fp64, allowed {allowed:.3g}"


def gemma2(softcap: float | None = 0.01):
    """A two-layer Gemma-2 decoder (grouped heads, logit softcapping, a window past the test's
    lengths); a cap of the size of its (small, freshly initialised) scores, so that it bites."""
    config = transformers.Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       max_position_embeddings=128, attention_dropout=0.0, sliding_window=64,
                                       attn_logit_softcapping=softcap, final_logit_softcapping=None)
    return transformers.Gemma2ForCausalLM(config)


def compare(model, ids, dtype, implementation=STRICT, mask=None, baseline="sdpa") -> None:
    exact = run(twin(model, baseline, torch.float64), ids, mask)
    sdpa = run(twin(model, baseline, dtype), ids, mask)
    got = run(twin(model, implementation, dtype), ids, mask)
    assert_within_fa_rule(got[0], sdpa[0], exact[0], "output")
    assert got[1].keys() == exact[1].keys()
    for name in exact[1]:
        assert_within_fa_rule(got[1][name], sdpa[1][name], exact[1][name], f"gradient of {name}")


def test_register_names_an_implementation_that_models_accept():
    model = twin(llama(), STRICT, torch.float32)
    assert model.config._attn_implementation == STRICT
    assert STRICT in transformers.AttentionInterface._global_mapping
    from transformers.masking_utils import AttentionMaskInterface

    assert STRICT in AttentionMaskInterface._global_mapping


@pytest.mark.parametrize("name", ["", "two words", 3])
def test_register_refuses_a_name_that_is_not_an_identifier(name):
    with pytest.raises(ValueError, match="name: expected an identifier"):
        flashtune_hf.register(name)


def test_register_refuses_a_name_that_transformers_takes_for_flash_attention():
    with pytest.raises(ValueError, match="contains 'flash'"):
        flashtune_hf.register("flashtune")
    assert transformers.utils.generic.is_flash_attention_requested(requested_attention_implementation="flashtune")
    assert not transformers.utils.generic.is_flash_attention_requested(requested_attention_implementation=flashtune_hf.NAME)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gqa_decoder_logits_and_gradients_match_sdpa(dtype):
    model = llama()
    ids = torch.randint(0, 97, (2, 19), device=DEVICE)
    compare(model, ids, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_encoder_outputs_and_gradients_match_sdpa(dtype):
    model = bert()
    ids = torch.randint(0, 97, (2, 23), device=DEVICE)
    compare(model, ids, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemma2_softcapping_runs_on_the_kernels_and_matches_eager(dtype):
    """Gemma-2 passes softcap=attn_logit_softcapping to the attention function: the kernels
    apply it, so flashtune matches transformers' eager implementation, which applies it."""
    model = gemma2()
    ids = torch.randint(0, 97, (2, 19), device=DEVICE)
    compare(model, ids, dtype, baseline="eager")
    uncapped = gemma2(softcap=None)
    uncapped.load_state_dict(model.state_dict())
    capped, plain = (run(twin(m, "eager", torch.float64), ids)[0] for m in (model, uncapped))
    assert (capped - plain).abs().max() > 1e-3  # the cap matters here: dropping it would be seen


def test_gemma2_softcapping_with_a_padding_mask_is_computed_densely_with_one_warning():
    model = gemma2()
    ids = torch.randint(0, 97, (2, 19), device=DEVICE)
    mask = torch.ones(2, 19, dtype=torch.long, device=DEVICE)
    mask[0, :5] = 0  # left padding
    flashtune_hf._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run(twin(model, LENIENT, torch.float32), ids, mask)[0]
    assert torch.isfinite(got).all()
    # eager's own padded rows spread NaN here; the truth of each sequence is eager on it alone
    # (RoPE scores depend on relative positions only, so the left padding's shift does not count)
    for b, start in ((0, 5), (1, 0)):
        exact = run(twin(model, "eager", torch.float64), ids[b:b + 1, start:])[0]
        assert (got[b, start:] - exact[0]).abs().max() < 1e-4
    assert sum("softcapped attention with an attention mask" in str(w.message) for w in caught) == 1


def test_a_padding_mask_goes_to_sdpa_through_the_drop_in_with_one_warning():
    model = bert()
    ids = torch.randint(0, 97, (2, 11), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # the second sequence is right-padded
    with pytest.raises(ValueError, match="strict=True"):
        twin(model, STRICT, torch.float32)(input_ids=ids, attention_mask=mask)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare(model, ids, torch.float32, implementation=LENIENT, mask=mask)
    messages = [str(w.message) for w in caught if "scaled_dot_product_attention instead" in str(w.message)]
    assert len(messages) == 1 and "attn_mask" in messages[0], messages


def test_output_attentions_is_refused_with_a_remedy():
    model = twin(llama(), STRICT, torch.float32)
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        model(input_ids=torch.randint(0, 97, (1, 5), device=DEVICE), output_attentions=True)


def test_generate_gives_the_same_tokens_as_sdpa():
    """Prefill (causal) then decode steps (one query against the cache) on flashtune."""
    model = llama()
    prompt = torch.randint(0, 97, (2, 9), device=DEVICE)
    tokens = {}
    for implementation in ("sdpa", STRICT):
        generator = twin(model, implementation, torch.float32)
        generator.generation_config.pad_token_id = 0
        tokens[implementation] = generator.generate(prompt, max_new_tokens=5, do_sample=False)
    assert tokens["sdpa"].shape == (2, 14)
    assert torch.equal(tokens[STRICT], tokens["sdpa"])
