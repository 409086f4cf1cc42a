"""The key tells shapes apart: seq_len becomes seq_q, and seq_k, group (query heads per
key/value head) and batch_heads (batch x query heads, bucketed to a power of two) join it.
A table of recorded calls (flashtune.recording) is new. A tuned result also names its runner (flashtune's Triton kernels, or an SDPA backend that
was faster) and the times of every runner measured (JSON); 0001's rows ran Triton.

Rows written under 0001 were tuned on the standard grid: square (seq_k = seq_q), no grouped
heads (group 1), and the grid's batch x heads, (16384 // seq_len) * (2048 // head_dim)
rounded to the nearest power of two in log2 space; the interpreter's rows (GPU key
"triton-interpreter@sm00") at its demo shape, 1 x 2 heads. The downgrade keeps only rows of
that form (the others have no 0001 key) and deletes the rest.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Frozen: this file states what it changes and never imports flashtune.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLES = ("flashtune_tuned_results", "flashtune_trials")
OLD_KEY = ("gpu_id", "dtype", "head_dim", "causal", "pass", "seq_len")
NEW_KEY = ("gpu_id", "dtype", "head_dim", "causal", "pass", "seq_q", "seq_k", "group", "batch_heads")
NEW_COLUMNS = ("seq_k", "group", "batch_heads")
INTERPRETER_GPU = "triton-interpreter@sm00"
RUNNERS = "'triton', 'sdpa-cudnn', 'sdpa-flash', 'sdpa-efficient'"


def _bucket(value: int) -> int:
    low = 1 << (value.bit_length() - 1)
    return low if value * value < 2 * low * low else 2 * low


def _grid_batch_heads(gpu_key: str, head_dim: int, seq_len: int) -> int:
    if gpu_key == INTERPRETER_GPU:
        return 2
    return _bucket(max(1, 16384 // seq_len) * max(1, 2048 // head_dim))


def _grid_points(connection, table: str, seq_column: str):
    """(gpu_id, head_dim, seq, grid batch_heads) of every distinct grid point of a table."""
    rows = connection.execute(sa.text(
        f'SELECT DISTINCT t.gpu_id, g."key", t.head_dim, t.{seq_column} FROM {table} t '
        'JOIN flashtune_gpus g ON g.id = t.gpu_id')).all()
    return [(gpu_id, head_dim, seq, _grid_batch_heads(gpu_key, head_dim, seq))
            for gpu_id, gpu_key, head_dim, seq in rows]


def upgrade() -> None:
    connection = op.get_bind()
    for table in TABLES:
        # what names seq_len goes first (SQLite rebuilds the table, and a CHECK or index on a
        # renamed column would name a column that no longer exists)
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"ck_{table}_seq_len", type_="check")
            if table == "flashtune_tuned_results":
                batch.drop_constraint("uq_flashtune_tuned_results_key", type_="unique")
            else:
                batch.drop_index("ix_flashtune_trials_key")
            batch.alter_column("seq_len", new_column_name="seq_q", existing_type=sa.Integer(), existing_nullable=False)
            for column in NEW_COLUMNS:
                batch.add_column(sa.Column(column, sa.Integer(), nullable=True))
        for gpu_id, head_dim, seq, batch_heads in _grid_points(connection, table, "seq_q"):
            connection.execute(
                sa.text(f'UPDATE {table} SET seq_k = seq_q, "group" = 1, batch_heads = :bh '
                        'WHERE gpu_id = :gpu AND head_dim = :d AND seq_q = :n'),
                {"bh": batch_heads, "gpu": gpu_id, "d": head_dim, "n": seq})
        with op.batch_alter_table(table) as batch:
            for column in NEW_COLUMNS:
                batch.alter_column(column, existing_type=sa.Integer(), nullable=False)
            batch.create_check_constraint(f"ck_{table}_seq_q", "seq_q > 0")
            batch.create_check_constraint(f"ck_{table}_seq_k", "seq_k > 0")
            batch.create_check_constraint(f"ck_{table}_group", '"group" > 0')
            batch.create_check_constraint(f"ck_{table}_batch_heads", "batch_heads > 0")
            if table == "flashtune_tuned_results":
                batch.create_unique_constraint("uq_flashtune_tuned_results_key", list(NEW_KEY))
            else:
                batch.create_index("ix_flashtune_trials_key", [*NEW_KEY, "kernel_hash"])
    with op.batch_alter_table("flashtune_tuned_results") as batch:
        batch.add_column(sa.Column("runner", sa.String(32), nullable=True))
        batch.add_column(sa.Column("runner_times", sa.JSON(), nullable=True))
    connection.execute(sa.text("UPDATE flashtune_tuned_results SET runner = 'triton'"))
    with op.batch_alter_table("flashtune_tuned_results") as batch:
        batch.alter_column("runner", existing_type=sa.String(32), nullable=False)
        batch.create_check_constraint("ck_flashtune_tuned_results_runner", f'"runner" IN ({RUNNERS})')
    op.create_table(
        "flashtune_recorded_calls",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("seq_q", sa.Integer(), nullable=False),
        sa.Column("seq_k", sa.Integer(), nullable=False),
        sa.Column("group", sa.Integer(), nullable=False),
        sa.Column("batch_heads", sa.Integer(), nullable=False),
        sa.Column("causal", sa.Boolean(), nullable=False),
        sa.Column("pass", sa.String(8), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("heads_q", sa.Integer(), nullable=False),
        sa.Column("heads_kv", sa.Integer(), nullable=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["gpu_id"], ["flashtune_gpus.id"], name="fk_flashtune_recorded_calls_gpu_id"),
        sa.CheckConstraint("\"dtype\" IN ('float16', 'bfloat16', 'float32')", name="ck_flashtune_recorded_calls_dtype"),
        sa.CheckConstraint("head_dim > 0", name="ck_flashtune_recorded_calls_head_dim"),
        sa.CheckConstraint("seq_q > 0", name="ck_flashtune_recorded_calls_seq_q"),
        sa.CheckConstraint("seq_k > 0", name="ck_flashtune_recorded_calls_seq_k"),
        sa.CheckConstraint('"group" > 0', name="ck_flashtune_recorded_calls_group"),
        sa.CheckConstraint("batch_heads > 0", name="ck_flashtune_recorded_calls_batch_heads"),
        sa.CheckConstraint("\"pass\" IN ('fwd', 'bwd')", name="ck_flashtune_recorded_calls_pass"),
        sa.CheckConstraint("batch > 0 AND heads_q > 0 AND heads_kv > 0", name="ck_flashtune_recorded_calls_shape"),
        sa.CheckConstraint("calls >= 0", name="ck_flashtune_recorded_calls_calls"),
        sa.UniqueConstraint(*NEW_KEY, "batch", "heads_q", "heads_kv", name="uq_flashtune_recorded_calls_call"),
    )


def downgrade() -> None:
    connection = op.get_bind()
    op.drop_table("flashtune_recorded_calls")
    with op.batch_alter_table("flashtune_tuned_results") as batch:
        batch.drop_constraint("ck_flashtune_tuned_results_runner", type_="check")
        batch.drop_column("runner_times")
        batch.drop_column("runner")
    for table in TABLES:
        # keep the rows of the grid's form: the only ones a 0001 key can name
        keep = _grid_points(connection, table, "seq_q")
        connection.execute(sa.text(f'DELETE FROM {table} WHERE seq_k <> seq_q OR "group" <> 1'))
        for gpu_id, head_dim, seq, batch_heads in keep:
            connection.execute(
                sa.text(f"DELETE FROM {table} WHERE gpu_id = :gpu AND head_dim = :d AND seq_q = :n "
                        "AND batch_heads <> :bh"),
                {"bh": batch_heads, "gpu": gpu_id, "d": head_dim, "n": seq})
        with op.batch_alter_table(table) as batch:
            if table == "flashtune_tuned_results":
                batch.drop_constraint("uq_flashtune_tuned_results_key", type_="unique")
            else:
                batch.drop_index("ix_flashtune_trials_key")
            for name in ("seq_q", "seq_k", "group", "batch_heads"):
                batch.drop_constraint(f"ck_{table}_{name}", type_="check")
            for column in NEW_COLUMNS:
                batch.drop_column(column)
            batch.alter_column("seq_q", new_column_name="seq_len", existing_type=sa.Integer(),
                               existing_nullable=False)
        with op.batch_alter_table(table) as batch:
            batch.create_check_constraint(f"ck_{table}_seq_len", "seq_len > 0")
            if table == "flashtune_tuned_results":
                batch.create_unique_constraint("uq_flashtune_tuned_results_key", list(OLD_KEY))
            else:
                batch.create_index("ix_flashtune_trials_key", [*OLD_KEY, "kernel_hash"])
