"""Tuned tables as files: export from one store, import into another.

An export file is UTF-8 JSON, data only (nothing in it is ever executed or unpickled)::

    {
      "format": "flashtune-tuned-table",
      "format_version": 3,
      "flashtune_version": "0.1.0",            # the exporting flashtune
      "exported_at": "2026-11-30T12:00:00Z",
      "tables": [                              # one per GPU; a file may hold several
        {
          "gpu": {"key": "NVIDIA H200@sm90", "name": "NVIDIA H200", "capability": [9, 0],
                  "sm_count": 132, "total_memory": 150754820096},
          "entries": [
            {"dtype": "bfloat16", "head_dim": 64, "seq_q": 1024, "seq_k": 1024, "group": 1,
             "batch_heads": 512, "causal": true, "pass": "fwd", "runner": "sdpa-cudnn", "chosen_by": "gpu",
             "runner_times": {"triton": {"gpu_ms": 0.123, "eager_ms": 0.131},
                              "sdpa-cudnn": {"gpu_ms": 0.118, "eager_ms": 0.125}},
             "config": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
             "time_ms": 0.123, "tflops": 456.7, "default_time_ms": 0.15, "error": 0.31, "n_trials": 32,
             "provenance": {"flashtune_version": "0.1.0", "kernel_hash": "...", "triton_version": "3.6.0",
                            "torch_version": "2.11.0", "cuda_version": "13.0", "driver_version": "..."}}
          ]
        }
      ],
      "sha256": "..."                          # of the canonical JSON of "tables"
    }

An entry's key is ``TuningKey.as_dict()`` without the GPU. ``runner_times`` holds each raced
runner's GPU and eager time (``flashtune.runners.RunnerTime``; null: nothing but the kernels was
timed) and ``chosen_by`` which of them chose ``runner`` (``runners.CHOSEN_BY``). Version 2 files
(written before runners had both times) hold one time per runner and no ``chosen_by``: they
import, each time a GPU time, the eager time unknown. Version 1 files (written before the key had
seq_k, group and batch_heads) name one ``seq_len`` and no runner; they still import, as keys of
the standard grid they were tuned on (``TuningKey.from_dict``).

An entry's provenance is its table's GPU (name, compute capability, SM count) plus the
versions it was tuned under. The checksum covers every entry and its GPU: sha256 of
``json.dumps(tables, sort_keys=True, separators=(",", ":"), ensure_ascii=True)``.

Importing reads at most ``MAX_BYTES``, parses with the standard JSON parser (duplicate
names and NaN/Infinity rejected), validates the whole document with pydantic (strict
types, finite numbers, known dtypes and passes, configs valid for their pass, no
tuning key twice), verifies the checksum, and only then writes, in one transaction
(``Store.import_results``). Entries tuned under other kernel sources or another triton
import as they are, stale: the dispatcher serves them once ``flashtune revalidate`` has
checked them on this installation, so no tuning is lost by an upgrade.
Every rejection is an ``ExchangeError`` whose message names the place in the file.
(One module, about 400 lines: the file format's writer and its validating reader belong together.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from flashtune._version import __version__
from flashtune.keys import DTYPES, PASSES, GpuInfo, TuningKey
from flashtune.provenance import Provenance, is_current
from flashtune.runners import CHOSEN_BY, RUNNERS, TRITON, RunnerTime, times_as_dicts
from flashtune.store.records import ImportSummary, StoredResult

__all__ = [
    "FORMAT", "FORMAT_VERSION", "MAX_BYTES", "ExchangeError", "ExportFile", "checksum",
    "dump_export", "entry_dict", "export_document", "gpu_dict", "import_export", "parse_export",
    "read_export", "write_export",
]

FORMAT = "flashtune-tuned-table"
# 1: the key's length was one seq_len (a grid key); 2: one time per runner (a GPU time). Both read.
FORMAT_VERSION = 3
MAX_BYTES = 16 * 1024 * 1024
VERSION_FIELDS = ("flashtune_version", "kernel_hash", "triton_version", "torch_version", "cuda_version",
                  "driver_version")


class ExchangeError(ValueError):
    """An export file that cannot be imported (or written); the message says where and why."""


# -- the file's schema ------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


# Text shows up in tables and messages: no control characters (a newline would break a line).
_PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f]*$"  # zero-width and bidi characters: StoredResult.check
_Version = Annotated[str, Field(max_length=64, pattern=_PRINTABLE)]
_Count = Annotated[int, Field(ge=0, le=2**62)]
_Size = Annotated[int, Field(ge=1, le=2**31 - 1)]


class _Gpu(_Strict):
    key: Annotated[str, Field(min_length=1, max_length=255, pattern=_PRINTABLE)]
    name: Annotated[str, Field(min_length=1, max_length=200, pattern=_PRINTABLE)]
    capability: Annotated[list[Annotated[int, Field(ge=0, le=1000)]], Field(min_length=2, max_length=2)]
    sm_count: Annotated[int, Field(ge=0, le=2**31 - 1)]
    total_memory: _Count

    @model_validator(mode="after")
    def _key_matches(self):
        expected = self.info().key
        if self.key != expected:
            raise ValueError(f"key {self.key!r} does not match name and capability ({expected!r})")
        return self

    def info(self) -> GpuInfo:
        return GpuInfo(self.name, (self.capability[0], self.capability[1]), self.sm_count, self.total_memory)


class _Versions(_Strict):
    flashtune_version: _Version
    kernel_hash: _Version
    triton_version: _Version
    torch_version: _Version
    cuda_version: _Version
    driver_version: _Version


class _Entry(_Strict):
    dtype: Literal[DTYPES]  # type: ignore[valid-type]
    head_dim: Annotated[int, Field(ge=1, le=1024)]
    causal: bool
    pass_: Literal[PASSES] = Field(alias="pass")  # type: ignore[valid-type]
    config: dict[str, int]
    time_ms: Annotated[float, Field(gt=0)]
    tflops: Annotated[float, Field(ge=0)]
    default_time_ms: Annotated[float, Field(gt=0)] | None
    error: Annotated[float, Field(ge=0)]
    n_trials: _Count
    provenance: _Versions

    @model_validator(mode="after")
    def _config_valid(self):
        # ConfigError is a ValueError: pydantic reports it at this entry
        self.parsed_config()
        return self

    def parsed_config(self):
        from flashtune.configs.base import config_class

        return config_class(self.pass_).from_dict(self.config)

    def result(self, gpu: _Gpu) -> StoredResult:
        info = gpu.info()
        key = TuningKey.from_dict(self.model_dump(by_alias=True), gpu=info.key)
        provenance = Provenance(**self.provenance.model_dump(), gpu_name=info.name,
                                capability=f"{info.capability[0]}.{info.capability[1]}", sm_count=info.sm_count)
        return StoredResult(key=key, config=self.parsed_config(), time_ms=self.time_ms,
                            tflops=self.tflops, default_time_ms=self.default_time_ms, error=self.error,
                            n_trials=self.n_trials, gpu=info, provenance=provenance,
                            runner=getattr(self, "runner", TRITON), runner_times=self.runner_times_read(),
                            chosen_by=getattr(self, "chosen_by", None))

    def runner_times_read(self):
        """The entry's runner times as StoredResult takes them (RunnerTime objects, or numbers)."""
        times = getattr(self, "runner_times", None)
        if times is None:
            return None
        return {name: RunnerTime(t.gpu_ms, t.eager_ms) if isinstance(t, _RunnerTime) else t
                for name, t in times.items()}


