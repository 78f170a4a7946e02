"""The README's decode performance table is the committed measurement it cites: every row's
times, ratio and target come from the two decode JSONs named above it (AUTO, then the reference
kernel measured as AUTO before AUTO became the seesaw kernel)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _performance_section() -> str:
    start = README.index("## Performance")
    return README[start : README.index("\n## ", start + 1)]


def _cited() -> list[Path]:
    """The first two decode JSONs the section names: AUTO's, then the reference kernel's."""
    paths = re.findall(r"`(bench/results/[^`]*/decode-[\w-]+\.json)`", _performance_section())
    assert len(paths) >= 2, f"the performance section names {paths}, not AUTO's and the reference's"
    return [ROOT / p for p in paths[:2]]


def _results(which: int) -> dict:
    doc = json.loads(_cited()[which].read_text(encoding="utf-8"))
    return doc


def _rows() -> list[list[str]]:
    """The case rows of the section's first table whose rows name cases (the decode table; later
    tables, such as the power-limited floor's, cite other measurements)."""
    lines = _performance_section().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\| \d+x\d+x\d+xR?\d+ \|", line))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert len(rows) >= 23, f"the decode table has {len(rows)} rows"
    return rows


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row[0])
def test_decode_table_row_is_the_measurement(row: list[str]) -> None:
    case, auto_us, reference_us, flashinfer_us, ratio, target = row
    auto_doc, ref_doc = _results(0), _results(1)
    auto = {c["name"]: c for c in auto_doc["cases"]}[case]
    ref = {c["name"]: c for c in ref_doc["cases"]}[case]
    assert auto["snapmla"]["kernel"] == "auto" and ref["snapmla"]["kernel"] == "auto"
    measured_fi = auto["flashinfer"]["median_us"]  # the AUTO run's FlashInfer, as the table has
    assert float(auto_us) == round(auto["snapmla"]["median_us"], 1)
    assert float(reference_us) == round(ref["snapmla"]["median_us"], 1)
    assert float(flashinfer_us) == round(measured_fi, 1)
    assert float(ratio.rstrip("x")) == round(measured_fi / auto["snapmla"]["median_us"], 2)
    assert float(target) == auto["target_us"]


def test_table_commits_are_the_cited_ones() -> None:
    """The heading's commit is the AUTO measurement's, and each file names its own commit."""
    heading = re.search(r"## Performance \(.*commit (\w+)\)", README)
    assert heading and _results(0)["commit"].startswith(heading.group(1))
    for which, path in enumerate(_cited()):
        assert _results(which)["commit"][:7] in path.name
