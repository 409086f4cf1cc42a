"""Does the runner race choose what a model sees? Each runner timed both ways, and inside a model.

For each row (a short call: the B=8 x 12 heads x 1024 x d64 causal training key and short rows of
flashtune.shapes.REALISTIC_GRID by default), in one process:

1. the search's race itself (``KeyBench.race``, what ``flashtune search`` stores): each runner's GPU
   time (CUDA-graph replay) and eager time (plain calls back to back, the host included), the
   Triton side running the store's winner of the key (``--db``) or the heuristic default;
   what ``runners.choose`` picks, and what the GPU time alone and the eager time alone pick;
2. a small transformers model at that shape, random weights: a Llama layer stack (causal rows;
   a decode row is one step against a static cache of the row's length), or a BERT encoder (full
   attention), with the row's heads, K/V heads and head dim, ``--layers`` layers, timed eagerly as
   a model runs: forward + backward for a training row, the forward for an inference row; once
   per runner: ``attn_implementation="sdpa"`` with SDPA held to that backend, and flashtune's
   registered "ftune" attention serving the raced Triton configs (written into a temporary store).

The report says per row which runner was fastest in the model, which the rule chose, and whether
they agree (the rule's factor: ``runners.HOST_BOUND_FACTOR``). What cannot run here (a backend, a
model, a cache kind of this transformers) is skipped with a note. GPU figures only; ``--device
cpu`` is a smoke run of the code under the Triton interpreter on tiny rows.

    python benchmarks/race_timing.py [--rows NAME,...] [--shape B,Hq,Hkv,Nq,Nk,D[,causal]] [--db STORE]
                                     [--layers 4] [--rounds 3] [--out race.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys
import tempfile
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)
from flashtune.shapes import REALISTIC_GRID, Shape  # noqa: E402

# The training key whose eager race stored sdpa-cudnn as 1.85x faster than flashtune although
# their GPU times were at parity (flashtune's host cost per eager fwd+bwd ~340 us, SDPA's ~178)
SHORT_TRAINING = Shape(8, 12, 12, 1024, 1024, 64, True, "bfloat16", ("fwd", "bwd"), "train-b8-h12-1024-d64-causal")
DEFAULT_ROWS = (SHORT_TRAINING.name, "gpt2-train-512", "bert-base-512", "vit-l16-257", "decode-b32-4k",
                "decode-b1-64k")
ROWS = {s.name: s for s in (SHORT_TRAINING, *REALISTIC_GRID)}
SDPA_BACKEND_NAMES = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION",
                      "sdpa-efficient": "EFFICIENT_ATTENTION"}


@dataclasses.dataclass(frozen=True)
class Row:
    """One row to run: its call, the pass its key is raced on (a training row: "bwd", forward +
    backward; else "fwd"), the model that runs it (None: none fits, ``note`` says why)."""

    shape: Shape
    pass_: str
    model: str | None  # "llama" (causal, prefill or training), "llama-decode" (one step), "bert" (full)
    note: str = ""

    @property
    def training(self) -> bool:
        return self.pass_ == "bwd"


def model_kind(shape: Shape, training: bool) -> tuple[str | None, str]:
    """(the model that runs ``shape``'s call, or None, and why not)."""
    if shape.seq_q == 1 and shape.seq_k > 1:
        if training:
            return None, "a decode step has no backward in a model"
        return "llama-decode", ""
    if shape.seq_q != shape.seq_k:
        return None, "queries and keys of different lengths (cross attention) are not a self-attention stack"
    if shape.causal:
        return "llama", ""
    if shape.heads_q != shape.heads_kv:
        return None, "an encoder with grouped K/V heads: no such model here"
    return "bert", ""


def build_rows(names: list[str], shapes: list[Shape], *, cpu: bool = False) -> list[Row]:
    """The rows of ``names`` (ROWS' names) and ``shapes``, each once, in order; interpreter-sized
    with ``cpu``. ValueError names an unknown row."""
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise ValueError(f"unknown row {unknown[0]!r}; expected some of {', '.join(ROWS)}")
    rows = []
    for shape in dict.fromkeys([ROWS[n] for n in names] + list(shapes)):
        if cpu:
            shape = harness.tiny(shape)
        training = "bwd" in shape.passes and shape.seq_q > 1
        kind, note = model_kind(shape, training)
        rows.append(Row(shape, "bwd" if training else "fwd", kind, note))
    return rows


def parse_args(argv=None) -> tuple[argparse.Namespace, list[Row]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), metavar="NAME,...",
                    help=f"rows by name (default: {', '.join(DEFAULT_ROWS)}); --list-rows prints them")
    ap.add_argument("--shape", action="append", type=harness.parse_shape, default=[],
                    metavar="B,Hq,Hkv,Nq,Nk,D[,causal]", help="a row of these sizes besides --rows' (repeatable)")
    ap.add_argument("--list-rows", action="store_true", help="print the rows and exit")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "bfloat16", "fp16", "float16"),
                    help="the rows' dtype (default bf16; the interpreter runs fp16)")
    ap.add_argument("--device", default="cuda", help="cuda[:N]; cpu: a smoke run under the Triton interpreter")
    ap.add_argument("--db", help="a store whose tuned winners the Triton side runs (default: the heuristic defaults)")
    ap.add_argument("--layers", type=int, default=4, help="the model's layers (default 4)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds of the race and of the model timings (default 3; 1 under --device cpu)")
    ap.add_argument("--no-model", action="store_true", help="the race only")
    ap.add_argument("--out", help="write the report as JSON (with the environment)")
    args = ap.parse_args(argv)
    if args.list_rows:
        for name, shape in ROWS.items():
            print(f"  {name:<32} {shape.label()}")
        raise SystemExit(0)
    if args.layers < 1:
        ap.error(f"--layers: expected a positive number, got {args.layers}")
    cpu = args.device.startswith("cpu")
    if args.rounds is None:
        args.rounds = 1 if cpu else 3
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive number, got {args.rounds}")
    dtype = "float16" if cpu else harness.DTYPES[args.dtype]
    shapes = [dataclasses.replace(s, dtype=dtype) for s in args.shape]
    try:
        rows = build_rows([n for n in args.rows.split(",") if n], shapes, cpu=cpu)
    except ValueError as e:
        ap.error(f"--rows: {e}")
    rows = [dataclasses.replace(r, shape=dataclasses.replace(r.shape, dtype=dtype)) for r in rows]
    if not rows:
        ap.error("--rows/--shape: no row to run")
    return args, rows


