"""Every published figure agrees with the result file it comes from.

A table of figures in README.md or docs/ carries a comment naming its source,
``<!-- result: RESULT_ID RUN KIND -->``: the file benchmarks/results/RESULT_ID.json, the run of
that name in it, and the kind of table. Each cell is recomputed here from the run's rows (its
medians, not its summary) and must equal the printed figure to the printed precision. A table
with figures and no such comment must say ``<!-- not-data -->``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!-- result: (\S+) (\S+) (\S+) -->")


def tables(text: str):
    """(marker line or None, header cells, body rows) for each markdown table, in order."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-:| ]+\|$", lines[i + 1]):
            before = lines[i - 1].strip() if i else ""
            header = cells(lines[i])
            body = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                body.append(cells(lines[i]))
                i += 1
            yield before, header, body
        else:
            i += 1


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def run_of(result_id: str, name: str) -> dict:
    document = json.loads((RESULTS / f"{result_id}.json").read_text())
    runs = [r for r in document["runs"] if r["name"] == name]
    assert len(runs) == 1, f"{result_id}: expected one run named {name!r}, found {len(runs)}"
    return runs[0]


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def same(printed: str, value: float | None, where: str) -> None:
    """The printed figure is ``value`` rounded to the printed number of decimals."""
    if value is None:
        assert printed == "-", f"{where}: printed {printed!r}, the result file has no figure"
        return
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    assert abs(float(printed) - value) <= 0.5 * 10 ** -decimals + 1e-9, \
        f"{where}: printed {printed}, the result file gives {value:.{decimals + 2}f}"


def best_sdpa_ms(row: dict) -> float:
    return min(ms for name, ms in row["ms"].items() if name != "flashtune" and ms)


# --- one checker per kind of table ---------------------------------------------------------

def check_grid(run: dict, header, body, where: str) -> None:
    rows = {(r["head_dim"], r["causal"], r["seq_len"], r["pass_"]): r for r in run["rows"]}
    assert len(body) == len(rows) // 2, f"{where}: {len(body)} rows printed, the run has {len(rows) // 2} shapes"
    for line in body:
        d, mask, n = int(line[0]), line[1] == "causal", int(line[2])
        fwd = rows[(d, mask, n, "fwd")]
        assert line[3] == f"{fwd['batch']} x {fwd['heads']}", f"{where}: D={d} N={n}: batch x heads"
        for offset, pass_ in ((4, "fwd"), (8, "bwd")):
            t = rows[(d, mask, n, pass_)]["tflops"]
            at = f"{where}: {pass_} D={d} {line[1]} N={n}"
            same(line[offset], t["flashtune"], at + " flashtune TFLOPS")
            same(line[offset + 1], t["cudnn"], at + " cuDNN TFLOPS")
            same(line[offset + 2], t["flash"], at + " FA2 TFLOPS")
            same(line[offset + 3], t["flashtune"] / t["cudnn"], at + " ratio")


def check_grid_summary(run: dict, header, body, where: str) -> None:
    for line in body:
        label, count = re.match(r"(\S+) \((\d+)\)", line[0]).groups()
        chosen = [r for r in run["rows"] if label == "all" or r["head_dim"] == int(label.removeprefix("D="))]
        for offset, pass_ in ((1, "fwd"), (3, "bwd")):
            sel = [r for r in chosen if r["pass_"] == pass_]
            if pass_ == "fwd":
                assert int(count) == len(sel), f"{where}: {label}: {count} rows printed, {len(sel)} in the run"
            for k, backend in enumerate(("cudnn", "flash")):
                value = geomean(r["tflops"]["flashtune"] / r["tflops"][backend] for r in sel) if sel else None
                same(line[offset + k], value, f"{where}: {label} {pass_} / {backend}")


def check_shapes(run: dict, header, body, where: str) -> None:
    rows = {(r["name"], r["pass_"]): r for r in run["rows"]}
    assert len(body) == len(rows), f"{where}: {len(body)} rows printed, the run has {len(rows)}"
    for line in body:
        row = rows[(line[0], line[2])]
        s = row["shape"]
        shape = (f"{s['batch']}, {s['heads_q']}/{s['heads_kv']}, {s['seq_q']} x {s['seq_k']}, {s['head_dim']}"
                 + (" causal" if s["causal"] else ""))
        at = f"{where}: {line[0]} {line[2]}"
        assert line[1] == shape, f"{at}: shape printed {line[1]!r}, the run's is {shape!r}"
        for k, backend in enumerate(("flashtune", "cudnn", "flash")):
            same(line[3 + k], row["ms"][backend], f"{at} {backend} ms")
        same(line[6], best_sdpa_ms(row) / row["ms"]["flashtune"], f"{at} ratio")


