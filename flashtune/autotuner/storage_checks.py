"""Optuna's study storage under faults: a journal cut short (disk full) is repaired, and
a storage that cannot be opened is one error naming it (password hidden), raised
before the first trial.

A torn journal line breaks every later search on that storage: the next append is
written after the torn bytes, and Optuna's reader then fails on that line
("Expecting ':' delimiter", naming no file). ``repair_journal`` cuts the journal at
its first damaged line, keeps the cut lines in a file next to it, and warns
(``JournalRepaired``); the trials those lines held are in the store, and the search
takes them back from there (``_KeySearch._adopt_recorded_trials``), so nothing measured
is lost or measured again.
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime, timezone
from pathlib import Path


class JournalRepaired(UserWarning):
    """The Optuna journal had a damaged line; the message names the file and what was kept."""


def repair_journal(path: Path, lock=None) -> str | None:
    """Cut ``path`` at its first line that is not one complete JSON object; return the
    warning given (None where the journal is whole). ``lock``: the journal backend's
    lock, held while looking (another process may be appending)."""
    if not path.is_file():
        return None
    from optuna.storages.journal._file import get_lock_file

    with get_lock_file(lock) if lock is not None else _nothing():
        data = path.read_bytes()
        offset, number = 0, 0
        for line in data.splitlines(keepends=True):
            if not _whole(line):
                break
            offset += len(line)
            number += 1
        else:
            return None
        aside = path.with_name(f"{path.name}.damaged-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%fZ')}")
        aside.write_bytes(data[offset:])
        with path.open("r+b") as f:
            f.truncate(offset)
    message = (f"the Optuna journal {path} was damaged at line {number + 1} (a write cut short, e.g. by a full "
               f"disk): the journal now ends before it, and the {len(data) - offset} bytes from there are kept in "
               f"{aside}; the trials they held are taken back from the store")
    warnings.warn(message, JournalRepaired, stacklevel=2)
    return message


def _whole(line: bytes) -> bool:
    if not line.endswith(b"\n"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def shown_storage(url: str) -> str:
    """An RDB storage URL as it may appear in messages (password hidden)."""
    import sqlalchemy as sa

    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "(an unparsable URL)"


def open_rdb_storage(url: str):
    """Optuna's RDB storage at ``url``; connected now (it creates its tables), so an
    unreachable server is a ``ValueError`` naming the storage before any trial."""
    import optuna
    import sqlalchemy as sa

    from flashtune.store.engine import describe_error

    try:
        return optuna.storages.RDBStorage(url)
    except (sa.exc.SQLAlchemyError, ImportError, ValueError, RuntimeError) as e:
        cause = e
        while cause.__cause__ is not None and not isinstance(cause, sa.exc.SQLAlchemyError):
            cause = cause.__cause__
        raise ValueError(f"storage: cannot open the Optuna storage {shown_storage(url)}: {describe_error(cause)}; "
                         "check the URL and that its server runs, or leave --storage out for a journal file next "
                         "to the store") from None


def open_journal(path: Path):
    """A JournalStorage on ``path``: checked writable, repaired if damaged."""
    import optuna

    try:
        with path.open("ab"):
            pass
    except OSError as e:
        raise ValueError(f"storage: cannot write the Optuna journal {path}: {e.strerror or e}") from None
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    repair_journal(path, getattr(backend, "_lock", None))
    try:
        return optuna.storages.JournalStorage(backend)
    except ValueError as e:  # a damage repair_journal does not know
        raise ValueError(f"storage: cannot read the Optuna journal {path}: {e}; move it aside (the store keeps "
                         "every trial) and search again") from None