def report_row(row: Row, race: dict, model_ms: dict, notes: list[str]) -> dict:
    """A row of the report: the race's times ({runner: RunnerTime or None}), each runner's time in
    the model ({runner: ms or None}), what the rule, the GPU time alone and the eager time alone
    choose, the runner fastest in the model, and whether the rule chose it."""
    from flashtune import runners

    raced = {name: t for name, t in race.items() if t is not None}
    rule = runners.choose(raced) if raced else (None, None)
    by_gpu = runners.fastest({n: t.gpu_ms for n, t in raced.items()}) if raced else None
    by_eager = runners.fastest({n: t.eager_ms for n, t in raced.items()}) if raced else None
    # among the runners the race could choose (one that failed its check there is no candidate)
    timed = {name: ms for name, ms in model_ms.items() if ms is not None and (not raced or name in raced)}
    in_model = min(timed, key=timed.__getitem__) if timed else None
    best = timed.get(in_model)

    def loss(name):  # how much slower than the fastest the model runs with ``name``
        return None if name not in timed or not best else timed[name] / best

    return {
        "row": row.shape.name or row.shape.label(), "shape": row.shape.as_dict(), "pass": row.pass_,
        "model": row.model,
        "race": {name: None if t is None else t.as_dict() for name, t in race.items()},
        "host_bound_ratio": (raced[by_gpu].eager_ms / raced[by_gpu].gpu_ms
                             if by_gpu in raced and raced[by_gpu].eager_ms else None),
        "rule": rule[0], "chosen_by": rule[1], "gpu_choice": by_gpu, "eager_choice": by_eager,
        "model_ms": model_ms, "model_fastest": in_model,
        "rule_agrees": None if in_model is None or rule[0] is None else rule[0] == in_model,
        "model_slowdown": {"rule": loss(rule[0]), "gpu_choice": loss(by_gpu), "eager_choice": loss(by_eager)},
        "notes": notes,
    }