def check_shapes_summary(run: dict, header, body, where: str) -> None:
    for line in body:
        pass_, group, count = re.match(r"(fwd|bwd) (all|decode|non-decode) \((\d+)\)", line[0]).groups()
        sel = [r for r in run["rows"] if r["pass_"] == pass_
               and (group == "all" or (r["shape"]["seq_q"] == 1) == (group == "decode"))]
        assert int(count) == len(sel), f"{where}: {line[0]}: {len(sel)} rows in the run"
        same(line[1], geomean(best_sdpa_ms(r) / r["ms"]["flashtune"] for r in sel), f"{where}: {line[0]} / best")
        same(line[2], geomean(r["ms"]["flash"] / r["ms"]["flashtune"] for r in sel), f"{where}: {line[0]} / FA2")


def check_peer(run: dict, header, body, where: str) -> None:
    """Tables of another implementation's TFLOPS: identity columns, then figures by column name."""
    names = {"FA4": "fa4", "cuDNN": "cudnn", "flashtune": "flashtune", "FlexAttention": "flex_attention"}
    identity = [h for h in header if h in ("B", "Hq", "Hkv", "N", "D", "mask")]
    assert len(body) == len(run["rows"]), f"{where}: {len(body)} rows printed, the run has {len(run['rows'])}"
    for line in body:
        key = dict(zip(header, line))
        matches = [r for r in run["rows"] if all(
            (("causal" if r["causal"] else "full") == key[h]) if h == "mask" else r[h] == int(key[h]) for h in identity)]
        assert len(matches) == 1, f"{where}: no single row of the run is {key}"
        row = matches[0]
        for h, printed in key.items():
            m = re.match(r"(\S+)(?: / (\S+))? (fwd|bwd)$", h)
            if not m:
                continue
            figures = row[f"tflops_{m.group(3)}"]
            value = figures[names[m.group(1)]]
            if m.group(2):
                value /= figures[names[m.group(2)]]
            same(printed, value, f"{where}: {key} {h}")


CHECKS = {"grid": check_grid, "grid-summary": check_grid_summary, "shapes": check_shapes,
          "shapes-summary": check_shapes_summary, "peer": check_peer}

MARKED = [(page, m.groups(), header, body) for page in PAGES for before, header, body in tables(page.read_text())
          for m in [MARKER.search(before)] if m]


def test_the_pages_cite_result_files():
    cited = {groups[0] for _, groups, _, _ in MARKED}
    assert "h200-gluon-acceptance" in cited, "README's table must come from a result file"
    assert any(page.name == "README.md" for page, *_ in MARKED)


@pytest.mark.parametrize("page,source,header,body", MARKED,
                         ids=[f"{p.relative_to(ROOT)}:{' '.join(g)}" for p, g, _, _ in MARKED])
def test_a_table_agrees_with_its_result_file(page, source, header, body):
    result_id, run_name, kind = source
    assert (RESULTS / f"{result_id}.json").is_file(), f"{page.name}: no result file {result_id}.json"
    CHECKS[kind](run_of(result_id, run_name), header, body, f"{page.relative_to(ROOT)} ({result_id} {run_name})")


def test_every_table_of_figures_names_its_source():
    unmarked = []
    for page in PAGES:
        for before, header, body in tables(page.read_text()):
            figures = any(re.fullmatch(r"\d+\.\d+", c) for row in body for c in row)
            if figures and not MARKER.search(before) and "<!-- not-data -->" not in before:
                unmarked.append(f"{page.relative_to(ROOT)}: table {' | '.join(header)[:60]}")
    assert not unmarked, "tables of figures without a <!-- result: ... --> source:\n" + "\n".join(unmarked)


def test_the_recomputed_means_are_the_benchmark_scripts_own():
    """The geometric means this test derives from the rows equal the summary that
    benchmarks/attention.py and benchmarks/shapes.py wrote into the same run."""
    grid = run_of("h200-gluon-acceptance", "grid4")
    for pass_ in ("fwd", "bwd"):
        sel = [r for r in grid["rows"] if r["pass_"] == pass_]
        for backend in ("cudnn", "flash"):
            ours = geomean(r["tflops"]["flashtune"] / r["tflops"][backend] for r in sel)
            assert ours == pytest.approx(grid["summary"][pass_][backend], rel=1e-4)
    shapes = run_of("h200-gluon-acceptance", "shapes4")
    for pass_ in ("fwd", "bwd"):
        sel = [r for r in shapes["rows"] if r["pass_"] == pass_]
        ours = geomean(best_sdpa_ms(r) / r["ms"]["flashtune"] for r in sel)
        assert ours == pytest.approx(shapes["summary"][f"{pass_} all"]["best"], rel=1e-4)


def test_a_wrong_figure_is_caught():
    run = run_of("h200-gluon-acceptance", "grid4")
    header = ["standard grid rows", "forward / cuDNN", "forward / FA2", "backward / cuDNN", "backward / FA2"]
    with pytest.raises(AssertionError, match="printed 1.018"):
        check_grid_summary(run, header, [["all (24)", "1.018", "1.640", "0.974", "1.649"]], "sample")
