"""Attention shapes a team runs: rows from a file, or expanded from a model's preset.

A ``Shape`` is one attention call as a model makes it: batch, query and key/value heads,
query and key lengths, head dim, causal, dtype, and the passes it needs (``fwd`` for
inference, ``fwd`` and ``bwd`` for training). ``load_shapes(path)`` reads them from a JSON
or YAML file (a list of rows, or ``{"shapes": [...]}``); ``model_shapes(name)`` expands a
preset (Llama-3, Mistral, Qwen-2.5, Gemma-2, GPT-2, BERT, ViT, Whisper, Stable Diffusion)
into its prefill, decode and training calls at a few batch sizes and lengths. What is
wrong with a file is said with the row and the field; nothing is half-loaded.

Row fields (aliases in parentheses): ``batch`` (B), ``heads_q`` (Hq, heads), ``heads_kv``
(Hkv; default heads_q), ``seq_q`` (Nq, seq_len), ``seq_k`` (Nk; default seq_q), ``head_dim``
(D), ``causal`` (default false; top-left aligned, as SDPA's is_causal), ``dtype`` (default
bfloat16), ``passes`` (default ["fwd"]; "fwd+bwd" or a list), ``name`` (optional).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, Iterable

from flashtune.keys import DTYPES, PASSES

MAX_HEAD_DIM = 256
MAX_FILE_BYTES = 1 << 20
# bounds that keep a typo (an extra digit) from becoming a search of hours or a refused launch
MAX_BATCH, MAX_HEADS, MAX_SEQ = 1 << 16, 1024, 1 << 22

_ALIASES = {"B": "batch", "Hq": "heads_q", "heads": "heads_q", "Hkv": "heads_kv", "Nq": "seq_q", "seq_len": "seq_q",
            "Nk": "seq_k", "D": "head_dim"}


class ShapeError(ValueError):
    """A shape row or file that cannot be used; the message names the row and the field."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One attention call: q (batch, heads_q, seq_q, head_dim), k and v (batch, heads_kv, seq_k, head_dim)."""

    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_k: int
    head_dim: int
    causal: bool = False
    dtype: str = "bfloat16"
    passes: tuple[str, ...] = ("fwd",)
    name: str = ""

    def __post_init__(self) -> None:
        for field, top in (("batch", MAX_BATCH), ("heads_q", MAX_HEADS), ("heads_kv", MAX_HEADS),
                           ("seq_q", MAX_SEQ), ("seq_k", MAX_SEQ), ("head_dim", MAX_HEAD_DIM)):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise ShapeError(f"{field}: expected an integer in [1, {top}], got {_short(value)}")
        if self.heads_q % self.heads_kv:
            raise ShapeError(f"heads_kv: expected a divisor of heads_q ({self.heads_q}), got {self.heads_kv}")
        if not isinstance(self.causal, bool):
            raise ShapeError(f"causal: expected true or false, got {_short(self.causal)}")
        if self.dtype not in DTYPES:
            raise ShapeError(f"dtype: expected one of {', '.join(DTYPES)}, got {_short(self.dtype)}")
        if not self.passes or any(p not in PASSES for p in self.passes) or len(set(self.passes)) != len(self.passes):
            raise ShapeError(f"passes: expected 'fwd', 'bwd' or both, got {_short(self.passes)}")
        if not isinstance(self.name, str) or not self.name.isprintable() or len(self.name) > 100:
            raise ShapeError(f"name: expected printable text of at most 100 characters, got {_short(self.name)}")

    @property
    def decode(self) -> bool:
        """One query per sequence and head: a decode step, bound by reading K and V."""
        return self.seq_q == 1

    @property
    def group(self) -> int:
        """Query heads per key/value head (1: multi-head, heads_q: multi-query)."""
        return self.heads_q // self.heads_kv

    def flops(self, pass_: str = "fwd") -> float:
        """4·B·Hq·Nq·Nk·D for the forward, halved for causal with Nq = Nk; the backward is 2.5x."""
        work = 4.0 * self.batch * self.heads_q * self.seq_q * self.seq_k * self.head_dim
        if self.causal and self.seq_q == self.seq_k:
            work /= 2
        return work * (2.5 if pass_ == "bwd" else 1.0)

    def kv_bytes(self) -> int:
        """Bytes of K and V one call reads at least once (a decode step's floor)."""
        element = 4 if self.dtype == "float32" else 2
        return 2 * self.batch * self.heads_kv * self.seq_k * self.head_dim * element

    def label(self) -> str:
        gqa = f"/{self.heads_kv}" if self.heads_kv != self.heads_q else ""
        mask = " causal" if self.causal else ""
        return (f"{self.name + ': ' if self.name else ''}B{self.batch} H{self.heads_q}{gqa} "
                f"{self.seq_q}x{self.seq_k} d{self.head_dim}{mask} {self.dtype} {'+'.join(self.passes)}")

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["passes"] = list(self.passes)
        return out

    @classmethod
    def from_dict(cls, row: Any) -> "Shape":
        """A shape from a row of a shape file (aliases and defaults as the module says)."""
        if not isinstance(row, dict):
            raise ShapeError(f"expected an object of fields, got {type(row).__name__}")
        fields = {}
        for name, value in row.items():
            field = _ALIASES.get(name, name)
            if field not in _FIELDS:
                raise ShapeError(f"{name}: not a shape field (expected {', '.join(_FIELDS)})")
            if field in fields:
                raise ShapeError(f"{name}: given twice (as {field})")
            fields[field] = value
        missing = [f for f in ("batch", "heads_q", "seq_q", "head_dim") if f not in fields]
        if missing:
            raise ShapeError(f"{missing[0]}: missing")
        fields.setdefault("heads_kv", fields["heads_q"])
        fields.setdefault("seq_k", fields["seq_q"])
        passes = fields.get("passes", ("fwd",))
        if isinstance(passes, str):
            passes = passes.split("+")
        if not isinstance(passes, (list, tuple)):
            raise ShapeError(f"passes: expected 'fwd', 'bwd', 'fwd+bwd' or a list, got {_short(passes)}")
        fields["passes"] = tuple(passes)
        causal = fields.get("causal", False)
        if isinstance(causal, str) and causal.lower() in ("yes", "no", "true", "false"):
            fields["causal"] = causal.lower() in ("yes", "true")
        return cls(**fields)


