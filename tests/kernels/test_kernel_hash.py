"""The kernel source hash: what makes stored results stale, and what does not."""

from __future__ import annotations

import shutil

import pytest

from flashtune import provenance

HASHED = [p.relative_to(provenance._PACKAGE).as_posix() for p in provenance.kernel_files()]


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    copy = tmp_path / "flashtune"
    shutil.copytree(provenance._PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(provenance, "_PACKAGE", copy)
    provenance.kernel_source_hash.cache_clear()
    yield copy
    provenance.kernel_source_hash.cache_clear()


def _hash_after(path, text: str) -> str:
    path.write_text(path.read_text() + text)
    provenance.kernel_source_hash.cache_clear()
    return provenance.kernel_source_hash()


@pytest.mark.parametrize("name", HASHED)
def test_a_change_to_kernel_code_changes_the_hash(package_copy, name):
    before = provenance.kernel_source_hash()
    assert _hash_after(package_copy / name, "\n# changed\n") != before


@pytest.mark.parametrize("name", ["heuristics/tables/sm90.toml", "heuristics/defaults.py", "configs/space.py",
                                  "kernels/reference.py", "kernels/api.py", *provenance.UNTUNED_KERNEL_SOURCES])
def test_tables_space_checks_reference_and_untuned_kernels_do_not(package_copy, name):
    before = provenance.kernel_source_hash()
    assert _hash_after(package_copy / name, "\n# changed\n") == before


def test_every_file_with_gpu_code_is_hashed():
    """Triton or Gluon kernels, or named as untuned: GPU code no stored result configures
    (the JVP kernel)."""
    jit_files = {p.relative_to(provenance._PACKAGE).as_posix() for p in provenance._PACKAGE.rglob("*.py")
                 if "@triton.jit" in p.read_text() or "@gluon.jit" in p.read_text()}
    assert {"kernels/triton/forward.py", "kernels/triton/backward.py"} <= jit_files
    assert any(name.startswith("kernels/gluon/") for name in jit_files)
    assert jit_files <= set(HASHED) | set(provenance.UNTUNED_KERNEL_SOURCES)
    assert not set(HASHED) & set(provenance.UNTUNED_KERNEL_SOURCES)
