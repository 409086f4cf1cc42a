"""A field added to a config class, with a default, needs no code anywhere else: it is
stored, exported, imported, sent to the dispatcher and shown in labels as it is.

The test adds ``num_ctas`` (a field FwdConfig lacks) to a subclass of FwdConfig and makes it the forward's config
class, the way a new tunable is added to FwdConfig itself."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashtune import dispatch
from flashtune.kernels import FwdConfig
from flashtune.configs import base as config_mod
from flashtune.store import ResultFilter, Store
from flashtune.store.exchange import dump_export, import_export, parse_export


@dataclasses.dataclass(frozen=True, order=True)
class WiderFwdConfig(FwdConfig):
    num_ctas: int = 1


@pytest.fixture
def wider(monkeypatch):
    monkeypatch.setitem(config_mod.CONFIG_CLASSES, "fwd", WiderFwdConfig)
    return WiderFwdConfig(32, 32, 4, 2, num_ctas=4)


def test_an_added_field_round_trips_through_store_export_import_and_dispatcher(wider, write, db_path, tmp_path):
    assert WiderFwdConfig.FIELDS[-1] == "num_ctas" and "num_ctas" in WiderFwdConfig.OPTIONAL
    assert wider.label() == "32x32 w4 s2 num_ctas=4" and WiderFwdConfig(32, 32, 4, 2).label() == "32x32 w4 s2"
    written = write(64, "fwd", wider)
    with Store(db_path) as store:
        (stored,) = store.list_results(ResultFilter.for_key(written.key))
        data = dump_export([stored])
    assert stored.config == wider and type(stored.config) is WiderFwdConfig

    export = parse_export(data)
    assert b'"num_ctas": 4' in data and export.results[0].config == wider
    with Store(tmp_path / "other.db") as other:
        import_export(other, export)
        (imported,) = other.list_results()
    assert imported.config == wider

    # data written before the field existed reads as its default
    assert WiderFwdConfig.from_dict(FwdConfig(32, 32, 4, 2).to_dict()) == WiderFwdConfig(32, 32, 4, 2)

    fn = dispatch.get_tuned_attention(db_path)
    q = torch.randn(1, 2, 64, 16)
    choice = fn.explain(q, q, q)
    assert choice.fwd_config == wider and choice.fwd_source == "tuned exact"
