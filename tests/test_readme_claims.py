"""The README's figures are the measurements it cites. Every row of its decode table and of its
accuracy table, and every range and ratio stated beside them, is recomputed here from
``bench/results/decode-h200.json`` and ``bench/results/accuracy-h200.json`` (the margins over
FlashMLA from ``bench/results/decode-flashmla-h100.json``).

After a new run replaces those files, ``python3 tests/test_readme_claims.py`` prints the rows
and ranges as the new JSONs give them, for the README's cases.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TEXT = " ".join(README.split())  # the prose with line breaks as spaces, for its claims
DECODE_JSON = "bench/results/decode-h200.json"
ACCURACY_JSON = "bench/results/accuracy-h200.json"
FLASHMLA_JSON = "bench/results/decode-flashmla-h100.json"

CASE_ROW = re.compile(r"^\| (\d+x\d+x\d+xR?\d+) \|(.*)\|\s*$", re.MULTILINE)
ACCURACY_ROW = re.compile(r"^\| ([^|`]+) \| `([\w.-]+)` \| ([\d.]+)% \|\s*$", re.MULTILINE)


def _load(path: str) -> dict[str, Any]:
    assert f"`{path}`" in README, f"the README does not cite {path}"
    return json.loads((ROOT / path).read_text(encoding="utf-8"))


def _decode() -> dict[str, Any]:
    return _load(DECODE_JSON)


def _accuracy() -> dict[str, Any]:
    return _load(ACCURACY_JSON)


def _paragraph_citing(path: str) -> str:
    """The README paragraph that names ``path``."""
    for paragraph in README.split("\n\n"):
        if f"`{path}`" in paragraph:
            return paragraph
    raise AssertionError(f"no paragraph of the README cites {path}")


def _shape(name: str) -> tuple[int, int, int, str]:
    batch, q_len, heads, context = name.split("x")
    return int(batch), int(q_len), int(heads), context


def _speedup(case: dict[str, Any]) -> float:
    return case["flashinfer"]["median_us"] / case["snapmla"]["median_us"]


def _timed_cases(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Cases where both kernels have a time."""
    return [
        c
        for c in doc["cases"]
        if c.get("snapmla", {}).get("median_us") and c.get("flashinfer", {}).get("median_us")
    ]


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def _decode_row(case: dict[str, Any]) -> list[str]:
    """The table's three measured cells of a case, as the README writes them."""
    return [
        f"{case['snapmla']['median_us']:.1f}",
        f"{case['flashinfer']['median_us']:.1f}",
        f"{_speedup(case):.2f}x",
    ]


def _decode_rows() -> list[list[str]]:
    rows = [
        [m.group(1)] + [c.strip() for c in m.group(2).split("|")] for m in CASE_ROW.finditer(README)
    ]
    assert len(rows) >= 8, f"the README's decode table has {len(rows)} rows"
    return rows


def _accuracy_rows() -> list[tuple[str, str, str]]:
    rows = [(m.group(1).strip(), m.group(2), m.group(3)) for m in ACCURACY_ROW.finditer(README)]
    assert len(rows) >= 4, f"the README's accuracy table has {len(rows)} rows"
    return rows


def _mean_error_pct(doc: dict[str, Any], config: str) -> float:
    values = [r["rel_l2"] for r in doc["results"] if r["config"] == config]
    assert values, f"{ACCURACY_JSON} has no results for {config!r}"
    return 100 * sum(values) / len(values)


def _ratios(doc: dict[str, Any], num: str, den: str) -> list[float]:
    """num's error over den's at every (context, layer) pair both have."""
    by_key = {(r["config"], r["context"], r["layer"]): r["rel_l2"] for r in doc["results"]}
    pairs = sorted({(c, l) for (g, c, l) in by_key if g == num and (den, c, l) in by_key})
    assert pairs, f"no (context, layer) pair has both {num!r} and {den!r}"
    return [by_key[(num, c, l)] / by_key[(den, c, l)] for c, l in pairs]


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# ----------------------------------------------------------------------------- decode


@pytest.mark.parametrize("row", _decode_rows(), ids=lambda row: row[0])
def test_decode_table_row_is_the_measurement(row: list[str]) -> None:
    assert len(row) == 5, f"{row[0]}: expected case, description, two times and a speed-up"
    cases = {c["name"]: c for c in _decode()["cases"]}
    assert row[0] in cases, f"{row[0]} is not a case of {DECODE_JSON}"
    case = cases[row[0]]
    assert case["snapmla"]["kernel"] == "auto", "the table shows the default kernel"
    assert row[2:] == _decode_row(case), f"{row[0]}: the JSON gives {_decode_row(case)}"


def test_decode_table_has_each_case_once() -> None:
    names = [row[0] for row in _decode_rows()]
    assert len(names) == len(set(names)), names


def test_decode_run_is_the_cited_one() -> None:
    doc, text = _decode(), _paragraph_citing(DECODE_JSON)
    commit = re.search(r"commit (\w{7,})", text)
    assert commit and doc["commit"].startswith(commit.group(1)), (commit, doc["commit"])
    assert doc["device"]["name"] in text, doc["device"]["name"]


def test_speedup_over_every_case() -> None:
    claim = re.search(r"Over all (\d+) cases: (\d+\.\d\d-\d+\.\d\d)x FlashInfer", TEXT)
    assert claim, "the README states the speed-up range over every case"
    cases = _timed_cases(_decode())
    assert int(claim.group(1)) == len(cases) == len(_decode()["cases"])
    assert claim.group(2) == _range([_speedup(c) for c in cases])


