__version__ = "0.2.0"

# The kernel source hash (flashtune.provenance.kernel_source_hash) of each release. The
# version changes whenever those sources do: tests/test_version.py fails until a change to
# them comes with a new version here, its hash, and a CHANGELOG.md entry. Stored results
# name the hash they were tuned under; this table turns it back into a release.
KERNEL_HASHES = {
    "0.1.0": "f5599e0fbc84ca38",
    "0.2.0": "448dc77057a1e363",
}
