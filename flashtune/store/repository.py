"""``Store``: the store's operations, each one transaction.

(Over 400 lines on purpose: every operation on the store's rows is one method of ``Store``,
so a caller finds all of them in one place; the claims' SQL lives in ``store/claims.py``,
the rows' checks in ``store/records.py``.)
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from flashtune.keys import GpuInfo, RecordedCall, TuningKey
from flashtune.outcome import Outcome
from flashtune.provenance import Provenance
from flashtune.store.engine import (ENV_VAR, upsert_insert, asks_read_only, cannot_write, create_store_engine, ensure_directory,
                                    resolve_url, show_url, sqlite_path, transaction, use_wal, wrap_errors)
from flashtune.store.claims import KeyClaims, forget, store_id
from flashtune.store.errors import NoStoreError, StoreError
from flashtune.store.migrations import database_revision, head_revision, migrate, schema_error, unversioned_check
from flashtune.store.models import KEY_COLUMNS, Gpu, RecordedCallRow, Trial, TunedResult, utcnow
from flashtune.store.records import (
    ImportSummary,
    ResultFilter,
    StoredResult,
    TrialRecord,
    as_utc,
    check_config,
    load_config,
)

ON_CONFLICT = ("error", "skip", "replace", "keep_faster")
PROVENANCE_COLUMNS = ("flashtune_version", "kernel_hash", "triton_version", "torch_version", "cuda_version",
                      "driver_version")
_KEY_INDEX = ("gpu_id", *KEY_COLUMNS)  # the unique key of tuned results
ANY_RESULT = object()  # save_result's ``replacing`` not given: whatever is stored


class Store:
    """The tuned-config store in one database (a SQLAlchemy URL, a SQLite path, or None).

    Opening checks the schema. A database without flashtune's tables gets them (unless
    ``create=False``); one at an older revision raises ``SchemaBehindError`` naming
    ``flashtune db upgrade``; one written by a newer flashtune raises ``SchemaNewerError``.
    Every method is one transaction and raises ``StoreError`` when the database fails;
    bad arguments raise ``ValueError`` before anything is written.

    ``create=False`` opens only an existing store, read-only where this process cannot
    write its SQLite file or directory (``read_only``). ``lock_timeout_s`` bounds each
    wait for a lock (see ``create_store_engine``); a lock timeout's error names what
    holds the lock where it can be found.
    """

    def __init__(self, url: str | os.PathLike | sa.URL | None = None, *, create: bool = True,
                 lock_timeout_s: float | None = None) -> None:
        self.url = resolve_url(url)
        path = sqlite_path(self.url)
        if not create and path is not None and not path.exists():
            raise NoStoreError(f"no flashtune store at {path}")
        if create and url is None and not os.environ.get(ENV_VAR):
            ensure_directory(self.url)  # the default location's; a path given by hand must exist (typos)
        self.read_only = asks_read_only(self.url) or (not create and cannot_write(self.url))
        self._engine = create_store_engine(self.url, lock_timeout_s=lock_timeout_s, read_only=self.read_only)
        try:
            self._check_schema(create)
        except BaseException:
            self._engine.dispose()
            raise

    def __repr__(self) -> str:
        return f"Store({show_url(self.url)!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the store's connections."""
        self._engine.dispose()

    @property
    def claims(self):
        """The claims on tuning keys (``flashtune.store.claims.KeyClaims``)."""
        return KeyClaims(self)

    def store_id(self) -> str:
        """The store's identity (a random hex id; a new one after ``clear``)."""
        return store_id(self)

    def _check_schema(self, create: bool) -> None:
        where = show_url(self.url)
        with self._transaction(f"open the store at {where}") as session:
            revision = database_revision(session.connection())
            if revision is None:
                unversioned_check(session.connection(), self.url)
        if revision is not None and revision != head_revision():
            raise schema_error(revision, self.url)
        if revision is None:
            if not create:
                raise self._no_store_error(where)
            migrate(self._engine, self.url)  # under a lock: finds the work done if another process did it
        if not self.read_only:
            with wrap_errors(f"open the store at {where}"):
                use_wal(self._engine)

    def _no_store_error(self, where: str) -> StoreError:
        """Why a database without flashtune's tables is no store: another program's database, or one
        with no tables at all, which reads as no store yet (an empty file, or the first search or
        import is creating the store at this moment)."""
        with self._transaction(f"open the store at {where}") as session:
            empty = not sa.inspect(session.connection()).get_table_names()
        if empty:
            return NoStoreError(f"no flashtune store at {where} yet: the database is empty (a search or import "
                                "may be creating it now)")
        return StoreError(f"the database at {where} holds no flashtune store")

    @contextlib.contextmanager
    def _transaction(self, action: str, *, write: bool = False):
        from flashtune.store.locks import is_lock_error, lock_holders

        try:
            with transaction(self._engine, action, write=write) as session:
                yield session
        except StoreError as e:
            holders = lock_holders(self.url) if is_lock_error(e.__cause__) else ""
            if not holders:
                raise
            raise StoreError(f"{e}; the lock is {holders}") from e.__cause__

    # -- GPUs --------------------------------------------------------------------------

    def upsert_gpu(self, gpu: GpuInfo) -> None:
        """Record a GPU (or update its SM count and memory); needed before its trials."""
        with self._transaction(f"record GPU {gpu.key}", write=True) as session:
            _upsert_gpu(session, gpu)

    def list_gpus(self) -> list[GpuInfo]:
        with self._transaction("list GPUs") as session:
            return [_gpu_info(gpu) for gpu in session.scalars(sa.select(Gpu).order_by(Gpu.key))]

    # -- trials ------------------------------------------------------------------------

    def record_trial(self, key: TuningKey, config, outcome: Outcome, *, provenance: Provenance,
                     study: str | None = None) -> int:
        """Record one trial's outcome and return its id; the key's GPU must be recorded.

        An ``ok`` outcome needs ``time_ms``. A NaN ``error`` (the kernel produced NaN) is
        stored as infinity.
        """
        if not isinstance(outcome, Outcome):
            raise ValueError(f"outcome: expected an Outcome, got {type(outcome).__name__}")
        outcome.check()
        check_config(key, config)
        with self._transaction(f"record a trial of {key.label()} on {key.gpu}", write=True) as session:
            values = {
                **_key_values(key, _known_gpu_id(session, key.gpu)),
                "config": config.to_dict(), "status": outcome.status, "time_ms": outcome.time_ms,
                "error": outcome.stored_error(), "message": outcome.message, "study": study,
                "kernel_hash": provenance.kernel_hash, "triton_version": provenance.triton_version,
            }
            return session.execute(sa.insert(Trial.__table__).values(values).returning(Trial.id)).scalar_one()

    def trials_for(self, key: TuningKey, *, kernel_hash: str | None = None) -> list[TrialRecord]:
        """The trials of one key, oldest first; only those of one kernel version if given."""
        conditions = _conditions(Trial, ResultFilter.for_key(key))
        if kernel_hash is not None:
            conditions.append(Trial.kernel_hash == kernel_hash)
        with self._transaction(f"read the trials of {key.label()} on {key.gpu}") as session:
            rows = session.scalars(sa.select(Trial).where(*conditions).order_by(Trial.id))
            return [_trial_record(row, key) for row in rows]

    # -- tuned results -----------------------------------------------------------------

    def save_result(self, result: StoredResult, *, replace: bool = False, replacing=ANY_RESULT) -> bool:
        """Store a search's winner; an existing faster result stays unless ``replace``.

        ``replacing`` (with ``replace``): the stored result as the caller read it
        (``list_results``; None: the key had none). It is replaced only while it is still that
        one; a result written since (an import, another search), which the caller never
        measured, stays where it is faster. Returns whether ``result`` is now the stored one.
        """
        summary = self._write_results([result], "replace" if replace else "keep_faster",
                                      f"save the result of {result.key.label()} on {result.key.gpu}",
                                      replacing=replacing)
        return summary.kept == 0

    def import_results(self, results: Iterable[StoredResult], *, on_conflict: str = "error",
                       dry_run: bool = False) -> ImportSummary:
        """Store many results in one transaction: all of them, or on any error none.

        ``on_conflict`` says what to do where a key already has a result: ``error`` (the
        import fails), ``skip`` (keep the stored one), ``replace``, or ``keep_faster`` (the
        faster, except that a current result is never replaced by a stale one: ``_faster``).
        ``dry_run``: do every write, report, and roll the transaction back (so the report
        follows the same rules as a real import).
        """
        if on_conflict not in ON_CONFLICT:
            raise ValueError(f"on_conflict: expected one of {', '.join(ON_CONFLICT)}, got {on_conflict!r}")
        results = list(results)
        return self._write_results(results, on_conflict, f"import {len(results)} results", dry_run=dry_run)

    def _write_results(self, results: list[StoredResult], on_conflict: str, action: str, *,
                       dry_run: bool = False, replacing=ANY_RESULT) -> ImportSummary:
        seen: set[TuningKey] = set()
        for i, result in enumerate(results):
            try:
                result.check()
            except ValueError as e:
                raise ValueError(f"results[{i}] ({result.key.label()} on {result.key.gpu}): {e}") from e
            if result.key in seen:
                raise ValueError(f"results[{i}]: {result.key.label()} on {result.key.gpu} appears twice")
            seen.add(result.key)
        gpus = {result.gpu.key: result.gpu for result in results}
        outcomes: collections.Counter[str] = collections.Counter()
        try:
            with self._transaction(action, write=True) as session:
                # GPU rows first, in one order: on PostgreSQL their row locks then serialize
                # the writers of one GPU, so two imports cannot deadlock on result rows.
                gpu_ids = {gpu_key: _upsert_gpu(session, gpus[gpu_key]) for gpu_key in sorted(gpus)}
                for result in results:
                    outcomes[_write_result(session, result, gpu_ids[result.key.gpu], on_conflict, replacing)] += 1
                if dry_run:
                    raise _RollBack  # leaves the transaction through its rollback path
        except _RollBack:
            pass
        return ImportSummary(**outcomes)

    def record_calls(self, calls) -> None:
        """Add recorded calls (``flashtune.keys.RecordedCall``; their GPUs recorded):
        a new signature is inserted, a known one gets its ``calls`` added."""
        table = RecordedCallRow.__table__
        with self._transaction(f"record {len(calls)} calls", write=True) as session:
            for call in calls:
                values = {**_key_values(call.key, _known_gpu_id(session, call.key.gpu)), "batch": call.batch,
                          "heads_q": call.heads_q, "heads_kv": call.heads_kv}
                now = utcnow()
                query = upsert_insert(session, table).values(**values, calls=call.calls, first_seen=now, last_seen=now)
                session.execute(query.on_conflict_do_update(
                    index_elements=["gpu_id", *KEY_COLUMNS, "batch", "heads_q", "heads_kv"],
                    set_={"calls": table.c.calls + query.excluded.calls, "last_seen": now}))

    def recorded_calls(self, gpu: str | None = None) -> list:
        """The recorded calls (of one GPU key if given), the most called first."""
        query = sa.select(RecordedCallRow, Gpu.key).join(Gpu, RecordedCallRow.gpu_id == Gpu.id)
        if gpu is not None:
            query = query.where(Gpu.key == gpu)
        with self._transaction("list the recorded calls") as session:
            rows = session.execute(query.order_by(RecordedCallRow.calls.desc(), RecordedCallRow.id)).all()
            return [RecordedCall(TuningKey(gpu_key, r.dtype, r.head_dim, r.seq_q, r.causal, r.pass_, seq_k=r.seq_k,
                                           group=r.group, batch_heads=r.batch_heads),
                                 r.batch, r.heads_q, r.heads_kv, r.calls, as_utc(r.first_seen), as_utc(r.last_seen))
                    for r, gpu_key in rows]

    def load_table(self, gpu: str | GpuInfo, *, damaged: list[str] | None = None) -> dict[TuningKey, StoredResult]:
        """Every tuned result of one GPU (a ``GpuInfo`` or its key), by tuning key
        (``damaged`` as in ``list_results``)."""
        gpu_key = gpu.key if isinstance(gpu, GpuInfo) else gpu
        return {result.key: result for result in self.list_results(ResultFilter(gpu=gpu_key), damaged=damaged)}

    def list_results(self, where: ResultFilter | None = None, *,
                     damaged: list[str] | None = None) -> list[StoredResult]:
        """The tuned results that match ``where`` (all by default), in key order.

        A damaged row (its config is not JSON or does not validate, or a figure is out of the
        bounds a save applies) raises ``StoreError``
        naming the row; given a ``damaged`` list, the row is skipped instead and that
        message appended to it, so one bad row does not hide the others.
        """
        where = where or ResultFilter()
        # The config is read as text and parsed here: the driver's JSON decoding would
        # fail the whole query on one damaged row, naming none.
        query = (
            sa.select(TunedResult, Gpu, sa.cast(TunedResult.config, sa.Text))
            .options(sa.orm.defer(TunedResult.config))
            .join(Gpu, TunedResult.gpu_id == Gpu.id)
            .where(*_conditions(TunedResult, where))
            .order_by(Gpu.key, *(TunedResult.__table__.c[name] for name in KEY_COLUMNS))
        )
        results, configs = [], {}
        with self._transaction(f"list results ({where.describe()})") as session:
            for row, gpu, config_text in session.execute(query):
                try:
                    results.append(_stored_result(row, gpu, config_text, configs))
                except StoreError as e:
                    if damaged is None:
                        raise
                    damaged.append(str(e))
        return results

    def clear(self) -> int:
        """Delete every tuned result, trial, GPU and key claim (the schema stays), and give
        the store a new identity; return how many results there were."""
        with self._transaction("clear the store", write=True) as session:
            forget(session)
            session.execute(sa.delete(Trial))
            session.execute(sa.delete(RecordedCallRow))
            count = session.execute(sa.delete(TunedResult)).rowcount
            session.execute(sa.delete(Gpu))
            return count

    def delete_results(self, where: ResultFilter) -> int:
        """Delete the tuned results that match ``where`` and return how many; an empty
        filter deletes them all. Trials stay (they are the audit log)."""
        query = sa.delete(TunedResult).where(*_conditions(TunedResult, where))
        with self._transaction(f"delete results ({where.describe()})", write=True) as session:
            return session.execute(query, execution_options={"synchronize_session": False}).rowcount


