"""Several GPUs: tensor-parallel and data-parallel MLA decode, one process per GPU.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node N bench/bench_multi_gpu.py tp \\
        --quick --out tp.json
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node N bench/bench_multi_gpu.py dp \\
        --quick --out dp.json
    python3 bench/bench_multi_gpu.py --markdown tp.json       # a results JSON as tables

``tp``: a DeepSeek-V3-shaped attention layer (128 heads, kv_lora_rank 512, RoPE 64) with its
heads sharded over the N ranks, 128 / N each. Every rank appends the same latent tokens to its
own FP8 cache (MLA's latent KV is shared by all heads, so tensor parallelism replicates it) and
decodes its heads; the outputs are all-gathered and checked on rank 0 against single-GPU runs:
each shard bit for bit against rank 0 decoding the same heads with the same per-rank head count
(this identity must hold: same inputs, same config, same kernel), and the whole against one
128-head decode, head by head (reported: the kernel variant and the split-KV plan depend on the
head count, so bit identity there is a measurement, not a promise). Times: each rank's decode
(all ranks at once) against rank 0 decoding all 128 heads alone.

``dp``: data-parallel attention, every rank its own requests at 128 heads. Aggregate decode
throughput (query tokens per second over all ranks, all ranks replaying at once, wall clock
between barriers) against rank 0 alone running the same loop, and the ratio (ideal: N). Each
rank's output is checked on rank 0 against rank 0 decoding that rank's requests, bit for bit.

Runs with ``--nproc-per-node 1`` too (the same code path, NCCL with one rank), and without
torchrun as a single process. NVLink multicast (NVLS) is not needed: NCCL_NVLS_ENABLE defaults
to 0 here. Timing: N calls captured in one CUDA graph (bench_decode.py's capture), replays
between CUDA events. Inputs are generated on the host from ``--seed`` (identical on every rank
and device). Exit status 1 when an identity that must hold fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_decode import (  # the sibling script's helpers (standard library only at import)
    CONTENT_DIM,
    HEAD_DIM,
    OUR_BYTES_PER_TOKEN,
    PAGE_SIZE,
    ROPE_DIM,
    SOFTMAX_SCALE,
    _fmt,
    capture_graph,
    environment,
    git_commit,
    import_snapmla,
    short_error,
    write_json,
)

SCHEMA = "snapmla.bench_multi_gpu/1"
MODES = ("tp", "dp", "both")
HEADS = 128  # DeepSeek-V3: 128 query heads, kv_lora_rank 512, qk_rope_head_dim 64
GRAPH_TARGET_S = 2e-3  # one replay of the captured calls lasts about this long
MAX_CALLS = 256
MIN_WALL_S = 0.25  # replays at least this long: the barriers' cost stays a small share
# (batch, context) per mode: the full run and --quick
SHAPES = {
    "tp": {"full": (32, 8192), "quick": (16, 4096)},
    "dp": {"full": (32, 8192), "quick": (16, 4096)},
}


# ------------------------------------------------------------------------------ host-only


def heads_of_rank(num_heads: int, world: int, rank: int) -> range:
    """The query heads rank ``rank`` of ``world`` decodes under tensor parallelism: a
    contiguous block of ``num_heads / world``; ``world`` must divide ``num_heads``."""
    if world < 1 or num_heads % world:
        raise ValueError(f"{world} ranks do not divide {num_heads} heads evenly")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside 0 .. {world - 1}")
    h = num_heads // world
    return range(rank * h, (rank + 1) * h)


def bf16_to_float(bits: Any) -> Any:
    """BF16 bits (uint16 / int16 numpy array) as float32 values."""
    import numpy as np

    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def head_agreement(got: Any, want: Any) -> dict[str, Any]:
    """Head-by-head comparison of two decode outputs given as BF16 bits (numpy uint16 / int16,
    ``[b, s_q, h, 512]``): the heads equal bit for bit, and over all heads the largest absolute
    difference and the relative L2 error of ``got`` against ``want``."""
    import numpy as np

    g = np.asarray(got).view(np.uint16)
    w = np.asarray(want).view(np.uint16)
    if g.shape != w.shape or g.ndim != 4:
        raise ValueError(f"outputs [b, s_q, h, d] of one shape expected, got {g.shape}, {w.shape}")
    same = (g == w).all(axis=(0, 1, 3))  # [h]
    gf = bf16_to_float(g).astype(np.float64)
    wf = bf16_to_float(w).astype(np.float64)
    finite = np.isfinite(gf) & np.isfinite(wf)
    diff = np.abs(gf - wf)[finite]
    norm = float(np.sqrt((wf[finite] ** 2).sum()))
    return {
        "heads": int(same.size),
        "identical_heads": int(same.sum()),
        "first_differing_heads": [int(i) for i in np.flatnonzero(~same)[:8]],
        "max_abs_diff": float(diff.max()) if diff.size else 0.0,
        "rel_l2": float(np.sqrt((diff**2).sum()) / norm) if norm > 0 else 0.0,
        "nonfinite_mismatch": int((np.isfinite(gf) != np.isfinite(wf)).sum()),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def markdown(doc: dict[str, Any]) -> str:
    """A results JSON as Markdown: a caption (GPUs, commit, date), then a table per mode run."""
    devices = doc.get("devices") or []
    names = sorted({d.get("name", "?") for d in devices}) or ["?"]
    world = doc.get("world_size", len(devices))
    caption = (
        f"{world} x {', '.join(names)}, commit {str(doc.get('commit'))[:7]}, "
        f"{str(doc.get('date', '?'))[:10]}; times in us"
    )
    lines = [caption]
    tp = doc.get("tp")
    if tp:
        s = tp["settings"]
        lines += [
            "",
            (
                f"Tensor parallel: {s['num_heads']} heads over {world} GPUs, batch {s['batch']}, "
                f"context {s['context']}, q_len {s['q_len']}"
            ),
            "",
            (
                "| GPUs | heads a GPU | 1 GPU, all heads | TP, slowest rank | speedup "
                "| shards = 1-GPU run of their heads | heads identical to the all-heads run |"
            ),
            "|---:|---:|---:|---:|---:|---|---|",
        ]
        agree = tp.get("vs_all_heads") or {}
        shards = tp.get("shards_identical")
        lines.append(
            f"| {world} | {s['heads_per_rank']} | {_fmt(tp.get('single_us'))} "
            f"| {_fmt(tp.get('tp_max_us'))} | {_fmt(tp.get('speedup'), '.2f')}x "
            f"| {'-' if shards is None else ('yes' if shards else 'NO')} "
            f"| {agree.get('identical_heads', '-')} / {agree.get('heads', '-')} |"
        )
    dp = doc.get("dp")
    if dp:
        s = dp["settings"]
        lines += [
            "",
            (
                f"Data parallel: {s['num_heads']} heads, batch {s['batch']} a GPU, context "
                f"{s['context']}, q_len {s['q_len']}; query tokens per second"
            ),
            "",
            (
                "| GPUs | 1 GPU tok/s | all GPUs tok/s | ratio | per-rank us (min .. max) "
                "| outputs = rank 0's run |"
            ),
            "|---:|---:|---:|---:|---:|---|",
        ]
        per = dp.get("per_rank_us") or []
        spread = f"{_fmt(min(per))} .. {_fmt(max(per))}" if per else "-"
        same = dp.get("outputs_identical")
        lines.append(
            f"| {world} | {_fmt(dp.get('single_tokens_per_s'), '.0f')} "
            f"| {_fmt(dp.get('aggregate_tokens_per_s'), '.0f')} "
            f"| {_fmt(dp.get('ratio'), '.2f')}x | {spread} "
            f"| {'-' if same is None else ('yes' if same else 'NO')} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Launch: NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node N "
        "bench/bench_multi_gpu.py {tp,dp,both} [options]",
    )
    p.add_argument("mode", nargs="?", choices=MODES, default="both", help="what to run (both)")
    p.add_argument("--batch", type=int, help="requests (dp: a rank); default by mode")
    p.add_argument("--context", type=int, help="tokens of context a request; default by mode")
    p.add_argument("--heads", type=int, default=HEADS, help="query heads of the layer (128)")
    p.add_argument("--q-len", type=int, default=1, help="new tokens a request (1 .. 4)")
    p.add_argument(
        "--kernel", choices=("auto", "fast", "reference"), default="auto", help="decode kernel"
    )
    p.add_argument(
        "--num-sm-parts", type=int, default=0, help="split-KV parts (0: from the SM count)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    p.add_argument("--quick", action="store_true", help="smaller shapes, 0.05 s of replays")
    p.add_argument("--timing-s", type=float, help="seconds of replays a measurement (0.3)")
    p.add_argument("--no-check", action="store_true", help="skip the bit-identity checks")
    p.add_argument("--out", help="write the JSON results here (rank 0)")
    p.add_argument("--markdown", metavar="JSON", help="print a results JSON as tables and exit")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the defaults that depend on the mode and --quick filled in."""
    p = _parser()
    args = p.parse_args(argv)
    if args.timing_s is None:
        args.timing_s = 0.05 if args.quick else 0.3
    if args.markdown:
        return args
    size = "quick" if args.quick else "full"
    for mode in ("tp", "dp"):
        b, ctx = SHAPES[mode][size]
        setattr(args, f"{mode}_batch", args.batch or b)
        setattr(args, f"{mode}_context", args.context or ctx)
    if not 1 <= args.heads <= 128:
        p.error(f"--heads: 1 .. 128, got {args.heads}")
    if not 1 <= args.q_len <= 4:
        p.error(f"--q-len: 1 .. 4, got {args.q_len}")
    for name in ("batch", "context"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name}: >= 1, got {value}")
    if args.num_sm_parts < 0:
        p.error(f"--num-sm-parts: >= 0, got {args.num_sm_parts}")
    return args


