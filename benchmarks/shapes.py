"""flashtune vs torch SDPA on the shapes models run (../shared/design/SHAPES.md), in one run.

Every row of SHAPES.md's realistic grid: training (forward and backward), prefill,
cross-attention and decode shapes, grouped-query heads included. For each row flashtune
(heuristic defaults, or the per-row configs of --configs) is first checked against an
fp32 reference and SDPA, then flashtune and SDPA's cuDNN, FlashAttention-2 and
memory-efficient backends (``enable_gqa=True``; one that refuses a shape says so) are
timed with triton.testing.do_bench medians over --rounds interleaved rounds (the
helpers of benchmarks/attention.py). Figures:

  forward FLOPs  = 4 * B * Hq * Nq * Nk * D, halved when causal with Nq = Nk
  backward FLOPs = 2.5 * forward; backward time = o.backward(do, retain_graph=True) alone
  decode rows: K/V bytes read (2 * B * Hkv * Nk * D * element size) per second, as a
               fraction of the copy bandwidth measured in the same run (read + write
               bytes of a 1 GiB device copy per second); and, on a second line ("clean
               L2"), the same with every call timed after the L2 is emptied by a read
               instead of do_bench's zero fill (time_clean_l2: the fill leaves the L2 full
               of dirty lines that a call reading ~100 MB pays to write back)

and, for each forward, flashtune's time when its launches replay from a CUDA graph
(``graph_ms``: the GPU's time without the host's; far below ``ms`` means host-bound).

    python benchmarks/shapes.py --out shapes.json
    python benchmarks/shapes.py --rows decode-b1-64k decode-b32-4k --configs decode.json
    python benchmarks/shapes.py --device cpu --tiny           # interpreter smoke test

--sweep FILE.json maps row names to lists of forward configs: each is checked against
SDPA and timed (flashtune alone, do_bench median) before the row, and the fastest correct
one is the row's forward config (unless --configs gives one); --sweep-out writes those
winners in --configs' format.

--db STORE measures a tuned store (``flashtune search --shapes`` over these rows) in the
same run: "flashtune" is then the row's stored Triton configs (the kernels' own figure, as
``explain()`` finds them), "default" the heuristic configs, "dropin" the call through
``get_tuned_attention(STORE)`` (SDPA's signature; the runner the search chose, the lookup
and the host's cost included), each row also naming the drop-in's choice. With --singles,
every Triton winner stored for a pass is also timed on every row of that pass (interleaved
with the row's tuned config, after a check against it), and the summary names the best
single config for all rows: the one of lowest geometric-mean time over the rows where
every candidate it is compared with runs (rows it cannot run are named).

--configs FILE.json maps row names to configs, e.g.
  {"decode-b1-64k": {"fwd": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3,
                             "num_splits": 32, "pack_gqa": 1}}}
(a row or pass without an entry uses the heuristic default).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys

# The interpreter is chosen when triton is imported: before flashtune's kernels are.
if "--device" in sys.argv[:-1] and sys.argv[sys.argv.index("--device") + 1].startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import attention as grid_bench  # noqa: E402  (benchmarks/attention.py: timing and check helpers)

from flashtune.protocol import time_clean_l2  # noqa: E402  (also imported from here by docs/data/*/ probes)
from flashtune.shapes import REALISTIC_GRID, Shape  # noqa: E402

BACKENDS = ("cudnn", "flash", "efficient")


SHAPES = list(REALISTIC_GRID)  # ../shared/design/SHAPES.md, in its order (flashtune.shapes)


def tiny(shape: Shape) -> Shape:
    """The same kind of shape at interpreter size: the grouping, head dim and masking
    kept, short sequences (decode keeps one query)."""
    hq = min(shape.heads_q, 4)
    hkv = max(1, hq * shape.heads_kv // shape.heads_q)
    n_q = 1 if shape.decode else min(shape.seq_q, 17)
    n_k = min(shape.seq_k, 40) if shape.seq_k != shape.seq_q else n_q
    return dataclasses.replace(shape, batch=1, heads_q=hq, heads_kv=hkv, seq_q=n_q, seq_k=n_k)


BY_NAME = {s.name: s for s in SHAPES}


@dataclasses.dataclass
class Result:
    name: str
    pass_: str
    shape: dict
    flops: float
    ms: dict = dataclasses.field(default_factory=dict)  # backend -> median ms over the rounds (None: failed)
    rounds_ms: dict = dataclasses.field(default_factory=dict)
    tflops: dict = dataclasses.field(default_factory=dict)
    copy_fraction: dict = dataclasses.field(default_factory=dict)  # decode rows: K/V read rate / copy bandwidth
    clean_ms: dict = dataclasses.field(default_factory=dict)  # decode rows: time_clean_l2 medians
    clean_fraction: dict = dataclasses.field(default_factory=dict)  # ... as a fraction of its copy bandwidth
    graph_ms: float | None = None  # flashtune forward replayed from a CUDA graph
    config: dict | None = None
    config_source: str = "default"
    schedule: str | None = None  # the split kernel's schedule, when it runs
    check: dict = dataclasses.field(default_factory=dict)
    error: str | None = None
    choice: str | None = None  # --db: the drop-in's explain() for the row's call
    singles_ms: dict = dataclasses.field(default_factory=dict)  # --singles: config label -> ms (None: cannot run)
    singles_tuned_ms: float | None = None  # the tuned config, timed interleaved with the singles
    singles_timer: str | None = None  # "eager" or "cuda-graph replay" (--graph-singles)

    def best_sdpa(self) -> tuple[str | None, float | None]:
        timed = [(self.tflops[b], b) for b in BACKENDS if self.tflops.get(b)]
        if not timed:
            return None, None
        t, b = max(timed)
        return b, t

    def ratios(self) -> dict:
        ft = self.tflops.get("flashtune")
        out = {b: grid_bench.ratio(ft, self.tflops.get(b)) for b in BACKENDS}
        out["best"] = grid_bench.ratio(ft, self.best_sdpa()[1])
        out["dropin"] = grid_bench.ratio(self.tflops.get("dropin"), self.best_sdpa()[1])
        out["vs_default"] = grid_bench.ratio(ft, self.tflops.get("default"))
        return out


def load_sweep(path: str | None) -> dict:
    if path is None:
        return {}
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise SystemExit(f"--sweep {path}: expected an object mapping row names to lists of forward configs")
    unknown = sorted(set(data) - set(BY_NAME))
    if unknown:
        raise SystemExit(f"--sweep {path}: unknown rows {unknown}")
    return data


def load_configs(path: str | None) -> dict:
    if path is None:
        return {}
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise SystemExit(f"--configs {path}: expected an object mapping row names to {{'fwd': ..., 'bwd': ...}}")
    for name, entry in data.items():
        if name not in BY_NAME:
            raise SystemExit(f"--configs {path}: unknown row {name!r}; rows: {', '.join(BY_NAME)}")
        if not isinstance(entry, dict) or set(entry) - {"fwd", "bwd"}:
            raise SystemExit(f"--configs {path}: row {name!r}: expected {{'fwd': {{...}}, 'bwd': {{...}}}}")
    return data


def _fmt(x, spec: str) -> str:
    return format("n/a", ">" + spec.split(".")[0]) if x is None else format(x, spec)


HEADER = (f"{'row':<26} {'pass':<4} | {'flashtune':>9} {'cuDNN':>7} {'FA2':>7} {'effic':>7} | "
          f"{'ft/best':>7} {'ft/cuDNN':>8} {'ft/FA2':>7} | {'graph':>6}  config")


def format_result(r: Result) -> str:
    head = f"{r.name:<26} {r.pass_:<4} | "
    if r.error:
        return head + f"ABORTED: {r.error}"
    rat = r.ratios()
    if r.copy_fraction:  # decode: fractions of the copy bandwidth
        c = r.copy_fraction
        figures = (f"{_fmt(c.get('flashtune'), '9.2f')} {_fmt(c.get('cudnn'), '7.2f')} {_fmt(c.get('flash'), '7.2f')} "
                   f"{_fmt(c.get('efficient'), '7.2f')}")
    else:
        t = r.tflops
        figures = (f"{_fmt(t.get('flashtune'), '9.1f')} {_fmt(t.get('cudnn'), '7.1f')} {_fmt(t.get('flash'), '7.1f')} "
                   f"{_fmt(t.get('efficient'), '7.1f')}")
    graph = _fmt(None if r.graph_ms is None or not r.ms.get("flashtune") else r.graph_ms / r.ms["flashtune"], "6.2f")
    cfg = " ".join(f"{k}={v}" for k, v in (r.config or {}).items())
    sched = f" [{r.schedule}]" if r.schedule else ""
    ratios = f"{_fmt(rat['best'], '7.3f')} {_fmt(rat['cudnn'], '8.3f')} {_fmt(rat['flash'], '7.3f')}"
    return head + (f"{figures} | {ratios} | "
                   f"{graph}  {r.config_source}: {cfg}{sched}")


def format_clean(r: Result) -> str:
    """Decode rows: the clean-L2 figures, under the row's line."""
    c = r.clean_fraction
    best = max((c[b] for b in BACKENDS if c.get(b)), default=None)
    return (f"{'':<26} {'':<4}   clean L2: {_fmt(c.get('flashtune'), '9.2f')} {_fmt(c.get('cudnn'), '7.2f')} "
            f"{_fmt(c.get('flash'), '7.2f')} {_fmt(c.get('efficient'), '7.2f')} | "
            f"{_fmt(grid_bench.ratio(c.get('flashtune'), best), '7.3f')} of best SDPA")