# -- helpers: one statement or one conversion each -------------------------------------


def _upsert_gpu(session: Session, gpu: GpuInfo) -> int:
    values = {
        "name": gpu.name, "capability_major": gpu.capability[0], "capability_minor": gpu.capability[1],
        "sm_count": gpu.sm_count, "total_memory": gpu.total_memory,
    }
    query = (
        upsert_insert(session, Gpu.__table__)
        .values(key=gpu.key, **values)
        .on_conflict_do_update(index_elements=["key"], set_={**values, "updated_at": utcnow()})
        .returning(Gpu.id)
    )
    return session.execute(query).scalar_one()


def _known_gpu_id(session: Session, gpu_key: str) -> int:
    gpu_id = session.scalar(sa.select(Gpu.id).where(Gpu.key == gpu_key))
    if gpu_id is None:
        raise StoreError(f"GPU {gpu_key!r} is not in the store: record it first with Store.upsert_gpu(GpuInfo)")
    return gpu_id


def _key_values(key: TuningKey, gpu_id: int) -> dict:
    """The key columns of a row, by column name."""
    return {"gpu_id": gpu_id, **key.as_dict(gpu=False)}


def _conditions(model: type[TunedResult | Trial], where: ResultFilter) -> list:
    conditions = []
    if where.gpu is not None:
        conditions.append(model.gpu_id == sa.select(Gpu.id).where(Gpu.key == where.gpu).scalar_subquery())
    for name in ("dtype", "head_dim", "seq_q", "seq_k", "group", "batch_heads", "causal", "pass_"):
        value = getattr(where, name)
        if value is not None:
            conditions.append(getattr(model, name) == value)
    return conditions


