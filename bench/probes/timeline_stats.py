"""Medians of a seesaw_timeline log's per-block segments (cycles), one table per timeline.

    python3 bench/probes/timeline_stats.py timeline.log [--from 6 --to 29]

For each `### <binary> ...` section of the log (CTA (0, 0)'s events, bench/seesaw_trace.cu
with -DSNAPMLA_SEESAW_TRACE), the owner warpgroup's segments of its blocks in [from, to]: the
period (qk_issue of block i + 2 after block i's), QK issue to done, the softmax (QK done to
published), and the PV of each block as its warpgroup rows record them (pv_start to pv_end).
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict


def sections(text: str):
    name, lines = None, []
    for line in text.splitlines():
        if line.startswith("### "):
            if name is not None:
                yield name, lines
            name, lines = line[4:].strip(), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        yield name, lines


def events(lines):
    ev = defaultdict(dict)  # (wg, blk) -> {event: cycle}
    pat = re.compile(r"^wg(\d) blk (\d+): (.*)$")
    for line in lines:
        m = pat.match(line.strip())
        if not m:
            continue
        wg, blk = int(m.group(1)), int(m.group(2))
        for kv in m.group(3).split():
            k, _, v = kv.partition("=")
            if v.lstrip("-").isdigit():
                ev[(wg, blk)][k] = int(v)
    return ev


def table(ev, lo: int, hi: int):
    seg = defaultdict(list)
    owner = {blk: wg for (wg, blk), e in ev.items() if "qk_issue" in e}
    for blk in range(lo, hi + 1):
        wg = owner.get(blk)
        if wg is None:
            continue
        e = ev[(wg, blk)]
        nxt = ev.get((wg, blk + 2), {})
        if "qk_issue" in nxt:
            seg["period"].append(nxt["qk_issue"] - e["qk_issue"])
        if "qk_done" in e:
            seg["qk issue to done"].append(e["qk_done"] - e["qk_issue"])
            if "published" in e:
                seg["softmax"].append(e["published"] - e["qk_done"])
        for w in (0, 1):
            f = ev.get((w, blk), {})
            if "pv_start" in f and "pv_end" in f:
                seg["own pv" if w == wg else "other's pv"].append(f["pv_end"] - f["pv_start"])
    return {k: (statistics.median(v), len(v)) for k, v in seg.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--from", dest="lo", type=int, default=6)
    ap.add_argument("--to", dest="hi", type=int, default=29)
    a = ap.parse_args()
    with open(a.log) as f:
        text = f.read()
    for name, lines in sections(text):
        rows = table(events(lines), a.lo, a.hi)
        print(f"{name}: " + ", ".join(f"{k} {v:.0f}" for k, (v, _) in rows.items()))


if __name__ == "__main__":
    main()
