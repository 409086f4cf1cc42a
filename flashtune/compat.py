"""The torch and triton versions this flashtune runs with, checked when it is imported.

The floors are what the code needs: the kernels import ``triton.tools.tensor_descriptor``
and Gluon (``triton.experimental.gluon``), both first in triton 3.6; torch 2.11 is the
oldest torch flashtune has been run with (with triton 3.6.0 on the H100 and H200). The
ceilings are the first releases nobody has tested (triton's Gluon API is experimental and
changes between releases). ``TESTED`` lists the pairs the test suite has passed with;
pyproject.toml declares the same ranges (a test holds them together).

Versions are read from the installed packages' metadata, so the check imports neither
torch nor triton (``flashtune --help`` stays instant). Below a floor, ``import flashtune``
raises ``UnsupportedVersionError`` and the command line says what to install; at or above
a ceiling, a warning says the pair is untested.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import warnings


@dataclasses.dataclass(frozen=True)
class Supported:
    """A dependency's supported range: ``minimum`` <= version < ``below`` (release numbers)."""

    package: str
    minimum: tuple[int, ...]
    below: tuple[int, ...]
    why: str  # why the floor is where it is

    @property
    def spec(self) -> str:
        """The range as pip writes it: ``triton>=3.6,<3.7``."""
        return f"{self.package}>={_dotted(self.minimum)},<{_dotted(self.below)}"


SUPPORTED = (
    Supported("torch", (2, 11), (2, 14), "the oldest torch flashtune has been tested with"),
    Supported("triton", (3, 6), (3, 7), "flashtune's kernels import triton.tools.tensor_descriptor and Gluon, "
              "both new in triton 3.6"),
)
# (torch, triton, where): the pairs the test suite has passed with
TESTED = (
    ("2.11.0", "3.6.0", "NVIDIA H100 and H200, CUDA 13.0"),
    ("2.13.0", "3.6.0", "CPU, under the Triton interpreter (CI)"),
)
# distributions that install the `triton` module (nightly torch builds ship pytorch-triton)
_DISTRIBUTIONS = {"triton": ("triton", "pytorch-triton"), "torch": ("torch",)}


class UnsupportedVersionError(ImportError):
    """An installed torch or triton that flashtune cannot run with; the message says what to install."""


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def installed_version(package: str) -> str | None:
    """The installed version of ``package`` ("torch", "triton") from its metadata; None if absent."""
    from importlib.metadata import PackageNotFoundError, version

    for name in _DISTRIBUTIONS.get(package, (package,)):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def release(version: str) -> tuple[int, ...]:
    """The release numbers a version starts with: "2.13.0+cpu" -> (2, 13, 0)."""
    found = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in found[0].split(".")) if found else ()


def tested_pairs() -> str:
    return "; ".join(f"torch {torch} + triton {triton} ({where})" for torch, triton, where in TESTED)


def version_problems() -> tuple[list[str], list[str]]:
    """(errors, warnings) about the installed torch and triton: an error where flashtune cannot run
    (absent, or below the floor), a warning where the version is newer than any tested."""
    errors, untested = [], []
    for dependency in SUPPORTED:
        found = installed_version(dependency.package)
        if found is None:
            errors.append(f"{dependency.package} is not installed: pip install '{dependency.spec}'")
        elif release(found) < dependency.minimum:
            errors.append(f"flashtune needs {dependency.spec} ({dependency.why}), found {dependency.package} "
                          f"{found}: pip install '{dependency.spec}'")
        elif release(found) >= dependency.below:
            untested.append(f"{dependency.package} {found} is newer than any flashtune was tested with "
                            f"({dependency.spec})")
    if errors:
        errors.append(f"tested: {tested_pairs()}")
    return errors, untested


def _show_without_traceback(previous):
    """An excepthook that prints an UnsupportedVersionError as its message alone (it is no bug
    of the caller's code: a traceback would only hide the remedy), and anything else as before."""
    def hook(kind, value, traceback):
        if isinstance(value, UnsupportedVersionError):
            print(f"{kind.__name__}: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)
    return hook


def check_installed() -> None:
    """Raise ``UnsupportedVersionError`` where the installed torch or triton cannot run flashtune
    (uncaught, it prints without a traceback); warn once where they are newer than tested."""
    errors, untested = version_problems()
    if errors:
        sys.excepthook = _show_without_traceback(sys.excepthook)
        raise UnsupportedVersionError("; ".join(errors))
    for message in untested:
        warnings.warn(f"{message}; tested: {tested_pairs()}", UserWarning, stacklevel=3)
