"""Recording the calls a model makes, so that a search tunes exactly those.

``get_tuned_attention(record=True)`` (or ``FLASHTUNE_RECORD=1``) notes each call signature
whose key has no tuned result of its own (``Choice`` sources other than "tuned exact"): its
tuning keys (one per pass it needs) with the call's real batch and heads, once per process,
and how many calls each made. The dispatcher notes a signature when it first plans it (a
call seen before is its plan's dict hit plus one counter increment); a background thread
writes the notes to the store, and the counts once more when the process exits (or on
``TunedAttention.flush_recorded()``), so no call waits for the database. A store that cannot
be written warns once and the model runs on.

``flashtune list --recorded`` shows the recorded calls with their counts; ``flashtune search
--recorded`` tunes their keys.
"""

from __future__ import annotations

import atexit
import dataclasses
import queue
import threading
import warnings
from datetime import datetime

from flashtune.keys import GpuInfo, TuningKey

ENV_VAR = "FLASHTUNE_RECORD"


@dataclasses.dataclass(frozen=True)
class RecordedCall:
    """A call signature the dispatcher served without a tuned key of its own."""

    key: TuningKey
    batch: int
    heads_q: int
    heads_kv: int
    calls: int
    first_seen: datetime | None = None
    last_seen: datetime | None = None


class Counter:
    """The calls of one recorded signature since its last flush (a plain int, bumped per call)."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0


class Recorder:
    """Notes new call signatures and their call counts, and writes them to a store off the
    calling thread. One per drop-in callable."""

    def __init__(self, url) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._seen: dict[tuple, Counter] = {}  # (gpu, key, batch, heads_q, heads_kv) -> its counter
        self._gpus: dict[str, GpuInfo] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
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
        the writer at most ``timeout`` seconds."""
        done = threading.Event()
        if self._thread is None:
            return
        self._queue.put(done)
        done.wait(timeout)

    def _write_loop(self) -> None:
        pending: list[tuple] = []
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                self._write(pending, with_counts=True)
                pending = []
                item.set()
                continue
            pending.append(item)
            if self._queue.empty():  # write what came in together, in one transaction
                self._write(pending, with_counts=False)
                pending = []

    def _write(self, new: list[tuple], *, with_counts: bool) -> None:
        from flashtune.store import Store

        with self._lock:
            counted = [ident for ident, counter in self._seen.items() if with_counts and counter.calls]
            rows = []
            for ident in dict.fromkeys([*new, *counted]):
                counter = self._seen[ident]
                rows.append((ident, counter.calls))  # the calls counted since the last write go with it
                counter.calls = 0
            gpus = dict(self._gpus)
        if not rows:
            return
        try:
            with Store(self.url, lock_timeout_s=2.0) as store:
                for gpu in gpus.values():
                    store.upsert_gpu(gpu)
                store.record_calls([RecordedCall(key, batch, hq, hkv, calls)
                                    for (_, keys, batch, hq, hkv), calls in rows for key in keys])
        except Exception as e:  # noqa: BLE001 - recording never breaks the model
            with self._lock:  # the counts are not lost: they go with the next flush
                for ident, calls in rows:
                    self._seen[ident].calls += calls
            if not self._warned:
                self._warned = True
                warnings.warn(f"flashtune cannot record calls in {self.url}: {e}", RuntimeWarning, stacklevel=1)
