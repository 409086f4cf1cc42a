"""Shared pieces of the autotuner tests."""

from __future__ import annotations

import collections
import itertools
import os
from pathlib import Path

from flashtune.autotuner.worker import TrialWorker
from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig
from flashtune.keys import GpuInfo, TuningKey
from flashtune.store import Store

GPU = GpuInfo.interpreter().key

from flashtune.autotuner.faults import FAULT_OOB_WRITE, FAULT_SPIN, FAULT_TRAP, FAULT_WRONG  # noqa: F401,E402


def key(pass_: str = "fwd", dtype: str = "float32", seq_len: int = 16, causal: bool = True,
        head_dim: int = 16) -> TuningKey:
    return TuningKey(GPU, dtype, head_dim, seq_len, causal, pass_)


def cid(cfg):
    """A config's identity (what the search and its ``faults`` argument key configs by)."""
    return cfg.canonical()


def tiny_space(monkeypatch, pass_: str, space: dict[str, list[int]]) -> list:
    """Replace a pass's search space (in this process) and return its configs in order."""
    from flashtune.configs import space as space_mod

    cls = FwdConfig if pass_ == "fwd" else BwdConfig
    monkeypatch.setitem(space_mod.SPACES, pass_, (cls, space))
    return [cls(**dict(zip(space, values))) for values in itertools.product(*space.values())]


def trials_of(db: Path, k: TuningKey):
    with Store(db) as store:
        return store.trials_for(k)


def rows_per_config(db: Path, k: TuningKey) -> collections.Counter:
    return collections.Counter(cid(t.config) for t in trials_of(db, k))


def stored_result(db: Path, k: TuningKey):
    from flashtune.store import ResultFilter

    with Store(db) as store:
        found = store.list_results(ResultFilter.for_key(k))
    return found[0] if found else None


def store_id(db: Path) -> str:
    """The store's identity, which its keys' study names carry."""
    with Store(db) as store:
        return store.store_id()


def journal_study(journal: Path, name: str):
    import optuna

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    return optuna.load_study(study_name=name, storage=storage)


def child_pids(parent: int | None = None) -> list[int]:
    """Child processes (alive or zombie) of ``parent`` (default: this process), except
    multiprocessing's resource tracker, which lives as long as the interpreter."""
    parent = os.getpid() if parent is None else parent
    skip = set()
    try:
        from multiprocessing import resource_tracker

        pid = getattr(resource_tracker._resource_tracker, "_pid", None)
        if pid:
            skip.add(pid)
    except Exception:  # noqa: BLE001
        pass
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == parent and int(entry.name) not in skip:
            out.append(int(entry.name))
    return out


def process_exists(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


class Spy:
    """Wraps a TrialWorker method: records the calls, optionally acts before/after them."""

    def __init__(self, monkeypatch, name, before=None, after=None):
        self.calls = []
        original = getattr(TrialWorker, name)

        def wrapper(worker, *args, **kwargs):
            self.calls.append(args)
            if before:
                before(worker, len(self.calls), *args)
            result = original(worker, *args, **kwargs)
            if after:
                after(worker, len(self.calls), *args)
            return result

        monkeypatch.setattr(TrialWorker, name, wrapper)
