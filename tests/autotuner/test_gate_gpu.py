"""On an H100/H200: the correctness gate over the real Gluon configs of every family (the
CPU's test_gate.py runs them through a launch double). A wrong result (FAULT_WRONG, after the
real launch) of each Gluon class is rejected; each class's own result passes; a search over a
key's Gluon classes, all but one made wrong, stores the right one and re-times no other.

Run: ``python -m pytest -m gpu tests/autotuner/test_gate_gpu.py -q`` (about 10 Gluon compiles
per head dim; minutes on a cold Triton cache).
"""

from __future__ import annotations

import collections

import pytest
import torch
from gate_classes import CLASSES, keys, search_rejecting_wrong_classes

from flashtune.autotuner.faults import FAULT_WRONG
from flashtune.configs.base import ConfigError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="the Gluon kernels run on compute capability 9.0 (H100/H200) only"),
]

GLUON = [c for c in CLASSES if c.gluon]
HEAD_DIMS = (64, 128)
SEQ = 256  # two 128-row tiles


def _keys(head_dim: int) -> dict:
    from flashtune.keys import GpuInfo

    return keys(GpuInfo.from_device("cuda").key, gluon_head_dim=head_dim, gluon_seq=SEQ, gluon_dtype="bfloat16")


def _runs_here(cls, key) -> bool:
    try:
        cls.config.validate(key.head_dim, getattr(torch, key.dtype), torch.device("cuda"))
    except ConfigError:
        return False
    return True


@pytest.fixture(scope="module")
def benches():
    from flashtune.autotuner.trial import KeyBench

    built: dict = {}

    def bench(key):
        if key not in built:  # a small call of the key: (batch, query heads, K/V heads)
            built[key] = KeyBench(key, torch.device("cuda"), (2, 4, 4))
        return built[key]

    return bench


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_gluon_family_has_a_class_that_runs_here(head_dim):
    keyset = _keys(head_dim)
    running = collections.Counter((c.pass_, c.config.family) for c in GLUON if _runs_here(c, keyset[c.key_name]))
    assert set(running) == {("fwd", 1), ("bwd", 1), ("bwd", 2), ("bwd", 3), ("bwd", 4)}, running


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("cls", GLUON, ids=str)
def test_a_wrong_result_of_a_real_gluon_config_is_rejected(cls, head_dim, benches):
    key = _keys(head_dim)[cls.key_name]
    if not _runs_here(cls, key):
        pytest.skip(f"{cls} does not validate at head dim {head_dim} on this GPU")
    bench = benches(key)
    right = bench.run(cls.config)
    assert right.status == "ok" and right.error <= 1, f"{cls}: the real config fails the gate: {right}"
    wrong = bench.run(cls.config, FAULT_WRONG)
    assert wrong.status == "incorrect" and wrong.time_ms is None and wrong.error > 1, f"{cls}: {wrong}"


@pytest.mark.parametrize("key_name", ["fwd-gluon", "bwd-gluon"])
def test_no_wrong_gluon_trial_is_retimed_or_stored_by_a_search_on_the_gpu(key_name, tmp_path, monkeypatch):
    """The real search on the GPU, its trials in the worker process, over the key's Gluon
    classes that run here."""
    key = _keys(128)[key_name]
    configs = [c.config for c in GLUON if c.key_name == key_name and _runs_here(c, key)]
    assert len(configs) >= 2
    search_rejecting_wrong_classes(key, configs, tmp_path / "t.db", "cuda", monkeypatch, sdpa=False)
