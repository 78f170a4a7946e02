"""Where a snapmla.torch decode call's host time goes (issue #10), on the GPU machine: the
public call, its parts, and the C call alone, each timed over N calls (median of 5 rounds).

    python3 bench/host_torch_parts.py [--batch 1] [--heads 128] [--iters 2000]

One decode layer of 100 tokens per request (bench_host_overhead.py's setup), torch tensors on
cuda:0, outputs given, after a warm-up that fills the call memo (and, with the library's
repeated-call graphs, captures the call's graph)."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

import snapmla
import snapmla.torch as smt
from snapmla import _lib


def per_call_us(fn: Callable[[], Any], iters: int) -> float:
    """Median over 5 rounds of the host time per call, timed in chunks of 64 calls with the
    GPU drained between chunks (untimed), so that the launch queue never fills and the host
    never waits for the GPU inside a timed chunk."""
    rounds = []
    for _ in range(5):
        total = 0
        for _ in range(max(1, iters // 64)):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(64):
                fn()
            total += time.perf_counter_ns() - t0
        rounds.append(total / (max(1, iters // 64) * 64) / 1000)
    torch.cuda.synchronize()
    return statistics.median(rounds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--iters", type=int, default=2000)
    a = p.parse_args()
    b, h, max_pages = a.batch, a.heads, 64
    cache = smt.empty_cache(1, max_pages, device="cuda")
    q = torch.zeros(b, 1, h, 576, dtype=torch.bfloat16, device="cuda")
    block_table = torch.arange(max_pages, dtype=torch.int32, device="cuda").repeat(b, 1)
    seqlens = torch.full((b,), 100, dtype=torch.int32, device="cuda")
    plan, ws = smt.decode_buffers(b, num_heads=h, max_pages=max_pages)
    smt.plan(plan, seqlens, num_heads=h, max_pages=max_pages)
    out = torch.empty(b, 1, h, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(b, h, 1, dtype=torch.float32, device="cuda")
    scale = 192**-0.5
    op_args = (cache, 0, q, block_table, seqlens, plan, ws, out, lse, scale, True, 0, 0)

    def public() -> None:
        smt.decode(cache, 0, q, block_table, seqlens, plan, ws, softmax_scale=scale, out=out,
                   lse=lse)  # fmt: skip

    for _ in range(50):
        public()
    torch.cuda.synchronize()
    assert len(smt._decode_memo) >= 1
    args, config, handle, plan_ptr, ws_ptr, index = next(iter(smt._decode_memo.values()))
    c_decode = _lib.lib().snapmla_decode
    stream = smt._stream_of(index)
    tensors = (cache, q, block_table, seqlens, plan, ws, out, lse)

    strided = (q, block_table)  # the two the memo keys by stride; the rest by is_contiguous()
    contiguous = (cache, seqlens, plan, ws, out, lse)

    def key() -> tuple[Any, ...]:  # (smt._decode's key, as a loop)
        return tuple(
            (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device()) for t in strided
        ) + tuple(
            (t.data_ptr(), t.shape, t.is_contiguous(), t.dtype, t.get_device())
            for t in contiguous
        )

    memo = {key(): 1}
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("public smt.decode (eager: direct)", public),
        ("torch.ops.snapmla.decode (dispatcher)", lambda: torch.ops.snapmla.decode(*op_args)),
        ("smt._decode (the implementation)", lambda: smt._decode(*op_args)),
        ("C snapmla_decode alone (cffi)", lambda: c_decode(handle, config, args, plan_ptr,
                                                           ws_ptr, stream)),  # fmt: skip
        ("memo key (8 tensors) + dict get", lambda: memo.get(key())),
        ("smt._eager(8 tensors, 2 ints)", lambda: smt._eager(*tensors, ints=(0, 0))),
        ("smt._stream_of(0)", lambda: smt._stream_of(0)),
        ("smt._current_device()", smt._current_device),
        ("_lib.lib().snapmla_decode lookup", lambda: _lib.lib().snapmla_decode),
    ]
    print(f"snapmla.torch decode host time, batch {b}, heads {h}, {a.iters} calls x 5 rounds "
          f"(median round; chunks of 64 calls, GPU drained between), snapmla "
          f"{snapmla.version()}")  # fmt: skip
    for name, fn in parts:
        print(f"{name:<42} {per_call_us(fn, a.iters):8.2f} us")


if __name__ == "__main__":
    main()
