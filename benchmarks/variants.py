"""The attention variants beside plain attention, in one process on a GPU: varlen training, a
sliding window, the fp8 forward; each row checked for correctness first, then timed.

    python benchmarks/variants.py --out variants.json          # the full rows (about 4 minutes on an H200)
    python benchmarks/variants.py --quick                      # shrunk shapes, one round
    python benchmarks/variants.py --only fp8 window            # some sections

Times are triton.testing.do_bench medians (ms; L2 flushed; benchmarks/harness.py), in --rounds
interleaved rounds (the median of the rounds is reported). "speed-up vs X" is time(X) /
time(flashtune): > 1 means flashtune is faster. Each section's goal is printed next to its
measured ratio.

(a) varlen training, forward + backward: documents of mixed lengths (a fixed seeded draw,
    128 to 4096 tokens, summing to 16384) packed through flashtune.attention_varlen, against
    the same documents padded to the longest one in one batch through flashtune.attention
    and through SDPA (its default choice and cuDNN), and flash_attn's varlen function when it
    imports; Llama-3-8B heads (Hq=32, Hkv=8, D=128), bf16, causal. Goal: time(padded
    flashtune) / time(varlen) >= 0.9. TFLOPS count the documents' own causal work only.
    Checked first: varlen against the padded batch on the real tokens (o, dq, dk, dv).
(b) sliding window: B=1, N=16384, Hq=32, Hkv=8, D=128, bf16, causal with
    window_size=(4096, 0) (query i sees keys i-4096..i) through flashtune.attention against
    FlexAttention (torch.compile(flex_attention) with the same window as a block mask),
    forward and forward + backward. Goal: >= 1.2x FlexAttention. TFLOPS count the visible
    (query, key) pairs. Checked first: both against each other and against an fp32
    reference on the last 1024 queries of head 0.
(c) fp8 forward: e4m3, B=4, H=16, N=4096, D=128, causal and not, bf16 out, against
    flashtune's own bf16 forward (goal >= 1.3x) and cuDNN's bf16 forward (SDPA,
    CUDNN_ATTENTION), on the same values (bf16 inputs quantized per tensor, amax to 448). V in
    three forms: keys contiguous already (the kernel alone), head dim contiguous re-laid out
    by attention_fp8 (the copy timed in), and head dim contiguous as given
    (relayout_v=False): what the default's copy costs or saves. Accuracy: max and mean abs
    error of the fp8 output against cuDNN's bf16 output (whole tensor) and against an fp32
    reference on (batch 0, head 0), next to flashtune bf16's error there.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import sys
from dataclasses import asdict, dataclass, field

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)

SECTIONS = ("varlen", "window", "fp8")
GOALS = {"varlen": ("padded", 0.9), "window": ("flex", 1.2), "fp8": ("flashtune-bf16", 1.3)}
LLAMA3_8B = {"heads_q": 32, "heads_kv": 8, "head_dim": 128}


# ----------------------------------------------------------------------------------
# Pure pieces (no GPU needed)
# ----------------------------------------------------------------------------------
def document_lengths(total: int, *, shortest: int = 128, longest: int = 4096, seed: int = 0) -> list[int]:
    """Mixed document lengths summing to ``total``: log-uniform draws in [shortest, longest]
    (a fixed seed), the last one cut to what is left (at least 1 token)."""
    rng = random.Random(seed)
    lengths, left = [], total
    while left > 0:
        n = int(round(math.exp(rng.uniform(math.log(shortest), math.log(longest)))))
        n = min(n, left)
        lengths.append(n)
        left -= n
    return lengths


def causal_flops(lengths, heads: int, head_dim: int) -> float:
    """Forward FLOPs of causal attention over each document alone: 4·H·L²·D / 2 each."""
    return sum(2.0 * heads * n * n * head_dim for n in lengths)


def window_pairs(n: int, left: int) -> int:
    """(query, key) pairs a causal window (left, 0) keeps over n tokens: query i sees
    min(i, left) + 1 keys."""
    full = min(n, left + 1)
    return full * (full + 1) // 2 + (n - full) * (left + 1)


def speedups(ms: dict, ours: str) -> dict:
    """time(other) / time(ours) for every other backend with a time."""
    mine = ms.get(ours)
    return {name: harness.ratio(t, mine) for name, t in ms.items() if name != ours and t is not None}


@dataclass
class Row:
    section: str
    case: str
    pass_: str  # "fwd" or "fwd+bwd"
    ours: str  # the backend the speed-ups are of
    flops: float
    ms: dict = field(default_factory=dict)
    rounds_ms: dict = field(default_factory=dict)
    check: dict = field(default_factory=dict)
    error: str | None = None

    def speedups(self) -> dict:
        return speedups(self.ms, self.ours)

    def tflops(self) -> dict:
        return {name: harness.tflops(self.flops, t) for name, t in self.ms.items()}


def format_row(row: Row) -> str:
    head = f"{row.section:<7} {row.case:<34} {row.pass_:<7}"
    if row.error:
        return f"{head} ABORTED: {row.error}"
    times = " ".join(f"{name}=n/a" if t is None else f"{name}={t:.3f}ms({harness.fmt(row.tflops()[name], '.0f')})"
                     for name, t in row.ms.items())
    ups = " ".join(f"{name}:{harness.fmt(r, '.2f')}x" for name, r in row.speedups().items())
    goal = GOALS[row.section]
    reached = row.speedups().get(goal[0])
    verdict = "" if reached is None else \
        f"  [goal vs {goal[0]} >= {goal[1]}: {'met' if reached >= goal[1] else 'MISSED'}]"
    # the other variants of ours (fp8: V re-laid out in the call, V as given) against the goal's baseline
    others = [name for name in row.ms if name.startswith(row.ours) and name != row.ours]
    extra = "".join(f"; {name} vs {goal[0]}: "
                    f"{harness.fmt(harness.ratio(row.ms.get(goal[0]), row.ms[name]), '.2f')}x"
                    for name in others)
    return f"{head} {times} | {row.ours} speed-up vs {ups}{verdict}{extra}"


# ----------------------------------------------------------------------------------
# The GPU part
# ----------------------------------------------------------------------------------
_rel, _first_line = harness._rel, harness.first_line


def _timed(args, rows: list[Row], runners: dict, make_fn) -> None:
    """Time every (runner, row) pair in interleaved rounds (rows of distinct passes):
    make_fn(run, row) -> (fn, grad_to_none)."""
    import torch

    from flashtune import protocol

    by_pass = {row.pass_: row for row in rows}
    device = torch.device("cuda", torch.cuda.current_device())

    def time_one(run, pass_):
        fn, grads = make_fn(run, by_pass[pass_])
        fn()  # compile outside the timing
        return protocol.time_ms(fn, device, quick=args.quick, grad_to_none=grads)

    times, failed = harness.time_rounds(runners, list(by_pass), args.rounds, time_one)
    for (name, pass_), why in failed.items():
        print(f"  {by_pass[pass_].section} {name} {pass_} failed: {why}", file=sys.stderr)
    for (name, pass_), ms in times.items():
        by_pass[pass_].rounds_ms[name] = ms
        by_pass[pass_].ms[name] = harness.median(ms)


def _training_step(run, q, k, v, do):
    """fn running forward + backward of ``run`` on fresh leaves, and the leaves for grad_to_none."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]

    def fn():
        run(*leaves).backward(do)
    return fn, leaves


