"""What the scripts under benchmarks/ share, so that every figure is measured the same way.

- ``environment()``: the run's GPU, driver, torch, triton, CUDA, cuDNN, the anchors' versions,
  flashtune's version and git commit, the date and the command line; ``environment_line()``
  prints it, ``write_json()`` writes it into every result file;
- rows: ``flashtune.shapes.Shape`` rows of the standard grid (``grid``), of the shapes models run
  (``shapes``: ``flashtune.shapes.REALISTIC_GRID``) and of the head dims off the grid
  (``headdims``); ``add_row_args()`` / ``rows_from_args()`` give every script the same ``--rows``,
  ``--shape``, ``--dtype`` and ``--pass``;
- ``make_inputs()``: q, k, v and dO of a row in one of two layouts: ``contiguous`` (B, H, N, D)
  tensors, or ``transformers``: (B, H, N, D) views of (B, N, H, D) storage, as Hugging Face
  models hand attention its inputs;
- ``anchor()``: what flashtune is compared with: torch SDPA's backends selected as flashtune's own
  SDPA runners select them (``flashtune.runners``), FlashAttention-2 and FlashAttention-4 where
  they import, FlexAttention (``torch.compile(flex_attention)``); one that cannot run says why;
- ``check()``: every runner against an fp32 reference before anything is timed;
- timing through ``flashtune.protocol``: ``time_pass()`` (one pass's median: the forward, or the
  backward alone), ``time_rounds()`` (runners interleaved round by round), ``copy_bandwidth()``;
- ``kernels()``, ``gluon()`` and ``kernel_function_names()`` (the kernels' names, as the profiler
  shows their launches): the only place any benchmark imports flashtune's kernel layer.

Nothing here imports torch or triton at module level: a script calls ``use_interpreter_for_cpu()``
first, because triton chooses its interpreter when it is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import types
from pathlib import Path

from flashtune import protocol
from flashtune.protocol import GRID_HEAD_DIMS, GRID_SEQ_LENS, grid_shape
from flashtune.shapes import REALISTIC_GRID, Shape, ShapeError

PASSES = ("fwd", "bwd")
geomean = protocol.geomean  # of the positive values: every summary's mean
LAYOUTS = ("contiguous", "transformers")
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


def use_interpreter_for_cpu(argv: list[str] | None = None) -> bool:
    """Switch triton to its interpreter when the command line asks for ``--device cpu``; call it
    before torch, triton or flashtune's kernels are imported. True when it did."""
    argv = sys.argv[1:] if argv is None else argv
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--device="):
            value = arg.partition("=")[2]
        else:
            continue
        if value.startswith("cpu"):
            os.environ.setdefault("TRITON_INTERPRET", "1")
            return True
    return False


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``: how a failure is reported in a row."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


# ----------------------------------------------------------------------------------
# The environment
# ----------------------------------------------------------------------------------
def git_commit(path: str | Path) -> str | None:
    """The commit of the git checkout holding ``path``, with ``+dirty`` when tracked files under
    it differ from it; None outside a checkout."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no", "--", ".") else "")


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _driver_version() -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def cudnn_version(number: int | None) -> str | None:
    """torch's cuDNN version number as text: 91900 -> "9.19.0"."""
    if not number:
        return None
    return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"


def environment(device=None) -> dict:
    """What a figure was measured with: the machine, the software and the command."""
    import torch
    import triton

    import flashtune

    package = Path(flashtune.__file__).resolve().parent
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn_version(torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None),
        "flashtune": flashtune.__version__,
        "flashtune_commit": git_commit(package),
        "flashtune_path": str(package),
        "flash_attn": _distribution_version("flash-attn", "flash_attn"),
        "flash_attn_4": _distribution_version("flash-attn-4", "flash_attn_4", "flash-attn-cute"),
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "device": None, "gpu": None, "capability": None, "sm_count": None, "driver": None,
    }
    device = torch.device(device) if device is not None else None
    if device is not None:
        env["device"] = str(device)
    if device is not None and device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                   driver=_driver_version())
    return env


