"""Store tests run against a SQLite file and against a real PostgreSQL server.

``db_url`` is parametrized over both backends. PostgreSQL comes from
``FLASHTUNE_TEST_POSTGRES_URL`` (e.g. ``postgresql+psycopg://postgres@127.0.0.1:5432/test``);
each test gets a schema of its own, dropped afterwards. Without the variable the
PostgreSQL cases skip and say why; with it set and the server unreachable they fail.
"""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa

POSTGRES_ENV = "FLASHTUNE_TEST_POSTGRES_URL"
BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(autouse=True)
def _no_default_store(tmp_path, monkeypatch):
    """No store test may touch the user's real default store."""
    monkeypatch.setenv("FLASHTUNE_DB", str(tmp_path / "default-store" / "tuned.db"))


@pytest.fixture(scope="session")
def postgres_server() -> sa.Engine:
    """An engine on the test server's database; skips without the variable, fails if unreachable."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set: set it to a PostgreSQL URL such as "
                    "postgresql+psycopg://postgres@127.0.0.1:5432/test to run the PostgreSQL store tests")
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except Exception as e:  # noqa: BLE001 - any failure to connect is the same failure here
        pytest.fail(f"{POSTGRES_ENV}={url} is set but the server cannot be reached: {e}", pytrace=False)
    yield engine
    engine.dispose()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A URL whose connections work in a fresh schema of the test server (dropped after the test)."""
    schema = f"flashtune_test_{uuid.uuid4().hex[:12]}"
    with postgres_server.connect() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    # The %3D tells alembic's config apart from a naive one: "%" must be escaped there.
    url = postgres_server.url.update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    with postgres_server.connect() as connection:
        connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path) -> str:
    """The URL of an empty database: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(db_url):
    from flashtune.store import Store

    with Store(db_url) as opened:
        yield opened