_FIELDS = tuple(f.name for f in dataclasses.fields(Shape))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _field_name(name: Any) -> str:
    """A field's name as a message shows it: bare where it is a plain identifier."""
    return name if isinstance(name, str) and name.isidentifier() and len(name) <= 40 else _short(name)


def load_shapes(path: str | Path) -> list[Shape]:
    """The shapes of a JSON or YAML file, in order, duplicates dropped; ShapeError names what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ShapeError(f"{path}: expected a regular file of shapes (JSON or YAML)")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ShapeError(f"{path}: larger than {MAX_FILE_BYTES} bytes; a shape file is a short list")
    text = path.read_text(encoding="utf-8", errors="replace")
    data = _parse(path, text)
    if getattr(data, "twice", None) is not None:
        raise ShapeError(f"{path}: {_short(data.twice)} is given twice")
    if isinstance(data, dict) and set(data) == {"shapes"}:
        data = data["shapes"]
    if not isinstance(data, list) or not data:
        raise ShapeError(f"{path}: expected a non-empty list of shape rows (or {{\"shapes\": [...]}})")
    shapes = []
    for index, row in enumerate(data, 1):
        if getattr(row, "twice", None) is not None:
            raise ShapeError(f"{path}: row {index}: {_field_name(row.twice)}: given twice")
        try:
            shapes.append(Shape.from_dict(row))
        except ShapeError as e:
            raise ShapeError(f"{path}: row {index}: {e}") from None
        except TypeError as e:  # a field of the wrong kind that the constructor met first
            raise ShapeError(f"{path}: row {index}: {e}") from None
    return list(dict.fromkeys(shapes))


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml  # optuna's dependency

        try:
            return yaml.load(text, Loader=_fields_loader())  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as e:
            raise ShapeError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    try:
        return json.loads(text, object_pairs_hook=_Fields)
    except json.JSONDecodeError as e:
        raise ShapeError(f"{path}: not valid JSON: {e} (YAML files end in .yaml or .yml)") from None


class _Fields(dict):
    """An object of a shapes file, remembering a field it names twice (``twice``): JSON and YAML
    parsers keep the last one silently, and a row tuned at a shape its author did not mean costs
    a search. ``written``: the names as the file writes them, where they differ from the pairs'."""

    def __init__(self, pairs, written=None) -> None:
        pairs = list(pairs)
        super().__init__(pairs)
        self.twice, seen = None, set()
        for name in (n for n, _ in pairs) if written is None else written:
            if name in seen:
                self.twice = name
                break
            seen.add(name)