def bench_varlen(args) -> list[Row]:
    import itertools

    import torch
    import torch.nn.functional as F

    import flashtune
    from flashtune.runners import sdpa

    hq, hkv, d = LLAMA3_8B["heads_q"], LLAMA3_8B["heads_kv"], LLAMA3_8B["head_dim"]
    lengths = document_lengths(args.varlen_tokens, longest=1024 if args.quick else 4096)
    total, longest, batch = sum(lengths), max(lengths), len(lengths)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    k, v = (torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    # the padded batch: document b in rows [0, len_b) of batch entry b, zeros after
    rows = torch.cat([torch.arange(n, device="cuda") for n in lengths])
    docs = torch.repeat_interleave(torch.arange(batch, device="cuda"), torch.tensor(lengths, device="cuda"))

    def pad(x):  # (total, H, D) -> (B, H, N, D) view of a (B, N, H, D) tensor, as models hold it
        out = x.new_zeros(batch, longest, x.shape[1], x.shape[2])
        out[docs, rows] = x
        return out.transpose(1, 2)

    def unpad(x):  # (B, H, N, D) -> (total, H, D)
        return x.transpose(1, 2)[docs, rows]

    qp, kp, vp, dop = pad(q), pad(k), pad(v), pad(do)
    case = f"{batch} docs {min(lengths)}-{longest} ({total} tok)"
    flops_fwd = causal_flops(lengths, hq, d)
    fwd_row = Row("varlen", case, "fwd", "varlen", flops_fwd)
    step_row = Row("varlen", case, "fwd+bwd", "varlen", 3.5 * flops_fwd)
    out_rows = [fwd_row, step_row]

    varlen = lambda q_, k_, v_: flashtune.attention_varlen(q_, k_, v_, cu, cu, longest, longest,  # noqa: E731
                                                           causal=True)
    packed = {"varlen": varlen}
    padded = {"padded": lambda q_, k_, v_: flashtune.attention(q_, k_, v_, causal=True),
              "sdpa": lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, enable_gqa=True),
              "cudnn": lambda q_, k_, v_: sdpa("sdpa-cudnn", q_, k_, v_, is_causal=True, enable_gqa=True)}
    try:
        from flash_attn import flash_attn_varlen_func

        packed["flash_attn"] = lambda q_, k_, v_: flash_attn_varlen_func(q_, k_, v_, cu, cu, longest, longest,
                                                                         causal=True)
    except ImportError as e:
        print(f"# varlen: flash_attn not available ({_first_line(e)})")

    # check: varlen against the padded batch (flashtune, then cuDNN) on the real tokens
    try:
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = varlen(*leaves)
        grads = torch.autograd.grad(o, leaves, do)
        for name in ("padded", "cudnn"):
            try:
                pl = [x.detach().clone().requires_grad_() for x in (qp, kp, vp)]
                op = padded[name](*pl)
                gp = torch.autograd.grad(op, pl, dop)
            except Exception as e:  # noqa: BLE001 - a baseline that cannot run this shape
                fwd_row.check[name] = _first_line(e)
                continue
            rel = {n: _rel(a, unpad(b)) for n, a, b in zip(("o", "dq", "dk", "dv"), (o, *grads), (op, *gp))}
            fwd_row.check[name] = step_row.check[name] = rel
            bad = {n: r for n, r in rel.items() if not r < 2e-2}
            if bad:
                raise AssertionError(f"varlen vs {name} on the real tokens: relative errors {bad} > 0.02")
        del leaves, o, grads
    except Exception as e:  # noqa: BLE001 - abort the section's rows, keep the run
        for row in out_rows:
            row.error = _first_line(e)
        return out_rows

    def make_fn(run, row):
        inputs = (q, k, v, do) if run in packed.values() else (qp, kp, vp, dop)
        if row.pass_ == "fwd":
            return (lambda: _no_grad(run, *inputs[:3])), None
        return _training_step(run, *inputs)

    _timed(args, out_rows, {**packed, **padded}, make_fn)
    return out_rows


