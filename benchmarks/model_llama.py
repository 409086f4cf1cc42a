"""flashtune at the model level: a transformers LlamaForCausalLM with Llama-3-8B's layer sizes,
``attn_implementation="sdpa"`` against flashtune's registered implementation ("ftune",
``flashtune.integrations.transformers``), in one process on one set of weights.

    python benchmarks/model_llama.py --out model.json
    python benchmarks/model_llama.py --layers 8 --train 1x8192,4x2048 --gen-batch 1,16,64 --optimizer adamw
    python benchmarks/model_llama.py --device cpu        # tiny model under the Triton interpreter

The model: hidden 4096, 32 query heads and 8 key/value heads of 128, MLP 14336, ``--layers``
layers (default 4), ``--vocab`` tokens (default 32000, not Llama-3's 128256, to save memory),
random weights in ``--dtype`` (bf16). One model serves both implementations: it is switched by
``set_attn_implementation`` between calls, so both run the same weights. The cases:

- training steps (``--train BxN,...``): gradients zeroed, forward, a loss on random labels,
  backward (and ``--optimizer``'s step at learning rate 0: its arithmetic runs, the weights
  stay the same for every round);
- ``generate()`` (``--gen-batch B,...``): a prompt of ``--prompt`` random tokens, greedy,
  exactly ``--new`` new tokens, transformers' default cache.

Every case is first run once by each implementation as a check (the warm-up too: compiles,
caches): the logits against SDPA's (relative error of the whole tensor, within 5 %), for
training also the gradients of the first layer's parameters; for generate() the last prompt
position's logits and the generated tokens (greedy decoding of a random model meets near-ties,
so in bf16 the tokens may part after a while; they are reported, not required to agree). Then
``--rounds`` interleaved rounds (the order rotated each round), each the median of ``--iters``
calls between device synchronisations: ms per call, and sdpa / ftune (above 1: flashtune
faster). Then one call of each implementation under torch.profiler (``--profile``): the GPU time
of flashtune's kernels (harness.kernel_function_names), of SDPA's kernels and of everything
else, the GPU time launched from inside the attention functions (forward and backward), and the
host time of the model's attention function, of flashtune's dispatcher inside it
(``TunedAttention.__call__``) and of the attention backward's autograd nodes. The profiled call
is slower than the timed ones (the profiler's own cost): its figures are shares, the ms come
from the rounds. A case that fails (out of memory, say) records its error and the next runs.

Exit status 1 when an implementation's check fails; --device cpu is a check that the script
works, not a performance figure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import math
import pathlib
import re
import sys
import time
import warnings
import zlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/harness.py)
from kernel_breakdown import short_name  # noqa: E402

# Llama-3-8B's layer sizes; the vocabulary is smaller by default (its logits and embeddings are
# not what is compared, and 128256 tokens cost 4 GiB of weights and gradients more)
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, rms_norm_eps=1e-5)
GPU_DEFAULTS = dict(layers=4, vocab=32000, train="1x8192,4x2048", gen_batch="1,16,64", prompt=512, new=128)
# under the interpreter every attention call is Python over numpy: two layers of four heads of 16
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rms_norm_eps=1e-5)
CPU_DEFAULTS = dict(layers=2, vocab=128, train="1x32", gen_batch="1,2", prompt=32, new=4)

IMPLEMENTATIONS = ("sdpa", "ftune")
TOLERANCE = 0.05  # the harness's rule: every runner within 5 % relative error of the anchor
ATTENTION_RANGE = "model_llama: attention function"
DISPATCH_RANGE = "model_llama: flashtune dispatcher"
STEP_RANGE = "model_llama: step"
# the autograd node of an attention call's backward: flashtune's Function, or an SDPA backend's
ATTENTION_BACKWARD = re.compile(r"^autograd::engine::evaluate_function: "
                                r"(?:FlashAttention\w*|ScaledDotProduct\w*Attention\w*)Backward\d*$")
# SDPA's backends on a GPU: FlashAttention-2 (pytorch_flash::flash_fwd_kernel, flash_bwd_*),
# memory-efficient (fmha_cutlassF/B_*), cuDNN (cudnn_generated_fort_native_sdpa_*)
SDPA_KERNEL = re.compile(r"pytorch_flash|flash_fwd|flash_bwd|fmha|sdpa|efficient_attention|mem_eff")


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str  # "train" or "generate"
    batch: int
    tokens: int  # the training sequence, or the prompt
    new: int = 0  # generated tokens

    @property
    def name(self) -> str:
        if self.kind == "train":
            return f"train-{self.batch}x{self.tokens}"
        return f"generate-b{self.batch}-p{self.tokens}-n{self.new}"

    def tokens_per_call(self) -> int:
        return self.batch * (self.tokens if self.kind == "train" else self.new)


def parse_train(text: str) -> list[tuple[int, int]]:
    """``--train 1x8192,4x2048``: (batch, tokens) pairs."""
    pairs = []
    for item in (x.strip() for x in text.split(",")):
        m = re.fullmatch(r"(\d+)x(\d+)", item)
        if not m or int(m[1]) < 1 or int(m[2]) < 2:
            raise ValueError(f"expected BATCHxTOKENS items such as 1x8192,4x2048 (tokens at least 2), got {item!r}")
        pairs.append((int(m[1]), int(m[2])))
    return pairs


def parse_counts(text: str) -> list[int]:
    """``--gen-batch 1,16,64``: positive integers."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"expected positive integers such as 1,16,64, got {item!r}")
        out.append(int(item))
    return out


