"""A/B of the Triton dK/dV kernel's heaviest-first 1-D grid (backward.dkdv_lpt_units): the Triton
default backward (family 0) with the rule vs LPT_UNITS 0 for the dK/dV kernel, checked bitwise equal."""
import math, sys, torch, triton
from flashtune.kernels import attention_forward, default_config
from flashtune.kernels import backward
from flashtune.shapes import REALISTIC_GRID
from flashtune.protocol import grid_shape

rows = [(s.name, s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim)
        for s in REALISTIC_GRID if s.causal and s.seq_q >= 512 and s.head_dim in (64, 128, 256)]
for d in (64, 128):
    for n in (1024, 4096):
        b, h = grid_shape(d, n)
        rows.append((f"grid-d{d}-{n}", b, h, h, n, n, d))
rule = backward.dkdv_lpt_units
print(f"{'row':28s} {'grid ms':>8s} {'lpt ms':>8s} {'speedup':>8s}")
for name, B, Hq, Hkv, Nq, Nk, D in rows:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    do = torch.randn_like(q)
    scale = 1 / math.sqrt(D)
    fc = default_config("fwd", D, q.dtype, q.device, causal=True, seq_q=Nq, seq_k=Nk)
    bc = default_config("bwd", D, q.dtype, q.device, causal=True, seq_q=Nq, seq_k=Nk, triton_only=True)
    o, lse2 = attention_forward(q, k, v, fc, causal=True, sm_scale=scale)
    fn = lambda: backward.attention_backward(do, q, k, v, o, lse2, bc, causal=True, sm_scale=scale)
    backward.dkdv_lpt_units = rule
    a = [x.clone() for x in fn()]
    t_l = triton.testing.do_bench(fn, warmup=25, rep=60, return_mode="median")
    backward.dkdv_lpt_units = lambda *a_, **k_: 0
    b_ = [x.clone() for x in fn()]
    t_g = triton.testing.do_bench(fn, warmup=25, rep=60, return_mode="median")
    backward.dkdv_lpt_units = rule
    t_l2 = triton.testing.do_bench(fn, warmup=25, rep=60, return_mode="median")
    same = all(torch.equal(x, y) for x, y in zip(a, b_))
    print(f"{name:28s} {t_g:8.3f} {min(t_l, t_l2):8.3f} {t_g / min(t_l, t_l2):8.3f} {'bitwise-equal' if same else 'DIFFERENT'}  {bc}")
    sys.stdout.flush()
