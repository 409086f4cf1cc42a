"""decode-mqa-d256-b16-8k (B16, 8 query heads, 1 K/V head, 8192 keys, D=256, bf16): where its
do_bench figure goes. In one process: the default and one-stage / split alternatives (each checked
against fp32 math), cuDNN and FA2, timed by do_bench (zero-fill flush: the L2 left full of dirty
lines) and with a clean L2 (time_clean_l2); and device copies of 1 GiB and of the row's own K/V
bytes timed the same two ways, so that the dirty flush's fixed write-back is seen on a plain copy
of the same size. Run twice by the command of README.txt: as flashtune is, and with every
load_tile load given eviction_policy="evict_first" (the only load form whose hint triton 3.6
keeps is a one-stage pointer load)."""
import os, sys, torch, triton
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
clean = lambda fn: time_clean_l2(fn, dev)
B, Hq, Hkv, N, D = 16, 8, 1, 8192, 256
torch.manual_seed(0)
q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
kvb = 2 * k.numel() * 2
print(f"variant {os.environ.get('PROBE_VARIANT', 'as is')}; K/V bytes {kvb / 2**20:.0f} MiB", flush=True)
copies = {}
for label, nbytes in (("1GiB", 1 << 30), ("kv/2", kvb // 2), ("kv", kvb)):
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
    f = lambda: dst.copy_(src)
    copies[label] = {m: 2 * nbytes / (t(f) * 1e-3) for m, t in (("db", db), ("clean", clean))}
    print(f"copy {label:5s} ({2 * nbytes / 2**20:5.0f} MiB moved): do_bench {copies[label]['db'] / 1e12:.3f} TB/s, "
          f"clean {copies[label]['clean'] / 1e12:.3f} TB/s", flush=True)
    del src, dst
with sdpa_kernel([SDPBackend.MATH]):
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
default, _ = resolve_configs(q, None, None, False, seq_k=N, heads_kv=Hkv)
ALT = [C(64, 64, 4, 1), C(64, 32, 4, 1), C(64, 64, 8, 1), C(64, 64, 4, 1, num_splits=16), C(64, 64, 4, 2),
       C(64, 64, 4, 3, num_splits=16), C(64, 32, 4, 2), C(32, 64, 4, 1)]
cands = {"cudnn": None, "fa2": None, "default": default}
for c in ALT:
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
    fns[nm] = (f, (f().float() - ref).abs().max().item())
print(f"default {default} plan {decode.plan_schedule(default, B, Hq, Hkv, 1, N, dev)}", flush=True)
times = {nm: [] for nm in fns}
for _ in range(2):
    for nm, (f, _) in fns.items():
        times[nm].append((db(f), clean(f)))
best = {m: min(min(x[i] for x in times[b]) for b in ("cudnn", "fa2")) for i, m in enumerate(("db", "clean"))}
for nm, (f, err) in fns.items():
    a, c = (min(x[i] for x in times[nm]) for i in (0, 1))
    fr = lambda ms, m, size: kvb / (ms * 1e-3) / copies[size][m]
    print(f"  {nm:26s} do_bench {a*1e3:6.1f}us {fr(a, 'db', '1GiB'):.3f} of 1GiB copy, {fr(a, 'db', 'kv/2'):.3f} of same-bytes copy,"
          f" /best {best['db']/a:.3f} | clean {c*1e3:6.1f}us {fr(c, 'clean', '1GiB'):.3f}, /best {best['clean']/c:.3f} | err {err:.1e}",
          flush=True)
