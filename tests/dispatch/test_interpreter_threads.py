"""Threads under the Triton interpreter: concurrent calls of ``flashtune.attention`` and of the
drop-in, forward and backward, compute what one thread computes (the interpreter's launches
are serialised: flashtune.interpreter_lock)."""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import flashtune
from flashtune.device import INTERPRETER

pytestmark = pytest.mark.skipif(not INTERPRETER, reason="the interpreter's own thread-safety")


def test_concurrent_calls_with_gradients_match_one_thread(tmp_path):
    with pytest.warns(flashtune.dispatch.DispatchWarning, match="no tuned configs"):
        fn = flashtune.get_tuned_attention(tmp_path / "none.db", device="cpu")  # the heuristic configs
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 17, 16, generator=gen) for _ in range(3))

    def call(i: int):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves, is_causal=True) if i % 2 else flashtune.attention(*leaves, causal=True)
        out.backward(torch.ones_like(out))
        return out.detach(), *(t.grad for t in leaves)

    want = call(1)
    assert torch.equal(call(0)[0], want[0])  # the two entries run the same default configs

    def outcome(i: int) -> str:
        try:
            got = call(i)
        except Exception as e:  # noqa: BLE001 - counted, shown below
            return f"{type(e).__name__}: {str(e)[:120]}"
        return "same" if all(torch.equal(a, b) for a, b in zip(got, want)) else "different"

    with ThreadPoolExecutor(16) as pool:
        seen = collections.Counter(pool.map(outcome, range(64)))
    assert seen == {"same": 64}, seen