class _EntryV1(_Entry):
    seq_len: _Size


class _EntryV2(_Entry):
    seq_q: _Size
    seq_k: _Size
    group: _Size
    batch_heads: _Size
    runner: Literal[RUNNERS]  # type: ignore[valid-type]
    runner_times: dict[Literal[RUNNERS], Annotated[float, Field(gt=0)]] | None  # type: ignore[valid-type]


class _RunnerTime(_Strict):
    gpu_ms: Annotated[float, Field(gt=0)]
    eager_ms: Annotated[float, Field(gt=0)] | None


class _EntryV3(_EntryV2):
    runner_times: dict[Literal[RUNNERS], _RunnerTime] | None  # type: ignore[valid-type]
    chosen_by: Literal[CHOSEN_BY] | None  # type: ignore[valid-type]


class _TableV1(_Strict):
    gpu: _Gpu
    entries: list[_EntryV1]


class _TableV2(_Strict):
    gpu: _Gpu
    entries: list[_EntryV2]


class _TableV3(_Strict):
    gpu: _Gpu
    entries: list[_EntryV3]


class _Document(_Strict):
    format: Literal[FORMAT]  # type: ignore[valid-type]
    format_version: Literal[FORMAT_VERSION]  # type: ignore[valid-type]
    flashtune_version: _Version
    exported_at: _Version
    tables: list[_TableV3]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class _DocumentV1(_Document):
    format_version: Literal[1]
    tables: list[_TableV1]


class _DocumentV2(_Document):
    format_version: Literal[2]
    tables: list[_TableV2]


_DOCUMENTS: dict[int, type[_Document]] = {1: _DocumentV1, 2: _DocumentV2, FORMAT_VERSION: _Document}