def format_dropin(r: Result) -> str:
    """--db: the drop-in's figure and its choice for the row, under the row's line."""
    rat = r.ratios()
    choice = " / ".join(line.strip() for line in (r.choice or "").splitlines())
    return (f"{'':<26} {'':<4}   drop-in / best SDPA {_fmt(rat['dropin'], '.3f')}; tuned Triton / default "
            f"{_fmt(rat['vs_default'], '.3f')}; serves: {choice}")


def load_singles(db: str, device) -> dict:
    """--singles: each pass's distinct stored Triton winners of this GPU."""
    from flashtune.keys import GpuInfo
    from flashtune.store import ResultFilter, Store

    gpu = GpuInfo.from_device(device)
    with Store(db, create=False) as store:
        rows = store.list_results(ResultFilter(gpu=gpu.key))
    out = {p: list(dict.fromkeys(r.config for r in rows if r.key.pass_ == p)) for p in ("fwd", "bwd")}
    print(f"# singles: {len(out['fwd'])} forward and {len(out['bwd'])} backward winners of {db}")
    return out


def summarize(results: list[Result]) -> dict:
    """Geometric means of flashtune / best SDPA and / FA2, per pass, decode rows apart."""
    out = {}
    for pass_ in ("fwd", "bwd"):
        for group, sel in (("non-decode", lambda r: not BY_NAME[r.name].decode), ("decode", lambda r: BY_NAME[
                r.name].decode), ("all", lambda r: True)):
            rows = [r for r in results if r.pass_ == pass_ and not r.error and sel(r)]
            if rows:
                out[f"{pass_} {group}"] = {"best": grid_bench.geomean(r.ratios()["best"] for r in rows),
                                           "flash": grid_bench.geomean(r.ratios()["flash"] for r in rows),
                                           "cudnn": grid_bench.geomean(r.ratios()["cudnn"] for r in rows),
                                           "rows": len(rows)}
                dropin = [r.ratios()["dropin"] for r in rows if r.ratios()["dropin"]]
                if dropin:
                    out[f"{pass_} {group}"].update(
                        dropin=grid_bench.geomean(dropin), dropin_min=min(dropin),
                        vs_default=grid_bench.geomean(r.ratios()["vs_default"] for r in rows))
    return out


