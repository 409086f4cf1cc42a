"""Fresh process: capture the backward of a Gluon-default call (llama3-70b-tp8 shape) in a CUDA graph."""
import sys, traceback
import torch, triton
import flashtune
from flashtune.protocol import capture_graph

B, Hq, Hkv, N = 2, 8, 1, 4096
mode = sys.argv[1] if len(sys.argv) > 1 else "after-eager"
q, k, v = (torch.randn(B, h, N, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (Hq, Hkv, Hkv))
do = torch.randn(B, Hq, N, 128, device="cuda", dtype=torch.bfloat16)
from flashtune.kernels import default_config
import dataclasses
which = sys.argv[2] if len(sys.argv) > 2 else "default"
cfg = {"default": None, "triton": default_config("bwd", 128, torch.bfloat16, "cuda", causal=True, triton_only=True),
       "s4": dataclasses.replace(default_config("bwd", 128, torch.bfloat16, "cuda", causal=True, seq_q=N), dkdv_split=4),
       "s1": dataclasses.replace(default_config("bwd", 128, torch.bfloat16, "cuda", causal=True, seq_q=N), dkdv_split=1)}[which]
mode = mode + "/" + which + ("/noplans" if __import__("os").environ.get("FLASHTUNE_LAUNCH_PLANS") == "0" else "")
o = flashtune.attention(q, k, v, causal=True, bwd_config=cfg)
fn = lambda: o.backward(do, retain_graph=True)
if mode == "after-eager":
    fn(); torch.cuda.synchronize()
if mode == "after-bench":
    fn(); torch.cuda.synchronize()
    triton.testing.do_bench(fn, warmup=10, rep=50, grad_to_none=[q, k, v])
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
try:
    g = capture_graph(fn, q.device)
    g.replay(); torch.cuda.synchronize()
    print(mode, "capture ok")
except Exception as e:
    print(mode, "capture FAILED:", type(e).__name__, str(e).splitlines()[0])
    traceback.print_exc()
