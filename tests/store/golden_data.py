"""Golden databases: one SQLite file per released schema, under tests/store/golden/.

Make the one of a new release once, then commit it:

    python tests/store/golden_data.py 0001

writes ``tests/store/golden/schema_0001.sqlite``: a new SQLite file upgraded to that
revision, holding the rows of ``ROWS[revision]``, inserted with plain SQL (the
repository's code follows the newest schema, so it cannot write an old one). The test
suite upgrades each golden file to head and reads it back. Never regenerate a committed
file: it stands for the databases users already have.
"""

from __future__ import annotations

import sys
from pathlib import Path

import sqlalchemy as sa

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"

_CREATED = "2026-11-29 12:00:00.000000"
_VERSIONS = {"flashtune_version": "0.1.0", "kernel_hash": "0123456789abcdef", "triton_version": "3.6.0"}

ROWS = {
    "0001": {
        "flashtune_gpus": [
            {"id": 1, "key": "NVIDIA H200@sm90", "name": "NVIDIA H200", "capability_major": 9,
             "capability_minor": 0, "sm_count": 132, "total_memory": 150754820096,
             "created_at": _CREATED, "updated_at": _CREATED},
        ],
        "flashtune_tuned_results": [
            {"id": 1, "gpu_id": 1, "dtype": "bfloat16", "head_dim": 128, "seq_len": 4096, "causal": True,
             "pass": "fwd", "config": '{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}',
             "time_ms": 0.412, "tflops": 667.2, "default_time_ms": 0.498, "error": 0.0039, "n_trials": 96,
             **_VERSIONS, "torch_version": "2.13.0", "cuda_version": "12.8",
             "driver_version": "cuda-driver-api 13.0", "created_at": _CREATED, "updated_at": _CREATED},
            {"id": 2, "gpu_id": 1, "dtype": "float16", "head_dim": 64, "seq_len": 1024, "causal": False,
             "pass": "bwd", "config": '{"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, '
                                      '"num_warps": 4, "num_stages": 3}',
             "time_ms": 0.131, "tflops": 410.9, "default_time_ms": None, "error": 0.0021, "n_trials": 64,
             **_VERSIONS, "torch_version": "2.13.0", "cuda_version": "12.8",
             "driver_version": "cuda-driver-api 13.0", "created_at": _CREATED, "updated_at": _CREATED},
        ],
        "flashtune_trials": [
            {"id": 1, "gpu_id": 1, "dtype": "bfloat16", "head_dim": 128, "seq_len": 4096, "causal": True,
             "pass": "fwd", "config": '{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}',
             "status": "ok", "time_ms": 0.412, "error": 0.0039, "message": "", "study": "h200-fwd",
             "kernel_hash": "0123456789abcdef", "triton_version": "3.6.0", "created_at": _CREATED},
            {"id": 2, "gpu_id": 1, "dtype": "bfloat16", "head_dim": 128, "seq_len": 4096, "causal": True,
             "pass": "fwd", "config": '{"BLOCK_M": 256, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4}',
             "status": "out_of_resources", "time_ms": None, "error": None,
             "message": "out of resource: shared memory, Required: 327680, Hardware limit: 232448",
             "study": "h200-fwd", "kernel_hash": "0123456789abcdef", "triton_version": "3.6.0",
             "created_at": _CREATED},
        ],
    },
    "0002": {  # the key tells shapes apart: seq_q, seq_k, group, batch_heads
        "flashtune_gpus": [
            {"id": 1, "key": "NVIDIA H200@sm90", "name": "NVIDIA H200", "capability_major": 9,
             "capability_minor": 0, "sm_count": 132, "total_memory": 150754820096,
             "created_at": _CREATED, "updated_at": _CREATED},
        ],
        "flashtune_tuned_results": [
            {"id": 1, "gpu_id": 1, "dtype": "bfloat16", "head_dim": 128, "seq_q": 4096, "seq_k": 4096, "group": 1,
             "batch_heads": 64, "causal": True, "pass": "fwd",
             "config": '{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "tma": 0, '
                       '"num_splits": 0, "pack_gqa": -1}',
             "time_ms": 0.412, "tflops": 667.2, "default_time_ms": 0.498, "error": 0.0039, "n_trials": 96,
             "runner": "triton", "runner_times": None,
             **_VERSIONS, "torch_version": "2.13.0", "cuda_version": "12.8",
             "driver_version": "cuda-driver-api 13.0", "created_at": _CREATED, "updated_at": _CREATED},
            {"id": 2, "gpu_id": 1, "dtype": "bfloat16", "head_dim": 128, "seq_q": 1, "seq_k": 65536, "group": 4,
             "batch_heads": 32, "causal": False, "pass": "fwd",
             "config": '{"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "tma": 0, '
                       '"num_splits": 32, "pack_gqa": 1}',
             "time_ms": 0.095, "tflops": 0.71, "default_time_ms": 0.131, "error": 0.0031, "n_trials": 32,
             "runner": "sdpa-cudnn", "runner_times": '{"triton": 0.095, "sdpa-cudnn": 0.081, "sdpa-flash": 0.112}',
             **_VERSIONS, "torch_version": "2.13.0", "cuda_version": "13.0",
             "driver_version": "cuda-driver-api 13.0", "created_at": _CREATED, "updated_at": _CREATED},
        ],
        "flashtune_recorded_calls": [
            {"id": 1, "gpu_id": 1, "dtype": "bfloat16", "head_dim": 128, "seq_q": 1, "seq_k": 32768, "group": 4,
             "batch_heads": 32, "causal": False, "pass": "fwd", "batch": 1, "heads_q": 32, "heads_kv": 8,
             "calls": 4096, "first_seen": _CREATED, "last_seen": _CREATED},
        ],
        "flashtune_trials": [
            {"id": 1, "gpu_id": 1, "dtype": "bfloat16", "head_dim": 128, "seq_q": 1, "seq_k": 65536, "group": 4,
             "batch_heads": 32, "causal": False, "pass": "fwd",
             "config": '{"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "tma": 0, '
                       '"num_splits": 32, "pack_gqa": 1}',
             "status": "ok", "time_ms": 0.095, "error": 0.0031, "message": "", "study": "h200-decode",
             "kernel_hash": "0123456789abcdef", "triton_version": "3.6.0", "created_at": _CREATED},
        ],
    },
}

