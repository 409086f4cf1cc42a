"""A model's attention calls through the drop-in, and what it serves for each.

After ``flashtune search --model NAME --db STORE``: for each of the model's preset calls
(flashtune.shapes.model_shapes), builds random inputs, calls ``get_tuned_attention(STORE)``
as SDPA (forward, and forward + backward for training calls), checks the output against
torch SDPA, and prints ``explain()``: the runner and configs served and where they came
from ("tuned exact" when the search stored the call's own key). Exits 1 if a call was
served wrong or a call of the model found no tuned key.

    python benchmarks/explain_model.py --model llama3-8b --db tuned.db [--tp 1] [--out explain.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from flashtune import get_tuned_attention
from flashtune.shapes import model_shapes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--db", required=True, help="the store the search wrote")
    ap.add_argument("--out", help="write each call's choice as JSON")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("explain_model.py needs a CUDA GPU", file=sys.stderr)
        return 2
    fn = get_tuned_attention(args.db)
    rows, bad = [], 0
    for s in model_shapes(args.model, tp=args.tp):
        gen = torch.Generator(device="cuda").manual_seed(0)
        dtype = getattr(torch, s.dtype)

        def rand(h, n):
            return torch.randn(s.batch, h, n, s.head_dim, device="cuda", dtype=dtype, generator=gen)

        train = "bwd" in s.passes
        q, k, v = (x.requires_grad_(train) for x in (rand(s.heads_q, s.seq_q), rand(s.heads_kv, s.seq_k),
                                                      rand(s.heads_kv, s.seq_k)))
        gqa = s.heads_q != s.heads_kv
        choice = fn.explain(q, k, v, is_causal=s.causal, enable_gqa=gqa)
        out = fn(q, k, v, is_causal=s.causal, enable_gqa=gqa)
        ref = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=s.causal,
                                             enable_gqa=gqa)
        err = ((out.detach().float() - ref.float()).norm() / ref.float().norm()).item()
        if train:
            out.backward(torch.randn_like(out))
        tuned = choice.fwd_source == "tuned exact" and (not train or choice.bwd_source == "tuned exact")
        ok = err < 0.02 and tuned
        bad += not ok
        served = choice.train_runner if train else choice.runner
        print(f"{s.label()}\n  serves: {served}; rel. error vs SDPA {err:.2e}{'' if ok else '  <-- PROBLEM'}\n  "
              + str(choice).replace("\n", "\n  "), flush=True)
        rows.append({"shape": s.as_dict(), "served": served, "choice": str(choice), "rel_err": err, "ok": ok})
    print(f"{len(rows) - bad} of {len(rows)} calls of {args.model} served a tuned key exactly and correctly")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
