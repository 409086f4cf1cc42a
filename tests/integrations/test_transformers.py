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

from flashtune import dispatch, kernels  # noqa: E402
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
    warnings.filterwarnings("ignore", message="flashtune has no tuned configs", category=dispatch.DispatchWarning)


@pytest.fixture
def varlen_calls(monkeypatch):
    """What each flashtune.attention_varlen call got (the integration imports it per call)."""
    calls, real = [], kernels.attention_varlen

    def spy(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
        calls.append({"cu_q": cu_seqlens_q.tolist(), "cu_k": cu_seqlens_k.tolist(), **options})
        return real(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options)

    monkeypatch.setattr(kernels, "attention_varlen", spy)
    return calls


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


def run(model, ids, mask=None, valid=None, **inputs):
    """The model's float output on ``ids`` and every parameter's gradient of a fixed loss;
    with ``valid`` (batch, seq) the output is 0 at the other positions (padding: its output
    is no implementation's business), for the loss and the comparison."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, **inputs)
    value = out.logits if hasattr(out, "logits") else out.last_hidden_state
    if valid is not None:
        value = value * valid.unsqueeze(-1).to(value.dtype)
    weights = torch.linspace(-1, 1, value.numel(), device=value.device).view_as(value)
    (value.float() * weights).sum().backward()
    grads = {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}
    return value.double(), grads


def assert_within_fa_rule(got, baselines, exact, what: str) -> None:
    """FlashAttention's rule: |flashtune - fp64| <= 2 |torch's attention in the same dtype - fp64|
    + slack, torch's attention being the least accurate of ``baselines`` (one tensor or several)."""
    baselines = baselines if isinstance(baselines, (list, tuple)) else [baselines]
    error = (got - exact).abs().max().item()
    worst = max((b - exact).abs().max().item() for b in baselines)
    allowed = 2 * worst + 1e-5 * (1 + exact.abs().max().item())
    assert error <= allowed, f"{what}: max error {error:.3g} against fp64, allowed {allowed:.3g}"


def gemma2(softcap: float | None = 0.01, sliding_window: int = 64):
    """A two-layer Gemma-2 decoder (grouped heads, logit softcapping, by default a window past the
    tests' lengths); a cap of the size of its (small, freshly initialised) scores, so that it bites."""
    config = transformers.Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       max_position_embeddings=128, attention_dropout=0.0,
                                       sliding_window=sliding_window, attn_logit_softcapping=softcap,
                                       final_logit_softcapping=None)
    return transformers.Gemma2ForCausalLM(config)


def compare(model, ids, dtype, implementation=STRICT, mask=None, baseline="sdpa", valid=None, **inputs) -> None:
    """``run`` of flashtune, and of torch's attention (``baseline`` and transformers' "eager") in
    ``dtype`` and ``baseline`` in fp64 (float ``inputs`` cast to each).

    Both of torch's attentions are the dtype's baseline because a parameter's gradient carries the
    attention's rounding through the whole model, where torch's two legitimate attentions differ
    too: on one CPU, the fp16 gradient of a padded decoder's layer-1 norm weight was off by
    0.00172 with SDPA, 0.00232 with eager, 0.00368 with flashtune (whose output error, 0.00047,
    was below SDPA's 0.00052), so the rule against SDPA alone failed on that CPU and passed on
    others."""
    def cast(to):
        return {name: x.to(to) if torch.is_tensor(x) and x.is_floating_point() else x for name, x in inputs.items()}

    exact = run(twin(model, baseline, torch.float64), ids, mask, valid, **cast(torch.float64))
    torch_runs = [run(twin(model, b, dtype), ids, mask, valid, **cast(dtype))
                  for b in dict.fromkeys((baseline, "eager"))]
    got = run(twin(model, implementation, dtype), ids, mask, valid, **cast(dtype))
    assert_within_fa_rule(got[0], [r[0] for r in torch_runs], exact[0], "output")
    assert got[1].keys() == exact[1].keys()
    for name in exact[1]:
        assert_within_fa_rule(got[1][name], [r[1][name] for r in torch_runs], exact[1][name], f"gradient of {name}")


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


def test_gemma2_softcapping_with_left_padding_runs_on_varlen_with_the_cap_and_window(varlen_calls):
    """Left padding of a Gemma-2 whose sliding window (8) bites: varlen with the cap, the window
    on the sliding layer; each sequence matches eager on it alone (RoPE scores depend on
    relative positions only, so the padding's shift does not count)."""
    model = gemma2(sliding_window=8)
    ids = torch.randint(0, 97, (2, 19), device=DEVICE)
    mask = torch.ones(2, 19, dtype=torch.long, device=DEVICE)
    mask[0, :5] = 0
    got = run(twin(model, STRICT, torch.float32), ids, mask)[0]
    for b, start in ((0, 5), (1, 0)):
        exact = run(twin(model, "eager", torch.float64), ids[b:b + 1, start:])[0]
        assert (got[b, start:] - exact[0]).abs().max() < 1e-4
    assert [(c["cu_q"], c["softcap"], c["window_size"]) for c in varlen_calls] == \
        [([0, 14, 33], 0.01, (7, 0)), ([0, 14, 33], 0.01, None)]  # layer 0 slides, layer 1 is global


