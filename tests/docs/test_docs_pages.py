"""The documentation speaks of the product, links only inside the repository, and the result
files it cites are complete; the example shapes files load as the guide says they do."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import yaml

from flashtune.shapes import Shape, load_shapes

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*") if p.is_file())]
# what the pages must not say: how the project was worked on, or links outside the repository
FORBIDDEN = re.compile(r"session|issue [0-9]|\.\./shared", re.IGNORECASE)


def forbidden_lines(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]


def test_the_pages_speak_of_the_product():
    hits = [f"{path.relative_to(ROOT)}:{n}: {path.read_text(errors='replace').splitlines()[n - 1].strip()[:100]}"
            for path in DOCS for n in forbidden_lines(path.read_text(errors="replace"))]
    assert not hits, "README.md and docs/ must not say these:\n" + "\n".join(hits)


def test_the_check_finds_what_it_forbids():
    outside = "../" + "shared/design/SHAPES.md"  # spelt in two parts, so this file is no hit of its own
    text = f"fine\nas Issue 5 says\nmeasured in the third Session\nsee {outside}\nissues are fine\n"
    assert forbidden_lines(text) == [2, 3, 4]


def test_relative_links_of_the_readme_lead_to_files():
    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)", text) if "://" not in t]
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


# --- result files --------------------------------------------------------------------------

RESULT_FILES = sorted(RESULTS.glob("*.json"))


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.stem for p in RESULT_FILES])
def test_a_result_file_names_its_gpu_versions_date_and_commands(path):
    doc = json.loads(path.read_text())
    assert doc["id"] == path.stem
    assert not re.search(r"\d{4}-\d\d-\d\d", path.stem), "the date goes inside the file, not in its name"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", doc["date"])
    assert doc["gpu"].startswith("NVIDIA ")
    assert {"torch", "triton"} <= set(doc["versions"])
    assert isinstance(doc["command"], list) and doc["command"], "the commands that produced the runs"
    assert doc["runs"] and all(run["name"] for run in doc["runs"])


def test_every_cited_result_id_is_a_file():
    cited = set()
    for path in DOCS:
        if path.suffix == ".md":
            cited |= set(re.findall(r"<!-- result: (\S+) ", path.read_text()))
            cited |= set(re.findall(r"`((?:h100|h200)-[a-z0-9-]+)`", path.read_text()))
    missing = sorted(c for c in cited if not (RESULTS / f"{c}.json").is_file())
    assert cited and not missing, f"cited but not under benchmarks/results/: {missing}"


def test_sources_map_every_former_run_directory_to_result_files():
    with open(RESULTS / "sources.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and len({r["old_dir"] for r in rows}) == len(rows)
    for row in rows:
        assert row["old_dir"].startswith("docs/data/")
        ids = row["result_ids"].split()
        assert ids or row["note"], f"{row['old_dir']}: neither result ids nor a note"
        assert all((RESULTS / f"{i}.json").is_file() for i in ids), row
    assert not (ROOT / "docs" / "data").exists()


# --- the example shapes files --------------------------------------------------------------

def documented_fields() -> dict[str, tuple[list[str], str]]:
    """The shape fields as the guide's table states them: field -> (aliases, default)."""
    page = (ROOT / "docs" / "tune-your-model.md").read_text()
    fields = {}
    for line in page.splitlines():
        m = re.match(r"^\| `(\w+)` \|([^|]*)\|([^|]*)\|", line)
        if m:
            aliases = re.findall(r"`(\w+)`", m.group(2))
            fields[m.group(1)] = (aliases, m.group(3).strip())
    return fields


def as_the_guide_says(row: dict, fields) -> Shape:
    """A shape row read by the guide's table alone: aliases to fields, then the defaults."""
    alias_of = {a: name for name, (aliases, _) in fields.items() for a in aliases}
    values = {alias_of.get(k, k): v for k, v in row.items()}
    for name, (_, default) in fields.items():
        if name in values:
            continue
        if default.startswith("`") and default.strip("`") in fields:   # e.g. heads_kv defaults to heads_q
            values[name] = values[default.strip("`")]
        elif default == "`false`":
            values[name] = False
        elif default in ("`bfloat16`", "`fwd`"):
            values[name] = default.strip("`")
        elif default == "":
            values[name] = ""
    passes = values["passes"]
    passes = tuple(passes.split("+")) if isinstance(passes, str) else tuple(passes)
    return Shape(values["batch"], values["heads_q"], values["heads_kv"], values["seq_q"], values["seq_k"],
                 values["head_dim"], values["causal"], values["dtype"], passes, values["name"])


@pytest.mark.parametrize("name", ["shapes.yaml", "shapes-interpreter.yaml"])
def test_an_example_shapes_file_loads_as_the_guide_describes(name):
    path = ROOT / "examples" / name
    fields = documented_fields()
    assert {"batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "causal", "dtype", "passes"} <= set(fields)
    raw = yaml.safe_load(path.read_text())["shapes"]
    loaded = load_shapes(path)
    assert loaded == [as_the_guide_says(row, fields) for row in raw]
    assert len(loaded) == len(raw) >= 2


def test_the_example_covers_training_decode_and_grouped_query_calls():
    shapes = load_shapes(ROOT / "examples" / "shapes.yaml")
    assert any("bwd" in s.passes for s in shapes)
    assert any(s.decode for s in shapes)
    assert any(s.group > 1 for s in shapes)
    assert any(s.seq_q != s.seq_k and not s.decode for s in shapes)
    interpreter = load_shapes(ROOT / "examples" / "shapes-interpreter.yaml")
    assert all(s.dtype == "float32" and s.head_dim <= 32 for s in interpreter), "the interpreter runs float32, small"
