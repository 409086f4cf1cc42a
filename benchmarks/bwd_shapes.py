"""The backward of the fwd+bwd rows of ../shared/design/SHAPES.md: flashtune against SDPA's
cuDNN and FlashAttention-2 backends in one process, with candidate backward configs per row.

For each row: SDPA's backward (``o.backward(do, retain_graph=True)``, enable_gqa) under cuDNN
and FLASH_ATTENTION; flashtune's heuristic default through autograd the same way; then each
candidate config's kernels alone (``attention_backward``), checked against cuDNN's gradients
(relative error over the whole tensors) before it is timed; for the default also the
preprocess and dQ kernels alone and the whole backward replayed from a CUDA graph (GPU time
without the host's launch cost). do_bench medians; TFLOPS = 2.5 x the forward FLOPs of
SHAPES.md.

    python benchmarks/bwd_shapes.py --out bwd_shapes.json [--rows gemma2-d256-train-4k ...] [--sweep 128 256]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import itertools
import json
import pathlib
import sys
import time

import torch
import triton

from flashtune.kernels.backward import _preprocess, _sum_partials, attention_backward, dq_kernel_alone
from flashtune.kernels.common import sm_count
from flashtune.kernels.config import BwdConfig, ConfigError, default_config, dkdv_split, padded_head_dim
from flashtune.kernels.forward import attention_forward

_spec = importlib.util.spec_from_file_location("bench_attention", pathlib.Path(__file__).with_name("attention.py"))
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up there
_spec.loader.exec_module(bench)

# name, B, Hq, Hkv, Nq, Nk, D, causal: the fwd+bwd rows of SHAPES.md
ROWS = [
    ("llama3-8b-train-8k", 1, 32, 8, 8192, 8192, 128, True),
    ("llama3-70b-tp8-train-4k", 2, 8, 1, 4096, 4096, 128, True),
    ("mistral-7b-train-2k", 4, 32, 8, 2048, 2048, 128, True),
    ("qwen-28h-train-4k", 1, 28, 4, 4096, 4096, 128, True),
    ("gpt2-train-512", 32, 12, 12, 512, 512, 64, True),
    ("gemma2-d256-train-4k", 1, 16, 8, 4096, 4096, 256, True),
    ("bert-base-512", 32, 12, 12, 512, 512, 64, False),
    ("vit-l16-257", 32, 16, 16, 257, 257, 64, False),
]


def candidates(row, base: BwdConfig, sweep: tuple[int, ...]) -> dict[str, BwdConfig]:
    """Named backward configs to time for a row: the default (dkdv_split auto), the same
    unsplit and with explicit splits, and for the head dims in ``sweep`` blocks/warps/stages
    around it."""
    _, B, Hq, Hkv, Nq, Nk, D, causal = row
    out = {"default": base, "split1": dataclasses.replace(base, dkdv_split=1)}
    if D == 256:  # the default before 2026-12-01
        out["32x64 w8s1 (old default)"] = BwdConfig(32, 64, 64, 32, 8, 1)
    if D <= 128:
        out["tma flipped"] = dataclasses.replace(base, tma=1 - base.tma)
    if Hq > Hkv or B * Hkv * Nk < 64 * 1024:
        for s in (2, 4, 8, 16):
            out[f"split{s}"] = dataclasses.replace(base, dkdv_split=s)
    if D in sweep:
        if D == 256:
            dkdv = itertools.product((32, 64), (64,), (8,), (1, 2))
            dq = itertools.product((64, 128), (32, 64), (4, 8), (1, 2))
        elif D == 128:
            dkdv = [(64, 128, 8, 2), (32, 128, 8, 3), (64, 64, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2)]
            dq = itertools.product((128, 64), (64,), (4, 8), (2, 3))
        else:
            dkdv = itertools.product((32, 64), (64, 128), (4, 8), (2, 3))
            dq = itertools.product((64, 128), (32, 64), (4, 8), (2, 3))
        for m1, n1, w, s in dkdv:
            out[f"dkdv {m1}x{n1} w{w}s{s}"] = dataclasses.replace(base, BLOCK_M1=m1, BLOCK_N1=n1, num_warps=w,
                                                                  num_stages=s)
        for m2, n2, w, s in dq:
            out[f"dq {m2}x{n2} w{w}s{s}"] = dataclasses.replace(base, BLOCK_M2=m2, BLOCK_N2=n2, dq_num_warps=w,
                                                               dq_num_stages=s, atomic_dq=0)
        if D <= 128:
            out["atomic_dq"] = dataclasses.replace(base, atomic_dq=1)
    valid = {}
    for name, cfg in out.items():
        try:
            valid[name] = cfg.validate(D, torch.bfloat16, torch.device("cuda"))
        except ConfigError:
            pass
    if D == 256 and D in sweep:
        # TMA loads at D=256, which validate() does not allow yet (never run): an experiment
        valid["tma d256 (unvalidated)"] = dataclasses.replace(base, tma=1)
    return valid


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def bench_row(row, args) -> dict:
    name, B, Hq, Hkv, Nq, Nk, D, causal = row
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, Hq, Nq, D, device=dev, dtype=dt, generator=gen)
    k, v = (torch.randn(B, Hkv, Nk, D, device=dev, dtype=dt, generator=gen) for _ in range(2))
    do = torch.randn(B, Hq, Nq, D, device=dev, dtype=dt, generator=gen)
    sm = D ** -0.5
    flops = 2.5 * 4 * B * Hq * Nq * Nk * D * (0.5 if causal and Nq == Nk else 1.0)
    out = {"row": name, "shape": [B, Hq, Hkv, Nq, Nk, D, causal], "flops": flops, "ms": {}, "err": {}, "configs": {}}

    def timed(fn, **kw):
        return float(triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median", **kw))

    # SDPA backends and flashtune's default through autograd
    sdpa_grads = {}
    for backend_name, runner in (("cudnn", bench._sdpa(torch.nn.attention.SDPBackend.CUDNN_ATTENTION)),
                                 ("flash", bench._sdpa(torch.nn.attention.SDPBackend.FLASH_ATTENTION)),
                                 ("flashtune-autograd", bench._flashtune(None, None))):
        try:
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            o = runner(*leaves, causal)
            sdpa_grads[backend_name] = torch.autograd.grad(o, leaves, do, retain_graph=True)
            out["ms"][backend_name] = timed(lambda: o.backward(do, retain_graph=True), grad_to_none=leaves)
            del o, leaves
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape says so
            out["ms"][backend_name] = None
            out["err"][backend_name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    ref = sdpa_grads.get("cudnn") or sdpa_grads.get("flash")

    o, lse2 = attention_forward(q, k, v, default_config("fwd", D, dt, dev, causal=causal), causal=causal,
                                sm_scale=sm)
    base = default_config("bwd", D, dt, dev, causal=causal)
    cands = candidates(row, base, args.sweep)
    from triton.runtime._async_compile import AsyncCompileMode
    with concurrent.futures.ThreadPoolExecutor(16) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for cfg in cands.values():
            try:
                attention_backward(do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=sm, compile_only=True)
            except Exception:  # noqa: BLE001 - fails again, reported, at its launch
                pass
    for cname, cfg in cands.items():
        try:
            got = attention_backward(do, q, k, v, o, lse2, cfg, causal=causal, sm_scale=sm)
            err = max(_rel(a, b) for a, b in zip(got, ref)) if ref else None
            out["err"][cname] = err
            if err is not None and not err < 0.02:
                print(f"  {name} {cname}: WRONG, relative error {err:.3g} vs SDPA", flush=True)
                continue
            out["configs"][cname] = {**cfg.to_dict(), "splits": list(dkdv_split(
                cfg, batch=B, heads_q=Hq, heads_kv=Hkv, n_q=Nq, n_k=Nk, sm_count=sm_count(dev)))}
        except Exception as e:  # noqa: BLE001
            out["err"][cname] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    # the checked candidates timed in interleaved rounds, each one's figure the best round's median
    rounds = {c: [] for c in out["configs"]}
    for _ in range(args.rounds):
        for cname in rounds:
            cfg = cands[cname]
            rounds[cname].append(timed(lambda: attention_backward(do, q, k, v, o, lse2, cfg, causal=causal,
                                                                  sm_scale=sm)))
    out["rounds_ms"] = rounds
    out["ms"].update({c: min(r) for c, r in rounds.items()})
    # host time of one backward call: launches queued without waiting for the GPU
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        attention_backward(do, q, k, v, o, lse2, base, causal=causal, sm_scale=sm)
    out["ms"]["default:host"] = (time.perf_counter() - t0) / 50 * 1e3
    torch.cuda.synchronize()
    # where the default's time goes
    delta = torch.empty(q.shape[:3], device=dev, dtype=torch.float32)
    out["ms"]["default:preprocess"] = timed(lambda: _preprocess(o, do, delta, int64=False))
    split = out["configs"].get("default", {}).get("splits", [1, 1])
    if split[0] * split[1] > 1:
        parts = torch.empty((2, split[0] * split[1], B, Hkv, Nk, padded_head_dim(D)), device=dev,
                            dtype=torch.float32).normal_()
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        out["ms"]["default:sum-partials"] = timed(lambda: _sum_partials(parts, dk, dv, int64=False))
        del parts
    dq_alone = dq_kernel_alone(do, q, k, v, o, lse2, base, causal=causal, sm_scale=sm)
    if dq_alone is not None:
        out["ms"]["default:dq-kernel"] = timed(dq_alone)
    try:
        out["ms"]["default:cuda-graph"] = float(triton.testing.do_bench_cudagraph(
            lambda: attention_backward(do, q, k, v, o, lse2, base, causal=causal, sm_scale=sm), rep=args.rep,
            return_mode="median"))
    except Exception as e:  # noqa: BLE001
        out["err"]["default:cuda-graph"] = f"{type(e).__name__}: {str(e)[:160]}"
    return out


def report(r: dict) -> None:
    ms, fl = r["ms"], r["flops"]
    cu, fa = ms.get("cudnn"), ms.get("flash")

    def tf(x):
        return f"{fl / x * 1e-9:6.0f}" if x else "   n/a"

    print(f"{r['row']}: cuDNN {tf(cu)}  FA2 {tf(fa)}  flashtune(autograd) {tf(ms.get('flashtune-autograd'))} "
          f"TFLOPS; errors {[(k, v) for k, v in r['err'].items() if isinstance(v, str)]}", flush=True)
    ranked = sorted(((k, v) for k, v in ms.items() if v and k not in ("cudnn", "flash", "flashtune-autograd")
                     and not k.startswith("default:")), key=lambda kv: kv[1])
    for k, v in ranked[:12] + [kv for kv in ranked[12:] if kv[0] in ("default", "split1")]:
        print(f"   {k:34s} {tf(v)} TFLOPS  x{cu / v if cu else float('nan'):.2f} cuDNN  "
              f"x{fa / v if fa else float('nan'):.2f} FA2  splits {r['configs'][k].get('splits')}", flush=True)
    for k in ("default:preprocess", "default:sum-partials", "default:dq-kernel", "default:cuda-graph",
              "default:host"):
        if ms.get(k):
            print(f"   {k:34s} {ms[k] * 1e3:8.1f} us", flush=True)
    if ms.get("default"):
        print(f"   {'default (kernels, do_bench)':34s} {ms['default'] * 1e3:8.1f} us", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", help="row names (default: every fwd+bwd row)")
    ap.add_argument("--sweep", type=int, nargs="*", default=(), metavar="D",
                    help="for rows of these head dims also time blocks/warps/stages around the default")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds of the candidates")
    ap.add_argument("--out", help="write every figure as JSON")
    args = ap.parse_args()
    rows = [r for r in ROWS if not args.rows or r[0] in args.rows]
    results = {"environment": bench.environment(), "rows": []}
    t0 = time.time()
    for row in rows:
        r = bench_row(row, args)
        results["rows"].append(r)
        report(r)
        torch.cuda.empty_cache()
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    print(f"total {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