def test_gemma2_softcapping_with_an_unrepresentable_mask_is_computed_densely_with_one_warning(varlen_calls):
    model = gemma2()
    ids = torch.randint(0, 97, (2, 19), device=DEVICE)
    mask = torch.ones(2, 19, dtype=torch.long, device=DEVICE)
    mask[0, 6] = 0  # a hole inside the sequence: its keys are no contiguous range
    flashtune_hf._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run(twin(model, LENIENT, torch.float32), ids, mask)[0]
    exact = run(twin(model, "eager", torch.float64), ids, mask)[0]
    assert (got - exact).abs().max() < 1e-4
    assert sum("softcapped attention with an attention mask" in str(w.message) for w in caught) == 1
    assert not varlen_calls


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_gqa_decoder_runs_on_varlen_and_matches_sdpa(side, dtype, varlen_calls):
    """Logits at the valid positions and every gradient of a loss over them, against SDPA."""
    model = llama()
    ids = torch.randint(0, 97, (3, 13), device=DEVICE)
    mask = torch.ones_like(ids)
    if side == "right":
        mask[1, 9:], mask[2, 4:] = 0, 0
    else:
        mask[1, :4], mask[2, :9] = 0, 0
    compare(model, ids, dtype, mask=mask, valid=mask)
    cu = [0, 13, 22, 26]  # the valid tokens only
    assert [(c["cu_q"], c["cu_k"], c["causal"]) for c in varlen_calls] == [(cu, cu, True)] * 2  # one per layer


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_padded_encoder_runs_on_varlen_and_matches_sdpa(dtype, varlen_calls):
    model = bert()
    ids = torch.randint(0, 97, (3, 11), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, 7:], mask[2, :3] = 0, 0  # right and left padding
    compare(model, ids, dtype, mask=mask)  # every position: the padding rows see the valid keys, as in SDPA
    keys = [0, 11, 18, 26]  # the valid keys; every query row (the 2-D padding names causal masks' queries only)
    assert [(c["cu_q"], c["cu_k"], c["causal"]) for c in varlen_calls] == [([0, 11, 22, 33], keys, False)] * 2