class _RollBack(Exception):
    """Raised inside a transaction to undo it (a dry run)."""


def _write_result(session: Session, result: StoredResult, gpu_id: int, on_conflict: str,
                  replacing=ANY_RESULT) -> str:
    """Write one result under the ``on_conflict`` policy; say whether it was inserted,
    replaced an existing one, or the existing one was kept (``replacing``: as save_result)."""
    table = TunedResult.__table__
    values = {
        "config": result.config.to_dict(), "time_ms": result.time_ms, "tflops": result.tflops,
        "default_time_ms": result.default_time_ms, "error": result.error, "n_trials": result.n_trials,
        "runner": result.runner, "runner_times": _runner_times_json(result),
        **{name: getattr(result.provenance, name) for name in PROVENANCE_COLUMNS},
    }
    key_values = _key_values(result.key, gpu_id)
    where = [table.c[name] == value for name, value in key_values.items()]
    # Nobody else writes this row before we do: the caller holds the GPU row's lock on
    # PostgreSQL, and SQLite's IMMEDIATE transaction excludes other writers.
    row = session.execute(sa.select(table.c.created_at, table.c.updated_at).where(*where)).first()
    existed = row is not None
    if existed and on_conflict == "replace" and replacing is not ANY_RESULT and (
            replacing is None or (as_utc(row.created_at), as_utc(row.updated_at))
            != (replacing.created_at, replacing.updated_at)):
        on_conflict = "keep_faster"  # written since the caller read it: the faster stays
    if existed and on_conflict == "error":
        raise StoreError(f"{result.key.label()} on {result.key.gpu} already has a result; import with "
                         "on_conflict='skip', 'replace' or 'keep_faster' to resolve it")
    query = upsert_insert(session, table).values(**key_values, **values)
    if on_conflict == "skip":
        query = query.on_conflict_do_nothing(index_elements=list(_KEY_INDEX))
    elif on_conflict in ("replace", "keep_faster"):
        query = query.on_conflict_do_update(
            index_elements=list(_KEY_INDEX),
            set_={**{name: query.excluded[name] for name in values}, "updated_at": utcnow()},
            where=_faster(table, query, result) if on_conflict == "keep_faster" else None,
        )
    written = session.execute(query.returning(table.c.id)).first() is not None
    return "kept" if not written else "replaced" if existed else "inserted"


