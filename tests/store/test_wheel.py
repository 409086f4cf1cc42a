"""The built wheel carries the migrations: installed in a fresh venv outside the repository,
it upgrades a new database to head from another directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import alembic
import platformdirs
import pytest
import sqlalchemy

from flashtune.provenance import kernel_source_hash
from flashtune.store import current_revision, head_revision

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import flashtune.store as store
from flashtune import provenance, tables
from flashtune.store import migrations
print(store.upgrade(sys.argv[1]))
print(migrations.script_location())
print(store.__file__)
print(provenance.kernel_source_hash())
print(tables.TABLES_DIR)
"""


def _run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FLASHTUNE_"))})
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_an_installed_wheel_upgrades_a_new_database_from_anywhere(tmp_path):
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(REPO))
    [wheel] = (tmp_path / "dist").glob("flashtune-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "flashtune/store/_alembic/env.py" in names
    assert "flashtune/store/_alembic/versions/0001_initial_schema.py" in names
    # the shipped tables travel as package data, every one of the checkout's
    shipped = {f"flashtune/tables/{p.name}" for p in (REPO / "flashtune" / "tables").glob("*.json")}
    assert {"flashtune/tables/__init__.py", *shipped} <= set(names)

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index", str(wheel))
    # The wheel's dependencies come from this interpreter's site-packages, listed in a
    # .pth file: they are searched after the venv's own site-packages (where flashtune
    # now is), and their own .pth files (an editable flashtune, say) are not read.
    site_packages = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    dependencies = {str(Path(module.__file__).resolve().parents[1]) for module in (sqlalchemy, alembic, platformdirs)}
    (site_packages / "_flashtune_test_dependencies.pth").write_text("\n".join(sorted(dependencies)) + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    database = tmp_path / "new" / "tuned.db"
    database.parent.mkdir()
    revision, scripts, module, kernel_hash, tables = _run(str(python), "-I", "-c", CHECK, f"sqlite:///{database}",
                                                          cwd=elsewhere).split()
    assert revision == head_revision() == current_revision(database)
    assert Path(scripts) == site_packages / "flashtune" / "store" / "_alembic"
    assert Path(module).is_relative_to(site_packages)
    # the installed kernels hash as the checkout's: stored results stay current across the install
    assert kernel_hash == kernel_source_hash()
    assert Path(tables) == site_packages / "flashtune" / "tables"
