"""SQLAlchemy models of the store's tables (the schema is described in ``flashtune.store``).

The alembic revisions are the source of truth for the schema; these models mirror the
head revision, and a test checks that the two agree. Every constraint and index has an
explicit name, so later migrations can refer to it on every backend (SQLite's batch
mode needs names).
"""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flashtune.keys import DTYPES, PASSES
from flashtune.outcome import TRIAL_STATUSES
from flashtune.runners import RUNNERS

# The key columns besides the GPU, in index order: the numeric dimensions last, so that an
# index prefix serves the lookups of one key family (gpu, dtype, head_dim, causal, pass).
# They are the column names of ``TuningKey.as_dict()``.
KEY_COLUMNS: tuple[str, ...] = ("dtype", "head_dim", "causal", "pass", "seq_q", "seq_k", "group", "batch_heads")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f'"{column}" IN ({", ".join(repr(v) for v in values)})'


def _checks(table: str, **conditions: str) -> list[sa.CheckConstraint]:
    """CHECK constraints named ``ck_<table>_<name>``."""
    return [sa.CheckConstraint(sql, name=f"ck_{table}_{name}") for name, sql in conditions.items()]


def _key_constraints(table: str) -> list[sa.Constraint]:
    """The foreign key and checks of the tuning-key columns (``KeyColumns``)."""
    return [
        sa.ForeignKeyConstraint(["gpu_id"], ["flashtune_gpus.id"], name=f"fk_{table}_gpu_id"),
        *_checks(
            table,
            dtype=_one_of("dtype", DTYPES),
            head_dim="head_dim > 0",
            seq_q="seq_q > 0",
            seq_k="seq_k > 0",
            group='"group" > 0',
            batch_heads="batch_heads > 0",
            **{"pass": _one_of("pass", PASSES)},  # "pass" is a Python keyword
        ),
    ]


class Base(DeclarativeBase):
    pass


class KeyColumns:
    """The tuning-key columns shared by tuned results and trials."""

    gpu_id: Mapped[int]
    dtype: Mapped[str] = mapped_column(sa.String(16))
    head_dim: Mapped[int]
    seq_q: Mapped[int]
    seq_k: Mapped[int]
    group: Mapped[int]
    batch_heads: Mapped[int]
    causal: Mapped[bool]
    pass_: Mapped[str] = mapped_column("pass", sa.String(8))


class Gpu(Base):
    __tablename__ = "flashtune_gpus"
    __table_args__ = (
        sa.UniqueConstraint("key", name="uq_flashtune_gpus_key"),
        *_checks(
            "flashtune_gpus",
            capability="capability_major >= 0 AND capability_minor >= 0",
            sm_count="sm_count >= 0",
            total_memory="total_memory >= 0",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(sa.String(255))
    name: Mapped[str] = mapped_column(sa.String(200))
    capability_major: Mapped[int]
    capability_minor: Mapped[int]
    sm_count: Mapped[int]
    total_memory: Mapped[int] = mapped_column(sa.BigInteger)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class TunedResult(KeyColumns, Base):
    __tablename__ = "flashtune_tuned_results"
    __table_args__ = (
        sa.UniqueConstraint("gpu_id", *KEY_COLUMNS, name="uq_flashtune_tuned_results_key"),
        *_key_constraints("flashtune_tuned_results"),
        *_checks(
            "flashtune_tuned_results",
            time_ms="time_ms > 0",
            tflops="tflops >= 0",
            default_time_ms="default_time_ms IS NULL OR default_time_ms > 0",
            error="error >= 0",
            n_trials="n_trials >= 0",
            runner=_one_of("runner", RUNNERS),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    config: Mapped[dict] = mapped_column(sa.JSON)
    time_ms: Mapped[float] = mapped_column(sa.Double)
    tflops: Mapped[float] = mapped_column(sa.Double)
    default_time_ms: Mapped[float | None] = mapped_column(sa.Double)
    error: Mapped[float] = mapped_column(sa.Double)
    n_trials: Mapped[int]
    runner: Mapped[str] = mapped_column(sa.String(32))  # flashtune.runners: what serves the key
    # each runner's GPU and eager ms, measured in one run, and what chose the runner (repository.py)
    runner_times: Mapped[dict | None] = mapped_column(sa.JSON)
    flashtune_version: Mapped[str] = mapped_column(sa.String(64))
    kernel_hash: Mapped[str] = mapped_column(sa.String(64))
    triton_version: Mapped[str] = mapped_column(sa.String(64))
    torch_version: Mapped[str] = mapped_column(sa.String(64))
    cuda_version: Mapped[str] = mapped_column(sa.String(64))
    driver_version: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class Trial(KeyColumns, Base):
    __tablename__ = "flashtune_trials"
    __table_args__ = (
        sa.Index("ix_flashtune_trials_key", "gpu_id", *KEY_COLUMNS, "kernel_hash"),
        *_key_constraints("flashtune_trials"),
        *_checks(
            "flashtune_trials",
            status=_one_of("status", TRIAL_STATUSES),
            time_ms="time_ms IS NULL OR time_ms > 0",
            ok_has_time="status <> 'ok' OR time_ms IS NOT NULL",
            error="error IS NULL OR error >= 0",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    config: Mapped[dict] = mapped_column(sa.JSON)
    status: Mapped[str] = mapped_column(sa.String(32))
    time_ms: Mapped[float | None] = mapped_column(sa.Double)
    error: Mapped[float | None] = mapped_column(sa.Double)
    message: Mapped[str] = mapped_column(sa.Text)
    study: Mapped[str | None] = mapped_column(sa.String(200))
    kernel_hash: Mapped[str] = mapped_column(sa.String(64))
    triton_version: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


CLAIM_STATES: tuple[str, ...] = ("claimed", "done")


class KeyClaim(Base):
    """A search's claim on a tuning key (``flashtune.store.claims``)."""

    __tablename__ = "flashtune_key_claims"
    __table_args__ = (
        sa.UniqueConstraint("key_identity", name="uq_flashtune_key_claims_key_identity"),
        sa.Index("ix_flashtune_key_claims_holder", "holder", "state"),
        *_checks(
            "flashtune_key_claims",
            state="state IN ('claimed', 'done')",
            trials="trials IS NULL OR trials > 0",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    key_identity: Mapped[str] = mapped_column(sa.Text)
    kernel_hash: Mapped[str] = mapped_column(sa.String(64))
    holder: Mapped[str] = mapped_column(sa.String(255))
    state: Mapped[str] = mapped_column(sa.String(16))
    lease_expires_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    trials: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class StoreInfo(Base):
    """Name/value facts about the store itself; ``store_id`` is its identity."""

    __tablename__ = "flashtune_store_info"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[str] = mapped_column(sa.Text)


class RecordedCallRow(KeyColumns, Base):
    """A call signature the dispatcher served without a tuned key of its own (flashtune.recording)."""

    __tablename__ = "flashtune_recorded_calls"
    __table_args__ = (
        sa.UniqueConstraint("gpu_id", *KEY_COLUMNS, "batch", "heads_q", "heads_kv",
                            name="uq_flashtune_recorded_calls_call"),
        *_key_constraints("flashtune_recorded_calls"),
        *_checks(
            "flashtune_recorded_calls",
            shape="batch > 0 AND heads_q > 0 AND heads_kv > 0",
            calls="calls >= 0",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    batch: Mapped[int]
    heads_q: Mapped[int]
    heads_kv: Mapped[int]
    calls: Mapped[int] = mapped_column(sa.BigInteger)
    first_seen: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)
