"""bfloat16 under the Triton interpreter computes garbage: it is refused, never returned
(issue 17, item 8). The dispatcher sends such calls to torch SDPA with its warning."""

from __future__ import annotations

import pytest
import torch

from flashtune.device import INTERPRETER

pytestmark = pytest.mark.skipif(not INTERPRETER, reason="the interpreter's behaviour (no CUDA here)")


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(1, 2, 16, 16, dtype=torch.bfloat16) for _ in range(3)]


def test_attention_refuses_bfloat16_on_the_cpu():
    from flashtune import attention

    with pytest.raises(TypeError, match="q: bfloat16 is not computed correctly by the Triton interpreter"):
        attention(*_inputs())


def test_the_drop_in_runs_bfloat16_through_sdpa_and_says_so(tmp_path):
    from flashtune.dispatch import DispatchWarning, get_tuned_attention

    q, k, v = _inputs()
    with pytest.warns(DispatchWarning):  # the empty store's warning
        fn = get_tuned_attention(tmp_path / "none.db", device="cpu")
    assert fn.explain(q, k, v).fwd_source.startswith("sdpa fallback: q: bfloat16 is not computed correctly")
    with pytest.warns(DispatchWarning, match="scaled_dot_product_attention instead: q: bfloat16"):
        out = fn(q, k, v)
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert (out.float() - expected).abs().max().item() < 0.05  # garbage was ~8e8
