"""The tables shipped in the package: which GPU they serve, and where they stand in the lookup
(the user's store, then the shipped table of the call's GPU, then the heuristic defaults).

flashtune ships no table for the Triton interpreter; each test writes one (an export of a
store made here, as `flashtune export --for-package` writes it) into a directory of its own
and points the package's table directory at it."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
from click.testing import CliRunner
from dispatch_samples import BWD_A, FWD_A, FWD_B, qkv

from flashtune import tables
from flashtune.cli import cli
from flashtune.dispatch import DispatchWarning, get_tuned_attention
from flashtune.kernels import default_config
from flashtune.keys import GpuInfo
from flashtune.store import Store

H100_SXM = GpuInfo("NVIDIA H100 80GB HBM3", (9, 0), 132, 85_000_000_000)
H100_PCIE = GpuInfo("NVIDIA H100 PCIe", (9, 0), 114, 85_000_000_000)
H200_SXM = GpuInfo("NVIDIA H200", (9, 0), 132, 150_000_000_000)
H200_NVL = GpuInfo("NVIDIA H200 NVL", (9, 0), 132, 150_000_000_000)


@pytest.fixture
def shipped_dir(tmp_path, monkeypatch):
    directory = tmp_path / "tables"
    directory.mkdir()
    monkeypatch.setattr(tables, "TABLES_DIR", directory)
    return directory


@pytest.fixture
def ship(write, db_path, shipped_dir, gpu, tmp_path):
    """``ship(rows)``: the rows (written with ``write``'s arguments to a scratch store) as this GPU's
    shipped table, exported by the CLI as a release does; returns the file."""
    def ship(*rows):
        scratch = tmp_path / "release.db"
        with Store(scratch) as store:
            for seq_len, pass_, config, options in rows:
                result = write(seq_len, pass_, config, **options)
                store.save_result(result, replace=True)
        with Store(db_path) as store:  # `write` stored them in the user's store too: not wanted here
            store.clear()
        if any("kernel_hash" in options for *_, options in rows):  # a table of a release whose kernels changed since
            target = ["-o", str(shipped_dir / tables.file_name(gpu))]
        else:
            target = ["--for-package", "-o", str(shipped_dir)]
        out = CliRunner().invoke(cli, ["export", *target, "--db", str(scratch)])
        assert out.exit_code == 0, out.output
        [path] = shipped_dir.glob("*.json")
        return path
    return ship


def test_a_fresh_install_serves_the_shipped_table_and_says_so(ship, tmp_path, gpu):
    path = ship((16, "fwd", FWD_A, {}), (16, "bwd", BWD_A, {}), (64, "fwd", FWD_B, {}))
    assert path.name == tables.file_name(gpu)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)  # no store is no problem when a table serves
        fn = get_tuned_attention(tmp_path / "no-store-here.db")
    choice = fn.explain(*qkv(16))
    assert (choice.fwd_config, choice.fwd_source) == (FWD_A, f"tuned exact (shipped table {path.name})")
    assert (choice.bwd_config, choice.bwd_source) == (BWD_A, f"tuned exact (shipped table {path.name})")
    assert fn.explain(*qkv(48)).fwd_source == f"tuned nearest (fwd float32 d16 n64 full; shipped table {path.name})"
    q, k, v = qkv(16)
    reference = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(fn(q, k, v).double(), reference, atol=1e-4, rtol=1e-4)


def test_the_users_store_wins_key_by_key(ship, write, db_path):
    path = ship((16, "fwd", FWD_A, {}), (32, "fwd", FWD_A, {}))
    write(16, "fwd", FWD_B)  # the user's own tuning of one key
    fn = get_tuned_attention(db_path)
    assert (fn.explain(*qkv(16)).fwd_config, fn.explain(*qkv(16)).fwd_source) == (FWD_B, "tuned exact")
    assert fn.explain(*qkv(32)).fwd_source == f"tuned exact (shipped table {path.name})"


def test_a_stale_store_row_gives_way_to_a_current_shipped_one(ship, write, db_path):
    path = ship((16, "fwd", FWD_A, {}))
    write(16, "fwd", FWD_B, kernel_hash="00000000deadbeef")
    choice = get_tuned_attention(db_path).explain(*qkv(16))
    assert (choice.fwd_config, choice.fwd_source) == (FWD_A, f"tuned exact (shipped table {path.name})")


def test_a_stale_shipped_table_is_not_served(ship, db_path):
    ship((16, "fwd", FWD_A, {"kernel_hash": "00000000deadbeef"}))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        choice = get_tuned_attention(db_path).explain(*qkv(16))
    assert choice.fwd_config == default_config("fwd", 16, torch.float32, qkv(16)[0].device)
    assert choice.fwd_source.startswith("heuristic (the tuned fwd config of fwd float32 d16 n16 full is stale")
    assert any("`flashtune revalidate" in str(w.message) for w in record)


def test_revalidate_brings_a_stale_shipped_row_into_the_store(ship, db_path, tmp_path):
    ship((16, "fwd", FWD_A, {"kernel_hash": "00000000deadbeef"}))
    out = CliRunner().invoke(cli, ["revalidate", "--interpreter", "--db", str(db_path), "--json", "--no-progress"])
    assert out.exit_code == 0, out.output
    [revalidated] = json.loads(out.stdout)["keys"]
    assert (revalidated["seq_q"], revalidated["pass"], revalidated["status"]) == (16, "fwd", "revalidated")
    choice = get_tuned_attention(db_path).explain(*qkv(16))
    assert choice.fwd_source == "tuned exact"  # from the store now, checked here
    with Store(db_path) as store:
        [row] = store.list_results()
    assert row.provenance.kernel_hash != "00000000deadbeef"


def test_a_table_for_another_part_of_the_same_name_is_not_served(ship, db_path, gpu):
    other = dataclasses.replace(gpu, sm_count=gpu.sm_count + 1)  # same name and key, other SM count
    path = ship((16, "fwd", FWD_A, {"on": other}))
    assert path.name == tables.file_name(other) != tables.file_name(gpu)
    assert get_tuned_attention(db_path).explain(*qkv(16)).fwd_source == "heuristic"


def test_a_damaged_shipped_table_warns_and_serves_the_defaults(shipped_dir, db_path):
    (shipped_dir / "broken.json").write_text("{ not json")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert get_tuned_attention(db_path).explain(*qkv(16)).fwd_source == "heuristic"
    assert any("the shipped table broken.json cannot be read: the file is not valid JSON" in str(w.message)
               for w in record)



def test_of_two_tables_for_one_gpu_the_file_named_for_it_serves(ship, write, db_path, shipped_dir):
    """A second file claiming the GPU (a table left from an older release, named so that it sorts
    first) does not displace the one the release wrote for it."""
    from flashtune.store.exchange import write_export

    path = ship((16, "fwd", FWD_A, {}))
    older = write(16, "fwd", FWD_B, kernel_hash="00000000deadbeef")
    with Store(db_path) as store:
        store.clear()
    leftover = shipped_dir / path.name.replace(".json", "-old.json")
    write_export(leftover, [older])
    assert sorted(p.name for p in shipped_dir.iterdir()) == [leftover.name, path.name]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        choice = get_tuned_attention(db_path).explain(*qkv(16))
    assert (choice.fwd_config, choice.fwd_source) == (FWD_A, f"tuned exact (shipped table {path.name})")
    assert [str(w.message) for w in record if issubclass(w.category, DispatchWarning)] == [
        f"flashtune: 2 shipped tables match {older.key.gpu} ({path.name}, {leftover.name}); serving {path.name}"]

@pytest.mark.parametrize("table_gpu, device_gpu, served", [
    (H100_SXM, H100_SXM, True),
    (H100_SXM, dataclasses.replace(H100_SXM, name="nvidia  h100 80gb hbm3"), True),  # case and spacing
    (H100_SXM, dataclasses.replace(H100_SXM, name="H100 80GB HBM3"), True),  # without the vendor
    (H100_SXM, H100_PCIE, False),  # another H100
    (H200_SXM, H200_NVL, False),  # same SM count, another part
    (H100_SXM, dataclasses.replace(H100_SXM, sm_count=16), False),  # a MIG slice
    (H100_SXM, dataclasses.replace(H100_SXM, capability=(9, 1)), False),
    (H100_SXM, dataclasses.replace(H100_SXM, total_memory=1), True),  # memory is no part of the match
])
def test_a_table_serves_the_gpu_of_its_name_capability_and_sm_count(table_gpu, device_gpu, served):
    assert tables.gpu_matches(table_gpu, device_gpu) is served


def test_file_names():
    assert tables.file_name(H100_SXM) == "h100-80gb-hbm3-sm90-132sm.json"
    assert tables.file_name(H200_NVL) == "h200-nvl-sm90-132sm.json"
    assert tables.file_name(H100_PCIE) != tables.file_name(H100_SXM)


def test_export_for_the_package_takes_one_gpu_and_current_rows_only(write, db_path, shipped_dir, tmp_path):
    write(16, "fwd", FWD_A, kernel_hash="00000000deadbeef")
    out = CliRunner().invoke(cli, ["export", "--for-package", "-o", str(shipped_dir), "--db", str(db_path)])
    assert out.exit_code == 1
    assert out.output.startswith("Error: 1 of 1 result is stale") and "a shipped table holds current results only" \
        in out.output
    write(32, "fwd", FWD_A, on=H100_SXM)
    out = CliRunner().invoke(cli, ["export", "--for-package", "-o", str(shipped_dir), "--db", str(db_path)])
    assert out.exit_code == 2 and "a shipped table holds one GPU's results" in out.output
    out = CliRunner().invoke(cli, ["export", "--for-package", "-o", str(tmp_path / "nowhere"), "--db", str(db_path)])
    assert out.exit_code == 2 and "is not a directory" in out.output
    assert list(shipped_dir.iterdir()) == []


def test_list_shipped_shows_the_shipped_tables(ship):
    path = ship((16, "fwd", FWD_A, {}))
    out = CliRunner().invoke(cli, ["list", "--shipped", "--json"])
    assert out.exit_code == 0, out.output
    [row] = json.loads(out.stdout)
    assert (row["seq_q"], row["table"], row["stale"]) == (16, path.name, None)