def parse_args(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda[:N], or cpu: a tiny model (2 layers, hidden 64, 4 heads, "
                                                     "2 K/V heads) under the Triton interpreter")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 4; 2 on cpu)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 32000; 128 on cpu)")
    ap.add_argument("--dtype", default=None, choices=sorted(harness.DTYPES), help="default bf16 (fp32 on cpu)")
    ap.add_argument("--train", default=None, metavar="BxN,...",
                    help="training steps of B sequences of N tokens (default 1x8192,4x2048; 1x32 on cpu; "
                         "'' for none)")
    ap.add_argument("--gen-batch", default=None, metavar="B,...",
                    help="generate() batch sizes (default 1,16,64; 1,2 on cpu; '' for none)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens of generate() (default 512; 32 on cpu)")
    ap.add_argument("--new", type=int, default=None, help="tokens generate() adds (default 128; 4 on cpu)")
    ap.add_argument("--optimizer", choices=("none", "sgd", "adamw"), default="none",
                    help="an optimizer step in each training step, at learning rate 0 (default none)")
    ap.add_argument("--db", default=None, help="the store whose tuned table flashtune serves (default: as "
                                               "get_tuned_attention(): FLASHTUNE_DB or the user's store)")
    ap.add_argument("--strict", action="store_true",
                    help="a call flashtune's kernels cannot run raises instead of running torch SDPA")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per case (default 3; 1 on cpu)")
    ap.add_argument("--max-rounds", type=int, default=None,
                    help="more rounds, up to this many, while half or more of an implementation's rounds are over "
                         "1.15x its fastest (default 2 x --rounds + 1 on a GPU)")
    ap.add_argument("--iters", type=int, default=None, help="calls per round, their median taken (default 3; 1 on cpu)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="calls of each implementation after its check, before the rounds (default 1; 0 on cpu)")
    ap.add_argument("--profile", choices=("both", "ftune", "none"), default="both",
                    help="profile one call of each implementation, of flashtune's only, or none (default both)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", metavar="FILE.json", help="write the results as JSON ('-': stdout)")
    ap.set_defaults(_default_rounds=3)
    return ap, ap.parse_args(argv)


def settle_args(ap: argparse.ArgumentParser, args: argparse.Namespace, cpu: bool) -> list[Case]:
    """The defaults of the device filled in, every number checked (``ap.error`` names a bad one);
    the cases to run."""
    defaults = CPU_DEFAULTS if cpu else GPU_DEFAULTS
    for name in ("layers", "vocab", "prompt", "new"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
        if getattr(args, name) < 1:
            ap.error(f"--{name}: expected a positive number, got {getattr(args, name)}")
    if args.vocab < 2:
        ap.error(f"--vocab: expected at least 2 tokens, got {args.vocab}")
    if args.iters is None:
        args.iters = 1 if cpu else 3
    if args.warmup is None:
        args.warmup = 0 if cpu else 1
    if args.iters < 1:
        ap.error(f"--iters: expected at least 1, got {args.iters}")
    if args.warmup < 0:
        ap.error(f"--warmup: expected 0 or more, got {args.warmup}")
    args.dtype = harness.DTYPES[args.dtype] if args.dtype else "float32" if cpu else "bfloat16"
    try:
        train = parse_train(defaults["train"] if args.train is None else args.train) \
            if (args.train is None or args.train.strip()) else []
    except ValueError as e:
        ap.error(f"--train: {e}")
    try:
        gen = parse_counts(defaults["gen_batch"] if args.gen_batch is None else args.gen_batch) \
            if (args.gen_batch is None or args.gen_batch.strip()) else []
    except ValueError as e:
        ap.error(f"--gen-batch: {e}")
    cases = [Case("train", b, n) for b, n in train] + [Case("generate", b, args.prompt, args.new) for b in gen]
    if not cases:
        ap.error("--train/--gen-batch: no case to run")
    return list(dict.fromkeys(cases))


# ----------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------
def build_model(args, cases: list[Case], device, cpu: bool):
    """A LlamaForCausalLM of random weights in the run's dtype on ``device``, running SDPA."""
    import torch
    import transformers

    longest = max(c.tokens + c.new for c in cases)
    config = transformers.LlamaConfig(vocab_size=args.vocab, num_hidden_layers=args.layers,
                                      max_position_embeddings=max(8192, longest), attention_dropout=0.0,
                                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      **(TINY if cpu else LLAMA3_8B))
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # made in its dtype (no fp32 copy on the way), as from_pretrained makes it
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    # no .to(dtype): it would round the rotary embedding's fp32 inverse frequencies as well
    odd = {str(p.dtype) for p in model.parameters() if p.dtype != dtype}
    if odd:
        raise RuntimeError(f"the model was built with parameters in {', '.join(sorted(odd))}, not {dtype}")
    use(model, "sdpa")
    # a fixed length: no end-of-sequence token ends a sequence early
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def use(model, implementation: str) -> None:
    """Switch the model's attention to ``implementation`` (and check that it took)."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(implementation)
    else:  # transformers without it: the attention layers read the shared config on every call
        model.config._attn_implementation = implementation
    if model.config._attn_implementation != implementation:
        raise RuntimeError(f"the model runs {model.config._attn_implementation!r} after switching to "
                           f"{implementation!r}")


def make_optimizer(model, name: str):
    import torch

    if name == "none":
        return None
    # learning rate 0: the step's arithmetic runs, the weights stay the same for every round
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.0)


def rel_err(a, b) -> float:
    """|a - b| / |b| over whole tensors (norms in fp32)."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class TrainCase:
    """One training step's inputs and calls."""

    def __init__(self, model, case: Case, device, optimizer, seed: int) -> None:
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        vocab = model.config.vocab_size
        self.model, self.optimizer = model, optimizer
        self.ids = torch.randint(0, vocab, (case.batch, case.tokens), device=device, generator=gen)
        self.labels = torch.randint(0, vocab, (case.batch, case.tokens), device=device, generator=gen)

    def prepare(self) -> None:
        self.model.train()

    def __call__(self):
        self.model.zero_grad(set_to_none=True)
        out = self.model(input_ids=self.ids, labels=self.labels)
        out.loss.backward()
        if self.optimizer is not None:
            self.optimizer.step()
        return out

    def check_run(self) -> dict:
        """The step's loss and logits, and the first layer's gradients (copies)."""
        out = self()
        layer = self.model.model.layers[0]
        grads = {name: p.grad.detach().clone() for name, p in layer.named_parameters() if p.grad is not None}
        return {"loss": out.loss.item(), "logits": out.logits.detach(), "grads": grads}

    @staticmethod
    def compare(got: dict, ref: dict) -> dict:
        names = sorted(ref["grads"])
        if sorted(got["grads"]) != names:
            raise RuntimeError("the implementations' first layers have gradients for different parameters")
        per = {n: rel_err(got["grads"][n], ref["grads"][n]) for n in names}
        diff = math.sqrt(sum((got["grads"][n].float() - ref["grads"][n].float()).norm().item() ** 2 for n in names))
        norm = math.sqrt(sum(ref["grads"][n].float().norm().item() ** 2 for n in names))
        worst = max(per, key=per.get)
        figures = {"loss": got["loss"], "logits_rel_err": rel_err(got["logits"], ref["logits"]),
                   "layer0_grad_rel_err": diff / max(norm, 1e-30), "layer0_worst_grad": {worst: per[worst]}}
        figures["ok"] = bool(figures["logits_rel_err"] <= TOLERANCE and figures["layer0_grad_rel_err"] <= TOLERANCE)
        return figures


class GenerateCase:
    """One generate() call's inputs and calls."""

    def __init__(self, model, case: Case, device, seed: int) -> None:
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        self.model, self.case = model, case
        self.prompt = torch.randint(3, model.config.vocab_size, (case.batch, case.tokens), device=device,
                                    generator=gen)
        self.mask = torch.ones_like(self.prompt)

    def prepare(self) -> None:
        self.model.eval()

    def __call__(self):
        return self.model.generate(self.prompt, attention_mask=self.mask, max_new_tokens=self.case.new,
                                   min_new_tokens=self.case.new, do_sample=False)

    def check_run(self) -> dict:
        import torch

        tokens = self()
        if tokens.shape != (self.case.batch, self.case.tokens + self.case.new):
            raise RuntimeError(f"generate() returned {tuple(tokens.shape)} tokens, expected "
                               f"{(self.case.batch, self.case.tokens + self.case.new)}")
        with torch.no_grad():
            logits = self.model(input_ids=self.prompt, attention_mask=self.mask, logits_to_keep=1).logits[:, -1]
        return {"tokens": tokens[:, self.case.tokens:], "logits": logits}

    @staticmethod
    def compare(got: dict, ref: dict) -> dict:
        same = got["tokens"] == ref["tokens"]
        parted = (~same).int().argmax(dim=1)  # each row's first differing step (0 where none)
        first = [int(p) if not s.all() else None for p, s in zip(parted.tolist(), same)]
        figures = {"prompt_logits_rel_err": rel_err(got["logits"], ref["logits"]),
                   "tokens_equal": bool(same.all()), "tokens_equal_fraction": same.float().mean().item(),
                   "first_differing_step": first}
        figures["ok"] = bool(figures["prompt_logits_rel_err"] <= TOLERANCE)
        return figures


# ----------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------
def synchronizer(device):
    import torch

    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def median_ms(fn, sync, iters: int) -> float:
    """The median wall ms of ``iters`` calls, each between two synchronisations: a model step's
    time as its caller sees it, host and GPU together."""
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return harness.median(times)


# ----------------------------------------------------------------------------------
# The profile
# ----------------------------------------------------------------------------------
@contextlib.contextmanager
def marked_ranges(implementation: str):
    """Profiler ranges around the model's attention function (the one ``implementation``
    names in transformers' attention interface, through a local override of it) and around
    flashtune's dispatcher; both put back afterwards."""
    from torch.profiler import record_function
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from flashtune.dispatch import TunedAttention

    original = ALL_ATTENTION_FUNCTIONS[implementation]
    dispatch = TunedAttention.__call__

    def attention(*args, **kwargs):
        with record_function(ATTENTION_RANGE):
            return original(*args, **kwargs)

    def dispatcher(self, *args, **kwargs):
        with record_function(DISPATCH_RANGE):
            return dispatch(self, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS[implementation] = attention  # the instance's own mapping, over the registered one
    TunedAttention.__call__ = dispatcher
    try:
        yield
    finally:
        TunedAttention.__call__ = dispatch
        del ALL_ATTENTION_FUNCTIONS[implementation]


def kernel_class(name: str, flashtune_names: frozenset) -> str:
    """flashtune, sdpa or other: whose kernel a profiled GPU launch is."""
    short = short_name(name, width=400)
    if short in flashtune_names or any(short.startswith(n) for n in flashtune_names):
        return "flashtune"
    return "sdpa" if SDPA_KERNEL.search(name) else "other"


def summarize(events, flashtune_names: frozenset, top: int = 5) -> dict:
    """A profiled call's GPU time by whose kernels ran, the GPU time launched inside the
    attention functions, and the host time of the attention function, the dispatcher and the
    attention backward's nodes (ms of the call, and the number of ranges)."""
    from torch.autograd import DeviceType

    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    gpu = [e for e in events if e.device_type == DeviceType.CUDA]

    def host(match) -> tuple[float, int]:
        spans = [e.time_range.elapsed_us() for e in cpu if match(e.name)]
        return sum(spans) / 1e3, len(spans)

    attention_ms, attention_calls = host(lambda n: n == ATTENTION_RANGE)
    dispatch_ms, dispatch_calls = host(lambda n: n == DISPATCH_RANGE)
    backward_ms, backward_calls = host(lambda n: bool(ATTENTION_BACKWARD.match(n)))
    step_ms, _ = host(lambda n: n == STEP_RANGE)
    out = {"step_ms_profiled": step_ms,
           "host_ms": {"attention_function": attention_ms, "flashtune_dispatcher": dispatch_ms,
                       "attention_backward_nodes": backward_ms},
           "host_calls": {"attention_function": attention_calls, "flashtune_dispatcher": dispatch_calls,
                          "attention_backward_nodes": backward_calls}}
    by_class: dict = {"flashtune": {}, "sdpa": {}, "other": {}}
    for e in gpu:
        entry = by_class[kernel_class(e.name, flashtune_names)].setdefault(short_name(e.name), [0.0, 0])
        entry[0] += e.time_range.elapsed_us() / 1e3
        entry[1] += 1
    total = sum(ms for kernels in by_class.values() for ms, _ in kernels.values())
    out["gpu_ms"] = {cls: sum(ms for ms, _ in kernels.values()) for cls, kernels in by_class.items()}
    out["gpu_ms"]["total"] = total
    out["gpu_share"] = {cls: (ms / total if total else None) for cls, ms in out["gpu_ms"].items() if cls != "total"}
    out["top_kernels"] = {cls: [{"kernel": k, "ms": ms, "launches": n}
                                for k, (ms, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]]
                          for cls, kernels in by_class.items()}
    out["gpu_ms_launched_in_attention"] = launched_in_attention(cpu, gpu) if gpu else None
    out["gpu_profiled"] = bool(gpu)
    return out


def launched_in_attention(cpu: list, gpu: list) -> float | None:
    """GPU ms of the kernels launched inside an attention function's range or an attention
    backward node (each kernel's launching op found by its correlation id, then its parents);
    None where the profiler gave no correlation."""
    # the ops (linked to nothing themselves): a runtime event's id is CUPTI's, which may equal an op's
    by_id = {e.id: e for e in cpu if not getattr(e, "linked_correlation_id", 0)}
    found, total = False, 0.0
    for kernel in gpu:
        op = by_id.get(getattr(kernel, "linked_correlation_id", 0) or -1)
        found |= op is not None
        seen = 0
        while op is not None and seen < 10_000:
            if op.name == ATTENTION_RANGE or ATTENTION_BACKWARD.match(op.name):
                total += kernel.time_range.elapsed_us() / 1e3
                break
            op, seen = op.cpu_parent, seen + 1
    return total if found else None


def profile_call(runner, model, implementation: str, device, flashtune_names: frozenset) -> dict:
    """One call of ``runner`` by ``implementation`` under torch.profiler, summarized."""
    from torch.profiler import ProfilerActivity, profile, record_function

    use(model, implementation)
    sync = synchronizer(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync()
    with marked_ranges(implementation), profile(activities=activities) as prof:
        with record_function(STEP_RANGE):
            runner()
        sync()
    return summarize(prof.events(), flashtune_names)


# ----------------------------------------------------------------------------------
# A case
# ----------------------------------------------------------------------------------
def free(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def peak_gib(device) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None


def run_case(case: Case, model, names: dict, args, device, optimizer, flashtune_names: frozenset) -> dict:
    """The check, the interleaved rounds and the profiles of one case; what fails is recorded."""
    import torch

    result: dict = {"name": case.name, **dataclasses.asdict(case), "errors": {}}
    seed = args.seed + 1 + zlib.crc32(case.name.encode()) % 1000  # the same inputs in every run
    try:
        runner = TrainCase(model, case, device, optimizer, seed) if case.kind == "train" else \
            GenerateCase(model, case, device, seed)
    except Exception as e:  # noqa: BLE001 - out of memory for the inputs: the next case runs
        result["errors"]["case"] = harness.first_line(e)
        return result
    runner.prepare()
    sync = synchronizer(device)
    ran, peaks = {}, {}
    for impl in IMPLEMENTATIONS:  # the check, which is also the warm-up
        try:
            use(model, names[impl])
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            ran[impl] = runner.check_run()
            peaks[impl] = peak_gib(device)
            for _ in range(args.warmup):
                runner()
            sync()
        except Exception as e:  # noqa: BLE001 - out of memory, or an implementation that cannot run it
            result["errors"][impl] = harness.first_line(e)
            ran.pop(impl, None)
        free(device)
    if device.type == "cuda":
        result["peak_gib"] = peaks
    if "sdpa" in ran and "ftune" in ran:
        try:
            result["check"] = runner.compare(ran["ftune"], ran["sdpa"])
            if case.kind == "train":
                result["check"]["sdpa_loss"] = ran["sdpa"]["loss"]
        except Exception as e:  # noqa: BLE001
            result["errors"]["check"] = harness.first_line(e)
    del ran
    free(device)

    def time_one(impl: str, _pass: str) -> float:
        use(model, names[impl])
        return median_ms(runner, sync, args.iters)

    runnable = {impl: impl for impl in IMPLEMENTATIONS if impl not in result["errors"]}
    times, failed = harness.time_rounds(runnable, ["call"], args.rounds, time_one, max_rounds=args.max_rounds)
    for (impl, _), why in failed.items():
        result["errors"][impl] = why
    free(device)
    ms = {impl: harness.median(times[impl, "call"]) for impl in runnable if times[impl, "call"]}
    result["ms"] = ms
    result["rounds_ms"] = {impl: times[impl, "call"] for impl in runnable}
    result["ratio_sdpa_over_ftune"] = harness.ratio(ms.get("sdpa"), ms.get("ftune"))
    result["tokens_per_s"] = {impl: case.tokens_per_call() / (t * 1e-3) for impl, t in ms.items() if t}
    profiled = [] if args.profile == "none" else ["ftune"] if args.profile == "ftune" else list(IMPLEMENTATIONS)
    result["breakdown"] = {}
    for impl in profiled:
        if impl not in ms:
            continue
        try:
            result["breakdown"][impl] = profile_call(runner, model, names[impl], device, flashtune_names)
        except Exception as e:  # noqa: BLE001 - the profile is extra: its failure leaves the times
            result["errors"][f"profile {impl}"] = harness.first_line(e)
        free(device)
    del runner
    model.zero_grad(set_to_none=True)  # a training case's gradients would stay for the next cases
    free(device)
    return result


def print_case(r: dict) -> None:
    ms = r.get("ms", {})
    line = f"{r['name']:<26}" + "".join(f" {impl} {harness.fmt(ms.get(impl), '9.2f')} ms" for impl in IMPLEMENTATIONS)
    line += f"   sdpa/ftune {harness.fmt(r.get('ratio_sdpa_over_ftune'), '6.3f')}"
    check = r.get("check")
    if check:
        figures = ", ".join(f"{k} {v:.2e}" for k, v in check.items() if k.endswith("rel_err"))
        if "tokens_equal_fraction" in check:
            figures += f", tokens equal {check['tokens_equal_fraction']:.1%}"
        line += f"   check: {figures}{'' if check['ok'] else '  <-- PROBLEM'}"
    print(line, flush=True)
    for impl, b in r.get("breakdown", {}).items():
        g, h, n = b["gpu_ms"], b["host_ms"], b["host_calls"]
        gpu = "no GPU kernels profiled"
        if b["gpu_profiled"]:
            gpu = f"GPU {g['total']:.2f} ms: " + ", ".join(
                f"{cls} {g[cls]:.2f} ms ({harness.fmt(b['gpu_share'][cls], '.1%')})"
                for cls in ("flashtune", "sdpa", "other"))
        inside = b["gpu_ms_launched_in_attention"]
        print(f"    {impl} profiled {b['step_ms_profiled']:.2f} ms; {gpu}"
              + ("" if inside is None else f"; launched in attention {inside:.2f} ms"))
        print(f"      host: attention function {h['attention_function']:.2f} ms ({n['attention_function']} calls), "
              f"flashtune dispatcher {h['flashtune_dispatcher']:.2f} ms ({n['flashtune_dispatcher']}), "
              f"attention backward nodes {h['attention_backward_nodes']:.2f} ms ({n['attention_backward_nodes']})")
    for what, why in r["errors"].items():
        print(f"    {what}: {why}", flush=True)


def main(argv=None) -> int:
    ap, args = parse_args(argv)
    cpu = harness.use_interpreter_for_cpu(["--device", args.device])  # before triton is imported
    cases = settle_args(ap, args, cpu)
    device = harness.timing_from_args(ap, args)
    if cpu:  # a tiny model: torch's threads only contend with each other (and with a busy machine's others)
        import torch

        torch.set_num_threads(1)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("model_llama.py needs transformers: pip install 'flashtune[transformers]'", file=sys.stderr)
        return 2
    from flashtune.integrations import transformers as flashtune_hf

    names = {"sdpa": "sdpa", "ftune": flashtune_hf.register(db=args.db, strict=args.strict)}
    env = harness.environment(device)
    print(harness.environment_line(env))
    flashtune_names = harness.kernel_function_names()
    try:
        model = build_model(args, cases, device, cpu)
    except Exception as e:  # noqa: BLE001 - out of memory for the weights, say: no case can run
        why = f"the model ({args.layers} layers, vocab {args.vocab}, {args.dtype}) cannot be built: " \
              f"{harness.first_line(e)}"
        print(f"model_llama.py: {why}", file=sys.stderr)
        harness.write_json(args.out, {"environment": env, "error": why})
        return 2
    params = sum(p.numel() for p in model.parameters())
    model_info = {"layers": args.layers, "vocab": args.vocab, "dtype": args.dtype, "parameters": params,
                  **{k: getattr(model.config, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                           "num_key_value_heads", "head_dim")},
                  "transformers": transformers.__version__, "optimizer": args.optimizer}
    print(f"# LlamaForCausalLM: {args.layers} layers, hidden {model_info['hidden_size']}, "
          f"{model_info['num_attention_heads']}/{model_info['num_key_value_heads']} heads of "
          f"{model_info['head_dim']}, vocab {args.vocab}, {params / 1e6:.1f}M parameters, {args.dtype}; "
          f"transformers {transformers.__version__}; sdpa against {names['ftune']!r}"
          + ("; [Triton interpreter: not GPU figures]" if cpu else ""), flush=True)
    optimizer = make_optimizer(model, args.optimizer)
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for case in cases:
            r = run_case(case, model, names, args, device, optimizer, flashtune_names)
            print_case(r)
            results.append(r)
    seen = list(dict.fromkeys(f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught))
    for w in seen:
        print(f"# warning: {w}")
    summary = {kind: harness.geomean([r["ratio_sdpa_over_ftune"] for r in results
                                      if r["kind"] == kind and r.get("ratio_sdpa_over_ftune")])
               for kind in ("train", "generate")}
    print("# geometric mean sdpa/ftune (above 1: flashtune faster): "
          + ", ".join(f"{k} {harness.fmt(v, '.3f')}" for k, v in summary.items()))
    bad = [r["name"] for r in results if r.get("check") and not r["check"]["ok"]]
    harness.write_json(args.out, {"environment": env, "model": model_info, "implementations": names,
                                  "timing": {"rounds": args.rounds, "max_rounds": args.max_rounds,
                                             "iters": args.iters, "warmup": args.warmup},
                                  "cases": results, "geomean_sdpa_over_ftune": summary, "warnings": seen,
                                  "failed_checks": bad})
    if bad:
        print(f"# check failed: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