@functools.lru_cache(maxsize=1)
def _fields_loader():
    """yaml's SafeLoader making each mapping a ``_Fields`` (made on first use: yaml is imported
    only for YAML files)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            # the fields written in this mapping, before merge keys (`<<: *anchor`) add theirs,
            # which the written ones override as YAML means them to
            written = [self.construct_object(k, deep=True) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
            self.flatten_mapping(node)
            pairs = []
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, collections.abc.Hashable):
                    raise yaml.constructor.ConstructorError(None, None, "found an unhashable key",
                                                            key_node.start_mark)
                pairs.append((key, self.construct_object(value_node, deep=deep)))
            return _Fields(pairs, written)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                           lambda loader, node: loader.construct_mapping(node, deep=True))
    return Loader


# ----------------------------------------------------------------------------------
# Model presets
# ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Model:
    """A model's attention: its heads and head dim, and what kind of calls it makes."""

    name: str
    description: str
    heads_q: int
    heads_kv: int
    head_dim: int
    kind: str  # "decoder" (LLM: training, prefill, decode), "encoder" (fixed tokens), "whisper", "diffusion"
    seq_lens: tuple[int, ...] = (1024, 4096, 8192)  # decoder: training/prefill lengths and decode cache lengths
    tokens: int = 0  # encoder: tokens per sequence

    def shapes(self, *, tp: int = 1, batch_sizes: Iterable[int] | None = None,
               seq_lens: Iterable[int] | None = None, dtype: str = "bfloat16") -> list[Shape]:
        """This model's attention calls on one GPU of a ``tp``-way tensor-parallel group."""
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or self.heads_q % tp:
            raise ShapeError(f"tp: expected a divisor of {self.name}'s {self.heads_q} query heads, got {_short(tp)}")
        hq, hkv = self.heads_q // tp, max(1, self.heads_kv // tp)  # K/V heads replicate past tp = heads_kv
        lens = tuple(seq_lens) if seq_lens is not None else self.seq_lens
        suffix = f"-tp{tp}" if tp > 1 else ""
        out: list[Shape] = []

        def add(kind: str, b: int, nq: int, nk: int, causal: bool, passes: tuple[str, ...], heads=(hq, hkv),
                d: int = self.head_dim) -> None:
            out.append(Shape(b, heads[0], heads[1], nq, nk, d, causal, dtype, passes,
                             f"{self.name}{suffix}-{kind}-b{b}-{nq}x{nk}"))

        if self.kind == "decoder":
            batches = tuple(batch_sizes) if batch_sizes is not None else (1, 16, 64)
            for n in lens:
                add("train", max(1, 8192 // n), n, n, True, ("fwd", "bwd"))
                add("prefill", 1, n, n, True, ("fwd",))
                for b in batches:
                    add("decode", b, 1, n, False, ("fwd",))
        elif self.kind == "encoder":
            for b in tuple(batch_sizes) if batch_sizes is not None else (1, 8, 32):
                add("encode", b, self.tokens, self.tokens, False, ("fwd", "bwd"))
        elif self.kind == "whisper":  # encoder self-attention, decoder cross-attention to the audio
            for b in tuple(batch_sizes) if batch_sizes is not None else (1, 4, 16):
                add("encode", b, self.tokens, self.tokens, False, ("fwd",))
                add("cross-decode", b, 1, self.tokens, False, ("fwd",))
        elif self.kind == "diffusion":  # UNet self- and cross-attention at three resolutions, CFG doubles the batch
            for b in tuple(batch_sizes) if batch_sizes is not None else (2, 8):
                for level, tokens in enumerate((4096, 1024, 256)):
                    d = self.head_dim << level
                    add("self", b, tokens, tokens, False, ("fwd",), d=d)
                    add("cross", b, tokens, 77, False, ("fwd",), d=d)
        return list(dict.fromkeys(out))


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("llama3-8b", "Llama-3/3.1 8B: 32 query heads, 8 K/V heads, d128", 32, 8, 128, "decoder"),
    Model("llama3-70b", "Llama-3/3.1 70B: 64 query heads, 8 K/V heads, d128 (use --tp)", 64, 8, 128, "decoder"),
    Model("mistral-7b", "Mistral 7B: 32 query heads, 8 K/V heads, d128", 32, 8, 128, "decoder"),
    Model("qwen2.5-7b", "Qwen-2.5 7B: 28 query heads, 4 K/V heads, d128", 28, 4, 128, "decoder"),
    Model("qwen2.5-72b", "Qwen-2.5 72B: 64 query heads, 8 K/V heads, d128 (use --tp)", 64, 8, 128, "decoder"),
    Model("gemma2-9b", "Gemma-2 9B: 16 query heads, 8 K/V heads, d256", 16, 8, 256, "decoder", (1024, 4096, 8192)),
    Model("gpt2", "GPT-2 small: 12 heads, d64, context 1024", 12, 12, 64, "decoder", (512, 1024)),
    Model("bert-base", "BERT base: 12 heads, d64, 512 tokens, bidirectional", 12, 12, 64, "encoder", tokens=512),
    Model("vit-l16", "ViT-L/16 at 224 px: 16 heads, d64, 257 tokens", 16, 16, 64, "encoder", tokens=257),
    Model("whisper-large", "Whisper large-v3: 20 heads, d64, 1500 audio frames", 20, 20, 64, "whisper", tokens=1500),
    Model("sd15", "Stable Diffusion 1.5 UNet: 8 heads, d40/80/160, 77 text tokens", 8, 8, 40, "diffusion"),
)}


