"""Alembic environment of flashtune's store.

flashtune runs migrations in code (``flashtune.store.upgrade``) and hands over its own
connection, already in a transaction. Run from the repository root, the alembic
command line works too (``alembic -c alembic.ini revision --autogenerate -m ...``),
against the URL in alembic.ini or ``-x url=...``.
"""

from alembic import context

from flashtune.store.engine import create_store_engine, resolve_url
from flashtune.store.migrations import VERSION_TABLE, is_store_table
from flashtune.store.models import Base


def _configure(**kwargs) -> None:
    context.configure(
        target_metadata=Base.metadata,  # for autogenerate only; revisions never import models
        version_table=VERSION_TABLE,
        include_name=is_store_table,
        **kwargs,
    )


def _url():
    return resolve_url(context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option("sqlalchemy.url"))


def run_offline() -> None:
    _configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = create_store_engine(_url())
    try:
        with engine.connect() as connection:
            _run_on(connection)
            connection.commit()
    finally:
        engine.dispose()


def _run_on(connection) -> None:
    # SQLite cannot ALTER most things: later revisions use batch mode there.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
