"""Compile the Gluon forward (kernels/gluon/forward.py) or, with "kernel": "bwd" in an item,
the Gluon dK/dV kernel (kernels/gluon/backward.py; with "bwd_kernel": "dq" the Gluon dQ kernel of
kernels/gluon/backward_dq.py, with "wide" the D=256 dK/dV kernel of kernels/gluon/backward_wide.py)
for sm_90 without a GPU.

Run as a script with TRITON_INTERPRET unset. Reads a JSON list of {"config", "head_dim",
"dtype", "causal"} (optionally "window": the sliding-window variant; "trace": the kernel's
instrumentation; "scale_positive": false, the forward's softmax for a negative sm_scale;
"tma_store": false, the forward's output stored from registers (an output the copy engine cannot
address); "tma_dkdv": false, the dK/dV kernel's outputs stored from registers) on stdin and prints
one JSON line per item with the compiled kernel's shared memory in bytes ("shared"), its PTX
register cap ("maxnreg"), the setmaxnreg values of its partitions ("setmaxnreg"), its wgmma and TMA
copy, reduce-add and bulk-store counts and bulk-store waits, its cycle-counter reads ("clock_reads":
the trace's stamps), its ex2.approx instructions and polynomial exponentials ("ex2", "poly_exp2s":
the split exponential's magic constant), with "ptxas": true also ptxas's registers and spill bytes a
thread ("registers", "spill_stores", "spill_loads") and the SASS's HGMMAs and those waited for one by
one ("hgmma", "hgmma_waited"), or one {"skip": ...} line when this triton cannot compile Gluon for
sm_90 here.
"""

from __future__ import annotations

import json
import re
import sys


def compile_item(item: dict) -> dict:
    import torch

    dtype = getattr(torch, item["dtype"])
    if item.get("kernel") == "bwd":
        from flashtune.configs.gluon import GluonBwdConfig
        from flashtune.kernels.gluon.backward_launch import compile_for_sm90 as compile_bwd, compile_wide_for_sm90

        cfg = GluonBwdConfig(**item["config"])
        if item.get("bwd_kernel") == "wide":  # the D=256 dK/dV kernel
            compiled = compile_wide_for_sm90(cfg, dtype, item["causal"])
        else:  # the Gluon dK/dV kernel, or its dQ kernel
            compiled = compile_bwd(cfg, item["head_dim"], dtype, item["causal"], item.get("bwd_kernel", "dkdv"),
                                   trace=item.get("trace", False), tma_dkdv=item.get("tma_dkdv", True))
    else:
        from flashtune.configs.gluon import GluonFwdConfig
        from flashtune.kernels.gluon.forward_launch import compile_for_sm90

        compiled = compile_for_sm90(GluonFwdConfig(**item["config"]), item["head_dim"], dtype, item["causal"],
                                    item.get("window", False), trace=item.get("trace", False),
                                    scale_positive=item.get("scale_positive", True),
                                    tma_store=item.get("tma_store", True))
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
