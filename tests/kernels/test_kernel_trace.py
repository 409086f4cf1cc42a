"""kernels/gluon/trace.py's account on synthetic traces: the Gluon kernels' trace layouts read back
into where the time went (CPU; the kernels that write real traces are checked on a GPU by
test_gluon_trace_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from flashtune.kernels.gluon import trace as kt

# cycles of each consumer block interval (trace.FORWARD.consumer's order), between two
# blocks, waiting for Q, the epilogue; the producer's wait and issue per block
BLOCK = (10, 20, 30, 40, 50, 60, 70)
BETWEEN, WAIT_Q, EPILOGUE, LAST_V, LAST_PV = 5, 100, 200, 7, 9
P_WAIT, P_ISSUE, P_Q = 300, 4, 11
GHZ = 2.0


def _durations(layout: kt.Layout) -> tuple[int, ...]:
    """Cycles of each of the layout's consumer intervals: BLOCK's, then 80, 90, ..."""
    n = len(layout.consumer[0])
    return BLOCK[:n] + tuple(80 + 10 * i for i in range(n - len(BLOCK)))


def _tile(n: int, overlap: int, clk0: int, gt0: int, smid: int, pid: int, layout=kt.FORWARD) -> np.ndarray:
    """One tile's three partitions, every block costing the layout's _durations (+ BETWEEN
    before each but the first, + the last block's work after the loop with the forward's
    overlap)."""
    out = np.zeros((3, layout.slots(n)), dtype=np.int64)
    E = layout.events
    for w in (0, 1):
        h = out[w]
        h[kt.H_CLK_START] = clk0
        h[kt.H_CLK_Q] = c = clk0 + WAIT_Q
        for j in range(n):
            c += BETWEEN
            ev = h[kt.HEAD + E * j:kt.HEAD + E * (j + 1)]
            ev[0] = c
            for i, d in enumerate(_durations(layout)):
                c += d
                ev[i + 1] = c
        if overlap in layout.last and n:
            h[kt.H_CLK_LAST_V] = c = c + LAST_V
            c += LAST_PV
        h[kt.H_CLK_BLOCKS] = c
        h[kt.H_CLK_END] = c + EPILOGUE
    p = out[2]
    p[kt.H_CLK_START] = c = clk0
    c += P_Q
    p[kt.H_CLK_Q] = c
    for j in range(n):
        ev = p[kt.HEAD + E * j:kt.HEAD + E * (j + 1)]
        ev[0] = c
        ev[1] = c = c + P_WAIT
        ev[2] = c = c + P_ISSUE
    p[kt.H_CLK_BLOCKS] = p[kt.H_CLK_END] = c
    for h in out:
        h[kt.H_N_BLOCKS] = n
        h[kt.H_SMID] = smid
        h[kt.H_PID] = pid
        h[kt.H_GT_START] = gt0
        h[kt.H_GT_END] = gt0 + round((out[0, kt.H_CLK_END] - clk0) / GHZ)
    return out


def _trace(blocks: list[int], overlap: int, sms: int, max_blocks: int | None = None,
           layout=kt.FORWARD) -> np.ndarray:
    """Tiles of ``blocks`` blocks, one after the other on each of ``sms`` SMs."""
    width = layout.slots(max_blocks or max(blocks))
    trace = np.zeros((len(blocks), 3, width), dtype=np.int64)
    gt_next = [1_000_000] * sms
    for t, n in enumerate(blocks):
        sm = t % sms
        tile = _tile(n, overlap, clk0=10_000 + 50 * t, gt0=gt_next[sm], smid=sm, pid=t, layout=layout)
        trace[t, :, :tile.shape[1]] = tile
        gt_next[sm] = tile[0, kt.H_GT_END]
    return trace


@pytest.mark.parametrize("overlap", [0, 1])
def test_the_account_adds_up_to_the_stamped_intervals(overlap):
    blocks = [3, 5, 1, 4]
    acc = kt.account(_trace(blocks, overlap, sms=2), overlap)
    n = sum(blocks)
    last = (LAST_V + LAST_PV) * len(blocks) if overlap else 0
    total = 2 * (len(blocks) * (WAIT_Q + EPILOGUE) + n * (sum(BLOCK) + BETWEEN)) + 2 * last
    names = [name for name, _a, _b in kt.FORWARD.consumer[overlap]]
    for name, cycles in zip(names, BLOCK):
        extra = {"wait V": LAST_V, "wait PV": LAST_PV}.get(name, 0) if overlap else 0
        assert acc.consumer[name] == pytest.approx(2 * (n * cycles + len(blocks) * extra) / total)
    assert acc.consumer["wait Q"] == pytest.approx(2 * len(blocks) * WAIT_Q / total)
    assert acc.consumer["epilogue"] == pytest.approx(2 * len(blocks) * EPILOGUE / total)
    assert acc.consumer["between blocks"] == pytest.approx(2 * n * BETWEEN / total)
    assert sum(acc.consumer.values()) == pytest.approx(1.0)
    assert tuple(acc.consumer) == kt.FORWARD.consumer_phases(overlap)  # the loop's own intervals only
    assert acc.block_phases == {name: float(c) for name, c in zip(names, BLOCK)}
    assert acc.cycles_per_block == sum(BLOCK) + BETWEEN
    p_total = len(blocks) * P_Q + n * (P_WAIT + P_ISSUE)
    assert acc.producer == pytest.approx({"wait slot": n * P_WAIT / p_total, "issue": n * P_ISSUE / p_total,
                                          "the rest": len(blocks) * P_Q / p_total})
    assert acc.tiles == 4 and acc.blocks == n
    assert acc.ghz == pytest.approx(GHZ, rel=0.02)
    assert acc.consumer_lag == 0.0  # the synthetic consumers walk in step
    assert len(acc.lines()) == 5 and acc.to_dict()["consumer"] == acc.consumer


def test_the_consumer_lag_is_the_median_offset_of_consumer_1s_blocks():
    layout = kt.BACKWARD
    trace = _trace([4, 3], 0, sms=2, layout=layout)
    for t, n in enumerate([4, 3]):  # consumer 1 starts each block later: 100 + 10 per block, tile t
        for j in range(n):
            ev = slice(kt.HEAD + layout.events * j, kt.HEAD + layout.events * (j + 1))
            trace[t, 1, ev] += 100 + 10 * j + 1000 * t
    acc = kt.account(trace, 0, layout=layout)
    lags = sorted([100, 110, 120, 130] + [1100, 1110, 1120])
    assert acc.consumer_lag == float(lags[len(lags) // 2])
    assert acc.lines()[-1].endswith(f"consumer 1 behind consumer 0 by {lags[len(lags) // 2]}")


def test_the_grid_account_splits_the_span_into_busy_gaps_head_and_tail():
    # tiles back to back on 2 SMs: SM 0 runs 3 tiles, SM 1 one; a 4-SM GPU has 2 with no tile
    blocks = [4, 1, 4, 4]
    trace = _trace(blocks, 0, sms=1)
    trace[1, :, kt.H_SMID] = 1  # tile 1 on SM 1, at the same start as tile 0 ran
    acc = kt.account(trace, 0, sms=4)
    start, end = trace[:, 0, kt.H_GT_START], trace[:, 0, kt.H_GT_END]
    span = end.max() - start.min()
    busy = (end - start).sum()
    assert acc.span_us == pytest.approx(span / 1e3)
    assert acc.grid["busy"] == pytest.approx(busy / (4 * span))
    assert acc.grid["no tile"] == pytest.approx(0.5)
    # SM 1: its one tile starts at tile 1's start (after tile 0 on the original SM): head, then tail
    assert acc.grid["head"] == pytest.approx((start[1] - start.min()) / (4 * span))
    assert acc.grid["tail"] == pytest.approx((end.max() - end[1]) / (4 * span))
    assert acc.grid["gaps"] == pytest.approx((start[2] - end[0]) / (4 * span))
    assert sum(acc.grid.values()) == pytest.approx(1.0)


def test_a_trace_with_a_tile_never_stamped_is_refused():
    trace = _trace([2, 2, 2], 1, sms=1)
    trace[1, 2, :] = 0  # the second tile's producer never ran its stamps
    with pytest.raises(kt.TraceError, match=r"tile 1 producer"):
        kt.account(trace, 1)


def test_a_trace_whose_partitions_disagree_or_overflow_is_refused():
    trace = _trace([2, 3], 0, sms=1)
    trace[0, 1, kt.H_N_BLOCKS] = 3
    with pytest.raises(kt.TraceError, match="disagree"):
        kt.account(trace, 0)
    trace = _trace([2, 3], 0, sms=1)
    with pytest.raises(kt.TraceError, match="slots hold 2"):
        kt.account(trace[:, :, :kt.FORWARD.slots(2)], 0)
    with pytest.raises(kt.TraceError, match=r"expected \(tiles, 3"):
        kt.account(trace[:, :2], 0)


def test_tiles_without_key_blocks_count_their_time_between_q_and_the_epilogue():
    acc = kt.account(_trace([0, 2], 1, sms=1, max_blocks=2), 1)
    assert sum(acc.consumer.values()) == pytest.approx(1.0)
    assert acc.blocks == 2


def test_the_dkdv_kernels_layout_is_read_with_its_own_intervals():
    layout = kt.BACKWARD
    blocks = [6, 2, 5]
    acc = kt.account(_trace(blocks, 0, sms=3, layout=layout), 0, layout=layout)
    n, durations = sum(blocks), _durations(layout)
    total = 2 * (len(blocks) * (WAIT_Q + EPILOGUE) + n * (sum(durations) + BETWEEN))
    names = [name for name, _a, _b in layout.consumer[0]]
    assert tuple(acc.consumer) == layout.consumer_phases(0) and acc.consumer["wait K, V"] > 0
    for name, cycles in zip(names, durations):
        assert acc.consumer[name] == pytest.approx(2 * n * cycles / total)
    assert acc.consumer["between blocks"] == pytest.approx(2 * n * BETWEEN / total)
    assert sum(acc.consumer.values()) == pytest.approx(1.0)
    assert acc.kernel == layout.kernel and acc.lines()[0].startswith("backward dK/dV: 3 tiles, 13 blocks")
    # read as the forward's, the slots are too few for its blocks' events: refused, not misread
    with pytest.raises(kt.TraceError):
        kt.account(_trace(blocks, 0, sms=3, layout=layout)[:, :, :kt.HEAD + 8 * 6], 0, layout=layout)
