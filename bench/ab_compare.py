"""Compare two builds timed in one GPU call: bench_decode.py results of each build, interleaved.

    python3 bench/ab_compare.py decode-cases*.json --base 30b2541 --out ab.json
    python3 bench/ab_compare.py decode-cases*.json --base 30b2541 --new 6093ba6  # one of several

Each input is a bench_decode.py result; the build is the commit it names. With `--new`, the
files of builds other than the two named are left out (an A/B of several builds in one call).
Per case, the median time of every run of a build is averaged over its runs, and the ratio
new / base printed with the runs themselves (their spread is the noise the ratio is read
against). The JSON written keeps every run's median, the ratios and the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any


def compare(
    docs: list[dict[str, Any]], base: str, tolerance: float, new: str | None = None
) -> dict[str, Any]:
    runs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for doc in docs:
        for case in doc["cases"]:
            runs[doc["commit"]][case["name"]].append(case["snapmla"]["median_us"])
    bases = [c for c in runs if c.startswith(base)]
    news = [c for c in runs if not c.startswith(base) and (new is None or c.startswith(new))]
    if len(bases) != 1 or len(news) != 1:
        other = "one other build" if new is None else f"one build {new}"
        raise ValueError(f"expected one base ({base}) and {other}, got {sorted(runs)}")
    b, n = runs[bases[0]], runs[news[0]]
    cases = []
    for name in b:
        if name not in n:
            raise ValueError(f"case {name} was timed for the base build only")
        ratio = (sum(n[name]) / len(n[name])) / (sum(b[name]) / len(b[name]))
        cases.append({"name": name, "base_us": b[name], "new_us": n[name], "ratio": ratio})
    within = sum(abs(c["ratio"] - 1) <= tolerance for c in cases)
    return {
        "base": bases[0],
        "new": news[0],
        "device": docs[0]["device"]["name"],
        "settings": docs[0]["settings"],
        "tolerance": tolerance,
        "within": within,
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench_decode.py JSON files of both builds")
    ap.add_argument("--base", required=True, help="the base build's commit (a prefix)")
    ap.add_argument(
        "--new", help="the other build's commit (a prefix); other builds' files left out"
    )
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--out", help="write the comparison here")
    args = ap.parse_args(argv)
    docs = []
    for path in args.results:
        with open(path) as f:
            docs.append(json.load(f))
    result = compare(docs, args.base, args.tolerance, args.new)
    print(f"{result['new']} against {result['base']} on {result['device']}")
    for c in result["cases"]:
        base = " ".join(f"{x:7.1f}" for x in c["base_us"])
        new = " ".join(f"{x:7.1f}" for x in c["new_us"])
        print(f"{c['name']:20s} base {base}  new {new}  new/base {c['ratio']:.3f}")
    ratios = [c["ratio"] for c in result["cases"]]
    print(
        f"new/base {min(ratios):.3f}-{max(ratios):.3f}; within {args.tolerance:.0%}: "
        f"{result['within']} of {len(ratios)}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