def summary(rows: list[dict]) -> dict:
    """How often each way of choosing picked the runner fastest in the model, and its geomean slowdown."""
    judged = [r for r in rows if r["model_fastest"] is not None and r["rule"] is not None]
    out = {"rows_judged": len(judged)}
    for way, field in (("rule", "rule"), ("gpu_choice", "gpu_choice"), ("eager_choice", "eager_choice")):
        out[way] = {"agrees": sum(r[field] == r["model_fastest"] for r in judged),
                    "geomean_slowdown": harness.geomean(r["model_slowdown"][way] for r in judged)}
    return out


# ----------------------------------------------------------------------------------
# The race (the search's own code)
# ----------------------------------------------------------------------------------
def triton_configs(key, shape: Shape, device, db):
    """(the winner raced, the forward config of a training step): the store's current rows of the
    key (and of its fwd key), else the heuristic defaults, as the search races them."""
    import torch

    from flashtune.heuristics.defaults import default_config
    from flashtune.provenance import is_current
    from flashtune.store import ResultFilter, Store

    def stored(k):
        if db is None:
            return None
        with Store(db) as store:
            found = [r for r in store.list_results(ResultFilter.for_key(k)) if is_current(r.provenance)]
        return found[0].config if found else None

    def default(pass_):
        return default_config(pass_, shape.head_dim, getattr(torch, shape.dtype), device, causal=shape.causal,
                              seq_q=shape.seq_q, seq_k=shape.seq_k, batch_heads_kv=shape.batch * shape.heads_kv,
                              batch_heads=shape.batch * shape.heads_q)

    fwd_key = dataclasses.replace(key, pass_="fwd")
    fwd = stored(fwd_key) or default("fwd")
    return (fwd, None) if key.pass_ == "fwd" else (stored(key) or default("bwd"), fwd)


def race(row: Row, gpu, device, db, rounds: int):
    """(the key, its race: {runner: RunnerTime or None}, (winner, fwd config)) by ``KeyBench.race``."""
    from flashtune.autotuner.trial import KeyBench
    from flashtune.keys import TuningKey

    key = TuningKey.for_shape(gpu.key, row.shape, row.pass_)
    winner, fwd_config = triton_configs(key, row.shape, device, db)
    bench = KeyBench(key, device, (row.shape.batch, row.shape.heads_q, row.shape.heads_kv))
    times = bench.race(winner, fwd_config, rounds)
    del bench
    return key, times, (winner, fwd_config)


def serving_store(path: pathlib.Path, key, configs, times, gpu, device) -> None:
    """A store whose rows of the key (and of its fwd key) are the configs raced, served by the kernels."""
    from flashtune.provenance import current_provenance
    from flashtune.store import StoredResult, Store

    winner, fwd_config = configs
    provenance = current_provenance(device if device.type == "cuda" else None)
    ms = max((times.get("triton").gpu_ms if times.get("triton") else 1.0), 1e-6)
    rows = [(key, winner)] + ([(dataclasses.replace(key, pass_="fwd"), fwd_config)] if fwd_config else [])
    with Store(path) as store:
        store.upsert_gpu(gpu)
        for k, config in rows:
            store.save_result(StoredResult(key=k, config=config, time_ms=ms, tflops=0.0, default_time_ms=None,
                                           error=0.0, n_trials=0, gpu=gpu, provenance=provenance), replace=True)


def served_note(row: Row, store, device) -> list[str]:
    """A note where the drop-in would not serve the row's call with the raced configs on the kernels."""
    from flashtune import get_tuned_attention

    q, k, v, _ = harness.make_inputs(row.shape, device, "transformers")
    choice = get_tuned_attention(store).explain(q, k, v, is_causal=row.shape.causal and row.shape.seq_q > 1,
                                                enable_gqa=row.shape.heads_q != row.shape.heads_kv)
    sources = [choice.fwd_source] + ([choice.bwd_source] if row.training else [])
    runner = choice.train_runner if row.training else choice.runner
    if all(source == "tuned exact" for source in sources) and runner == "triton":
        return []
    return [f"the drop-in serves this call otherwise than raced: {runner}, {'; '.join(sources)}"]


