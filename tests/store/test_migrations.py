"""Migrations: models and revisions agree, golden databases upgrade, schema mismatches
say what to run, and the revision files are frozen."""

from __future__ import annotations

import ast
import json
import shutil
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from golden_data import GOLDEN_DIR, ROWS, golden_path, insert_rows
from store_samples import H200, config_for, key, provenance, result

from flashtune.outcome import Outcome
from flashtune.keys import TuningKey
from flashtune.store import (
    VERSION_TABLE,
    SchemaBehindError,
    SchemaNewerError,
    Store,
    StoreError,
    current_revision,
    head_revision,
    migrations,
    upgrade,
)
from flashtune.store.engine import create_store_engine, resolve_url
from flashtune.runners import RunnerTime
from flashtune.store.models import Base

GOLDEN_REVISIONS = sorted(p.stem.removeprefix("schema_") for p in GOLDEN_DIR.glob("schema_*.sqlite"))


def _engine(url) -> sa.Engine:
    return create_store_engine(resolve_url(url))


def test_an_empty_database_upgrades_to_head_and_matches_the_models(db_url):
    assert current_revision(db_url) is None
    assert upgrade(db_url) == head_revision() == current_revision(db_url)
    engine = _engine(db_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={
            "compare_type": True, "version_table": VERSION_TABLE, "include_name": migrations.is_store_table})
        assert compare_metadata(context, Base.metadata) == []
        # alembic does not compare CHECK constraints: compare their names
        inspector = sa.inspect(connection)
        for table in Base.metadata.sorted_tables:
            model_checks = {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}
            assert {c["name"] for c in inspector.get_check_constraints(table.name)} == model_checks, table.name
    engine.dispose()
    assert upgrade(db_url) == head_revision()  # a second upgrade does nothing


def test_opening_a_new_database_creates_the_schema(db_url):
    with Store(db_url) as store:
        assert store.list_results() == []
    assert current_revision(db_url) == head_revision()


def test_the_revisions_form_one_line_from_0001_to_head():
    scripts = list(migrations._scripts().walk_revisions())
    assert scripts[-1].revision == "0001" and scripts[-1].down_revision is None
    assert all(len(s.nextrev) <= 1 for s in scripts), "branched history"
    assert scripts[0].revision == head_revision()


def test_revision_files_never_import_the_live_models():
    for path in (migrations.script_location() / "versions").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert {name.split(".")[0] for name in imported} <= {"alembic", "sqlalchemy"}, path.name


# -- golden databases ---------------------------------------------------------------------------


def _golden_database(db_url: str, revision: str) -> None:
    """Put the golden database of ``revision`` at ``db_url``: the committed file for
    SQLite; for PostgreSQL, the same rows written into that revision's schema."""
    path = resolve_url(db_url).database
    if db_url.startswith("sqlite"):
        shutil.copyfile(golden_path(revision), path)
        return
    upgrade(db_url, revision)
    engine = _engine(db_url)
    with engine.begin() as connection:
        insert_rows(connection, ROWS[revision])
        for table in ROWS[revision]:  # rows came with their ids: move the sequences past them
            connection.execute(sa.text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                       f"(SELECT max(id) FROM {table}))"))
    engine.dispose()


def _row_key(row: dict) -> TuningKey:
    """The key of a golden row (a row of 0001 has seq_len: a key of the standard grid)."""
    return TuningKey.from_dict(row, gpu="NVIDIA H200@sm90")


def test_golden_files_match_their_rows():
    assert GOLDEN_REVISIONS == sorted(ROWS), "every schema in ROWS has a committed golden file, and back"
    assert set(GOLDEN_REVISIONS) == migrations.known_revisions(), (
        "every schema revision needs its golden database: add its rows to ROWS, then run "
        "python tests/store/golden_data.py REVISION")
    for revision in GOLDEN_REVISIONS:
        engine = sa.create_engine(f"sqlite:///file:{golden_path(revision)}?mode=ro&uri=true")
        with engine.connect() as connection:
            assert connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == revision
            for table, rows in ROWS[revision].items():
                assert connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar() == len(rows)
        engine.dispose()


@pytest.mark.parametrize("revision", GOLDEN_REVISIONS)
def test_a_golden_database_upgrades_to_head_with_every_row(db_url, revision):
    _golden_database(db_url, revision)
    if revision != head_revision():
        with pytest.raises(SchemaBehindError):
            Store(db_url)
    assert upgrade(db_url) == head_revision()
    with Store(db_url) as store:
        table = store.load_table(H200)
        expected = ROWS[revision]["flashtune_tuned_results"]
        assert len(table) == len(expected)
        for row in expected:
            stored = table[_row_key(row)]
            # rows written before a config gained fields load as the launch they stored
            assert stored.config == type(stored.config).from_dict(json.loads(row["config"]))
            assert json.loads(row["config"]).items() <= stored.config.to_dict().items()
            assert (stored.time_ms, stored.tflops, stored.default_time_ms, stored.error, stored.n_trials) == (
                row["time_ms"], row["tflops"], row["default_time_ms"], row["error"], row["n_trials"])
            assert stored.provenance.kernel_hash == row["kernel_hash"]
            # rows of 0001 ran Triton; 0002 stores the runner and every runner's time, one a runner: read
            # as its GPU time, the eager time unknown
            assert stored.runner == row.get("runner", "triton")
            times = json.loads(row["runner_times"]) if row.get("runner_times") else None
            assert stored.runner_times == (None if times is None else
                                           {name: RunnerTime(ms, None) for name, ms in times.items()})
            assert stored.chosen_by is None
            assert stored.created_at == datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
        trial_rows = ROWS[revision]["flashtune_trials"]
        trials = store.trials_for(_row_key(trial_rows[0]))
        assert [(t.status, t.message) for t in trials] == [(r["status"], r["message"]) for r in trial_rows]
        # and the upgraded database takes new rows
        assert store.save_result(result(key(8192)))
        store.record_trial(key(8192), config_for("fwd"), Outcome("ok", time_ms=1.0), provenance=provenance())
        assert len(store.load_table(H200)) == len(expected) + 1


