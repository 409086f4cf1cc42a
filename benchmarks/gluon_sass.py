"""What the Gluon kernels' hot loops are made of, from their sm_90 machine code, on any host.

Compiles a Gluon kernel for sm_90 without a GPU (kernels/gluon forward_launch.compile_for_sm90,
backward_launch.compile_for_sm90), assembles it with triton's ptxas (``-v``: registers, spill
bytes) and disassembles it with nvdisasm, then finds the loops that issue wgmma (the
consumers' block loops: a conditional branch back to a label before it, innermost first) and
counts their instructions by class: HGMMA, MUFU (exp2), the fp32 ALU ops, integer and uniform
ops, shuffles, barriers, shared-memory and global loads and stores, and local-memory (spill)
loads and stores, which in a hot loop cost the most. Static counts of a loop body (both sides of
a branch inside it counted): for comparing two versions of a kernel, not for timing.

    python benchmarks/gluon_sass.py                                  # the forward's D=128 default, causal
    python benchmarks/gluon_sass.py --kernel bwd --config DQ_FUSED=1 --head-dim 128
    python benchmarks/gluon_sass.py --kernel bwd --head-dim 256 --full
    python benchmarks/gluon_sass.py --kernel fwd --trace

``--config FIELD=VALUE`` (repeatable) changes the default config's fields; ``--trace`` compiles
the instrumented kernel.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

# ptxas's summary lines; nvdisasm's instruction lines ("/*0770*/  @!P1 HGMMA.64x128x16... ;")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(\.[^\s]*)?\s*(.*?);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
CLASSES = {  # opcode -> class, in the order printed
    "HGMMA": "wgmma", "WARPGROUP": "wgmma sync",
    "MUFU": "MUFU",
    "FFMA": "fp32", "FMUL": "fp32", "FADD": "fp32", "FMNMX": "fp32", "FSEL": "fp32", "FSETP": "fp32",
    "F2FP": "convert", "F2F": "convert", "I2F": "convert", "F2I": "convert",
    "SHFL": "shuffle",
    "BAR": "barrier", "SYNCS": "mbarrier",
    "LDS": "shared", "STS": "shared", "LDSM": "shared", "STSM": "shared",
    "LDG": "global", "STG": "global", "UTMALDG": "TMA", "UTMAREDG": "TMA", "UBLKCP": "TMA",
    "LDL": "spill", "STL": "spill",
}


@dataclasses.dataclass
class Loop:
    start: int  # instruction indices, inclusive
    end: int
    counts: dict[str, int]


def parse(sass: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """(instructions as (opcode, text) in order, label -> index of the next instruction)."""
    instrs, labels = [], {}
    for line in sass.splitlines():
        label = _LABEL.match(line.strip())
        if label:
            labels[label.group(1)] = len(instrs)
            continue
        m = _INSTR.match(line)
        if m:
            instrs.append((m.group(3), line.strip()))
    return instrs, labels


def classify(opcode: str) -> str:
    if opcode in CLASSES:
        return CLASSES[opcode]
    return "uniform" if opcode.startswith("U") else "integer and other"


def wgmma_loops(instrs: list[tuple[str, str]], labels: dict[str, int]) -> list[Loop]:
    """The loops with a wgmma in them that hold no smaller such loop: [label, conditional branch
    back to it]."""
    spans = []
    for i, (op, text) in enumerate(instrs):
        target = _TARGET.search(text)
        if op == "BRA" and "@" in text.split("BRA")[0] and target and labels.get(target.group(1), i + 1) <= i:
            spans.append((labels[target.group(1)], i))
    with_mma = [(a, b) for a, b in spans if any(instrs[k][0] == "HGMMA" for k in range(a, b + 1))]
    inner = [(a, b) for a, b in with_mma
             if not any((c, d) != (a, b) and a <= c and d <= b for c, d in with_mma)]
    loops = []
    for a, b in sorted(set(inner)):
        counts = collections.Counter(classify(instrs[k][0]) for k in range(a, b + 1))
        loops.append(Loop(a, b, {c: counts[c] for c in dict.fromkeys([*CLASSES.values(), "uniform",
                                                                      "integer and other"]) if counts[c]}))
    return loops


class FieldError(ValueError):
    """A --config field the kernel's config does not have."""


def configured(cfg, fields: dict):
    """``cfg`` with the --config fields set."""
    try:
        return dataclasses.replace(cfg, **{k: int(v) for k, v in fields.items()})
    except TypeError as e:
        raise FieldError(f"{type(cfg).__name__} has no such field ({e})") from None


def compile_kernel(args) -> tuple[str, str]:
    """(ptxas's -v output, nvdisasm's SASS) of the kernel the arguments name."""
    import torch
    import triton

    g = harness.gluon()
    gluon_forward, gluon_backward, gluon_backward_wide = g.forward, g.backward, g.backward_wide
    fields = dict(item.split("=") for item in args.config)
    if args.kernel == "fwd":
        cfg = configured(gluon_forward.default_gluon_config(args.head_dim), fields)
        compiled = gluon_forward.compile_for_sm90(cfg, args.head_dim, torch.bfloat16, not args.full, trace=args.trace)
    elif args.head_dim == 256:  # the D=256 dK/dV kernel (gluon_backward_wide)
        if args.trace:
            raise SystemExit("--trace: the D=256 backward has no instrumentation")
        cfg = configured(gluon_backward_wide.default_wide_config(), fields)
        compiled = gluon_backward_wide.compile_wide_for_sm90(cfg, torch.bfloat16, not args.full)
    else:
        cfg = configured(gluon_backward.default_gluon_bwd_config(args.head_dim), fields)
        compiled = gluon_backward.compile_for_sm90(cfg, args.head_dim, torch.bfloat16, not args.full,
                                                   trace=args.trace)
    print(f"{args.kernel} {cfg.short()} D={args.head_dim} {'full' if args.full else 'causal'} bf16"
          f"{' traced' if args.trace else ''}")
    tools = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        pathlib.Path(ptx).write_text(compiled.asm["ptx"])
        info = subprocess.run([str(tools / "ptxas"), "-arch=sm_90a", "-v", ptx, "-o", cubin], capture_output=True,
                              text=True, check=True).stderr
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout
    return info, sass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("fwd", "bwd"), default="fwd", help="the forward or the dK/dV kernel")
    ap.add_argument("--head-dim", type=int, choices=(64, 128, 256), default=128)
    ap.add_argument("--full", action="store_true", help="no causal mask")
    ap.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--trace", action="store_true", help="the instrumented kernel (TRACE)")
    args = ap.parse_args(argv)
    for item in args.config:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*=-?\d+", item):
            ap.error(f"--config: expected NAME=INTEGER, got {item!r}")
    try:
        info, sass = compile_kernel(args)
    except FieldError as e:
        ap.error(f"--config: {e}")
    spill, regs = _SPILL.search(info), _REGS.search(info)
    instrs, labels = parse(sass)
    print(f"{len(instrs)} instructions, {regs.group(1) if regs else '?'} registers, spill stores/loads "
          f"{spill.group(1) if spill else '?'}/{spill.group(2) if spill else '?'} bytes a thread")
    for loop in wgmma_loops(instrs, labels):
        print(f"  loop [{loop.start}, {loop.end}] ({loop.end - loop.start + 1} instructions): "
              + ", ".join(f"{c} {n}" for c, n in loop.counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