# ----------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------
def make_model(row: Row, layers: int, implementation: str, device):
    """A random-weight model of the row's attention geometry, in the row's dtype."""
    import torch

    s = row.shape
    hidden = s.heads_q * s.head_dim
    torch.manual_seed(0)
    if row.model == "bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=hidden, num_attention_heads=s.heads_q, num_hidden_layers=layers,
                            intermediate_size=4 * hidden, max_position_embeddings=max(512, s.seq_q), vocab_size=1024,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = BertModel(config, add_pooling_layer=False)
    else:
        from transformers import LlamaConfig, LlamaModel

        config = LlamaConfig(hidden_size=hidden, num_attention_heads=s.heads_q, num_key_value_heads=s.heads_kv,
                             head_dim=s.head_dim, num_hidden_layers=layers, intermediate_size=4 * hidden,
                             vocab_size=1024, max_position_embeddings=max(s.seq_q, s.seq_k) + 1)
        model = LlamaModel(config)
    config._attn_implementation = implementation  # noqa: SLF001 - transformers' own switch
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(implementation)
    model = model.to(device=device, dtype=getattr(torch, s.dtype))
    return model.train(row.training)


def model_step(row: Row, model, device):
    """A no-argument call: forward + backward of the stack (training), its forward (inference), or
    one decode step against a static cache of the row's key length (its contents do not matter to
    the time; each step writes the same last slot, so the cache does not grow)."""
    import torch

    s, dtype = row.shape, getattr(torch, row.shape.dtype)
    hidden = s.heads_q * s.head_dim
    gen = torch.Generator(device=device).manual_seed(1)
    if row.model == "llama-decode":
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=s.seq_k)
        x = torch.randn(s.batch, 1, hidden, device=device, dtype=dtype, generator=gen)
        position = torch.tensor([s.seq_k - 1], device=device)
        ids = position.expand(s.batch, 1)

        def decode():
            with torch.no_grad():
                return model(inputs_embeds=x, past_key_values=cache, cache_position=position, position_ids=ids,
                             use_cache=True).last_hidden_state
        return decode
    x = torch.randn(s.batch, s.seq_q, hidden, device=device, dtype=dtype, generator=gen)
    if not row.training:
        def forward():
            with torch.no_grad():
                return model(inputs_embeds=x).last_hidden_state
        return forward
    grad = torch.randn(s.batch, s.seq_q, hidden, device=device, dtype=dtype, generator=gen)

    def train():
        model.zero_grad(set_to_none=True)
        model(inputs_embeds=x).last_hidden_state.backward(grad)
    return train


class Models:
    """The row's two models, built once (random init on the device): attn_implementation "sdpa"
    (each SDPA runner holds it to its backend) and "ftune" (the kernels); each with its step, or
    the reason it cannot be built."""

    def __init__(self, row: Row, layers: int, device):
        self.row, self.layers, self.device = row, layers, device
        self.built: dict = {}

    def step(self, implementation: str):
        if implementation not in self.built:
            import torch

            try:
                with torch.device(self.device):
                    model = make_model(self.row, self.layers, implementation, self.device)
                self.built[implementation] = (model, model_step(self.row, model, self.device))
            except Exception as e:  # noqa: BLE001 - a model this transformers cannot build: noted
                self.built[implementation] = harness.first_line(e)
        return self.built[implementation]

    def close(self) -> None:
        import torch

        self.built.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def time_in_model(models: Models, runner: str, device, notes: list[str]):
    """Model ms per step with ``runner`` serving its attention, eagerly as a model runs; None with
    a note where it cannot run."""
    import contextlib

    import torch

    from flashtune.protocol import eager_time_ms

    built = models.step("ftune" if runner == "triton" else "sdpa")
    if isinstance(built, str):
        notes.append(f"model for {runner}: {built}")
        return None
    _, step = built
    if runner == "triton":
        held = contextlib.nullcontext()
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        held = sdpa_kernel([getattr(SDPBackend, SDPA_BACKEND_NAMES[runner])])
    try:
        with held, warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ms = eager_time_ms(step, device)
        # the drop-in warns where it hands a call to SDPA: then the figure is not the kernels'
        told = sorted({str(w.message).splitlines()[0] for w in seen if "flashtune" in str(w.message)})
        notes.extend(f"{runner} in the model: {message}" for message in told)
        return ms
    except Exception as e:  # noqa: BLE001 - a backend that cannot run this model's calls
        notes.append(f"{runner} in the model: {harness.first_line(e)}")
        return None