def environment_line(env: dict) -> str:
    """The environment on one line, for the top of a script's output."""
    where = (f"{env['gpu']} (sm_{env['capability'].replace('.', '')}, {env['sm_count']} SMs), driver {env['driver']}"
             if env.get("gpu") else f"{env.get('device') or 'cpu'}"
             + (" under the Triton interpreter (timings are not GPU performance)" if env.get("interpreter") else ""))
    commit = (env.get("flashtune_commit") or "no git checkout")[:12] + \
        ("+dirty" if (env.get("flashtune_commit") or "").endswith("+dirty") else "")
    anchors = "".join(f", {label} {env[key]}" for key, label in (("flash_attn", "flash-attn"),
                                                                 ("flash_attn_4", "flash-attn-4")) if env.get(key))
    return (f"# {where}; torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}"
            f"{anchors}; flashtune {env['flashtune']} ({commit}); {env['date']}\n# {env['command']}")


def write_json(path: str | None, payload: dict) -> None:
    """``payload`` as indented JSON at ``path`` ("-": standard output; None: nowhere)."""
    if not path:
        return
    text = json.dumps(payload, indent=1, default=str) + "\n"
    if path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text)


# ----------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------
def _mask(causal: bool) -> str:
    return "causal" if causal else "full"


def grid_rows(dtype: str = "bfloat16") -> list[Shape]:
    """The standard grid: 16k tokens at model width 2048 (B = 16384 / N, H = 2048 / D), D 64 and
    128, N 512 to 16384, full and causal; named ``grid-d128-4096-causal``."""
    rows = []
    for d in GRID_HEAD_DIMS:
        for causal in (False, True):
            for n in GRID_SEQ_LENS:
                b, h = grid_shape(d, n)
                rows.append(Shape(b, h, h, n, n, d, causal, dtype, PASSES, f"grid-d{d}-{n}-{_mask(causal)}"))
    return rows


# Head dims off the grid that models run (ViT-H/14 80, Phi 96, d112, DeepSeek's 192 query/key part,
# Stable Diffusion's 40, Gemma's 256), at about 16k-32k tokens a call.
_HEAD_DIMS = ((4, 32, 32, 2048, 96, True), (4, 32, 32, 2048, 80, True), (2, 16, 16, 4096, 112, True),
              (2, 16, 16, 4096, 192, True), (2, 8, 8, 4096, 40, False), (1, 16, 8, 4096, 256, True))


def head_dim_rows(dtype: str = "bfloat16") -> list[Shape]:
    """Training rows (forward and backward) at head dims the grid does not have."""
    return [Shape(b, hq, hkv, n, n, d, causal, dtype, PASSES,
                  f"d{d}-b{b}-h{hq}{'' if hq == hkv else f'x{hkv}'}-{n}-{_mask(causal)}")
            for b, hq, hkv, n, d, causal in _HEAD_DIMS]


ROW_SETS = {"grid": grid_rows, "shapes": lambda dtype="bfloat16": [dataclasses.replace(s, dtype=dtype)
                                                                   for s in REALISTIC_GRID],
            "headdims": head_dim_rows}


def select_rows(items: list[str], dtype: str = "bfloat16") -> list[Shape]:
    """The rows ``items`` name, in order, each once: a set (grid, shapes, headdims), a row's name, or a
    grid row's name without its masking (``grid-d128-4096``: both). ValueError names an unknown one."""
    every = {name: make(dtype) for name, make in ROW_SETS.items()}
    by_name = {row.name: row for rows in every.values() for row in rows}
    out = []
    for item in items:
        if item in every:
            out += every[item]
        elif item in by_name:
            out.append(by_name[item])
        elif f"{item}-full" in by_name:
            out += [by_name[f"{item}-full"], by_name[f"{item}-causal"]]
        else:
            raise ValueError(f"unknown row {item!r}; expected {', '.join(ROW_SETS)} or row names "
                             "(--list-rows prints them)")
    return list(dict.fromkeys(out))


