"""Experiment: the forward with Hopper's tensor-memory-accelerator loads (TMA, through
host tensor descriptors) against flashtune's pointer-load forward and SDPA's cuDNN.

flashtune's kernels load tiles through tensors of pointers (cp.async on sm_90). A
TMA load moves a whole tile with one instruction and needs no per-element address
registers, which matters most where registers are tight (D=128). This script holds a
forward that is flashtune's algorithm with Q/K/V loaded and O stored through
``triton.tools.tensor_descriptor.TensorDescriptor``s (out-of-range rows and head-dim
padding come back as zeros from the copy engine, so those loads need no masks), to find
out on the GPU whether the kernels should gain a TMA variant. It is not part of the
package; its loop mirrors flashtune/kernels/forward.py's _fwd_inner on purpose (only the loads
differ) and goes away once a TMA path, if it wins, lives in the kernels.

For each (D, causal, N) of the standard grid's shapes (bf16, 16k tokens, width 2048)
and each config, both variants are checked against each other (O and the log-sum-exp)
and timed side by side with cuDNN (triton.testing.do_bench median). TMA needs 16-byte
aligned strides and base: the inputs here are contiguous.

    python benchmarks/fwd_tma.py --out fwd_tma.json
    python benchmarks/fwd_tma.py --device cpu      # correctness smoke run under the interpreter
"""

from __future__ import annotations

import argparse
import json
import os
import sys

CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 3)]


# The interpreter is chosen when triton is imported: before the kernels below are defined.
if "--device" in sys.argv[:-1] and sys.argv[sys.argv.index("--device") + 1].startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashtune.kernels.common import key_range  # noqa: E402


