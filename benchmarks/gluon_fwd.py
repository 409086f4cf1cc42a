"""Time the Gluon forward (kernels/gluon_forward.py) against flashtune's Triton forward
(its default config) and SDPA's cuDNN backend on an H100/H200; print the ratios.

    python benchmarks/gluon_fwd.py [--configs all] [--dtype bf16]

Forward only, triton.testing.do_bench (median ms); TFLOP/s counts 4 x B x H x Nq x Nk x D
(halved for causal). "gluon/cudnn" > 1 means the Gluon kernel is slower. Nothing is
tuned: the Gluon configs are the default and a few neighbours (--configs all).
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.kernels import attention_forward, default_config
from flashtune.kernels.gluon_forward import GluonFwdConfig, default_gluon_config, gluon_attention_forward

SHAPES = [  # (B, H, N, D)
    (4, 16, 4096, 128),
    (4, 16, 4096, 64),
    (2, 16, 8192, 128),
]
NEIGHBOURS = [GluonFwdConfig(NUM_BUFFERS=3), GluonFwdConfig(PINGPONG=0), GluonFwdConfig(BLOCK_N=64),
              GluonFwdConfig(BLOCK_M=128, BLOCK_N=64, NUM_BUFFERS=3)]


def bench(fn) -> float:
    fn()  # compile outside the timing
    return triton.testing.do_bench(fn, warmup=50, rep=200)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--configs", choices=("default", "all"), default="default")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("needs an sm_90 GPU (H100/H200)")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, {args.dtype}")
    print(f"{'shape':>22} {'mask':>6} {'config':>22} {'gluon ms':>9} {'TFLOP/s':>8} {'triton ms':>9} "
          f"{'cudnn ms':>9} {'g/triton':>8} {'g/cudnn':>8}")
    for B, H, N, D in SHAPES:
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
        scale = 1 / math.sqrt(D)
        for causal in (False, True):
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            fwd_cfg = default_config("fwd", D, dtype, q.device, causal=causal, seq_q=N)
            t_triton = bench(lambda: attention_forward(q, k, v, fwd_cfg, causal=causal, sm_scale=scale))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                t_cudnn = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))
            configs = [default_gluon_config(D, causal)]
            if args.configs == "all":
                configs += [c for c in NEIGHBOURS if c not in configs]
            for cfg in configs:
                try:
                    cfg.validate(D, dtype, q.device)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"{cfg.short()}: {e}")
                    continue
                t = bench(lambda: gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale))
                print(f"{str((B, H, N, D)):>22} {'causal' if causal else 'full':>6} {cfg.short():>22} {t:9.3f} "
                      f"{flops / t / 1e9:8.1f} {t_triton:9.3f} {t_cudnn:9.3f} {t / t_triton:8.3f} {t / t_cudnn:8.3f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
