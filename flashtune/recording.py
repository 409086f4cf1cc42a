"""Recording the calls a model makes, so that a search tunes exactly those.

``get_tuned_attention(record=True)`` (or ``FLASHTUNE_RECORD=1``) notes each call signature
that no served row covers: its tuning keys (one per pass it needs) rounded to their bucket
(``bucket_key``: each length to the nearest power of two in log2 space, as batch x heads
already is, the point the dispatcher's nearest-key rule serves the call from once the bucket
is tuned), with the call's real batch and heads, once per process, and how many calls each
made. A decode loop's cache lengths 17 to 516 make six keys (16, 32, ..., 512), not 500; a
call whose bucket a served row of the store or the shipped table falls in is not noted. The
dispatcher notes a signature when it first plans it (a call seen before is its plan's dict hit
plus one counter increment); a background thread writes the notes to the store, creating it
on the first write, and the counts once more when the process exits (or on
``TunedAttention.flush_recorded()``), so no call waits for the database. A write that fails
keeps its signatures and counts for the next write, and the thread tries it again by itself
(``RETRY_S``); a store that cannot be written (still locked after a few tries) warns once and
the model runs on.

``flashtune list --recorded`` shows the recorded buckets with their summed call counts
(``buckets``; rows recorded before bucketing are bucketed as they are read); ``flashtune
search --recorded`` tunes each bucket's key at the batch and heads of its most called signature.
"""

from __future__ import annotations

import atexit
import dataclasses
import queue
import threading
import time
import warnings
from datetime import datetime

from flashtune.keys import GpuInfo, RecordedCall, TuningKey, batch_heads_bucket
from flashtune.store import Store
from flashtune.store.locks import is_lock_error

ENV_VAR = "FLASHTUNE_RECORD"
# A write waits this long for another writer's lock (a search's, another process's recorder), then
# is tried again after each of RETRY_S in turn (the last repeating): the writer runs off the calling
# thread, so waiting costs the model nothing, and a lock that goes away costs no warning.
LOCK_TIMEOUT_S = 2.0
RETRY_S = (1.0, 4.0, 15.0, 60.0)
# A store still locked after this many tries is worth a warning (any other failure warns at once).
LOCK_TRIES_BEFORE_WARNING = 3
FLUSH_RETRY_S = 0.1  # a flush tries a locked store again this often until its deadline


def bucket_key(key: TuningKey) -> TuningKey:
    """The key a call is recorded under: its lengths rounded to the nearest power of two in log2
    space, the larger on a tie (``keys.batch_heads_bucket``'s rounding). It is the point of a family
    tuned at powers of two that the dispatcher's nearest-key rule serves the call from
    (``dispatch.nearest_first``: ``key_distance`` sums each dimension's squared log2 distance, so
    the nearest lattice point rounds each one alone, and ties go to the larger point), and within
    the factor of 2 that ``keys.neighbour_gap`` lets a tuned key carry over (a bucket's lengths
    are within a factor of sqrt 2 of its key's, its group and batch x heads bucket are the key's,
    and seq_q 1 is a bucket of its own)."""
    return dataclasses.replace(key, seq_q=batch_heads_bucket(key.seq_q), seq_k=batch_heads_bucket(key.seq_k))


@dataclasses.dataclass(frozen=True)
class RecordedBucket:
    """The recorded calls of one ``bucket_key``: their summed count, and the (batch, heads_q,
    heads_kv) of the most called signature, at which ``search --recorded`` tunes the key."""

    key: TuningKey
    batch: int
    heads_q: int
    heads_kv: int
    calls: int
    signatures: int  # recorded signatures (batch, heads, lengths) in the bucket
    first_seen: datetime | None = None
    last_seen: datetime | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.batch, self.heads_q, self.heads_kv)


def buckets(calls: list[RecordedCall]) -> list[RecordedBucket]:
    """The recorded calls grouped by ``bucket_key``, the most called bucket first. A bucket is tuned
    at its key (its lengths the bucket's powers of two) with the batch and heads of its most called
    signature (every signature of a bucket has the key's group and batch x heads bucket)."""
    grouped: dict[TuningKey, list[RecordedCall]] = {}
    for call in calls:
        grouped.setdefault(bucket_key(call.key), []).append(call)
    out = []
    for key, members in grouped.items():
        top = max(members, key=lambda c: c.calls)
        seen = [c.first_seen for c in members if c.first_seen is not None]
        last = [c.last_seen for c in members if c.last_seen is not None]
        out.append(RecordedBucket(key, top.batch, top.heads_q, top.heads_kv, sum(c.calls for c in members),
                                  len({(c.key, c.batch, c.heads_q, c.heads_kv) for c in members}),
                                  min(seen, default=None), max(last, default=None)))
    return sorted(out, key=lambda b: (-b.calls, b.key))


