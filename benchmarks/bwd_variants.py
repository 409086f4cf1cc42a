"""Backward variants side by side on a GPU: the dQ kernel with shared or its own warps and
stages, against atomic dQ (accumulated in the dK/dV kernel), next to SDPA's cuDNN backward.

For each shape of the standard grid's D x causal x N (N from --seq-lens), every variant is
checked against the heuristic default's gradients (relative max error printed) and timed
with triton.testing.do_bench (median) in the same process as cuDNN.

    python benchmarks/bwd_variants.py --out bwd_variants.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import time

import torch
import triton

from flashtune.kernels.backward import attention_backward
from flashtune.kernels.config import BwdConfig, ConfigError, default_config


def variants(base: BwdConfig, head_dim: int, dtype, device) -> dict[str, BwdConfig]:
    out = {"default": base}
    for w, s in itertools.product((4, 8), (1, 2, 3)):
        out[f"separate, dQ w{w}s{s}"] = BwdConfig(base.BLOCK_M1, base.BLOCK_N1, base.BLOCK_M2, base.BLOCK_N2,
                                                  base.num_warps, base.num_stages, w, s)
    for m1, n1, (w, s) in itertools.product((32, 64, 128), (64, 128), [(4, 2), (4, 3), (8, 2), (8, 3)]):
        out[f"atomic {m1}x{n1} w{w}s{s}"] = BwdConfig(m1, n1, n1, m1, w, s, atomic_dq=1)
    valid = {}
    for name, cfg in out.items():
        try:
            valid[name] = cfg.validate(head_dim, dtype, device)
        except ConfigError:
            pass
    return valid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--out", help="write every timing as JSON")
    args = ap.parse_args()
    from triton.runtime._async_compile import AsyncCompileMode

    dev, dt = torch.device("cuda"), torch.bfloat16
    results, t0 = [], time.time()
    for D, causal in itertools.product(args.head_dims, (False, True)):
        base = default_config("bwd", D, dt, dev, causal=causal)
        cands = variants(base, D, dt, dev)
        compiled = False
        for N in args.seq_lens:
            B, H = 16384 // N, 2048 // D
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=dt) for _ in range(4))
            sm = D ** -0.5
            o, lse2 = attention_forward_default(q, k, v, causal, sm)
            if not compiled:
                with concurrent.futures.ThreadPoolExecutor(16) as pool, AsyncCompileMode(pool, ignore_errors=True):
                    for cfg in cands.values():
                        attention_backward(do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=sm, compile_only=True)
                compiled = True
            ref = attention_backward(do, q, k, v, o, lse2, base, causal=causal, sm_scale=sm)
            flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
            qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                oo = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            cudnn = triton.testing.do_bench(lambda: oo.backward(do, retain_graph=True), return_mode="median")
            row = {"D": D, "causal": causal, "N": N, "cudnn_ms": cudnn, "ms": {}, "err": {}, "configs": {}}
            for name, cfg in cands.items():
                try:
                    got = attention_backward(do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=sm)
                    row["err"][name] = max(float((a.float() - b.float()).abs().max() / b.float().abs().max())
                                           for a, b in zip(got, ref))
                    row["ms"][name] = triton.testing.do_bench(
                        lambda: attention_backward(do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=sm),
                        return_mode="median")
                    row["configs"][name] = cfg.to_dict()
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"   {name}: {type(e).__name__} {str(e)[:200]}")
            results.append(row)
            print(f"D{D} causal={causal} N{N}: cuDNN {flops / cudnn * 1e-9:.0f} TFLOPS", flush=True)
            for name, ms in sorted(row["ms"].items(), key=lambda x: x[1])[:8]:
                print(f"   {name:28s} {flops / ms * 1e-9:6.0f} TFLOPS  x{cudnn / ms:.3f} cuDNN  "
                      f"err {row['err'][name]:.1e}", flush=True)
            del q, k, v, do, o, lse2, qq, kk, vv, oo
            torch.cuda.empty_cache()
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    print(f"total {time.time() - t0:.0f} s")


def attention_forward_default(q, k, v, causal, sm_scale):
    from flashtune.kernels.forward import attention_forward

    return attention_forward(q, k, v, default_config("fwd", q.shape[-1], q.dtype, q.device, causal=causal),
                             causal=causal, sm_scale=sm_scale)


if __name__ == "__main__":
    main()
