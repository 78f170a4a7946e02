"""End-to-end decode of a DeepSeek-V3-shaped transformers model: stock (BF16 StaticCache) against
snapmla.transformers (FP8 paged cache, absorbed decode), tokens/s and KV memory.

    python bench/bench_generate.py --quick --out /tmp/gen.json     # < 2 minutes on an H200
    python bench/bench_generate.py --out gen.json                  # 1-64 requests, 1k-32k tokens
    python bench/bench_generate.py --markdown gen.json             # the table of a result

The model is randomly initialized at DeepSeek-V3's layer size (hidden 7168, 128 heads,
q_lora_rank 1536, kv_lora_rank 512, dense MLP 18432) with a few layers and a small vocabulary:
decode time per layer is the real model's, the layer count scales it. Timing method: each
request's context is filled to the given length directly in the cache (random latents; decode
time does not depend on their values), then one decode step (the whole model forward: batch x 1
token, attention mask and positions fixed) is captured in a CUDA graph after warm-up and
replayed; tokens/s = batch x replays / the CUDA-event time of the replays. Both sides run in
the same graphs-over-eager-kernels setting (what generate's reduce-overhead compile captures,
without inductor's fusion of the elementwise ops, which both would share). KV memory is the
cache tensors' bytes; the step's peak is the most memory a replay adds on top (stock expands
kv_b_proj over the whole context each step). ``max_batch`` is the largest batch (powers of
two) whose cache and step peak fit ``--budget-gib`` at the longest context.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

METHOD = (
    "one decode step (full model forward, batch x 1 token) captured in a CUDA graph after "
    "warm-up, replayed; CUDA events around the replays; tokens/s = batch x replays / time. "
    "Contexts filled directly in the cache. KV bytes: cache tensors; step peak: memory a "
    "replay adds (torch.cuda.max_memory_allocated)."
)


def _config(layers: int, vocab: int) -> Any:
    import transformers

    return transformers.DeepseekV3Config(
        vocab_size=vocab,
        hidden_size=7168,
        intermediate_size=18432,
        num_hidden_layers=layers,
        first_k_dense_replace=layers,  # dense MLPs: the MoE's routing is not what is measured
        num_attention_heads=128,
        num_key_value_heads=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0,
                         "original_max_position_embeddings": 4096, "mscale": 1.0,
                         "mscale_all_dim": 1.0},  # fmt: skip
        max_position_embeddings=163840,
        num_mtp_layers=0,
        eos_token_id=None,
        pad_token_id=0,
    )


def _model(layers: int, vocab: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.DeepseekV3ForCausalLM(_config(layers, vocab))
    return model.to(torch.bfloat16).eval()


class _Stock:
    """transformers' StaticCache, its attention (SDPA over the expanded context)."""

    name = "stock-bf16-static"

    def __init__(self, model: Any) -> None:
        self.model = model

    def cache(self, batch: int, context: int, extra: int) -> Any:
        import torch
        from transformers import StaticCache

        cache = StaticCache(config=self.model.config, max_cache_len=context + extra)
        for layer in cache.layers:  # [b, 1, len, 512] latents and [b, 1, len, 64] rotated keys
            layer.lazy_initialization(
                torch.empty(batch, 1, 0, 512, dtype=torch.bfloat16, device="cuda"),
                torch.empty(batch, 1, 0, 64, dtype=torch.bfloat16, device="cuda"),
            )
            layer.keys.normal_()
            layer.values.normal_()
            layer.cumulative_length.fill_(context)
        return cache

    @staticmethod
    def kv_bytes(cache: Any) -> int:
        return sum(t.numel() * t.element_size() for la in cache.layers for t in (la.keys, la.values))

    @staticmethod
    def mask(batch: int, context: int, extra: int) -> Any:
        import torch

        return torch.ones(batch, 1, 1, context + extra, dtype=torch.bool, device="cuda")


