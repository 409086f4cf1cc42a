"""Kernel tests: interpreter set-up, the `gpu` marker's skip, seeded randomness.

Without CUDA the kernels run under Triton's interpreter on CPU tensors. The interpreter
must be on before triton is imported; tests/conftest.py does that for the whole
session, and the line below covers a run that starts in this directory.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from flashtune import device as common  # imports torch: after the env set-up

SEED = 20261129


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False")


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global seed (inputs also use explicit generators)."""
    torch.manual_seed(SEED)
    yield


@pytest.fixture
def kernel_device():
    """The device the kernels run on here: CUDA, or the CPU under the interpreter.

    Fails (not skips) when neither is available, so a mis-set TRITON_INTERPRET cannot
    silently turn the CPU matrix into a no-op.
    """
    if HAS_CUDA:
        return torch.device("cuda")
    if not common.INTERPRETER:
        pytest.fail("no CUDA and the Triton interpreter is off: triton was imported before "
                    "TRITON_INTERPRET=1 was set, or TRITON_INTERPRET is set to something else")
    return torch.device("cpu")
