"""``flashtune export`` and ``flashtune import``: tuned tables as files for other teams, and for the package."""

from __future__ import annotations

from pathlib import Path

import click

from flashtune.cli._common import (
    Command,
    db_option,
    echo_json,
    filter_options,
    missing_store,
    open_store,
    plural,
    read_results,
    stale_note,
)

ON_CONFLICT = {"keep-faster": "keep_faster", "replace": "replace", "skip": "skip"}


@click.command("export", cls=Command)
@click.option("-o", "--output", required=True, metavar="FILE", type=click.Path(allow_dash=True),
              help="The file to write (- for standard output); with --for-package, the directory of the file.")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option("--for-package", is_flag=True, help="Write the table flashtune ships for one GPU: its current results "
              "only (none may be stale), into OUTPUT (flashtune/tables/ of a checkout) under the GPU's file name.")
@filter_options
@db_option
@click.option("--json", "as_json", is_flag=True, help="Output the summary as JSON.")
def export_command(output, force, for_package, where, db, as_json):
    """Export tuned results to a JSON file that `flashtune import` reads.

    The file holds each GPU's table with its provenance (GPU, driver, CUDA, torch,
    triton, kernel source hash) and a sha256 of the entries. Filters choose what to
    export; by default everything.

    With --for-package it writes the table a flashtune release ships for one GPU
    (flashtune/tables/, served where a user's store has no current result): tune the
    GPU with `flashtune search` (the grid, `--shapes` with SHAPES.md's rows, `--model`
    presets), then export it into the checkout and commit the file.

    \b
    Examples:
      flashtune export -o h200.json --gpu 'NVIDIA H200@sm90'
      flashtune export --for-package -o flashtune/tables/ --gpu 'NVIDIA H100 80GB HBM3@sm90'
    """
    from flashtune.store.exchange import dump_export, write_export

    if as_json and output == "-":
        raise click.UsageError("--json and -o - both write to standard output: export to a file")
    with open_store(db) as store:
        results = read_results(store, where)
    if not results:
        raise click.ClickException(f"nothing to export: no tuned result matches ({where.describe()}); "
                                   "`flashtune list` shows what is stored")
    if for_package:
        output = str(_package_file(output, results, db))
    elif output != "-" and Path(output).is_dir():
        raise click.BadParameter(f"{output!r} is a directory: give the export file's path", param_hint="'--output'")
    if output != "-" and Path(output).exists() and not force:
        raise click.ClickException(f"{output} exists: pass --force to overwrite it, or export to another file")
    gpus = list(dict.fromkeys(r.key.gpu for r in results))
    if output == "-":
        click.echo(dump_export(results), nl=False)  # bytes: written as they are
        click.echo(f"exported {plural(len(results), 'result')} ({', '.join(gpus)})", err=True)
        return
    write_export(output, results)
    if as_json:
        echo_json({"file": output, "results": len(results), "gpus": gpus, "for_package": for_package})
        return
    click.echo(f"exported {plural(len(results), 'result')} ({', '.join(gpus)}) to {output}")


def _package_file(directory: str, results: list, db) -> Path:
    """Where ``--for-package`` writes: the GPU's file name (``tables.file_name``) in ``directory``;
    the results must be of one GPU and current."""
    from flashtune import tables
    from flashtune.provenance import is_current

    if directory == "-" or not Path(directory).is_dir():
        raise click.BadParameter(f"{directory!r} is not a directory: with --for-package, -o names the directory of "
                                 "the shipped tables (flashtune/tables/ of a checkout)", param_hint="'--output'")
    gpus = {r.gpu.key: r.gpu for r in results}
    if len(gpus) != 1:
        raise click.UsageError(f"a shipped table holds one GPU's results, these are of {len(gpus)} "
                               f"({', '.join(sorted(gpus))}): pick one with --gpu")
    stale = [r for r in results if not is_current(r.provenance)]
    if stale:
        raise click.ClickException(f"{stale_note(len(stale), len(results), db).removeprefix('note: ')}; a shipped "
                                   "table holds current results only")
    return Path(directory) / tables.file_name(next(iter(gpus.values())))


@click.command("import", cls=Command)
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@db_option
@click.option("--on-conflict", type=click.Choice(list(ON_CONFLICT)), default="keep-faster", show_default=True,
              help="Where the store already has a key: keep the faster result (a current one always wins over a "
              "stale one), replace it, or skip the file's.")
@click.option("--dry-run", is_flag=True, help="Validate and report what would change; write nothing.")
@click.option("--force", is_flag=True, hidden=True, help="Accepted for old scripts; stale results import without it.")
@click.option("--json", "as_json", is_flag=True, help="Output the report as JSON.")
def import_command(file, db, on_conflict, dry_run, force, as_json):
    """Import an export file into the store: all of it, or nothing.

    The whole file is validated first (size, JSON, every field, checksum, no key
    twice); then it is written in one transaction. Results tuned under other kernel
    sources or another triton (an older flashtune's export, another team's) import
    as stale: they are not served until `flashtune revalidate` has checked them on
    this installation.

    \b
    Example:
      flashtune import h200.json --dry-run
      flashtune import h200.json --on-conflict replace
    """
    from flashtune.provenance import stale_versions
    from flashtune.store.exchange import ExchangeError, import_export, read_export
    from flashtune.store.records import ImportSummary

    try:
        export = read_export(file)
        if dry_run and missing_store(db):  # a dry run creates nothing: into no store, every entry is new
            summary = ImportSummary(inserted=len(export.results))
        else:
            with open_store(db, create=True) as store:
                summary = import_export(store, export, on_conflict=ON_CONFLICT[on_conflict], dry_run=dry_run)
    except ExchangeError as e:
        raise click.ClickException(f"{file}: {e}") from e
    stale = export.stale()
    if as_json:
        echo_json({"file": file, "entries": len(export.results), "gpus": export.gpus, "dry_run": dry_run,
                   "added": summary.inserted, "replaced": summary.replaced, "kept": summary.kept,
                   "stale": len(stale), "stale_versions": sorted({stale_versions(r.provenance) for r in stale}),
                   "exported_by": export.flashtune_version, "exported_at": export.exported_at})
        return
    click.echo(f"{file}: {plural(len(export.results), 'entry', 'entries')} for {plural(len(export.gpus), 'GPU')} "
               f"({', '.join(export.gpus) or 'none'}), exported by flashtune {export.flashtune_version} "
               f"at {export.exported_at}")
    if dry_run:
        click.echo(f"dry run: {summary.inserted} to add, {summary.replaced} to replace, {summary.kept} to keep; "
                   "nothing was written")
    else:
        click.echo(f"imported: {summary.inserted} added, {summary.replaced} replaced, {summary.kept} kept")
    if summary.kept:
        faster = "it was at least as fast" + (", or current where the file's is stale" if stale else "")
        why = {"keep-faster": faster, "skip": "--on-conflict skip"}.get(on_conflict, "")
        click.echo(f"{plural(summary.kept, 'key')} {'would keep' if dry_run else 'kept'} the store's result ({why})")
    if stale:
        versions = "; ".join(sorted({stale_versions(r.provenance) for r in stale}))
        click.echo(f"{stale_note(len(stale), len(export.results), db)} (the file's were tuned with {versions})",
                   err=True)
