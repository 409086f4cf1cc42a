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
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)
from flashtune import get_tuned_attention  # noqa: E402
from flashtune.shapes import ShapeError, model_shapes  # noqa: E402


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
    try:
        shapes = model_shapes(args.model, tp=args.tp)
    except ShapeError as e:
        ap.error(f"--model/--tp: {e}")
    fn = get_tuned_attention(args.db)
    env = harness.environment(torch.device("cuda"))
    print(harness.environment_line(env))
    rows, bad = [], 0
    for s in shapes:
        train = "bwd" in s.passes
        q, k, v, _ = harness.make_inputs(s, "cuda")
        q, k, v = (x.requires_grad_(train) for x in (q, k, v))
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
    harness.write_json(args.out, {"environment": env, "rows": rows})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
