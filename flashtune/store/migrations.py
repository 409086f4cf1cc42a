"""Schema migrations: alembic, run in code, never from the current directory.

The revisions live in ``alembic/`` at the repository root and ship inside the wheel as
``flashtune/store/_alembic``; ``script_location()`` finds whichever this flashtune has.
Alembic's version table is ``flashtune_alembic_version``, so the store can share a
database with Optuna's tables (and Optuna's own ``alembic_version``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import sqlalchemy as sa

from flashtune.store.engine import (cannot_write, create_store_engine, ensure_directory, resolve_url, show_url,
                                    sqlite_path, transaction, use_wal, wrap_errors)
from flashtune.store.errors import SchemaBehindError, SchemaNewerError, StoreError

VERSION_TABLE = "flashtune_alembic_version"
# First key of the PostgreSQL advisory lock that serializes concurrent upgrades of one
# schema (the second key is the schema's hash).
_PG_MIGRATION_LOCK = 0x666C6173  # "flas"


def script_location() -> Path:
    """The alembic script directory of this flashtune (installed wheel or repository)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "_alembic", package.parents[1] / "alembic"):
        if (candidate / "env.py").is_file() and (candidate / "versions").is_dir():
            return candidate
    raise StoreError(f"flashtune's migrations are missing from this installation (looked next to {package}); "
                     "reinstall flashtune")


def is_store_table_name(name: str | None) -> bool:
    """flashtune's own tables (a shared database holds others, Optuna's for one)."""
    return (name or "").startswith("flashtune_") and name != VERSION_TABLE


def is_store_table(name: str | None, type_: str, _parents=None) -> bool:
    """Alembic's ``include_name`` hook: autogenerate looks at flashtune's tables only."""
    return type_ != "table" or is_store_table_name(name)


def alembic_config(url: sa.URL | None = None, connection: sa.Connection | None = None):
    """An alembic ``Config`` built in code; ``env.py`` uses ``connection`` when given."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url is not None:
        # ConfigParser interpolates "%": a URL-encoded password or option must be escaped.
        config.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


@functools.lru_cache(maxsize=1)
def _scripts():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The schema revision this flashtune writes."""
    return _scripts().get_current_head()


def known_revisions() -> set[str]:
    return {script.revision for script in _scripts().walk_revisions()}


def database_revision(connection: sa.Connection) -> str | None:
    """The revision recorded in the database; None where flashtune's tables were never made."""
    from alembic.migration import MigrationContext

    return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def schema_error(revision: str, url: sa.URL) -> StoreError:
    """The error for a database at ``revision`` when this flashtune expects the head."""
    head = head_revision()
    if revision in known_revisions():
        return SchemaBehindError(
            f"the database at {show_url(url)} is at schema revision {revision}, this flashtune expects {head}: "
            f"run `flashtune db upgrade --db {show_url(url)}`"
        )
    return SchemaNewerError(
        f"the database at {show_url(url)} is at schema revision {revision}, which this flashtune "
        f"(schema {head}) does not know: it was written by a newer flashtune; upgrade flashtune"
    )


def unversioned_check(connection: sa.Connection, url: sa.URL) -> None:
    """Raise ``StoreError`` where flashtune's tables exist but no revision is recorded
    (the version table was emptied or dropped): such a database is no new store."""
    tables = sorted(filter(is_store_table_name, sa.inspect(connection).get_table_names()))
    if not tables:
        return
    rows = (connection.execute(sa.select(sa.func.count()).select_from(sa.table("flashtune_tuned_results")))
            .scalar_one() if "flashtune_tuned_results" in tables else 0)
    raise StoreError(
        f"the database at {show_url(url)} has flashtune's tables ({', '.join(tables)}; {rows} tuned "
        f"result{'' if rows == 1 else 's'}) "
        f"but no {VERSION_TABLE} table with a revision in it, so their schema is unknown: restore the database "
        f"from a backup; if this flashtune wrote it (schema {head_revision()}), record that revision with the SQL "
        f"`INSERT INTO {VERSION_TABLE} (version_num) VALUES ('{head_revision()}')` and check with "
        "`flashtune db current`")


def migrate(engine: sa.Engine, url: sa.URL, revision: str = "head") -> str:
    """Upgrade the database behind ``engine`` to ``revision`` in one transaction; return the new revision.

    Concurrent calls queue: on SQLite the transaction begins IMMEDIATE, on PostgreSQL it
    takes an advisory lock for the schema; the second caller then finds the work done.
    """
    from alembic import command
    from alembic.util import CommandError

    with transaction(engine, f"upgrade {show_url(url)}", write=True) as session:
        connection = session.connection()
        if engine.dialect.name == "postgresql":
            schema = sa.func.hashtext(sa.func.coalesce(sa.func.current_schema(), ""))
            connection.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK, schema)))
        found = database_revision(connection)
        if found is not None and found not in known_revisions():
            raise schema_error(found, url)
        if found is None:
            unversioned_check(connection, url)
        try:
            command.upgrade(alembic_config(url, connection), revision)
        except CommandError as e:
            raise StoreError(f"cannot upgrade {show_url(url)} to {revision!r}: {e}") from e
        return database_revision(connection)


def upgrade(url: str | os.PathLike | None = None, revision: str = "head") -> str:
    """Upgrade the store at ``url`` (default: the default store) to ``revision``; return it.

    This is what ``flashtune db upgrade --db URL`` runs. A new database gets every table.
    """
    resolved = resolve_url(url)
    ensure_directory(resolved)
    engine = create_store_engine(resolved)
    try:
        revision = migrate(engine, resolved, revision)
        with wrap_errors(f"upgrade {show_url(resolved)}"):
            use_wal(engine)
        return revision
    finally:
        engine.dispose()


def current_revision(url: str | os.PathLike | None = None) -> str | None:
    """The schema revision of the store at ``url``; None where there is no store (yet).

    A database with flashtune's tables but no recorded revision raises ``StoreError``."""
    resolved = resolve_url(url)
    path = sqlite_path(resolved)
    if path is not None and not path.exists():
        return None
    engine = create_store_engine(resolved, read_only=cannot_write(resolved))
    try:
        with transaction(engine, f"read the schema revision of {show_url(resolved)}") as session:
            revision = database_revision(session.connection())
            if revision is None:
                unversioned_check(session.connection(), resolved)
            return revision
    finally:
        engine.dispose()
