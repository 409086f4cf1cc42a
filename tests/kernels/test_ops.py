"""flashtune's attention as PyTorch operators: opcheck, and torch.compile with no graph break.

Without CUDA the kernels run under the Triton interpreter and graphs compile with the
aot_eager backend (Inductor's CPU code generation costs minutes of CI for nothing the
operators decide); with CUDA the same tests compile with Inductor, in bf16.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch._dynamo  # noqa: E402

import flashtune  # noqa: E402
from flashtune.kernels import FwdConfig  # noqa: E402
from flashtune.kernels import ops  # noqa: E402

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu] if CUDA else []
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32
BACKEND = "inductor" if CUDA else "aot_eager"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """A recompilation fails the test: one trace must serve every sequence length."""
    torch._dynamo.reset()
    torch.manual_seed(20261201)
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


def qkv(n_q=17, n_k=23, hq=4, hkv=2, d=16, requires_grad=False):
    def make(h, n):
        return torch.randn(2, h, n, d, device=DEVICE, dtype=DTYPE, requires_grad=requires_grad)
    return make(hq, n_q), make(hkv, n_k), make(hkv, n_k)


@pytest.mark.parametrize("causal", [False, True])
def test_operators_pass_opcheck(causal):
    """Schema, fake tensors, autograd registration and dynamic-shape tracing of both operators."""
    q, k, v = qkv(requires_grad=True)
    config = ops.config_json(FwdConfig(16, 16, 4, 1))
    args = (q, k, v, causal, 0.25, config, "", "ieee", "top_left", "")
    torch.library.opcheck(torch.ops.flashtune.attention.default, args)
    o, lse2 = torch.ops.flashtune.attention(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    do = torch.randn_like(o)
    torch.library.opcheck(torch.ops.flashtune.attention_backward.default,
                          (do, q.detach(), k.detach(), v.detach(), o, lse2, causal, 0.25, config, "", "ieee",
                           "top_left", ""))


def test_operators_with_softcap_and_a_window_pass_opcheck():
    q, k, v = qkv(requires_grad=True)
    config = ops.config_json(FwdConfig(16, 16, 4, 1))
    args = (q, k, v, True, 0.25, config, "", "ieee", "top_left", "", 5.0, 6, 0)
    torch.library.opcheck(torch.ops.flashtune.attention.default, args)
    o, lse2 = torch.ops.flashtune.attention(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    torch.library.opcheck(torch.ops.flashtune.attention_backward.default,
                          (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse2, True, 0.25, config, "",
                           "ieee", "top_left", "", 5.0, 6, 0))


def test_operators_with_dropout_pass_opcheck():
    """dropout_p and the (seed, offset) tensor through both operators."""
    q, k, v = qkv(requires_grad=True)
    config = ops.config_json(FwdConfig(16, 16, 4, 1))
    rng = torch.tensor([12345, 7], device=DEVICE)
    args = (q, k, v, True, 0.25, config, "", "ieee", "top_left", "", 0.0, -1, -1, 0.3, rng)
    torch.library.opcheck(torch.ops.flashtune.attention.default, args)
    o, lse2 = torch.ops.flashtune.attention(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    torch.library.opcheck(torch.ops.flashtune.attention_backward.default,
                          (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse2, True, 0.25, config, "",
                           "ieee", "top_left", "", 0.0, -1, -1, 0.3, rng))


def test_dropout_compiles_whole_and_matches_eager_for_a_seed():
    """A training step with dropout under torch.compile(fullgraph=True): with a fixed seed the
    numbers are eager's (outputs and gradients); with none, the seed is drawn inside the graph
    from torch's generator, so calls differ and torch.manual_seed repeats them."""
    q, k, v = qkv(requires_grad=True)
    seeded = lambda q, k, v: flashtune.attention(q, k, v, causal=True, dropout_p=0.2, dropout_seed=3)  # noqa: E731
    results = []
    for run in (torch.compile(seeded, fullgraph=True, backend=BACKEND), seeded):
        o = run(q, k, v)
        results.append((o.detach(), *torch.autograd.grad(o.float().square().sum(), (q, k, v))))
    tolerance = dict(atol=2e-2, rtol=2e-2) if DTYPE == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **tolerance)
    q, k, v = qkv()
    drawn = torch.compile(lambda q, k, v: flashtune.attention(q, k, v, dropout_p=0.5), fullgraph=True,
                          backend=BACKEND)
    torch.manual_seed(1)
    a = drawn(q, k, v)
    b = drawn(q, k, v)
    torch.manual_seed(1)
    assert not torch.equal(a, b) and torch.equal(a, drawn(q, k, v))


