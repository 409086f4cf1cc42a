"""The drop-in under torch.compile: one operator per pass, the tuned table consulted inside it.

A graph traced once with dynamic sequence lengths must still run each call with the
config stored for its own shape; the table lookup happens on the real shapes, in the
operator (kernels/ops.py), not as a guard of the trace.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from flashtune import dispatch
from flashtune.kernels import FwdConfig

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter case; tests/kernels/test_ops.py "
                                "compiles with Inductor on the GPU")


@pytest.fixture(autouse=True)
def _one_trace():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


def qkv(n: int):
    return (torch.randn(1, 4, n, 16), torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16))


def test_each_shape_gets_its_stored_config_from_one_trace(write, db_path, operator_forward_configs):
    short, long = FwdConfig(16, 16, 4, 1), FwdConfig(32, 32, 4, 2)
    write(32, "fwd", short, causal=True, group=2, batch_heads=4)  # qkv's 4 query heads of 2 K/V heads
    write(128, "fwd", long, causal=True, group=2, batch_heads=4)
    seen = operator_forward_configs
    attention = dispatch.get_tuned_attention(db_path)
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, is_causal=True, enable_gqa=True),
                             fullgraph=True, dynamic=True, backend="aot_eager")
    for n, stored in ((32, short), (128, long), (33, short)):
        q, k, v = qkv(n)
        out = compiled(q, k, v)
        assert seen[-1] == stored, n
        torch.testing.assert_close(out, attention(q, k, v, is_causal=True, enable_gqa=True), atol=1e-6, rtol=1e-6)


def test_a_mask_traces_sdpa_whole():
    attention = dispatch.get_tuned_attention()
    q, k, v = qkv(24)
    mask = torch.rand(1, 1, 24, 24) > 0.3
    mask[..., 0] = True
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, attn_mask=mask, enable_gqa=True),
                             fullgraph=True, backend="aot_eager")
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(compiled(q, k, v), expected)


def test_dropout_traces_the_kernels_whole_and_draws_its_seed_in_the_graph(db_path, operator_forward_configs):
    """dropout_p in (0, 1) traces the flashtune operator (not SDPA) with the seed drawn inside
    the graph from torch's generator: torch.manual_seed repeats a call, and the numbers are the
    eager drop-in's for the same draw."""
    attention = dispatch.get_tuned_attention(db_path)
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, dropout_p=0.3, enable_gqa=True), fullgraph=True,
                             backend="aot_eager")
    q, k, v = qkv(24)
    torch.manual_seed(3)
    out = compiled(q, k, v)
    assert operator_forward_configs  # the kernels ran, through the operator
    torch.manual_seed(3)
    assert torch.equal(out, compiled(q, k, v))
    torch.manual_seed(3)
    eager = attention(q, k, v, dropout_p=0.3, enable_gqa=True)
    torch.testing.assert_close(out, eager, atol=1e-6, rtol=1e-6)
    assert not torch.equal(out, compiled(q, k, v))  # a fresh draw
