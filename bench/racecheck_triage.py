"""Sorts compute-sanitizer racecheck records of the decode kernels into the one known false
positive and everything else; fails on anything else.

    python3 bench/racecheck_triage.py sanitize-racecheck.log

The known one: the seesaw kernel's row statistics (m, sigma, l, gamma of a block), written by the
block's owner warpgroup at the end of its softmax and read by the other warpgroup at the start of
the next block's softmax. Both directions are ordered through named barriers the reader or the
writer only arrives at (`bar.arrive`, then the other side's `bar.sync`: PTX orders the arriving
threads' earlier accesses before the waiters' later ones); racecheck does not model that
handoff and reports some of those pairs, a different number from run to run of the same build.
A debug build that stores (request, block) beside the statistics and traps on any other read
saw none (docs/design.md, the seesaw). Every other record, in the decode kernels or elsewhere, fails.

The pairs are recognised by source text, not line numbers: the read is a statement of
`softmax.cuh` that loads `ps.m`, `ps.sig` or `ps.l` of a row, the write one that stores
`ps.m`, `ps.sig`, `ps.l` or `ps.gamma` of a row, both in `softmax_block`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
SOFTMAX = os.path.join(os.path.dirname(HERE), "cpp", "decode", "sm90", "softmax.cuh")

_READ_STATS = re.compile(r"=\s*ps\.(m|sig|l)\[th\.row_of\(ri\)\];")
_WRITE_STATS = re.compile(r"ps\.(m|sig|l|gamma)\[th\.row_of\(ri\)\]\s*=")
_FIRST = re.compile(r"Race reported between (\w+) access at (.*) in ([\w.]+):(\d+)\s*$")
_SECOND = re.compile(r"^\s*and (\w+) access at (.*) in ([\w.]+):(\d+)(?: \[(\d+) hazards?\])?\s*$")
_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed")


@dataclass(frozen=True)
class Access:
    kind: str  # Read or Write
    function: str
    file: str
    line: int


@dataclass(frozen=True)
class Record:
    first: Access
    second: Access
    count: int  # racecheck's hazard count of the pair


def handoff_lines(source: str) -> tuple[set[int], set[int]]:
    """Line numbers (1-based) of the statistics reads and writes in softmax.cuh's text."""
    reads, writes = set(), set()
    for n, text in enumerate(source.splitlines(), 1):
        if _READ_STATS.search(text):
            reads.add(n)
        if _WRITE_STATS.search(text):
            writes.add(n)
    return reads, writes


def parse(log: str) -> tuple[list[Record], int | None]:
    """The hazard records of a racecheck log and its summary's count (None: no summary)."""
    records, pending = [], None
    summary = None
    for raw in log.splitlines():
        line = raw.removeprefix("=========").rstrip()
        m = _FIRST.search(line)
        if m:
            pending = Access(m[1], m[2], m[3], int(m[4]))
            continue
        m = _SECOND.search(line)
        if m and pending is not None:
            second = Access(m[1], m[2], m[3], int(m[4]))
            records.append(Record(pending, second, int(m[5] or 1)))
            pending = None
            continue
        m = _SUMMARY.search(line)
        if m:
            summary = int(m[1])
    return records, summary


def is_handoff(record: Record, reads: set[int], writes: set[int]) -> bool:
    accesses = (record.first, record.second)
    if any(a.file != "softmax.cuh" or "softmax_block" not in a.function for a in accesses):
        return False
    kinds = {a.kind: a.line for a in accesses}
    return set(kinds) == {"Read", "Write"} and kinds["Read"] in reads and kinds["Write"] in writes


def triage(log: str, source: str) -> tuple[list[Record], list[Record], str | None]:
    """(known handoff records, other records, a problem with the log or None)."""
    records, summary = parse(log)
    if summary is None:
        return [], records, "no RACECHECK SUMMARY line: racecheck did not finish"
    if summary != len(records):
        return [], records, f"the summary counts {summary} records, {len(records)} were parsed"
    reads, writes = handoff_lines(source)
    if not reads or not writes:
        return [], records, "softmax.cuh has no statistics reads or writes to recognise"
    known = [r for r in records if is_handoff(r, reads, writes)]
    other = [r for r in records if not is_handoff(r, reads, writes)]
    return known, other, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="compute-sanitizer --tool racecheck output")
    p.add_argument("--source", default=SOFTMAX, help="softmax.cuh of the build (default: tree)")
    args = p.parse_args(argv)
    with open(args.log, encoding="utf-8", errors="replace") as f:
        log = f.read()
    with open(args.source, encoding="utf-8") as f:
        source = f.read()
    known, other, problem = triage(log, source)
    if problem:
        print(f"racecheck triage: {problem}")
        return 1
    hazards = sum(r.count for r in known)
    print(
        f"racecheck: {len(known)} records ({hazards} hazards) are the row-statistics handoff, "
        f"{len(other)} others"
    )
    for r in other:
        a, b = r.first, r.second
        print(f"  {a.kind} {a.file}:{a.line} / {b.kind} {b.file}:{b.line} in {a.function[:120]}")
    return 0 if not other else 1


if __name__ == "__main__":
    sys.exit(main())