def model_shapes(name: str, *, tp: int = 1, batch_sizes: Iterable[int] | None = None,
                 seq_lens: Iterable[int] | None = None, dtype: str = "bfloat16") -> list[Shape]:
    """The attention calls of a preset model (``MODELS``); ShapeError names the presets for an unknown one."""
    model = MODELS.get(name)
    if model is None:
        raise ShapeError(f"model: unknown {_short(name)}; expected one of {', '.join(MODELS)}")
    for label, values in (("batch_sizes", batch_sizes), ("seq_lens", seq_lens)):
        if values is not None and (not values or not all(isinstance(v, int) and v >= 1 for v in values)):
            raise ShapeError(f"{label}: expected positive integers, got {_short(values)}")
    return model.shapes(tp=tp, batch_sizes=batch_sizes, seq_lens=seq_lens, dtype=dtype)


# docs/performance.md's rows, in its order: the shapes models run
_FB, _F = ("fwd", "bwd"), ("fwd",)
REALISTIC_GRID: tuple[Shape, ...] = tuple(Shape(b, hq, hkv, nq, nk, d, causal, "bfloat16", passes, name) for
                                          name, b, hq, hkv, nq, nk, d, causal, passes in (
    ("llama3-8b-train-8k", 1, 32, 8, 8192, 8192, 128, True, _FB),
    ("llama3-70b-tp8-train-4k", 2, 8, 1, 4096, 4096, 128, True, _FB),
    ("mistral-7b-train-2k", 4, 32, 8, 2048, 2048, 128, True, _FB),
    ("qwen-28h-train-4k", 1, 28, 4, 4096, 4096, 128, True, _FB),
    ("gpt2-train-512", 32, 12, 12, 512, 512, 64, True, _FB),
    ("gemma2-d256-train-4k", 1, 16, 8, 4096, 4096, 256, True, _FB),
    ("bert-base-512", 32, 12, 12, 512, 512, 64, False, _FB),
    ("vit-l16-257", 32, 16, 16, 257, 257, 64, False, _FB),
    ("whisper-enc-1500", 4, 20, 20, 1500, 1500, 64, False, _F),
    ("sd15-cross-4096x77", 2, 8, 8, 4096, 77, 40, False, _F),
    ("llama3-8b-prefill-2k", 1, 32, 8, 2048, 2048, 128, True, _F),
    ("chunked-prefill-1k-of-16k", 1, 32, 8, 1024, 16384, 128, False, _F),
    ("decode-b1-64k", 1, 32, 8, 1, 65536, 128, False, _F),
    ("decode-b32-4k", 32, 32, 8, 1, 4096, 128, False, _F),
    ("decode-b128-2k-70b", 128, 64, 8, 1, 2048, 128, False, _F),
    ("decode-mqa-d256-b16-8k", 16, 8, 1, 1, 8192, 256, False, _F),
))
