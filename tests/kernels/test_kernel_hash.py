"""The kernel source hash: what makes stored results stale, and what does not."""

from __future__ import annotations

import shutil

import pytest

from flashtune import provenance


@pytest.fixture
def kernel_copy(tmp_path, monkeypatch):
    copy = tmp_path / "kernels"
    shutil.copytree(provenance._KERNEL_DIR, copy)
    monkeypatch.setattr(provenance, "_KERNEL_DIR", copy)
    provenance.kernel_source_hash.cache_clear()
    yield copy
    provenance.kernel_source_hash.cache_clear()


def _hash_after(path, text: str) -> str:
    path.write_text(path.read_text() + text)
    provenance.kernel_source_hash.cache_clear()
    return provenance.kernel_source_hash()


@pytest.mark.parametrize("name", provenance.KERNEL_FILES)
def test_a_change_to_kernel_code_changes_the_hash(kernel_copy, name):
    before = provenance.kernel_source_hash()
    assert _hash_after(kernel_copy / name, "\n# changed\n") != before


@pytest.mark.parametrize("name", ["config.py", "space.py", "reference.py", "function.py"])
def test_tables_space_checks_and_reference_do_not(kernel_copy, name):
    before = provenance.kernel_source_hash()
    assert _hash_after(kernel_copy / name, "\n# changed\n") == before


def test_every_file_with_gpu_code_is_hashed():
    """Triton or Gluon kernels, or named as untuned: GPU code no stored result configures
    (the JVP kernel)."""
    jit_files = {p.name for p in provenance._KERNEL_DIR.glob("*.py")
                 if "@triton.jit" in p.read_text() or "@gluon.jit" in p.read_text()}
    assert {"gluon_forward.py", "gluon_backward.py"} <= jit_files
    assert jit_files and jit_files <= set(provenance.KERNEL_FILES) | set(provenance.UNTUNED_KERNEL_FILES)
    assert not set(provenance.KERNEL_FILES) & set(provenance.UNTUNED_KERNEL_FILES)


@pytest.mark.parametrize("name", provenance.UNTUNED_KERNEL_FILES)
def test_untuned_kernels_do_not_change_the_hash(kernel_copy, name):
    before = provenance.kernel_source_hash()
    assert _hash_after(kernel_copy / name, "\n# changed\n") == before
