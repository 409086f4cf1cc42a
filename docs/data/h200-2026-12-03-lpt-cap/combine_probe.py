"""Decode rows: clean-L2 wall time with the combine cut by columns (decode.combine_parts)
or one program per row (COMBINE_PROGRAMS_PER_SM = 0), per num_splits, with per-kernel times
(profiler); cuDNN alongside."""
import sys, torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, "benchmarks")
from shapes import time_clean_l2
from flashtune.kernels.config import FwdConfig
from flashtune.kernels.forward import attention_forward
from flashtune.kernels import decode, default_config, launch
launch.ENABLED = False  # a launch plan would replay the first call's combine grid
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
ROWS = {"b1-64k": ((1, 32, 8, 65536, 128), [(None, None, None, 0), (128, 1, 1, 47), (128, 1, 1, 128)]),
        "mqa-d256": ((16, 8, 1, 8192, 256), [(None, None, None, 0), (64, 3, 0, 16)]),
        "b32-4k": ((32, 32, 8, 4096, 128), [(None, None, None, 0), (128, 1, 1, 2), (128, 1, 1, 3), (128, 2, 1, 2), (64, 2, 0, 2)]),
        "b128-2k": ((128, 64, 8, 2048, 128), [(None, None, None, 0), (64, 2, 0, 0), (128, 1, 1, 2)])}
saved = decode.COMBINE_PROGRAMS_PER_SM
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
        res, outs = {}, {}
        for cut in (False, True, False, True):
            decode.COMBINE_PROGRAMS_PER_SM = saved if cut else 0
            outs[cut] = fn()
            res.setdefault(cut, []).append(time_clean_l2(fn, dev))
        err = max((outs[True][i].float() - outs[False][i].float()).abs().max().item() for i in (0, 1))
        t0, t1 = min(res[False]), min(res[True])
        print(f"  bn{cfg.BLOCK_N} s{cfg.num_stages} tma{cfg.tma} sp{sp}: row {t0*1e3:.1f} us = {kvb/(t0*1e-3)/cbw:.3f}"
              f" | cut {t1*1e3:.1f} us = {kvb/(t1*1e-3)/cbw:.3f} ({t0/t1:.3f}x) | cut/cudnn {tc/t1:.3f} | maxdiff {err:.1e}  {prof(fn)}", flush=True)
    decode.COMBINE_PROGRAMS_PER_SM = saved
