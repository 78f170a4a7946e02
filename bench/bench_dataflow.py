"""Data-movement throughput: KVCache.append, quantize_q and KVCache.fetch_dequant.

Each operation runs on large inputs (1M and 4M tokens or query rows by default; random slot
permutations for append and fetch-dequant) and is reported in GB/s of bytes read plus bytes
written, counted here explicitly:

    append         reads 1152 B/token (BF16 c_kv + k_pe) + 8 (int64 slot), writes 644
    quantize_q     reads 1152 B per (token, head) row, writes 644 (FP8 512 + BF16 128 + fp32 4)
    fetch_dequant  reads 644 B/token + 8 (slot), writes 1152

against the target of 0.8 x 4.2 TB/s, next to a device-to-device copy (torch ``copy_``) that
moves the same number of bytes (half read, half written), measured in the same run as a
ceiling. Timing as in bench_decode.py: CUDA-graph replay, median over >= 20 replays.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_decode import (  # the sibling script's helpers
    BF16_BYTES_PER_TOKEN,
    CONTENT_DIM,
    HBM_TBPS,
    HEAD_DIM,
    MIN_REPS,
    OUR_BYTES_PER_TOKEN,
    PAGE_SIZE,
    ROPE_DIM,
    _fmt,
    _free_memory,
    _rel_l2,
    git_commit,
    open_gpu,
    short_error,
    time_calls,
    write_json,
)

SLOT_BYTES = 8
TARGET_FRACTION = 0.8
TARGET_GBPS = TARGET_FRACTION * HBM_TBPS * 1e3
CHECK_ROWS = 1 << 16  # rows the sanity checks look at
OPS = ("append", "quantize_q", "fetch_dequant")

# Bytes per token (or per query row): (read, written).
BYTES = {
    "append": (BF16_BYTES_PER_TOKEN + SLOT_BYTES, OUR_BYTES_PER_TOKEN),
    "quantize_q": (BF16_BYTES_PER_TOKEN, OUR_BYTES_PER_TOKEN),
    "fetch_dequant": (OUR_BYTES_PER_TOKEN + SLOT_BYTES, BF16_BYTES_PER_TOKEN),
}


def _size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    value = int(text[:-1] if text[-1:] in "KMG" else text)
    return value * mult


def _stream(torch: Any) -> int:
    return torch.cuda.current_stream().cuda_stream


def _timed(torch: Any, fn: Any, args: argparse.Namespace) -> dict[str, Any]:
    return time_calls(torch, lambda i: fn(), target_s=args.timing_s, use_graph=not args.no_graph)


def _copy_ceiling(torch: Any, nbytes: int, args: argparse.Namespace) -> dict[str, Any]:
    """torch copy_ of nbytes/2 bytes: moves nbytes (read + write)."""
    half = nbytes // 2 // 16 * 16
    src = torch.randint(1, 255, (half,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = _timed(torch, lambda: dst.copy_(src), args)
    t["bytes_moved"] = 2 * half
    t["gbps"] = 2 * half / (t["median_us"] * 1e-6) / 1e9
    return t


def _result(op: str, rows: int, t: dict[str, Any] | None) -> dict[str, Any]:
    read, written = BYTES[op]
    total = rows * (read + written)
    res: dict[str, Any] = {
        "op": op,
        "rows": rows,
        "bytes_read": rows * read,
        "bytes_written": rows * written,
        "bytes_total": total,
        "target_gbps": TARGET_GBPS,
        "error": None,
    }
    if t is not None:
        res.update(t)
        res["gbps"] = total / (t["median_us"] * 1e-6) / 1e9
        res["pass"] = res["gbps"] >= TARGET_GBPS
    return res


def bench_cache_ops(
    torch: Any, snapmla: Any, n: int, args: argparse.Namespace, ops: list[str]
) -> list[dict[str, Any]]:
    """append and fetch_dequant of n tokens at a random permutation of the cache's slots."""
    results = []
    num_pages = -(-n // PAGE_SIZE)
    c_kv = torch.empty(n, CONTENT_DIM, dtype=torch.bfloat16, device="cuda").normal_(0.0, 0.5)
    k_pe = torch.empty(n, ROPE_DIM, dtype=torch.bfloat16, device="cuda").normal_(0.0, 0.5)
    slots = torch.randperm(num_pages * PAGE_SIZE, device="cuda")[:n].to(torch.int64)
    cache = snapmla.KVCache(num_layers=1, num_pages=num_pages)
    try:
        cache.append(0, c_kv, k_pe, slots, stream=_stream(torch))  # every slot holds data
        torch.cuda.synchronize()
        if "append" in ops:
            res = _result("append", n, None)
            try:
                t = _timed(
                    torch, lambda: cache.append(0, c_kv, k_pe, slots, stream=_stream(torch)), args
                )
                res = _result("append", n, t)
            except Exception as exc:  # noqa: BLE001 (recorded in the results)
                torch.cuda.synchronize()
                res["error"] = short_error(exc)
            results.append(res)
        if "fetch_dequant" in ops:
            out_c = torch.empty_like(c_kv)
            out_k = torch.empty_like(k_pe)
            res = _result("fetch_dequant", n, None)
            try:

                def fetch() -> None:
                    cache.fetch_dequant(0, slots, c_kv=out_c, k_pe=out_k, stream=_stream(torch))

                fetch()
                torch.cuda.synchronize()
                m = min(n, CHECK_ROWS)
                checks = {
                    "roundtrip_c_kv_rel_l2": _rel_l2(torch, out_c[:m], c_kv[:m]),
                    "roundtrip_k_pe_rel_l2": _rel_l2(torch, out_k[:m], k_pe[:m]),
                }
                res = _result("fetch_dequant", n, _timed(torch, fetch, args))
                res["checks"] = checks
            except Exception as exc:  # noqa: BLE001 (recorded in the results)
                torch.cuda.synchronize()
                res["error"] = short_error(exc)
            results.append(res)
    finally:
        torch.cuda.synchronize()
        cache.close()
    return results


def bench_quantize_q(
    torch: Any, snapmla: Any, rows: int, heads: int, args: argparse.Namespace
) -> dict[str, Any]:
    """quantize_q of rows = tokens x heads query rows (q BF16 [tokens, heads, 576])."""
    tokens = max(1, rows // heads)
    rows = tokens * heads
    res = _result("quantize_q", rows, None)
    res["heads"] = heads
    q = torch.empty(tokens, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda").normal_(0.0, 0.5)
    q8 = torch.empty(tokens, heads, CONTENT_DIM, dtype=torch.float8_e4m3fn, device="cuda")
    qr = torch.empty(tokens, heads, ROPE_DIM, dtype=torch.bfloat16, device="cuda")
    qs = torch.empty(tokens, heads, dtype=torch.float32, device="cuda")
    try:

        def quant() -> None:
            snapmla.quantize_q(q, out=(q8, qr, qs), stream=_stream(torch))

        quant()
        torch.cuda.synchronize()
        m = max(1, min(tokens, CHECK_ROWS // heads))
        scale = qs[:m, :, None]
        checks = {
            "dequant_content_rel_l2": _rel_l2(
                torch, q8[:m].float() * scale, q[:m, :, :CONTENT_DIM]
            ),
            "dequant_rope_rel_l2": _rel_l2(torch, qr[:m].float() * scale, q[:m, :, CONTENT_DIM:]),
        }
        t = _timed(torch, quant, args)
        res = _result("quantize_q", rows, t)
        res["heads"] = heads
        res["checks"] = checks
    except Exception as exc:  # noqa: BLE001 (recorded in the results)
        torch.cuda.synchronize()
        res["error"] = short_error(exc)
    return res


def table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'op':<14} {'rows':>9} {'MB moved':>9} {'us':>9} {'GB/s':>7} {'copy GB/s':>9} "
        f"{'%copy':>6} {'target':>6} {'pass':>4} {'check err%':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        copy = r.get("copy") or {}
        gbps = r.get("gbps")
        cg = copy.get("gbps")
        checks = r.get("checks") or {}
        err = max(checks.values()) if checks else None
        ok = r.get("pass")
        lines.append(
            f"{r['op']:<14} {r['rows']:>9} {r['bytes_total'] / 1e6:>9.0f} "
            f"{_fmt(r.get('median_us')):>9} {_fmt(gbps, '.0f'):>7} {_fmt(cg, '.0f'):>9} "
            f"{_fmt(100 * gbps / cg if gbps and cg else None, '.0f'):>6} "
            f"{r['target_gbps']:>6.0f} {'-' if ok is None else ('yes' if ok else 'NO'):>4} "
            f"{_fmt(None if err is None else 100 * err, '.2f'):>10}"
        )
        if r.get("error"):
            lines.append(f"    error: {r['error'][:150]}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", default="1M,4M", help="tokens (query rows for quantize_q), e.g. '1M,4M'"
    )
    p.add_argument(
        "--ops", default=",".join(OPS), help=f"comma-separated subset of {', '.join(OPS)}"
    )
    p.add_argument("--heads", type=int, default=128, help="query heads for quantize_q (128)")
    p.add_argument("--no-copy", action="store_true", help="skip the copy_ ceiling")
    p.add_argument("--out", help="write the JSON results here")
    p.add_argument("--quick", action="store_true", help="shorter timing (0.05 s per point)")
    p.add_argument(
        "--timing-s",
        type=float,
        default=None,
        help="seconds of replays per point (default 0.2, --quick 0.05)",
    )
    p.add_argument("--no-graph", action="store_true", help="time eager launches instead")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.timing_s is None:
        args.timing_s = 0.05 if args.quick else 0.2
    sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        print(f"bench_dataflow: unknown ops {unknown}; choose from {OPS}", file=sys.stderr)
        return 2

    gpu = open_gpu("bench_dataflow")
    if gpu is None:
        return 2
    torch, snapmla, env = gpu
    doc: dict[str, Any] = {
        "schema": "snapmla.bench_dataflow/1",
        **git_commit(),
        **env,
        "settings": {
            "sizes": sizes,
            "ops": ops,
            "heads": args.heads,
            "quick": args.quick,
            "timing_s_per_point": args.timing_s,
            "min_reps": MIN_REPS,
            "graph": not args.no_graph,
            "slots": "random permutation of the cache's slots",
            "data": "normal(0, 0.5), BF16",
        },
        "constants": {
            "bytes_per_row": {op: {"read": r, "written": w} for op, (r, w) in BYTES.items()},
            "hbm_tbps": HBM_TBPS,
            "target_fraction": TARGET_FRACTION,
            "target_gbps": TARGET_GBPS,
        },
        "results": [],
    }
    start = time.perf_counter()
    for n in sizes:
        batch: list[dict[str, Any]] = []
        if "append" in ops or "fetch_dequant" in ops:
            try:
                batch += bench_cache_ops(torch, snapmla, n, args, ops)
                _free_memory(torch)
            except Exception as exc:  # noqa: BLE001 (recorded in the results)
                torch.cuda.synchronize()
                for op in ("append", "fetch_dequant"):
                    if op in ops:
                        r = _result(op, n, None)
                        r["error"] = short_error(exc)
                        batch.append(r)
        if "quantize_q" in ops:
            batch.append(bench_quantize_q(torch, snapmla, n, args.heads, args))
            _free_memory(torch)
        for r in batch:
            if not args.no_copy:
                try:
                    r["copy"] = _copy_ceiling(torch, r["bytes_total"], args)
                    _free_memory(torch)
                except Exception as exc:  # noqa: BLE001 (recorded in the results)
                    r["copy"] = {"error": short_error(exc)}
            gbps, cg = r.get("gbps"), (r.get("copy") or {}).get("gbps")
            r["fraction_of_copy"] = gbps / cg if gbps and cg else None
            print(
                f"{r['op']} x {r['rows']}: {_fmt(gbps, '.0f')} GB/s (copy {_fmt(cg, '.0f')} GB/s)",
                flush=True,
            )
        doc["results"] += batch
        write_json(args.out, doc)
    measured = [r for r in doc["results"] if r.get("pass") is not None]
    doc["summary"] = {
        "points": len(doc["results"]),
        "passed": sum(1 for r in measured if r["pass"]),
        "failed": [f"{r['op']}x{r['rows']}" for r in measured if not r["pass"]],
        "errors": [f"{r['op']}x{r['rows']}" for r in doc["results"] if r.get("error")],
        "wall_s": time.perf_counter() - start,
    }
    write_json(args.out, doc)
    print()
    print(f"snapmla data movement on {env['device']['name']}, commit {doc['commit'][:12]}")
    print(table(doc["results"]))
    s = doc["summary"]
    print(
        f"\n{s['passed']}/{len(measured)} points meet {TARGET_GBPS:.0f} GB/s; {s['wall_s']:.0f} s"
    )
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
