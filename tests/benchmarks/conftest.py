"""The scripts under benchmarks/ as modules: that folder first on the import path, as when a
script runs (``python benchmarks/compare.py`` puts it there), so ``import harness`` finds it."""

import importlib
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))


@pytest.fixture(scope="session")
def script():
    """``script("compare")``: benchmarks/compare.py, imported once."""
    return importlib.import_module
