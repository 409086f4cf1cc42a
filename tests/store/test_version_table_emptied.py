"""A store whose version table was emptied is no new store (issue 17, item 10): `info`,
`db current`, opening and `db upgrade` say what is wrong and how to repair it."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from store_samples import key, result

from flashtune.cli import cli
from flashtune.store import Store, StoreError, head_revision

HEAD = head_revision()


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="flashtune")


def test_an_emptied_version_table_is_reported_with_its_repair(db_url):
    with Store(db_url) as store:
        store.save_result(result(key()))
    engine = sa.create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM flashtune_alembic_version"))
    shown = sa.make_url(db_url).render_as_string(hide_password=True)
    problem = (f"the database at {shown} has flashtune's tables (flashtune_gpus, flashtune_recorded_calls, "
               f"flashtune_trials, flashtune_tuned_results; 1 tuned result) but no flashtune_alembic_version table with a "
               "revision in it, so their schema is unknown: restore the database from a backup; if this flashtune "
               f"wrote it (schema {HEAD}), record that revision with the SQL `INSERT INTO flashtune_alembic_version "
               f"(version_num) VALUES ('{HEAD}')` and check with `flashtune db current`")
    info = _cli("info", "--db", db_url, "--json")
    assert info.exit_code == 0
    assert json.loads(info.stdout)["store"]["problem"] == problem  # 3a7812e: "no store yet"
    current = _cli("db", "current", "--db", db_url)
    assert (current.exit_code, current.output) == (1, f"Error: {problem}\n")
    for opening in (lambda: Store(db_url, create=False), lambda: Store(db_url)):
        with pytest.raises(StoreError) as raised:
            opening()
        assert str(raised.value) == problem
    with engine.begin() as connection:  # the repair the message gives
        connection.execute(sa.text(f"INSERT INTO flashtune_alembic_version (version_num) VALUES ('{HEAD}')"))
    engine.dispose()
    with Store(db_url, create=False) as store:
        assert [r.key for r in store.list_results()] == [key()]
