"""Where a small call's host time goes on the GPU (issue 14 diagnosis): the pieces of the
launch path (triton's binder, its run wrapper, the compiled launcher alone, allocations,
stream lookups) against the whole calls, B=1 H=1 N=128 D=64 bf16, microseconds per call
(median of 5 rounds of 2000, synchronised), then a cProfile of the drop-in's forward +
backward. Figures: docs/dispatch-overhead.md.

    python3 benchmarks/host_profile_gpu.py
"""
import cProfile, io, pstats, statistics, time, sys
import torch, torch.nn.functional as F
import flashtune
from flashtune.kernels import attention_forward, attention_backward, default_config
import flashtune.kernels.forward as fw
from flashtune.kernels.common import torch_fp32_precision
import triton
from triton import knobs
from triton.runtime import driver

dev = "cuda"
N, D = 128, 64
q, k, v = (torch.randn(1, 1, N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
do = torch.randn_like(q)
fwd = default_config("fwd", D, q.dtype, q.device, causal=False)
bwd = default_config("bwd", D, q.dtype, q.device, causal=False)
tuned = flashtune.get_tuned_attention("/tmp/none.db", device=dev)

def us(fn, iters=2000, rep=5):
    for _ in range(50): fn()
    r = []
    for _ in range(rep):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(iters): fn()
        torch.cuda.synchronize(); r.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(r)

cap = {}
orig = fw._attn_fwd_kernel.run
def rec(*a, **kw):
    cap["a"], cap["kw"] = a, dict(kw)
    kern = orig(*a, **kw); cap["kern"] = kern; return kern
fw._attn_fwd_kernel.run = rec
o, lse2 = attention_forward(q, k, v, fwd, causal=False, sm_scale=D ** -0.5)
fw._attn_fwd_kernel.run = orig
a, kw, kern = cap["a"], cap["kw"], cap["kern"]
grid = kw["grid"]
print("fwd config", fwd, "grid", grid, "nargs", len(a) + len(kw))
# bound args in signature order
binder = fw._attn_fwd_kernel.device_caches[0][4]
bound, spec, opts = binder(*a, **{x: y for x, y in kw.items() if x not in ("grid", "warmup")})
vals = tuple(bound.values())
stream = driver.active.get_current_stream(0)
run = kern.run; fn_ = kern.function; pm = kern.packed_metadata
rows = {
 "sdpa fwd": lambda: F.scaled_dot_product_attention(q, k, v),
 "direct attention_forward": lambda: attention_forward(q, k, v, fwd, causal=False, sm_scale=D ** -0.5),
 "jit .run prebuilt args": lambda: orig(*a, **kw),
 "binder only": lambda: binder(*a, **{x: y for x, y in kw.items() if x not in ("grid", "warmup")}),
 "compiled launcher direct": lambda: run(grid[0], grid[1], grid[2], stream, fn_, pm, None, None, None, *vals),
 "get_current_stream": lambda: driver.active.get_current_stream(driver.active.get_current_device()),
 "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
 "empty_like": lambda: torch.empty_like(q),
 "empty lse": lambda: torch.empty((1, 1, N), device=q.device, dtype=torch.float32),
 "q.device": lambda: q.device,
 "torch_fp32_precision": lambda: torch_fp32_precision(q.dtype),
 "is_grad_enabled": lambda: torch.is_grad_enabled(),
 "is_compiling": lambda: torch.compiler.is_compiling(),
 "tuned fwd (no grad tensors)": lambda: tuned(q, k, v),
 "flashtune.attention fwd": lambda: flashtune.attention(q, k, v, fwd_config=fwd, bwd_config=bwd),
 "direct attention_backward": lambda: attention_backward(do, q, k, v, o, lse2, bwd, causal=False, sm_scale=D ** -0.5),
 "sdpa fwd+bwd": lambda: torch.autograd.grad(F.scaled_dot_product_attention(qg, kg, vg), (qg, kg, vg), do),
 "tuned fwd+bwd": lambda: torch.autograd.grad(tuned(qg, kg, vg), (qg, kg, vg), do),
}
from autograd_floor import EmptyAttentionFunction  # benchmarks/
rows["python Function floor fwd+bwd"] = lambda: torch.autograd.grad(EmptyAttentionFunction.apply(qg, kg, vg),
                                                                    (qg, kg, vg), do)
rows["grad of q*1 floor"] = lambda: torch.autograd.grad(qg * 1, (qg,), do)
# What other Python-side attention pays for autograd on this host: torch.compile's training
# graphs run their backward through AOTAutograd's CompiledFunction (a Python autograd.Function),
# and FlexAttention, the Triton peer, is used compiled.
_times1 = torch.compile(lambda x: x * 1)
rows["compiled q*1 fwd+bwd (AOTAutograd)"] = lambda: torch.autograd.grad(_times1(qg), (qg,), do)
try:
    from torch.nn.attention.flex_attention import flex_attention
    _flex = torch.compile(flex_attention)
    rows["flex_attention compiled fwd"] = lambda: _flex(q, k, v)
    rows["flex_attention compiled fwd+bwd"] = lambda: torch.autograd.grad(_flex(qg, kg, vg), (qg, kg, vg), do)
except ImportError:  # pragma: no cover - older torch
    pass
for name, f in rows.items():
    print(f"{name:42s} {us(f):8.2f}")
pr = cProfile.Profile()
f = rows["tuned fwd+bwd"]
pr.enable()
for _ in range(2000): f()
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40); print(s.getvalue()[:9000])