# ----------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------
def copy_bandwidth(device, time_one, nbytes: int) -> float:
    """Bytes per second of a device copy (read + write), ``time_one(fn)`` in ms."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_one(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)


_sdpa = grid_bench._sdpa  # one backend, selected as the drop-in's SDPA runners select it


def _graph_ms(fn, device, *, grad: bool = False) -> float | None:
    """do_bench median of ``fn`` replayed from a CUDA graph (no host work per launch);
    ``grad``: captured with autograd on (a backward)."""
    import contextlib

    import torch
    import triton

    from flashtune.protocol import capture_graph

    if device.type != "cuda":
        return None
    try:
        with contextlib.nullcontext() if grad else torch.no_grad():
            graph = capture_graph(fn, device)
        return float(triton.testing.do_bench(graph.replay, return_mode="median"))
    except Exception as e:  # noqa: BLE001 - a figure we can do without
        print(f"  CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
        return None


def _graph_pass_ms(run, pass_: str, q, k, v, do, causal: bool) -> float | None:
    """One pass of ``run`` replayed from a CUDA graph: the forward, or the backward alone
    (``o.backward(do)`` captured after an eager forward); None when the capture fails."""
    if pass_ == "fwd":
        return _graph_ms(lambda: run(q, k, v, causal), q.device)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = run(*leaves, causal)
    return _graph_ms(lambda: o.backward(do, retain_graph=True), q.device, grad=True)


def _precompile(candidates: list[dict], q, k, v, causal: bool) -> None:
    """Compile the candidates' kernels in parallel (triton's AsyncCompileMode), so the
    sweep's launches hit the cache; failures recur, reported, at the launch."""
    import concurrent.futures
    import contextlib

    from flashtune.kernels import FwdConfig, attention_forward

    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # an older triton: the launches compile one by one
        return
    with concurrent.futures.ThreadPoolExecutor(max(1, min(32, os.cpu_count() or 1))) as pool, \
            AsyncCompileMode(pool, ignore_errors=True):
        for given in candidates:
            with contextlib.suppress(Exception):
                attention_forward(q, k, v, FwdConfig.from_dict(given), causal=causal, sm_scale=q.shape[-1] ** -0.5,
                                  compile_only=True)