# 0003 adds the key claims (and the store's identity, which its migration makes).
ROWS["0003"] = {
    **ROWS["0002"],
    "flashtune_key_claims": [
        {"id": 1, "key_identity": '{"batch_heads":64,"causal":true,"dtype":"bfloat16","gpu":"NVIDIA H200@sm90",'
                                  '"group":1,"head_dim":128,"pass":"fwd","seq_k":4096,"seq_q":4096}',
         "kernel_hash": "0123456789abcdef", "holder": "host-a:4242:0123456789ab", "state": "done",
         "lease_expires_at": _CREATED, "trials": 96, "created_at": _CREATED, "updated_at": _CREATED},
    ],
}


def golden_path(revision: str) -> Path:
    return GOLDEN_DIR / f"schema_{revision}.sqlite"


def insert_rows(connection: sa.Connection, rows: dict[str, list[dict]]) -> None:
    """Insert rows given by table, in order, with plain SQL."""
    for table, table_rows in rows.items():
        for row in table_rows:
            columns = ", ".join(f'"{name}"' for name in row)
            values = ", ".join(f":{name}" for name in row)
            connection.execute(sa.text(f"INSERT INTO {table} ({columns}) VALUES ({values})"), row)


def main(revision: str) -> None:
    from flashtune.store import upgrade

    path = golden_path(revision)
    if path.exists():
        sys.exit(f"{path} exists: golden databases are never regenerated")
    upgrade(path, revision)
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        insert_rows(connection, ROWS[revision])
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode = DELETE")  # one self-contained file
    engine.dispose()
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1])
