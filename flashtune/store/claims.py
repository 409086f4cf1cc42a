"""Claims on tuning keys, with leases, so that searches sharing a store split the keys.

A search claims a key before it searches it (``KeyClaims.claim``): the claim is one
short transaction that inserts the key's row, or takes over a row whose lease expired
(its holder died), or a finished row the caller means to search again; which one
happened is read from the statement's row count, so two searches racing for a key
never both get it (SQLite: the write transaction begins IMMEDIATE; PostgreSQL: the
UPDATE's WHERE is evaluated again on the row another transaction just changed). The
holder renews its leases while it works (``renew``), marks the key done when its
winner is stored (``finish``), and gives back what it did not finish (``release``).

A key is named by ``key_identity``: its ``TuningKey.as_dict()`` as JSON with sorted
keys, so keys that gain fields later need no change here. Times are the database's
clock on PostgreSQL (hosts' clocks differ), this host's on SQLite (one host).

``store_id`` is the store's identity (made by migration 0002; made here if a store
lost it), which the Optuna study names carry.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa

from flashtune.keys import TuningKey
from flashtune.store.engine import upsert_insert
from flashtune.store.models import KeyClaim, StoreInfo, utcnow
from flashtune.store.records import as_utc

STORE_ID = "store_id"


def key_identity(key: TuningKey) -> str:
    """The claims table's name of a key: its JSON form with sorted keys."""
    return json.dumps(key.as_dict(), sort_keys=True, separators=(",", ":"))


