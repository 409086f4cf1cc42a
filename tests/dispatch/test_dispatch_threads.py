"""Threads: concurrent get_tuned_attention() calls share one read of the table, and
concurrent calls of one callable pick the same configs as one thread does."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from dispatch_samples import BWD_A, FWD_A, FWD_B, qkv

import flashtune
from flashtune import dispatch
from flashtune.dispatch import get_tuned_attention
from flashtune.store import Store

THREADS = 16


def _count_reads(monkeypatch) -> list:
    reads = []
    real_load_table = Store.load_table

    def load_table(self, gpu, **kwargs):
        reads.append(gpu)
        time.sleep(0.05)  # a slow read widens every race
        return real_load_table(self, gpu, **kwargs)

    monkeypatch.setattr(Store, "load_table", load_table)
    return reads


def test_concurrent_get_tuned_attention_calls_share_one_read(write, db_path, monkeypatch):
    write(16, "fwd", FWD_A)
    reads = _count_reads(monkeypatch)
    arrived = []
    real_ticket = dispatch._ticket

    def ticket():  # each get_tuned_attention() takes a ticket before it asks for the table
        arrived.append(None)
        return real_ticket()

    monkeypatch.setattr(dispatch, "_ticket", ticket)
    # Hold the table lock until every thread has arrived: the first one in reads the
    # table after all of them were called, so that one read serves them all.
    with ThreadPoolExecutor(THREADS) as pool:
        with dispatch._TABLES_LOCK:
            futures = [pool.submit(get_tuned_attention, db_path) for _ in range(THREADS)]
            deadline = time.monotonic() + 10
            while len(arrived) < THREADS and time.monotonic() < deadline:
                time.sleep(0.001)
        callables = [f.result() for f in futures]
    assert len(reads) == 1
    assert len({id(fn._snapshot.tables[fn.device]) for fn in callables}) == 1
    assert all(fn.explain(*qkv(16)).fwd_config == FWD_A for fn in callables)


def test_concurrent_get_tuned_attention_calls_without_coordination(write, db_path, monkeypatch):
    write(16, "fwd", FWD_A)
    reads = _count_reads(monkeypatch)
    barrier = threading.Barrier(THREADS)

    def make():
        barrier.wait()
        return get_tuned_attention(db_path)

    with ThreadPoolExecutor(THREADS) as pool:
        callables = list(pool.map(lambda _: make(), range(THREADS)))
    # How many reads happen depends on the schedule; what may not: every callable's
    # table was read after the callable was made (it sees every row committed before),
    # and every read serves a callable (none is wasted).
    tables = [fn._snapshot.tables[fn.device] for fn in callables]
    assert all(table.loaded_at > fn._snapshot.since for fn, table in zip(callables, tables))
    assert len(reads) == len({id(table) for table in tables})
    assert all(fn.explain(*qkv(16)).fwd_config == FWD_A for fn in callables)


def test_concurrent_calls_of_one_callable_match_one_thread(write, db_path, monkeypatch):
    write(16, "fwd", FWD_A)
    write(64, "fwd", FWD_B)
    write(16, "bwd", BWD_A)
    fn = get_tuned_attention(db_path)
    reads = _count_reads(monkeypatch)
    shapes = [(n, causal) for n in (8, 16, 17, 40, 64, 100) for causal in (False, True)]
    inputs = {shape: qkv(shape[0]) for shape in shapes}
    barrier = threading.Barrier(THREADS)

    def explain_all(i):
        barrier.wait()
        order = shapes[i % len(shapes):] + shapes[:i % len(shapes)]
        return {shape: fn.explain(*inputs[shape], is_causal=shape[1]) for shape in order}

    with ThreadPoolExecutor(THREADS) as pool:
        seen = list(pool.map(explain_all, range(THREADS)))
    alone = get_tuned_attention(db_path)
    expected = {shape: alone.explain(*inputs[shape], is_causal=shape[1]) for shape in shapes}
    assert all(choices == expected for choices in seen)
    assert len(reads) == 1  # `alone`'s: the threads' calls read nothing


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton interpreter is not thread-safe")
def test_concurrent_launches_of_one_callable_match_one_thread(write, db_path):
    write(16, "fwd", FWD_A)
    write(16, "bwd", BWD_A)
    fn = get_tuned_attention(db_path)
    q, k, v = qkv(17)
    want = flashtune.attention(q, k, v, fwd_config=FWD_A, bwd_config=BWD_A, fp32_precision="ieee")
    with ThreadPoolExecutor(THREADS) as pool:
        outs = list(pool.map(lambda _: fn(q, k, v), range(4 * THREADS)))
    assert all(torch.equal(out, want) for out in outs)
