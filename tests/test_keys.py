"""keys.neighbour_gap: when a tuned key's config carries over to a call of another key, and that
it agrees with how recording buckets calls."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashtune.keys import TuningKey, batch_heads_bucket, carries_over, neighbour_gap
from flashtune.recording import bucket_key


def _key(seq_q, seq_k=None, group=1, batch_heads=32, **kw) -> TuningKey:
    fields = dict(gpu="g@sm90", dtype="bfloat16", head_dim=64, causal=True, pass_="fwd") | kw
    return TuningKey(fields["gpu"], fields["dtype"], fields["head_dim"], seq_q, fields["causal"], fields["pass_"],
                     seq_k=seq_k or seq_q, group=group, batch_heads=batch_heads)


CALL = _key(3000, 3000, group=4, batch_heads=64)


@pytest.mark.parametrize("tuned", [
    CALL,
    _key(1500, 1500, group=4, batch_heads=64), _key(6000, 6000, group=4, batch_heads=64),  # a factor of 2 exactly
    _key(2048, 4096, group=8, batch_heads=32), _key(4096, 2048, group=2, batch_heads=128),  # 2 or less in each
])
def test_a_key_within_a_factor_of_2_in_every_dimension_carries_over(tuned):
    assert neighbour_gap(tuned, CALL) is None and carries_over(tuned, CALL) and carries_over(CALL, tuned)


@pytest.mark.parametrize(("tuned", "why"), [
    (_key(1499, 3000, group=4, batch_heads=64), "seq_q 1499 for a call of 3000, more than a factor of 2 apart"),
    (_key(3000, 6001, group=4, batch_heads=64), "seq_k 6001 for a call of 3000, more than a factor of 2 apart"),
    (_key(3000, 3000, group=9, batch_heads=64), "group 9 for a call of 4, more than a factor of 2 apart"),
    (_key(3000, 3000, group=4, batch_heads=16), "batch_heads 16 for a call of 64, more than a factor of 2 apart"),
    # one query head per K/V head against grouped heads: no factor makes up for packing
    (_key(3000, 3000, group=1, batch_heads=64), "group 1 for a call of group 4 (grouped heads pack"),
    (_key(1, 3000, group=4, batch_heads=64), "a decode key (seq_q 1) for a call of 3000 queries"),
    (_key(3000, 3000, group=4, batch_heads=64, causal=False), "another family"),
    (_key(3000, 3000, group=4, batch_heads=64, pass_="bwd"), "another family"),
])
def test_a_key_beyond_the_rule_does_not_carry_over_and_says_why(tuned, why):
    gap = neighbour_gap(tuned, CALL)
    assert gap is not None and gap.startswith(why) and not carries_over(tuned, CALL)


def test_decode_and_a_single_head_stand_apart_from_their_neighbours_within_a_factor_of_2():
    assert neighbour_gap(_key(2, 4096), _key(1, 4096)) == "a key of 2 queries for a decode call (seq_q 1)"
    assert not carries_over(_key(1, 4096, group=2), _key(1, 4096, group=1))
    assert carries_over(_key(1, 4096, group=2), _key(1, 8192, group=4))  # decode from decode, grouped from grouped
    assert carries_over(_key(2, 4096), _key(4, 4096))


def test_the_71_group_prefill_has_no_neighbour_among_group_1_and_group_8_keys():
    call = _key(3000, 3000, group=71, batch_heads=batch_heads_bucket(71))
    for tuned in (_key(2048, 2048, group=1, batch_heads=64), _key(4096, 4096, group=8, batch_heads=64),
                  _key(4096, 4096, group=32, batch_heads=64)):
        assert not carries_over(tuned, call)
    assert carries_over(_key(4096, 4096, group=64, batch_heads=64), call)


_dims = st.tuples(st.integers(1, 1 << 17), st.integers(1, 1 << 17), st.integers(1, 128), st.integers(0, 16))


@given(_dims, _dims)
def test_the_rule_is_a_log2_distance_of_at_most_1_in_each_dimension(a, b):
    ka, kb = _key(a[0], a[1], a[2], 1 << a[3]), _key(b[0], b[1], b[2], 1 << b[3])
    within = all(abs(math.log2(Fraction(x, y))) <= 1 for x, y in zip(ka.point, kb.point))
    same_kind = (ka.seq_q == 1) == (kb.seq_q == 1) and (ka.group > 1) == (kb.group > 1)
    assert carries_over(ka, kb) == carries_over(kb, ka) == (within and same_kind)


_calls = st.tuples(st.integers(1, 1 << 20), st.integers(1, 1 << 20), st.integers(1, 128), st.integers(1, 1 << 16))


def _bucket_members(bucket: int) -> range:
    """The lengths ``bucket_key`` rounds to ``bucket`` (a power of two): [bucket / sqrt 2, bucket * sqrt 2)."""
    low = math.isqrt(bucket * bucket // 2 - 1) + 1 if bucket > 1 else 1  # the least x with 2 x^2 >= bucket^2
    high = math.isqrt(2 * bucket * bucket - 1)  # the largest x with x^2 < 2 bucket^2
    return range(low, high + 1)


@given(_calls, st.data())
def test_every_call_of_a_recording_bucket_carries_over_from_the_buckets_key(a, data):
    """Recording notes a call under ``bucket_key`` and ``search --recorded`` tunes that key: the rule
    must let it serve every call of the bucket. A call whose bucket holds a served row is not noted,
    so any two keys of one bucket must carry over to each other too."""
    call = _key(a[0], a[1], a[2], batch_heads_bucket(a[3]))
    bucket = bucket_key(call)
    lengths = [_bucket_members(n) for n in (bucket.seq_q, bucket.seq_k)]
    assert all(batch_heads_bucket(x) == n for r, n in zip(lengths, (bucket.seq_q, bucket.seq_k)) for x in
               (r.start, r.stop - 1)) and call.seq_q in lengths[0] and call.seq_k in lengths[1]
    other = dataclasses.replace(call, seq_q=data.draw(st.sampled_from(lengths[0])),
                                seq_k=data.draw(st.sampled_from(lengths[1])))
    assert bucket_key(other) == bucket
    assert carries_over(bucket, call) and carries_over(bucket, other)
    assert carries_over(call, other) and carries_over(other, call)
