"""Compile the Gluon forward (kernels/gluon_forward.py) or, with "kernel": "bwd" in an item,
the Gluon dK/dV kernel (kernels/gluon_backward.py; with "bwd_kernel": "dq" its dQ kernel, with
"wide" the D=256 dK/dV kernel of kernels/gluon_backward_wide.py, "prefetch" its PREFETCH) for sm_90
without a GPU.

Run as a script with TRITON_INTERPRET unset. Reads a JSON list of {"config", "head_dim",
"dtype", "causal"} (optionally "window": the sliding-window variant; "trace": the forward's
instrumentation; "fma_softmax": its SCALE_POSITIVE softmax; "tma_store": its output through
TMA; "snake": the persistent kernel's PERSISTENT_SNAKE;
"row_limit": the forward's ROW_LIMIT_MASK; "fwd_poly_exp2": the forward's POLY_EXP2;
"compact_stats", "turns", "scale_in_p", "poly_exp2", "step_counters", "skip_dead", "tma_dkdv": the dK/dV
kernel's COMPACT_STATS, CONSUMER_TURNS, SCALE_IN_P, POLY_EXP2, STEP_COUNTERS, SKIP_DEAD_STEPS and
TMA_STORE_DKDV) on stdin and prints one JSON line per item with the compiled kernel's shared memory in
bytes ("shared"), its PTX register cap ("maxnreg"), the setmaxnreg values of its partitions ("setmaxnreg"), its wgmma and TMA copy, reduce-add and
bulk-store counts and bulk-store waits, its cycle-counter reads ("clock_reads": the trace's stamps),
its ex2.approx instructions and polynomial exponentials ("ex2", "poly_exp2s": POLY_EXP2's magic constant),
with "ptxas": true also ptxas's registers and spill bytes a thread ("registers", "spill_stores",
"spill_loads") and the SASS's HGMMAs and those waited for one by one ("hgmma", "hgmma_waited"), or
one {"skip": ...} line when this triton cannot compile Gluon for sm_90 here.
"""

from __future__ import annotations

import json
import re
import sys


def compile_item(item: dict) -> dict:
    import torch

    dtype = getattr(torch, item["dtype"])
    if item.get("kernel") == "bwd" and item.get("bwd_kernel") == "wide":  # the D=256 dK/dV kernel
        from flashtune.kernels import gluon_backward_wide
        from flashtune.kernels.gluon_backward import GluonBwdConfig
        from flashtune.kernels.gluon_backward_wide import compile_wide_for_sm90

        gluon_backward_wide.PREFETCH = int(item.get("prefetch", 0))  # the module's switch, read at the compile
        compiled = compile_wide_for_sm90(GluonBwdConfig(**item["config"]), dtype, item["causal"])
    elif item.get("kernel") == "bwd":  # the Gluon dK/dV kernel (kernels/gluon_backward.py)
        from flashtune.kernels import gluon_backward
        from flashtune.kernels.gluon_backward import GluonBwdConfig, compile_for_sm90 as compile_bwd

        if "compact_stats" in item:  # the module's switch, read at the compile
            gluon_backward.COMPACT_STATS = item["compact_stats"]
        # off unless the item says (an earlier item's values would otherwise stay)
        gluon_backward.CONSUMER_TURNS = item.get("turns", 0)
        gluon_backward.SCALE_IN_P = item.get("scale_in_p", False)
        gluon_backward.DQ_SCALE_AT_CAST = item.get("dq_scale_at_cast", False)
        gluon_backward.POLY_EXP2 = item.get("poly_exp2", 0)
        gluon_backward.STEP_COUNTERS = item.get("step_counters", False)
        gluon_backward.SKIP_DEAD_STEPS = item.get("skip_dead", False)
        gluon_backward.TMA_STORE_DKDV = item.get("tma_dkdv", False)

        compiled = compile_bwd(GluonBwdConfig(**item["config"]), item["head_dim"], dtype, item["causal"],
                               item.get("bwd_kernel", "dkdv"), trace=item.get("trace", False))
    else:
        from flashtune.kernels import gluon_forward
        from flashtune.kernels.gluon_forward import GluonFwdConfig, compile_for_sm90

        if "row_limit" in item:  # the module's switch, read at the compile
            gluon_forward.ROW_LIMIT_MASK = item["row_limit"]
        gluon_forward.POLY_EXP2 = item.get("fwd_poly_exp2", 0)  # off unless the item says
        cfg = GluonFwdConfig(**item["config"])
        compiled = compile_for_sm90(cfg, item["head_dim"], dtype, item["causal"], item.get("window", False),
                                    trace=item.get("trace", False), fma_softmax=item.get("fma_softmax"),
                                    tma_store=item.get("tma_store"), snake=item.get("snake"))
    ptx = compiled.asm["ptx"]
    maxnreg = re.search(r"\.maxnreg\s+(\d+)", ptx)
    extra = ptxas_info(ptx) if item.get("ptxas") else {}
    return {**extra, "shared": int(compiled.metadata.shared), "maxnreg": int(maxnreg.group(1)) if maxnreg else None,
            "setmaxnreg": sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
            "tma_reduces": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor", ptx)),
            "tma_stores": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
            "store_waits": len(re.findall(r"cp\.async\.bulk\.wait_group", ptx)),
            "mbarrier_waits": len(re.findall(r"mbarrier\.try_wait", ptx)),
            "clock_reads": len(re.findall(r"%clock64", ptx)),
            "ex2": len(re.findall(r"ex2\.approx", ptx)),
            "poly_exp2s": len(re.findall(r"add\.rn\.f32 %t, %xc, 0f4B400000", ptx))}


def ptxas_info(ptx: str) -> dict:
    """triton's ptxas -v on ``ptx`` for sm_90a: the registers a thread and the spill bytes a
    thread stored and loaded ("registers", "spill_stores", "spill_loads"); from nvdisasm's SASS the
    HGMMA instructions ("hgmma") and those that wait for their own completion ("hgmma_waited", gsb0:
    one a chain where ptxas pipelines the wgmmas, every one where it serializes them, which it does
    without a word)."""
    import os
    import pathlib
    import subprocess
    import tempfile

    import triton

    ptxas = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        pathlib.Path(src).write_text(ptx)
        cubin = os.path.join(tmp, "k.cubin")
        info = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", src, "-o", cubin],
                              capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(ptxas.parent / "nvdisasm"), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    regs = re.search(r"Used (\d+) registers", info)
    hgmma = [line for line in sass.splitlines() if "HGMMA" in line]
    return {"registers": int(regs.group(1)), "spill_stores": int(spill.group(1)), "spill_loads": int(spill.group(2)),
            "hgmma": len(hgmma), "hgmma_waited": sum("gsb0" in line for line in hgmma)}


def main() -> int:
    items = json.load(sys.stdin)
    try:
        import triton.backends.nvidia  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
    except ImportError as e:
        print(json.dumps({"skip": f"this triton cannot compile Gluon for sm_90 here: {e}"}))
        return 0
    for item in items:
        print(json.dumps({**item, **compile_item(item)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
