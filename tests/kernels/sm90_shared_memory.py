"""Compile flashtune's kernels for sm_90 (H100/H200) without a GPU; print shared memory.

Run as a script with TRITON_INTERPRET unset (the interpreter replaces the kernels by
Python functions). Reads a JSON list of {"pass", "config", "head_dim", "dtype", "causal"}
(optionally "softcap", "window", "varlen", "dropout": the SOFTCAP/WINDOW/VARLEN/DROPOUT
variants; for an fp8 forward "v_keys_contiguous": V with unit key stride instead of unit
head-dim stride) on
stdin and prints one JSON line per item with the compiled kernels' shared memory in bytes
("shared": one number per kernel) and their async global-to-shared copies in the TTGIR
("async_copies"), or "skip" when this triton cannot compile for sm_90 here. The launches'
specialisations are mimicked for contiguous tensors: unit head-dim strides, 16-byte
aligned pointers and strides; an item's "stride_align" (the kernels' STRIDE_ALIGN, default
16) below 16 mimics strides triton cannot see as multiples of 16 (a head dim of 40), and
each result then also counts the 16-bit global loads and stores the PTX does one element
at a time ("scalar_16bit": one number per kernel).
"""

from __future__ import annotations

import json
import re
import sys

TARGET = ("cuda", 90, 32)
POINTER_TYPES = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32", "float8_e4m3fn": "*fp8e4nv",
                 "float8_e5m2": "*fp8e5"}


def _source(fn, pointers: dict, scalars: dict, constexprs: dict, v_keys_contiguous: bool = False,
            strides_divisible: bool = True):
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name.startswith("stride") and name.endswith("d") and not (v_keys_contiguous and name == "stride_vd"):
            constexprs[name] = 1  # contiguous head dim: triton specialises a stride of 1
        if v_keys_contiguous and name == "stride_vn":
            constexprs[name] = 1  # V's keys contiguous (fp8.keys_contiguous)
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
            if not pointers[name].startswith("tensordesc"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = scalars.get(name, "i32")
            if name.startswith("stride") and strides_divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn, signature, constexprs, attrs)


