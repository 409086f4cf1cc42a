"""The kernel source hash: what makes stored results stale, and what does not.

The hash covers every file under ``provenance.HASHED_PATHS`` (the kernels, their launchers,
config rules and heuristic defaults); each test changes a copy of the package, as an upgrade
would, and reads the hash of the copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flashtune import provenance

PACKAGE = Path(provenance.__file__).resolve().parent
HASHED = [p.relative_to(PACKAGE).as_posix() for p in provenance.hashed_files()]


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    copy = tmp_path / "flashtune"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(provenance, "_PACKAGE", copy)
    provenance.kernel_source_hash.cache_clear()
    yield copy
    provenance.kernel_source_hash.cache_clear()


def _hash_after(path: Path, text: str) -> str:
    path.write_text(path.read_text() + text)
    provenance.kernel_source_hash.cache_clear()
    return provenance.kernel_source_hash()


def test_where_the_package_lies_is_no_part_of_the_hash(package_copy):
    copied = provenance.kernel_source_hash()
    provenance.kernel_source_hash.cache_clear()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(provenance, "_PACKAGE", PACKAGE)
        assert provenance.kernel_source_hash() == copied
    provenance.kernel_source_hash.cache_clear()


@pytest.mark.parametrize("name", HASHED)
def test_a_change_to_any_hashed_file_changes_the_hash(package_copy, name):
    before = provenance.kernel_source_hash()
    assert _hash_after(package_copy / name, "\n# changed\n") != before


def test_a_new_file_among_the_kernels_changes_the_hash(package_copy):
    before = provenance.kernel_source_hash()
    (package_copy / "kernels" / "new_kernel.py").write_text("# a new kernel\n")
    provenance.kernel_source_hash.cache_clear()
    assert provenance.kernel_source_hash() != before


@pytest.mark.parametrize("name", ["dispatch.py", "keys.py", "store/repository.py", "cli/_common.py"])
def test_code_outside_the_hashed_paths_does_not(package_copy, name):
    before = provenance.kernel_source_hash()
    assert _hash_after(package_copy / name, "\n# changed\n") == before


def test_compiled_caches_do_not(package_copy):
    before = provenance.kernel_source_hash()
    cache = package_copy / "kernels" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "forward.cpython-311.pyc").write_bytes(b"\0compiled")
    provenance.kernel_source_hash.cache_clear()
    assert provenance.kernel_source_hash() == before


def test_every_file_with_gpu_code_is_hashed():
    """Triton or Gluon kernels anywhere in the package lie under a hashed path (but the search's
    test-only fault injection, which no stored result runs)."""
    jit_files = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                 if "__pycache__" not in p.parts and ("@triton.jit" in p.read_text() or "@gluon.jit" in p.read_text())}
    assert {"kernels/triton/forward.py", "kernels/gluon/forward.py", "kernels/gluon/backward.py"} <= jit_files
    assert jit_files - {"autotuner/faults.py"} <= set(HASHED)


def test_the_heuristic_defaults_and_config_rules_are_hashed():
    """They decide which config a call is served and what a stored config launches."""
    assert {"heuristics/tables/sm90.toml", "heuristics/defaults.py", "configs/forward.py", "configs/space.py",
            "kernels/passes.py", "kernels/launch.py", "device.py"} <= set(HASHED)
