"""Decode rows: clean-L2 wall time with the combine as a programmatic dependent (PDL) or
not, per num_splits, with per-kernel times (profiler); cuDNN alongside."""
import sys, torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, "benchmarks")
from shapes import time_clean_l2
from flashtune.kernels.config import FwdConfig
from flashtune.kernels.forward import attention_forward
from flashtune.kernels import decode, default_config
dev = torch.device("cuda")
src = torch.empty(1 << 30, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
cbw = 2 * src.numel() / (time_clean_l2(lambda: dst.copy_(src), dev) * 1e-3)
del src, dst
print(f"clean copy bw {cbw/1e12:.3f} TB/s")
def prof(fn):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(20): fn()
        torch.cuda.synchronize()
    out = {}
    for a in p.key_averages():
        tot = getattr(a, "device_time_total", None) or getattr(a, "cuda_time_total", 0)
        if tot: out[a.key[:18]] = round(tot / max(a.count, 1), 1)
    return out
ROWS = {"b1-64k": ((1, 32, 8, 65536, 128), [(128, 1, 1, s) for s in (0, 32, 47, 86, 128)] + [(64, 2, 0, 0), (64, 2, 0, 47)]),
        "mqa-d256": ((16, 8, 1, 8192, 256), [(None, None, None, 0), (64, 3, 0, 8), (64, 3, 0, 16)]),
        "b32-4k": ((32, 32, 8, 4096, 128), [(None, None, None, 0), (128, 1, 1, 2), (128, 2, 1, 2)])}
for name in sys.argv[1:] or ROWS:
    (B, Hq, Hkv, N, D), cfgs = ROWS[name]
    torch.manual_seed(0)
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    kvb = 2 * k.numel() * 2
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        tc = time_clean_l2(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), dev)
    print(f"{name}: cudnn {tc*1e3:.1f} us = {kvb/(tc*1e-3)/cbw:.3f}", flush=True)
    for bn, st, tma, sp in cfgs:
        if bn is None:
            cfg = default_config("fwd", D, torch.bfloat16, dev, causal=False, seq_q=1, seq_k=N)
        else:
            cfg = FwdConfig(64, bn, 4, st, tma=tma, num_splits=sp, pack_gqa=1)
        fn = lambda: attention_forward(q, k, v, cfg, causal=False, sm_scale=D ** -0.5)
        res = {}
        for pdl in (False, True, False, True):
            decode.COMBINE_PDL = pdl
            try:
                out = fn()
            except Exception as e:
                print("fail", cfg, e); break
            res.setdefault(pdl, []).append(time_clean_l2(fn, dev))
        else:
            t0, t1 = min(res[False]), min(res[True])
            print(f"  bn{cfg.BLOCK_N} s{cfg.num_stages} tma{cfg.tma} sp{sp}: plain {t0*1e3:.1f} us = {kvb/(t0*1e-3)/cbw:.3f}"
                  f" | pdl {t1*1e3:.1f} us = {kvb/(t1*1e-3)/cbw:.3f} ({t0/t1:.3f}x) | cudnn/pdl {tc/t1:.3f}  {prof(fn)}", flush=True)
    decode.COMBINE_PDL = True
