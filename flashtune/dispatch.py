"""``get_tuned_attention()``: torch SDPA's signature, flashtune's tuned kernels.

The returned callable takes ``(query, key, value, attn_mask=None, dropout_p=0.0,
is_causal=False, scale=None, enable_gqa=False)`` in SDPA's (batch, heads, seq_len,
head_dim) layout and is differentiable, so it replaces
``torch.nn.functional.scaled_dot_product_attention`` line for line.

How a call picks its configs, for each pass (fwd, bwd) on its own:

- the lookup key is the call's ``TuningKey.for_call``: (this GPU, dtype, head_dim, seq_q,
  seq_k, causal, pass, group = query heads / key heads, batch x query heads bucketed to a
  power of two);
- the table is the user's store over the table shipped with flashtune for this GPU
  (``flashtune.tables``: served where the store has no current row of a key);
- a tuned winner for exactly that key is used ("tuned exact"); else the tuned keys of the
  same family (gpu, dtype, head_dim, causal, pass) nearest in log2 space over (seq_q, seq_k,
  group, batch_heads) (``keys.key_distance``), the larger on a tie ("tuned nearest (KEY)"),
  the first of them that carries over to the call (``keys.neighbour_gap``: within a factor of
  2 in each of those, group 1 only from group 1 and grouped only from grouped, decode only from
  decode) and whose config validates for this call: a stored config that does not (say its
  shared memory exceeds this device's) is never served, and is passed over with a warning;
  with none, the heuristic default table ("heuristic", or "heuristic (nearest tuned key KEY is
  too far: WHY)" where a farther one was passed over). A row of the shipped table says so:
  "tuned exact (shipped table FILE)", "tuned nearest (KEY; shipped table FILE)";
- a stale row (tuned under other kernel sources or another triton,
  ``flashtune.provenance.staleness``) is never served: its correctness check ran on other
  code. It is passed over like a config that does not fit, the source saying so and naming
  ``flashtune revalidate``, which checks and re-times it here.

An ``attn_mask`` made by ``torch.nn.attention.bias.causal_upper_left(Nq, Nk)`` or
``causal_lower_right(Nq, Nk)`` runs the kernels' causal mask, aligned top-left or
bottom-right (queries that see no key, lower-right with Nq > Nk, get 0 as in SDPA).

``dropout_p > 0`` runs the kernels' dropout (kernels.common.Dropout: FlashAttention's, the
mask regenerated in the backward), with the same configs as without it (dropout is not a
key dimension: whether it moves the best config is not measured) and always the Triton
kernels, also where the search found an SDPA backend faster (it was timed without
dropout). The seed is drawn from torch's generator of the device per call (so
``torch.manual_seed`` repeats a run), and dropout applies whenever dropout_p > 0, in eval
too, as in SDPA.

What the kernels cannot run (any other ``attn_mask``, a ``dropout_p`` outside [0, 1), inputs that are not
4-D, dtypes other than fp16/bf16/fp32, head dims above 256, a CPU tensor without the
Triton interpreter, ...) goes to torch SDPA with one warning per reason, or raises
``ValueError`` with ``strict=True``. Differing query and key/value head counts need
``enable_gqa=True`` as in SDPA (one key/value head broadcasts, as in SDPA).

float32 inputs follow torch's fp32 matmul precision as SDPA's own fp32 matmuls do:
tf32 dots when ``torch.get_float32_matmul_precision()`` is "high" or "medium" (or
``torch.backends.cuda.matmul.fp32_precision`` is "tf32"), fp32-accurate dots otherwise
(torch's default "highest"; kernels.common.torch_fp32_precision).

The tuned table of a (database, GPU) is read once and cached for the process: calls
never touch the database, a call is one dict lookup plus the launch. Each
``get_tuned_attention()`` and each ``reload()`` re-reads it, so they see every row
committed before they were called. A missing, locked or corrupt database gives one
warning and the shipped table or the heuristic defaults; it never breaks the model. Stale
rows give one warning naming ``flashtune revalidate``.

(Over 400 lines on purpose: the drop-in, its table, its per-signature plans and its traced
form under torch.compile are one concept; the kernels, the store and the key live apart.)
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import threading
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from flashtune import recording, runners
from flashtune.recording import bucket_key
from flashtune.kernels import (
    BwdConfig,
    ConfigError,
    FlashAttentionFunction,
    FwdConfig,
    attention_forward,
    check_inputs,
    default_config,
)
from flashtune.device import resolve_device
from flashtune.kernels.common import Dropout, torch_fp32_precision
from flashtune.kernels.api import check_dropout, check_dropout_p, draw_rng
from flashtune.kernels.passes import dropout_fwd_config
from flashtune.keys import GpuInfo, TuningKey, dtype_name, key_distance, neighbour_gap
from flashtune.provenance import current_versions, staleness
from flashtune.store import ENV_VAR, NoStoreError, Store, default_path, resolve_url
from flashtune.store.engine import show_url, sqlite_path

__all__ = ["Choice", "DispatchWarning", "TunedAttention", "TunedTable", "call_key", "get_tuned_attention",
           "nearest_first"]

# How long loading the table waits for a lock (SQLite's busy timeout, PostgreSQL's
# lock_timeout) before it warns and serves the heuristic configs.
LOAD_LOCK_TIMEOUT_S = 1.0
_MAX_PLANS = 4096  # remembered call signatures per callable; forgotten all at once when full


class DispatchWarning(UserWarning):
    """What the dispatcher tells once: fallbacks, an unusable database, stale rows."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a call runs, per pass: the config (None for SDPA) and where it came from.

    ``*_source`` is "tuned exact", "tuned nearest (KEY LABEL)" (the user's store; a row of the
    shipped table adds "shipped table FILE" in the parentheses), "heuristic" (with the reason in
    parentheses when a tuned config was passed over: it does not fit the call, it is stale, or
    its key is too far to carry over, ``keys.neighbour_gap``) or "sdpa fallback: REASON".
    ``runner`` runs a call that needs no gradient (its fwd key's runner), ``train_runner``
    one that does (its bwd key's): "triton" (the configs above) or an SDPA backend that the
    search measured faster for the key (``flashtune.runners``). ``runner_source`` and
    ``train_runner_source`` say, for a key whose runners were raced, which timing chose its runner
    (GPU or eager: ``runners.choose``) and the served runner's and the kernels' two times; "" where
    nothing was raced (the heuristic, a row tuned without SDPA).
    """

    fwd_config: FwdConfig | None
    fwd_source: str
    bwd_config: BwdConfig | None
    bwd_source: str
    runner: str = "triton"
    train_runner: str = "triton"
    runner_source: str = ""
    train_runner_source: str = ""

    def __str__(self) -> str:
        def line(name, config, source):
            return f"{name}: {config.short() if config is not None else '-'}  [{source}]"

        lines = [line("fwd", self.fwd_config, self.fwd_source), line("bwd", self.bwd_config, self.bwd_source)]
        if (self.runner, self.train_runner) != ("triton", "triton"):
            lines.append(f"runs: {self.runner} without gradients, {self.train_runner} with them (the search "
                         "measured them faster than the Triton configs above)")
        for name, source in (("without gradients", self.runner_source), ("with gradients", self.train_runner_source)):
            if source:
                lines.append(f"runner {name}: {source}")
        return "\n".join(lines)

    @classmethod
    def sdpa(cls, reason: str) -> Choice:
        return cls(None, f"sdpa fallback: {reason}", None, f"sdpa fallback: {reason}")


def nearest_first(keys: Sequence[TuningKey], key: TuningKey) -> list[int]:
    """Indices of ``keys`` (one family) from the nearest to ``key`` to the farthest in log2
    space (``key_distance``); of two at the same distance, the larger point first. (Recording
    buckets calls by this order and by ``keys.neighbour_gap``, ``recording.bucket_key``: change
    them together.)"""
    return sorted(range(len(keys)), key=lambda i: (key_distance(keys[i], key), tuple(-x for x in keys[i].point)))



# -- the tuned table of one (database, GPU), shared by the process -------------------

_TICKETS = itertools.count()
_TABLES: dict[tuple[str, str], TunedTable] = {}
_TABLES_LOCK = threading.Lock()
_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def _ticket() -> int:
    """A number larger than every one handed out before (orders calls and loads)."""
    return next(_TICKETS)


def _warn_once(message: str) -> None:
    """Warn the first time ``message`` comes up in this process, pointing at the user's code."""
    with _WARNED_LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
    frame, stacklevel = sys._getframe(), 1
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(message, DispatchWarning, stacklevel=stacklevel)


@dataclasses.dataclass(frozen=True)
class Row:
    """A tuned result as the table holds it: where it came from, and why it is not served."""

    result: object  # StoredResult
    stale: str | None = None  # provenance.staleness: set, the row is never served
    shipped: str | None = None  # the shipped table's file name; None: the user's store

    def source(self, exact: bool, label: str) -> str:
        """The ``Choice`` source of a call this row serves (``label``: its key's)."""
        where = [] if exact else [label]
        if self.shipped is not None:
            where.append(f"shipped table {self.shipped}")
        return ("tuned exact" if exact else "tuned nearest") + (f" ({'; '.join(where)})" if where else "")


@dataclasses.dataclass(frozen=True)
class TunedTable:
    """The tuned winners of one GPU, by key family (``TuningKey.family``) -> (its tuned keys, their
    ``Row``): the user's store over the shipped table (``merged``). ``loaded_at`` is the ticket taken
    before the database was read; ``covered`` the ``bucket_key`` of every row that serves."""

    gpu: str
    families: dict[tuple, tuple[tuple[TuningKey, ...], tuple[Row, ...]]]
    loaded_at: int
    covered: frozenset = frozenset()

    @classmethod
    def from_results(cls, gpu: str, results, loaded_at: int, shipped=(), shipped_name: str | None = None) -> TunedTable:
        return cls.from_rows(gpu, merged(results, shipped, shipped_name), loaded_at)

    @classmethod
    def from_rows(cls, gpu: str, rows: dict, loaded_at: int) -> TunedTable:
        grouped: dict[tuple, list] = {}
        for key in sorted(rows):
            grouped.setdefault(key.family, []).append((key, rows[key]))
        families = {family: tuple(zip(*pairs, strict=True)) for family, pairs in grouped.items()}
        covered = frozenset(bucket_key(key) for key, row in rows.items() if row.stale is None)
        return cls(gpu, families, loaded_at, covered)

    def rows(self) -> list[Row]:
        return [row for _, rows in self.families.values() for row in rows]

    def candidates(self, key: TuningKey):
        """(tuned key, its Row) of ``key``'s family, nearest first (``nearest_first``)."""
        keys, rows = self.families.get(key.family, ((), ()))
        return [(keys[i], rows[i]) for i in nearest_first(keys, key)]

    def lookup(self, key: TuningKey):
        """(tuned key, its Row) nearest ``key`` in its family, or None."""
        found = self.candidates(key)
        return found[0] if found else None


def merged(results, shipped=(), shipped_name: str | None = None) -> dict:
    """Key -> ``Row``: the store's results over the shipped table's. Per key the first that exists
    of: a current store row, a current shipped row, a stale store row, a stale shipped row (a
    stale row serves nothing, but says in ``explain()`` what ``flashtune revalidate`` would bring
    back)."""
    rows: dict[TuningKey, Row] = {r.key: Row(r, staleness(r.provenance), shipped_name) for r in shipped}
    for result in results:
        row, there = Row(result, staleness(result.provenance)), rows.get(result.key)
        if there is None or row.stale is None or there.stale is not None:
            rows[result.key] = row
    return rows


def _read_results(url, gpu: str) -> list | None:
    """The GPU's stored results; on any failure to read, one warning and None."""
    where, damaged = show_url(url), []
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return []  # no store yet (a fresh install): the shipped table or the defaults serve, no warning of its own
    try:
        # create=False: never makes a database (and reads one it cannot write read-only);
        # a short lock timeout: a migration holding the tables must not stall the model
        with Store(url, create=False, lock_timeout_s=LOAD_LOCK_TIMEOUT_S) as store:
            results = list(store.load_table(gpu, damaged=damaged).values())
    except NoStoreError:
        return []  # an empty database: a store being created right now, as good as none yet
    except Exception as e:  # noqa: BLE001 - whatever the database does, the model runs
        _warn_once(f"flashtune cannot read tuned configs from {where}: {e}; using the shipped table or the "
                   "heuristic default configs")
        return None
    for problem in damaged:  # the rest of the table is served
        _warn_once(f"flashtune skips a damaged row in {where}: {problem}")
    return results


def _shipped_results(device: torch.device) -> tuple[tuple, str | None]:
    """(the results of the table shipped for the device's GPU, as its results; the file's name)."""
    from flashtune import tables

    gpu = GpuInfo.from_device(device)
    table, problems = tables.for_gpu(gpu)
    for problem in problems:
        _warn_once(f"flashtune: {problem}")
    return (table.for_device(gpu), table.name) if table is not None else ((), None)


def _load_table(url, device: torch.device, gpu: str, loaded_at: int) -> TunedTable:
    stored = _read_results(url, gpu)
    shipped, shipped_name = _shipped_results(device)
    table = TunedTable.from_results(gpu, stored or [], loaded_at, shipped, shipped_name)
    rows, where = table.rows(), show_url(url)
    sources = where if shipped_name is None else f"{where} and the shipped table {shipped_name}"
    if not rows and stored is not None:  # (an unreadable store said so already)
        _warn_once(f"flashtune has no tuned configs for {gpu} in {where} (and ships none for it); using the "
                   f"heuristic default configs (run `flashtune search --db {where}` on this GPU to tune it)")
    stale = [row for row in rows if row.stale is not None]
    if stale:
        theirs = sorted({row.stale.split(";")[0] for row in stale})
        _warn_once(f"{len(stale)} of {len(rows)} tuned configs for {gpu} ({sources}) are "
                   f"stale ({'; '.join(theirs)}; this flashtune has {current_versions()}): they are not served "
                   f"until `flashtune revalidate --db {where}` checks them again here")
    return table


def _shared_table(url, device: torch.device, since: int) -> TunedTable:
    """The process's table of (database, device's GPU), read again unless a read began
    after ticket ``since``."""
    gpu = GpuInfo.from_device(device).key
    cache_key = (url.render_as_string(hide_password=False), gpu)
    with _TABLES_LOCK:
        table = _TABLES.get(cache_key)
        if table is None or table.loaded_at < since:
            loaded_at = _ticket()
            table = _TABLES[cache_key] = _load_table(url, device, gpu, loaded_at)
        return table


# -- the callable ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How calls of one signature run: the kernels (``sm_scale`` set) or SDPA (``reason`` set)."""

    choice: Choice
    sm_scale: float | None = None
    reason: str | None = None
    causal: bool = False
    causal_align: str = "top_left"
    counter: recording.Counter | None = None  # recording: this signature's calls

    @classmethod
    def sdpa(cls, reason: str) -> _Plan:
        return cls(Choice.sdpa(reason), reason=reason)


_MASK = _Plan.sdpa("attn_mask is not supported")
_BAD_DROPOUT = _Plan.sdpa("dropout_p outside [0, 1) is not supported")


def _is_probability(dropout_p) -> bool:
    """Whether the kernels' dropout takes ``dropout_p`` (check_dropout_p)."""
    try:
        check_dropout_p(dropout_p)
    except (TypeError, ValueError):
        return False
    return True


@dataclasses.dataclass
class _Snapshot:
    """What a callable serves since its last (re)load; replaced whole by ``reload()``.

    ``plans`` maps a call signature (shapes, dtypes and devices of query, key and value,
    is_causal, scale, enable_gqa) to its plan: a call seen before is one dict lookup.
    """

    since: int
    tables: dict[torch.device, TunedTable] = dataclasses.field(default_factory=dict)
    plans: dict[tuple, _Plan] = dataclasses.field(default_factory=dict)


class TunedAttention:
    """A drop-in ``scaled_dot_product_attention`` that runs flashtune's tuned kernels.

    Made by ``get_tuned_attention()``; see the module docstring for the rules.
    """

    def __init__(self, db=None, *, device=None, strict: bool = False, record: bool | None = None) -> None:
        default_location = db is None and not os.environ.get(ENV_VAR)
        if db is None:  # the store's default, without creating its directory
            db = os.environ.get(ENV_VAR) or default_path()
        self.url = resolve_url(db)
        self.device = resolve_device(device)
        self.strict = strict
        if record is None:
            record = os.environ.get(recording.ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")
        # the first write makes the store (at the default location, its directory too)
        self._recorder = recording.Recorder(self.url, make_directory=default_location) if record else None
        self.reload()

    def flush_recorded(self) -> None:
        """Write the recorded call signatures and their call counts now (also done at exit)."""
        if self._recorder is not None:
            self._recorder.flush()

    def __repr__(self) -> str:
        return f"TunedAttention(db={show_url(self.url)!r}, device={str(self.device)!r}, strict={self.strict})"

    def reload(self) -> None:
        """Read the tuned table again: rows committed before this call are served."""
        snapshot = _Snapshot(_ticket())
        snapshot.tables[self.device] = _shared_table(self.url, self.device, snapshot.since)
        self._snapshot = snapshot

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        is_causal = bool(is_causal)
        if torch.compiler.is_compiling():
            return self._traced_call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        plan = self._plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if plan.counter is not None:
            plan.counter.calls += 1
        if plan.reason is not None:
            if self.strict:
                raise ValueError(f"flashtune cannot run this attention call (strict=True): {plan.reason}")
            _warn_once(f"flashtune runs torch's scaled_dot_product_attention instead: {plan.reason}")
            extra = {"enable_gqa": True} if enable_gqa else {}  # torch < 2.5 lacks the argument
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, **extra)
        needs_grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
        runner = plan.choice.train_runner if needs_grad else plan.choice.runner
        dropout = Dropout(float(dropout_p), draw_rng(query.device)) if dropout_p else None
        # an SDPA backend the search measured faster for this key (timed without dropout: dropout runs the kernels)
        if runner != "triton" and dropout is None:
            try:
                return runners.sdpa(runner, query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                    enable_gqa=enable_gqa)
            except RuntimeError as e:  # the backend cannot run this call after all: the kernels do, from now on
                _warn_once(f"flashtune's tuned runner {runner} cannot run a call it was chosen for "
                           f"({str(e).splitlines()[0]}); running the Triton kernels instead")
                mode = "train_runner" if needs_grad else "runner"  # the cached plan of this signature, not a copy
                object.__setattr__(plan, "choice", dataclasses.replace(plan.choice, **{
                    mode: "triton", f"{mode}_source": f"triton: the tuned runner {runner} cannot run this call"}))
        fwd, bwd = plan.choice.fwd_config, plan.choice.bwd_config
        if dropout is not None:  # the tuned config's DROPOUT kernel, where it fits (else the default's)
            fwd = dropout_fwd_config(fwd, query.shape[3], query.dtype, query.device, plan.causal)
        precision = torch_fp32_precision(query.dtype)
        if needs_grad:
            return FlashAttentionFunction.apply(query, key, value, plan.causal, plan.sm_scale, fwd, bwd, precision,
                                                plan.causal_align, 0.0, None, None, dropout)[0]
        # nothing to differentiate: the launcher alone, without autograd's cost per call
        return attention_forward(query, key, value, fwd, causal=plan.causal, sm_scale=plan.sm_scale,
                                 fp32_precision=precision, causal_align=plan.causal_align, dropout=dropout)[0]

    def _traced_call(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        """The call as torch.compile traces it: one flashtune operator whose configs are looked up in
        this store's table inside it, on the real shapes (kernels/ops.py), so dynamic shapes trace once;
        SDPA, traced as such, for what the kernels cannot run (without the eager path's warning)."""
        from flashtune.kernels.ops import compiled_attention, table_token

        align = "top_left"
        if attn_mask is not None:
            align = _causal_bias_align(attn_mask, query, key, is_causal)
        sdpa = align is None or not _is_probability(dropout_p)
        if not sdpa:
            try:
                sm_scale = check_inputs(query, key, value, causal=is_causal, sm_scale=scale)
            except (TypeError, ValueError):
                sdpa = True
        if sdpa:
            extra = {"enable_gqa": True} if enable_gqa else {}
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, **extra)
        if not enable_gqa and key.shape[1] not in (1, query.shape[1]):
            raise RuntimeError(f"query has {query.shape[1]} heads and key/value {key.shape[1]}: pass "
                               "enable_gqa=True for grouped-query attention (as torch SDPA requires)")
        return compiled_attention(query, key, value, causal=is_causal or attn_mask is not None, sm_scale=sm_scale,
                                  fwd_config=None, bwd_config=None, fp32_precision="", causal_align=align,
                                  table=table_token(self), dropout=check_dropout(dropout_p, None, query.device))[0]

    def explain(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False) -> Choice:
        """The configs this call would run and why. Runs nothing."""
        plan = self._plan(query, key, value, attn_mask, dropout_p, bool(is_causal), scale, enable_gqa)
        if dropout_p and plan.reason is None:  # dropout runs the kernels, whatever runner the key has
            fwd = dropout_fwd_config(plan.choice.fwd_config, query.shape[3], query.dtype, query.device, plan.causal)
            source = plan.choice.fwd_source if fwd == plan.choice.fwd_config else \
                "heuristic (the fwd config does not fit with dropout's mask)"
            kernels = "triton: dropout runs the kernels, whatever runner the key has"
            return dataclasses.replace(plan.choice, fwd_config=fwd, fwd_source=source, runner="triton",
                                       train_runner="triton",
                                       runner_source=kernels if plan.choice.runner_source else "",
                                       train_runner_source=kernels if plan.choice.train_runner_source else "")
        return plan.choice

    def _plan(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> _Plan:
        """The plan of this call: remembered by signature, made on first sight."""
        align = "top_left"
        if attn_mask is not None:
            align = _causal_bias_align(attn_mask, query, key, is_causal)
            if align is None:
                return _MASK
            is_causal = True
        if dropout_p and not _is_probability(dropout_p):
            return _BAD_DROPOUT
        snapshot, signature = self._snapshot, None
        if isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor):
            signature = (query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype,
                         query.device, key.device, value.device, is_causal, align, scale, enable_gqa)
            try:
                plan = snapshot.plans.get(signature)
            except TypeError:  # an unhashable scale, which check_inputs refuses below
                plan = signature = None
            if plan is not None:
                return plan
        plan = self._new_plan(snapshot, query, key, value, is_causal, scale, enable_gqa, align)
        if self._recorder is not None and plan.reason is None:
            plan = self._note(plan, query, key)
        if signature is not None:
            if len(snapshot.plans) >= _MAX_PLANS:
                snapshot.plans.clear()
            snapshot.plans[signature] = plan
        return plan

    def _note(self, plan: _Plan, query, key) -> _Plan:
        """Recording: the plan with its signature's counter; the passes whose ``bucket_key`` no
        served row covers are noted under it (the backward only for a call that needs gradients),
        so every call of a bucket adds to one count."""
        passes = [("fwd", plan.choice.fwd_source)]
        if query.requires_grad or key.requires_grad:
            passes.append(("bwd", plan.choice.bwd_source))
        gpu = GpuInfo.from_device(query.device)
        table = self._snapshot.tables.get(query.device)
        covered = table.covered if table is not None else frozenset()
        keys = [bucket_key(call_key(gpu.key, pass_, query, key, plan.causal)) for pass_, source in passes
                if not source.startswith("tuned exact")]
        keys = [k for k in keys if k not in covered]
        if not keys:
            return plan
        counter = self._recorder.note(gpu, keys, query.shape[0], query.shape[1], key.shape[1])
        return dataclasses.replace(plan, counter=counter)

    def _new_plan(self, snapshot: _Snapshot, query, key, value, is_causal, scale, enable_gqa,
                  align: str = "top_left") -> _Plan:
        """Check the inputs and pick both passes' configs.

        Raises RuntimeError, as SDPA does, for differing head counts without enable_gqa.
        """
        try:
            sm_scale = check_inputs(query, key, value, causal=is_causal, sm_scale=scale)
        except (TypeError, ValueError) as e:
            return _Plan.sdpa(str(e))
        if not enable_gqa and key.shape[1] not in (1, query.shape[1]):
            raise RuntimeError(f"query has {query.shape[1]} heads and key/value {key.shape[1]}: pass "
                               "enable_gqa=True for grouped-query attention (as torch SDPA requires)")
        device = query.device
        table = snapshot.tables.get(device)
        if table is None:
            table = snapshot.tables[device] = _shared_table(self.url, device, snapshot.since)
        (fwd, fwd_source, runner, runner_source), (bwd, bwd_source, train_runner, train_source) = (
            _pick(table, pass_, query, key, is_causal) for pass_ in ("fwd", "bwd"))
        return _Plan(Choice(fwd, fwd_source, bwd, bwd_source, runner, train_runner, runner_source, train_source),
                     sm_scale=sm_scale, causal=is_causal, causal_align=align)


def call_key(gpu: str, pass_: str, query: torch.Tensor, key: torch.Tensor, causal: bool) -> TuningKey:
    """The tuning key of a call's pass (q and k in SDPA's layout)."""
    batch, heads_q, seq_q, head_dim = query.shape
    return TuningKey.for_call(gpu, dtype_name(query.dtype), batch=batch, heads_q=heads_q, heads_kv=key.shape[1],
                              seq_q=seq_q, seq_k=key.shape[2], head_dim=head_dim, causal=causal, pass_=pass_)


def _pick(table: TunedTable, pass_: str, query: torch.Tensor, key: torch.Tensor, causal: bool):
    """(config, source, runner, runner source) of one pass: the nearest tuned config that carries
    over to the call (``keys.neighbour_gap``), is current and validates for it, the runner tuned
    with it ("triton" for the heuristic) and what chose that runner (``_runner_source``)."""
    wanted = call_key(table.gpu, pass_, query, key, causal)
    head_dim, dtype, device = query.shape[3], query.dtype, query.device
    passed_over = None  # why the nearest tuned config does not serve, for the source
    too_far = None  # the nearest tuned key beyond the rule, and why
    for tuned, row in table.candidates(wanted):
        gap = neighbour_gap(tuned, wanted)
        if gap is not None:  # passed over whatever its row is: it would not serve even if current and fitting
            if too_far is None:
                which = "nearest" if passed_over is None else "next nearest"
                too_far = f"{which} tuned key {tuned.label()} is too far: {gap}"
            continue
        result = row.result
        if row.stale is not None:
            passed_over = passed_over or (f"the tuned {pass_} config of {tuned.label()} is stale, {row.stale}: "
                                          "`flashtune revalidate` checks it again")
            continue
        try:
            result.config.validate(head_dim, dtype, device)
        except ConfigError as e:
            passed_over = passed_over or f"the tuned {pass_} config of {tuned.label()} does not fit here: {e}"
            _warn_once(f"flashtune skips a stored config for {table.gpu} {tuned.label()}: {e}")
            continue
        source = row.source(tuned == wanted, tuned.label())
        if passed_over is not None and passed_over.startswith(f"the tuned {pass_} config of {wanted.label()} is "):
            source += f"; {passed_over}"  # its own key's row is stale: say what would bring it back
        return result.config, source, result.runner, _runner_source(result)
    return (default_config(pass_, head_dim, dtype, device, causal=causal, seq_q=wanted.seq_q, seq_k=wanted.seq_k,
                           batch_heads_kv=query.shape[0] * key.shape[1], batch_heads=query.shape[0] * query.shape[1]),
            _heuristic_source(passed_over, too_far), "triton", "")


def _heuristic_source(*reasons: str | None) -> str:
    """"heuristic", with why each tuned key in the way did not serve."""
    given = [r for r in reasons if r is not None]
    return f"heuristic ({'; '.join(given)})" if given else "heuristic"


def _runner_source(result) -> str:
    """A raced row's runner, which timing chose it, and its GPU / eager ms beside the kernels'
    ("" where nothing was raced)."""
    times = result.runner_times
    if not times:
        return ""

    def both(name: str) -> str:
        t = times[name]
        eager = "-" if t.eager_ms is None else f"{t.eager_ms:.4g}"
        return f"{name} {t.gpu_ms:.4g} / {eager}"

    # beside the served runner: the kernels, or where they serve the fastest other runner by GPU time
    others = [name for name in sorted(times, key=lambda n: times[n].gpu_ms) if name != result.runner]
    other = "triton" if result.runner != "triton" and "triton" in times else next(iter(others), None)
    shown = [result.runner] + ([other] if other is not None and other in times else [])
    return (f"{result.runner}, chosen {runners.describe_choice(times, result.chosen_by)}; GPU / eager ms: "
            + ", ".join(both(name) for name in shown))


def _causal_bias_align(attn_mask, query, key, is_causal: bool) -> str | None:
    """"top_left" or "bottom_right" for a torch.nn.attention.bias causal_upper_left /
    causal_lower_right mask that matches the call's lengths; None for any other mask
    (SDPA runs it, and tells what is wrong with it)."""
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # torch without the causal biases
        return None
    if is_causal or not isinstance(attn_mask, CausalBias) or not isinstance(query, torch.Tensor) \
            or not isinstance(key, torch.Tensor) or query.dim() != 4 or key.dim() != 4:
        return None
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (query.shape[2], key.shape[2]):
        return None
    return {CausalVariant.UPPER_LEFT: "top_left", CausalVariant.LOWER_RIGHT: "bottom_right"}.get(attn_mask.variant)


def get_tuned_attention(db=None, *, device=None, strict: bool = False, record: bool | None = None) -> TunedAttention:
    """A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` that runs
    flashtune's kernels with the configs tuned for this GPU.

    ``db``: the store (a SQLAlchemy URL or a SQLite path; None: ``FLASHTUNE_DB`` or the
    user data dir's store). ``device``: whose table to read now (default: the current
    CUDA device, else the CPU under the Triton interpreter); tensors on another device
    get their GPU's table on first use. ``strict``: raise ``ValueError`` instead of
    falling back to torch SDPA for what the kernels cannot run.

    The table is read here (once per process, database and GPU: a later call reads it
    again to see new rows) and never during calls. An unusable database warns once and
    serves the heuristic defaults; only a ``db`` that is no database URL or path raises
    (``StoreError``). ``fn.explain(q, k, v, is_causal=...)`` says which configs a call
    would use and why; ``fn.reload()`` re-reads the table. ``record`` (default: the
    ``FLASHTUNE_RECORD`` environment variable): note the calls without a tuned key of their
    own in the store, for ``flashtune search --recorded`` (``flashtune.recording``).
    """
    return TunedAttention(db, device=device, strict=strict, record=record)