@triton.jit
def _inner(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hk, offs_m, lo, hi, N_K, qk_scale,
           MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
           WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([off_b, off_hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if MASK:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            valid = offs_n[None, :] < N_K
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= offs_m[:, None])
            qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([off_b, off_hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i

@triton.jit
def fwd_tma(desc_q, desc_k, desc_v, desc_o, LSE, qk_scale, H, GROUP, N_Q, N_K,
            CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            WS: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([off_b, off_h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full_hi, hi = key_range(start_m, N_K, CAUSAL, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _inner(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hk, offs_m, 0, full_hi, N_K,
                           qk_scale, False, CAUSAL, BLOCK_D, BLOCK_N, WS)
    acc, l_i, m_i = _inner(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hk, offs_m, full_hi, hi, N_K,
                           qk_scale, True, CAUSAL, BLOCK_D, BLOCK_N, False)
    acc = acc / l_i[:, None]
    desc_o.store([off_b, off_h, start_m, 0], acc.to(desc_o.dtype).reshape(1, 1, BLOCK_M, BLOCK_D))
    rows = (off_b * H + off_h).to(tl.int64) * N_Q
    tl.store(LSE + rows + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < N_Q)


def forward_tma(q, k, v, cfg, causal: bool, sm_scale: float, ws: bool = False):
    """(o, lse2) of the TMA forward; q, k, v (B, H, N, D) with 16-byte aligned strides."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from flashtune.kernels.common import LOG2E
    from flashtune.kernels.config import padded_head_dim

    block_m, block_n, warps, stages = cfg
    B, H, N_Q, D = q.shape
    bd = padded_head_dim(D)
    o = torch.empty_like(q)
    lse2 = torch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)

    def desc(t, rows):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, bd])

    fwd_tma[(triton.cdiv(N_Q, block_m), H, B)](
        desc(q, block_m), desc(k, block_n), desc(v, block_n), desc(o, block_m), lse2, sm_scale * LOG2E,
        H, H // k.shape[1], N_Q, k.shape[2], CAUSAL=causal, BLOCK_D=bd, BLOCK_M=block_m, BLOCK_N=block_n,
        WS=ws, num_warps=warps, num_stages=stages)
    return o, lse2


def run(args) -> tuple[list[dict], list[str]]:
    import torch

    from flashtune.kernels.config import FwdConfig
    from flashtune.kernels.forward import attention_forward
    from flashtune.kernels.reference import reference_attention

    device = torch.device(args.device)
    if device.type == "cuda":
        # device-side scratch for descriptors, should triton want any
        triton.set_allocator(lambda size, align, stream: torch.empty(size, device=device, dtype=torch.int8))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows, failures = [], []
    for D in args.head_dims:
        for causal in (False, True):
            for N in args.seq_lens:
                B, H = (16384 // N, 2048 // D) if device.type == "cuda" else (1, 2)
                gen = torch.Generator(device=device).manual_seed(0)
                q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, generator=gen) for _ in range(3))
                scale = D ** -0.5
                flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                row = {"D": D, "causal": causal, "N": N, "B": B, "H": H, "tflops": {}, "err": {}}
                if device.type == "cuda":
                    from torch.nn.attention import SDPBackend, sdpa_kernel

                    def cudnn():
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    row["tflops"]["cudnn"] = flops / triton.testing.do_bench(cudnn, return_mode="median") * 1e-9
                for cfg in CONFIGS if device.type == "cuda" else CONFIGS[:1]:
                    name = " ".join(map(str, cfg))
                    fc = FwdConfig(*cfg)

                    def pointer():
                        return attention_forward(q, k, v, fc, causal=causal, sm_scale=scale, fp32_precision="ieee")

                    def tma():
                        return forward_tma(q, k, v, cfg, causal, scale)

                    try:
                        (o1, l1), (o2, l2) = pointer(), tma()
                    except Exception as e:  # noqa: BLE001 - report, go on, fail at the end
                        failures.append(f"D{D} causal={causal} N{N} {name}: {type(e).__name__}: {str(e)[:300]}")
                        print(failures[-1], flush=True)
                        continue
                    row["err"][name] = max((o1.float() - o2.float()).abs().max().item(),
                                           (l1 - l2).abs().max().item())
                    if device.type != "cuda":  # the smoke run: against the plain reference too
                        ref, _ = reference_attention(q, k, v, causal=causal, sm_scale=scale, dtype=torch.float64)
                        err = (o2.double() - ref).abs().max().item()
                        if not err < 1e-4:
                            failures.append(f"D{D} causal={causal} N{N} {name}: tma forward off the reference by {err}")
                    if device.type == "cuda":
                        row["tflops"][f"pointer {name}"] = flops / triton.testing.do_bench(
                            pointer, return_mode="median") * 1e-9
                        row["tflops"][f"tma {name}"] = flops / triton.testing.do_bench(tma, return_mode="median") * 1e-9
                        # warp specialisation of the unmasked loop: documented for Blackwell; does sm_90 take it?
                        try:
                            o3, _ = forward_tma(q, k, v, cfg, causal, scale, ws=True)
                            row["err"][f"ws {name}"] = (o1.float() - o3.float()).abs().max().item()
                            row["tflops"][f"tma-ws {name}"] = flops / triton.testing.do_bench(
                                lambda: forward_tma(q, k, v, cfg, causal, scale, ws=True), return_mode="median") * 1e-9
                        except Exception as e:  # noqa: BLE001 - an answer, not a failure of the experiment
                            row.setdefault("ws_errors", {})[name] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                best = sorted(row["tflops"].items(), key=lambda x: -x[1])[:6]
                print(f"D{D} causal={causal} N{N}: max |pointer - tma| {max(row['err'].values(), default=0):.2e}; "
                      + ", ".join(f"{n} {t:.0f}" for n, t in best), flush=True)
    return rows, failures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seq-lens", type=int, nargs="+", default=None, help="default: 1k 4k 16k (cpu: 33 70)")
    ap.add_argument("--out", help="write the rows as JSON")
    args = ap.parse_args()
    args.seq_lens = args.seq_lens or ([1024, 4096, 16384] if not args.device.startswith("cpu") else [33, 70])
    rows, failures = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "failures": failures}, f, indent=1)
    worst = max((e for r in rows for e in r["err"].values()), default=float("nan"))
    print(f"worst |pointer - tma| over all rows: {worst:.2e}; {len(failures)} failed launches")
    sys.exit(1 if failures or not rows else 0)


if __name__ == "__main__":
    main()