def test_speedup_at_128_heads_and_short_contexts() -> None:
    claim = re.search(
        r"At 128 heads the lead is smallest: (\d+\.\d\d-\d+\.\d\d)x FlashInfer at 1k-4k\s+contexts",
        TEXT,
    )
    assert claim, "the README states the speed-up at 128 heads and 1k-4k tokens"
    cases = [
        c
        for c in _timed_cases(_decode())
        if _shape(c["name"])[1:] in ((1, 128, "1024"), (1, 128, "4096"))
    ]
    assert len(cases) >= 2
    assert claim.group(1) == _range([_speedup(c) for c in cases])


def test_flashmla_in_the_same_run() -> None:
    """The README's margins over FlashMLA (BF16 at 128 heads, batch 1 apart; its FP8 path at
    every case) are those of the FlashMLA run it cites."""
    doc = _load(FLASHMLA_JSON)
    bf16, batch1, fp8 = [], [], []
    for case in doc["cases"]:
        batch, _, heads, _ = _shape(case["name"])
        fp8.append(case["speedup_vs_flashmla_fp8"])
        if heads == 128:
            (batch1 if batch == 1 else bf16).append(case["speedup_vs_flashmla"])
    assert len(bf16) >= 4 and len(batch1) == 1 and len(fp8) >= 8
    claim = (
        f"snapmla leads it by {_range(bf16)}x there ({batch1[0]:.2f}x at batch 1) and "
        f"FlashMLA's FP8 path by {_range(fp8)}x"
    )
    assert " ".join(claim.split()) in " ".join(TEXT.split()), claim


def test_bytes_per_token() -> None:
    per_token = _decode()["constants"]["bytes_per_token"]
    ours, bf16 = per_token["snapmla"], per_token["flashinfer"]
    assert f"{ours} bytes per token and layer ({ours / bf16:.2f}x BF16's {bf16})" in TEXT
    assert f"{ours} bytes per token and layer against {bf16} ({bf16 / ours:.2f}x the" in TEXT


# --------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize("row", _accuracy_rows(), ids=lambda row: row[1])
def test_accuracy_table_row_is_the_measurement(row: tuple[str, str, str]) -> None:
    _, config, percent = row
    measured = _mean_error_pct(_accuracy(), config)
    assert percent == f"{measured:.2f}", f"{config}: the JSON gives {measured:.2f}%"


def test_accuracy_run_is_the_cited_one() -> None:
    doc, text = _accuracy(), _paragraph_citing(ACCURACY_JSON)
    assert doc["mode"] == "gpu" and doc["kernel"]["name"] == "auto", "the kernel was measured"
    commit = re.search(r"commit (\w{7,})", text)
    assert commit and doc["commit"].startswith(commit.group(1)), (commit, doc["commit"])
    assert doc["device"].split()[-1] in text, doc["device"]
    assert f"{doc['settings']['heads']} heads" in text
    pairs = len({(r["context"], r["layer"]) for r in doc["results"]})
    assert f"Over those {pairs} layer and context pairs" in TEXT


def test_kernel_error_against_the_model() -> None:
    claim = re.search(
        r"at most (\d\.\d{3})x that of the contract's NumPy model \(geometric mean (\d\.\d{3})x\)",
        TEXT,
    )
    assert claim, "the README states the kernel's error against the model's"
    ratios = _ratios(_accuracy(), "ours", "ours-model")
    assert claim.groups() == (f"{max(ratios):.3f}", f"{_geomean(ratios):.3f}")


def test_alternative_caches_against_ours() -> None:
    claim = re.search(
        r"have (\d\.\d)x \(RoPE quantized too\) and (\d\.\d)x \(per-tensor scales\) our error",
        " ".join(TEXT.split()),
    )
    assert claim, "the README states schemes A and B against ours"
    doc = _accuracy()
    measured = tuple(f"{_geomean(_ratios(doc, s, 'ours')):.1f}" for s in ("A", "B"))
    assert claim.groups() == measured


def _print_expected() -> None:
    decode, accuracy = _decode(), _accuracy()
    cases = {c["name"]: c for c in decode["cases"]}
    print(f"decode: commit {decode['commit']}, {decode['device']['name']}")
    for row in _decode_rows():
        if row[0] in cases:
            print("| " + " | ".join(row[:2] + _decode_row(cases[row[0]])) + " |")
        else:
            print(f"{row[0]}: not a case of {DECODE_JSON}")
    timed = _timed_cases(decode)
    print(f"Over all {len(timed)} benchmark cases: {_range([_speedup(c) for c in timed])}x")
    short = [c for c in timed if _shape(c["name"])[1:] in ((1, 128, "1024"), (1, 128, "4096"))]
    print(f"128 heads, 1k-4k: {_range([_speedup(c) for c in short])}x")
    print(f"accuracy: commit {accuracy['commit']}, {accuracy['device']}")
    for description, config, _ in _accuracy_rows():
        print(f"| {description} | `{config}` | {_mean_error_pct(accuracy, config):.2f}% |")
    ratios = _ratios(accuracy, "ours", "ours-model")
    print(f"kernel vs model: at most {max(ratios):.3f}x, geometric mean {_geomean(ratios):.3f}x")
    for scheme in ("A", "B"):
        print(f"{scheme} vs ours: {_geomean(_ratios(accuracy, scheme, 'ours')):.1f}x")


if __name__ == "__main__":
    _print_expected()
