"""``flashtune export`` and ``flashtune import``: tuned tables as files for other teams."""

from __future__ import annotations

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
)

ON_CONFLICT = {"keep-faster": "keep_faster", "replace": "replace", "skip": "skip"}


@click.command("export", cls=Command)
@click.option("-o", "--output", required=True, metavar="FILE", type=click.Path(dir_okay=False, allow_dash=True),
              help="The file to write (- for standard output).")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@filter_options
@db_option
def export_command(output, force, where, db):
    """Export tuned results to a JSON file that `flashtune import` reads.

    The file holds each GPU's table with its provenance (GPU, driver, CUDA, torch,
    triton, kernel source hash) and a sha256 of the entries. Filters choose what to
    export; by default everything.

    \b
    Example:
      flashtune export -o h200.json --gpu 'NVIDIA H200@sm90'
    """
    from flashtune.store.exchange import dump_export, write_export

    from pathlib import Path

    if output != "-" and Path(output).exists() and not force:
        raise click.ClickException(f"{output} exists: pass --force to overwrite it, or export to another file")
    with open_store(db) as store:
        results = read_results(store, where)
    if not results:
        raise click.ClickException(f"nothing to export: no tuned result matches ({where.describe()}); "
                                   "`flashtune list` shows what is stored")
    gpus = ", ".join(dict.fromkeys(r.key.gpu for r in results))
    if output == "-":
        click.echo(dump_export(results), nl=False)  # bytes: written as they are
        click.echo(f"exported {plural(len(results), 'result')} ({gpus})", err=True)
        return
    write_export(output, results)
    click.echo(f"exported {plural(len(results), 'result')} ({gpus}) to {output}")


@click.command("import", cls=Command)
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@db_option
@click.option("--on-conflict", type=click.Choice(list(ON_CONFLICT)), default="keep-faster", show_default=True,
              help="Where the store already has a key: keep the faster result, replace it, or skip the file's.")
@click.option("--dry-run", is_flag=True, help="Validate and report what would change; write nothing.")
@click.option("--force", is_flag=True, help="Import results tuned with other kernel sources (a different kernel "
              "source hash) too.")
@click.option("--json", "as_json", is_flag=True, help="Output the report as JSON.")
def import_command(file, db, on_conflict, dry_run, force, as_json):
    """Import an export file into the store: all of it, or nothing.

    The whole file is validated first (size, JSON, every field, checksum, no key
    twice); then it is written in one transaction. Results tuned with other kernel
    sources are refused unless --force.

    \b
    Example:
      flashtune import h200.json --dry-run
      flashtune import h200.json --on-conflict replace
    """
    from importlib.metadata import PackageNotFoundError, version

    from flashtune.store.exchange import (
        ExchangeError,
        check_kernel_hash,
        import_export,
        read_export,
    )
    from flashtune.store.records import ImportSummary

    try:
        export = read_export(file)
        check_kernel_hash(export, force=force)  # before the store is opened (or created)
        if dry_run and missing_store(db):  # a dry run creates nothing: into no store, every entry is new
            summary = ImportSummary(inserted=len(export.results))
        else:
            with open_store(db, create=True) as store:
                summary = import_export(store, export, on_conflict=ON_CONFLICT[on_conflict], dry_run=dry_run,
                                        force=force)
    except ExchangeError as e:
        raise click.ClickException(f"{file}: {e}") from e
    try:
        triton = version("triton")
    except PackageNotFoundError:
        triton = None
    other_triton = sum(n for v, n in export.triton_versions().items() if triton and v != triton)
    if as_json:
        echo_json({"file": file, "entries": len(export.results), "gpus": export.gpus, "dry_run": dry_run,
                   "added": summary.inserted, "replaced": summary.replaced, "kept": summary.kept,
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
        why = "it was at least as fast" if on_conflict == "keep-faster" else "--on-conflict skip"
        click.echo(f"{plural(summary.kept, 'key')} {'would keep' if dry_run else 'kept'} the store's result ({why})")
    if other_triton:
        click.echo(f"note: {plural(other_triton, 'entry', 'entries')} {'was' if other_triton == 1 else 'were'} tuned with another triton than this one ({triton}); "
                   "`flashtune search --revalidate` re-times them here", err=True)