# ------------------------------------------------------------------------------ ranks


class Group:
    """The ranks of the run: torch.distributed (NCCL) under torchrun, else one process alone.
    One GPU a rank: LOCAL_RANK's."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.dist = None
        self.rank, self.world, self.local_rank = 0, 1, 0
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            import torch.distributed as dist

            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
            self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(self.local_rank)
            dist.init_process_group(backend="nccl")
            self.dist = dist
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:
            torch.cuda.set_device(0)
        self.device = torch.device("cuda", self.local_rank)

    def barrier(self) -> None:
        self.torch.cuda.synchronize()
        if self.dist is not None:
            self.dist.barrier(device_ids=[self.local_rank])

    def all_gather(self, t: Any) -> list[Any]:
        """Every rank's ``t`` (one shape and dtype on all ranks), in rank order."""
        if self.dist is None:
            return [t]
        parts = [self.torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(parts, t.contiguous())
        return parts

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.dist is None:
            return [obj]
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.dist is not None:
            self.dist.destroy_process_group()


# ------------------------------------------------------------------------------ one layer


class Layer:
    """One decode step of one layer on this rank's GPU: an FP8 cache holding ``batch``
    requests of ``context`` tokens (pages in a seeded shuffled order), their queries for
    ``heads`` (a slice of the generated heads), and snapmla.torch's plan and outputs."""

    def __init__(
        self,
        torch: Any,
        smt: Any,
        device: Any,
        args: argparse.Namespace,
        batch: int,
        context: int,
        seed: int,
        heads: range,
        total_heads: int,
    ) -> None:
        self.torch, self.smt, self.args = torch, smt, args
        g = torch.Generator().manual_seed(seed)
        pages_per_request = -(-context // PAGE_SIZE)
        num_pages = batch * pages_per_request
        tokens = batch * context
        c_kv = (torch.randn(tokens, CONTENT_DIM, generator=g) * 0.5).to(torch.bfloat16)
        k_pe = (torch.randn(tokens, ROPE_DIM, generator=g) * 0.5).to(torch.bfloat16)
        order = torch.randperm(num_pages, generator=g).to(torch.int32)
        table = order.view(batch, pages_per_request)
        i = torch.arange(context, dtype=torch.int64)
        slots = (table.to(torch.int64)[:, i // PAGE_SIZE] * PAGE_SIZE + i % PAGE_SIZE).reshape(-1)
        q = torch.randn(batch, args.q_len, total_heads, HEAD_DIM, generator=g) * 0.5
        q = q.to(torch.bfloat16)[:, :, heads.start : heads.stop].contiguous()

        self.batch, self.context, self.heads = batch, context, len(heads)
        self.max_pages = pages_per_request
        self.cache = smt.empty_cache(1, num_pages, device=device)
        smt.append(self.cache, 0, c_kv.to(device), k_pe.to(device), slots.to(device))
        self.q = q.to(device)
        self.block_table = table.to(device)
        self.seqlens = torch.full((batch,), context, dtype=torch.int32, device=device)
        self.plan, self.workspace = smt.decode_buffers(
            batch,
            num_heads=self.heads,
            q_len=args.q_len,
            max_pages=self.max_pages,
            num_sm_parts=args.num_sm_parts,
            device=device,
        )
        smt.plan(
            self.plan,
            self.seqlens,
            num_heads=self.heads,
            q_len=args.q_len,
            max_pages=self.max_pages,
            num_sm_parts=args.num_sm_parts,
        )
        self.out = torch.empty(batch, args.q_len, self.heads, CONTENT_DIM, dtype=torch.bfloat16,
                               device=device)  # fmt: skip
        self.lse = torch.empty(batch, self.heads, args.q_len, dtype=torch.float32, device=device)

    def decode(self, _i: int = 0) -> None:
        """The step's decode into ``out`` and ``lse`` on torch's current stream."""
        self.smt.decode(
            self.cache,
            0,
            self.q,
            self.block_table,
            self.seqlens,
            self.plan,
            self.workspace,
            softmax_scale=SOFTMAX_SCALE,
            causal=True,
            kernel=self.args.kernel,
            num_sm_parts=self.args.num_sm_parts,
            out=self.out,
            lse=self.lse,
        )

    def result(self) -> tuple[Any, Any]:
        """(out, lse) after the work queued so far, as host BF16 bits and fp32 bits."""
        self.torch.cuda.synchronize()
        t = self.torch
        return self.out.view(t.int16).cpu().numpy(), self.lse.view(t.int32).cpu().numpy()

    def tokens_per_call(self) -> int:
        return self.batch * self.args.q_len


def calls_per_graph(torch: Any, layer: Layer) -> int:
    """Calls one graph replay holds: about GRAPH_TARGET_S of decodes (at least 1)."""
    for _ in range(3):
        layer.decode()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        layer.decode()
    end.record()
    torch.cuda.synchronize()
    per_call = start.elapsed_time(end) * 1e-3 / 5
    return max(1, min(MAX_CALLS, math.ceil(GRAPH_TARGET_S / max(per_call, 1e-7))))


def timed_replays(
    torch: Any, group: Group, graph: Any, calls: int, target_s: float, active: bool
) -> dict[str, Any]:
    """Every rank enters; the ``active`` ones replay ``graph`` (``calls`` decodes) for about
    ``target_s`` at the same time. Per rank: the median call between CUDA events; for all:
    the wall time from the barrier before to the barrier after (the slowest rank's)."""
    reps = 0
    per_call: list[float] = []
    if active:
        graph.replay()  # one untimed replay, then an estimate of the replay count
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        want_s = max(target_s, MIN_WALL_S)
        reps = max(20, min(5000, math.ceil(want_s / max(time.perf_counter() - t0, 1e-6))))
    reps = max(group.all_gather_object(reps))  # every active rank runs as long
    group.barrier()
    start = time.perf_counter()
    if active:
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        for e0, e1 in events:
            e0.record()
            graph.replay()
            e1.record()
        torch.cuda.synchronize()
        per_call = [e0.elapsed_time(e1) * 1e3 / calls for e0, e1 in events]
    group.barrier()
    wall = time.perf_counter() - start
    return {
        "median_us": statistics.median(per_call) if per_call else None,
        "reps": reps,
        "calls_per_replay": calls,
        "wall_s": wall,
    }


def _timing(torch: Any, group: Group, layer: Layer, args: argparse.Namespace, active: bool):
    """Graph-timed decodes of ``layer`` on the active ranks (every rank enters)."""
    calls = calls_per_graph(torch, layer) if active else 1
    calls = max(group.all_gather_object(calls))
    graph = capture_graph(torch, layer.decode, calls) if active else None
    t = timed_replays(torch, group, graph, calls, args.timing_s, active)
    del graph
    return t


def _identical(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    """Two (out, lse) results equal bit for bit."""
    import numpy as np

    return bool(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))


# ------------------------------------------------------------------------------ the modes


def run_tp(torch: Any, smt: Any, group: Group, args: argparse.Namespace) -> dict[str, Any]:
    """Tensor parallel: this rank's heads, all-gathered; checked and timed on rank 0."""
    import numpy as np

    world, rank = group.world, group.rank
    batch, context = args.tp_batch, args.tp_context
    mine = heads_of_rank(args.heads, world, rank)
    h = len(mine)
    settings = {
        "num_heads": args.heads,
        "heads_per_rank": h,
        "batch": batch,
        "context": context,
        "kv_bytes_a_rank": batch * context * OUR_BYTES_PER_TOKEN,  # every rank reads it all
        "q_len": args.q_len,
        "kernel": args.kernel,
        "num_sm_parts": args.num_sm_parts,
        "seed": args.seed,
    }
    res: dict[str, Any] = {"settings": settings}
    layer = Layer(torch, smt, group.device, args, batch, context, args.seed, mine, args.heads)
    layer.decode()
    out = torch.cat(group.all_gather(layer.out), dim=2)  # [b, s_q, heads, 512]
    lse = torch.cat(group.all_gather(layer.lse), dim=1)  # [b, heads, s_q]
    gathered = (out.view(torch.int16).cpu().numpy(), lse.view(torch.int32).cpu().numpy())

    if not args.no_check and rank == 0:
        # one GPU: all heads in one call, then each rank's heads alone (its head count)
        full = Layer(torch, smt, group.device, args, batch, context, args.seed,
                     range(args.heads), args.heads)  # fmt: skip
        full.decode()
        want_all = full.result()
        del full
        shard_ok = []
        for r in range(world):
            heads = heads_of_rank(args.heads, world, r)
            one = Layer(torch, smt, group.device, args, batch, context, args.seed, heads,
                        args.heads)  # fmt: skip
            one.decode()
            got = (
                gathered[0][:, :, heads.start : heads.stop],
                gathered[1][:, heads.start : heads.stop],
            )
            shard_ok.append(_identical(got, one.result()))
            del one
        res["shards_identical_by_rank"] = shard_ok
        res["shards_identical"] = all(shard_ok) if args.comparable else None
        res["vs_all_heads"] = head_agreement(gathered[0], want_all[0])
        res["vs_all_heads"]["lse_identical"] = bool(np.array_equal(gathered[1], want_all[1]))
        res["vs_all_heads"]["nonfinite_out"] = int((~np.isfinite(bf16_to_float(gathered[0]))).sum())
        torch.cuda.empty_cache()

    t = _timing(torch, group, layer, args, active=True)  # every rank, its heads
    per_rank = group.all_gather_object(t["median_us"])
    del layer
    torch.cuda.empty_cache()
    single = None
    if rank == 0:
        full = Layer(torch, smt, group.device, args, batch, context, args.seed,
                     range(args.heads), args.heads)  # fmt: skip
    ts = _timing(torch, group, full if rank == 0 else None, args, active=rank == 0)
    if rank == 0:
        single = ts["median_us"]
        del full
    res.update(
        {
            "per_rank_us": per_rank,
            "tp_max_us": max(per_rank),
            "single_us": single,
            "speedup": _ratio(single, max(per_rank)),
            "timing": {"tp": t, "single": ts},
        }
    )
    return res


def run_dp(torch: Any, smt: Any, group: Group, args: argparse.Namespace) -> dict[str, Any]:
    """Data parallel: every rank its own requests at all heads; throughput and a check."""
    world, rank = group.world, group.rank
    batch, context = args.dp_batch, args.dp_context
    heads = range(args.heads)
    settings = {
        "num_heads": args.heads,
        "batch": batch,
        "context": context,
        "q_len": args.q_len,
        "kernel": args.kernel,
        "num_sm_parts": args.num_sm_parts,
        "seeds": [args.seed + 1000 + r for r in range(world)],
    }
    res: dict[str, Any] = {"settings": settings}
    layer = Layer(torch, smt, group.device, args, batch, context, args.seed + 1000 + rank,
                  heads, args.heads)  # fmt: skip
    tokens = layer.tokens_per_call()
    alone = _timing(torch, group, layer, args, active=rank == 0)
    together = _timing(torch, group, layer, args, active=True)
    per_rank = group.all_gather_object(together["median_us"])
    calls, calls_alone = together["calls_per_replay"], alone["calls_per_replay"]
    single_tps = tokens * calls_alone * alone["reps"] / alone["wall_s"]
    aggregate_tps = world * tokens * calls * together["reps"] / together["wall_s"]
    res.update(
        {
            "per_rank_us": per_rank,
            "single_us": alone["median_us"] if rank == 0 else None,
            "single_tokens_per_s": single_tps,
            "aggregate_tokens_per_s": aggregate_tps,
            "ratio": aggregate_tps / single_tps,
            "ideal_ratio": world,
            "timing": {"single": alone, "all": together},
        }
    )
    if not args.no_check:
        layer.decode()
        out = group.all_gather(layer.out)
        lse = group.all_gather(layer.lse)
        if rank == 0:
            same = []
            for r in range(world):
                got = (
                    out[r].view(torch.int16).cpu().numpy(),
                    lse[r].view(torch.int32).cpu().numpy(),
                )
                if r == 0:
                    want = layer.result()
                else:
                    one = Layer(torch, smt, group.device, args, batch, context,
                                args.seed + 1000 + r, heads, args.heads)  # fmt: skip
                    one.decode()
                    want = one.result()
                    del one
                same.append(_identical(got, want))
            res["outputs_identical_by_rank"] = same
            res["outputs_identical"] = all(same) if args.comparable else None
    del layer
    torch.cuda.empty_cache()
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown:
        with open(args.markdown, encoding="utf-8") as f:
            print(markdown(json.load(f)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_multi_gpu: no CUDA device", file=sys.stderr)
        return 2
    import_snapmla()
    import snapmla.torch as smt

    group = Group(torch)
    try:
        if args.heads % group.world:
            if group.rank == 0:
                print(f"bench_multi_gpu: {group.world} ranks do not divide {args.heads} heads",
                      file=sys.stderr)  # fmt: skip
            return 2
        props = torch.cuda.get_device_properties(group.device)
        me = {
            "rank": group.rank,
            "local_rank": group.local_rank,
            "name": props.name,
            "sm_count": props.multi_processor_count,
            "memory_bytes": int(props.total_memory),
        }
        devices = group.all_gather_object(me)
        same_sms = len({d["sm_count"] for d in devices}) == 1
        # Bit identity across devices needs one split-KV part count on all of them.
        args.comparable = same_sms or args.num_sm_parts > 0
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            **git_commit(),
            **(environment(torch) if group.rank == 0 else {}),
            "world_size": group.world,
            "devices": devices,
            "same_sm_count": same_sms,
            "cross_device_checks": args.comparable,
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "settings": {"mode": args.mode, "quick": args.quick, "timing_s": args.timing_s},
        }
        start = time.perf_counter()
        failed: list[str] = []
        for mode, run in (("tp", run_tp), ("dp", run_dp)):
            if args.mode not in (mode, "both"):
                continue
            try:
                doc[mode] = run(torch, smt, group, args)
            except Exception as exc:  # recorded, then raised: torchrun ends every rank
                doc[mode] = {"error": short_error(exc)}
                print(f"rank {group.rank}: {mode} failed: {short_error(exc)}", file=sys.stderr)
                if group.rank == 0:
                    write_json(args.out, doc)
                raise
            r = doc[mode]
            for key in ("shards_identical", "outputs_identical"):
                if r.get(key) is False:
                    failed.append(f"{mode}: {key} is false")
        doc["summary"] = {"failed": failed, "wall_s": time.perf_counter() - start}
        if group.rank == 0:
            write_json(args.out, doc)
            print(markdown(doc))
            for f in failed:
                print(f"FAILED {f}")
            if args.out:
                print(f"results: {args.out}")
        return 1 if failed else 0
    finally:
        group.close()


if __name__ == "__main__":
    sys.exit(main())
