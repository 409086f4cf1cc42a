"""The correctness gate over every config class the search space can produce: a trial whose
result is wrong is rejected (``incorrect``), never re-timed and never stored as a result,
whatever its kernel family, dQ mode, schedule or loads (gate_classes.CLASSES).

The wrong results come from ``flashtune.autotuner.faults`` after the launch; the Triton
families launch their real kernels under the interpreter, the Gluon families (which cannot
run there) the plain float64 reference of gate_classes. test_gate_gpu.py runs the Gluon
configs for real.
"""

from __future__ import annotations

import collections

import pytest
import torch
from gate_classes import CLASSES, InlineWorker, keys, search_rejecting_wrong_classes, use_reference_launch

from flashtune.autotuner import scheduler
from flashtune.autotuner.faults import FAULT_NAN, FAULT_WRONG, FAULT_WRONG_SECOND, FAULT_WRONG_THIRD
from flashtune.autotuner.trial import KeyBench
from flashtune.configs.space import SPACES, candidates

CPU = torch.device("cpu")
KEYS = keys()

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


@pytest.fixture(scope="module")
def benches():
    """One KeyBench per key of the classes, built on first use."""
    built: dict = {}

    def bench(name: str) -> KeyBench:
        if name not in built:
            built[name] = KeyBench(KEYS[name], CPU)
        return built[name]

    return bench


def test_the_classes_are_configs_of_the_search_space_and_hold_every_value_of_it():
    """So a field or a value added to the space is a class this gate test must be told of."""
    for pass_ in ("fwd", "bwd"):
        space = set(candidates(pass_))
        ours = [c for c in CLASSES if c.pass_ == pass_]
        for c in ours:
            key = KEYS[c.key_name]
            assert c.config == c.config.canonical() and c.config in space, c
            dtype = getattr(torch, key.dtype)
            if c.gluon:
                c.config.validate_anywhere(key.head_dim, dtype)  # sm_90's rules: what the GPU test runs
            else:
                c.config.validate(key.head_dim, dtype, CPU)
        held = collections.defaultdict(set)
        for c in ours:
            for name in SPACES[pass_][1]:
                held[name].add(getattr(c.config, name))
        missing = {name: sorted(set(values) - held[name]) for name, values in SPACES[pass_][1].items()
                   if set(values) - held[name]}
        assert not missing, f"{pass_}: no class holds {missing}; add one to gate_classes.CLASSES"
    assert len({c.name for c in CLASSES}) == len(CLASSES)


def test_the_triton_classes_take_the_launch_paths_they_are_named_for():
    from flashtune.configs.backward import dkdv_split
    from flashtune.kernels.triton.decode import plan_schedule

    fwd, bwd = KEYS["fwd"], KEYS["bwd"]
    batch, heads_q, heads_kv = fwd.trial_shape(interpreter=True)
    assert heads_q == 2 * heads_kv
    by_name = {c.name: c.config for c in CLASSES}

    def schedule(name):
        return plan_schedule(by_name[name], batch, heads_q, heads_kv, fwd.seq_q, fwd.seq_k, CPU)

    assert schedule("fwd plain kernel") is None and schedule("fwd tma") is None
    assert schedule("fwd split-kv").splits == 4 and not schedule("fwd split-kv").pack
    empty = schedule("fwd split-kv mostly empty chunks")
    assert empty.splits == 16 and empty.splits * empty.chunk > 2 * fwd.seq_k  # most chunks hold no key
    assert schedule("fwd gqa packed").pack and schedule("fwd gqa packed").splits == 1
    both = schedule("fwd gqa packed split-kv tma")
    assert both.pack and both.splits == 4

    batch, heads_q, heads_kv = bwd.trial_shape(interpreter=True)

    def split(name):
        return dkdv_split(by_name[name], batch=batch, heads_q=heads_q, heads_kv=heads_kv, n_q=bwd.seq_q,
                          n_k=bwd.seq_k, sm_count=4)

    assert split("bwd dkdv split over heads") == (2, 1)
    head_split, query_split = split("bwd dkdv split over queries")
    assert query_split > 1
    assert split("bwd atomic dq dkdv split")[0] * split("bwd atomic dq dkdv split")[1] > 1


@pytest.mark.parametrize("cls", CLASSES, ids=str)
def test_a_wrong_result_is_rejected_in_every_class(cls, benches, monkeypatch):
    """The class's right answer passes the gate, the same launch made wrong fails it."""
    calls = use_reference_launch(monkeypatch) if cls.gluon else []
    bench = benches(cls.key_name)
    passed, worst, _ = bench.check(bench.launcher(cls.config)())
    assert passed and worst <= 1, f"{cls}: the right answer fails the gate ({worst:.3g}x the allowance)"
    out = bench.run(cls.config, FAULT_WRONG)
    first = "o" if cls.pass_ == "fwd" else "dq"
    assert out.status == "incorrect", f"{cls}: a wrong {first} was {out.status}"
    assert out.time_ms is None and out.error > 1 and out.message.startswith(f"{first} error")
    if cls.gluon:  # the double ran in place of the Gluon launch, with the class's own config
        assert calls == [cls.config, cls.config]


def _first(pass_: str, gluon: bool):
    return next(c for c in CLASSES if c.pass_ == pass_ and c.gluon == gluon)


_EACH_OUTPUT = [(pass_, gluon, fault, name)
                for pass_, faults in (("fwd", ((FAULT_WRONG_SECOND, "lse"), (FAULT_NAN, "o"))),
                                      ("bwd", ((FAULT_WRONG_SECOND, "dk"), (FAULT_WRONG_THIRD, "dv"),
                                               (FAULT_NAN, "dq"))))
                for gluon in (False, True) for fault, name in faults]


@pytest.mark.parametrize("pass_, gluon, fault, output", _EACH_OUTPUT,
                         ids=[f"{p}-{'gluon' if g else 'triton'}-{o}-{'nan' if f == FAULT_NAN else 'scaled'}"
                              for p, g, f, o in _EACH_OUTPUT])
def test_each_output_is_checked(pass_, gluon, fault, output, benches, monkeypatch):
    """Every output of the pass is held to its allowance (a NaN too), not only the first."""
    if gluon:
        use_reference_launch(monkeypatch)
    cls = _first(pass_, gluon)
    out = benches(cls.key_name).run(cls.config, fault)
    assert out.status == "incorrect" and out.message.startswith(f"{output} error"), out


@pytest.mark.parametrize("key_name", list(KEYS))
def test_no_wrong_trial_of_any_class_is_retimed_or_stored(key_name, tmp_path, monkeypatch):
    """A whole search of the key over its classes, every one but the last made wrong (the
    trials in this process: gate_classes.InlineWorker; the store is real)."""
    if key_name.endswith("gluon"):
        use_reference_launch(monkeypatch)
    monkeypatch.setattr(scheduler, "DeviceWorker", InlineWorker)
    search_rejecting_wrong_classes(KEYS[key_name], [c.config for c in CLASSES if c.key_name == key_name],
                                   tmp_path / "t.db", "cpu", monkeypatch)