def main(argv=None) -> int:
    harness.use_interpreter_for_cpu(sys.argv[1:] if argv is None else argv)
    args, rows = parse_args(argv)
    import torch

    from flashtune import runners
    from flashtune.keys import GpuInfo

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("race_timing.py needs a CUDA GPU (--device cpu: a smoke run under the interpreter)", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.cuda.set_device(device)
    gpu = GpuInfo.from_device(device) if device.type == "cuda" else GpuInfo.interpreter()
    env = harness.environment(device)
    print(harness.environment_line(env))
    if device.type != "cuda":
        print("[Triton interpreter: not GPU figures]")
    try:
        import flashtune.integrations.transformers as flashtune_hf
    except ImportError as e:
        flashtune_hf = None
        print(f"note: no model timings: {e}", file=sys.stderr)
    report = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, row in enumerate(rows):
            notes = [row.note] if row.note else []
            try:
                key, times, configs = race(row, gpu, device, args.db, args.rounds)
            except Exception as e:  # noqa: BLE001 - the row's inputs do not fit, the kernels cannot run it
                notes.append(f"race: {harness.first_line(e)}")
                report.append(report_row(row, {}, {}, notes))
                print(f"{row.shape.name or row.shape.label()}: skipped ({notes[-1]})", flush=True)
                continue
            model_ms: dict = {}
            if row.model is not None and not args.no_model and flashtune_hf is not None:
                store = pathlib.Path(scratch) / f"row{i}.db"
                serving_store(store, key, configs, times, gpu, device)
                notes += served_note(row, store, device)
                flashtune_hf.register(db=store, strict=False)
                names = list(runners.RUNNERS)
                samples: dict = {name: [] for name in names}
                models = Models(row, args.layers, device)
                try:
                    for r in range(args.rounds):  # interleaved, the order rotated each round
                        for name in names[r % len(names):] + names[:r % len(names)]:
                            if samples[name] is not None:
                                ms = time_in_model(models, name, device, notes)
                                samples[name] = None if ms is None else samples[name] + [ms]
                finally:
                    models.close()
                model_ms = {name: statistics.median(ms) if ms else None for name, ms in samples.items()}
            report.append(report_row(row, times, model_ms, notes))
            _print_row(report[-1])
    result = {"environment": env, "host_bound_factor": runners.HOST_BOUND_FACTOR, "layers": args.layers,
              "rounds": args.rounds, "db": args.db, "rows": report, "summary": summary(report)}
    s = result["summary"]
    print(f"rule chose the runner fastest in the model on {s['rule']['agrees']} of {s['rows_judged']} rows "
          f"(GPU time alone: {s['gpu_choice']['agrees']}, eager time alone: {s['eager_choice']['agrees']})")
    harness.write_json(args.out, result)
    return 0


def _print_row(r: dict) -> None:
    def cell(t):
        return "      -/-      " if t is None else f"{t['gpu_ms']:7.4f}/{t['eager_ms']:7.4f}"

    print(f"{r['row']} ({r['pass']}, model {r['model'] or '-'})")
    for name, t in r["race"].items():
        ms = r["model_ms"].get(name)
        print(f"  {name:<15} race gpu/eager ms {cell(t)}   in the model {harness.fmt(ms, '8.4f')} ms")
    ratio = r["host_bound_ratio"]
    print(f"  rule: {r['rule']} ({r['chosen_by']}; eager/GPU of the GPU choice "
          f"{harness.fmt(ratio, '.2f')}x), fastest in the model: {r['model_fastest'] or '-'}"
          + ("" if r["rule_agrees"] is None else "  [agrees]" if r["rule_agrees"] else "  [DIFFERS]"))
    for note in r["notes"]:
        print(f"  note: {note}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
