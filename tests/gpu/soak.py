"""Soak test of a serving loop, for the GPU machine (not collected by pytest: it runs minutes).

    python3 tests/gpu/soak.py [--steps 3000] [--check-every 50] [--seed 0]

A fixed batch of request slots (padded for one CUDA graph, as engines capture them), requests
joining (a prompt appended in one call) and leaving (their pages back to a free list), every
active request growing by one token per step (appended, as a decode step does), and each step
one graph replay of plan update + decode (AUTO). Every ``--check-every`` steps the same inputs
go through the reference kernel eagerly: the AUTO output must stay within the tensor-core tier
of it (no drift), finite where a request is active and exactly 0 where a slot is empty; device
memory must not grow after a warm-up. Prints steps run, requests served and the largest deviation; exit status
1 on any failure.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import snapmla
from snapmla import reference as ref

HEADS, Q_LEN, SLOTS, MAX_CONTEXT, PAGE = 16, 1, 24, 6000, 64
SM_SCALE = 192**-0.5
TIER_RTOL = 2e-2  # the contract's tensor-core tier against the model (and so the reference)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--check-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    dev = torch.device("cuda")
    max_pages = (MAX_CONTEXT + PAGE) // PAGE
    num_pages = SLOTS * max_pages
    cache = snapmla.KVCache(num_layers=1, num_pages=num_pages)
    free_pages = list(rng.permutation(num_pages))
    lens = np.zeros(SLOTS, np.int32)  # 0: the slot is empty
    pages: list[list[int]] = [[] for _ in range(SLOTS)]

    table_t = torch.zeros(SLOTS, max_pages, dtype=torch.int32, device=dev)
    lens_t = torch.zeros(SLOTS, dtype=torch.int32, device=dev)
    q_t = torch.zeros(SLOTS, Q_LEN, HEADS, 576, dtype=torch.bfloat16, device=dev)
    out = torch.empty(SLOTS, Q_LEN, HEADS, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(SLOTS, HEADS, Q_LEN, dtype=torch.float32, device=dev)
    plan = snapmla.DecodePlan(lens_t, num_heads=HEADS, q_len=Q_LEN, max_pages=max_pages)

    def append(slot: int, start: int, n: int) -> None:
        """Tokens [start, start + n) of the request in `slot`, pages taken as needed."""
        while len(pages[slot]) * PAGE < start + n:
            pages[slot].append(free_pages.pop())
        pos = np.arange(start, start + n)
        slots = np.asarray(pages[slot], np.int64)[pos // PAGE] * PAGE + pos % PAGE
        c_kv = torch.randn(n, 512, device=dev).mul_(0.5).to(torch.bfloat16)
        k_pe = torch.randn(n, 64, device=dev).mul_(0.5).to(torch.bfloat16)
        cache.append(0, c_kv, k_pe, torch.from_numpy(slots).to(dev),
                     stream=torch.cuda.current_stream().cuda_stream)

    stream = torch.cuda.current_stream()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s = torch.cuda.current_stream()
        plan.update(lens_t, stream=s)
        snapmla.decode(cache, 0, q_t, table_t, lens_t, plan, softmax_scale=SM_SCALE,
                       out=out, lse=lse, stream=s)
    torch.cuda.synchronize()
    # Device memory is compared from the end of a warm-up (a tenth of the steps): until then the
    # caching allocators (torch's, CuPy's) grow their pools, which is not a leak (0d8aa48: 36 MiB
    # in the first 300 steps, then flat to the last).
    warmup = max(1, args.steps // 10)
    mem0 = None
    worst, served, failures = 0.0, 0, []
    for step in range(args.steps):
        for slot in range(SLOTS):  # leave: finished or at the context limit
            if lens[slot] and (lens[slot] >= MAX_CONTEXT - 1 or rng.random() < 0.002):
                free_pages.extend(pages[slot])
                pages[slot], lens[slot] = [], 0
                served += 1
        for slot in np.flatnonzero(lens == 0):  # join: a prompt in one append
            if rng.random() < 0.05:
                n = int(rng.integers(1, 3000))
                append(int(slot), 0, n)
                lens[slot] = n
        active = np.flatnonzero(lens > 0)
        for slot in active:  # one new token each
            append(int(slot), int(lens[slot]), 1)
            lens[slot] += 1
        table = np.zeros((SLOTS, max_pages), np.int32)
        for slot in active:
            table[slot, : len(pages[slot])] = pages[slot]
        table_t.copy_(torch.from_numpy(table))
        lens_t.copy_(torch.from_numpy(lens))
        q_t.normal_(0.0, 0.5)
        graph.replay()
        if step == warmup:
            torch.cuda.synchronize()
            mem0 = torch.cuda.mem_get_info()[0]
        if step % args.check_every == 0 or step == args.steps - 1:
            want_out = torch.empty_like(out)
            want_lse = torch.empty_like(lse)
            ref_plan = snapmla.DecodePlan(lens_t, num_heads=HEADS, q_len=Q_LEN,
                                          max_pages=max_pages, stream=stream.cuda_stream)
            snapmla.decode(cache, 0, q_t, table_t, lens_t, ref_plan, softmax_scale=SM_SCALE,
                           out=want_out, lse=want_lse, kernel="reference",
                           stream=stream.cuda_stream)
            torch.cuda.synchronize()
            o, w = out.float().cpu().numpy(), want_out.float().cpu().numpy()
            on, off = lens > 0, lens == 0
            if on.any():
                if not np.isfinite(o[on]).all():
                    failures.append(f"step {step}: non-finite output of an active request")
                err = ref.rel_l2(o[on].astype(np.float64), w[on].astype(np.float64))
                worst = max(worst, err)
                if err > TIER_RTOL:
                    failures.append(f"step {step}: {err:.2e} from the reference kernel")
            if off.any() and not (o[off] == 0).all():
                failures.append(f"step {step}: an empty slot's output is not 0")
            print(f"step {step}: {int(on.sum())} active, {served} served, rel L2 vs reference "
                  f"{worst:.2e} (worst so far), free device memory {torch.cuda.mem_get_info()[0] >> 20} MiB",
                  flush=True)
    torch.cuda.synchronize()
    grown = 0 if mem0 is None else (mem0 - torch.cuda.mem_get_info()[0]) >> 20
    if grown > 64:
        failures.append(f"device memory grew by {grown} MiB")
    print(f"soak: {args.steps} steps, {served} requests served, largest deviation from the "
          f"reference kernel {worst:.2e} (bound {TIER_RTOL:g}), device memory change {grown} MiB")
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