def sweep_row(args, shape: Shape, candidates: list[dict], device) -> tuple[dict | None, list[dict]]:
    """(the fastest correct forward config of ``candidates`` on this row, or None; every
    candidate's figures). Correct: relative error of O against SDPA's output below 2 %."""
    import torch

    from flashtune.kernels import FwdConfig, attention
    from flashtune.kernels.config import ConfigError

    s = shape
    dtype = getattr(torch, grid_bench.DTYPES[args.dtype]) if device.type == "cuda" else torch.float16
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(s.batch, s.heads_q, s.seq_q, s.head_dim, device=device, dtype=dtype, generator=gen)
    k, v = (torch.randn(s.batch, s.heads_kv, s.seq_k, s.head_dim, device=device, dtype=dtype, generator=gen)
            for _ in range(2))
    with torch.no_grad():
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=s.causal, enable_gqa=True).float()
    if device.type == "cuda":
        _precompile(candidates, q, k, v, s.causal)
    figures, best = [], None
    for given in candidates:
        row = {"config": given}
        try:
            cfg = FwdConfig.from_dict(given).validate(s.head_dim, dtype, device)
            with torch.no_grad():
                got = attention(q, k, v, causal=s.causal, fwd_config=cfg)
                row["rel_err"] = ((got.float() - want).norm() / want.norm()).item()
                if not row["rel_err"] < 0.02:
                    raise AssertionError(f"relative error {row['rel_err']:.3g}")
                from flashtune.protocol import time_ms

                row["ms"] = time_ms(lambda cfg=cfg: attention(q, k, v, causal=s.causal, fwd_config=cfg), device,
                                    quick=True)
        except (ConfigError, AssertionError, Exception) as e:  # noqa: BLE001 - each failure is a finding
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        figures.append(row)
        if "ms" in row and (best is None or row["ms"] < best["ms"]):
            best = row
        extra = f"{row['ms']:.4f} ms" if "ms" in row else row["error"]
        print(f"  sweep {s.name}: {' '.join(f'{k}={v}' for k, v in given.items())}: {extra}", flush=True)
    return (None if best is None else best["config"]), figures


