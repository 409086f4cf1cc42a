"""What each key holds after an import under each conflict rule: the config and the time,
not only the counts (a keep-faster rule turned around must fail here)."""

from __future__ import annotations

import pytest
from exchange_samples import key, result

from flashtune.store.exchange import dump_export, import_export, parse_export

STORED = [result(key(512), 0.5), result(key(1024), 0.25), result(key(2048), 0.25)]
INCOMING = [result(key(512), 0.25, block=32), result(key(1024), 0.5, block=32), result(key(2048), 0.25, block=32),
            result(key(4096), 1.0, block=32)]


def _held(store) -> dict[int, tuple[int, float]]:
    """seq_len -> (the config's BLOCK_M, time_ms)."""
    return {r.key.seq_q: (r.config.BLOCK_M, r.time_ms) for r in store.list_results()}


@pytest.mark.parametrize("on_conflict, expected", [
    # faster file entry wins; slower one loses; a tie keeps the stored result; a new key is added
    ("keep_faster", {512: (32, 0.25), 1024: (64, 0.25), 2048: (64, 0.25), 4096: (32, 1.0)}),
    ("replace", {512: (32, 0.25), 1024: (32, 0.5), 2048: (32, 0.25), 4096: (32, 1.0)}),
    ("skip", {512: (64, 0.5), 1024: (64, 0.25), 2048: (64, 0.25), 4096: (32, 1.0)}),
])
def test_each_key_holds_the_result_its_rule_picks(store, on_conflict, expected):
    store.import_results(STORED)
    import_export(store, parse_export(dump_export(INCOMING)), on_conflict=on_conflict)
    assert _held(store) == expected


def test_keep_faster_also_keeps_the_winners_provenance_and_default_time(store):
    store.import_results(STORED)
    import_export(store, parse_export(dump_export(INCOMING)), on_conflict="keep_faster")
    by_len = {r.key.seq_q: r for r in store.list_results()}
    assert by_len[512].default_time_ms == 0.5 and by_len[1024].default_time_ms == 0.5  # each from its own run


def test_keep_faster_never_trades_a_current_result_for_a_stale_one(store):
    """An old team's table (other kernel sources) fills in keys, but a key that serves keeps its result,
    however fast the stale one was; a stale stored result gives way to a current one, however slow."""
    old = "0123456789abcdef"
    store.import_results([result(key(512), 0.5), result(key(1024), 0.25, kernel_hash=old),
                          result(key(2048), 0.5, kernel_hash=old)])
    incoming = [result(key(512), 0.125, block=32, kernel_hash=old),  # faster but stale: the current one stays
                result(key(1024), 1.0, block=32),  # slower but current: replaces the stale one
                result(key(2048), 0.25, block=32, kernel_hash=old),  # both stale: the faster wins
                result(key(4096), 1.0, block=32, kernel_hash=old)]  # new: added, stale
    summary = import_export(store, parse_export(dump_export(incoming)), on_conflict="keep_faster")
    assert (summary.inserted, summary.replaced, summary.kept) == (1, 2, 1)
    assert _held(store) == {512: (64, 0.5), 1024: (32, 1.0), 2048: (32, 0.25), 4096: (32, 1.0)}
