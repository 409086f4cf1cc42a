"""How many writes per second the store takes from many processes at once (docs/scale-out.md).

Each of P processes opens its own ``Store`` and, for ``--seconds``, does one kind of
write the search does, as fast as it can, each write its own transaction:

  trial   ``Store.record_trial`` (one INSERT): what every trial of every GPU writes
  claim   ``claims.claim`` of a new key, then ``claims.finish`` (two transactions): once per key
  renew   ``claims.renew`` of a held key (one UPDATE): every lease/3 per key being searched
  optuna  one trial of an Optuna study in RDB storage on the same database, as a key's search
          makes it (ask, the outcome's user attributes, tell; random sampler, so the figure is
          the storage's): with ``--url`` only

and the total of the P processes is reported per second, for P in ``--procs``. The
store is a fresh PostgreSQL schema (``--url``, dropped afterwards) or a SQLite file
(``--sqlite``). No GPU is needed.

    python benchmarks/store_throughput.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
    python benchmarks/store_throughput.py --sqlite /tmp/throughput.db --procs 1,4,16
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (benchmarks/harness.py)
from flashtune.keys import GpuInfo, TuningKey  # noqa: E402
from flashtune.outcome import Outcome  # noqa: E402
from flashtune.provenance import Provenance  # noqa: E402

GPU = GpuInfo("NVIDIA H200", (9, 0), 132, 150_754_820_096)
PROVENANCE = Provenance("0", "0123456789abcdef", "3.6.0", "2.13.0", "12.8", "", GPU.name, "9.0", 132)
FwdConfig = harness.kernels().FwdConfig
CONFIG = FwdConfig(128, 64, 8, 3)


def _work(url: str, op: str, worker: int, seconds: float, start, out) -> None:
    try:
        if op == "optuna":
            _optuna(url, worker, seconds, start, out)
        else:
            _store(url, op, worker, seconds, start, out)
    except BaseException as e:  # noqa: BLE001 - reported, and the point is void
        out.put(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        start.abort()


def _store(url: str, op: str, worker: int, seconds: float, start, out) -> None:
    from flashtune.store import Store

    holder = f"bench:{os.getpid()}:{worker}"
    with Store(url) as store:
        renewed = TuningKey(GPU.key, "bfloat16", 128, 1 + worker, True, "fwd")
        store.claims.claim(renewed, holder, lease_s=60, kernel_hash="h", trials=1)
        start.wait()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if op == "trial":
                store.record_trial(renewed, CONFIG, Outcome("ok", time_ms=0.5), provenance=PROVENANCE, study="bench")
            elif op == "claim":
                k = TuningKey(GPU.key, "bfloat16", 64, 1 + worker * 10_000_000 + n, True, "fwd")
                store.claims.claim(k, holder, lease_s=60, kernel_hash="h", trials=16)
                store.claims.finish(k, holder, trials=16)
            else:
                store.claims.renew(renewed, holder, lease_s=60)
            n += 1
        out.put(n / (time.perf_counter() - t0))


def _optuna(url: str, worker: int, seconds: float, start, out) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name=f"bench-{worker}-{uuid.uuid4().hex[:6]}", storage=storage,
                                sampler=optuna.samplers.RandomSampler(seed=worker))
    dists = {name: optuna.distributions.CategoricalDistribution(values)
             for name, values in FwdConfig.search_space().items()}
    attrs = Outcome("ok", time_ms=0.5, error=1e-3).as_attrs()
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        trial = study.ask(dists)
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        study.tell(trial, 0.5)
        n += 1
    out.put(n / (time.perf_counter() - t0))


def measure(url: str, op: str, procs: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [ctx.Process(target=_work, args=(url, op, i, seconds, start, out)) for i in range(procs)]
    for w in workers:
        w.start()
    try:
        start.wait(timeout=300)
    except threading.BrokenBarrierError:
        pass
    rates = [out.get(timeout=seconds + 300) for _ in workers]
    for w in workers:
        w.join()
    failed = [r for r in rates if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"{op} with {procs} processes: {failed[0]}")
    return sum(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a PostgreSQL URL; a schema of its own is made and dropped")
    parser.add_argument("--sqlite", help="a SQLite file (made anew)")
    parser.add_argument("--procs", default="1,2,4,8,16,32")
    parser.add_argument("--ops", default="trial,claim,renew,optuna")
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    import sqlalchemy as sa

    from flashtune.store import Store

    schema, admin = None, None
    if args.url:
        admin = sa.create_engine(args.url, isolation_level="AUTOCOMMIT")
        schema = f"flashtune_bench_{uuid.uuid4().hex[:8]}"
        with admin.connect() as c:
            c.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        url = admin.url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(False)
    else:
        path = Path(args.sqlite or Path(tempfile.mkdtemp()) / "throughput.db")
        for p in path.parent.glob(path.name + "*"):
            p.unlink()
        url = str(path)
    try:
        with Store(url) as store:
            store.upsert_gpu(GPU)
        if args.url:  # Optuna's tables, made once (processes making them at once collide)
            import optuna

            optuna.storages.RDBStorage(url).engine.dispose()
        ops = [op for op in args.ops.split(",") if op != "optuna" or args.url]
        print(f"store: {'PostgreSQL' if args.url else 'SQLite'}; {args.seconds:g} s per point; writes per second "
              "(claim: claim + finish of a new key, per second; each a transaction)")
        print("| processes | " + " | ".join(f"{op}/s" for op in ops) + " |")
        print("|---:|" + "---:|" * len(ops))
        for procs in [int(p) for p in args.procs.split(",")]:
            rates = [measure(url, op, procs, args.seconds) for op in ops]
            print(f"| {procs} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |", flush=True)
    finally:
        if admin is not None:
            with admin.connect() as c:
                c.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
            admin.dispose()


if __name__ == "__main__":
    main()
