"""``flashtune delete`` and ``flashtune db reset``: remove tuned results, after a confirmation."""

from __future__ import annotations

import click

from flashtune.cli._common import FILTER_OPTIONS, Command, db_option, echo_json, filter_options, open_store, plural

YES_HELP = "Do not ask for confirmation."
JSON_HELP = "Output the summary as JSON (the question, if asked, goes to stderr)."


@click.command("delete", cls=Command)
@filter_options
@db_option
@click.option("-y", "--yes", is_flag=True, help=YES_HELP)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def delete_command(where, db, yes, as_json):
    """Delete the tuned results that match the filters (at least one).

    The trials stay (the audit log, and what a new search of the key starts from);
    `flashtune search --force` with the key's options tunes a deleted key again.
    `flashtune db reset` empties the whole store.

    \b
    Example:
      flashtune delete --gpu 'NVIDIA H200@sm90' --head-dim 256
    """
    from flashtune.store.engine import show_url

    if where.describe() == "everything":
        raise click.UsageError(f"give at least one filter ({', '.join(FILTER_OPTIONS.values())}); "
                               "`flashtune db reset` deletes everything")
    with open_store(db) as store:
        found = len(store.list_results(where, damaged=[]))  # damaged rows are deleted too, not counted
        if not found:
            raise click.ClickException(f"no tuned result matches ({where.describe()}): `flashtune list` shows what "
                                       "is stored")
        if not yes:
            click.confirm(f"delete {plural(found, 'tuned result')} ({where.describe()}) from "
                          f"{show_url(store.url)}?", abort=True, err=True)
        deleted = store.delete_results(where)
    if as_json:
        echo_json({"deleted": deleted, "filters": where.describe(), "store": show_url(store.url)})
        return
    click.echo(f"deleted {plural(deleted, 'tuned result')} ({where.describe()}); their trials stay, "
               "`flashtune search --force` tunes these keys again")


@click.command("reset", cls=Command)
@db_option
@click.option("-y", "--yes", is_flag=True, help=YES_HELP)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def reset_command(db, yes, as_json):
    """Delete every tuned result, trial and GPU from the store (the schema stays).

    Rather than removing the store's file: the Optuna journal next to it still
    holds the searches, and `flashtune search --force` searches again.
    """
    from flashtune.store.engine import show_url

    with open_store(db) as store:
        where = show_url(store.url)
        if not yes:
            click.confirm(f"delete every tuned result and trial from {where}?", abort=True, err=True)
        deleted = store.clear()
    if as_json:
        echo_json({"emptied": where, "deleted": deleted})
        return
    click.echo(f"emptied {where}: {plural(deleted, 'tuned result')} and every trial deleted")