def compile_shared(item: dict) -> tuple[list[int], list[int], list[int]]:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from flashtune.kernels.triton import backward, forward
    from flashtune.configs.backward import BwdConfig
    from flashtune.configs.base import FP8_DTYPES, padded_head_dim
    from flashtune.configs.forward import FwdConfig

    p = POINTER_TYPES[item["dtype"]]
    D = item["head_dim"]
    fp8 = getattr(torch, item["dtype"]) in FP8_DTYPES
    block_d = padded_head_dim(D, getattr(torch, item["dtype"]))

    def desc(rows: int, tma: int, pointer: str = p) -> str:
        # a TMA config's descriptor argument (4-d, one [rows, BLOCK_D] tile of a head); else the pointer
        return f"tensordesc<{pointer[1:]}[1,1,{rows},{block_d}]>" if tma else pointer

    varlen = bool(item.get("varlen"))  # packed sequences: pointer loads (tma ignored), no split dK/dV
    common = {"CAUSAL": item["causal"], "HEAD_DIM": D, "BLOCK_D": block_d,
              "PRECISION": "tf32" if item["dtype"] == "float32" else "ieee", "INT64": False,
              "SOFTCAP": bool(item.get("softcap")), "WINDOW": bool(item.get("window")), "VARLEN": varlen,
              "DROPOUT": bool(item.get("dropout")), "STRIDE_ALIGN": item.get("stride_align", 16)}
    cu = dict.fromkeys(("CU_Q", "CU_K"), "*i32" if varlen else "*fp32")  # unused without varlen
    cu["RNG"] = "*i64" if item.get("dropout") else "*fp32"  # the dropout's (seed, offset); else unused
    if item["pass"] == "fwd":
        cfg = FwdConfig.from_dict(item["config"])
        tma = cfg.tma and not varlen
        pointers = {"Q": p, "K": p, "V": p, "O": "*bf16" if fp8 else p, "LSE": "*fp32", **cu}
        pointers.update(DescK=desc(cfg.BLOCK_N, tma), DescV=desc(cfg.BLOCK_N, tma))
        kernels = [(forward._attn_fwd_kernel, pointers,
                    {"BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "TMA": bool(tma),
                     "SCALE_POSITIVE": not item.get("softcap"), "FP8": fp8})]
    else:
        cfg = BwdConfig.from_dict(item["config"])
        tma = cfg.tma and not varlen
        pointers = {"Q": p, "K": p, "V": p, "DO": p, "LSE": "*fp32", "DELTA": "*fp32", **cu}
        desc1, desc2 = desc(cfg.BLOCK_M1, tma), desc(cfg.BLOCK_N2, tma)
        tma_dq = cfg.atomic_dq and tma  # dQ's bulk reduce-adds through a descriptor
        dkdv = {**pointers, "DQA": "*fp32", "DescQ": desc1, "DescDO": desc1,
                "DescDQA": desc(cfg.BLOCK_M1, tma_dq, "*fp32")}
        dkdv_blocks = {"BLOCK_M": cfg.BLOCK_M1, "BLOCK_N": cfg.BLOCK_N1, "ATOMIC_DQ": bool(cfg.atomic_dq),
                       "TMA": bool(tma), "TMA_DQ": bool(tma_dq)}
        # the dK/dV kernel storing dK/dV, and (dkdv_split, never with varlen) storing fp32 partials
        kernels = [(backward._bwd_dkdv_kernel, {**dkdv, "DK": p, "DV": p}, {**dkdv_blocks, "PARTIAL": False},
                    (cfg.num_warps, cfg.num_stages))]
        if not varlen:
            kernels.append((backward._bwd_dkdv_kernel, {**dkdv, "DK": "*fp32", "DV": "*fp32"},
                            {**dkdv_blocks, "PARTIAL": True}, (cfg.num_warps, cfg.num_stages)))
        # the dQ kernel also runs for an atomic config under deterministic mode
        kernels.append((backward._bwd_dq_kernel, {**pointers, "DQ": p, "DescK": desc2, "DescV": desc2},
                        {"BLOCK_M": cfg.BLOCK_M2, "BLOCK_N": cfg.BLOCK_N2, "TMA": bool(tma)},
                        (cfg.dq_num_warps, cfg.dq_num_stages)))
    shared, copies, scalar = [], [], []
    for fn, pointers, blocks, (warps, stages) in (kernels if item["pass"] != "fwd" else
                                                  [(*k, (cfg.num_warps, cfg.num_stages)) for k in kernels]):
        scalars = {"qk_scale": "fp32", "sm_scale": "fp32", "softcap_log2": "fp32", "v_descale": "fp32",
                   "drop_scale": "fp32"}
        src = _source(fn, pointers, scalars, {**common, **blocks}, bool(item.get("v_keys_contiguous")),
                      common["STRIDE_ALIGN"] == 16)
        compiled = triton.compile(src, target=GPUTarget(*TARGET), options={"num_warps": warps, "num_stages": stages})
        shared.append(int(compiled.metadata.shared))
        copies.append(compiled.asm["ttgir"].count("ttg.async_copy_global_to_local"))
        scalar.append(len(re.findall(r"\b(?:ld|st)\.global(?:\.[a-z0-9_:]+)*\.b16\s", compiled.asm["ptx"])))
    return shared, copies, scalar


def main() -> int:
    items = json.load(sys.stdin)
    try:
        import triton.backends.nvidia  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as e:
        print(json.dumps({"skip": f"this triton cannot compile for sm_90 here: {e}"}))
        return 0
    for item in items:
        shared, copies, scalar = compile_shared(item)
        print(json.dumps({**item, "shared": shared, "async_copies": copies, "scalar_16bit": scalar}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
