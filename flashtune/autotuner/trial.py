"""One key's trials: inputs, the reference, the correctness rule, timing.

Runs inside the worker process (flashtune.autotuner.worker); nothing here touches
the store. A ``KeyBench`` is built once per key: random inputs with a seed derived
from the key, and the fp32 reference computed once. ``run(config)`` checks a config
and times it; ``retime(configs, rounds)`` re-times finalists interleaved.
"""

from __future__ import annotations

import hashlib
import math
import statistics

import torch

from flashtune.autotuner.outcome import classify
from flashtune.keys import TuningKey
from flashtune.outcome import Outcome
from flashtune.protocol import flops, graph_time_ms, trial_shape
from flashtune.kernels import attention_backward, attention_forward, reference_with_grads
from flashtune.kernels.triton.backward import dq_kernel_alone
from flashtune.device import INTERPRETER
from flashtune.kernels.common import LN2, LOG2E
from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig
from flashtune.tolerance import baseline_dtype, error_ratio, max_error, tolerance, uses_tf32


def _seed(key: TuningKey) -> int:
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:4], "little")


class KeyBench:
    """Inputs, reference and error allowances for one tuning key on one device."""

    def __init__(self, key: TuningKey, device: torch.device, shape: tuple[int, int, int] | None = None):
        """``shape``: the (batch, heads_q, heads_kv) of a call the key was made from (a search
        of shape sets or recorded calls times the call itself); else ``trial_shape``'s."""
        self.key = key
        self.device = device
        self.dtype = getattr(torch, key.dtype)
        self.batch, self.heads, self.heads_kv = shape or trial_shape(key, device.type != "cuda")
        self.sm_scale = 1.0 / math.sqrt(key.head_dim)
        gen = torch.Generator(device=device).manual_seed(_seed(key))
        q_shape = (self.batch, self.heads, key.seq_q, key.head_dim)
        kv_shape = (self.batch, self.heads_kv, key.seq_k, key.head_dim)
        self.q, self.k, self.v, self.do = (torch.randn(shape, device=device, dtype=self.dtype, generator=gen)
                                           for shape in (q_shape, kv_shape, kv_shape, q_shape))
        ref_dtype = torch.float32 if device.type == "cuda" else torch.float64
        ref = reference_with_grads(self.q, self.k, self.v, self.do, causal=key.causal, dtype=ref_dtype)
        self.o_ref, self.lse_ref = ref[0], ref[1]
        self.grads_ref = ref[2:]
        # the allowances (flashtune.tolerance): the baseline is the plain reference computed
        # in the key's own precision (float16 for float32 with tf32 dots)
        tf32 = uses_tf32(self.dtype, device)
        self.tolerance = tolerance(self.dtype, tf32=tf32)
        low = reference_with_grads(self.q, self.k, self.v, self.do, causal=key.causal,
                                   dtype=baseline_dtype(self.dtype, tf32=tf32))
        self.allowance = {name: self.tolerance.allowance(max_error(x, r), lse=name == "lse")
                          for name, x, r in zip(("o", "lse", "dq", "dk", "dv"), low, ref)}
        # the backward's inputs come from the reference, so it is checked on its own
        self.o_in = self.o_ref.to(self.dtype)
        self.lse2_in = (self.lse_ref * LOG2E).float().contiguous()
        self.flops = flops(key, self.batch, self.heads)

    def launcher(self, config, fault: int = 0, *, compile_only: bool = False):
        """A no-argument callable running the key's pass with ``config`` (``fault``, tests
        only: with that fault of flashtune.autotuner.faults injected after the launch)."""
        if self.key.pass_ == "fwd":
            assert isinstance(config, FwdConfig)
            launch = lambda: attention_forward(self.q, self.k, self.v, config, causal=self.key.causal,  # noqa: E731
                                               sm_scale=self.sm_scale, compile_only=compile_only)
        else:
            assert isinstance(config, BwdConfig)
            launch = lambda: attention_backward(self.do, self.q, self.k, self.v, self.o_in,  # noqa: E731
                                                self.lse2_in, config, causal=self.key.causal,
                                                sm_scale=self.sm_scale, compile_only=compile_only)
        if fault and not compile_only:
            from flashtune.autotuner.faults import inject  # test mode only

            return inject(launch, fault, self.device)
        return launch

    def precompile(self, configs: list, faults: list[int], threads: int) -> None:
        """Compile the kernels of several configs in parallel threads (GPU only).

        Failures are left for the trial of each config to meet and record."""
        if self.device.type != "cuda" or len(configs) < 2:
            return
        import concurrent.futures

        from triton.runtime._async_compile import AsyncCompileMode

        with concurrent.futures.ThreadPoolExecutor(threads) as pool, AsyncCompileMode(pool, ignore_errors=True):
            for config, fault in zip(configs, faults):
                try:
                    self.launcher(config, fault, compile_only=True)()
                except Exception:  # noqa: BLE001 - the trial records it
                    pass

    def check(self, result) -> tuple[bool, float, str]:
        """(passed, worst error / allowance, which output was worst)."""
        if self.key.pass_ == "fwd":
            o, lse2 = result
            pairs = {"o": (o, self.o_ref), "lse": (lse2 * LN2, self.lse_ref)}
        else:
            pairs = dict(zip(("dq", "dk", "dv"), zip(result, self.grads_ref)))
        worst, worst_name = 0.0, ""
        for name, (got, ref) in pairs.items():
            ratio = error_ratio(max_error(got, ref), self.allowance[name])
            if not ratio <= worst:  # also catches NaN
                worst, worst_name = ratio if math.isfinite(ratio) else math.inf, name
        return worst <= 1.0, worst, worst_name

    def time_ms(self, fn, *, quick: bool = False) -> float:
        """A config's time: its launches' GPU time, from CUDA-graph replays
        (``protocol.graph_time_ms``). The runners' race times each runner this way and eagerly too."""
        return graph_time_ms(fn, self.device, quick=quick)

    def run(self, config, fault: int = 0, *, quick: bool = False) -> Outcome:
        """Check ``config`` against the reference, then time it (``quick``: a shorter
        do_bench, for screening many configs before the finalists are re-timed). A
        backward config with a dQ kernel also has that kernel timed alone (``dq_ms``)."""
        fn = self.launcher(config, fault)
        try:
            result = fn()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except Exception as e:  # noqa: BLE001 - every failure of a config is an outcome
            return classify(e)
        passed, worst, name = self.check(result)
        if not passed:
            return Outcome("incorrect", error=worst, message=f"{name} error is {worst:.3g}x the allowance")
        time_ms = self.time_ms(fn, quick=quick)
        dq_ms = None
        if self.key.pass_ == "bwd":
            dq_only = dq_kernel_alone(self.do, self.q, self.k, self.v, self.o_in, self.lse2_in, config,
                                      causal=self.key.causal, sm_scale=self.sm_scale)
            if dq_only is not None:
                dq_ms = self.time_ms(dq_only, quick=quick)
        return Outcome("ok", time_ms=time_ms, error=worst, dq_ms=dq_ms)

    def retime(self, configs: list, rounds: int) -> list[list[float]]:
        """Time each config once per round, interleaved, so drift hits them all alike."""
        fns = [self.launcher(c) for c in configs]
        times: list[list[float]] = [[] for _ in configs]
        for _ in range(rounds):
            for i, fn in enumerate(fns):
                times[i].append(self.time_ms(fn))
        return times

    # -- runners: the Triton winner against torch SDPA's backends (flashtune.runners) -----

    def _runner_fns(self, winner, fwd_config) -> tuple[dict, tuple]:
        """A no-argument callable per runner: the key's forward (fwd keys) or a training step,
        forward + backward through autograd (bwd keys); and the leaves whose gradients a
        training step fills. A step starts with the leaves' gradients unset, so each one writes
        them afresh (no accumulation), eager or replayed from a CUDA graph alike."""
        from flashtune.kernels import attention
        from flashtune.runners import SDPA_BACKENDS, sdpa

        causal, scale, gqa = self.key.causal, self.sm_scale, self.heads != self.heads_kv
        if self.key.pass_ == "fwd":
            fns = {"triton": self.launcher(winner)}
            for name in SDPA_BACKENDS:
                fns[name] = (lambda name=name: sdpa(name, self.q, self.k, self.v, is_causal=causal, scale=scale,
                                                    enable_gqa=gqa))
            return fns, ()
        q, k, v = leaves = tuple(t.detach().clone().requires_grad_(True) for t in (self.q, self.k, self.v))

        def step(run):
            def fn():
                for t in leaves:
                    t.grad = None
                run().backward(self.do)
            return fn

        fns = {"triton": step(lambda: attention(q, k, v, causal=causal, sm_scale=scale, fwd_config=fwd_config,
                                                bwd_config=winner, fp32_precision="tf32"))}
        for name in SDPA_BACKENDS:
            fns[name] = step(lambda name=name: sdpa(name, q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa))
        return fns, leaves

    def race(self, winner, fwd_config, rounds: int) -> dict:
        """Each runner's ``RunnerTime``: the medians over ``rounds`` interleaved rounds of its GPU
        time (CUDA-graph replays, as a trial is timed: ``time_ms``) and its eager time (plain calls
        back to back, the host included: ``protocol.eager_time_ms``); under the interpreter one
        wall-clock figure is both. None for an SDPA backend that cannot run the key or fails the
        correctness check (the same allowances as every trial). The Triton side is ``winner`` (a
        bwd key: with ``fwd_config``)."""
        import warnings

        from flashtune.protocol import eager_time_ms
        from flashtune.runners import RunnerTime

        fns, leaves = self._runner_fns(winner, fwd_config)
        usable = {}
        for name, fn in fns.items():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # SDPA warns for each reason a backend cannot run
                    out = fn()
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
            except RuntimeError:  # this backend does not run this shape, dtype or device
                continue
            if name != "triton":
                pairs = {"o": (out, self.o_ref)} if self.key.pass_ == "fwd" else \
                    {n: (t.grad, r) for n, t, r in zip(("dq", "dk", "dv"), leaves, self.grads_ref)}
                if not all(error_ratio(max_error(g, r), self.allowance[n]) <= 1.0 for n, (g, r) in pairs.items()):
                    continue
            usable[name] = fn
        gpu: dict[str, list[float]] = {name: [] for name in usable}
        eager: dict[str, list[float]] = {name: [] for name in usable}
        cuda = self.device.type == "cuda"
        for _ in range(rounds):
            for name, fn in usable.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    gpu[name].append(self.time_ms(fn))
                    # the interpreter's one wall-clock figure stands for both
                    eager[name].append(eager_time_ms(fn, self.device) if cuda else gpu[name][-1])
            for t in leaves:  # a replayed step's gradients live in its graph's memory: let go of them
                t.grad = None
        return {name: RunnerTime(statistics.median(gpu[name]), statistics.median(eager[name]))
                if name in usable and gpu[name] else None for name in fns}

    def describe(self) -> dict:
        return {"batch": self.batch, "heads": self.heads, "heads_kv": self.heads_kv, "flops": self.flops,
                "timer": "cuda-graph-replay" if self.device.type == "cuda" else "interpreter-wall-clock",
                "interpreter": INTERPRETER}
