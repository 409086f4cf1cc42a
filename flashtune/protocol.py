"""The measurement protocol (BENCHMARKS.md): the grid of shapes, how a key becomes a
shape, how FLOPs are counted, the timer and the geometric mean. The autotuner, the CLI
(``flashtune search``/``bench``) and the scripts under benchmarks/ all measure this way.

Nothing here imports torch or triton at module level (the CLI's ``--help`` stays instant).
"""

from __future__ import annotations

import math
import statistics
import time

# The standard grid: 16k tokens (batch x seq_len) at model width 2048 (heads x head_dim).
TOKENS, WIDTH = 16384, 2048
GRID_HEAD_DIMS = (64, 128)
GRID_DTYPES = ("bfloat16",)
GRID_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
# The interpreter demo: tiny shapes in a dtype the interpreter computes correctly.
DEMO_HEAD_DIMS = (16,)
DEMO_DTYPES = ("float32",)
DEMO_SEQ_LENS = (16, 32)
DEMO_SHAPE = (1, 2)  # (batch, heads) under the interpreter


def grid_shape(head_dim: int, seq_len: int, *, interpreter: bool = False) -> tuple[int, int]:
    """(batch, heads) of the standard grid for a head dim and sequence length; tiny under
    the interpreter."""
    if interpreter:
        return DEMO_SHAPE
    return max(1, TOKENS // seq_len), max(1, WIDTH // head_dim)


def trial_shape(key, interpreter: bool) -> tuple[int, int, int]:
    """(batch, heads_q, heads_kv) a tuning key is timed at (``TuningKey.trial_shape``): a grid
    key's grid shape on a GPU; tiny under the interpreter."""
    return key.trial_shape(interpreter=interpreter)


def attention_flops(pass_: str, batch: int, heads: int, seq_len: int, head_dim: int, causal: bool, *,
                    seq_k: int | None = None) -> float:
    """FLOPs counted as in the FlashAttention papers: 4·B·H·N²·D forward (half of it
    causal), 2.5 times that backward; ``seq_k`` for keys of another length (4·B·H·Nq·Nk·D)."""
    fwd = 4.0 * batch * heads * seq_len * (seq_len if seq_k is None else seq_k) * head_dim
    if causal:
        fwd /= 2
    if pass_ == "fwd":
        return fwd
    if pass_ == "bwd":
        return 2.5 * fwd
    raise ValueError(f"pass_: expected 'fwd' or 'bwd', got {pass_!r}")


def flops(key, batch: int, heads: int) -> float:
    """FLOPs of one call of a tuning key's pass at (batch, query heads): 4·B·H·Nq·Nk·D
    forward, halved for causal with Nq = Nk (as docs/performance.md counts), 2.5
    times that backward."""
    return attention_flops(key.pass_, batch, heads, key.seq_q, key.head_dim, key.causal and key.seq_q == key.seq_k,
                           seq_k=key.seq_k)


_WARM: set = set()


def warm_up_gpu(device, seconds: float = 1.0) -> None:
    """Keep ``device`` busy with matmuls for about ``seconds``, once per process and device,
    so its clocks have left idle before the first timed call (nothing off CUDA): a process that
    starts timing at once, the GPU idle at its lowest clock, times two identical launches up to
    10 % apart on its first row."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or device in _WARM:
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize(device)
    _WARM.add(device)


def time_ms(fn, device, *, quick: bool = False, grad_to_none=None) -> float:
    """Median time of ``fn`` in ms: triton's do_bench (CUDA events, L2 flushed between
    runs) on a GPU, after warm_up_gpu; wall clock under the interpreter, which is no
    performance figure."""
    if device.type == "cuda":
        import triton.testing

        warm_up_gpu(device)

        return float(triton.testing.do_bench(fn, warmup=10 if quick else 25, rep=30 if quick else 100,
                                             grad_to_none=grad_to_none, return_mode="median"))
    fn()  # warm-up: the first call allocates
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def eager_time_ms(fn, device, *, quick: bool = False) -> float:
    """Median wall-clock ms per call of ``fn`` called back to back, the device synchronised around
    each loop of calls: what the call costs eagerly when nothing else hides the host, its host's
    work and its GPU's whichever is longer, and the gaps between them (no L2 flush: a model's
    loop does none). ``time_ms`` under the interpreter."""
    if device.type != "cuda":
        return time_ms(fn, device, quick=quick)
    import torch

    warm_up_gpu(device)
    fn()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(5):
        fn()
    torch.cuda.synchronize(device)
    per_call = max((time.perf_counter() - start) / 5, 1e-6)
    # loops of about 10 ms (quick: 3 loops, else 7), 10 calls at least, so a sync's cost and a
    # loop's start are a small share of each figure
    calls = max(10, min(1000, int(0.010 / per_call)))
    figures = []
    for _ in range(3 if quick else 7):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(device)
        figures.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(figures)


_CLEAN_L2: dict = {}


def time_clean_l2(fn, device, *, rep: float = 20.0, cushion_cycles: int = 0) -> float:
    """Median ms of ``fn`` over about ``rep`` ms of calls, each after the L2 is emptied by
    reading a 256 MiB buffer. triton's do_bench empties it by zero-filling one, which leaves
    the L2 full of dirty lines: a call that reads more than the L2 holds then also writes
    them back (about 12 us of a 50 us decode step on an H200). After a read the
    lines are clean, as after a model's weight-streaming matmuls.

    ``cushion_cycles`` > 0: a device sleep of that many cycles is queued after the read, before
    the start event, so the host has enqueued ``fn``'s launches before the GPU reaches them and
    the figure is GPU time only. Without it a launcher's host time beyond the read's GPU time is
    counted (a bare Gluon launch's 160-880 us of host time read 0.29 ms for a 0.15 ms kernel)."""
    import torch

    buf = _CLEAN_L2.get(device)
    if buf is None:
        buf = _CLEAN_L2[device] = torch.ones(64 << 20, dtype=torch.int32, device=device)
    fn()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    n = max(10, min(2000, int(rep / max(start.elapsed_time(end) / 5, 1e-3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in events:
        buf.sum()
        if cushion_cycles:
            torch.cuda._sleep(cushion_cycles)
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize(device)
    return statistics.median(a.elapsed_time(b) for a, b in events)


def capture_graph(fn, device):
    """A CUDA graph of ``fn``'s launches on ``device``: ``fn`` runs twice on a side stream
    first (compiles, launch plans, allocations), then once under capture. Raises what the
    capture raised (a host sync, an uncapturable op), the device synchronised and usable."""
    import torch

    try:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        return graph
    except Exception:
        torch.cuda.synchronize(device)
        raise


def graph_time_ms(fn, device, *, quick: bool = False) -> float:
    """Median GPU time of ``fn``'s launches in ms, replayed from a CUDA graph (do_bench of
    the replay, L2 flushed between runs as ``time_ms``): the kernels' own time, without the
    host's. The autotuner times configs this way: a config decides the GPU's work, not the
    host's, and an eager timing of a short call adds the host's cost of the launch, which
    differs by kernel family (the Gluon forward's eager call took 0.150 ms against 0.090
    from a graph on an H200 row of 0.07 ms) and jitters (an eager re-timing once kept a config
    10 % slower on the GPU). A call that cannot be captured
    (``capture_graph``) is timed eagerly, as is everything under the interpreter."""
    if device.type != "cuda":
        return time_ms(fn, device, quick=quick)
    try:
        graph = capture_graph(fn, device)
    except Exception:  # noqa: BLE001 - not capturable: time the call eagerly
        return time_ms(fn, device, quick=quick)
    try:
        return time_ms(graph.replay, device, quick=quick)
    finally:
        graph.reset()


def geomean(values) -> float | None:
    """Geometric mean of the positive values (None and others left out); None if none."""
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