def _faster(table: sa.Table, query, result: StoredResult):
    """keep_faster's rule, as the condition under which ``result`` replaces the stored row: a current
    row (tuned under this installation's kernel sources and triton) is never replaced by a stale
    one, a stale row always by a current one; between two of one kind, the faster wins. So an
    import of an old table keeps every key that serves, and fills in the others."""
    from flashtune.provenance import installed_triton_version, is_current, kernel_source_hash

    stored_current = sa.and_(table.c.kernel_hash == kernel_source_hash(),
                             table.c.triton_version == installed_triton_version())
    faster = query.excluded.time_ms < table.c.time_ms
    if is_current(result.provenance):
        return sa.or_(sa.not_(stored_current), faster)
    return sa.and_(sa.not_(stored_current), faster)


# The runner_times column (JSON) holds each raced runner's {"gpu_ms", "eager_ms"} and, under this
# key (no runner's name), what chose the runner; a row written before runners had both times holds
# {runner: ms}, read as GPU times (StoredResult). One JSON value, so the schema did not change.
CHOSEN_BY_FIELD = "chosen_by"


def _runner_times_json(result: StoredResult) -> dict | None:
    from flashtune.runners import times_as_dicts

    if result.runner_times is None:
        return None
    value = times_as_dicts(result.runner_times)
    return value if result.chosen_by is None else {**value, CHOSEN_BY_FIELD: result.chosen_by}