def test_softcap_and_a_window_compile_whole_and_match_eager():
    """A Gemma-2-style layer (softcap, a local window) under torch.compile(fullgraph=True):
    the operator carries both; the numbers are eager's, for outputs and gradients."""
    check_compiled_training(TwoLayers(lambda q, k, v: flashtune.attention(q, k, v, causal=True, softcap=3.0,
                                                                          window_size=(9, 0))))
    # and the window and the cap really apply: a compiled call differs from one without them
    q, k, v = (x * 4 for x in qkv(n_q=40, n_k=40))
    plain = torch.compile(lambda q, k, v: flashtune.attention(q, k, v, causal=True), fullgraph=True,
                          backend=BACKEND)(q, k, v)
    torch._dynamo.reset()
    capped = torch.compile(lambda q, k, v: flashtune.attention(q, k, v, causal=True, softcap=3.0, window_size=(9, 0)),
                           fullgraph=True, backend=BACKEND)(q, k, v)
    ref, _ = flashtune.kernels.reference_attention(q, k, v, causal=True, softcap=3.0, window_size=(9, 0),
                                                   dtype=torch.float64)
    # bf16 rounds the output (|o| up to ~8 with these inputs) to 2^-8 relative: a relative bound
    bf16 = DTYPE == torch.bfloat16
    torch.testing.assert_close(capped.double(), ref, atol=2e-2 if bf16 else 1e-4, rtol=1.6e-2 if bf16 else 0)
    assert (plain - capped).abs().max() > 0.1


def test_the_operator_runs_the_config_it_is_given(operator_forward_configs):
    seen = operator_forward_configs
    q, k, v = qkv()
    torch.ops.flashtune.attention(q, k, v, False, 0.25, ops.config_json(FwdConfig(32, 16, 4, 2)), "", "ieee",
                                  "top_left", "")
    torch.ops.flashtune.attention(q, k, v, False, 0.25, "", "", "ieee", "top_left", "")
    assert seen[0] == FwdConfig(32, 16, 4, 2)
    assert seen[1] == flashtune.kernels.default_config("fwd", 16, DTYPE, q.device, causal=False)


class TwoLayers(torch.nn.Module):
    """Two causal grouped-query attention layers (4 query heads, 2 key/value heads of 8)."""

    def __init__(self, attention) -> None:
        super().__init__()
        self.attention = attention
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 64) for _ in range(2))

    def forward(self, x):
        b, n, _ = x.shape
        for layer in self.layers:
            q, kv = layer(x).split([32, 32], dim=-1)
            q = q.view(b, n, 4, 8).transpose(1, 2)
            k, v = kv.view(b, n, 2, 2, 8).permute(2, 0, 3, 1, 4)
            x = x + self.attention(q, k, v).transpose(1, 2).reshape(b, n, 32)
        return x


def check_compiled_training(model) -> None:
    """fullgraph=True, dynamic shapes, three sequence lengths: one trace, eager's numbers."""
    model = model.to(device=DEVICE, dtype=DTYPE)
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=BACKEND)
    tolerance = dict(atol=2e-2, rtol=2e-2) if DTYPE == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    for n in (19, 40, 77):
        x = torch.randn(2, n, 32, device=DEVICE, dtype=DTYPE)
        results = []
        for run in (compiled, model):
            model.zero_grad(set_to_none=True)
            y = run(x)
            y.float().square().mean().backward()
            results.append((y.detach(), [p.grad.clone() for p in model.parameters()]))
        (y_c, g_c), (y_e, g_e) = results
        torch.testing.assert_close(y_c, y_e, **tolerance)
        for a, b in zip(g_c, g_e):
            torch.testing.assert_close(a, b, **tolerance)


def test_a_model_calling_attention_compiles_whole_with_dynamic_shapes():
    check_compiled_training(TwoLayers(lambda q, k, v: flashtune.attention(q, k, v, causal=True)))


def test_compiled_calls_check_their_inputs_when_traced():
    def bad(q, k, v):
        return flashtune.attention(q, k, v[..., :8])

    with pytest.raises(Exception, match="head_dim"):
        torch.compile(bad, fullgraph=True, backend=BACKEND)(*qkv())