def test_rows_of_0001_become_keys_of_the_grid_they_were_tuned_on(db_url):
    _golden_database(db_url, "0001")
    upgrade(db_url)
    with Store(db_url) as store:
        keys = sorted(store.load_table(H200), key=lambda k: k.head_dim)
        trial_keys = {t.key for t in store.trials_for(keys[0])} | {t.key for t in store.trials_for(keys[1])}
    # bf16 d128 n4096: 4 x 16 heads of the grid; fp16 d64 n1024: 16 x 32 heads
    assert [(k.head_dim, k.seq_q, k.seq_k, k.group, k.batch_heads) for k in keys] == [
        (64, 1024, 1024, 1, 512), (128, 4096, 4096, 1, 64)]
    assert all(k.is_grid for k in keys) and trial_keys <= set(keys) and len(trial_keys) == 1


def test_the_downgrade_to_0001_keeps_the_grid_rows_and_drops_the_others(db_url):
    from alembic import command

    _golden_database(db_url, "0002")
    command.downgrade(migrations.alembic_config(resolve_url(db_url)), "0001")
    engine = _engine(db_url)
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT head_dim, seq_len, causal FROM flashtune_tuned_results ORDER BY id")).all()
        trials = connection.execute(sa.text("SELECT count(*) FROM flashtune_trials")).scalar()
    engine.dispose()
    assert [tuple(r) for r in rows] == [(128, 4096, True)] and trials == 0  # the decode key had no 0001 form
    assert upgrade(db_url) == head_revision()
    with Store(db_url) as store:
        assert [k.seq_q for k in store.load_table(H200)] == [4096]


# -- schema mismatches ------------------------------------------------------------------------

FUTURE_REVISION = '''"""A later schema, for the tests only: an index on trial status."""
from alembic import op

revision = "9001"
down_revision = "{head}"


def upgrade():
    op.create_index("ix_flashtune_trials_status", "flashtune_trials", ["status"])


def downgrade():
    op.drop_index("ix_flashtune_trials_status", table_name="flashtune_trials")
'''


@pytest.fixture
def use_migrations(tmp_path, monkeypatch):
    """Switch this process between its own migrations ("this") and those of a newer
    flashtune ("newer": one more revision, 9001)."""
    locations = {"this": migrations.script_location(), "newer": tmp_path / "alembic"}
    shutil.copytree(locations["this"], locations["newer"], ignore=shutil.ignore_patterns("__pycache__"))
    (locations["newer"] / "versions" / "9001_trial_status_index.py").write_text(
        FUTURE_REVISION.format(head=head_revision()))

    def use(which: str) -> None:
        monkeypatch.setattr(migrations, "script_location", lambda: locations[which])
        migrations._scripts.cache_clear()

    yield use
    migrations._scripts.cache_clear()


def test_a_database_behind_says_to_run_flashtune_db_upgrade(db_url, use_migrations):
    with Store(db_url) as store:
        store.save_result(result(key()))
    old = head_revision()
    use_migrations("newer")
    with pytest.raises(SchemaBehindError) as caught:
        Store(db_url)
    shown = resolve_url(db_url).render_as_string(hide_password=True)
    assert str(caught.value) == (f"the database at {shown} is at schema revision {old}, this flashtune expects 9001: "
                                 f"run `flashtune db upgrade --db {shown}`")
    assert current_revision(db_url) == old  # refusing changed nothing
    assert upgrade(db_url) == "9001"
    with Store(db_url) as store:
        assert list(store.load_table(H200)) == [key()]


def test_a_database_from_a_newer_flashtune_says_to_upgrade_flashtune(db_url, use_migrations):
    use_migrations("newer")
    with Store(db_url) as store:
        store.save_result(result(key()))
    use_migrations("this")
    with pytest.raises(SchemaNewerError, match=rf"schema revision 9001, which this flashtune \(schema "
                                               rf"{head_revision()}\) does not know: it was written by a newer "
                                               r"flashtune; upgrade flashtune"):
        Store(db_url)
    with pytest.raises(SchemaNewerError, match="upgrade flashtune"):
        upgrade(db_url)
    assert current_revision(db_url) == "9001"


def test_flashtune_tables_without_a_version_table_are_refused(db_url):
    upgrade(db_url)
    engine = _engine(db_url)
    with engine.begin() as connection:
        connection.execute(sa.text(f"DROP TABLE {VERSION_TABLE}"))
    engine.dispose()
    with pytest.raises(StoreError, match="has flashtune's tables .* but no flashtune_alembic_version table"):
        Store(db_url)