def parse_shape(text: str) -> Shape:
    """``--shape B,Hq,Hkv,Nq,Nk,D[,causal|full]`` as a row of both passes (full unless given)."""
    parts = text.split(",")
    try:
        if len(parts) not in (6, 7) or (len(parts) == 7 and parts[6] not in ("causal", "full")):
            raise ValueError("expected B,Hq,Hkv,Nq,Nk,D and optionally causal or full")
        b, hq, hkv, nq, nk, d = (int(x) for x in parts[:6])
        causal = len(parts) == 7 and parts[6] == "causal"
        return Shape(b, hq, hkv, nq, nk, d, causal, "bfloat16", PASSES,
                     f"{b}x{hq}x{hkv}-{nq}x{nk}-d{d}-{_mask(causal)}")
    except (ValueError, ShapeError) as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def tiny(shape: Shape) -> Shape:
    """The same kind of row at interpreter size: its grouping, head dim and masking, one batch,
    short sequences (a decode row keeps its one query)."""
    hq = min(shape.heads_q, 4)
    hkv = max(1, hq * shape.heads_kv // shape.heads_q)
    n_q = 1 if shape.decode else min(shape.seq_q, 17)
    n_k = min(shape.seq_k, 40) if shape.seq_k != shape.seq_q else n_q
    return dataclasses.replace(shape, batch=1, heads_q=hq, heads_kv=hkv, seq_q=n_q, seq_k=n_k)


def add_row_args(ap: argparse.ArgumentParser, *, rows: str = "grid", passes: bool = True) -> None:
    """``--rows``, ``--shape``, ``--list-rows``, ``--dtype`` (and ``--pass``)."""
    ap.add_argument("--rows", default=rows, metavar="SET|ROW,...",
                    help=f"rows: {', '.join(ROW_SETS)} (sets) or row names, comma-separated (default {rows}); "
                         "--list-rows prints them")
    ap.add_argument("--shape", action="append", type=parse_shape, default=[], metavar="B,Hq,Hkv,Nq,Nk,D[,causal]",
                    help="a row of these sizes besides --rows' (repeatable; full unless 'causal')")
    ap.add_argument("--list-rows", action="store_true", help="print the rows of every set and exit")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                    help="the rows' dtype (default bf16 on a GPU, fp16 under the interpreter)")
    if passes:
        ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "both"), default="both",
                        help="the passes of each row to run (default both; a row without it is left out)")


def rows_from_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[Shape]:
    """The rows the arguments ask for (``ap.error`` names a bad one); interpreter-sized under
    ``--device cpu``. ``--list-rows`` prints them all and exits."""
    if args.list_rows:
        for name, make in ROW_SETS.items():
            print(f"{name}:")
            for row in make():
                print(f"  {row.name:<28} {row.label()}")
        raise SystemExit(0)
    cpu = str(getattr(args, "device", "cuda")).startswith("cpu")
    dtype = DTYPES[args.dtype] if args.dtype else "float16" if cpu else "bfloat16"
    try:
        rows = select_rows([item for item in args.rows.split(",") if item], dtype) if args.rows else []
    except ValueError as e:
        ap.error(f"--rows: {e}")
    rows += [dataclasses.replace(s, dtype=dtype) for s in args.shape]
    wanted = PASSES if getattr(args, "pass_", "both") == "both" else (args.pass_,)
    rows = [dataclasses.replace(s, passes=tuple(p for p in s.passes if p in wanted))
            for s in dict.fromkeys(rows) if set(s.passes) & set(wanted)]
    if not rows:
        ap.error("--rows/--shape/--pass: no row to run")
    return [tiny(s) for s in rows] if cpu else rows


def add_timing_args(ap: argparse.ArgumentParser, *, rounds: int = 3) -> None:
    """``--device``, ``--timer``, ``--quick``, ``--rounds``, ``--max-rounds``."""
    ap.add_argument("--device", default="cuda", help="cuda[:N], or cpu: the Triton interpreter on tiny rows")
    ap.add_argument("--timer", choices=TIMERS, default="eager",
                    help="eager: do_bench of the calls, host time included where it exceeds the GPU's (default); "
                         "graph: do_bench of a CUDA-graph replay (the GPU's time alone; eager where the call does "
                         "not capture); clean-l2: each call after an L2-emptying read; cushioned: that with the "
                         "host's launch work hidden behind a device sleep")
    ap.add_argument("--quick", action="store_true", help="shorter do_bench runs (10 ms warm-up, 30 ms of calls)")
    ap.add_argument("--rounds", type=int, default=None,
                    help=f"interleaved rounds per row; each figure is the median of its rounds (default {rounds}, "
                         "1 under the interpreter)")
    ap.add_argument("--max-rounds", type=int, default=None,
                    help="more rounds, up to this many, while half or more of a runner's rounds are over 1.15x its "
                         "fastest (a busy moment of the host; default 2 x --rounds + 1 on a GPU)")
    ap.set_defaults(_default_rounds=rounds)


