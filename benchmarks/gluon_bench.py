"""What benchmarks/gluon_fwd.py, gluon_bwd.py and gluon_profile.py share: the GPU check and
the run's environment line, the shape lists and a row's inputs, the interleaved timing rounds, the per-row ratios
and line, and the geometric-mean summary.

Not a script: the benchmarks import it (``python benchmarks/gluon_fwd.py`` puts
benchmarks/ first on the import path).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import statistics

import torch
import triton

from flashtune.protocol import GRID_SEQ_LENS, geomean, grid_shape, time_clean_l2


def sm90_run(dtype_name: str) -> tuple[torch.dtype, str]:
    """(dtype, the environment line, printed) for a run on an sm_90 GPU; SystemExit elsewhere."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("needs an sm_90 GPU (H100/H200)")
    env = (f"{datetime.date.today()} {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
           f"{triton.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, {dtype_name}")
    print(env)
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name], env


def with_flag(module, name: str, value, fn):
    """``fn()`` with ``module.name`` set to ``value`` (a kernel module's switch, read at each
    launch: gluon_forward.FMA_SOFTMAX, gluon_backward.COMPACT_STATS), restored after."""
    return with_flags(module, {name: value}, fn)


def with_flags(module, values: dict, fn):
    """``fn()`` with each of ``module``'s switches named in ``values`` set, restored after."""
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        return fn()
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


# a 0/1 field's or switch's choice on the command line -> its values (None: as the configs or module have it)
ON_OFF = {"default": None, "off": (0, ), "on": (1, ), "both": (0, 1)}


def int_axes(ap, option: str, items: list[str], known) -> list[tuple[str, list[int]]]:
    """``NAME=V[,V...]`` arguments of ``option`` as (name, integer values), in order; ``ap.error``
    names a name ``known(name)`` refuses (it returns the error's text, None for a known one) or
    values that are not integers."""
    axes = []
    for item in items:
        name, _, values = item.partition("=")
        refused = known(name)
        if refused:
            ap.error(f"{option}: {refused}")
        try:
            axes.append((name, [int(v) for v in values.split(",")]))
        except ValueError:
            ap.error(f"{option}: expected {name}=V[,V...] with integer values, got {item!r}")
    return axes


def combinations(axes: list[tuple[str, list]]) -> list[dict]:
    """Every combination of the axes' values, one dict per combination ([{}] for none)."""
    return [dict(zip([name for name, _ in axes], combo)) for combo in itertools.product(*(v for _, v in axes))]


def switch_values(ap, module, items: list[str]) -> list[dict]:
    """``--switch NAME=V[,V...]`` arguments (integer values of ``module``'s upper-case switches)
    as every combination of them, one dict per combination ([{}] for none); ``ap.error`` names
    a bad one."""
    def current(name):  # a dict: values by launch kind, an int sets every launch's
        return getattr(module, name, None)

    def known(name):
        if name.upper() != name or not isinstance(current(name), (bool, int, dict)):
            return f"{module.__name__} has no switch {name!r}"
        return None

    axes = []
    for name, parsed in int_axes(ap, "--switch", items, known):
        kind = int if isinstance(current(name), dict) else type(current(name))
        if kind is bool and set(parsed) - {0, 1}:
            ap.error(f"--switch: {name} is on or off, expected values of 0 and 1, got "
                     f"{','.join(map(str, parsed))!r}")
        axes.append((name, [kind(v) for v in parsed]))
    return combinations(axes)


def switch_tag(flags: dict, items: list[str]) -> str:
    """The label suffix of one combination: `` NAME=V`` for each switch given several values."""
    multi = {item.partition("=")[0] for item in items if "," in item}
    return "".join(f" {name}={int(value)}" for name, value in flags.items() if name in multi)


