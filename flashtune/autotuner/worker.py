"""Trials run in a long-lived child process, so a crashing or hanging kernel costs one trial.

The parent talks to the child over a pipe: ``setup`` builds a key's inputs and
reference, ``run`` checks and times one config, ``retime`` re-times finalists. A reply
that does not come within its timeout gets the child killed (``timeout``); a child that
dies (illegal memory access, trap, segfault) is reported as ``crashed``. Either way the
next request starts a fresh child, which builds the key's inputs again.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import traceback
from typing import Any

from flashtune.outcome import Outcome
from flashtune.keys import TuningKey


class WorkerLost(Exception):
    """The child died or was killed; ``status`` says which ("crashed" or "timeout")."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class WorkerError(RuntimeError):
    """The child raised while serving a request (e.g. the key's inputs could not be built)."""


def _die_with_parent(parent_pid: int) -> None:
    """Linux: the child gets SIGKILL when the parent dies (strictly: when the thread that
    started it ends), so a worker stuck in a hanging kernel does not outlive a search
    that was killed (SIGKILL, the OOM killer)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort
        return
    if os.getppid() != parent_pid:  # the parent died before prctl
        os._exit(1)


def _child(conn, device: str, interpreter: bool, parent_pid: int | None = None) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the parent handles it and
    # stops this child; the child must not die half-way through a reply on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    import torch

    from flashtune.autotuner.outcome import is_fatal

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev.index if dev.index is not None else 0)
    bench = None
    while True:
        try:
            op, args = conn.recv()
        except EOFError:
            return
        if op == "exit":
            return
        try:
            if op == "setup":
                bench = None  # a failed setup leaves no key's inputs behind
            bench, reply = serve(bench, dev, op, args)
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"))
            if is_fatal(e):
                return
            continue
        conn.send(("ok", reply))
        if isinstance(reply, Outcome) and reply.status == "crashed":
            return  # the CUDA context is poisoned: leave, the parent starts a new child


def serve(bench, device, op: str, args: dict) -> tuple[Any, Any]:
    """One request of the worker's protocol: (the key's bench after it, the reply). ``bench``
    is the current key's ``KeyBench`` (None before the first ``setup``). The worker process
    serves its requests with it; a test double of the worker runs it in the caller's process,
    so what it tests is the same request handling."""
    from flashtune.autotuner.trial import KeyBench

    if op == "setup":
        bench = KeyBench(args["key"], device, args.get("shape"))
        return bench, bench.describe()
    if op == "run":
        return bench, bench.run(args["config"], args.get("fault", 0))
    if op == "precompile":
        return bench, bench.precompile(args["configs"], args["faults"], args["threads"])
    if op == "retime":
        return bench, bench.retime(args["configs"], args["rounds"])
    if op == "race":
        return bench, bench.race(args["config"], args["fwd_config"], args["rounds"])
    raise ValueError(f"unknown request {op!r}")


class TrialWorker:
    """A child process that runs trials on one device; restarted after a crash or timeout."""

    def __init__(self, device: str, *, interpreter: bool, setup_timeout: float = 600.0):
        self.device = device
        self.interpreter = interpreter
        self.setup_timeout = setup_timeout
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self._key: TuningKey | None = None
        self._busy = False  # a request was sent and its reply not yet read
        self._answered = False  # whether the current child has replied to anything yet
        self.restarts = 0  # how many children were started (the first one included)
        self.info: dict = {}  # what ``setup`` reported for the current key
        # key -> (batch, heads_q, heads_kv) of the call it was made from: its trials run that
        # shape (KeyBench); a key not here runs its trial_shape
        self.shapes: dict[TuningKey, tuple[int, int, int]] = {}

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_child, args=(child, self.device, self.interpreter, os.getpid()),
                                       daemon=True, name="flashtune-trial-worker")
        # The child may import triton while unpickling (the parent's __main__ is imported
        # again under spawn), so the interpreter switch must be in its environment at start.
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if self.interpreter else "0"
        try:
            self._proc.start()
        except BaseException:
            self._proc = None  # never started: nothing to stop or join later
            raise
        finally:
            if saved is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = saved
        child.close()
        self._conn = parent
        self._answered = False

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=30)
            self._conn.close()
        self._proc = self._conn = None
        self._key = None
        self._busy = False

    @property
    def pid(self) -> int | None:
        """The current child's process id (None when no child runs)."""
        return self._proc.pid if self._proc is not None else None

    def _request(self, op: str, args: dict, timeout: float):
        if self._proc is not None and not self._proc.is_alive():
            # died while idle (e.g. the OOM killer): not the fault of the next request
            self._kill()
        if self._proc is None:
            self._start()
            self.restarts += 1
        self._busy = True
        try:
            self._conn.send((op, args))
            ready = self._conn.poll(timeout)
            if not ready:
                self._kill()
                raise WorkerLost("timeout", f"no answer within {timeout:g} s; the worker was killed")
            status, reply = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as e:
            if self._proc is not None:
                self._proc.join(timeout=5)  # the pipe closes before the exit status is known
            code = self._proc.exitcode if self._proc is not None else None
            first = not self._answered
            self._kill()
            message = f"the worker died (exit code {code})"
            if first:
                message += (" before answering its first request; if search() is called from a script, call it "
                            "under `if __name__ == '__main__':` (the worker process is started by spawn, which "
                            "imports the script again)")
            raise WorkerLost("crashed", message) from e
        self._answered = True
        self._busy = False
        if status == "error":
            raise WorkerError(f"worker failed on {op}: {reply}")
        if isinstance(reply, Outcome) and reply.status == "crashed":
            self._kill()
        return reply

    def setup(self, key: TuningKey) -> dict:
        """Build the key's inputs and reference in the child (again after a restart)."""
        self._key = None  # until the child has them
        info = self._request("setup", {"key": key, "shape": self.shapes.get(key)}, self.setup_timeout)
        self._key = key
        self.info = info
        return info

    def info_for(self, key: TuningKey) -> dict:
        """What ``setup`` reported for ``key``, building its inputs in the child if needed."""
        self._ensure(key)
        return self.info

    def _ensure(self, key: TuningKey) -> None:
        if self._proc is not None and not self._proc.is_alive():
            self._kill()  # died while idle (the OOM killer): a fresh child needs the key's inputs
        if self._key != key or self._proc is None:
            self.setup(key)

    def run(self, key: TuningKey, config, timeout: float, fault: int = 0) -> Outcome:
        """One trial; a crash or a timeout comes back as an Outcome, never raises."""
        self._ensure(key)
        try:
            return self._request("run", {"config": config, "fault": fault}, timeout)
        except WorkerLost as e:
            return Outcome(e.status, message=str(e))

    def precompile(self, key: TuningKey, configs: list, faults: list[int], timeout: float) -> None:
        """Compile several configs' kernels in parallel in the child, so their trials
        start warm. Best effort: a failure here is met again, and recorded, by the trial."""
        self._ensure(key)
        try:
            threads = max(1, min(16, os.cpu_count() or 1))
            self._request("precompile", {"configs": list(configs), "faults": faults, "threads": threads},
                          timeout)
        except (WorkerLost, WorkerError):
            pass

    def retime(self, key: TuningKey, configs: list, rounds: int, timeout: float) -> list[list[float]]:
        self._ensure(key)
        return self._request("retime", {"configs": list(configs), "rounds": rounds}, timeout)

    def race(self, key: TuningKey, config, fwd_config, rounds: int, timeout: float) -> dict:
        """Each runner's ``RunnerTime`` for the key, GPU and eager (``KeyBench.race``)."""
        self._ensure(key)
        return self._request("race", {"config": config, "fwd_config": fwd_config, "rounds": rounds}, timeout)

    def close(self) -> None:
        """Stop the child: politely when idle; killed at once when a request is in flight
        (the search was interrupted mid-trial, and the trial may never end)."""
        if self._proc is not None and self._proc.is_alive() and not self._busy:
            try:
                self._conn.send(("exit", {}))
                self._proc.join(timeout=10)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> "TrialWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