def bench_row(args, shape: Shape, entries: dict, copy_bw: float, singles: dict | None = None,
              clean_copy_bw: float | None = None) -> list[Result]:
    import torch
    from torch.nn.attention import SDPBackend

    from flashtune.kernels import BwdConfig, FwdConfig, attention
    from flashtune.kernels.decode import plan_schedule
    from flashtune.kernels.function import resolve_configs

    device = torch.device(args.device)
    dtype = getattr(torch, grid_bench.DTYPES[args.dtype]) if device.type == "cuda" else torch.float16
    gen = torch.Generator(device=device).manual_seed(0)
    s = shape

    def rand(h, n):
        return torch.randn(s.batch, h, n, s.head_dim, device=device, dtype=dtype, generator=gen)

    q, k, v, do = rand(s.heads_q, s.seq_q), rand(s.heads_kv, s.seq_k), rand(s.heads_kv, s.seq_k), rand(s.heads_q,
                                                                                                            s.seq_q)
    given = entries.get(s.name, {})
    fwd = FwdConfig.from_dict(given["fwd"]) if "fwd" in given else None
    bwd = BwdConfig.from_dict(given["bwd"]) if "bwd" in given else None
    sources = {p: "file" if p in given else "default" for p in ("fwd", "bwd")}
    gqa = s.heads_q != s.heads_kv
    dropin = choice = None
    if args.db:  # the store's configs, as the drop-in finds them for this call
        from flashtune import get_tuned_attention

        dropin = get_tuned_attention(args.db, device=device)
        choice = dropin.explain(q, k, v, is_causal=s.causal, enable_gqa=gqa)
        if fwd is None and choice.fwd_config is not None and choice.fwd_source.startswith("tuned"):
            fwd, sources["fwd"] = choice.fwd_config, choice.fwd_source
        if bwd is None and choice.bwd_config is not None and choice.bwd_source.startswith("tuned"):
            bwd, sources["bwd"] = choice.bwd_config, choice.bwd_source
    default_fwd, default_bwd = resolve_configs(q, None, None, s.causal, seq_k=s.seq_k, heads_kv=s.heads_kv)
    fwd, bwd = resolve_configs(q, fwd, bwd, s.causal, seq_k=s.seq_k, heads_kv=s.heads_kv)
    plan = plan_schedule(fwd, s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, device)
    schedule = None if plan is None else \
        (f"split kernel: {plan.splits} chunks of {plan.chunk} keys, "
         f"{'packed ' if plan.pack else ''}{plan.block_m}-row tiles")

    def flashtune(q, k, v, causal):
        return attention(q, k, v, causal=causal, fwd_config=fwd, bwd_config=bwd)

    runners = {"flashtune": flashtune}
    if dropin is not None:
        runners["default"] = lambda q, k, v, causal: attention(q, k, v, causal=causal, fwd_config=default_fwd,
                                                                bwd_config=default_bwd)
        runners["dropin"] = lambda q, k, v, causal: dropin(q, k, v, is_causal=causal, enable_gqa=gqa)
    if device.type == "cuda":
        runners.update(cudnn=_sdpa(SDPBackend.CUDNN_ATTENTION), flash=_sdpa(SDPBackend.FLASH_ATTENTION),
                       efficient=_sdpa(SDPBackend.EFFICIENT_ATTENTION))
    else:  # the interpreter: SDPA's math backend stands in for the GPU ones
        runners.update(cudnn=_sdpa(SDPBackend.MATH))

    results = {p: Result(s.name, p, dataclasses.asdict(s), s.flops(p),
                         config=(fwd if p == "fwd" else bwd).to_dict(), config_source=sources[p],
                         schedule=schedule if p == "fwd" else None,
                         choice=None if choice is None else str(choice)) for p in s.passes}
    # correctness first: against the fp32 reference on one (batch, head) and the whole
    # tensors against the first SDPA backend that runs the shape
    check, errors = None, []
    for name in [b for b in runners if b in BACKENDS]:
        try:
            check = grid_bench.check_against_cudnn(flashtune, runners[name], q, k, v, do, s.causal)
            check["against"] = name
            if dropin is not None:  # what the drop-in serves is checked the same way
                check["dropin"] = grid_bench.check_against_cudnn(runners["dropin"], runners[name], q, k, v, do,
                                                                 s.causal)
            break
        except AssertionError as e:
            errors.append(f"flashtune disagrees with {name}: {e}")
            break
        except Exception as e:  # noqa: BLE001 - that backend cannot run the shape: try the next
            errors.append(f"{name}: {type(e).__name__}")
    if check is None:
        for r in results.values():
            r.error = "; ".join(errors) or "no backend to check against"
        return list(results.values())
    if device.type == "cuda":
        torch.cuda.empty_cache()

    def time_one(run, pass_):
        if device.type != "cuda":
            from flashtune.protocol import time_ms

            if pass_ == "fwd":
                with torch.no_grad():
                    return time_ms(lambda: run(q, k, v, s.causal), device)
            leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
            o = run(*leaves, s.causal)
            return time_ms(lambda: o.backward(do, retain_graph=True), device)
        return grid_bench.time_pass(run, pass_, q, k, v, do, s.causal, warmup=args.warmup, rep=args.rep)

    timed = grid_bench.time_rounds(runners, list(s.passes), args.rounds, time_one, max_rounds=args.max_rounds)
    for (name, pass_), times in timed.items():
        r = results[pass_]
        r.check = check
        r.rounds_ms[name] = times
        r.ms[name] = statistics.median(times) if times else None
        r.tflops[name] = grid_bench.tflops(r.flops, r.ms[name])
        if s.decode and r.ms[name]:
            r.copy_fraction[name] = s.kv_bytes() / (r.ms[name] * 1e-3) / copy_bw
    if s.decode and clean_copy_bw and "fwd" in results:
        r = results["fwd"]
        for name, run in runners.items():
            if r.ms.get(name):
                with torch.no_grad():
                    r.clean_ms[name] = time_clean_l2(lambda: run(q, k, v, s.causal), device)
                r.clean_fraction[name] = s.kv_bytes() / (r.clean_ms[name] * 1e-3) / clean_copy_bw
    if "fwd" in results:
        results["fwd"].graph_ms = _graph_ms(lambda: flashtune(q, k, v, s.causal), device)
    for pass_, candidates in (singles or {}).items():
        if pass_ in results:
            time_singles(args, results[pass_], candidates, (fwd, bwd), q, k, v, do, s.causal, time_one)
    return list(results.values())