# -- what a file holds --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ExportFile:
    """A validated export file: its results, and who wrote it when."""

    flashtune_version: str
    exported_at: str
    results: tuple[StoredResult, ...]

    @property
    def gpus(self) -> list[str]:
        """The GPU keys of the file's tables, in file order."""
        return list(dict.fromkeys(r.key.gpu for r in self.results))

    def kernel_hashes(self) -> Counter:
        return Counter(r.provenance.kernel_hash for r in self.results)

    def triton_versions(self) -> Counter:
        return Counter(r.provenance.triton_version for r in self.results)

    def stale(self) -> list[StoredResult]:
        """The results tuned under other kernel sources or another triton than this installation's."""
        return [r for r in self.results if not is_current(r.provenance)]


# -- export -------------------------------------------------------------------------------

def entry_dict(result: StoredResult) -> dict[str, Any]:
    """One result as an export entry (its GPU is its table's)."""
    return {
        **result.key.as_dict(gpu=False), "config": result.config.to_dict(), "time_ms": result.time_ms,
        "tflops": result.tflops,
        "default_time_ms": result.default_time_ms, "error": result.error, "n_trials": result.n_trials,
        "runner": result.runner, "chosen_by": result.chosen_by, "runner_times": times_as_dicts(result.runner_times),
        "provenance": {name: getattr(result.provenance, name) for name in VERSION_FIELDS},
    }


def gpu_dict(gpu: GpuInfo) -> dict[str, Any]:
    return {"key": gpu.key, "name": gpu.name, "capability": list(gpu.capability), "sm_count": gpu.sm_count,
            "total_memory": gpu.total_memory}


def checksum(tables: Any) -> str:
    """sha256 of the canonical JSON of ``tables`` (sorted keys, no spaces, ASCII)."""
    try:
        canonical = json.dumps(tables, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ExchangeError(f"cannot checksum the tables: {e}") from e
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def export_document(results: Iterable[StoredResult], *, exported_at: datetime | None = None) -> dict[str, Any]:
    """The export document of ``results``: one table per GPU, in the order given."""
    tables: dict[str, dict[str, Any]] = {}
    for result in results:
        table = tables.setdefault(result.gpu.key, {"gpu": gpu_dict(result.gpu), "entries": []})
        table["entries"].append(entry_dict(result))
    body = list(tables.values())
    moment = (exported_at or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "flashtune_version": __version__,
        "exported_at": moment.strftime("%Y-%m-%dT%H:%M:%SZ"), "tables": body, "sha256": checksum(body),
    }


def dump_export(results: Iterable[StoredResult], *, exported_at: datetime | None = None) -> bytes:
    """The bytes of an export file holding ``results``: one line per entry, so files diff well."""
    document = export_document(results, exported_at=exported_at)

    def one_line(value: Any) -> str:
        return json.dumps(value, allow_nan=False)

    lines = ["{"]
    lines += [f" {one_line(name)}: {one_line(value)}," for name, value in document.items()
              if name not in ("tables", "sha256")]
    lines.append(' "tables": [')
    for t, table in enumerate(document["tables"]):
        lines.append(f'  {{"gpu": {one_line(table["gpu"])}, "entries": [')
        lines += [f"   {one_line(entry)}," for entry in table["entries"]]
        if table["entries"]:
            lines[-1] = lines[-1].rstrip(",")
        lines.append("  ]}" + ("," if t < len(document["tables"]) - 1 else ""))
    lines += [" ],", f' "sha256": {one_line(document["sha256"])}', "}", ""]
    return "\n".join(lines).encode("utf-8")


def write_export(path: str | os.PathLike, results: Iterable[StoredResult]) -> int:
    """Write an export file atomically (a temporary file renamed into place); return the entry count."""
    results = list(results)
    data = dump_export(results)
    if len(data) > MAX_BYTES:
        raise ExchangeError(f"the export would be {len(data)} bytes, over the {MAX_BYTES}-byte limit of an "
                            "import: export fewer results (use the filters)")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        raise ExchangeError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return len(results)


# -- import -------------------------------------------------------------------------------

def read_export(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES) -> ExportFile:
    """Read and validate an export file; the size is checked before anything is parsed."""
    path = Path(path)
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise ExchangeError(f"{path} is a directory, not an export file")
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read forever, /dev/zero never end
            raise ExchangeError(f"{path} is not a regular file (a pipe, a device or a socket): save the export to a "
                                "file and import that")
        size = info.st_size
        if size > max_bytes:
            raise ExchangeError(_too_big(size, max_bytes))
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)  # the file may have grown since stat()
    except OSError as e:
        raise ExchangeError(f"cannot read {path}: {e.strerror or e}") from e
    return parse_export(data, max_bytes=max_bytes)


