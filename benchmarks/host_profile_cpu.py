"""flashtune's own Python per training call, without a GPU (issue 14): the tuned callable's and
flashtune.attention's forward + backward on tiny CPU tensors under the interpreter, with the
kernels' launches stubbed out after the launch plans are recorded, against an empty Python
autograd.Function of the same shape and torch SDPA on the CPU. On the CPU autograd runs the
backward on the calling thread, so the difference to the H200's figures
(benchmarks/host_profile_gpu.py) is autograd's CUDA path. Figures: docs/dispatch-overhead.md.

    python3 benchmarks/host_profile_cpu.py
"""
import os, time, statistics
os.environ["TRITON_INTERPRET"] = "1"
import torch, flashtune
from flashtune.kernels import forward as fw, backward as bw, decode as dc
torch.manual_seed(0)
N, D = 32, 16
q, k, v = (torch.randn(1, 1, N, D, dtype=torch.float32) for _ in range(3))
qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
do = torch.randn_like(q)
tuned = flashtune.get_tuned_attention("/tmp/none.db", device="cpu")
f = lambda: torch.autograd.grad(tuned(qg, kg, vg), (qg, kg, vg), do)
fa = lambda: torch.autograd.grad(flashtune.attention(qg, kg, vg), (qg, kg, vg), do)
f(); f(); fa(); fa()
for kern in (fw._attn_fwd_kernel, bw._bwd_dkdv_kernel, bw._bwd_dq_kernel, bw._bwd_preprocess_kernel):
    kern.run = lambda *a, **kw: None
class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c):
        ctx.save_for_backward(a, b, c)
        return torch.empty_like(a)
    @staticmethod
    def backward(ctx, g):
        a, b, c = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b), torch.empty_like(c)
rows = {"tuned fwd+bwd (kernels stubbed)": f, "attention fwd+bwd (stubbed)": fa,
        "tuned fwd (stubbed)": lambda: tuned(q, k, v),
        "empty Function fwd+bwd": lambda: torch.autograd.grad(Ident.apply(qg, kg, vg), (qg, kg, vg), do),
        "sdpa fwd+bwd cpu": lambda: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(qg, kg, vg), (qg, kg, vg), do)}
def us(fn, iters=3000, rep=5):
    for _ in range(100): fn()
    r = []
    for _ in range(rep):
        t = time.perf_counter()
        for _ in range(iters): fn()
        r.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(r)
for n, fn in rows.items(): print(f"{n:36s} {us(fn):7.1f}")
import cProfile, pstats, io
pr = cProfile.Profile(); pr.enable()
for _ in range(3000): f()
pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