def timing_from_args(ap: argparse.ArgumentParser, args: argparse.Namespace):
    """The device of ``--device`` (``ap.error`` where it is unusable), ``args.rounds`` and
    ``args.max_rounds`` filled in."""
    import torch

    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        ap.error(f"--device: {first_line(e)}")
    if device.type not in ("cuda", "cpu"):
        ap.error(f"--device: expected cuda[:N] or cpu, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device: no CUDA GPU here (torch.cuda.is_available() is False); --device cpu runs the "
                 "interpreter on tiny rows")
    if args.rounds is None:
        args.rounds = 1 if device.type == "cpu" else args._default_rounds
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive number of rounds, got {args.rounds}")
    if args.max_rounds is None:
        args.max_rounds = args.rounds if device.type == "cpu" else 2 * args.rounds + 1
    if args.max_rounds < args.rounds:
        ap.error(f"--max-rounds: expected at least --rounds ({args.rounds}), got {args.max_rounds}")
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


def parse_layouts(ap: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    """``--layout contiguous|transformers|both``."""
    if text == "both":
        return LAYOUTS
    if text not in LAYOUTS:
        ap.error(f"--layout: expected {', '.join(LAYOUTS)} or both, got {text!r}")
    return (text,)


# ----------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------
def make_inputs(shape: Shape, device, layout: str = "contiguous", seed: int = 0):
    """q, k, v and dO of ``shape`` (seeded randn), each (B, H, N, D): contiguous tensors, or views
    of (B, N, H, D) storage (``layout="transformers"``)."""
    import torch

    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    dtype = getattr(torch, shape.dtype)
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(heads: int, n: int):
        if layout == "contiguous":
            return torch.randn(shape.batch, heads, n, shape.head_dim, device=device, dtype=dtype, generator=gen)
        return torch.randn(shape.batch, n, heads, shape.head_dim, device=device, dtype=dtype,
                           generator=gen).transpose(1, 2)

    return (rand(shape.heads_q, shape.seq_q), rand(shape.heads_kv, shape.seq_k), rand(shape.heads_kv, shape.seq_k),
            rand(shape.heads_q, shape.seq_q))


# ----------------------------------------------------------------------------------
# Anchors: what flashtune is compared with
# ----------------------------------------------------------------------------------
class Unavailable(RuntimeError):
    """An anchor that cannot run here, or not this row; the message says why."""


# anchor name -> flashtune.runners' name of the SDPA backend
SDPA_ANCHORS = {"cudnn": "sdpa-cudnn", "flash": "sdpa-flash", "efficient": "sdpa-efficient"}
ANCHORS = (*SDPA_ANCHORS, "math", "fa2", "fa4", "flex")
ANCHOR_HELP = ("cudnn, flash, efficient: torch SDPA's cuDNN, FlashAttention-2 and memory-efficient backends; "
               "math: SDPA's math backend; fa2: the flash-attn package (FlashAttention-2); fa4: flash-attn-4 "
               "(flash_attn.cute); flex: torch.compile(flex_attention)")


def parse_anchors(ap: argparse.ArgumentParser, text: str) -> list[str]:
    """``--anchors a,b,...`` (flashtune.runners' names, sdpa-cudnn and the like, accepted too)."""
    aliases = {runner: name for name, runner in SDPA_ANCHORS.items()}
    names = [aliases.get(n, n) for n in text.split(",") if n]
    bad = [n for n in names if n not in ANCHORS]
    if bad:
        ap.error(f"--anchors: unknown {', '.join(map(repr, bad))}; expected some of {', '.join(ANCHORS)}")
    return list(dict.fromkeys(names))


def _gqa(q, k) -> bool:
    return q.shape[1] != k.shape[1]


def _bottom_right_differs(q, k, causal: bool) -> None:
    if causal and q.shape[2] != k.shape[2]:
        raise Unavailable("causal with Nq != Nk: FlashAttention aligns the mask bottom-right, SDPA and flashtune "
                          "top-left")


@functools.cache
def _flex_block_mask(n_q: int, n_k: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return create_block_mask(causal, B=None, H=None, Q_LEN=n_q, KV_LEN=n_k, device=device)


def anchor(name: str, device):
    """``run(q, k, v, causal) -> o`` for an anchor, q/k/v/o (B, H, N, D) tensors or views; Unavailable
    where it cannot run on ``device`` at all."""
    import torch

    cuda = torch.device(device).type == "cuda"
    if name in SDPA_ANCHORS:
        if not cuda and name != "flash":
            raise Unavailable(f"SDPA's {name} backend needs a CUDA GPU")
        from flashtune.runners import sdpa

        runner = SDPA_ANCHORS[name]
        return lambda q, k, v, causal: sdpa(runner, q, k, v, is_causal=causal, enable_gqa=_gqa(q, k))
    if name == "math":
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run_math(q, k, v, causal):
            with sdpa_kernel([SDPBackend.MATH]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=_gqa(q, k))
        return run_math
    if name in ("fa2", "fa4"):
        if not cuda:
            raise Unavailable(f"{name} needs a CUDA GPU")
        try:
            if name == "fa2":
                from flash_attn import flash_attn_func
            else:
                from flash_attn.cute import flash_attn_func
        except Exception as e:  # noqa: BLE001 - not installed, or built for another torch: say so
            package = "flash-attn (FlashAttention-2)" if name == "fa2" else "flash-attn-4 (flash_attn.cute)"
            raise Unavailable(f"{package} does not import: {first_line(e)}") from None

        def run_fa(q, k, v, causal):  # FlashAttention takes (B, N, H, D): the views' transposes
            _bottom_right_differs(q, k, causal)
            o = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
            return (o[0] if isinstance(o, tuple) else o).transpose(1, 2)  # FlashAttention-4 returns (o, lse)
        return run_fa
    if name == "flex":
        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError as e:
            raise Unavailable(f"FlexAttention does not import: {first_line(e)}") from None
        flex = torch.compile(flex_attention)

        def run_flex(q, k, v, causal):
            mask = _flex_block_mask(q.shape[2], k.shape[2], str(q.device)) if causal else None
            return flex(q, k, v, block_mask=mask, enable_gqa=_gqa(q, k))
        return run_flex
    raise ValueError(f"anchor: expected one of {', '.join(ANCHORS)}, got {name!r}")


def anchors(names: list[str], device) -> tuple[dict, dict]:
    """({name: run} of the anchors that can run here, {name: why not} of the others)."""
    runs, notes = {}, {}
    for name in names:
        try:
            runs[name] = anchor(name, device)
        except Unavailable as e:
            notes[name] = str(e)
    return runs, notes


# ----------------------------------------------------------------------------------
# flashtune's side
# ----------------------------------------------------------------------------------
@functools.cache
def kernels() -> types.SimpleNamespace:
    """The names of flashtune's kernel layer the benchmarks use, imported here and nowhere else
    under benchmarks/ (flashtune's public ``attention`` and ``get_tuned_attention`` aside)."""
    from flashtune import device
    from flashtune import kernels as api
    from flashtune.configs import space
    from flashtune.kernels import common, fp8, passes
    from flashtune.kernels.triton import backward, decode, forward

    return types.SimpleNamespace(
        BwdConfig=api.BwdConfig, ConfigError=api.ConfigError, FwdConfig=api.FwdConfig, attention=api.attention,
        attention_backward=api.attention_backward, attention_forward=api.attention_forward,
        default_config=api.default_config, reference_attention=api.reference_attention,
        resolve_configs=api.resolve_configs, as_triton=passes.as_triton, keys_contiguous=fp8.keys_contiguous,
        space=space, LN2=common.LN2, sm_count=device.sm_count, torch_fp32_precision=common.torch_fp32_precision,
        # the modules holding the Triton kernels (their @triton.jit functions end in "_kernel")
        backward_module=backward, decode_module=decode, forward_module=forward)


@functools.cache
def gluon() -> types.SimpleNamespace:
    """The Gluon (sm_90) kernels' entry points: configs, launchers, instrumentation, compiles for sm_90."""
    from flashtune.configs import gluon as configs
    from flashtune.kernels.gluon import backward_launch, forward_launch, trace

    def merged(*modules):
        return types.SimpleNamespace(**{k: v for m in modules for k, v in vars(m).items() if not k.startswith("__")})

    return types.SimpleNamespace(forward=merged(configs, forward_launch), backward=merged(configs, backward_launch),
                                 backward_wide=merged(configs, backward_launch), trace=trace)


@functools.cache
def kernel_function_names() -> frozenset[str]:
    """The names of flashtune's GPU kernels (its Triton and Gluon ``@jit`` functions, which end
    in ``_kernel``): the names their launches carry in torch.profiler's CUDA events. Read from
    the kernel modules, so that a kernel added there is counted without a list to keep; a
    Gluon module this triton cannot import is left out."""
    import importlib
    import pkgutil

    names = set()
    for package in ("flashtune.kernels.triton", "flashtune.kernels.gluon"):
        try:
            root = importlib.import_module(package)
        except ImportError:
            continue
        for info in pkgutil.iter_modules(root.__path__, f"{package}."):
            try:
                module = importlib.import_module(info.name)
            except ImportError:
                continue
            # a JITFunction, or the interpreter's stand-in for one, keeps the Python function in .fn
            names.update(name for name, obj in vars(module).items()
                         if name.endswith("_kernel") and callable(getattr(obj, "fn", None)))
    return frozenset(names)


def flashtune_configs(q, k, causal: bool, fwd=None, bwd=None, *, triton_only: bool = False) -> tuple:
    """The (forward, backward) configs ``flashtune.attention`` launches for this call: the given
    ones validated, else its heuristic defaults; ``triton_only``: the Triton kernels' own (where
    the default is another family's, the Triton default that stands in for it)."""
    kern = kernels()
    configs = kern.resolve_configs(q, fwd, bwd, causal, seq_k=k.shape[2], heads_kv=k.shape[1])
    if triton_only:
        configs = tuple(kern.as_triton(c, q.shape[-1], q.dtype, q.device, causal) for c in configs)
    return configs


def flashtune_runner(fwd=None, bwd=None):
    """``run(q, k, v, causal)``: ``flashtune.attention`` with these configs (None: its defaults)."""
    import flashtune

    if fwd is None and bwd is None:
        return lambda q, k, v, causal: flashtune.attention(q, k, v, causal=causal)
    return lambda q, k, v, causal: flashtune.attention(q, k, v, causal=causal, fwd_config=fwd, bwd_config=bwd)


# ----------------------------------------------------------------------------------
# Correctness
# ----------------------------------------------------------------------------------
class CheckError(AssertionError):
    """A runner whose output or gradients are wrong; the message has the figures."""


def reference(q, k, v, do, causal: bool, *, grads: bool, dtype=None):
    """o (and dq, dk, dv) in fp32 (or ``dtype``) on batch 0 and K/V head 0 (with the query heads
    that share it): softmax(q kᵀ / √D) v with SDPA's top-left causal mask, by plain torch ops."""
    import torch

    group = q.shape[1] // k.shape[1]
    leaves = [x[:1, :n].detach().to(dtype or torch.float32).requires_grad_(grads)
              for x, n in ((q, group), (k, 1), (v, 1))]
    qs, ks, vs = leaves
    scores = qs @ ks.repeat_interleave(group, dim=1).transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        rows = torch.arange(q.shape[2], device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(k.shape[2], device=q.device)[None, :] > rows, float("-inf"))
    o = torch.softmax(scores, dim=-1).nan_to_num() @ vs.repeat_interleave(group, dim=1)
    if not grads:
        return [o.detach()]
    return [o.detach(), *torch.autograd.grad(o, leaves, do[:1, :group].to(o.dtype))]


def outputs(run, q, k, v, do, causal: bool, grads: bool) -> list:
    """``run``'s o under no_grad, or o, dq, dk, dv."""
    import torch

    if not grads:
        with torch.no_grad():
            return [run(q, k, v, causal)]
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    o = run(*leaves, causal)
    return [o.detach(), *torch.autograd.grad(o, leaves, do)]


def reference_slice(outputs: list, q, k) -> list:
    """The part of full outputs (o, dq, dk, dv) that ``reference`` computes."""
    group = q.shape[1] // k.shape[1]
    return [x[:1, :1] if i > 1 else x[:1, :group] for i, x in enumerate(outputs)]


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


NAMES = ("o", "dq", "dk", "dv")


def check(runs: dict, strict: set, q, k, v, do, causal: bool, *, grads: bool) -> tuple[dict, dict]:
    """Every runner of ``runs`` checked before it is timed. The first that runs is the check's
    anchor; each runner's error against the fp32 ``reference`` (batch 0, K/V head 0) must stay
    within 2x the anchor's plus 4 ulps of the reference's largest value (FlashAttention's rule)
    for the runners in ``strict``, and its outputs within 5 % relative error of the anchor's over
    the whole tensors for all. Returns ({name: figures} of the runners that passed, {name: why}
    of the others)."""
    import torch

    ref = reference(q, k, v, do, causal, grads=grads)
    eps = torch.finfo(q.dtype).eps
    passed, failed, base, base_err = {}, {}, None, None
    for name, run in runs.items():
        try:
            got = outputs(run, q, k, v, do, causal, grads)
        except Exception as e:  # noqa: BLE001 - a runner that cannot run this row says why
            failed[name] = first_line(e)
            continue
        err = {n: (a.float() - r).abs().max().item() for n, a, r in zip(NAMES, reference_slice(got, q, k), ref)}
        figures = {"max_err_vs_fp32": err}
        bad = [f"{n}: not finite" for n, a in zip(NAMES, got) if not torch.isfinite(a).all()]
        if base is None:
            base, base_err, figures["anchor"] = got, err, True
            if bad:
                failed[name] = "; ".join(bad)
                base = None
                continue
        else:
            rel = {n: _rel(a, b) for n, a, b in zip(NAMES, got, base)}
            figures["rel_vs_anchor"] = rel
            bad += [f"{n}: relative error {r:.3g} against the check's anchor > 0.05" for n, r in rel.items()
                    if not r <= 0.05]
        if name in strict:
            for n, r in zip(NAMES, ref):
                allowed = 2 * base_err[n] + 4 * eps * r.abs().max().item()
                if not err[n] <= allowed:
                    bad.append(f"{n}: max error {err[n]:.3g} against fp32 > allowed {allowed:.3g} "
                               f"(the anchor's {base_err[n]:.3g})")
        if bad:
            failed[name] = "; ".join(bad)
        else:
            passed[name] = figures
        del got
    return passed, failed


# ----------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------
TIMERS = ("eager", "graph", "clean-l2", "cushioned")
CUSHION_CYCLES = 400_000  # a device sleep of about 0.2 ms: longer than a launcher's host time


def time_ms(fn, device, timer: str = "eager", *, quick: bool = False) -> tuple[float, str]:
    """(median ms of ``fn``, the timer that ran). On a GPU: do_bench of the calls (``eager``), of
    their CUDA-graph replay (``graph``; eager where the call cannot be captured), or each call
    after an L2-emptying read (``clean-l2``; ``cushioned``: its launches queued behind a device
    sleep, so the host's launch work is not counted); the interpreter's wall clock elsewhere."""
    if timer not in TIMERS:
        raise ValueError(f"timer: expected one of {', '.join(TIMERS)}, got {timer!r}")
    if device.type != "cuda":
        return protocol.time_ms(fn, device, quick=quick), "interpreter wall clock"
    if timer == "graph":
        try:
            graph = protocol.capture_graph(fn, device)
        except Exception:  # noqa: BLE001 - not capturable: timed eagerly, and said so
            return protocol.time_ms(fn, device, quick=quick), "eager"
        try:
            return protocol.time_ms(graph.replay, device, quick=quick), "graph"
        finally:
            graph.reset()
    if timer in ("clean-l2", "cushioned"):
        protocol.warm_up_gpu(device)
        return protocol.time_clean_l2(fn, device, rep=30.0 if quick else 100.0,
                                      cushion_cycles=CUSHION_CYCLES if timer == "cushioned" else 0), timer
    return protocol.time_ms(fn, device, quick=quick), "eager"


def pass_call(run, pass_: str, q, k, v, do, causal: bool):
    """The zero-argument call one pass times: the forward under no_grad, or the backward alone
    (``autograd.grad`` of one kept forward, as ``o.backward(do, retain_graph=True)`` without the
    gradients' accumulation)."""
    import torch

    if pass_ == "fwd":
        def forward():
            with torch.no_grad():
                return run(q, k, v, causal)
        return forward
    if pass_ != "bwd":
        raise ValueError(f"pass_: expected 'fwd' or 'bwd', got {pass_!r}")
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    o = run(*leaves, causal)
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)


def time_row(runners: dict, shape: Shape, inputs: tuple, device, args) -> tuple[dict, dict, set]:
    """``time_rounds`` of one row's passes with the timing arguments (``add_timing_args``):
    (times, failures, the timers used). ``inputs`` is (q, k, v, do)."""
    q, k, v, do = inputs
    used = set()

    def time_one(run, pass_):
        ms, timer = time_ms(pass_call(run, pass_, q, k, v, do, shape.causal), device, args.timer, quick=args.quick)
        used.add(timer)
        return ms

    times, failed = time_rounds(runners, list(shape.passes), args.rounds, time_one, max_rounds=args.max_rounds)
    return times, failed, used


def time_rounds(runners: dict, passes: list, rounds: int, time_one, *, max_rounds: int | None = None,
                spread: float = 1.15) -> tuple[dict, dict]:
    """({(runner, pass): [ms of each round]}, {(runner, pass): why it failed}) from ``time_one(run,
    pass_)``. Runners and passes are interleaved round by round, the runners' order rotated each
    round, so a slow moment of a shared machine, or the GPU warming, hits one round of each rather
    than all of one. A runner that raises on a pass is not tried again on it.

    ``max_rounds``: after ``rounds``, more rounds (up to ``max_rounds`` in all) while a runner's
    slowest rounds are over ``spread`` times its fastest and not yet a minority, so that a
    median never lands on a disturbed round."""
    times = {(name, p): [] for name in runners for p in passes}
    failed: dict = {}
    names = list(runners)

    def one_round(index: int) -> None:
        shift = index % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            for p in passes:
                if (name, p) in failed:
                    continue
                try:
                    times[name, p].append(time_one(runners[name], p))
                except Exception as e:  # noqa: BLE001 - a runner that cannot run this row
                    failed[name, p] = first_line(e)
                    times[name, p] = []

    def disturbed(ms: list) -> bool:
        fast = min(ms)
        return 2 * sum(1 for t in ms if t > fast * spread) >= len(ms)

    for i in range(rounds):
        one_round(i)
    done = rounds
    while done < (max_rounds or 0) and any(ms and disturbed(ms) for ms in times.values()):
        one_round(done)
        done += 1
    return times, failed


def median(values: list) -> float | None:
    return statistics.median(values) if values else None


def copy_bandwidth(device, *, timer: str = "eager") -> float:
    """Bytes read and written per second by a device copy (1 GiB on a GPU): what bounds a decode
    step, which reads all of K and V once."""
    import torch

    nbytes = (1 << 30) if device.type == "cuda" else (1 << 22)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms, _ = time_ms(lambda: dst.copy_(src), device, "clean-l2" if timer in ("clean-l2", "cushioned") else "eager")
    return 2 * nbytes / (ms * 1e-3)


def host_us_per_call(fn, iters: int, repeats: int = 5, sync=None, warmup: int = 20) -> float:
    """Median over ``repeats`` rounds of the wall microseconds per call of ``iters`` back-to-back
    calls, ``sync()`` around each round: a call's host cost where the GPU's work is small."""
    import time

    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    rounds = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        rounds.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(rounds)


# ----------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------
def tflops(flops: float, ms: float | None) -> float | None:
    return None if not ms or ms <= 0 else flops / (ms * 1e-3) / 1e12


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None where either is missing."""
    return None if a is None or b is None or b == 0 else a / b


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted, or n/a as wide."""
    return format("n/a", ">" + spec.split(".")[0]) if x is None or (isinstance(x, float) and math.isnan(x)) \
        else format(x, spec)