def parse_export(data: bytes, *, max_bytes: int = MAX_BYTES) -> ExportFile:
    """Validate the bytes of an export file; raise ``ExchangeError`` naming the first problem."""
    if len(data) > max_bytes:
        raise ExchangeError(_too_big(len(data), max_bytes))
    document = _load_json(data)
    _check_header(document)
    try:
        version = document.get("format_version")
        parsed = _DOCUMENTS.get(version if isinstance(version, int) else None, _Document).model_validate(document)
    except ValidationError as e:
        raise ExchangeError(_describe(e)) from None
    if checksum(document["tables"]) != parsed.sha256:
        raise ExchangeError("the sha256 checksum does not match the tables: the file was changed or damaged "
                            "after export; export it again")
    results = _results(parsed)
    return ExportFile(parsed.flashtune_version, parsed.exported_at, tuple(results))


def import_export(store, export: ExportFile, *, on_conflict: str = "keep_faster",
                  dry_run: bool = False) -> ImportSummary:
    """Write a validated file's results in one transaction (or, with ``dry_run``, say what would
    be written). Results tuned under other kernel sources or another triton are imported as they
    are: stale (``ExportFile.stale``), served once ``flashtune revalidate`` has checked them here;
    under ``keep_faster`` none replaces a current row."""
    return store.import_results(export.results, on_conflict=on_conflict, dry_run=dry_run)


# -- helpers ------------------------------------------------------------------------------

def _too_big(size: int, limit: int) -> str:
    return f"the file is {size} bytes, over the {limit}-byte limit of an export file; is it an export?"


def _reject_constant(name: str):
    raise ExchangeError(f"the file holds {name}, which is not a finite number")


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for name, value in pairs:
        if name in seen:
            raise ExchangeError(f"the file names {name!r} twice in one object")
        seen[name] = value
    return seen


def _load_json(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ExchangeError(f"the file is not UTF-8 text (byte {e.start}): is it an export?") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_names, parse_constant=_reject_constant)
    except ExchangeError:
        raise
    except json.JSONDecodeError as e:
        raise ExchangeError(f"the file is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                            "was it truncated?") from None
    except (ValueError, RecursionError) as e:  # nesting too deep, integers too long
        raise ExchangeError(f"the file cannot be read as JSON: {type(e).__name__}: {e}") from None


def _check_header(document: Any) -> None:
    """The format fields first, so a file of another kind or version says so plainly."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ExchangeError(f"not a flashtune export file (expected \"format\": \"{FORMAT}\")")
    version = document.get("format_version")
    if isinstance(version, (bool, float)):  # pydantic's Literal takes true and 1.0 for 1
        raise ExchangeError(f"format_version: expected the integer {FORMAT_VERSION}, got {json.dumps(version)}")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise ExchangeError(f"the file has format version {version}, this flashtune reads version "
                            f"{FORMAT_VERSION}: it was written by a newer flashtune; upgrade flashtune")


def _describe(error: ValidationError) -> str:
    problems = error.errors(include_url=False)
    first = problems[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" if str(part).isidentifier()
                    else f"[{str(part)!r}]" for part in first["loc"]).lstrip(".")
    message = _shorten_numbers(first["msg"].removeprefix("Value error, "))
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    value = first.get("input")
    shown = "" if isinstance(value, (dict, list)) else f", got {_short(value)}"
    return f"{where or 'the file'}: {message}{shown}{more}"


def _short(value: Any) -> str:
    from flashtune.store.records import short_value

    return short_value(value)


def _shorten_numbers(text: str) -> str:
    """A message quoting a 4001-digit number quotes its first digits and its length."""
    return re.sub(r"\d{40,}", lambda m: f"{m[0][:12]}... ({len(m[0])} digits)", text)


def _results(document: _Document) -> list[StoredResult]:
    """The file's results; a GPU or a tuning key that appears twice is an error."""
    results: list[StoredResult] = []
    tables: dict[str, int] = {}
    seen: dict[TuningKey, str] = {}
    for t, table in enumerate(document.tables):
        if table.gpu.key in tables:
            raise ExchangeError(f"tables[{t}]: GPU {table.gpu.key!r} already has tables[{tables[table.gpu.key]}]")
        tables[table.gpu.key] = t
        for e, entry in enumerate(table.entries):
            where = f"tables[{t}].entries[{e}]"
            try:
                result = entry.result(table.gpu)
            except ValueError as error:  # a key the file's types allow but TuningKey does not (batch_heads 3)
                raise ExchangeError(_shorten_numbers(f"{where}: {error}")) from None
            if result.key in seen:
                raise ExchangeError(f"{where}: {result.key.label()} on {result.key.gpu} is also {seen[result.key]}")
            seen[result.key] = where
            try:
                result.check()  # what the store will require, so a bad file fails before the transaction
            except ValueError as error:
                raise ExchangeError(_shorten_numbers(f"{where}: {error}")) from None
            results.append(result)
    return results

