"""bench/ab_compare.py: the ratios of two builds' interleaved runs."""

from __future__ import annotations

import json

import pytest

from _bench_module import bench_module

ab = bench_module("ab_compare")


def _doc(commit: str, times: dict[str, float]) -> dict:
    return {
        "commit": commit,
        "device": {"name": "GPU"},
        "settings": {"timing_s": 0.05},
        "cases": [{"name": k, "snapmla": {"median_us": v}} for k, v in times.items()],
    }


def test_ratio_of_the_builds_means_and_the_count_within_tolerance(tmp_path) -> None:
    docs = [
        _doc("aaaaaaa", {"x": 100.0, "y": 10.0}),
        _doc("bbbbbbb", {"x": 101.0, "y": 11.0}),
        _doc("bbbbbbb", {"x": 102.0, "y": 11.0}),
        _doc("aaaaaaa", {"x": 100.0, "y": 10.0}),
    ]
    paths = []
    for i, doc in enumerate(docs):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(doc))
    out = tmp_path / "ab.json"
    assert ab.main([*map(str, paths), "--base", "aaa", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    ratios = {c["name"]: c["ratio"] for c in result["cases"]}
    assert ratios["x"] == pytest.approx(1.015) and ratios["y"] == pytest.approx(1.1)
    assert result["within"] == 1 and result["base"] == "aaaaaaa" and result["new"] == "bbbbbbb"
    assert result["cases"][0]["base_us"] == [100.0, 100.0]


def test_needs_exactly_two_builds_and_the_same_cases() -> None:
    with pytest.raises(ValueError, match="one base"):
        ab.compare([_doc("aaaaaaa", {"x": 1.0})], "aaa", 0.02)
    with pytest.raises(ValueError, match="base build only"):
        ab.compare([_doc("aaaaaaa", {"x": 1.0}), _doc("bbbbbbb", {"z": 1.0})], "aaa", 0.02)


def test_new_picks_one_build_of_several() -> None:
    docs = [
        _doc("aaaaaaa", {"x": 100.0}),
        _doc("bbbbbbb", {"x": 110.0}),
        _doc("ccccccc", {"x": 90.0}),
    ]
    assert ab.compare(docs, "aaa", 0.02, new="ccc")["cases"][0]["ratio"] == pytest.approx(0.9)
    assert ab.compare(docs, "aaa", 0.02, new="bbb")["new"] == "bbbbbbb"
    with pytest.raises(ValueError, match="one other build"):
        ab.compare(docs, "aaa", 0.02)
    with pytest.raises(ValueError, match="one build ddd"):
        ab.compare(docs, "aaa", 0.02, new="ddd")
