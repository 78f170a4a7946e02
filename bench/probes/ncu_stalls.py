"""Warp-stall samples of an ncu SASS source export, summed over instruction ranges.

    python3 bench/probes/ncu_stalls.py ncu-sass-32x1x128x16384.csv.gz     # landmarks, top lines
    python3 bench/probes/ncu_stalls.py FILE 480:617:qk 617:992:logits ...  # ranges' breakdowns

The file is what `gpu_session.sh ncu` writes (`ncu --page source --csv --print-source sass`).
Landmarks are the synchronization instructions (barriers, wgmma fences and waits, shuffles) of
the hot code, so that ranges can be chosen by reading them (e.g. the N = 64 kernel's block split
into QK, logits, exp, P8, publish and the two PVs).
"""

from __future__ import annotations

import collections
import csv
import gzip
import sys

MARKS = (
    "WARPGROUP.DEPBAR",
    "BAR.ARV",
    "BAR.SYNC",
    "MEMBAR",
    "SYNCS.PHASECHK",
    "WARPGROUP.ARRIVE",
    "SHFL.BFLY",
)


def load(path: str) -> list[tuple[str, int, int, dict[str, int]]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    head = rows[1]
    ix = {h: i for i, h in enumerate(head)}
    stalls = [h for h in head if h.startswith("stall_") and "(Not Issued)" not in h]
    recs = []
    for r in rows[2:]:
        try:
            samples = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        except (ValueError, IndexError):
            continue
        executed = int(r[ix["Instructions Executed"]] or 0)
        recs.append((r[ix["Source"]], samples, executed, {h: int(r[ix[h]] or 0) for h in stalls}))
    return recs


def main() -> None:
    recs = load(sys.argv[1])
    total = sum(r[1] for r in recs)
    print(f"{len(recs)} instructions, {total} samples")
    if len(sys.argv) == 2:
        for i, (src, _, executed, _) in enumerate(recs):
            if executed > 10000 and any(m in src for m in MARKS):
                print(f"{i:5d} {executed:9d} {src[:70]}")
        return
    for spec in sys.argv[2:]:
        a, b, label = spec.split(":", 2)
        part = recs[int(a) : int(b)]
        reasons: collections.Counter[str] = collections.Counter()
        for _, _, _, st in part:
            reasons.update(st)
        n = sum(r[1] for r in part)
        ex = sum(r[2] for r in part)
        share = sum(reasons.values()) or 1
        print(f"{label} [{a}, {b}): {n} samples ({100 * n / total:.1f}%), {ex} instructions")
        top = reasons.most_common(8)
        print("   " + " ".join(f"{k[6:]}={100 * v / share:.0f}%" for k, v in top))


if __name__ == "__main__":
    main()