def row_inputs(B, Hq, Hkv, Nq, Nk, D, dtype, with_do: bool = False) -> tuple:
    """A shape row's q, k, v (and dO), random from seed 0 on the GPU, in that order."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    if not with_do:
        return q, k, v
    return q, k, v, torch.randn(B, Hq, Nq, D, device="cuda", dtype=dtype, generator=gen)


def shapes(args, large: list[tuple], *, min_seq_k: int = 1, head_dims: tuple = (64, 128)) -> list[tuple]:
    """(name, B, Hq, Hkv, Nq, Nk, D, causal or None for both): the standard grid at D 64/128
    (``--grid``), SHAPES.md's rows of ``head_dims`` with Nq >= 1024 and Nk >= ``min_seq_k``
    (``--realistic``) and any other SHAPES.md row of ``head_dims`` that ``--rows`` names (decode
    rows excepted), else ``large``."""
    out = list(getattr(args, "shape", None) or [])  # --shape's rows first (add_shape_arg)
    if args.grid:
        for d in (64, 128):
            for n in GRID_SEQ_LENS:
                b, h = grid_shape(d, n)
                out.append((f"grid-d{d}-{n}", b, h, h, n, n, d, None))
    from flashtune.shapes import REALISTIC_GRID

    named = set(args.rows.split(",")) if getattr(args, "rows", None) else set()
    for s in REALISTIC_GRID:
        bulk = args.realistic and s.head_dim in head_dims and s.seq_q >= 1024 and s.seq_k >= min_seq_k
        # --rows names any SHAPES.md row of these head dims, the short ones (gpt2, bert, vit) too
        if bulk or (s.name in named and s.head_dim in head_dims and s.seq_q > 1):
            out.append((s.name, s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim, s.causal))
    return out or large


def parse_shape(text: str) -> tuple:
    """--shape's B,Hq,Hkv,Nq,Nk,D[,causal|full] as a shapes() row, named after its numbers (no
    masking given: both)."""
    parts = text.split(",")
    try:
        if len(parts) not in (6, 7):
            raise ValueError("expected 6 numbers and an optional causal or full")
        B, Hq, Hkv, Nq, Nk, D = (int(x) for x in parts[:6])
        if min(B, Hq, Hkv, Nq, Nk, D) < 1 or Hq % Hkv:
            raise ValueError("expected positive sizes and Hq a multiple of Hkv")
        masks = {"causal": True, "full": False, None: None}
        mask = parts[6] if len(parts) == 7 else None
        if mask not in masks:
            raise ValueError(f"expected causal or full last, got {mask!r}")
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: {e} (B,Hq,Hkv,Nq,Nk,D[,causal|full])") from None
    return f"{B}x{Hq}x{Hkv}-{Nq}x{Nk}-d{D}", B, Hq, Hkv, Nq, Nk, D, masks[mask]


def add_shape_arg(ap) -> None:
    """The benchmarks' --shape option: rows of any size, beside --grid's and SHAPES.md's."""
    ap.add_argument("--shape", action="append", type=parse_shape, metavar="B,Hq,Hkv,Nq,Nk,D[,causal|full]",
                    help="a row of these sizes (repeatable; named B x Hq x Hkv - Nq x Nk - dD; both maskings "
                         "unless one is given); --rows does not filter these")


def wanted_rows(args) -> set | None:
    """The row names a benchmark runs: --rows' and --shape's, or None (every row of shapes())."""
    if not args.rows:
        return None
    return set(args.rows.split(",")) | {row[0] for row in getattr(args, "shape", None) or []}


TIMERS = ("cushioned", "do_bench")
CUSHION_CYCLES = 400_000  # about 0.2 ms at the H200's clock: longer than a bare Gluon launch's host time


def cushioned_ms(fn, rep: float) -> float:
    """Median GPU time (ms) of ``fn`` over about ``rep`` ms of calls, each after an L2-emptying
    read and a 0.2 ms device sleep (protocol.time_clean_l2 with a cushion): a launcher's host
    time (descriptors, validation, Python) is not counted, as it is not in a model's queued
    steps. triton's do_bench counts it wherever it outlasts its L2 flush: measured on the H200,
    a 0.15 ms kernel read as 0.15 or 0.29 ms by run."""
    device = torch.device("cuda", torch.cuda.current_device())
    return time_clean_l2(fn, device, rep=rep, cushion_cycles=CUSHION_CYCLES)


def host_us(fn, calls: int = 50) -> float:
    """Mean host time (us) of one ``fn()`` call, its launches queued behind a device sleep so
    that no call waits for the GPU."""
    import time

    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # about 0.1 s: longer than the calls take to enqueue
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def time_one(fn, rep: float, timer: str = "cushioned") -> float:
    """``fn``'s median time (ms): ``cushioned_ms`` (GPU time) or triton's do_bench (which
    counts host time that outlasts its L2 flush)."""
    if timer not in TIMERS:
        raise ValueError(f"timer: expected one of {TIMERS}, got {timer!r}")
    if timer == "do_bench":
        return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")
    return cushioned_ms(fn, rep)


