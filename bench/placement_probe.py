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
``--recreate`` builds the case once and rebuilds named parts between trials, each trial an
interleaved cost (``--profile``: each kernel's time under torch.profiler; ``parts:N``: the
plans' num_sm_parts).

Session 42's answer (bench/results/2026-12-04-s42/): not the addresses. With 132 parts of 4
blocks the graphs ran in one of two states from one capture to the next, and in the second the
one-term attention kernel was 1.1 us faster while the two-term one was not (cost 1.017 or
1.077); with the last 16 parts empty, so that no attention CTA waits for an SM the Q-quant
kernel holds, both forms were faster and in the same state in every trial (twelve with
112-124 parts; decode/plan.cu, SNAPMLA_PLAN_QQ_ROOM).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_decode as bd


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


class Setup:
    """One case's data as bench_decode builds it (random BF16 pages appended to an FP8 cache,
    ROTATE_BYTES of copies, shuffled pages), with each part re-creatable on its own."""

    def __init__(self, torch: Any, snapmla: Any, case: Any, seed: int = 0) -> None:
        import numpy as np

        self.torch, self.snapmla, self.case = torch, snapmla, case
        self.seqlens = case.seqlens(seed)
        ppr = [-(-n // bd.PAGE_SIZE) for n in self.seqlens]
        self.pages = sum(ppr)
        self.max_pages = max(ppr)
        page_bytes = self.pages * bd.PAGE_BYTES
        self.copies = max(1, min(bd.MAX_COPIES, -(-bd.ROTATE_BYTES // page_bytes)))
        total = self.pages * self.copies
        torch.manual_seed(seed)
        self.ckv = torch.randn(total, bd.PAGE_SIZE, bd.CONTENT_DIM, device="cuda").mul_(0.5)
        self.ckv = self.ckv.to(torch.bfloat16)
        self.kpe = torch.randn(total, bd.PAGE_SIZE, bd.ROPE_DIM, device="cuda").mul_(0.5)
        self.kpe = self.kpe.to(torch.bfloat16)
        perm = np.random.default_rng(seed).permutation(self.pages).astype(np.int32)
        offs = np.concatenate([[0], np.cumsum(ppr)])
        bt = np.zeros((case.batch, self.max_pages), dtype=np.int32)
        for r in range(case.batch):
            bt[r, : ppr[r]] = perm[offs[r] : offs[r + 1]]
        self.bt_rel = bt
        self.q_cpu = torch.randn(case.batch, case.q_len, case.heads, bd.HEAD_DIM).mul_(0.5)
        self.q_cpu = self.q_cpu.to(torch.bfloat16)
        self.cache = self.plan1 = self.plan2 = None
        self.num_sm_parts = 0
        for part in ("cache", "tables", "io", "plans"):
            self.recreate(part)

    def stream(self) -> int:
        return self.torch.cuda.current_stream().cuda_stream

    def recreate(self, part: str) -> None:
        torch, snapmla, case = self.torch, self.snapmla, self.case
        if part == "cache":
            old = self.cache
            self.cache = snapmla.KVCache(num_layers=1, num_pages=self.ckv.shape[0])
            slots = torch.arange(self.ckv.shape[0] * bd.PAGE_SIZE, device="cuda")
            self.cache.append(
                0,
                self.ckv.view(-1, bd.CONTENT_DIM),
                self.kpe.view(-1, bd.ROPE_DIM),
                slots,
                stream=self.stream(),
            )
            torch.cuda.synchronize()
            if old is not None:
                old.close()
        elif part == "tables":
            rel = torch.from_numpy(self.bt_rel).cuda()
            self.tables = torch.stack([rel + c * self.pages for c in range(self.copies)])
            self.seqlens_t = torch.tensor(self.seqlens, dtype=torch.int32, device="cuda")
        elif part == "io":
            self.q = self.q_cpu.cuda()
            self.out = torch.empty(
                case.batch,
                case.q_len,
                case.heads,
                bd.CONTENT_DIM,
                dtype=torch.bfloat16,
                device="cuda",
            )
            self.lse = torch.empty(
                case.batch, case.heads, case.q_len, dtype=torch.float32, device="cuda"
            )
        elif part.startswith("parts:"):  # the plans' num_sm_parts, then new plans
            self.num_sm_parts = int(part[6:])
            self.recreate("plans")
        elif part == "plans":
            for old in (self.plan1, self.plan2):
                if old is not None:
                    old.close()
            kw = {
                "num_heads": case.heads,
                "q_len": case.q_len,
                "max_pages": self.max_pages,
                "num_sm_parts": self.num_sm_parts,
                "stream": self.stream(),
            }
            self.plan1 = snapmla.DecodePlan(self.seqlens_t, **kw)
            self.plan2 = snapmla.DecodePlan(self.seqlens_t, q_precision="fp8x2", **kw)
        elif part != "none":
            raise SystemExit(f"placement_probe: unknown part {part!r}")

    def call(self, plan: Any) -> Any:
        def run(i: int) -> None:
            self.snapmla.decode(
                self.cache,
                0,
                self.q,
                self.tables[i % self.copies],
                self.seqlens_t,
                plan,
                softmax_scale=bd.SOFTMAX_SCALE,
                causal=self.case.q_len > 1,
                out=self.out,
                lse=self.lse,
                stream=self.stream(),
            )

        return run


def recreate_mode(torch: Any, snapmla: Any, a: argparse.Namespace) -> int:
    """--recreate: the case's data built once; before each trial the named parts are built
    anew (the rest kept), then the two calls' interleaved cost."""
    setup = Setup(torch, snapmla, bd.Case.parse(a.case))
    print(
        f"# {a.case} recreate mode: {setup.copies} KV copies; interleaved medians (us), "
        "cost and its p10 / p90 over the rounds"
    )
    t_start = time.perf_counter()
    for parts in a.recreate.split(","):
        for _ in range(a.repeat):
            for part in parts.split("+"):
                setup.recreate(part)
            bd._free_memory(torch)
            one = setup.call(setup.plan1)
            two = setup.call(setup.plan2)
            graphs: list[Any] = []
            times = bd.interleaved_times(
                torch,
                [one, two],
                per_call_s=a.per_call_us * 1e-6,
                variants=setup.copies,
                pairs=a.pairs,
                keep_graphs=graphs,
            )
            assert times is not None, "graph capture failed"
            ratios = sorted(b / x for x, b in zip(*times))
            q = statistics.quantiles(ratios, n=10)
            print(
                f"{parts:<20} {time.perf_counter() - t_start:6.1f} s  "
                f"fp8 {statistics.median(times[0]) * 1e6:6.2f}  "
                f"fp8x2 {statistics.median(times[1]) * 1e6:6.2f}  "
                f"cost {statistics.median(ratios):.3f} ({q[0]:.3f} / {q[-1]:.3f})  "
                f"cache {int(setup.cache._owned._buffers[0].data.ptr) >> 20} MiB",
                flush=True,
            )
            if a.profile:
                for label, g in zip(("fp8", "fp8x2"), graphs):
                    try:
                        summary = kernel_profile(torch, g)
                    except Exception as exc:  # noqa: BLE001 (a torch without kineto's events)
                        summary = f"no profile: {exc}"
                    print(f"    {label}: {summary}", flush=True)
            del graphs
    return 0


def kernel_profile(torch: Any, graph: Any) -> str:
    """One replay of a graph under torch.profiler: each kernel's mean duration and the mean
    gap before it (from the previous kernel's end), us."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == torch.autograd.DeviceType.CUDA and e.duration_ns() > 0:
            kernels.append((e.start_ns(), e.duration_ns(), e.name()))
    kernels.sort()
    stats: dict[str, list[float]] = {}
    end = None
    for start, dur, name in kernels:
        short = name.split("<")[0].split("(")[0][-28:]
        gap = (start - end) / 1e3 if end is not None else 0.0
        stats.setdefault(short, []).append(dur / 1e3)
        stats.setdefault(short + " gap", []).append(gap)
        end = start + dur
    return "  ".join(f"{k} {statistics.mean(v):.2f}" for k, v in stats.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--case", default="8x1x16x4096")
    p.add_argument("--states", default="fresh,case:1x1x16x8192,fresh")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="bench_decode --two-term-rounds")
    p.add_argument("--timing-s", type=float, default=0.3)
    p.add_argument(
        "--recreate",
        help="instead of --states: comma-separated trials, each a "
        "+-joined list of parts built anew before it (none, cache, tables, io, plans, "
        "parts:N = plans with num_sm_parts N from then on)",
    )
    p.add_argument("--pairs", type=int, default=100, help="--recreate: interleaved rounds")
    p.add_argument(
        "--per-call-us",
        type=float,
        default=17.0,
        help="--recreate: a call's expected time, for the graphs' length (default 17)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="--recreate: after each trial, one replay of each graph under torch.profiler",
    )
    a = p.parse_args(argv)

    import cupy
    import torch

    snapmla = bd.import_snapmla()
    torch.cuda.init()
    if a.recreate:
        return recreate_mode(torch, snapmla, a)
    seen: dict[str, int] = {}
    snapmla.KVCache = _recording_cache(snapmla, seen)
    snapmla.DecodePlan = _recording_plan(snapmla, seen)
    args = bd._parser().parse_args(
        [
            "--no-flashinfer",
            "--two-term",
            f"--two-term-rounds={a.rounds}",
            f"--timing-s={a.timing_s}",
        ]
    )
    case = bd.Case.parse(a.case)
    print(
        f"# {a.case}; addresses in MiB; t s: seconds since the first run; cost, alt, same: "
        "bench_decode's two-term costs; il: the interleaved rounds' medians (us) and ratios"
    )
    print(
        f"{'state':<24} {'t s':>6} {'cache':>10} {'ws1':>10} {'ws2':>10} {'fp8 us':>7} "
        f"{'fp8x2':>7} {'cost':>6} {'alt':>6} {'same':>6} {'il fp8':>7} {'il fp8x2':>8} "
        f"{'inter':>6} {'p10':>6} {'p90':>6}"
    )
    t_start = time.perf_counter()
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
            t_run = time.perf_counter() - t_start
            res = bd.run_case(torch, snapmla, case, args, None, None)
            del keep
            bd._free_memory(torch)
            one = (res.get("snapmla") or {}).get("median_us")
            two = res.get("snapmla_fp8x2") or {}

            def where(key: str) -> str:
                return str(seen.get(key, 0) >> 20)

            alt = two.get("cost_alternating")
            il = two.get("interleaved") or {}
            costs.setdefault(state, []).append(two.get("cost_interleaved") or 0.0)
            print(
                f"{state:<24} {t_run:>6.1f} {where('cache'):>10} {where('ws1'):>10} "
                f"{where('ws2'):>10} {bd._fmt(one, '.2f'):>7} "
                f"{bd._fmt(two.get('median_us'), '.2f'):>7} "
                f"{bd._fmt(two.get('cost_vs_fp8'), '.3f'):>6} {bd._fmt(alt, '.3f'):>6} "
                f"{bd._fmt(two.get('cost_same_workspace'), '.3f'):>6} "
                f"{bd._fmt(il.get('fp8_us'), '.2f'):>7} {bd._fmt(il.get('fp8x2_us'), '.2f'):>8} "
                f"{bd._fmt(two.get('cost_interleaved'), '.3f'):>6} "
                f"{bd._fmt(il.get('ratio_p10'), '.3f'):>6} "
                f"{bd._fmt(il.get('ratio_p90'), '.3f'):>6}",
                flush=True,
            )
    print("# interleaved cost by state (median of its runs):")
    for state, c in costs.items():
        print(f"#   {state:<28} {statistics.median(c):.3f}  ({', '.join(f'{x:.3f}' for x in c)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
