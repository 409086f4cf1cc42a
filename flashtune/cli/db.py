"""``flashtune db upgrade`` and ``flashtune db current``: the store's schema (``db reset``: cli/remove.py)."""

from __future__ import annotations

import click

from flashtune.cli._common import Group, db_option, echo_json

json_option = click.option("--json", "as_json", is_flag=True, help="Output JSON.")


@click.group("db", cls=Group)
def db_group():
    """Show or upgrade the store's schema, or empty the store."""


def _where(db) -> str:
    from flashtune.store import resolve_url
    from flashtune.store.engine import show_url

    return show_url(resolve_url(db))


@db_group.command("upgrade")
@db_option
@json_option
def upgrade_command(db, as_json):
    """Upgrade a store to this flashtune's schema (creates a new store's tables).

    Run it after upgrading flashtune when a command says the database is behind.
    The upgrade is one transaction; concurrent upgrades queue.
    """
    from flashtune.store import current_revision, upgrade

    before = current_revision(db)
    after = upgrade(db)
    where = _where(db)
    if as_json:
        echo_json({"store": where, "before": before, "revision": after, "head": after})
    elif before == after:
        click.echo(f"{where} is already at schema revision {after} (head)")
    elif before is None:
        click.echo(f"created the store at {where}: schema revision {after} (head)")
    else:
        click.echo(f"upgraded {where} from schema revision {before} to {after} (head)")


@db_group.command("current")
@db_option
@json_option
def current_command(db, as_json):
    """Print the store's schema revision, and whether this flashtune can use it."""
    from flashtune.store import SchemaBehindError, current_revision, head_revision, resolve_url
    from flashtune.store.migrations import schema_error

    where = _where(db)
    revision = current_revision(db)
    head = head_revision()
    if as_json:
        state = ("none" if revision is None else "head" if revision == head else
                 "behind" if isinstance(schema_error(revision, resolve_url(db)), SchemaBehindError) else "newer")
        echo_json({"store": where, "revision": revision, "head": head, "state": state})
    elif revision is None:
        click.echo(f"{where}: no flashtune store (`flashtune db upgrade` or the first search creates it; this "
                   f"flashtune's schema is {head})")
    elif revision == head:
        click.echo(f"{where}: schema revision {revision} (head)")
    else:
        error = schema_error(revision, resolve_url(db))
        state = "behind" if isinstance(error, SchemaBehindError) else "unknown: written by a newer flashtune"
        click.echo(f"{where}: schema revision {revision} ({state}; this flashtune's is {head})")
        click.echo(str(error))
