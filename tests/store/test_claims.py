"""Key claims with leases (flashtune.store.claims), on SQLite and PostgreSQL; migration
0002 upgrades the golden 0001 store and downgrades."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback

import sqlalchemy as sa
from alembic import command
from golden_data import ROWS, golden_path
from store_samples import H200, key, result

from flashtune.keys import TuningKey
from flashtune.store import Store, current_revision, head_revision, migrations, resolve_url, upgrade
from flashtune.store.claims import holder_is_dead, key_identity, new_holder
from flashtune.store.engine import create_store_engine

FORK = multiprocessing.get_context("fork")
HASH = "0123456789abcdef"


def _claim(store, k, holder, *, lease_s=30.0, trials=8, kernel_hash=HASH, retake_done=False, dead_holder=None):
    return store.claims.claim(k, holder, lease_s=lease_s, kernel_hash=kernel_hash, trials=trials,
                              retake_done=retake_done, dead_holder=dead_holder)


def test_a_key_is_named_by_its_sorted_json():
    k = key(2048)
    assert json.loads(key_identity(k)) == k.as_dict()
    assert key_identity(k) == json.dumps(k.as_dict(), sort_keys=True, separators=(",", ":"))
    assert key_identity(k) != key_identity(key(4096))


def test_one_holder_gets_a_key_until_its_lease_expires(store):
    k = key()
    first = _claim(store, k, "a", lease_s=0.5)
    assert first.acquired and first.state == "claimed" and first.holder == "a"
    taken = _claim(store, k, "b")
    assert not taken.acquired and taken.holder == "a"
    assert _claim(store, k, "a", lease_s=0.5).acquired  # the holder's own claim is its own
    assert store.claims.renew(k, "a", lease_s=0.5)
    assert not store.claims.renew(k, "b", lease_s=30)  # not b's to renew
    time.sleep(0.7)
    over = _claim(store, k, "b")
    assert over.acquired and over.holder == "b"  # expired: taken over
    assert not store.claims.renew(k, "a", lease_s=30)  # a lost it
    assert not store.claims.finish(k, "a", trials=8)


def test_a_done_key_is_taken_only_for_more_trials_another_kernel_or_when_asked(store):
    k = key()
    assert _claim(store, k, "a").acquired
    assert store.claims.finish(k, "a", trials=8)
    done = _claim(store, k, "b", trials=8)
    assert not done.acquired and (done.state, done.trials, done.holder) == ("done", 8, "a")
    assert not _claim(store, k, "a", trials=4).acquired  # done by a: a's own claim does not reopen it
    assert _claim(store, k, "b", trials=16).acquired  # a bigger budget searches on
    store.claims.finish(k, "b", trials=16)
    assert _claim(store, k, "c", trials=16, kernel_hash="fedcba9876543210").acquired  # a new kernel
    store.claims.finish(k, "c", trials=16)
    assert _claim(store, k, "d", trials=16, retake_done=True).acquired  # --force
    assert store.claims.get(k).holder == "d"


def test_a_dead_holder_of_this_host_is_known_and_its_claim_taken_at_once(store):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = f"{socket.gethostname()}:{proc.pid}:0123456789ab"
    try:
        assert _claim(store, key(), holder).acquired
        assert not holder_is_dead(holder)
        assert not _claim(store, key(), "b").acquired
    finally:
        proc.kill()
        proc.wait()
    assert holder_is_dead(holder)
    assert not holder_is_dead(f"other-host:{proc.pid}:0123456789ab")  # another host's: never known
    assert not holder_is_dead(new_holder())  # this process
    assert not _claim(store, key(), "b").acquired  # the lease still runs...
    assert _claim(store, key(), "b", dead_holder=holder).acquired  # ...but its holder is known dead
    assert not _claim(store, key(), "c", dead_holder=holder).acquired  # b's now


def test_release_gives_back_what_is_not_done(store):
    a, b, c = key(256), key(512), key(1024)
    for k in (a, b, c):
        assert _claim(store, k, "x").acquired
    store.claims.finish(c, "x", trials=8)
    assert store.claims.release("x", a) == 1
    assert _claim(store, a, "y").acquired
    assert store.claims.release("x") == 1  # b; c is done and stays so
    assert _claim(store, b, "y").acquired
    assert not _claim(store, c, "y").acquired


def test_clearing_the_store_forgets_the_claims_and_changes_its_identity(store):
    before = store.store_id()
    assert store.store_id() == before and len(before) == 32
    _claim(store, key(), "x")
    store.clear()
    assert store.claims.all() == []
    assert store.store_id() != before


def test_a_store_that_lost_its_identity_gets_one(db_url):
    upgrade(db_url)
    engine = create_store_engine(resolve_url(db_url))
    with engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM flashtune_store_info"))
    engine.dispose()
    with Store(db_url) as store:
        made = store.store_id()
        assert len(made) == 32 and store.store_id() == made


def _racer(url: str, holder: str, keys: list, barrier, out) -> None:
    try:
        with Store(url) as store:
            barrier.wait()
            got = [k for k in keys if _claim(store, k, holder).acquired]
        out.put((holder, got))
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(1)


def test_racing_processes_never_get_one_key_twice(db_url):
    keys = [key(256 * (i + 1)) for i in range(24)]
    with Store(db_url):
        pass  # the schema, made once
    barrier, out = FORK.Barrier(4), FORK.Queue()
    racers = [FORK.Process(target=_racer, args=(db_url, f"h{i}", keys if i % 2 else keys[::-1], barrier, out))
              for i in range(4)]
    for process in racers:
        process.start()
    got = dict(out.get(timeout=60) for _ in racers)
    for process in racers:
        process.join(timeout=30)
        assert process.exitcode == 0
    won = [k for keys_won in got.values() for k in keys_won]
    assert sorted(won) == sorted(keys), got  # every key exactly once
    with Store(db_url) as store:
        holders = {c.key_identity: c.holder for c in store.claims.all()}
    assert all(holders[key_identity(k)] == h for h, ks in got.items() for k in ks)


# -- migration 0002 ----------------------------------------------------------------------------


def _tables(url) -> set[str]:
    engine = create_store_engine(resolve_url(url))
    with engine.connect() as connection:
        names = set(sa.inspect(connection).get_table_names())
    engine.dispose()
    return names


def _golden_0001(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        shutil.copyfile(golden_path("0001"), resolve_url(db_url).database)
        return
    from golden_data import insert_rows

    upgrade(db_url, "0001")
    engine = create_store_engine(resolve_url(db_url))
    with engine.begin() as connection:
        insert_rows(connection, ROWS["0001"])
        for table in ROWS["0001"]:  # rows came with their ids: move the sequences past them
            connection.execute(sa.text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                       f"(SELECT max(id) FROM {table}))"))
    engine.dispose()


def test_0003_upgrades_the_golden_0001_store_and_downgrades(db_url):
    _golden_0001(db_url)
    assert upgrade(db_url, "0003") == "0003"
    assert {"flashtune_key_claims", "flashtune_store_info"} <= _tables(db_url)
    upgrade(db_url)
    with Store(db_url) as store:
        identity = store.store_id()
        assert len(identity) == 32 and int(identity, 16) >= 0  # made by the migration: hex
        assert len(store.load_table(H200)) == len(ROWS["0001"]["flashtune_tuned_results"])
        k = TuningKey(H200.key, "bfloat16", 128, 4096, True, "fwd")
        assert _claim(store, k, "x").acquired
        store.save_result(result(key(8192)))
    url = resolve_url(db_url)
    engine = create_store_engine(url)
    with engine.begin() as connection:
        command.downgrade(migrations.alembic_config(url, connection), "0001")
    engine.dispose()
    assert current_revision(db_url) == "0001"
    assert not {"flashtune_key_claims", "flashtune_store_info"} & _tables(db_url)
    assert upgrade(db_url) == head_revision()  # and up again, with a new identity and no claims
    with Store(db_url) as store:
        assert store.claims.all() == [] and store.store_id() != identity
        assert len(store.load_table(H200)) == len(ROWS["0001"]["flashtune_tuned_results"]) + 1
