"""``flashtune info``: this GPU, the versions that matter, and the store."""

from __future__ import annotations

import click

from flashtune.cli._common import LOCK_TIMEOUT_S, Command, db_option, echo_json, stale_note


@click.command("info", cls=Command)
@db_option
@click.option("--json", "as_json", is_flag=True, help="Output JSON.")
def info_command(db, as_json):
    """Show this GPU, the versions, and the store.

    The GPU and its tuning key; flashtune (with its kernel source hash), torch,
    triton, CUDA and driver versions and the ranges flashtune supports; the
    store's location, schema revision, how many results are tuned for this GPU
    and how many of them are stale (`flashtune revalidate` checks those again);
    the table flashtune ships for this GPU, if any.
    """
    import torch
    import triton

    from flashtune import __version__
    from flashtune.compat import SUPPORTED, TESTED
    from flashtune.keys import GpuInfo
    from flashtune.provenance import current_provenance, kernel_source_hash
    from flashtune.store import head_revision

    has_gpu = torch.cuda.is_available()
    gpu = GpuInfo.from_device() if has_gpu else GpuInfo.interpreter()
    provenance = current_provenance()
    store = _store_state(db, gpu.key)
    shipped = _shipped_state(gpu)
    record = {
        "gpu": {"key": gpu.key, "name": gpu.name, "capability": list(gpu.capability), "sm_count": gpu.sm_count,
                "total_memory": gpu.total_memory} if has_gpu else None,
        "interpreter_gpu_key": None if has_gpu else gpu.key,
        "versions": {"flashtune": __version__, "kernel_hash": kernel_source_hash(), "torch": torch.__version__,
                     "triton": triton.__version__, "cuda": torch.version.cuda, "driver": provenance.driver_version
                     or None},
        "supported": {d.package: d.spec for d in SUPPORTED},
        "tested": [{"torch": torch_v, "triton": triton_v, "on": where} for torch_v, triton_v, where in TESTED],
        "store": {**store, "head_revision": head_revision()},
        "shipped_table": shipped,
    }
    if as_json:
        echo_json(record)
        return
    if has_gpu:
        gpu_line = (f"{gpu.key} ({gpu.sm_count} SMs, {gpu.total_memory / 2**30:.0f} GiB)")
    else:
        gpu_line = (f"none: torch sees no CUDA GPU (`--interpreter` demos run as {gpu.key})")
    versions = record["versions"]
    pairs = [
        ("GPU", gpu_line),
        ("flashtune", f"{versions['flashtune']} (kernel source hash {versions['kernel_hash']})"),
        ("torch", f"{versions['torch']} (supported: {record['supported']['torch']})"),
        ("triton", f"{versions['triton']} (supported: {record['supported']['triton']})"),
        ("CUDA", versions["cuda"] or "-"),
        ("driver", versions["driver"] or "-"),
        ("store", store["location"]),
        ("schema", _schema_line(store, record["store"]["head_revision"])),
        ("tuned results", _rows_line(store, gpu.key, db)),
        ("shipped table", _shipped_line(shipped, gpu.key)),
    ]
    width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        click.echo(f"{name.ljust(width)}  {value}")


def _shipped_state(gpu) -> dict | None:
    """The table flashtune ships for ``gpu``: its file, results and how many are stale; None if none."""
    from flashtune import tables
    from flashtune.provenance import is_current

    table, problems = tables.for_gpu(gpu)
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    if table is None:
        return None
    return {"file": table.name, "gpu": table.gpu.key, "results": len(table.results),
            "stale_results": sum(not is_current(r.provenance) for r in table.results)}


def _shipped_line(shipped: dict | None, gpu_key: str) -> str:
    if shipped is None:
        return f"none for {gpu_key} (`flashtune list --shipped` shows the GPUs flashtune ships tables for)"
    line = f"{shipped['file']}: {shipped['results']} results"
    if shipped["stale_results"]:
        line += (f", {shipped['stale_results']} stale: served once `flashtune revalidate` has checked them here "
                 "(into the store)")
    return line


def _store_state(db, gpu_key: str) -> dict:
    """Where the store is, its revision, and the number of results for ``gpu_key``: never creates it."""
    from flashtune.store import (
        Store,
        StoreError,
        current_revision,
        head_revision,
        resolve_url,
    )
    from flashtune.store.engine import show_url

    url = resolve_url(db)
    from flashtune.provenance import is_current

    state = {"location": show_url(url), "revision": None, "tuned_results": None, "stale_results": None,
             "total_results": None, "problem": None}
    try:
        state["revision"] = current_revision(url)
        if state["revision"] == head_revision():
            with Store(url, create=False, lock_timeout_s=LOCK_TIMEOUT_S) as store:
                damaged: list[str] = []
                table = store.load_table(gpu_key, damaged=damaged)
                state["tuned_results"] = len(table)
                state["stale_results"] = sum(not is_current(r.provenance) for r in table.values())
                state["total_results"] = len(store.list_results(damaged=damaged))
    except StoreError as e:
        state["problem"] = str(e).splitlines()[0]
    return state


def _schema_line(store: dict, head: str) -> str:
    revision = store["revision"]
    if store["problem"]:
        return f"unreadable: {store['problem']}"
    if revision is None:
        return f"no store yet (created by the first search or `flashtune db upgrade`; schema {head})"
    if revision == head:
        return f"{revision} (head)"
    return f"{revision} (this flashtune's is {head}: `flashtune db current` says what to do)"


def _rows_line(store: dict, gpu_key: str, db) -> str:
    if store["tuned_results"] is None:
        return "-"
    line = f"{store['tuned_results']} for {gpu_key} ({store['total_results']} in all)"
    if store["stale_results"]:
        line += "; " + stale_note(store["stale_results"], store["tuned_results"], db).removeprefix("note: ")
    return line
