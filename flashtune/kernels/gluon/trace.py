"""The Gluon kernels' own instrumentation: the layout of their traces and where the time goes.

``gluon_attention_forward(..., trace=buf)`` (buf from ``forward_launch.trace_buffer``) and
``gluon_attention_backward(..., trace=[])`` (the dK/dV kernel's trace appended to the list) run
the kernel compiled with ``TRACE``: each of a CTA's three partitions (consumer 0, consumer 1,
the TMA producer) stamps the SM's cycle counter (``%clock64``) at fixed points of every block
it handles and of every tile, and the global timer (``%globaltimer``, ns) at each tile's
start and end, into ``buf[tile, partition, slot]`` (int64; one thread of the partition
stores), as ``FORWARD`` and ``BACKWARD`` name the slots. ``tile`` is the tile's place in the
launch order (the CTA's linear id, or with PERSISTENT the tile index its CTA walked to).
Nothing else of the kernel changes: the untraced kernel is compiled without any of it, and a
traced call's outputs are the untraced call's, bit for bit (tests/kernels/test_gluon_trace_gpu.py
checks it).

The stamps cost a cycle-counter read and a store each (8 or 14 per block and partition);
``benchmarks/gluon_profile.py`` times the traced call beside the untraced one, so the
perturbation is on record with every account. The compiler may move arithmetic (the
softmax's) across a stamp; the waits (mbarrier, wgmma) it does not move, so the wait
figures are the firm ones.

This module has no Gluon in it: it reads a trace (``account``) on any host, and the CPU
tests build synthetic traces to check it.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

PARTITIONS = ("consumer 0", "consumer 1", "producer")
HEAD = 16  # header slots per (tile, partition)
# header slots
H_GT_START = 0  # %globaltimer (ns) at the tile's start in this partition
H_CLK_START = 1  # %clock64 there
H_SMID = 2
H_PID = 3  # the CTA (program id, linear)
H_CLK_Q = 4  # consumer: its resident tiles are in (forward: Q; dK/dV: K and V); producer: those issued
H_CLK_BLOCKS = 5  # consumer: every block done (the last P V included); producer: the last block issued
H_CLK_END = 6  # consumer: its outputs stored; producer: the tile's loads issued
H_GT_END = 7
H_N_BLOCKS = 8  # blocks (steps) of the tile (the same for the three partitions)
H_TILE_I = 9  # tiles this CTA ran before this one (PERSISTENT; else 0)
H_LO = 10  # the tile's first key block (forward), first query block (dK/dV)
H_CLK_LAST_V = 11  # forward with OVERLAP: the last block's V is in (its P V is issued after the loop)


@dataclasses.dataclass(frozen=True)
class Layout:
    """What one kernel stamps per block: ``events`` slots, the consumers' intervals between
    them per variant (the consumer's first event is the block's start, its last the block's
    end), the producer's; ``last``: per variant, the names the time after the last block's end
    splits into at H_CLK_LAST_V (else it counts as "between blocks")."""

    kernel: str
    events: int
    consumer: dict[int, tuple[tuple[str, int, int], ...]]
    producer: tuple[tuple[str, int, int], ...]
    resident: str  # what the consumer waits for before its first block (H_CLK_Q)
    last: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)

    def slots(self, max_blocks: int) -> int:
        """Slots per (tile, partition) for tiles of at most ``max_blocks`` blocks."""
        return HEAD + self.events * max_blocks

    def consumer_phases(self, variant: int) -> tuple[str, ...]:
        """What a consumer's time is split into (``account``'s consumer keys)."""
        return (f"wait {self.resident}",) + tuple(n for n, _a, _b in self.consumer[variant]) + \
            ("between blocks", "epilogue")


PRODUCER_PHASES = ("wait slot", "issue", "the rest")
_PRODUCER = (("wait slot", 0, 1), ("issue", 1, 2))

# the forward (gluon/forward.py), per key block; variant: OVERLAP (0: the sequential loop; 1:
# block j's S issued with block j-1's P V)
FORWARD = Layout("forward", 8, {
    0: (("wait K", 0, 1), ("wait turn", 1, 2), ("wait S", 2, 3), ("softmax", 3, 4), ("wait V", 4, 5),
        ("wait PV", 5, 6), ("release", 6, 7)),
    1: (("wait K", 0, 1), ("wait V", 1, 2), ("wait turn", 2, 3), ("wait S", 3, 4), ("softmax", 4, 5),
        ("wait PV", 5, 6), ("rescale, stage P", 6, 7)),
}, _PRODUCER, "Q", last={1: ("wait V", "wait PV")})

# the dK/dV kernel (gluon/backward.py), per step (query block of a query head); one variant:
# without the fused dQ its four dQ intervals are empty; with DQ_FUSED 2 they are the previous
# step's share (the last share runs after the loop: "between blocks")
BACKWARD = Layout("backward dK/dV", 14, {
    0: (("wait Q", 0, 1), ("wait dO", 1, 2), ("wait S", 2, 3), ("P", 3, 4), ("wait dP", 4, 5), ("dS", 5, 6),
        ("issue dV, dK", 6, 7), ("dQ: wait dS", 7, 8), ("dQ: wgmma", 8, 9), ("dQ: wait reduce", 9, 10),
        ("dQ: store, reduce", 10, 11), ("wait dV, dK", 11, 12), ("release", 12, 13)),
}, _PRODUCER, "K, V")


class TraceError(ValueError):
    """The trace is not one a traced kernel wrote (a tile or a partition never stamped)."""


@dataclasses.dataclass
class Account:
    """Where the time of one traced call went.

    consumer / producer: phase -> fraction of the partition's stamped time (summed over the
    tiles and, for the consumers, over both); cycles_per_block: the median over the consumers'
    blocks of a block's cycles (first event to the next block's first); grid: the SMs' time
    over the kernel's span (busy: running a tile; gaps: between two tiles of an SM; head,
    tail: before an SM's first tile, after its last), from the global timer; ghz: the cycle
    counter's rate against the global timer (median over tiles); consumer_lag: the median over
    blocks of how many cycles after consumer 0 consumer 1 started the same block (both read one
    SM's counter; about 0 when the two walk in step, half a block when they take turns).
    """

    kernel: str
    tiles: int
    blocks: int
    span_us: float
    sms: int
    ghz: float
    consumer: dict[str, float]
    producer: dict[str, float]
    grid: dict[str, float]
    cycles_per_block: float
    block_phases: dict[str, float]  # median cycles of each block interval
    consumer_lag: float = 0.0

    def lines(self) -> list[str]:
        """The account as a few lines of text."""
        pct = lambda d: ", ".join(f"{k} {100 * v:.1f}%" for k, v in d.items())  # noqa: E731
        return [f"{self.kernel}: {self.tiles} tiles, {self.blocks} blocks, span {self.span_us:.1f} us on "
                f"{self.sms} SMs, clock {self.ghz:.2f} GHz",
                f"consumers: {pct(self.consumer)}",
                f"producer: {pct(self.producer)}",
                f"SMs: {pct(self.grid)}",
                f"per block (median cycles): {self.cycles_per_block:.0f}: "
                + ", ".join(f"{k} {v:.0f}" for k, v in self.block_phases.items())
                + f"; consumer 1 behind consumer 0 by {self.consumer_lag:.0f}"]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check(trace: torch.Tensor, layout: Layout) -> None:
    if trace.ndim != 3 or trace.shape[1] != len(PARTITIONS) or trace.shape[2] < HEAD:
        raise TraceError(f"trace: expected (tiles, {len(PARTITIONS)}, slots >= {HEAD}), got {tuple(trace.shape)}")
    missing = torch.nonzero((trace[:, :, H_GT_START] == 0) | (trace[:, :, H_GT_END] == 0))
    if len(missing):
        t, p = missing[0].tolist()
        raise TraceError(f"trace: {len(missing)} (tile, partition) pairs were never stamped, the first tile {t} "
                         f"{PARTITIONS[p]}")
    n = trace[:, :, H_N_BLOCKS]
    if (n != n[:, :1]).any():
        raise TraceError("trace: the partitions of a tile disagree on its block count")
    most = int(n.max()) if n.numel() else 0
    if layout.slots(most) > trace.shape[2]:
        raise TraceError(f"trace: a tile has {most} blocks, the slots hold {(trace.shape[2] - HEAD) // layout.events}")


def _grid(trace: torch.Tensor, sms: int | None) -> tuple[dict[str, float], float, int]:
    start, end = trace[:, 0, H_GT_START], trace[:, 0, H_GT_END]
    smid = trace[:, 0, H_SMID]
    t0, t1 = int(start.min()), int(end.max())
    span = max(t1 - t0, 1)
    used = torch.unique(smid)
    n_sms = sms or len(used)
    busy = gaps = head = tail = 0
    for sm in used:
        on = torch.argsort(start[smid == sm])
        s, e = start[smid == sm][on], end[smid == sm][on]
        busy += int((e - s).sum())
        gaps += int((s[1:] - e[:-1]).clamp(min=0).sum())
        head += int(s[0] - t0)
        tail += int(t1 - e[-1])
    idle_sms = n_sms - len(used)  # SMs that ran no tile
    whole = n_sms * span
    return ({"busy": busy / whole, "gaps": gaps / whole, "head": head / whole, "tail": tail / whole,
             "no tile": idle_sms * span / whole}, span / 1e3, n_sms)


def account(trace, variant: int, sms: int | None = None, layout: Layout = FORWARD) -> Account:
    """Read a trace of ``layout``'s kernel (the forward's: ``forward_launch.trace_buffer``'s
    tensor after a traced call, or a copy) run as ``variant`` (the forward's: its config's
    OVERLAP; the dK/dV kernel's: 0); ``sms``: the GPU's SM count (the SMs that ran no tile
    count as idle). TraceError if it is not a complete trace."""
    trace = torch.as_tensor(trace).to(device="cpu", dtype=torch.int64)
    _check(trace, layout)
    variant = int(variant)
    intervals = layout.consumer[variant]
    last = layout.events - 1
    resident = f"wait {layout.resident}"
    cons = dict.fromkeys(layout.consumer_phases(variant), 0)
    prod = dict.fromkeys(PRODUCER_PHASES, 0)
    per_phase: dict[str, list[int]] = {name: [] for name, _a, _b in intervals}
    per_block: list[int] = []
    lags: list[int] = []
    ghz = []
    for t in range(trace.shape[0]):
        n = int(trace[t, 0, H_N_BLOCKS])
        for w in (0, 1):
            h = trace[t, w]
            ev = h[HEAD:HEAD + layout.events * n].reshape(n, layout.events)
            cons[resident] += int(h[H_CLK_Q] - h[H_CLK_START])
            for name, a, b in intervals:
                d = ev[:, b] - ev[:, a]
                cons[name] += int(d.sum())
                per_phase[name] += d.tolist()
            if n:
                between = int((ev[1:, 0] - ev[:-1, last]).sum()) + int(ev[0, 0] - h[H_CLK_Q])
                tail = int(h[H_CLK_BLOCKS] - ev[-1, last])
                if variant in layout.last:  # the last block's work after the loop
                    before, after = layout.last[variant]
                    cons[before] += int(h[H_CLK_LAST_V] - ev[-1, last])
                    cons[after] += int(h[H_CLK_BLOCKS] - h[H_CLK_LAST_V])
                    tail = 0
                cons["between blocks"] += between + tail
                per_block += (ev[1:, 0] - ev[:-1, 0]).tolist()
            else:
                cons["between blocks"] += int(h[H_CLK_BLOCKS] - h[H_CLK_Q])
            cons["epilogue"] += int(h[H_CLK_END] - h[H_CLK_BLOCKS])
            gt = int(h[H_GT_END] - h[H_GT_START])
            if gt > 0:
                ghz.append(int(h[H_CLK_END] - h[H_CLK_START]) / gt)
        starts = trace[t, :2, HEAD:HEAD + layout.events * n].reshape(2, n, layout.events)[:, :, 0]
        lags += (starts[1] - starts[0]).tolist()
        h = trace[t, 2]
        ev = h[HEAD:HEAD + layout.events * n].reshape(n, layout.events)
        total = int(h[H_CLK_END] - h[H_CLK_START])
        waited = 0
        for name, a, b in layout.producer:
            d = int((ev[:, b] - ev[:, a]).sum())
            prod[name] += d
            waited += d
        prod["the rest"] += total - waited
    cons_total = sum(cons.values()) or 1
    prod_total = sum(prod.values()) or 1
    grid, span_us, n_sms = _grid(trace, sms)
    med = lambda xs: float(statistics.median(xs)) if xs else 0.0  # noqa: E731
    return Account(kernel=layout.kernel, tiles=int(trace.shape[0]), blocks=int(trace[:, 0, H_N_BLOCKS].sum()),
                   span_us=span_us, sms=n_sms, ghz=med(ghz), consumer={k: v / cons_total for k, v in cons.items()},
                   producer={k: v / prod_total for k, v in prod.items()}, grid=grid,
                   cycles_per_block=med(per_block), block_phases={k: med(v) for k, v in per_phase.items()},
                   consumer_lag=med(lags))
