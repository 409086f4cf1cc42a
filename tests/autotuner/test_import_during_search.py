"""A result imported while a search tunes its key, faster than what the search finds, is what
the store holds and the dispatcher serves afterwards: the search replaces only the result it
found (and re-checked), never one it did not measure (Store.save_result's ``replacing``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch
from autotuner_helpers import GPU, key, stored_result, trials_of

from flashtune.configs.forward import FwdConfig
from flashtune.keys import GpuInfo
from flashtune.provenance import current_provenance
from flashtune.store import StoredResult

K = key("fwd", "float32", seq_len=16, causal=True)
IMPORTED = FwdConfig(32, 16, 4, 1, num_splits=1, pack_gqa=0)


def _result(config, time_ms: float) -> StoredResult:
    return StoredResult(key=K, config=config, time_ms=time_ms, tflops=1.0, default_time_ms=None, error=0.0,
                        n_trials=1, gpu=GpuInfo.interpreter(), provenance=current_provenance(None))


# The search, in a process of its own; when its final re-timing starts it says so and waits
# for the import, which therefore lands after the search read the store for its finalists.
SEARCH = """
import pathlib, sys, time
from flashtune.autotuner.worker import TrialWorker

here = pathlib.Path(sys.argv[1])
real_retime = TrialWorker.retime

def retime(worker, *args, **kwargs):
    (here / "retiming").touch()
    deadline = time.monotonic() + 120
    while not (here / "imported").exists():
        if time.monotonic() > deadline:
            raise SystemExit("the import never came")
        time.sleep(0.05)
    return real_retime(worker, *args, **kwargs)

TrialWorker.retime = retime

if __name__ == "__main__":
    from flashtune.autotuner import build_keys, search

    (key,) = build_keys("{gpu}", head_dims=[16], dtypes=["float32"], seq_lens=[16], causal=[True], passes=["fwd"])
    (r,) = search([key], db=str(here / "t.db"), trials=2, device="cpu", rounds=1).results
    print("RESULT", r.status, "|", r.message, "|", r.winner.label())
"""


def test_an_import_during_the_final_retiming_is_kept_when_faster(tmp_path):
    from flashtune.store.exchange import write_export

    script = tmp_path / "search_key.py"
    script.write_text(SEARCH.replace("{gpu}", GPU))
    export = tmp_path / "faster.json"
    write_export(export, [_result(IMPORTED, 1e-4)])  # far faster than anything the interpreter times
    env = dict(os.environ, TRITON_INTERPRET="1")
    searching = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "retiming").exists():
            assert searching.poll() is None, searching.communicate()
            assert time.monotonic() < deadline, "the search never reached its final re-timing"
            time.sleep(0.05)
        imported = subprocess.run([sys.executable, "-m", "flashtune", "import", str(export), "--db",
                                   str(tmp_path / "t.db")], capture_output=True, text=True, env=env, timeout=120)
        assert imported.returncode == 0, imported.stderr
        assert "1 added" in imported.stdout
        (tmp_path / "imported").touch()
        out, err = searching.communicate(timeout=240)
    finally:
        if searching.poll() is None:
            searching.kill()
            searching.communicate()
    assert searching.returncode == 0, err[-3000:]
    db = tmp_path / "t.db"
    held = stored_result(db, K)
    assert (held.config, held.time_ms) == (IMPORTED, 1e-4)
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT")]
    assert line.startswith("RESULT tuned | the store keeps a faster result"), line
    assert trials_of(db, K), "the search's trials are recorded all the same"
    from flashtune.dispatch import get_tuned_attention

    q = torch.randn(1, 2, 16, 16)
    choice = get_tuned_attention(db, device="cpu").explain(q, q, q, is_causal=True)
    assert (choice.fwd_config, choice.fwd_source) == (IMPORTED, "tuned exact")


def test_a_result_written_after_a_revalidation_read_its_row_is_kept_when_faster(tmp_path):
    """`flashtune revalidate` reads the stale rows, then waits for each key's claim: a search that
    held it (or an import) may store a current winner meanwhile. The revalidation checked the
    stale row, not that one: it replaces it only where it is faster."""
    import dataclasses

    from flashtune.autotuner import search
    from flashtune.store import Store

    db = tmp_path / "t.db"
    stale = dataclasses.replace(_result(FwdConfig(16, 16, 4, 1), 0.5), provenance=dataclasses.replace(
        current_provenance(None), kernel_hash="00000000deadbeef"))
    with Store(db) as store:
        store.save_result(stale)
    read = stored_result(db, K)  # as the command read it, before it took the key
    with Store(db) as store:
        store.save_result(_result(IMPORTED, 1e-4))  # far faster than anything the interpreter times
    (r,) = search([K], db=db, revalidate=True, rows={K: read}, device="cpu", rounds=1).results
    assert (r.status, r.message) == ("revalidated", "the store keeps a faster result written while this key was "
                                     "searched")
    held = stored_result(db, K)
    assert (held.config, held.time_ms) == (IMPORTED, 1e-4)