def time_rounds(fns: dict, rounds: int, rep: int, timer: str = "cushioned") -> dict[str, float]:
    """Each callable's median time (ms, ``time_one``) over ``rounds`` interleaved rounds."""
    times = {label: [] for label in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            times[label].append(time_one(fn, rep, timer))
    return {label: statistics.median(t) for label, t in times.items()}


def add_timer_args(ap, host_time: bool = True) -> None:
    """The benchmarks' --timer option (and --host-time)."""
    ap.add_argument("--timer", choices=TIMERS, default="cushioned",
                    help="cushioned: GPU time, the host's launch work hidden behind a device sleep (default); "
                         "do_bench: triton's, which counts host time that outlasts its L2 flush")
    if host_time:
        ap.add_argument("--host-time", action="store_true",
                        help="also print each runner's host time per call (us)")


def print_host_times(name: str, mask: str, fns: dict) -> None:
    """Each runner's host time per call, on one line."""
    print(f"{name:>28} {mask:>6} host us/call: " + ", ".join(f"{label} {host_us(fn):.0f}"
                                                           for label, fn in fns.items()), flush=True)


def ratio_row(name, B, Hq, Hkv, Nq, Nk, D, causal, ms: dict, errors: dict) -> dict:
    """The row of one shape: the times, the best "gluon ..." runner and its speed ratios to
    the Triton kernel, cuDNN and FlashAttention-2 (time(other) / time(gluon)), and Triton's
    to cuDNN."""
    gluon = {label: t for label, t in ms.items() if label.startswith("gluon")}
    best = min(gluon, key=gluon.get) if gluon else None
    row = dict(name=name, B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal, ms=ms, errors=errors,
               gluon_best=best)

    def speed(a, b):
        return ms[b] / ms[a] if a in ms and b in ms else None

    row.update({f"gluon/{x}": speed(best, x) for x in ("triton", "cudnn", "flash")},
               **{"triton/cudnn": speed("triton", "cudnn")})
    return row


def print_row(row: dict, flops: float, extra: tuple[str, ...] = (), label_width: int = 20) -> None:
    """The row's line (and its errors, and every Gluon runner's ratio to cuDNN); ``extra``:
    more runners' times after FlashAttention-2's."""
    ms, mask = row["ms"], "causal" if row["causal"] else "full"
    for label, msg in row["errors"].items():
        print(f"{row['name']:>28} {mask:>6} {label}: {msg}")

    def f(x):
        return f"{x:8.3f}" if x is not None else f"{'-':>8}"

    best = row["gluon_best"]
    g_ms = ms.get(best)
    cells = " ".join(f(ms.get(x)) for x in ("triton", "cudnn", "flash", *extra))
    print(f"{row['name']:>28} {mask:>6} {(best or '-')[6:]:>{label_width}} "
          f"{g_ms if g_ms else float('nan'):9.3f} {flops / g_ms / 1e9 if g_ms else float('nan'):8.1f} {cells} "
          f"{f(row['gluon/triton'])} {f(row['gluon/cudnn'])} {f(row['gluon/flash'])} {f(row['triton/cudnn'])}",
          flush=True)
    gluon = {label: t for label, t in ms.items() if label.startswith("gluon")}
    if len(gluon) > 1:  # every Gluon config's time, as a speed ratio to cuDNN
        print(f"{'':>36}" + ", ".join(f"{label[6:]} {ms['cudnn'] / t:.3f}" for label, t in gluon.items()))


def summarize(rows: list[dict]) -> dict:
    """Geometric means of the ratios per (head dim, masking) and over the D=128 rows, printed."""
    summary = {}
    for d in (64, 128, 256):
        for causal in (False, True):
            sel = [r for r in rows if r["D"] == d and r["causal"] == causal and r["gluon/cudnn"]]
            if sel:
                summary[f"d{d}-{'causal' if causal else 'full'}"] = {
                    x: geomean([r[x] for r in sel]) for x in ("gluon/cudnn", "gluon/triton", "gluon/flash",
                                                             "triton/cudnn")} | {"rows": len(sel)}
    d128 = [r["gluon/cudnn"] for r in rows if r["D"] == 128 and r["gluon/cudnn"]]
    if d128:
        summary["d128"] = {"gluon/cudnn": geomean(d128), "rows": len(d128)}
    print("geometric means (speed ratios):")
    for group, vals in summary.items():
        print(f"  {group:>12}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in vals.items()))
    return summary
