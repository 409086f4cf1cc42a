"""Initial schema: GPUs, tuned results and trials.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Frozen: this file states the tables it makes and never imports flashtune's models.
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

DTYPES = "'float16', 'bfloat16', 'float32'"
STATUSES = "'ok', 'incorrect', 'compile_error', 'out_of_resources', 'crashed', 'timeout'"
KEY_INDEX = ("gpu_id", "dtype", "head_dim", "causal", "pass", "seq_len")


def _key_columns(table: str) -> list:
    """gpu_id, dtype, head_dim, seq_len, causal, pass, with their foreign key and checks."""
    return [
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("causal", sa.Boolean(), nullable=False),
        sa.Column("pass", sa.String(8), nullable=False),
        sa.ForeignKeyConstraint(["gpu_id"], ["flashtune_gpus.id"], name=f"fk_{table}_gpu_id"),
        sa.CheckConstraint(f'"dtype" IN ({DTYPES})', name=f"ck_{table}_dtype"),
        sa.CheckConstraint("head_dim > 0", name=f"ck_{table}_head_dim"),
        sa.CheckConstraint("seq_len > 0", name=f"ck_{table}_seq_len"),
        sa.CheckConstraint("\"pass\" IN ('fwd', 'bwd')", name=f"ck_{table}_pass"),
    ]


def _timestamps(*names: str) -> list:
    return [sa.Column(name, sa.DateTime(timezone=True), nullable=False) for name in names]


def upgrade() -> None:
    op.create_table(
        "flashtune_gpus",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("capability_major", sa.Integer(), nullable=False),
        sa.Column("capability_minor", sa.Integer(), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("total_memory", sa.BigInteger(), nullable=False),
        *_timestamps("created_at", "updated_at"),
        sa.UniqueConstraint("key", name="uq_flashtune_gpus_key"),
        sa.CheckConstraint("capability_major >= 0 AND capability_minor >= 0", name="ck_flashtune_gpus_capability"),
        sa.CheckConstraint("sm_count >= 0", name="ck_flashtune_gpus_sm_count"),
        sa.CheckConstraint("total_memory >= 0", name="ck_flashtune_gpus_total_memory"),
    )
    op.create_table(
        "flashtune_tuned_results",
        sa.Column("id", sa.Integer(), primary_key=True),
        *_key_columns("flashtune_tuned_results"),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("time_ms", sa.Double(), nullable=False),
        sa.Column("tflops", sa.Double(), nullable=False),
        sa.Column("default_time_ms", sa.Double(), nullable=True),
        sa.Column("error", sa.Double(), nullable=False),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("flashtune_version", sa.String(64), nullable=False),
        sa.Column("kernel_hash", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64), nullable=False),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("cuda_version", sa.String(64), nullable=False),
        sa.Column("driver_version", sa.String(64), nullable=False),
        *_timestamps("created_at", "updated_at"),
        sa.UniqueConstraint(*KEY_INDEX, name="uq_flashtune_tuned_results_key"),
        sa.CheckConstraint("time_ms > 0", name="ck_flashtune_tuned_results_time_ms"),
        sa.CheckConstraint("tflops >= 0", name="ck_flashtune_tuned_results_tflops"),
        sa.CheckConstraint("default_time_ms IS NULL OR default_time_ms > 0",
                           name="ck_flashtune_tuned_results_default_time_ms"),
        sa.CheckConstraint("error >= 0", name="ck_flashtune_tuned_results_error"),
        sa.CheckConstraint("n_trials >= 0", name="ck_flashtune_tuned_results_n_trials"),
    )
    op.create_table(
        "flashtune_trials",
        sa.Column("id", sa.Integer(), primary_key=True),
        *_key_columns("flashtune_trials"),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("time_ms", sa.Double(), nullable=True),
        sa.Column("error", sa.Double(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("study", sa.String(200), nullable=True),
        sa.Column("kernel_hash", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64), nullable=False),
        *_timestamps("created_at"),
        sa.CheckConstraint(f'"status" IN ({STATUSES})', name="ck_flashtune_trials_status"),
        sa.CheckConstraint("time_ms IS NULL OR time_ms > 0", name="ck_flashtune_trials_time_ms"),
        sa.CheckConstraint("status <> 'ok' OR time_ms IS NOT NULL", name="ck_flashtune_trials_ok_has_time"),
        sa.CheckConstraint("error IS NULL OR error >= 0", name="ck_flashtune_trials_error"),
    )
    op.create_index("ix_flashtune_trials_key", "flashtune_trials", [*KEY_INDEX, "kernel_hash"])


def downgrade() -> None:
    op.drop_index("ix_flashtune_trials_key", table_name="flashtune_trials")
    op.drop_table("flashtune_trials")
    op.drop_table("flashtune_tuned_results")
    op.drop_table("flashtune_gpus")
