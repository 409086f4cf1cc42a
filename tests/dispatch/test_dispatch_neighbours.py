"""A neighbour's tuned config serves an untuned call only where it carries over (keys.neighbour_gap);
beyond that the heuristic default serves, says which tuned key was too far, and the call is recorded."""

from __future__ import annotations

import warnings

import pytest
import torch
from dispatch_samples import FWD_A, FWD_B, qkv

from flashtune.dispatch import DispatchWarning, call_key, get_tuned_attention
from flashtune.kernels import BwdConfig, FwdConfig, default_config
from flashtune.keys import batch_heads_bucket
from flashtune.recording import bucket_key, buckets
from flashtune.store import Store


def _heuristic_fwd(q, k, causal=False):
    return default_config("fwd", q.shape[3], q.dtype, q.device, causal=causal, seq_q=q.shape[2], seq_k=k.shape[2],
                          batch_heads_kv=q.shape[0] * k.shape[1], batch_heads=q.shape[0] * q.shape[1])


def test_a_near_neighbour_serves_and_a_far_one_gives_way_to_the_heuristic(write, db_path):
    write(16, "fwd", FWD_A)
    fn = get_tuned_attention(db_path)
    near = fn.explain(*qkv(32))  # a factor of 2
    assert (near.fwd_config, near.fwd_source) == (FWD_A, "tuned nearest (fwd float32 d16 n16 full)")
    q, k, v = qkv(33)
    far = fn.explain(q, k, v)
    assert far.fwd_config == _heuristic_fwd(q, k) != FWD_A
    assert far.fwd_source == ("heuristic (nearest tuned key fwd float32 d16 n16 full is too far: seq_q 16 for a "
                              "call of 33, more than a factor of 2 apart)")
    # batch x heads counts too: 8 heads are a factor of 4 from the tuned key's 2
    assert fn.explain(*qkv(16, heads=8)).fwd_source.startswith(
        "heuristic (nearest tuned key fwd float32 d16 n16 full is too far: batch_heads 2 for a call of 8")


def test_a_key_nearer_in_log2_but_beyond_the_rule_is_passed_over_for_one_within_it(write, db_path):
    """(16, 35) is 2.2x from (16, 16) in one length (distance 1.1), 1.9x from (30, 64) in both (distance 1.7)."""
    write(16, "fwd", FWD_A)
    write(30, "fwd", FWD_B, seq_k=64)
    assert get_tuned_attention(db_path).explain(*qkv(16, 35)).fwd_source == \
        "tuned nearest (fwd float32 d16 q30 k64 full g1 bh2)"


def test_a_stale_near_key_and_a_far_one_both_say_why_they_did_not_serve(write, db_path):
    write(32, "fwd", FWD_B, kernel_hash="00000000deadbeef")
    write(128, "fwd", FWD_A)
    with pytest.warns(DispatchWarning, match="stale"):
        fn = get_tuned_attention(db_path)
    source = fn.explain(*qkv(16)).fwd_source
    assert source.startswith("heuristic (the tuned fwd config of fwd float32 d16 n32 full is stale, ")
    assert source.endswith("; next nearest tuned key fwd float32 d16 n128 full is too far: seq_q 128 for a call "
                           "of 16, more than a factor of 2 apart)")


def test_the_71_group_mqa_prefill_falls_to_the_heuristic_and_is_recorded(write, db_path):
    """71 query heads of one K/V head, N=3000, D=64, causal: the tuned keys of its family (group 1 at the
    standard grid's lengths, group 8) are too far in group, so the heuristic default serves it."""
    for n in (2048, 4096):
        write(n, "fwd", FwdConfig(64, 64, 4, 2), dtype="float16", head_dim=64, causal=True, batch_heads=64)
    write(4096, "fwd", FwdConfig(64, 32, 4, 2), dtype="float16", head_dim=64, causal=True, group=8, batch_heads=64)
    fn = get_tuned_attention(db_path, record=True)
    q, k, v = qkv(3000, heads=71, kv_heads=1, head_dim=64, dtype=torch.float16)  # (the interpreter has no bf16)
    choice = fn.explain(q, k, v, is_causal=True, enable_gqa=True)
    assert choice.fwd_config == _heuristic_fwd(q, k, causal=True)
    assert choice.fwd_source.startswith("heuristic (nearest tuned key fwd float16 d64 n4096 causal g8 bh64 is too "
                                        "far: group 8 for a call of 71, more than a factor of 2 apart)")
    fn.flush_recorded()
    with Store(db_path) as store:
        recorded = {(c.key.pass_, c.key.seq_q, c.key.seq_k, c.key.group, c.key.batch_heads, c.heads_q, c.heads_kv)
                    for c in store.recorded_calls()}
    assert recorded == {("fwd", 4096, 4096, 71, batch_heads_bucket(71), 71, 1)}


# (n_q, n_k, batch, heads, kv_heads, causal): prefills, chunks, cross-attention and a decode loop's
# cache lengths, at lengths on and between the powers of two and at the edges of their buckets
CALLS = [(n, n, 1, 2, 2, True) for n in (5, 6, 11, 12, 22, 23, 45, 46, 64, 90, 91)] + [
    (8, 24, 1, 2, 2, False), (6, 40, 1, 2, 2, False), (40, 9, 1, 2, 2, False), (30, 30, 3, 4, 2, True),
    (17, 17, 1, 4, 1, False), (20, 20, 2, 8, 1, False),
] + [(1, n, b, 4, 2, False) for n in (17, 22, 23, 45, 46, 100, 181, 182, 300) for b in (1, 3)]


def test_every_call_of_a_recorded_bucket_is_served_by_the_buckets_tuned_key(write, db_path, gpu):
    """Record the calls, tune each recorded bucket at its key (as ``search --recorded`` does), and every
    recorded call is then served by its own bucket's key, and is not noted again."""
    def explain(fn, n_q, n_k, batch, heads, kv_heads, causal):
        q, k, v = qkv(n_q, n_k, batch=batch, heads=heads, kv_heads=kv_heads, grad=True)  # both passes noted
        return q, k, fn.explain(q, k, v, is_causal=causal, enable_gqa=heads != kv_heads)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DispatchWarning)  # a store with nothing tuned yet
        fn = get_tuned_attention(db_path, record=True)
        for shape in CALLS:
            explain(fn, *shape)
    fn.flush_recorded()
    with Store(db_path) as store:
        recorded = buckets(store.recorded_calls())
    assert len(recorded) > 40  # the calls fall in many buckets, not one
    for index, bucket in enumerate(recorded):
        key = bucket.key
        config = (FwdConfig(16, 16, 1, 1) if key.pass_ == "fwd" else BwdConfig(16, 16, 16, 16, 1, 1))
        write(key.seq_q, key.pass_, config, seq_k=key.seq_k, group=key.group, batch_heads=key.batch_heads,
              causal=key.causal)
    after = get_tuned_attention(db_path, record=True)
    for shape in CALLS:
        q, k, choice = explain(after, *shape)
        for pass_, source in (("fwd", choice.fwd_source), ("bwd", choice.bwd_source)):
            wanted = call_key(gpu.key, pass_, q, k, shape[5])
            tuned = bucket_key(wanted)
            assert source == ("tuned exact" if tuned == wanted else f"tuned nearest ({tuned.label()})"), (shape, pass_)
    after.flush_recorded()
    with Store(db_path) as store:
        assert buckets(store.recorded_calls()) == recorded  # nothing noted again: every bucket is served
