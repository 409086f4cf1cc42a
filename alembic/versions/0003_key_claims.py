"""Key claims with leases, and the store's identity.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``flashtune_key_claims``: one row per tuning key that a search claimed: the key's
canonical identity (its JSON, sorted keys), the kernel hash it was searched under,
who holds it (host:pid:uuid) and until when (the lease, renewed while the holder
works), its state (claimed or done) and the trial budget it was finished with.

``flashtune_store_info``: name/value rows; ``store_id`` is a random hex id made here
(one per store), which goes into the Optuna study names, so a new store never
inherits the finished studies of another.

Frozen: this file states the tables it makes and never imports flashtune's models.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# A random 32-digit hex id, made by the database itself (no Python randomness in a frozen revision).
_RANDOM_ID = {
    "sqlite": "lower(hex(randomblob(16)))",
    "postgresql": "replace(CAST(gen_random_uuid() AS TEXT), '-', '')",
}


def upgrade() -> None:
    op.create_table(
        "flashtune_key_claims",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key_identity", sa.Text(), nullable=False),
        sa.Column("kernel_hash", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("key_identity", name="uq_flashtune_key_claims_key_identity"),
        sa.CheckConstraint("state IN ('claimed', 'done')", name="ck_flashtune_key_claims_state"),
        sa.CheckConstraint("trials IS NULL OR trials > 0", name="ck_flashtune_key_claims_trials"),
    )
    op.create_index("ix_flashtune_key_claims_holder", "flashtune_key_claims", ["holder", "state"])
    op.create_table(
        "flashtune_store_info",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )
    dialect = op.get_context().dialect.name  # offline (--sql) too
    random_id = _RANDOM_ID.get(dialect, _RANDOM_ID["sqlite"])
    op.execute(f"INSERT INTO flashtune_store_info (name, value) VALUES ('store_id', {random_id})")


def downgrade() -> None:
    op.drop_table("flashtune_store_info")
    op.drop_index("ix_flashtune_key_claims_holder", table_name="flashtune_key_claims")
    op.drop_table("flashtune_key_claims")
