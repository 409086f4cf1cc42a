from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_default_store(tmp_path, monkeypatch):
    """No exchange test may touch the user's real default store."""
    monkeypatch.setenv("FLASHTUNE_DB", str(tmp_path / "default-store" / "tuned.db"))


@pytest.fixture
def store(tmp_path):
    from flashtune.store import Store

    with Store(tmp_path / "store.db") as opened:
        yield opened
