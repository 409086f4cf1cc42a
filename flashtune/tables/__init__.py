"""Tuned tables shipped inside the package: one export file per GPU, served where nothing is tuned.

Each ``*.json`` file in this directory is an export file (``flashtune.store.exchange``'s
format) holding the table of one GPU, tuned on that GPU with ``flashtune search`` and
written here by ``flashtune export --for-package -o flashtune/tables/``. The dispatcher
looks a call up in the user's store first, then in the shipped table of the call's GPU,
then falls back to the heuristic defaults (``flashtune.dispatch``); a row of either table
that is stale (``flashtune.provenance.staleness``) is never served unchecked.

Which GPU a table serves (``gpu_matches``): the device's name, normalised (``normalised_name``:
case and spacing, a leading "NVIDIA"), its compute capability and its SM count must all
equal the table's GPU. The name tells an H100 SXM ("NVIDIA H100 80GB HBM3") from an H100
PCIe or NVL, and an H200 SXM ("NVIDIA H200") from an H200 NVL; the SM count tells a MIG
slice, or a part with SMs fused off, from the whole GPU of the same name. Nothing looser
is served: a table tuned on another model of the same architecture can pick configs that
are slow on this one.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from flashtune.keys import GpuInfo

__all__ = ["TABLES_DIR", "ShippedTable", "file_name", "for_gpu", "gpu_matches", "normalised_name", "shipped_tables"]

TABLES_DIR = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class ShippedTable:
    """One shipped file: its path, the GPU it was tuned on, and its results (keys of that GPU)."""

    path: Path
    gpu: GpuInfo
    results: tuple

    @property
    def name(self) -> str:
        return self.path.name

    def for_device(self, gpu: GpuInfo) -> tuple:
        """The results as results of ``gpu`` (a device it matches): its GPU key in each key."""
        return tuple(dataclasses.replace(r, key=dataclasses.replace(r.key, gpu=gpu.key), gpu=gpu)
                     for r in self.results)


def normalised_name(name: str) -> str:
    """A device name as tables compare it: lower case, single spaces, no leading "NVIDIA"."""
    words = name.casefold().split()
    if words[:1] == ["nvidia"]:
        words = words[1:]
    return " ".join(words)


def gpu_matches(table_gpu: GpuInfo, gpu: GpuInfo) -> bool:
    """Whether a table tuned on ``table_gpu`` serves ``gpu``: the same normalised name, compute
    capability and SM count (the module says why nothing looser)."""
    return (normalised_name(table_gpu.name) == normalised_name(gpu.name)
            and tuple(table_gpu.capability) == tuple(gpu.capability) and table_gpu.sm_count == gpu.sm_count)


def file_name(gpu: GpuInfo) -> str:
    """The file a GPU's shipped table has: ``h100-80gb-hbm3-sm90-132sm.json``."""
    slug = re.sub(r"[^a-z0-9]+", "-", normalised_name(gpu.name)).strip("-") or "gpu"
    return f"{slug}-sm{gpu.capability[0]}{gpu.capability[1]}-{gpu.sm_count}sm.json"


_PARSED: dict[tuple, ShippedTable] = {}


def shipped_tables(directory: Path | None = None) -> tuple[list[ShippedTable], list[str]]:
    """(the tables in ``directory``, default this package's; a problem per file that cannot be read).

    A file that is not a valid one-GPU export is left out and named in the problems: a damaged
    installation serves the heuristic defaults for that GPU, it does not break the model."""
    from flashtune.store.exchange import ExchangeError, read_export

    directory = TABLES_DIR if directory is None else directory
    tables, problems = [], []
    for path in sorted(directory.glob("*.json")):
        try:
            stat = path.stat()
            ident = (str(path), stat.st_mtime_ns, stat.st_size)
            table = _PARSED.get(ident)
            if table is None:
                export = read_export(path)
                gpus = export.gpus
                if len(gpus) != 1:
                    raise ExchangeError(f"holds the tables of {len(gpus)} GPUs; a shipped file holds one")
                table = _PARSED[ident] = ShippedTable(path, export.results[0].gpu, export.results)
        except (OSError, ExchangeError) as e:
            problems.append(f"the shipped table {path.name} cannot be read: {e}")
            continue
        tables.append(table)
    return tables, problems


def for_gpu(gpu: GpuInfo, directory: Path | None = None) -> tuple[ShippedTable | None, list[str]]:
    """(the shipped table that serves ``gpu``, or None; the problems met on the way).

    Of several tables for the GPU the one in its own file (``file_name``, as the release wrote it)
    serves: another (a table left from an older release) must not displace it by its name's order."""
    tables, problems = shipped_tables(directory)
    found = sorted((t for t in tables if gpu_matches(t.gpu, gpu)), key=lambda t: t.name != file_name(gpu))
    if len(found) > 1:
        problems.append(f"{len(found)} shipped tables match {gpu.key} ({', '.join(t.name for t in found)}); "
                        f"serving {found[0].name}")
    return (found[0] if found else None), problems
