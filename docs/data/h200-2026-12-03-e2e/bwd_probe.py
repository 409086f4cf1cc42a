"""Where the end-to-end backward's time goes on grouped-query rows: do_bench vs graph vs host vs kernels."""
import dataclasses, time, sys
import torch, triton
import flashtune
from flashtune.kernels import default_config
from flashtune.protocol import capture_graph

bf = torch.bfloat16
rows = {"70b-tp8": (2, 8, 1, 4096), "llama3-8b": (1, 32, 8, 8192), "mistral": (4, 32, 8, 2048), "qwen": (1, 28, 4, 4096)}
which = sys.argv[1:] or list(rows)
for name in which:
    B, Hq, Hkv, N = rows[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, N, 128, device="cuda", dtype=bf, generator=g)
    k = torch.randn(B, Hkv, N, 128, device="cuda", dtype=bf, generator=g)
    v = torch.randn(B, Hkv, N, 128, device="cuda", dtype=bf, generator=g)
    do = torch.randn_like(q)
    tri = default_config("bwd", 128, bf, "cuda", causal=True, triton_only=True)
    fam1 = default_config("bwd", 128, bf, "cuda", causal=True, seq_q=N)
    for label, cfg in (("default", None), ("triton", tri), ("fam1-s4", dataclasses.replace(fam1, dkdv_split=4))):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = flashtune.attention(*leaves, causal=True, bwd_config=cfg)
        fn = lambda: o.backward(do, retain_graph=True)
        fn(); torch.cuda.synchronize()
        t_bench = triton.testing.do_bench(fn, warmup=10, rep=50, grad_to_none=leaves, return_mode="median")
        # host time per call: no sync inside the loop
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(20):
            fn()
        t_host = (time.perf_counter() - t0) / 20 * 1e3
        torch.cuda.synchronize(); t_all = (time.perf_counter() - t0) / 20 * 1e3
        try:
            graph = capture_graph(fn, q.device)
            t_graph = triton.testing.do_bench(graph.replay, warmup=10, rep=50, return_mode="median")
        except Exception as e:  # noqa
            t_graph = float("nan"); print("  graph failed", type(e).__name__, str(e)[:200])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        ks = {}
        for a in prof.key_averages():
            if a.device_type == torch.autograd.DeviceType.CUDA or "kernel" in a.key:
                tot = getattr(a, "device_time_total", 0) or 0
                if tot:
                    ks[a.key[:32]] = round(tot / 10, 1)
        print(f"{name} {label}: do_bench {t_bench:.3f} ms, graph {t_graph:.3f}, host/call {t_host:.3f}, "
              f"wall/call {t_all:.3f}; kernels (us/call) {ks}", flush=True)