def time_singles(args, result: Result, candidates: list, tuned: tuple, q, k, v, do, causal: bool, time_one) -> None:
    """Each candidate config of ``result``'s pass on this row: refused by ``validate()``, or
    failing, or disagreeing with the row's (checked) tuned config by over 2 % relative error
    gives None; the others are timed interleaved with the tuned config over --rounds. With
    --graph-singles, where the tuned config's launches capture in a CUDA graph, every config
    of the row is timed by graph replay (the GPU's time without the host's) and one that does
    not capture gives None, so a row never compares the two timers; ``result.singles_timer``
    says which ran."""
    import torch

    from flashtune.kernels import ConfigError, attention

    def run_with(cfg):
        f, b = (cfg, tuned[1]) if result.pass_ == "fwd" else (tuned[0], cfg)
        return lambda q, k, v, causal: attention(q, k, v, causal=causal, fwd_config=f, bwd_config=b)

    def outputs(run):
        leaves = [x.detach().clone().requires_grad_(result.pass_ == "bwd") for x in (q, k, v)]
        o = run(*leaves, causal)
        return [o] if result.pass_ == "fwd" else list(torch.autograd.grad(o, leaves, do))

    want = outputs(run_with(tuned[0] if result.pass_ == "fwd" else tuned[1]))
    runners = {"tuned": run_with(tuned[0] if result.pass_ == "fwd" else tuned[1])}
    for cfg in candidates:
        label = cfg.short()
        result.singles_ms[label] = None
        try:
            cfg.validate(q.shape[-1], q.dtype, q.device)
            got = outputs(run_with(cfg))
        except (ConfigError, RuntimeError, ValueError) as e:
            print(f"  single {label} on {result.name} {result.pass_}: cannot run ({type(e).__name__})",
                  file=sys.stderr)
            continue
        errs = [grid_bench._rel(a, b) for a, b in zip(got, want)]
        if not all(e <= 0.02 for e in errs):  # NaN fails too
            print(f"  single {label} on {result.name} {result.pass_}: disagrees with the tuned config "
                  f"({max(errs):.3g} relative error)", file=sys.stderr)
            continue
        runners[label] = run_with(cfg)
    del want
    timer, result.singles_timer = time_one, "eager"
    if args.graph_singles and _graph_pass_ms(runners["tuned"], result.pass_, q, k, v, do, causal) is not None:
        def timer(run, pass_):
            ms = _graph_pass_ms(run, pass_, q, k, v, do, causal)
            if ms is None:  # time_rounds leaves this config out of the row
                raise RuntimeError("CUDA graph capture failed")
            return ms

        result.singles_timer = "cuda-graph replay"
    timed = grid_bench.time_rounds(runners, [result.pass_], args.rounds, timer, max_rounds=args.max_rounds)
    for (label, _), times in timed.items():
        ms = statistics.median(times) if times else None
        if label == "tuned":
            result.singles_tuned_ms = ms
        else:
            result.singles_ms[label] = ms


