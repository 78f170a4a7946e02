"""Decode outputs of the installed build, saved or compared bit for bit: an A/B of two builds
that should compute the same bits (a kernel layout change, an experimental switch).

    python3 bench/probes/dump_decode.py --save /tmp/a.npz     # with build A installed
    python3 bench/probes/dump_decode.py --compare /tmp/a.npz  # with build B: exit 1 on any change

Cases (fixed seeds; the test suite's random caches with shuffled pages, NaN-filled unused slots
and NaN-poisoned outputs, tests/gpu/_util.py): every PV width, odd head counts, MTP, page edges
and empty / one-token contexts, with AUTO, the split default and one part a request; and the
two-term query (q_precision "fp8x2", kernel "fast") at the widths it runs (s_q x h <= 32).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpu")
)

from _util import BF16, make_cache, make_case, run_decode, to_numpy

# (heads, q_len, context lengths): rows s_q x h per request pick the PV width (16, 32, 64)
CASES = [
    (32, 1, [0, 1, 63, 64, 65, 1000, 9000]),
    (16, 2, [2, 64, 130, 5000]),
    (24, 1, [17, 4096, 333]),
    (17, 1, [65, 2000]),
    (11, 3, [3, 700, 64]),
    (16, 1, [1, 64, 4097]),
    (128, 1, [63, 3000]),
]
# The two-term query's cases (its kernels: PV widths 16 and 32).
CASES_TWO_TERM = [
    (32, 1, [0, 1, 63, 64, 65, 1000, 9000]),
    (16, 2, [2, 64, 130, 5000]),
    (16, 1, [1, 64, 4097]),
    (11, 2, [65, 2000, 3]),
]


def outputs() -> dict[str, np.ndarray]:
    got = {}
    for k, (h, s_q, lens) in enumerate(CASES):
        rng = np.random.default_rng(1000 + k)
        case = make_case(rng, lens, num_heads=h, q_len=s_q)
        cache = make_cache(case)
        for parts in (0, 1):
            out, lse = run_decode(cache, case, num_sm_parts=parts)
            name = f"h{h}_sq{s_q}_parts{parts}"
            got[name + "_out"] = to_numpy(out, BF16).view(np.uint16)
            got[name + "_lse"] = to_numpy(lse).view(np.uint32)
    for k, (h, s_q, lens) in enumerate(CASES_TWO_TERM):
        rng = np.random.default_rng(2000 + k)
        case = make_case(rng, lens, num_heads=h, q_len=s_q)
        cache = make_cache(case)
        for parts in (0, 1):
            out, lse = run_decode(
                cache, case, num_sm_parts=parts, kernel="fast", q_precision="fp8x2"
            )
            name = f"fp8x2_h{h}_sq{s_q}_parts{parts}"
            got[name + "_out"] = to_numpy(out, BF16).view(np.uint16)
            got[name + "_lse"] = to_numpy(lse).view(np.uint32)
    return got


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise equal, or both NaN (a NaN's payload is not part of the contract)."""

    def as_f32(x: np.ndarray) -> np.ndarray:
        if x.dtype == np.uint16:
            return (x.astype(np.uint32) << 16).view(np.float32)
        return x.view(np.float32)

    return (a == b) | (np.isnan(as_f32(a)) & np.isnan(as_f32(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", help="write the outputs here (.npz)")
    mode.add_argument("--compare", help="compare with the outputs saved here")
    args = ap.parse_args()
    got = outputs()
    if args.save:
        np.savez(args.save, **got)
        print(f"saved {len(got)} arrays to {args.save}")
        return 0
    want = np.load(args.compare)
    bad = 0
    for name, arr in got.items():
        diff = int(np.count_nonzero(~_same(arr, want[name])))
        if diff:
            bad += 1
        print(f"{name}: {'identical' if diff == 0 else f'{diff} of {arr.size} words differ'}")
    print("all identical" if bad == 0 else f"{bad} of {len(got)} arrays differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
