"""Decode rows in one process, launch plans on (as served): the default config (resolved as
flashtune.attention resolves it) and hand-picked alternatives, each checked against fp32 math
and timed by do_bench (zero-fill flush: dirty L2) and with a clean L2, rounds interleaved;
cuDNN and FA2 alongside; K/V read rate as a fraction of the copy bandwidth timed the same way."""
import sys, torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, "benchmarks")
from shapes import time_clean_l2
from flashtune.protocol import warm_up_gpu
from flashtune.kernels import decode
from flashtune.kernels.config import FwdConfig as C
from flashtune.kernels.forward import attention_forward
from flashtune.kernels.function import resolve_configs

dev = torch.device("cuda")
warm_up_gpu(dev)
db = lambda fn: float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
src = torch.empty(1 << 30, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
bw = {m: 2 * src.numel() / (t(lambda: dst.copy_(src)) * 1e-3) for m, t in (("db", db), ("clean", lambda f: time_clean_l2(f, dev)))}
del src, dst
print(f"copy bw do_bench {bw['db']/1e12:.3f} TB/s, clean {bw['clean']/1e12:.3f} TB/s", flush=True)
ALT = [C(64, 128, 4, 1, tma=1), C(64, 128, 4, 2, tma=1), C(64, 128, 4, 3, tma=1), C(64, 64, 4, 2), C(64, 64, 4, 2, tma=1),
       C(64, 64, 4, 3, tma=1), C(64, 128, 8, 2, tma=1), C(64, 128, 4, 2, tma=1, num_splits=2)]
ROWS = {"decode-b1-64k": ((1, 32, 8, 65536, 128), ALT[:2]), "decode-b32-4k": ((32, 32, 8, 4096, 128), ALT),
        "decode-b128-2k-70b": ((128, 64, 8, 2048, 128), ALT), "decode-mqa-d256-b16-8k": ((16, 8, 1, 8192, 256), [])}
ROUNDS = 2
for name in sys.argv[1:] or ROWS:
    (B, Hq, Hkv, N, D), alts = ROWS[name]
    torch.manual_seed(0)
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    kvb = 2 * k.numel() * 2
    frac = lambda ms, m: kvb / (ms * 1e-3) / bw[m]
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    default, _ = resolve_configs(q, None, None, False, seq_k=N, heads_kv=Hkv)
    cands = {"cudnn": None, "fa2": None, "default": default}
    for c in alts:
        c = c.validate(D, torch.bfloat16, dev)
        if c != default:
            cands[f"bn{c.BLOCK_N} w{c.num_warps} s{c.num_stages} tma{c.tma} sp{c.num_splits}"] = c
    fns = {}
    for nm, c in cands.items():
        if c is None:
            be = SDPBackend.CUDNN_ATTENTION if nm == "cudnn" else SDPBackend.FLASH_ATTENTION
            def f(be=be):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        else:
            f = lambda c=c: attention_forward(q, k, v, c, causal=False, sm_scale=D ** -0.5)[0]
        err = (f().float() - ref).abs().max().item()
        fns[nm] = (f, err)
    print(f"{name}: default {default} plan {decode.plan_schedule(default, B, Hq, Hkv, 1, N, dev)}", flush=True)
    times = {nm: [] for nm in fns}
    for _ in range(ROUNDS):
        for nm, (f, _) in fns.items():
            times[nm].append((db(f), time_clean_l2(f, dev)))
    best = {m: min(min(x[i] for x in times[b]) for b in ("cudnn", "fa2")) for i, m in enumerate(("db", "clean"))}
    for nm, (f, err) in fns.items():
        a, c = (min(x[i] for x in times[nm]) for i in (0, 1))
        print(f"  {nm:28s} do_bench {a*1e3:6.1f}us={frac(a,'db'):.3f} /best {best['db']/a:.3f} | clean {c*1e3:6.1f}us="
              f"{frac(c,'clean'):.3f} /best {best['clean']/c:.3f} | err {err:.1e}", flush=True)
