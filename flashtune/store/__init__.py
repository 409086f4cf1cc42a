"""The tuned-config store: what a search learns and what the dispatcher serves.

Use ``Store(url)`` (a SQLAlchemy URL, a SQLite file path, or None for ``FLASHTUNE_DB`` /
the user data dir's ``flashtune/tuned.db``). SQLite and PostgreSQL are supported; every
method is one transaction, and database failures raise ``StoreError`` with the cause
chained. ``upgrade(url)`` migrates a database to this flashtune's schema (``flashtune db
upgrade``); opening a store whose schema is behind or ahead raises an error that says
what to run.

Tables (all prefixed ``flashtune_``, so the store can share a database with Optuna's):

``flashtune_gpus``
    One row per GPU, unique on ``key`` (``GpuInfo.key``, name plus compute capability);
    name, capability major/minor, SM count, total memory (bytes), created/updated.

``flashtune_tuned_results``
    The winner of each tuning key: unique on (gpu_id, dtype, head_dim, causal, pass,
    seq_q, seq_k, group, batch_heads) (the columns of ``TuningKey.as_dict()``; schema 0002,
    which made 0001's ``seq_len`` rows keys of the standard grid), the index also serving
    lookups of a GPU or a key family. ``config`` (JSON,
    validated with ``FwdConfig``/``BwdConfig.from_dict`` on load), ``time_ms`` (median),
    ``tflops``, ``default_time_ms`` (the heuristic default's time in the same run, NULL
    if it could not run), ``error`` (correctness error measured), ``n_trials``, the
    provenance columns (flashtune, kernel source hash, triton, torch, CUDA, driver
    versions), created/updated. CHECKs: dtype and pass enums, positive sizes and times.

``flashtune_trials``
    Every trial's outcome, append-only: the key columns, ``config`` (JSON), ``status``
    (CHECK: ok, incorrect, compile_error, out_of_resources, crashed, timeout),
    ``time_ms`` (required when ok), ``error`` (NULL if not measured, infinity for NaN),
    ``message``, ``study`` (the search's name), ``kernel_hash`` and ``triton_version``
    (a warm start skips only configs measured with the same kernel), created. Indexed
    on the key columns plus kernel_hash.

``flashtune_key_claims``
    A search's claim on a tuning key (``flashtune.store.claims``): ``key_identity``
    (unique: the key's JSON, sorted keys), ``kernel_hash``, ``holder`` (host:pid:uuid),
    ``state`` (CHECK: claimed, done), ``lease_expires_at``, ``trials`` (the budget a done
    key was finished with), created/updated. Indexed on (holder, state).

``flashtune_store_info``
    Name/value rows about the store; ``store_id`` is its identity (a random hex id),
    which the Optuna study names carry.

Both key-carrying tables reference ``flashtune_gpus.id``. Timestamps are UTC. Alembic's
version table is ``flashtune_alembic_version``.
"""

from flashtune.store.engine import ENV_VAR, default_path, resolve_url
from flashtune.store.errors import NoStoreError, SchemaBehindError, SchemaNewerError, StoreError
from flashtune.store.migrations import VERSION_TABLE, current_revision, head_revision, upgrade
from flashtune.store.models import TRIAL_STATUSES
from flashtune.store.records import ImportSummary, ResultFilter, StoredResult, TrialRecord
from flashtune.store.repository import ON_CONFLICT, Store

__all__ = [
    "ENV_VAR", "ON_CONFLICT", "TRIAL_STATUSES", "VERSION_TABLE", "ImportSummary", "NoStoreError",
    "ResultFilter", "SchemaBehindError", "SchemaNewerError", "Store", "StoreError", "StoredResult", "TrialRecord",
    "current_revision", "default_path", "head_revision", "resolve_url", "upgrade",
]
