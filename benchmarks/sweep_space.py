"""Launch every config of the default search space on one shape: compile facts, correctness, time.

For each (pass, head_dim, causal): every candidate is compiled (in parallel, with
triton's AsyncCompileMode), then each config that compiled is checked against an fp32
reference and timed with do_bench. Records validate()'s verdict and shared-memory
estimate next to the compiled kernel's real shared memory, registers and spills, so
the estimate can be checked against the compiler. Needs a CUDA GPU.

    python benchmarks/sweep_space.py --dtype bfloat16 --head-dims 64 128 --seq-len 4096 --out sweep.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import pathlib
import sys
import time

import torch
from triton.runtime._async_compile import AsyncCompileMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

_k = harness.kernels()
ConfigError, attention_backward, attention_forward = _k.ConfigError, _k.attention_backward, _k.attention_forward
reference_attention, LN2, candidates = _k.reference_attention, _k.LN2, _k.space.candidates
KERNELS = {"fwd": [_k.forward_module._attn_fwd_kernel],
           "bwd": [_k.backward_module._bwd_dkdv_kernel, _k.backward_module._bwd_dq_kernel]}


def _compiled(kernels):
    out = {}
    for kern in kernels:
        for dev_cache in kern.device_caches.values():
            out.update({(kern.fn.__name__, key): k for key, k in dev_cache[0].items()})
    return out


def sweep(pass_, D, causal, dtype, n, tokens, width):
    H = max(1, width // D)
    B = max(1, tokens // n)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, n, D, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
    scale = 1 / math.sqrt(D)
    qr, kr, vr = (x.float().requires_grad_() for x in (q, k, v))
    o_ref, lse_ref = reference_attention(qr, kr, vr, causal=causal)
    grads_ref = torch.autograd.grad(o_ref, (qr, kr, vr), do.float())
    # torch's own attention in the same dtype: the error budget
    qd, kd, vd = (x.clone().requires_grad_() for x in (q, k, v))
    o_low, _ = reference_attention(qd, kd, vd, causal=causal, dtype=dtype)
    grads_low = torch.autograd.grad(o_low, (qd, kd, vd), do)
    o_ref_d = o_ref.detach()
    budget_fwd = (o_low.float() - o_ref_d).abs().max().item()
    budget_bwd = [(a.float() - b).abs().max().item() for a, b in zip(grads_low, grads_ref)]
    _, lse2 = attention_forward(q, k, v, _default_fwd(D, dtype), causal=causal, sm_scale=scale)
    o_def, _ = attention_forward(q, k, v, _default_fwd(D, dtype), causal=causal, sm_scale=scale)

    cands = candidates(pass_)
    rows = []
    before = _compiled(KERNELS[pass_])
    t0 = time.time()
    with AsyncCompileMode(concurrent.futures.ThreadPoolExecutor(16), ignore_errors=True):
        for cfg in cands:
            try:
                if pass_ == "fwd":
                    attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale, compile_only=True)
                else:
                    attention_backward(do, q, k, v, o_def, lse2, cfg, causal=causal, sm_scale=scale,
                                       compile_only=True)
            except Exception:  # noqa: BLE001 - recorded per config below
                pass
    compile_s = time.time() - t0
    for cfg in cands:
        row = {"pass": pass_, "head_dim": D, "causal": causal, "config": cfg.to_dict(),
               "estimate": cfg.shared_memory(D, dtype)}
        try:
            cfg.validate(D, dtype, "cuda")
            row["valid"] = True
        except ConfigError as e:
            row["valid"], row["reject"] = False, str(e)
        try:
            if pass_ == "fwd":
                fn = lambda: attention_forward(q, k, v, cfg, causal=causal, sm_scale=scale)  # noqa: E731
                o, l2 = fn()
                torch.cuda.synchronize()
                err = (o.float() - o_ref_d).abs().max().item()
                lerr = (l2 * LN2 - lse_ref.detach()).abs().max().item()
                row["err"], row["lse_err"] = err, lerr
                row["ok"] = math.isfinite(err) and err <= 2 * budget_fwd + 1e-3 and lerr <= 1e-2
            else:
                fn = lambda: attention_backward(do, q, k, v, o_def, lse2, cfg, causal=causal, sm_scale=scale)  # noqa
                g = fn()
                torch.cuda.synchronize()
                errs = [(a.float() - b).abs().max().item() for a, b in zip(g, grads_ref)]
                row["err"] = errs
                row["ok"] = all(math.isfinite(e) and e <= 2 * b + 1e-3 for e, b in zip(errs, budget_bwd))
            row["ms"] = harness.time_ms(fn, q.device, quick=True)[0]  # a screen, each config once
        except Exception as e:  # noqa: BLE001
            row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
    # attach compile facts: all kernels compiled in this sweep, by their constants
    facts = []
    for key, kern in _compiled(KERNELS[pass_]).items():
        if key in before:
            continue
        kern = kern.result(ignore_errors=True) if hasattr(kern, "result") else kern
        if kern is None:
            continue
        try:
            kern._init_handles()
        except Exception:  # noqa: BLE001 - out of resources: the facts below still hold
            pass
        facts.append({"kernel": key[0], "key": str(key[1]), "shared": kern.metadata.shared,
                      "regs": getattr(kern, "n_regs", None), "spills": getattr(kern, "n_spills", None), "num_warps": kern.metadata.num_warps,
                      "num_stages": kern.metadata.num_stages})
    return {"pass": pass_, "head_dim": D, "causal": causal, "shape": [B, H, n, D], "compile_s": compile_s,
            "budget_fwd": budget_fwd, "budget_bwd": budget_bwd, "rows": rows, "compiled": facts}


def _default_fwd(D, dtype):
    return _k.default_config("fwd", D, dtype, "cuda")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--passes", nargs="+", default=["fwd", "bwd"])
    ap.add_argument("--causal", nargs="+", default=["0", "1"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    results = []
    for pass_ in args.passes:
        for D in args.head_dims:
            for c in args.causal:
                t = time.time()
                res = sweep(pass_, D, c == "1", dtype, args.seq_len, args.tokens, args.width)
                ok = [r for r in res["rows"] if r.get("ok")]
                bad = [r for r in res["rows"] if r.get("valid") and not r.get("ok")]
                best = min(ok, key=lambda r: r["ms"]) if ok else None
                print(f"{pass_} D={D} causal={c}: {len(ok)} ok, {len(bad)} valid-but-failed, "
                      f"compile {res['compile_s']:.0f}s, total {time.time() - t:.0f}s, "
                      f"best {best and best['config']} {best and round(best['ms'], 4)} ms", flush=True)
                for r in bad[:5]:
                    print("   FAILED", r["config"], r.get("error"), r.get("err"), flush=True)
                results.append(res)
                harness.write_json(args.out, {"environment": harness.environment(torch.device("cuda")),
                                              "dtype": args.dtype, "sweeps": results})


if __name__ == "__main__":
    main()
