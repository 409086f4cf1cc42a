"""The version changes whenever the kernel sources do, and each version has a CHANGELOG entry."""

from __future__ import annotations

import re
from pathlib import Path

from flashtune import __version__, provenance
from flashtune._version import KERNEL_HASHES

REPO = Path(__file__).resolve().parents[1]


def test_this_version_names_the_kernel_sources_it_ships():
    current = provenance.kernel_source_hash()
    assert KERNEL_HASHES.get(__version__) == current, (
        f"the kernel sources changed (hash {current}, flashtune {__version__} records "
        f"{KERNEL_HASHES.get(__version__)}): stored results of {__version__} would look current with other code. "
        f"Bump __version__ in flashtune/_version.py, add the new version with hash {current!r} to KERNEL_HASHES "
        "there, and add its entry to CHANGELOG.md")


def test_no_two_versions_record_one_hash_and_versions_only_grow():
    hashes = list(KERNEL_HASHES.values())
    assert len(set(hashes)) == len(hashes)
    releases = [tuple(int(x) for x in v.split(".")) for v in KERNEL_HASHES]
    assert releases == sorted(releases) and list(KERNEL_HASHES)[-1] == __version__


def test_every_version_has_a_changelog_entry():
    text = (REPO / "CHANGELOG.md").read_text()
    headings = set(re.findall(r"^## \[?(\d+\.\d+\.\d+)\]?", text, flags=re.M))
    assert __version__ in headings, f"CHANGELOG.md has no '## {__version__}' entry"


def test_the_cli_prints_the_version(tmp_path):
    from click.testing import CliRunner

    from flashtune.cli import cli

    out = CliRunner().invoke(cli, ["--version"])
    assert (out.exit_code, out.output) == (0, f"flashtune {__version__}\n")


def test_a_stale_row_names_the_release_it_was_tuned_with():
    import dataclasses

    from flashtune.provenance import Provenance, stale_versions

    row = Provenance("0.1.0", KERNEL_HASHES["0.1.0"], provenance.installed_triton_version(), "", "", "", "", "", 0)
    assert stale_versions(row) == f"kernel sources {KERNEL_HASHES['0.1.0']} (flashtune 0.1.0)"
    assert stale_versions(dataclasses.replace(row, kernel_hash=provenance.kernel_source_hash())) is None
    other = dataclasses.replace(row, kernel_hash="00ca", triton_version="3.5.0")
    assert stale_versions(other) == "kernel sources 00ca and triton 3.5.0"
