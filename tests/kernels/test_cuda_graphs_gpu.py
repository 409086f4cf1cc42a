"""CUDA graphs: forward and backward are capturable and replay with new inputs as eager runs them.

Capture needs no host sync, no CPU-side read of a GPU tensor and allocations from the
graph's pool only; replays need the kernels to read their inputs through the captured
pointers. Each test captures, refills the static inputs with new random values, replays,
and compares with an eager call on the same values.
"""

from __future__ import annotations

import pytest
import torch

import flashtune
from flashtune.dispatch import get_tuned_attention

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

BF16 = dict(device="cuda", dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def _seed(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTUNE_DB", str(tmp_path / "store" / "tuned.db"))
    torch.manual_seed(20261201)


@pytest.mark.parametrize("n", [1000, 4096], ids=["n1000", "n4096"])  # 4096: the tables' long bucket
@pytest.mark.parametrize("causal", [False, True])
def test_a_training_step_replays_with_new_inputs(causal, n):
    """make_graphed_callables captures the forward and the backward as two graphs (at 4096
    queries, D=128 on sm_90, the defaults of both passes are Gluon kernels)."""
    shape_q, shape_kv = (2, 8, n, 128), (2, 2, n, 128)

    def step(q, k, v):
        return flashtune.attention(q, k, v, causal=causal)

    sample = [torch.randn(s, **BF16, requires_grad=True) for s in (shape_q, shape_kv, shape_kv)]
    graphed = torch.cuda.make_graphed_callables(step, tuple(sample))
    for _ in range(2):
        inputs = [torch.randn(s, **BF16, requires_grad=True) for s in (shape_q, shape_kv, shape_kv)]
        do = torch.randn(shape_q, **BF16)
        out = graphed(*inputs)
        out.backward(do)
        replayed = [out.detach()] + [t.grad for t in inputs]
        for t in inputs:
            t.grad = None
        eager = step(*inputs)
        eager.backward(do)
        torch.testing.assert_close(replayed[0], eager.detach(), atol=0, rtol=0)  # same kernel and config: same bits
        for got, want in zip(replayed[1:], [t.grad for t in inputs]):
            # an atomic-dQ or split backward adds in a varying order: its last bits vary
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_a_decode_loop_replays_with_new_cache_contents():
    """Eight decode steps (one query per sequence against a 4k cache) captured once, replayed twice."""
    attention = get_tuned_attention()
    q = torch.randn(8, 32, 1, 128, **BF16)
    k_cache = torch.randn(8, 8, 4096, 128, **BF16)
    v_cache = torch.randn_like(k_cache)
    out = torch.empty(8, 8, 32, 1, 128, **BF16)

    def steps():
        for i in range(8):
            out[i].copy_(attention(q + i, k_cache, v_cache, enable_gqa=True))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compiles, plans) outside the capture
        steps()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        steps()
    for _ in range(2):
        for t in (q, k_cache, v_cache):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        for i in range(8):
            torch.testing.assert_close(out[i], attention(q + i, k_cache, v_cache, enable_gqa=True), atol=0, rtol=0)


def test_reduce_overhead_compile_replays_as_eager():
    """torch.compile(mode="reduce-overhead") puts the compiled call in a CUDA graph."""
    def layer(q, k, v):
        return flashtune.attention(q, k, v, causal=True) * 2

    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        q, k, v = (torch.randn(1, 16, 512, 64, **BF16) for _ in range(3))
        torch.testing.assert_close(compiled(q, k, v).clone(), layer(q, k, v), atol=0, rtol=0)


def test_dropout_replays_with_the_seed_its_tensor_holds_and_draws_anew_without_one():
    """A captured forward and backward with dropout: given as a (seed, offset) tensor, the seed
    is read at replay (refilled: eager's bits for that seed); drawn from torch's generator
    (dropout_seed=None), each replay draws a fresh mask."""
    shape_q, shape_kv = (2, 8, 512, 64), (2, 2, 512, 64)
    rng = torch.tensor([1, 0], device="cuda")
    q, k, v = (torch.randn(s, **BF16, requires_grad=True) for s in (shape_q, shape_kv, shape_kv))
    seeded = torch.cuda.make_graphed_callables(
        lambda q, k, v: flashtune.attention(q, k, v, causal=True, dropout_p=0.2, dropout_seed=rng), (q, k, v))
    for seed in (7, 8):
        rng.copy_(torch.tensor([seed, 0]))
        out = seeded(q, k, v)
        eager = flashtune.attention(q, k, v, causal=True, dropout_p=0.2, dropout_seed=seed)
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
    drawn = torch.cuda.make_graphed_callables(lambda q, k, v: flashtune.attention(q, k, v, dropout_p=0.2), (q, k, v))
    first = drawn(q, k, v).detach().clone()
    assert not torch.equal(first, drawn(q, k, v))