class Counter:
    """The calls of one recorded signature since its last flush (a plain int, bumped per call)."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0


class Recorder:
    """Notes new call signatures and their call counts, and writes them to a store off the
    calling thread. One per drop-in callable."""

    def __init__(self, url, *, make_directory: bool = False) -> None:
        self.url = url
        self.make_directory = make_directory  # the default location's: made on the first write
        self._lock = threading.Lock()
        self._seen: dict[tuple, Counter] = {}  # (gpu, key, batch, heads_q, heads_kv) -> its counter
        self._gpus: dict[str, GpuInfo] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # noted signatures whose write failed: they go with every later write, and the writer
        # tries them again by itself, so they are stored before the process exits
        self._unwritten: dict[tuple, None] = {}
        self._failures = 0  # writes failed in a row
        self._locked = False  # whether the last failure was a lock (the one failure worth waiting out)
        self._warned = False
        atexit.register(self.flush)

    def note(self, gpu: GpuInfo, keys: list[TuningKey], batch: int, heads_q: int, heads_kv: int) -> Counter:
        """The counter of this signature's calls; a signature seen for the first time is
        queued for the store (each once, whichever thread sees it first)."""
        ident = (gpu.key, tuple(keys), batch, heads_q, heads_kv)
        with self._lock:
            counter = self._seen.get(ident)
            if counter is not None:
                return counter
            counter = self._seen[ident] = Counter()
            self._gpus[gpu.key] = gpu
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_loop, name="flashtune-recorder", daemon=True)
                self._thread.start()
        self._queue.put(ident)
        return counter

    def flush(self, timeout: float = 5.0) -> None:
        """Write every queued signature and the call counts since the last flush; wait for
        the writer at most ``timeout`` seconds (within which a locked store is tried again)."""
        done = threading.Event()
        if self._thread is None:
            return
        self._queue.put((done, time.monotonic() + timeout))
        done.wait(timeout)

    def _write_loop(self) -> None:
        pending: list[tuple] = []
        while True:
            retry_in = RETRY_S[min(self._failures, len(RETRY_S)) - 1] if self._failures else None
            try:
                item = self._queue.get(timeout=retry_in)
            except queue.Empty:  # a failed write's turn to be tried again
                self._write([], with_counts=False)
                continue
            if isinstance(item, tuple) and isinstance(item[0], threading.Event):
                done, deadline = item
                # at exit this is the counts' last chance: a lock is waited out until the
                # flush's deadline, and what still cannot be written is warned of
                while not self._write(pending, with_counts=True, deadline=deadline):
                    if not self._locked or time.monotonic() >= deadline - FLUSH_RETRY_S:
                        break
                    time.sleep(FLUSH_RETRY_S)
                pending = []
                done.set()
                continue
            pending.append(item)
            if self._queue.empty():  # write what came in together, in one transaction
                self._write(pending, with_counts=False)
                pending = []

    def _write(self, new: list[tuple], *, with_counts: bool, deadline: float | None = None) -> bool:
        """Whether the rows were written (or there were none)."""
        with self._lock:
            counted = [ident for ident, counter in self._seen.items() if with_counts and counter.calls]
            rows = []
            for ident in dict.fromkeys([*self._unwritten, *new, *counted]):
                counter = self._seen[ident]
                rows.append((ident, counter.calls))  # the calls counted since the last write go with it
                counter.calls = 0
            gpus = dict(self._gpus)
        if not rows:
            return True
        lock_timeout = LOCK_TIMEOUT_S if deadline is None else max(0.05, deadline - time.monotonic() - FLUSH_RETRY_S)
        try:
            if self.make_directory:
                from flashtune.store.engine import ensure_directory

                ensure_directory(self.url)
            with Store(self.url, lock_timeout_s=lock_timeout) as store:
                for gpu in gpus.values():
                    store.upsert_gpu(gpu)
                store.record_calls([RecordedCall(key, batch, hq, hkv, calls)
                                    for (_, keys, batch, hq, hkv), calls in rows for key in keys])
            with self._lock:
                for ident, _ in rows:
                    self._unwritten.pop(ident, None)
            self._failures = 0
            return True
        except Exception as e:  # noqa: BLE001 - recording never breaks the model
            with self._lock:  # neither the signatures nor the counts are lost: they go with the next write
                for ident, calls in rows:
                    self._seen[ident].calls += calls
                    self._unwritten[ident] = None
            self._failures += 1
            locked = self._locked = is_lock_error(e.__cause__) or is_lock_error(e)
            last_try = deadline is not None and time.monotonic() >= deadline - FLUSH_RETRY_S
            if not self._warned and (not locked or last_try or self._failures >= LOCK_TRIES_BEFORE_WARNING):
                self._warned = True
                warnings.warn(f"flashtune cannot record calls in {self.url}: {e}", RuntimeWarning, stacklevel=1)
            return False
