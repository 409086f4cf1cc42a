"""Where decode-mqa-d256-b16-8k's time goes: the split kernel and the combine, per config."""
import itertools, json, sys, time
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashtune.kernels.config import FwdConfig, ConfigError
from flashtune.kernels.forward import attention_forward
from flashtune.kernels import decode

rows = {"mqa": (16, 8, 1, 8192, 256), "b1-64k": (1, 32, 8, 65536, 128)}
which = sys.argv[1:] or ["mqa"]
dev = "cuda"
x = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev); y = torch.empty_like(x)
t = triton.testing.do_bench(lambda: y.copy_(x), warmup=10, rep=100)
copy_bw = 2 * x.numel() * 2 / (t * 1e-3)
t = triton.testing.do_bench(lambda: x.sum(dtype=torch.float32), warmup=10, rep=100)
read_bw = x.numel() * 2 / (t * 1e-3)
print(f"copy {copy_bw/1e12:.3f} TB/s  sum-read {read_bw/1e12:.3f} TB/s", flush=True)
del x, y
out = {}
for name in which:
    B, Hq, Hkv, N, D = rows[name]
    torch.manual_seed(0)
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    kv_bytes = 2 * k.numel() * 2
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(Hq // Hkv, 1),
                                         v.float().repeat_interleave(Hq // Hkv, 1))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        tc = triton.testing.do_bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), warmup=10, rep=50)
    print(f"{name}: cudnn {tc*1e3:.1f} us = {kv_bytes/(tc*1e-3)/copy_bw:.3f} of copy", flush=True)
    res = []
    for bn, st, w, sp in itertools.product((32, 64, 128), (2, 3, 4, 5), (4, 8), (4, 8, 16, 32, 64)):
        cfg = FwdConfig(64, bn, w, st, num_splits=sp, pack_gqa=1)
        try:
            cfg.validate(D, torch.bfloat16, dev)
        except ConfigError:
            continue
        fn = lambda: attention_forward(q, k, v, cfg, causal=False, sm_scale=D ** -0.5)
        try:
            o, _ = fn()
        except Exception as e:  # noqa
            print("  fail", cfg, type(e).__name__, str(e)[:100]); continue
        err = (o.float() - ref).abs().max().item()
        tt = triton.testing.do_bench(fn, warmup=5, rep=25)
        res.append((tt, bn, st, w, sp, err))
    res.sort()
    for tt, bn, st, w, sp, err in res[:12]:
        print(f"  bn{bn} s{st} w{w} sp{sp}: {tt*1e3:.1f} us = {kv_bytes/(tt*1e-3)/copy_bw:.3f} of copy  err {err:.1e}")
    # per-kernel times of the best five by the profiler
    for tt, bn, st, w, sp, err in res[:5]:
        cfg = FwdConfig(64, bn, w, st, num_splits=sp, pack_gqa=1)
        fn = lambda: attention_forward(q, k, v, cfg, causal=False, sm_scale=D ** -0.5)
        for _ in range(5): fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(30): fn()
            torch.cuda.synchronize()
        times = {}
        for a in prof.key_averages():
            if "kernel" in a.key or "Kernel" in a.key:
                tot = getattr(a, "device_time_total", None) or getattr(a, "cuda_time_total", 0)
                times[a.key[:40]] = round(tot / max(a.count, 1), 1)
        print(f"  profile bn{bn} s{st} w{w} sp{sp}:", times, flush=True)
    out[name] = dict(copy_bw=copy_bw, read_bw=read_bw, cudnn_us=tc * 1e3, results=res)
import os
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_probe.json"), "w"))
