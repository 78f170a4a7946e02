"""bench/racecheck_triage.py: the known row-statistics handoff pairs pass, anything else fails,
and a log it cannot account for fails, on records written the way compute-sanitizer writes them
and on the tree's own softmax.cuh."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from _bench_module import bench_module

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def triage() -> ModuleType:
    return bench_module("racecheck_triage")


def _fn(name: str, traits: str = "(int)32, (bool)0") -> str:
    return (
        f"void snapmla::decode::seesaw::{name}<snapmla::decode::seesaw::KernelTraits<{traits}>>"
        "(snapmla::decode::seesaw::SharedStorage &, const snapmla::decode::DecodeParams &)+0x4560"
    )


def _record(read: tuple[str, str, int], write: tuple[str, str, int], hazards: int = 64) -> str:
    return (
        f"========= Error: Race reported between Read access at {read[0]} in {read[1]}:{read[2]}\n"
        f"=========     and Write access at {write[0]} in {write[1]}:{write[2]} [{hazards} hazards]\n"
        "========= \n"
    )


def _log(*records: str, summary: int | None = None) -> str:
    n = len(records) if summary is None else summary
    return (
        "========= COMPUTE-SANITIZER\nsmoke output\n"
        + "".join(records)
        + f"========= RACECHECK SUMMARY: {n} hazards displayed ({n} errors, 0 warnings)\n"
    )


@pytest.fixture(scope="module")
def lines(triage: ModuleType) -> tuple[list[int], list[int]]:
    reads, writes = triage.handoff_lines(Path(triage.SOFTMAX).read_text())
    return sorted(reads), sorted(writes)


def test_the_tree_has_three_statistics_reads_and_four_writes(lines) -> None:
    reads, writes = lines
    assert len(reads) == 3 and len(writes) == 4, lines
    assert max(reads) < min(writes)  # the previous block's read comes first in softmax_block


def test_handoff_pairs_pass_and_are_counted(triage, lines) -> None:
    reads, writes = lines
    sm = _fn("softmax_block")
    log = _log(
        _record((sm, "softmax.cuh", reads[0]), (sm, "softmax.cuh", writes[0])),
        _record((sm, "softmax.cuh", reads[2]), (sm, "softmax.cuh", writes[2]), hazards=32),
    )
    known, other, problem = triage.triage(log, Path(triage.SOFTMAX).read_text())
    assert problem is None and not other and len(known) == 2
    assert sum(r.count for r in known) == 96


@pytest.mark.parametrize(
    "case",
    ["write_not_stats", "read_not_stats", "other_file", "other_function", "two_writes"],
)
def test_anything_else_fails(triage, lines, case: str) -> None:
    reads, writes = lines
    sm, pv = _fn("softmax_block"), _fn("pv_block")
    read, write = (sm, "softmax.cuh", reads[0]), (sm, "softmax.cuh", writes[0])
    if case == "write_not_stats":
        write = (sm, "softmax.cuh", writes[-1] + 2)
    elif case == "read_not_stats":
        read = (sm, "softmax.cuh", reads[0] - 3)
    elif case == "other_file":
        read = (pv, "pv.cuh", reads[0])
    elif case == "other_function":
        read = (pv, "softmax.cuh", reads[0])
    record = _record(read, write)
    if case == "two_writes":
        record = record.replace("Read access", "Write access")
    log = _log(_record((sm, "softmax.cuh", reads[1]), (sm, "softmax.cuh", writes[1])), record)
    known, other, problem = triage.triage(log, Path(triage.SOFTMAX).read_text())
    assert problem is None and len(known) == 1 and len(other) == 1, case


def test_a_log_it_cannot_account_for_fails(triage, lines, tmp_path: Path) -> None:
    reads, writes = lines
    sm = _fn("softmax_block")
    record = _record((sm, "softmax.cuh", reads[0]), (sm, "softmax.cuh", writes[0]))
    source = Path(triage.SOFTMAX).read_text()
    assert triage.triage(_log(record, summary=2), source)[2] is not None  # a record not parsed
    assert triage.triage("========= COMPUTE-SANITIZER\n" + record, source)[2] is not None
    assert triage.triage(_log(record), "no statistics here")[2] is not None
    path = tmp_path / "racecheck.log"
    path.write_text(_log(record))
    assert triage.main([str(path)]) == 0
    path.write_text(_log(record, summary=3))
    assert triage.main([str(path)]) == 1


def test_a_clean_log_passes(triage, tmp_path: Path) -> None:
    path = tmp_path / "racecheck.log"
    path.write_text(_log())
    assert triage.main([str(path)]) == 0
