"""Fuzzing the import: malformed, truncated and mutated files never change the store.

Two generators over a valid export of ``table()``:

- byte mutations (replace, insert, delete, truncate): what a damaged or hand-edited
  file looks like; nearly all fail at JSON parsing or at the checksum;
- structural mutations with the checksum recomputed (a leaf replaced by an arbitrary
  JSON value, a field dropped or added, an entry duplicated): these get past the
  checksum, so the schema itself must reject them.

The store already holds ``table()`` and the import runs with ``on_conflict="skip"``, so a
file that is accepted may add keys but never alter one: every stored key keeps its
result, every added key holds exactly the file's entry, and everything stored still
renders as JSON (finite speed-ups: what `flashtune list --json` prints); the store is
then restored. Every rejection must be an ``ExchangeError`` with a one-line message
(raised before the store is touched), and the store stays as it was. Each generator
must reach both outcomes, so neither branch is checked vacuously.
"""

from __future__ import annotations

import copy
import json

from exchange_samples import snapshot, table, without_timestamps
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashtune.store import ResultFilter, Store
from flashtune.store.exchange import (
    ExchangeError,
    checksum,
    dump_export,
    entry_dict,
    import_export,
    parse_export,
)

VALID = dump_export(table())
FUZZ = settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _mutate(data: bytes, mutations) -> bytes:
    buffer = bytearray(data)
    for op, position, byte in mutations:
        if not buffer:
            break
        i = position % len(buffer)
        if op == "replace":
            buffer[i] = byte
        elif op == "insert":
            buffer.insert(i, byte)
        elif op == "delete":
            del buffer[i]
        else:  # truncate
            del buffer[i:]
    return bytes(buffer)


def _try_import(store: Store, data: bytes, original) -> bool:
    """Import ``data``; on rejection check the store is unchanged, on acceptance check what
    it holds. Return whether it was accepted."""
    try:
        export = parse_export(data)
        summary = import_export(store, export, on_conflict="skip")
    except ExchangeError as e:
        message = str(e)
        assert message and "\n" not in message, repr(message)
        assert snapshot(store) == original
        return False
    # accepted: a mutation the format allows (or one that added keys)
    before = {r.key: r for r in without_timestamps(original[0])}
    held = {r.key: r for r in without_timestamps(store.list_results())}
    incoming = {r.key: r for r in export.results}
    assert {k: held[k] for k in before} == before  # "skip": no stored key altered
    assert {k: r for k, r in held.items() if k not in before} == {k: r for k, r in incoming.items() if k not in before}
    assert summary.inserted == len(set(incoming) - set(before)) and summary.kept == len(set(incoming) & set(before))
    json.dumps([dict(entry_dict(r), speedup=r.speedup) for r in held.values()], allow_nan=False)
    if snapshot(store) != original:  # put the store back
        store.delete_results(ResultFilter())
        store.import_results(table())
        assert snapshot(store) == original
    return True


def _store(tmp_path) -> tuple[Store, tuple]:
    store = Store(tmp_path / "fuzz.db")
    store.import_results(table())
    return store, snapshot(store)


mutation_lists = st.lists(
    st.tuples(st.sampled_from(["replace", "insert", "delete", "truncate"]), st.integers(0, len(VALID) - 1),
              st.integers(0, 255)),
    min_size=1, max_size=4,
)


def test_byte_mutations_never_change_the_store(tmp_path):
    store, original = _store(tmp_path)
    accepted, rejected = [], []

    @FUZZ
    @given(mutations=mutation_lists)
    def check(mutations):
        data = _mutate(VALID, mutations)
        (accepted if _try_import(store, data, original) else rejected).append(data)

    try:
        check()
    finally:
        store.close()
    assert accepted and rejected
    # whatever was accepted holds the same results as the valid file (only formatting changed)
    for data in accepted:
        assert set(parse_export(data).results) == set(table())


json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20), st.sampled_from(["float8", "fwd", "bwd", "bfloat16", "", "NVIDIA H200@sm90"]),
)
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


def _paths(value, prefix=()):
    """Every location in a JSON value: (path to the container, key or index)."""
    if isinstance(value, dict):
        for name, child in value.items():
            yield prefix, name
            yield from _paths(child, prefix + (name,))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield prefix, i
            yield from _paths(child, prefix + (i,))


DOCUMENT = json.loads(VALID)
PATHS = list(_paths(DOCUMENT))


def _at(document, path):
    for part in path:
        document = document[part]
    return document


@st.composite
def structural_mutations(draw):
    document = copy.deepcopy(DOCUMENT)
    for _ in range(draw(st.integers(1, 3))):
        parent_path, name = draw(st.sampled_from(PATHS))
        try:
            parent = _at(document, parent_path)
            parent[name]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed it
        op = draw(st.sampled_from(["replace", "drop", "add", "duplicate"]))
        if op == "replace":
            parent[name] = draw(json_values)
        elif op == "drop":
            del parent[name]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[name]))
    if draw(st.booleans()) and isinstance(document.get("tables"), list):
        try:
            document["sha256"] = checksum(document["tables"])  # past the checksum: the schema must reject
        except ExchangeError:
            pass
    return json.dumps(document).encode()


def test_structural_mutations_past_the_checksum_never_change_the_store(tmp_path):
    store, original = _store(tmp_path)
    outcomes = []

    @settings(FUZZ, max_examples=1500)
    @given(data=structural_mutations())
    def check(data):
        outcomes.append(_try_import(store, data, original))

    try:
        check()
    finally:
        store.close()
    assert True in outcomes and False in outcomes  # some files were accepted, and were inspected
