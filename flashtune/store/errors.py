"""The store's exceptions: every database failure reaches callers as a ``StoreError``."""

from __future__ import annotations


class StoreError(Exception):
    """The tuned-config store could not do what was asked; the message says why and what to do.

    Driver errors are chained (``raise StoreError(...) from e``), so the original cause
    stays in the traceback.
    """


class SchemaBehindError(StoreError):
    """The database's schema is older than this flashtune's: it needs ``flashtune db upgrade``."""


class SchemaNewerError(StoreError):
    """The database was written by a newer flashtune than this one."""


class NoStoreError(StoreError):
    """There is no flashtune store there yet: no SQLite file, or a database with no tables at all
    (an empty file, or a store another process is creating right now)."""