def test_cross_attention_with_encoder_padding_keeps_every_decoder_row(varlen_calls):
    """A decoder's cross-attention mask carries the encoder's padding: it must not be read as
    the decoder's (its rows would be dropped); self-attention drops the decoder's padding."""
    config = transformers.BertConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                     num_attention_heads=4, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, is_decoder=True, add_cross_attention=True)
    model = transformers.BertModel(config)
    ids = torch.randint(0, 97, (2, 7), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    encoder_mask = torch.ones_like(ids)
    encoder_mask[0, 2:] = 0
    encoder = torch.randn(2, 7, 64, device=DEVICE)
    compare(model, ids, torch.float32, mask=mask, valid=mask, encoder_hidden_states=encoder,
            encoder_attention_mask=encoder_mask, use_cache=False)
    assert [(c["cu_q"], c["cu_k"], c["causal"]) for c in varlen_calls] == \
        [([0, 7, 12], [0, 7, 12], True), ([0, 7, 14], [0, 2, 9], False)]


DOCUMENTS = (5, 3, 6)


def run_documents(model, ids):
    """``run`` of each document of the packed row ``ids`` alone: their outputs side by side and
    the sum of their gradients (the packed row's loss weights, document by document)."""
    model.zero_grad(set_to_none=True)
    outputs, start = [], 0
    weights = torch.linspace(-1, 1, ids.numel() * 97, device=ids.device).view(*ids.shape, 97)
    for n in DOCUMENTS:
        logits = model(input_ids=ids[:, start:start + n]).logits
        (logits.float() * weights[:, start:start + n]).sum().backward()
        outputs.append(logits.double())
        start += n
    return torch.cat(outputs, 1), {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("route", ["mask", "position_ids", "cu_seq_lens"])
def test_a_packed_row_runs_on_varlen_and_matches_each_document_alone(route, varlen_calls):
    """Documents packed in one row, told apart three ways: the block mask transformers builds
    from restarting position_ids without a cache; the position_ids themselves where it builds
    none (with a cache); FlashAttention's cu_seq_lens kwargs (positions not restarting)."""
    model = llama()
    ids = torch.randint(0, 97, (1, sum(DOCUMENTS)), device=DEVICE)
    positions = torch.cat([torch.arange(n, device=DEVICE) for n in DOCUMENTS]).unsqueeze(0)
    cu = torch.tensor([0, 5, 8, 14], dtype=torch.int32, device=DEVICE)
    inputs = {"mask": {"position_ids": positions, "use_cache": False},
              "position_ids": {"position_ids": positions, "use_cache": True},
              "cu_seq_lens": {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 6, "max_length_k": 6}}[route]
    exact = run_documents(twin(model, "sdpa", torch.float64), ids)
    sdpa = run_documents(twin(model, "sdpa", torch.float32), ids)
    got = run(twin(model, STRICT, torch.float32), ids, **inputs)
    assert_within_fa_rule(got[0], sdpa[0], exact[0], "output")
    assert got[1].keys() == exact[1].keys()
    for name in exact[1]:
        assert_within_fa_rule(got[1][name], sdpa[1][name], exact[1][name], f"gradient of {name}")
    assert [(c["cu_q"], c["cu_k"], c["causal"]) for c in varlen_calls] == [(cu.tolist(), cu.tolist(), True)] * 2


def test_a_padding_mask_varlen_cannot_represent_goes_to_sdpa_with_one_warning(varlen_calls):
    model = bert()
    ids = torch.randint(0, 97, (2, 11), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding, and
    mask[0, 4] = 0  # a hole: the valid keys of sequence 0 are no contiguous range
    with pytest.raises(ValueError, match="strict=True"):
        twin(model, STRICT, torch.float32)(input_ids=ids, attention_mask=mask)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare(model, ids, torch.float32, implementation=LENIENT, mask=mask)
    messages = [str(w.message) for w in caught if "scaled_dot_product_attention instead" in str(w.message)]
    assert len(messages) == 1 and "attn_mask" in messages[0], messages
    assert not varlen_calls


def prefix_lm_mask(n: int, prefix: int) -> torch.Tensor:
    """A 4-D mask: the first ``prefix`` tokens see each other, the rest causally."""
    keep = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril()
    keep[:prefix, :prefix] = True
    return keep.expand(2, 1, n, n)


def block_causal_mask(lengths) -> torch.Tensor:
    """A 4-D mask of documents packed in a row, each causal, one for every batch row (batch 1)."""
    keep = torch.block_diag(*(torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril() for n in lengths))
    return keep.view(1, 1, *keep.shape)


@pytest.mark.parametrize("kind", ["block causal", "prefix lm"])
def test_a_4d_mask_runs_on_varlen_only_when_it_is_exactly_representable(kind, varlen_calls):
    """A model's own 4-D mask (no 2-D padding to say which rows are padding): varlen serves it
    when its plan's mask equals it, SDPA otherwise (with the warning; strict raises)."""
    model = llama()
    ids = torch.randint(0, 97, (2, 12), device=DEVICE)
    if kind == "block causal":
        compare(model, ids, torch.float32, mask=block_causal_mask([7, 5]))
        cu = [0, 7, 12, 19, 24]
        assert [(c["cu_q"], c["cu_k"]) for c in varlen_calls] == [(cu, cu)] * 2
        return
    mask = prefix_lm_mask(12, 4)
    with pytest.raises(ValueError, match="strict=True"):
        twin(model, STRICT, torch.float32)(input_ids=ids, attention_mask=mask)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare(model, ids, torch.float32, implementation=LENIENT, mask=mask)
    assert sum("scaled_dot_product_attention instead" in str(w.message) for w in caught) == 1
    assert not varlen_calls


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


def test_generate_with_left_padding_runs_on_varlen_and_gives_the_same_tokens_as_sdpa(varlen_calls):
    """The prefill packs each prompt's valid tokens; each decode step packs one query per
    sequence against its valid keys, the padding at the start of the cache left out."""
    model = llama()
    prompt = torch.randint(1, 97, (2, 9), device=DEVICE)
    mask = torch.ones_like(prompt)
    prompt[0, :3], mask[0, :3] = 0, 0
    tokens = {}
    for implementation in ("sdpa", STRICT):
        generator = twin(model, implementation, torch.float32)
        generator.generation_config.pad_token_id = 0
        tokens[implementation] = generator.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert tokens["sdpa"].shape == (2, 13)
    assert torch.equal(tokens[STRICT], tokens["sdpa"])
    prefill = [([0, 6, 15], [0, 6, 15])] * 2
    steps = [([0, 1, 2], [0, 6 + step, 15 + 2 * step]) for step in (1, 2, 3) for _layer in range(2)]
    assert [(c["cu_q"], c["cu_k"]) for c in varlen_calls] == prefill + steps