def best_single(results: list[Result], pass_: str) -> dict | None:
    """The single config of lowest geometric-mean time over the rows of ``pass_`` where it
    runs; candidates are compared over the rows every one of them runs, and a config that
    cannot run a row is named with it."""
    rows = [r for r in results if r.pass_ == pass_ and not r.error and r.singles_tuned_ms]
    if not rows:
        return None
    labels = list(dict.fromkeys(label for r in rows for label in r.singles_ms))
    if not labels:  # the store has no other winner of the pass to compare (a pass with one tuned key)
        return None
    runs_all = [lb for lb in labels if all(r.singles_ms.get(lb) for r in rows)]
    if runs_all:
        pool, common = runs_all, rows
    else:  # no candidate runs every row: compare them over the rows all of the most widely usable run
        width = max(sum(1 for r in rows if r.singles_ms.get(lb)) for lb in labels)
        pool = [lb for lb in labels if sum(1 for r in rows if r.singles_ms.get(lb)) == width]
        common = [r for r in rows if all(r.singles_ms.get(lb) for lb in pool)]
    best = min(pool, key=lambda lb: grid_bench.geomean(r.singles_ms[lb] / r.singles_tuned_ms for r in common))
    per_row = {r.name: (r.singles_ms[best] / r.singles_tuned_ms if r.singles_ms.get(best) else None) for r in rows}
    return {"config": best, "rows": len(common), "of_rows": len(rows),
            "cannot_run": sorted(n for n, x in per_row.items() if x is None),
            "tuned_vs_single": grid_bench.geomean(x for x in per_row.values() if x),
            "per_row": per_row, "runs_every_row": bool(runs_all)}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", metavar="NAME", choices=list(BY_NAME), help="only these rows")
    ap.add_argument("--passes", nargs="+", choices=["fwd", "bwd"], default=["fwd", "bwd"],
                    help="only these passes of the rows (a row with none of them is left out)")
    ap.add_argument("--configs", metavar="FILE.json", help="flashtune configs per row (see above)")
    ap.add_argument("--sweep", metavar="FILE.json", help="forward configs to sweep per row (see above)")
    ap.add_argument("--sweep-out", metavar="FILE.json", help="write the sweep's winners in --configs' format")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"], help="input dtype on the GPU (default bf16)")
    ap.add_argument("--out", metavar="FILE.json", help="write the environment and every row as JSON")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warmup (ms)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds per row (default 3 on a GPU, 1 under the interpreter)")
    ap.add_argument("--max-rounds", type=int, default=None,
                    help="more rounds, up to this many, while a runner's rounds disagree (half or more of them "
                         "over 1.15x its fastest: a busy moment of the host; default 2 x --rounds + 1 on a GPU)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for the interpreter (fp16; implies --tiny)")
    ap.add_argument("--tiny", action="store_true", help="interpreter-sized versions of the rows")
    ap.add_argument("--db", metavar="STORE", help="a tuned store: its configs, and the drop-in on it (see above)")
    ap.add_argument("--singles", action="store_true",
                    help="with --db: time every stored Triton winner of a pass on every row of it (see above)")
    ap.add_argument("--graph-singles", action="store_true",
                    help="with --singles: time them (and the row's tuned config) from CUDA-graph replays, the "
                         "GPU's time alone: on short rows the eager times are the host's")
    args = ap.parse_args(argv)
    if args.singles and not args.db:
        ap.error("--singles: needs --db (the store whose winners are the candidates)")
    if args.graph_singles and not args.singles:
        ap.error("--graph-singles: needs --singles")
    cpu = args.device.startswith("cpu")
    args.tiny = args.tiny or cpu
    if args.rounds is None:
        args.rounds = 1 if cpu else 3
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive number of rounds, got {args.rounds}")
    if args.max_rounds is None:
        args.max_rounds = args.rounds if cpu else 2 * args.rounds + 1
    if args.max_rounds < args.rounds:
        ap.error(f"--max-rounds: expected at least --rounds ({args.rounds}), got {args.max_rounds}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/shapes.py needs a CUDA GPU, or --device cpu for the interpreter", file=sys.stderr)
        return 2
    entries = load_configs(args.configs)
    sweep = load_sweep(args.sweep)
    shapes = [BY_NAME[n] for n in args.rows] if args.rows else SHAPES
    shapes = [dataclasses.replace(s, passes=tuple(p for p in s.passes if p in args.passes))
              for s in shapes if set(s.passes) & set(args.passes)]
    if args.tiny:
        shapes = [tiny(s) for s in shapes]
    if device.type == "cuda":
        env = grid_bench.environment()
        print(f"# {env['gpu']} sm_{env['capability'][0]}{env['capability'][1]}, torch {env['torch']}, "
              f"triton {env['triton']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, driver {env['driver']}, "
              f"{env['date']}")
        import triton

        from flashtune.protocol import warm_up_gpu

        warm_up_gpu(device)  # the copy bandwidth is the first figure: timed with the clocks up
        copy_bw = copy_bandwidth(device, lambda fn: triton.testing.do_bench(fn, return_mode="median"), 1 << 30)
        clean_copy_bw = copy_bandwidth(device, lambda fn: time_clean_l2(fn, device), 1 << 30)
        print(f"# copy bandwidth with a clean L2 (time_clean_l2): {clean_copy_bw / 1e12:.2f} TB/s")
    else:
        clean_copy_bw = None
        env = {"device": "cpu", "timer": "interpreter-wall-clock"}
        from flashtune.protocol import time_ms

        copy_bw = copy_bandwidth(device, lambda fn: time_ms(fn, device), 1 << 22)
    print(f"# dtype {args.dtype if device.type == 'cuda' else 'float16'}; copy bandwidth {copy_bw / 1e12:.2f} TB/s "
          f"(read + write); TFLOPS (decode rows: K/V read rate / copy bandwidth) from "
          f"{'do_bench medians' if device.type == 'cuda' else 'the interpreter wall clock: not GPU performance'}; "
          f"flashtune configs: {args.configs or 'heuristic defaults'}; graph: CUDA-graph time / time")
    print(HEADER, flush=True)
    singles = load_singles(args.db, device) if args.singles else None
    results: list[Result] = []
    swept, winners, swept_configs = {}, {}, set()
    for shape in shapes:
        if shape.name in sweep:
            best, swept[shape.name] = sweep_row(args, shape, sweep[shape.name], device)
            if best is not None:
                winners[shape.name] = {"fwd": best}
                if "fwd" not in entries.get(shape.name, {}):
                    entries.setdefault(shape.name, {})["fwd"] = best
                    swept_configs.add(shape.name)
        for r in bench_row(args, shape, entries, copy_bw, singles, clean_copy_bw):
            if r.pass_ == "fwd" and shape.name in swept_configs:
                r.config_source = "sweep"
            results.append(r)
            print(format_result(r), flush=True)
            if r.clean_fraction:
                print(format_clean(r), flush=True)
            if args.db and not r.error:
                print(format_dropin(r), flush=True)
    summary = summarize(results)
    for key, sm in summary.items():
        print(f"geomean flashtune / best SDPA, {key}: {_fmt(sm['best'], '.3f')}  (/ FA2 {_fmt(sm['flash'], '.3f')}, "
              f"/ cuDNN {_fmt(sm['cudnn'], '.3f')}; {sm['rows']} rows)")
        if "dropin" in sm:
            print(f"  drop-in / best SDPA, {key}: geomean {_fmt(sm['dropin'], '.3f')}, lowest "
                  f"{_fmt(sm['dropin_min'], '.3f')}; tuned Triton / default: {_fmt(sm['vs_default'], '.3f')}")
    if singles is not None:
        summary["best_single"] = {p: best_single(results, p) for p in singles}
        for p, b in summary["best_single"].items():
            if b:
                print(f"best single Triton config, {p}: {b['config']} (over {b['rows']} of {b['of_rows']} rows"
                      f"{'; cannot run ' + ', '.join(b['cannot_run']) if b['cannot_run'] else ''}); "
                      f"per-row tuning / it: geomean {b['tuned_vs_single']:.3f}")
    aborted = [r for r in results if r.error]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "args": vars(args), "copy_bandwidth": copy_bw,
                       "copy_bandwidth_clean_l2": clean_copy_bw,
                       "rows": [dataclasses.asdict(r) for r in results], "summary": summary, "sweep": swept},
                      f, indent=1)
        print(f"# wrote {args.out}")
    if args.sweep_out:
        with open(args.sweep_out, "w") as f:
            json.dump(winners, f, indent=1)
    if aborted:
        print(f"WARNING: {len(aborted)} rows aborted: flashtune's output was wrong or failed", file=sys.stderr)
    return 1 if aborted else 0


if __name__ == "__main__":
    sys.exit(main())
