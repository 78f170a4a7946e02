"""The Q-quant kernel alone, one FP8 row against the two-term query's two (issue 9's cost at 32
rows a request: bench/NOTES.md, session 22). GPU only (PyTorch): 100 calls captured in a CUDA
graph with torch outputs given, replayed and timed by CUDA events, so that host time is left
out. (Not yet run: session 22's first try gave CuPy outputs, whose export left the capture.)

    python3 bench/time_qquant.py [--rows 2048,4096] [--heads 16]
"""
from __future__ import annotations

import argparse

import torch

import snapmla

CALLS = 100


def time_graph(call, replays: int = 20) -> float:
    """Microseconds per call of `call` (CALLS of them captured in one graph)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            call()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * CALLS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="2048,4096", help="query rows (tokens x heads), comma-separated")
    ap.add_argument("--heads", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        tokens = rows // args.heads
        q = torch.randn(tokens, args.heads, 576, device="cuda").to(torch.bfloat16)
        # torch outputs (CuPy ones would be exported on CuPy's stream, outside the capture)
        def outputs(two_term: bool) -> tuple:
            fp8 = lambda: torch.empty(tokens, args.heads, 512, dtype=torch.float8_e4m3fn,  # noqa: E731
                                      device="cuda")
            f32 = lambda: torch.empty(tokens, args.heads, device="cuda")  # noqa: E731
            rope = torch.empty(tokens, args.heads, 64, dtype=torch.bfloat16, device="cuda")
            return (fp8(), rope, f32()) + ((fp8(), f32()) if two_term else ())

        one, two = outputs(False), outputs(True)
        t1 = time_graph(lambda: snapmla.quantize_q(q, out=one))
        t2 = time_graph(lambda: snapmla.quantize_q(q, out=two, precision="fp8x2"))
        print(f"{rows} rows ({tokens} tokens x {args.heads} heads): one term {t1:.2f} us, "
              f"two terms {t2:.2f} us ({t2 / t1:.3f}x) per call in a graph")


if __name__ == "__main__":
    main()
