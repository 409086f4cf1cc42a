"""What ``flashtune bench`` measures: flashtune as ``get_tuned_attention()`` serves it, with
the heuristic default configs, and torch SDPA's cuDNN and flash backends.

Shapes and FLOPs are the autotuner's (``trial_shape``, ``flops``): the benchmark grid's
batch and heads on a GPU (16k tokens, model width 2048), batch 1 and 2 heads under the
interpreter. The forward time is one call; the backward time is
``o.backward(do, retain_graph=True)`` alone, as in BENCHMARKS.md. On a GPU the timer is
``triton.testing.do_bench`` (median); under the interpreter it is the wall clock.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from collections.abc import Callable

import torch

from flashtune.protocol import flops, time_ms, trial_shape
from flashtune.kernels import attention, default_config
from flashtune.kernels.common import torch_fp32_precision
from flashtune.keys import TuningKey, mask_name



@dataclasses.dataclass(frozen=True)
class Measurement:
    key: TuningKey
    impl: str
    time_ms: float | None
    tflops: float | None
    note: str = ""  # where the tuned config came from, or why nothing was measured


def measure(keys, impls, device: str, *, db=None, on_result=None, rounds: int = 1) -> list[Measurement]:
    """Time every implementation on every key; ``on_result`` sees each measurement.

    "tuned" is what ``get_tuned_attention(db)`` serves (exact key, else the nearest tuned
    key that carries over, ``keys.neighbour_gap``); a key it would serve with the heuristic
    default is not measured as tuned.
    Each key's implementations are timed in ``rounds`` interleaved rounds (a slow moment
    of a shared GPU hits one round of each, not all of one implementation); each time is
    the median of its rounds.
    """
    dev = torch.device(device)
    tuned = None
    if "tuned" in impls:
        from flashtune.dispatch import get_tuned_attention

        tuned = get_tuned_attention(db, device=dev)
    out = []
    for key in keys:
        timers = {impl: _prepare(key, impl, dev, tuned) for impl in impls}
        times: dict[str, list[float]] = {impl: [] for impl in impls}
        for _ in range(rounds):
            for impl, timer in timers.items():
                if isinstance(timer, Measurement):
                    continue  # nothing to time: not tuned, or the backend cannot run the shape
                try:
                    times[impl].append(timer.once())
                except RuntimeError as e:
                    timers[impl] = timer.unsupported(e)
        for impl, timer in timers.items():
            if isinstance(timer, Measurement):
                m = timer
            else:
                ms = statistics.median(times[impl])
                m = Measurement(key, impl, ms, timer.flops / ms * 1e-9, timer.note)
            out.append(m)
            if on_result is not None:
                on_result(m)
    return out


@dataclasses.dataclass(frozen=True)
class _Timer:
    """One implementation on one key's inputs, ready to be timed."""

    key: TuningKey
    impl: str
    once: Callable[[], float]  # one timing, in ms
    flops: float
    note: str

    def unsupported(self, e: BaseException) -> Measurement:
        return _unsupported(self.key, self.impl, e)


def _unsupported(key: TuningKey, impl: str, e: BaseException) -> Measurement:
    """The Measurement of an SDPA backend that does not support this shape or dtype."""
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return Measurement(key, impl, None, None, f"unsupported: {message[:80]}")


def _prepare(key: TuningKey, impl: str, device: torch.device, tuned):
    """A _Timer for ``impl`` on ``key`` (its own inputs, same seed for every impl), or the
    final Measurement when there is nothing to time."""
    batch, heads, heads_kv = trial_shape(key, device.type != "cuda")
    dtype = getattr(torch, key.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    q_shape, kv_shape = (batch, heads, key.seq_q, key.head_dim), (batch, heads_kv, key.seq_k, key.head_dim)
    q, k, v, do = (torch.randn(shape, device=device, dtype=dtype, generator=gen)
                   for shape in (q_shape, kv_shape, kv_shape, q_shape))
    gqa = heads != heads_kv
    note = ""
    if impl == "tuned":
        choice = tuned.explain(q, k, v, is_causal=key.causal, enable_gqa=gqa)
        note = choice.fwd_source if key.pass_ == "fwd" else choice.bwd_source
        if not note.startswith("tuned"):
            return Measurement(key, impl, None, None, f"not tuned ({note})")

        def run(q, k, v):
            return tuned(q, k, v, is_causal=key.causal, enable_gqa=gqa)
    elif impl == "default":
        fwd, bwd = (default_config(p, key.head_dim, dtype, device, causal=key.causal, seq_q=key.seq_q, seq_k=key.seq_k,
                                   batch_heads_kv=batch * heads_kv, batch_heads=batch * heads) for p in ("fwd", "bwd"))

        def run(q, k, v):
            return attention(q, k, v, causal=key.causal, fwd_config=fwd, bwd_config=bwd,
                             fp32_precision=torch_fp32_precision(dtype))
    else:  # "cudnn", "flash": SDPA with that backend alone, as a runner runs it
        from flashtune.runners import sdpa

        def run(q, k, v):
            return sdpa(f"sdpa-{impl}", q, k, v, is_causal=key.causal, enable_gqa=gqa)

    def quiet(fn):
        def call():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SDPA warns for each reason a backend cannot run
                return fn()
        return call

    if key.pass_ == "fwd":
        once = quiet(lambda: time_ms(lambda: run(q, k, v), device))
    else:
        for t in (q, k, v):
            t.requires_grad_(True)
        try:
            o = quiet(lambda: run(q, k, v))()
        except RuntimeError as e:  # an SDPA backend that does not support this shape or dtype
            return _unsupported(key, impl, e)
        once = quiet(lambda: time_ms(lambda: o.backward(do, retain_graph=True), device, grad_to_none=(q, k, v)))
    return _Timer(key, impl, once, flops(key, batch, heads), note)


def plot(measurements, path: str, title: str) -> None:
    """TFLOPS vs seq len, one line per implementation, one panel per key family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({(m.key.pass_, m.key.dtype, m.key.head_dim, m.key.causal) for m in measurements},
                      key=lambda f: (f[0] != "fwd", f[1], f[2], f[3]))
    cols = min(4, len(families))
    rows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, family in zip(axes.flat, families):
        pass_, dtype, head_dim, causal = family
        for impl in dict.fromkeys(m.impl for m in measurements):
            points = sorted((m.key.seq_q, m.tflops) for m in measurements
                            if (m.key.pass_, m.key.dtype, m.key.head_dim, m.key.causal) == family
                            and m.impl == impl and m.tflops is not None)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        seq_lens = sorted({m.key.seq_q for m in measurements})
        ax.set_xticks(seq_lens, [f"{n // 1024}k" if n >= 1024 else str(n) for n in seq_lens])
        ax.set_title(f"{pass_} {dtype} d{head_dim} {mask_name(causal)}", fontsize=9)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOPS")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(families):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