def _no_grad(run, *inputs):
    import torch

    with torch.no_grad():
        return run(*inputs)


def bench_window(args) -> list[Row]:
    import torch

    import flashtune

    default_config, reference_attention = harness.kernels().default_config, harness.kernels().reference_attention

    hq, hkv, d = LLAMA3_8B["heads_q"], LLAMA3_8B["heads_kv"], LLAMA3_8B["head_dim"]
    n, left = args.window_seq, args.window
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, do = (torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    k, v = (torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    case = f"B1 {hq}/{hkv} N{n} D{d} win({left},0)"
    flops_fwd = 4.0 * hq * d * window_pairs(n, left)
    out_rows = [Row("window", case, "fwd", "flashtune", flops_fwd),
                Row("window", case, "fwd+bwd", "flashtune", 3.5 * flops_fwd)]
    ours = lambda q_, k_, v_: flashtune.attention(q_, k_, v_, causal=True, window_size=(left, 0))  # noqa: E731
    runners = {"flashtune": ours}
    # the default's kernel family beside the other's: on an H100/H200 the default of a long
    # D=128 call is the Gluon kernel (which runs windows), "flashtune-triton" the Triton kernel's
    default = default_config("fwd", d, q.dtype, q.device, causal=True, seq_q=n)
    if default.family:
        triton_cfg = harness.kernels().as_triton(default, d, q.dtype, q.device, True)
        runners["flashtune-triton"] = lambda q_, k_, v_: flashtune.attention(  # noqa: E731
            q_, k_, v_, causal=True, window_size=(left, 0), fwd_config=triton_cfg)
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def in_window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx <= left)

        block_mask = create_block_mask(in_window, B=None, H=None, Q_LEN=n, KV_LEN=n, device="cuda")
        flex = torch.compile(flex_attention)
        runners["flex"] = lambda q_, k_, v_: flex(q_, k_, v_, block_mask=block_mask, enable_gqa=True)
    except Exception as e:  # noqa: BLE001 - report and time flashtune alone
        print(f"# window: FlexAttention not available ({_first_line(e)})")
    try:
        tail = min(1024, n)
        ref, _ = reference_attention(q[:, :1, -tail:].float(), k[:, :1].float(), v[:, :1].float(), causal=True,
                                     causal_align="bottom_right", window_size=(left, 0))
        outputs = {}
        for name, run in runners.items():
            leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
            o = run(*leaves)
            outputs[name] = (o.detach(), [g.detach() for g in torch.autograd.grad(o, leaves, do)])
            out_rows[0].check[name] = {"max_err_vs_fp32_tail": (o[:, :1, -tail:].float() - ref).abs().max().item()}
        err = out_rows[0].check["flashtune"]["max_err_vs_fp32_tail"]
        if not err < 2e-2:
            raise AssertionError(f"flashtune's window output is {err:.3g} off the fp32 reference (tail, head 0)")
        if "flex" in outputs:
            (o_ft, g_ft), (o_fx, g_fx) = outputs["flashtune"], outputs["flex"]
            rel = {nm: _rel(a, b) for nm, a, b in zip(("o", "dq", "dk", "dv"), (o_ft, *g_ft), (o_fx, *g_fx))}
            for row in out_rows:
                row.check["rel_vs_flex"] = rel
            bad = {nm: r for nm, r in rel.items() if not r < 2e-2}
            if bad:
                raise AssertionError(f"flashtune vs FlexAttention: relative errors {bad} > 0.02")
        del outputs
    except Exception as e:  # noqa: BLE001
        for row in out_rows:
            row.error = _first_line(e)
        return out_rows

    def make_fn(run, row):
        if row.pass_ == "fwd":
            return (lambda: _no_grad(run, q, k, v)), None
        return _training_step(run, q, k, v, do)

    _timed(args, out_rows, runners, make_fn)
    return out_rows


def bench_fp8(args) -> list[Row]:
    import torch

    import flashtune
    from flashtune.runners import sdpa

    kern = harness.kernels()
    reference_attention, ConfigError, FwdConfig = kern.reference_attention, kern.ConfigError, kern.FwdConfig
    keys_contiguous = kern.keys_contiguous

    b, h, n, d = args.fp8_shape
    e4m3 = torch.float8_e4m3fn
    gen = torch.Generator(device="cuda").manual_seed(2)
    q16, k16, v16 = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    fmax = torch.finfo(e4m3).max
    scales = [x.abs().amax().float().item() / fmax for x in (q16, k16, v16)]
    q8, k8, v8 = ((x.float() / s).to(e4m3) for x, s in zip((q16, k16, v16), scales))
    v8_keys = keys_contiguous(v8)
    descales = {"q_descale": scales[0], "k_descale": scales[1], "v_descale": scales[2]}
    gluon_fp8 = []
    for name, overlap in (("fp8-gluon", 1), ("fp8-gluon-seq", 0)):
        cfg = FwdConfig(64, 128, 4, 3, family=1, overlap=overlap)
        try:
            gluon_fp8.append((name, cfg.validate(d, e4m3, q16.device)))
        except ConfigError as e:
            print(f"# fp8: no {name} here ({_first_line(e)})")
    out_rows = []
    for causal in (False, True):
        row = Row("fp8", f"e4m3 B{b} H{h} N{n} D{d} {'causal' if causal else 'full'}", "fwd", "fp8",
                  harness.Shape(b, h, h, n, n, d, causal).flops("fwd"))
        fp8 = {"fp8": lambda c=causal: flashtune.attention_fp8(q8, k8, v8_keys, causal=c, **descales),
               "fp8+relayout": lambda c=causal: flashtune.attention_fp8(q8, k8, v8, causal=c, **descales),
               "fp8-v-as-given": lambda c=causal: flashtune.attention_fp8(q8, k8, v8, causal=c, relayout_v=False,
                                                                          **descales)}
        # the Gluon kernel's FP8 variant where it runs (sm_90): with the intra-warpgroup
        # overlap (P through shared memory) and without it (P in registers)
        for name, gluon_cfg in gluon_fp8:
            fp8[name] = lambda c=causal, g=gluon_cfg: flashtune.attention_fp8(q8, k8, v8_keys, causal=c,
                                                                             config=g, **descales)
        runners = {**fp8,
                   "flashtune-bf16": lambda c=causal: _no_grad(lambda: flashtune.attention(q16, k16, v16, causal=c)),
                   "cudnn-bf16": lambda c=causal: sdpa("sdpa-cudnn", q16, k16, v16, is_causal=c)}
        try:
            o_cudnn = runners["cudnn-bf16"]()
            o_bf16 = runners["flashtune-bf16"]()
            ref, _ = reference_attention(q16[:1, :1].float(), k16[:1, :1].float(), v16[:1, :1].float(),
                                         causal=causal)
            row.check["flashtune-bf16"] = {"max_err_vs_fp32_b0h0": (o_bf16[:1, :1].float() - ref).abs().max().item(),
                                           "mean_err_vs_fp32_b0h0": (o_bf16[:1, :1].float() - ref).abs().mean().item()}
            row.check["mean_abs_o"] = o_cudnn.float().abs().mean().item()
            for name, run in fp8.items():
                o = run()
                err = (o.float() - o_cudnn.float()).abs()
                err_ref = (o[:1, :1].float() - ref).abs()
                row.check[name] = {"max_err_vs_cudnn_bf16": err.max().item(),
                                   "mean_err_vs_cudnn_bf16": err.mean().item(),
                                   "max_err_vs_fp32_b0h0": err_ref.max().item(),
                                   "mean_err_vs_fp32_b0h0": err_ref.mean().item(),
                                   "rel_vs_cudnn_bf16": _rel(o, o_cudnn)}
                # a sanity bound, not the accuracy claim (tests/kernels/test_fp8.py has the
                # derived one): P in e4m3 is off by up to 2^-4 per probability
                if not row.check[name]["rel_vs_cudnn_bf16"] < 0.1:
                    raise AssertionError(f"{name}: relative error vs cuDNN bf16 "
                                         f"{row.check[name]['rel_vs_cudnn_bf16']:.3g} >= 0.1")
            del o_cudnn, o_bf16
        except Exception as e:  # noqa: BLE001
            row.error = _first_line(e)
            out_rows.append(row)
            continue
        _timed(args, [row], runners, lambda run, _row: (run, None))
        out_rows.append(row)
    return out_rows


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="shrunk shapes (4096 varlen tokens in documents of at most 1024, window 1024 over 4096, "
                         "fp8 N=1024), shorter do_bench runs and one round")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="the sections to run")
    ap.add_argument("--out", metavar="FILE.json", help="write the environment and every row as JSON")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per row (default 3; --quick 1)")
    args = ap.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive number of rounds, got {args.rounds}")
    args.varlen_tokens = 4096 if args.quick else 16384
    args.window_seq, args.window = (4096, 1024) if args.quick else (16384, 4096)
    args.fp8_shape = (4, 16, 1024 if args.quick else 4096, 128)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/variants.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    env = harness.environment(torch.device("cuda", torch.cuda.current_device()))
    print(harness.environment_line(env))
    print("# ms per backend (TFLOPS in brackets), do_bench medians; speed-up vs X = time(X) / time(ours)", flush=True)
    benches = {"varlen": bench_varlen, "window": bench_window, "fp8": bench_fp8}
    rows: list[Row] = []
    for section in args.only:
        try:
            got = benches[section](args)
        except Exception as e:  # noqa: BLE001 - a section that cannot set up: report it, run the others
            got = [Row(section, "setup", "-", "-", 0.0, error=_first_line(e))]
        for row in got:
            print(format_row(row), flush=True)
            if row.check:
                print(f"  check: {json.dumps(row.check, default=str)}", flush=True)
        rows.extend(got)
        torch.cuda.empty_cache()
    aborted = [r for r in rows if r.error]
    if aborted:
        print(f"WARNING: {len(aborted)} rows aborted", file=sys.stderr)
    harness.write_json(args.out, {"environment": env, "args": vars(args), "goals": GOALS,
                                  "rows": [{**asdict(r), "speedups": r.speedups(), "tflops": r.tflops()} for r in rows]})
    return 1 if aborted else 0


if __name__ == "__main__":
    sys.exit(main())