def new_holder() -> str:
    """A holder id for one search: ``host:pid:uuid``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def holder_is_dead(holder: str) -> bool:
    """Whether ``holder`` (``host:pid:uuid``) was a process of this host that is gone, so
    its claims need not wait for their leases (another host's holder: never known)."""
    parts = holder.split(":")
    if len(parts) < 3 or ":".join(parts[:-2]) != socket.gethostname() or not parts[-2].isdigit():
        return False
    pid = int(parts[-2])
    if pid == os.getpid():
        return False  # this process: another search of it, alive
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie (killed, not yet reaped) is dead
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


@dataclasses.dataclass(frozen=True)
class Claim:
    """A key's claim row as a claim attempt found or left it."""

    key_identity: str
    holder: str
    state: str  # "claimed" or "done"
    lease_expires_at: datetime
    kernel_hash: str
    trials: int | None  # the budget a done key was finished with
    acquired: bool  # whether the attempt got the key for the caller


class KeyClaims:
    """The claims of one store (``Store.claims``); every method is one transaction."""

    def __init__(self, store) -> None:
        self._store = store

    def _now(self, session) -> datetime:
        if session.get_bind().dialect.name == "postgresql":
            return session.scalar(sa.select(sa.func.now()))
        return utcnow()

    def claim(self, key: TuningKey, holder: str, *, lease_s: float, kernel_hash: str, trials: int,
              retake_done: bool = False, dead_holder: str | None = None) -> Claim:
        """Claim ``key`` for ``holder`` for ``lease_s`` seconds.

        Got when nobody claimed it, when its lease expired, when ``holder`` has it
        already, when ``dead_holder`` (known dead: ``holder_is_dead``) has it, or when
        it is done but under another kernel, with a smaller budget than ``trials``, or
        ``retake_done``. Otherwise the row as it is comes back, with ``acquired``
        False: held by another holder, or done."""
        table = KeyClaim.__table__
        identity = key_identity(key)
        with self._store._transaction(f"claim {key.label()} on {key.gpu}", write=True) as session:
            now = self._now(session)
            lease = now + timedelta(seconds=lease_s)
            mine = dict(holder=holder, state="claimed", lease_expires_at=lease, kernel_hash=kernel_hash,
                        trials=None, updated_at=now)

            inserted = session.execute(upsert_insert(session, table).values(key_identity=identity, created_at=now, **mine)
                                       .on_conflict_do_nothing(index_elements=["key_identity"])).rowcount
            if inserted != 1:
                c = table.c
                takeable = sa.or_(
                    sa.and_(c.state == "claimed", sa.or_(c.lease_expires_at < now, c.holder == holder,
                                                         c.holder == (dead_holder or holder))),
                    sa.and_(c.state == "done", sa.or_(sa.true() if retake_done else sa.false(),
                                                      c.kernel_hash != kernel_hash,
                                                      sa.func.coalesce(c.trials, 0) < trials)),
                )
                inserted = session.execute(sa.update(table).where(c.key_identity == identity, takeable)
                                           .values(**mine)).rowcount
            row = session.execute(sa.select(table).where(table.c.key_identity == identity)).one()
            return _claim(row, acquired=inserted == 1)

    def renew(self, key: TuningKey, holder: str, *, lease_s: float) -> bool:
        """Extend ``holder``'s lease on ``key``; False where it holds it no longer."""
        return self._update_held(f"renew the claim on {key.label()}", key, holder,
                                 lambda now: {"lease_expires_at": now + timedelta(seconds=lease_s)})

    def finish(self, key: TuningKey, holder: str, *, trials: int) -> bool:
        """Mark ``key`` done (its winner is stored) with the budget it was searched with."""
        return self._update_held(f"mark {key.label()} done", key, holder,
                                 lambda now: {"state": "done", "trials": trials, "lease_expires_at": now})

    def _update_held(self, action: str, key: TuningKey, holder: str, values) -> bool:
        """Update ``holder``'s live claim on ``key`` with ``values(now)`` (the database's
        clock); False where it holds it no longer."""
        table = KeyClaim.__table__
        with self._store._transaction(action, write=True) as session:
            now = self._now(session)
            return session.execute(
                sa.update(table).where(table.c.key_identity == key_identity(key), table.c.holder == holder,
                                       table.c.state == "claimed")
                .values(**values(now), updated_at=now)).rowcount == 1

    def release(self, holder: str, key: TuningKey | None = None) -> int:
        """Give back ``holder``'s claims that are not done (one key, or all): their
        leases end now, so any search takes them over. Returns how many."""
        table = KeyClaim.__table__
        where = [table.c.holder == holder, table.c.state == "claimed"]
        if key is not None:
            where.append(table.c.key_identity == key_identity(key))
        with self._store._transaction("release claims", write=True) as session:
            now = self._now(session)
            return session.execute(sa.update(table).where(*where)
                                   .values(lease_expires_at=now, updated_at=now)).rowcount

    def get(self, key: TuningKey) -> Claim | None:
        table = KeyClaim.__table__
        with self._store._transaction(f"read the claim on {key.label()}") as session:
            row = session.execute(sa.select(table).where(table.c.key_identity == key_identity(key))).first()
            return None if row is None else _claim(row, acquired=False)

    def all(self) -> list[Claim]:
        table = KeyClaim.__table__
        with self._store._transaction("list claims") as session:
            return [_claim(row, acquired=False)
                    for row in session.execute(sa.select(table).order_by(table.c.key_identity))]


def _claim(row, *, acquired: bool) -> Claim:
    return Claim(row.key_identity, row.holder, row.state, as_utc(row.lease_expires_at), row.kernel_hash, row.trials,
                 acquired)


def store_id(store) -> str:
    """The store's identity; made (once, race-free) where a store has none."""
    table = StoreInfo.__table__
    with store._transaction("read the store's identity") as session:
        found = session.scalar(sa.select(table.c.value).where(table.c.name == STORE_ID))
    if found:
        return found

    with store._transaction("record the store's identity", write=True) as session:
        session.execute(upsert_insert(session, table).values(name=STORE_ID, value=uuid.uuid4().hex)
                        .on_conflict_do_nothing(index_elements=["name"]))
        return session.scalar(sa.select(table.c.value).where(table.c.name == STORE_ID))


def forget(session) -> None:
    """Inside ``Store.clear``'s transaction: no claims, and a new identity (an emptied
    store is a new store: it inherits no finished study)."""
    session.execute(sa.delete(KeyClaim.__table__))
    table = StoreInfo.__table__
    session.execute(sa.update(table).where(table.c.name == STORE_ID).values(value=uuid.uuid4().hex))
