"""Many keys on many devices, and many searches on one store, with no key searched twice.

The driver (``run_keys``, in the calling process's main thread) hands keys out: a free
device takes the next key of its GPU, once the driver has claimed it in the store
(``flashtune.store.claims``). Each device is a thread of the driver that drives its own
trial worker process (``TrialWorker``) and searches one key at a time, all of its
trials on that device. A key another search holds waits and is tried again; it comes
back done (its winner is reported, "tuned_elsewhere"), or its lease expires (its
holder died) and it is taken over, resuming its study. A renewal thread extends the
leases of the keys being searched.

The devices report to the driver through one queue, so the caller's ``progress``
callback runs on the driver's thread only. Stopping (Ctrl-C, SIGTERM, an error): the
driver sets ``stop`` and kills the trial workers that are busy; a device thread then
raises KeyboardInterrupt where its key's search waits on its worker (every finished
trial is recorded; unmeasured ones are told to the study as such), and the driver
releases every claim it holds that is not done.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time

from flashtune.autotuner.worker import TrialWorker
from flashtune.store.claims import holder_is_dead

# what a key's result says about its claim: done (stored, never searched again unless
# forced), or given back (another search may try again)
DONE_STATUSES = ("tuned", "no_valid_config", "already_tuned", "revalidated")
STOP_WAIT_S = 60.0  # how long the driver waits for its devices to stop


class ClaimLost(Exception):
    """Another search took this key over (this search's lease ran out): stop searching it."""


class DeviceWorker(TrialWorker):
    """A trial worker whose requests end in KeyboardInterrupt once its search stops, and
    in ClaimLost once the key's claim is lost; a reply that arrived is still returned
    (a finished trial is recorded)."""

    def __init__(self, device: str, *, interpreter: bool, stop: threading.Event):
        super().__init__(device, interpreter=interpreter)
        self.stop = stop
        self.lost = threading.Event()

    def _check(self) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt("the search is stopping")
        if self.lost.is_set():
            raise ClaimLost("another search took this key over (this search's lease on it ran out)")

    def _request(self, op, args, timeout):
        self._check()
        try:
            return super()._request(op, args, timeout)
        except BaseException:
            self._check()  # the child was killed because the search stops
            raise

    def interrupt(self) -> None:
        """From the driver's thread: kill the child if a request is in flight."""
        proc = self._proc
        if self._busy and proc is not None:
            try:
                proc.kill()
            except (OSError, ValueError, AttributeError):
                pass


@dataclasses.dataclass
class Device:
    """One device of the search: its name ("cuda:1", "cpu:0"), its GPU, its Bench."""

    name: str
    gpu: object  # GpuInfo
    bench: object  # key_search.Bench, with a DeviceWorker

    def __post_init__(self):
        self.inbox: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None
        self.key = None  # the key it searches now
        self.measured = 0  # of that key

    def start(self, search_key, events: queue.Queue) -> None:
        self.thread = threading.Thread(target=self._serve, args=(search_key, events), daemon=True,
                                       name=f"flashtune-device-{self.name}")
        self.thread.start()

    def _serve(self, search_key, events: queue.Queue) -> None:
        worker = self.bench.worker
        try:
            while True:
                key = self.inbox.get()
                if key is None:
                    return
                worker.lost.clear()
                try:
                    result = search_key(key, self.bench, lambda p: events.put(("progress", self, p)))
                except ClaimLost as e:
                    events.put(("lost", self, key, str(e)))
                except BaseException as e:  # noqa: BLE001 - the driver raises it
                    events.put(("raised", self, key, e))
                    return
                else:
                    events.put(("result", self, key, result))
        finally:
            worker.close()  # from the thread that started the child


@dataclasses.dataclass
class Plan:
    """What the driver needs besides the devices."""

    store: object
    holder: str
    lease_s: float
    kernel_hash: str
    trials: int
    retake_done: bool  # force / revalidate: search done keys again
    report: object  # the caller's progress callback
    progress: object  # Progress class, to build reports of keys no device searched
    already: object  # key, status -> KeyResult of a key done elsewhere (or None: no winner stored)
    stop: threading.Event  # set when the search stops (the devices' workers watch it)


def run_keys(keys: list, devices: list[Device], plan: Plan, search_key) -> list:
    """Search ``keys`` on ``devices``; their results in the order of ``keys``."""
    events: queue.Queue = queue.Queue()
    stop = plan.stop
    results: dict = {}
    unique = list(dict.fromkeys(keys))  # a key given twice is searched once
    pending = list(unique)
    retry_at: dict = {}  # key -> when to try again a key held by another search
    held_before: set = set()
    poll_s = min(5.0, max(0.2, plan.lease_s / 4))
    renewal = threading.Thread(target=_renew, args=(devices, plan, stop), daemon=True,
                               name="flashtune-lease-renewal")
    for device in devices:
        device.start(search_key, events)
    renewal.start()
    try:
        while pending or any(d.key is not None for d in devices):
            for device in devices:
                if device.key is None:
                    _hand_out(device, pending, retry_at, held_before, results, plan, unique)
            busy = any(d.key is not None for d in devices)
            if not busy and not pending:
                break
            if not busy:
                wait = max(0.05, min(retry_at.values(), default=time.monotonic()) - time.monotonic())
            else:
                wait = poll_s
            try:
                event = events.get(timeout=min(wait, poll_s))
            except queue.Empty:
                continue
            _handle(event, devices, results, plan, unique)
    except BaseException:
        stop.set()
        _stop_devices(devices)
        raise
    finally:
        stop.set()
        for device in devices:
            device.inbox.put(None)
        for device in devices:
            if device.thread is not None:
                device.thread.join(timeout=STOP_WAIT_S)
        renewal.join(timeout=STOP_WAIT_S)
        try:
            plan.store.claims.release(plan.holder)
        except Exception:  # noqa: BLE001 - the leases expire on their own
            pass
    return [results[k] for k in keys]


def _hand_out(device: Device, pending: list, retry_at: dict, held_before: set, results: dict, plan: Plan,
              keys: list) -> None:
    """Claim the next key of ``device``'s GPU and give it to the device."""
    now = time.monotonic()
    for key in [k for k in pending if k.gpu == device.gpu.key and retry_at.get(k, 0) <= now]:
        claim = plan.store.claims.claim(key, plan.holder, lease_s=plan.lease_s, kernel_hash=plan.kernel_hash,
                                        trials=plan.trials, retake_done=plan.retake_done)
        if not claim.acquired and claim.state == "done":
            result = plan.already(key, "tuned_elsewhere" if key in held_before else "already_tuned")
            if result is not None:
                pending.remove(key)
                results[key] = result
                plan.report(plan.progress(key, len(results) - 1, len(keys), plan.trials, result.n_trials,
                                          done=True, result=result, device=""))
                continue
            # done, but its winner is gone from the store: finalised again
            claim = plan.store.claims.claim(key, plan.holder, lease_s=plan.lease_s,
                                            kernel_hash=plan.kernel_hash, trials=plan.trials, retake_done=True)
        if not claim.acquired and claim.state == "claimed" and holder_is_dead(claim.holder):
            # its holder was a process of this host that is gone: no need to wait for the lease
            claim = plan.store.claims.claim(key, plan.holder, lease_s=plan.lease_s, kernel_hash=plan.kernel_hash,
                                            trials=plan.trials, dead_holder=claim.holder)
        if claim.acquired:
            pending.remove(key)
            retry_at.pop(key, None)
            device.key, device.measured = key, 0
            device.inbox.put(key)
            return
        if key not in held_before:  # said once: this search waits for it
            plan.report(plan.progress(key, len(results), len(keys), plan.trials, 0, held_by=claim.holder))
        held_before.add(key)
        retry_at[key] = now + min(5.0, max(0.2, plan.lease_s / 4))


def _handle(event, devices: list[Device], results: dict, plan: Plan, keys: list) -> None:
    kind, device, *rest = event
    if kind == "progress":
        (report,) = rest
        device.measured = report.n_measured
        others = sum(min(d.measured, plan.trials) for d in devices if d is not device and d.key is not None)
        plan.report(dataclasses.replace(report, keys_done=len(results), keys_total=len(keys), others=others,
                                        device=device.name))
        return
    key, payload = rest
    device.key, device.measured = None, 0
    if kind == "raised":
        raise payload
    if kind == "lost":
        # another search has the key now; it is theirs to finish
        from flashtune.autotuner.key_search import KeyResult

        payload = KeyResult(key, "taken_over", message=payload)
        results[key] = payload
        return
    result = payload
    if result.status in DONE_STATUSES:
        trials = plan.trials if result.status == "no_valid_config" else max(1, result.n_trials)
        plan.store.claims.finish(key, plan.holder, trials=trials)
    else:
        plan.store.claims.release(plan.holder, key)  # failed: another search may try it
    results[key] = result


def _renew(devices: list[Device], plan: Plan, stop: threading.Event) -> None:
    """Every third of a lease: extend the lease of each key being searched; a key whose
    claim was lost stops at its next trial."""
    while not stop.wait(plan.lease_s / 3):
        for device in devices:
            key = device.key
            if key is None:
                continue
            try:
                if not plan.store.claims.renew(key, plan.holder, lease_s=plan.lease_s) and device.key == key:
                    device.bench.worker.lost.set()
            except Exception:  # noqa: BLE001 - the store is away for now: try again next time
                continue


def _stop_devices(devices: list[Device]) -> None:
    """Interrupt every device's worker until the device threads have ended."""
    deadline = time.monotonic() + STOP_WAIT_S
    for device in devices:
        device.inbox.put(None)
    while time.monotonic() < deadline:
        alive = [d for d in devices if d.thread is not None and d.thread.is_alive()]
        if not alive:
            return
        for device in alive:
            device.bench.worker.interrupt()
        alive[0].thread.join(timeout=0.1)