def _runner_times_of(value) -> dict:
    """StoredResult's runner_times and chosen_by of the column's value (one it cannot read goes to
    StoredResult as it is, whose check names it)."""
    if not isinstance(value, dict):
        return {"runner_times": value}
    value = dict(value)
    return {"chosen_by": value.pop(CHOSEN_BY_FIELD, None), "runner_times": value}


def _gpu_info(gpu: Gpu) -> GpuInfo:
    return GpuInfo(gpu.name, (gpu.capability_major, gpu.capability_minor), gpu.sm_count, gpu.total_memory)


def _stored_result(row: TunedResult, gpu: Gpu, config_text: str, configs: dict) -> StoredResult:
    """The row as a result; ``configs`` holds the configs read so far by (pass, JSON text): a
    table's keys share a few configs, and validating each row's anew made loading a large store
    (a team's, tens of thousands of keys) take seconds."""
    where = f"tuned result #{row.id}"
    try:
        key = TuningKey(gpu.key, row.dtype, row.head_dim, row.seq_q, row.causal, row.pass_, seq_k=row.seq_k,
                        group=row.group, batch_heads=row.batch_heads)
    except ValueError as e:
        raise StoreError(f"{where} on {gpu.key} has an invalid key: {e}; delete it with `flashtune delete`") from e
    where = f"{where} ({key.label()} on {gpu.key})"
    config = configs.get((row.pass_, config_text))
    if config is None:
        try:
            data = json.loads(config_text)
        except (TypeError, ValueError) as e:
            raise StoreError(f"{where} has a damaged config ({e}: {_short_text(config_text)}); delete it with "
                             "`flashtune delete` or tune that key again") from e
        config = configs[row.pass_, config_text] = load_config(row.pass_, data, where)
    provenance = Provenance(
        **{name: getattr(row, name) for name in PROVENANCE_COLUMNS},
        gpu_name=gpu.name, capability=f"{gpu.capability_major}.{gpu.capability_minor}", sm_count=gpu.sm_count,
    )
    result = StoredResult(
        key=key,
        config=config,
        time_ms=row.time_ms, tflops=row.tflops, default_time_ms=row.default_time_ms, error=row.error,
        n_trials=row.n_trials, gpu=_gpu_info(gpu), provenance=provenance, runner=row.runner,
        **_runner_times_of(row.runner_times), created_at=as_utc(row.created_at),
        updated_at=as_utc(row.updated_at),
    )
    # the bounds a save and an import apply to the figures, on the way out too: a row written
    # before them, or by hand (a time of 5e-324 made the speed-up inf and `list --json` failed
    # for every row). Not the config's device rules: they are the dispatcher's, per device.
    try:
        result.check_numbers()
    except ValueError as e:
        raise StoreError(f"{where} holds a value flashtune cannot show or serve ({e}); delete it with "
                         "`flashtune delete` or tune that key again") from e
    return result


def _trial_record(row: Trial, key: TuningKey) -> TrialRecord:
    return TrialRecord(
        id=row.id, key=key, config=load_config(row.pass_, row.config, f"trial #{row.id} ({key.label()} on {key.gpu})"),
        outcome=Outcome(row.status, time_ms=row.time_ms, error=row.error, message=row.message), study=row.study,
        kernel_hash=row.kernel_hash, triton_version=row.triton_version, created_at=as_utc(row.created_at),
    )


def _short_text(text) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."