class _SnapMLA:
    """snapmla.transformers: the FP8 paged cache and the absorbed decode."""

    def __init__(self, model: Any, kernel: str) -> None:
        import snapmla.transformers as smx

        self.smx = smx
        self.model = smx.prepare(model, kernel=kernel)  # after the stock runs: it patches
        self.name = f"snapmla-fp8-{kernel}"

    def cache(self, batch: int, context: int, extra: int) -> Any:
        import torch

        cache = self.smx.SnapMLACache(self.model, max_tokens=context + extra, batch_size=batch)
        backend = cache.backend
        chunk = max(1, (1 << 20) // batch)
        for start in range(0, context, chunk):
            n = min(chunk, context - start)
            j = torch.arange(start, start + n, device="cuda")
            slots = (cache.block_table[:, j // 64].long() * 64 + j % 64).reshape(-1)
            c = torch.randn(slots.numel(), 512, dtype=torch.bfloat16, device="cuda")
            k = torch.randn(slots.numel(), 64, dtype=torch.bfloat16, device="cuda")
            for layer in cache.settings.layers:
                backend.append(cache.kv, layer, c, k, slots)
        cache.seqlens.fill_(context)
        cache.columns.fill_(context)
        return cache

    @staticmethod
    def kv_bytes(cache: Any) -> int:
        return cache.memory_bytes()

    @staticmethod
    def mask(batch: int, context: int, extra: int) -> Any:
        return None  # every new token is real


def _measure(impl: Any, batch: int, context: int, iters: int, warmup: int) -> dict[str, Any]:
    import torch

    extra = warmup + iters + 8  # each replay appends one token
    row: dict[str, Any] = {"impl": impl.name, "batch": batch, "context": context}
    cache = graph = None
    try:
        cache = impl.cache(batch, context, extra)
        row["kv_bytes"] = impl.kv_bytes(cache)
        ids = torch.randint(1, impl.model.config.vocab_size, (batch, 1), device="cuda")
        pos = torch.full((batch, 1), context, device="cuda")
        mask = impl.mask(batch, context, extra)
        model = getattr(impl.model, "model", impl.model)
        lm_head = impl.model.lm_head

        def step() -> Any:
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                        past_key_values=cache, use_cache=True)  # fmt: skip
            return lm_head(out.last_hidden_state)

        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            for _ in range(warmup):
                graph.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                graph.replay()
            end.record()
            end.synchronize()
        ms = start.elapsed_time(end) / iters
        row.update(status="ok", step_ms=ms, tokens_per_s=batch * 1e3 / ms,
                   step_peak_bytes=torch.cuda.max_memory_allocated() - base)  # fmt: skip
    except torch.OutOfMemoryError:
        row.update(status="oom")
    finally:
        del graph, cache
        torch.cuda.empty_cache()
    return row


def _fits(impl: Any, context: int, budget: int, iters: int, warmup: int, limit: int) -> dict:
    """The largest power-of-two batch whose cache and step peak fit ``budget`` bytes."""
    best: dict[str, Any] = {"impl": impl.name, "context": context, "budget_bytes": budget,
                            "batch": 0}  # fmt: skip
    batch = 1
    while batch <= limit:
        row = _measure(impl, batch, context, iters, warmup)
        if row["status"] != "ok" or row["kv_bytes"] + row["step_peak_bytes"] > budget:
            break
        best.update(batch=batch, tokens_per_s=row["tokens_per_s"], kv_bytes=row["kv_bytes"],
                    step_peak_bytes=row["step_peak_bytes"])  # fmt: skip
        batch *= 2
    return best


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    if args.quick:
        batches, contexts, iters, warmup, layers = [1, 16, 64], [1024, 8192], 10, 3, 2
    else:
        batches, contexts = args.batches, args.contexts
        iters, warmup, layers = args.iters, args.warmup, args.layers
    t0 = time.time()
    model = _model(layers, args.vocab)
    budget = int(args.budget_gib * 2**30)
    results, fits = [], []
    for make in (lambda: _Stock(model), lambda: _SnapMLA(model, args.kernel)):
        impl = make()
        for context in contexts:
            for batch in batches:
                row = _measure(impl, batch, context, iters, warmup)
                results.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        fits.append(_fits(impl, max(contexts), budget, iters, warmup, args.max_batch))
        print(json.dumps(fits[-1]), file=sys.stderr, flush=True)
    return {
        "benchmark": "bench_generate",
        "method": METHOD,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "model": {"layers": layers, "hidden": 7168, "heads": 128, "q_lora_rank": 1536,
                  "kv_lora_rank": 512, "rope": 64, "vocab": args.vocab, "dtype": "bfloat16"},
        "kernel": args.kernel,
        "iters": iters,
        "warmup": warmup,
        "results": results,
        "max_batch": fits,
        "seconds": round(time.time() - t0, 1),
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    """The table of a result: per context and batch, tokens/s and KV memory of each side."""
    gib = 2.0**30
    rows = {}
    names = []
    for r in result["results"]:
        if r["impl"] not in names:
            names.append(r["impl"])
        rows.setdefault((r["context"], r["batch"]), {})[r["impl"]] = r
    stock, ours = names[0], names[-1]

    def tps(r: dict | None) -> str:
        return "oom" if not r or r.get("status") != "ok" else f"{r['tokens_per_s']:,.0f}"

    def mem(r: dict | None) -> str:
        return "-" if not r or "kv_bytes" not in r else f"{r['kv_bytes'] / gib:.2f}"

    lines = [
        f"{result['device']}, torch {result['torch']}, transformers {result['transformers']}, "
        f"{result['model']['layers']} layers of DeepSeek-V3 size. {result['method']}",
        "",
        f"| context | batch | {stock} tok/s | {ours} tok/s | speedup | KV GiB {stock} | "
        f"KV GiB {ours} |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (context, batch), by in sorted(rows.items()):
        s, o = by.get(stock), by.get(ours)
        ok = s and o and s.get("status") == "ok" and o.get("status") == "ok"
        speed = f"{o['tokens_per_s'] / s['tokens_per_s']:.2f}x" if ok else "-"
        lines.append(f"| {context} | {batch} | {tps(s)} | {tps(o)} | {speed} | {mem(s)} | "
                     f"{mem(o)} |")  # fmt: skip
    lines += ["", "| largest batch in the budget | context | budget GiB | batch | tok/s |",
              "|---|---:|---:|---:|---:|"]  # fmt: skip
    for f in result["max_batch"]:
        t = f"{f['tokens_per_s']:,.0f}" if f.get("batch") else "-"
        lines.append(f"| {f['impl']} | {f['context']} | {f['budget_bytes'] / gib:.0f} | "
                     f"{f['batch']} | {t} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few shapes, 2 layers (< 2 minutes)")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--markdown", metavar="JSON", help="print the table of a result and exit")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--kernel", default="auto", choices=["auto", "fast", "reference"])
    p.add_argument("--budget-gib", type=float, default=40.0,
                   help="memory for the cache and the step's peak, for max_batch")  # fmt: skip
    p.add_argument("--max-batch", type=int, default=256)
    args = p.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return 0
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    print(markdown(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

