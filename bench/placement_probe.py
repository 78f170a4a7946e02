#!/usr/bin/env python3
"""One bench_decode case, timed again and again in one process under different memory states.

Session 41 found that 8x1x16x4096's two-term cost was 1.014-1.018x when the case ran alone or
first, and 1.039-1.055x when 1x1x16x8192 ran before it in the same process (same board, same
wheel, both calls' times moving). This probe asks whether what moves is *where the case's
memory lands*: it runs the case (``bench_decode.run_case``, the same data, checks and
timings, ``--two-term`` with alternating rounds) after each of a list of states, and prints
the addresses the KV cache, the plans' workspaces and the torch tensors got next to both
calls' times and the cost. A state is a ``+``-joined list of:

  torch:MiB   a torch tensor of that size, allocated before the case and kept while it runs
  cupy:MiB    the same from CuPy's pool (where the cache and the workspaces come from)
  case:NAME   a whole bench case run before (e.g. case:1x1x16x8192), its memory freed as
              bench_decode frees it between cases
  fresh       nothing

  python3 bench/placement_probe.py --case 8x1x16x4096 \\
      --states "fresh,case:1x1x16x8192,cupy:2,cupy:64,torch:64,cupy:256+torch:256" --repeat 2

Each state runs ``--repeat`` times in the given order; every line is one run_case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_decode as bd  # noqa: E402


def _recording_cache(snapmla: Any, seen: dict[str, int]) -> type:
    """A KVCache that records where its (CuPy-owned) memory starts."""

    base = snapmla.KVCache

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            owned = getattr(self, "_owned", None)
            bufs = getattr(owned, "_buffers", ()) if owned is not None else ()
            seen["cache"] = int(bufs[0].data.ptr) if bufs else 0

    return Recording


def _recording_plan(snapmla: Any, seen: dict[str, int]) -> type:
    base = snapmla.DecodePlan

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            key = "ws2" if kw.get("q_precision") == "fp8x2" else "ws1"
            seen[key] = int(self._workspace_ptr)

    return Recording


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--case", default="8x1x16x4096")
    p.add_argument("--states", default="fresh,case:1x1x16x8192,fresh")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="bench_decode --two-term-rounds")
    p.add_argument("--timing-s", type=float, default=0.3)
    a = p.parse_args(argv)

    import cupy
    import torch

    snapmla = bd.import_snapmla()
    torch.cuda.init()
    seen: dict[str, int] = {}
    snapmla.KVCache = _recording_cache(snapmla, seen)
    snapmla.DecodePlan = _recording_plan(snapmla, seen)
    args = bd._parser().parse_args(
        ["--no-flashinfer", "--two-term", f"--two-term-rounds={a.rounds}",
         f"--timing-s={a.timing_s}"]
    )
    case = bd.Case.parse(a.case)
    print(f"# {a.case}, wheel {getattr(snapmla, '__version__', '?')}; addresses in MiB "
          "(and their offset in a 2 MiB page, KiB)")
    print(f"{'state':<28} {'cache':>14} {'ws1':>14} {'ws2':>14} {'fp8 us':>8} {'fp8x2 us':>8} "
          f"{'cost':>6} {'alt':>6} {'same':>6}")
    costs: dict[str, list[float]] = {}
    for state in a.states.split(","):
        for _ in range(a.repeat):
            keep: list[Any] = []
            for part in state.split("+"):
                kind, _, val = part.partition(":")
                if kind == "torch":
                    keep.append(torch.empty(int(val) << 20, dtype=torch.uint8, device="cuda"))
                elif kind == "cupy":
                    keep.append(cupy.empty(int(val) << 20, dtype=cupy.uint8))
                elif kind == "case":
                    bd.run_case(torch, snapmla, bd.Case.parse(val), args, None, None)
                    bd._free_memory(torch)
                elif kind != "fresh":
                    raise SystemExit(f"placement_probe: unknown state part {part!r}")
            seen.clear()
            res = bd.run_case(torch, snapmla, case, args, None, None)
            del keep
            bd._free_memory(torch)
            one = (res.get("snapmla") or {}).get("median_us")
            two = res.get("snapmla_fp8x2") or {}

            def where(key: str) -> str:
                v = seen.get(key, 0)
                return f"{v >> 20}+{(v & ((2 << 20) - 1)) >> 10}"

            alt = two.get("cost_alternating")
            costs.setdefault(state, []).append(alt or 0.0)
            print(f"{state:<28} {where('cache'):>14} {where('ws1'):>14} {where('ws2'):>14} "
                  f"{bd._fmt(one, '.2f'):>8} {bd._fmt(two.get('median_us'), '.2f'):>8} "
                  f"{bd._fmt(two.get('cost_vs_fp8'), '.3f'):>6} {bd._fmt(alt, '.3f'):>6} "
                  f"{bd._fmt(two.get('cost_same_workspace'), '.3f'):>6}", flush=True)
    print("# alternating cost by state (median of its runs):")
    for state, c in costs.items():
        print(f"#   {state:<28} {statistics.median(c):.3f}  ({', '.join(f'{x:.3f}' for x in c)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
