"""The README's decode performance table is the committed measurement it cites: every row's
times, ratio and target come from the ``decode-auto`` / ``decode-fast`` JSON named above it."""

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


def _results(kernel: str) -> dict[str, dict]:
    cited = re.search(r"`(bench/results/[^`]*)/decode-\*-(\w+)\.json`", _performance_section())
    assert cited, "the performance section names no decode-*-COMMIT.json"
    path = ROOT / cited.group(1) / f"decode-{kernel}-{cited.group(2)}.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    return {case["name"]: case for case in doc["cases"]}


def _rows() -> list[list[str]]:
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in _performance_section().splitlines()
        if re.match(r"\| \d+x\d+x\d+xR?\d+ \|", line)
    ]
    assert rows
    return rows


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row[0])
def test_decode_table_row_is_the_measurement(row: list[str]) -> None:
    case, auto_us, fast_us, flashinfer_us, ratio, target = row
    auto, fast = _results("auto")[case], _results("fast")[case]
    assert auto["snapmla"]["kernel"] == "auto" and fast["snapmla"]["kernel"] == "fast"
    measured_fi = auto["flashinfer"]["median_us"]  # the AUTO run's FlashInfer, as the table has
    assert float(auto_us) == round(auto["snapmla"]["median_us"], 1)
    assert float(fast_us) == round(fast["snapmla"]["median_us"], 1)
    assert float(flashinfer_us) == round(measured_fi, 1)
    assert float(ratio.rstrip("x")) == round(measured_fi / fast["snapmla"]["median_us"], 2)
    assert float(target) == fast["target_us"]
