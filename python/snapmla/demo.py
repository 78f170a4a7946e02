"""``python -m snapmla.demo``: speed and accuracy of snapmla's FP8 MLA decode on one shape.

On a Hopper GPU it builds a paged FP8 cache (fused K-append), decodes one step, times it with
CUDA events, checks the output against the step-by-step NumPy model of the numerics contract
and against exact float64 attention, and, when FlashInfer is installed, times FlashInfer's BF16
MLA kernel on the same inputs. Without a GPU it says so and shows what the CPU can: the
accuracy of the FP8 pipeline (NumPy emulation) and the memory it saves.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import reference as ref

BF16_BYTES_PER_TOKEN = (512 + 64) * 2
FP8_BYTES_PER_TOKEN = 512 + 64 * 2 + 4


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m snapmla.demo", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--q-len", type=int, default=1)
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU here
        return False


def _memory_line(tokens: int) -> str:
    fp8, bf16 = tokens * FP8_BYTES_PER_TOKEN, tokens * BF16_BYTES_PER_TOKEN
    return (f"KV cache for {tokens} tokens: {fp8 / 2**20:.1f} MiB FP8 vs {bf16 / 2**20:.1f} MiB "
            f"BF16 ({fp8 / bf16:.2f}x)")


def run_cpu(args: argparse.Namespace) -> int:
    print("snapmla demo: no CUDA GPU found here. snapmla's kernels need an sm_90a GPU (H100/H200);")
    print("this machine can show the numerics: the FP8 pipeline emulated in NumPy against exact")
    print("float64 attention on the same BF16 inputs (small shape).")
    rng = np.random.default_rng(args.seed)
    b, h, s_q, ctx = 2, 16, 1, 2048
    scale = 192**-0.5
    q = ref._as_bf16(rng.standard_normal((b, s_q, h, 576)) * 0.5)
    c_kv = [ref._as_bf16(rng.standard_normal((ctx, 512)) * 0.5) for _ in range(b)]
    k_pe = [ref._as_bf16(rng.standard_normal((ctx, 64)) * 0.5) for _ in range(b)]
    kv = [ref.quantize_kv(c, k) for c, k in zip(c_kv, k_pe)]
    t0 = time.perf_counter()
    out, lse = ref.decode_reference(q, kv, [ctx] * b, scale, causal=True)
    exact, exact_lse = ref.exact_attention(q, c_kv, k_pe, [ctx] * b, scale, causal=True)
    print(f"shape {b}x{s_q}x{h}x{ctx}: relative L2 error of the FP8 pipeline vs exact attention "
          f"{ref.rel_l2(out, exact):.2e}, max |lse error| {np.max(np.abs(lse - exact_lse)):.2e} "
          f"({time.perf_counter() - t0:.1f} s of NumPy)")
    print(_memory_line(args.batch * args.context))
    print("Run this on an H100/H200 for the kernel timings.")
    return 0


def _time_ms(fn, iters: int) -> float:
    import cupy

    fn()
    cupy.cuda.get_current_stream().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def run_gpu(args: argparse.Namespace) -> int:
    import cupy
    import ml_dtypes

    import snapmla

    b, s_q, h, ctx = args.batch, args.q_len, args.heads, args.context
    pages_per_req = (ctx + 63) // 64
    scale = 192**-0.5
    rs = cupy.random.RandomState(args.seed)
    bf16 = ml_dtypes.bfloat16
    print(f"snapmla demo on {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}: "
          f"batch {b}, q_len {s_q}, heads {h}, context {ctx}")

    tokens = b * ctx
    cache = snapmla.KVCache(num_layers=1, num_pages=b * pages_per_req)
    perm = rs.permutation(b * pages_per_req).astype(cupy.int32)
    block_table = perm.reshape(b, pages_per_req)
    c_kv = (rs.standard_normal((tokens, 512), dtype=cupy.float32) * 0.5).astype(bf16)
    k_pe = (rs.standard_normal((tokens, 64), dtype=cupy.float32) * 0.5).astype(bf16)
    pos = cupy.arange(ctx, dtype=cupy.int64)
    slots = (block_table[:, pos // 64].astype(cupy.int64) * 64 + pos % 64).reshape(-1)
    append_ms = _time_ms(lambda: cache.append(0, c_kv, k_pe, slots), 5)
    seqlens = cupy.full((b,), ctx, dtype=cupy.int32)
    q = (rs.standard_normal((b, s_q, h, 576), dtype=cupy.float32) * 0.5).astype(bf16)
    plan = snapmla.DecodePlan(seqlens, num_heads=h, q_len=s_q, max_pages=pages_per_req)
    out = cupy.empty((b, s_q, h, 512), dtype=bf16)
    lse = cupy.empty((b, h, s_q), dtype=cupy.float32)

    def step() -> None:
        snapmla.decode(cache, 0, q, block_table, seqlens, plan, softmax_scale=scale,
                       out=out, lse=lse)

    ms = _time_ms(step, args.iters)
    flops = 2.0 * b * s_q * h * ctx * (576 + 512)
    kv_bytes = tokens * FP8_BYTES_PER_TOKEN
    print(f"decode: {ms * 1e3:.1f} us  ({flops / ms / 1e9:.0f} TFLOPS, "
          f"{kv_bytes / ms / 1e9:.2f} TB/s of KV read)")
    print(f"append of {tokens} tokens: {append_ms * 1e3:.1f} us "
          f"({tokens * (1152 + 8 + 644) / append_ms / 1e9:.2f} TB/s)")
    print(_memory_line(tokens))

    # Accuracy on the first request (host float64): the contract's model and exact attention.
    n_check = 1
    q_h = cupy.asnumpy(q[:n_check])
    c_h = [cupy.asnumpy(c_kv[i * ctx:(i + 1) * ctx]) for i in range(n_check)]
    k_h = [cupy.asnumpy(k_pe[i * ctx:(i + 1) * ctx]) for i in range(n_check)]
    kv = [ref.quantize_kv(c, k) for c, k in zip(c_h, k_h)]
    model, _ = ref.decode_reference(q_h, kv, [ctx] * n_check, scale, causal=True)
    exact, _ = ref.exact_attention(q_h, c_h, k_h, [ctx] * n_check, scale, causal=True)
    got = cupy.asnumpy(out[:n_check]).astype(np.float64)
    model = model.astype(ml_dtypes.bfloat16).astype(np.float64)  # the contract's out = bf16(O/l)
    print(f"accuracy (request 0): rel. L2 vs the contract's NumPy model "
          f"{ref.rel_l2(got, model):.1e}; vs exact float64 attention {ref.rel_l2(got, exact):.2e}")

    try:
        import flashinfer  # noqa: F401
        import torch
    except Exception:  # noqa: BLE001
        print("FlashInfer is not installed: no BF16 baseline timed (bench/bench_decode.py has it).")
        return 0
    fi_ms = _flashinfer_ms(torch, q, c_kv, k_pe, block_table, seqlens, h, s_q, scale, args.iters)
    print(f"FlashInfer FA3 BF16: {fi_ms * 1e3:.1f} us -> snapmla speedup {fi_ms / ms:.2f}x")
    return 0


def _flashinfer_ms(torch, q, c_kv, k_pe, block_table, seqlens, h, s_q, scale, iters) -> float:
    import flashinfer

    b, pages = block_table.shape
    tq = torch.from_dlpack(q)
    ckv = torch.empty((b * pages, 64, 512), dtype=torch.bfloat16, device="cuda")
    kpe = torch.empty((b * pages, 64, 64), dtype=torch.bfloat16, device="cuda")
    ctx = int(seqlens[0])
    bt = torch.from_dlpack(block_table)
    pad = pages * 64 - ctx  # pages hold 64 tokens; FlashInfer reads only up to each length
    src_c = torch.nn.functional.pad(torch.from_dlpack(c_kv).view(b, ctx, 512), (0, 0, 0, pad))
    src_k = torch.nn.functional.pad(torch.from_dlpack(k_pe).view(b, ctx, 64), (0, 0, 0, pad))
    rows = bt.reshape(-1).long()
    ckv[rows] = src_c.reshape(b * pages, 64, 512)
    kpe[rows] = src_k.reshape(b * pages, 64, 64)
    ws = torch.empty(128 * 2**20, dtype=torch.int8, device="cuda")
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="fa3")
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * s_q
    kv_indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * pages
    kv_lens = torch.from_dlpack(seqlens)
    wrapper.plan(qo_indptr, kv_indptr, bt.reshape(-1).contiguous(), kv_lens, h, 512, 64, 64,
                 s_q > 1, scale, torch.bfloat16, torch.bfloat16)
    q_nope = tq[..., :512].reshape(b * s_q, h, 512).contiguous()
    q_pe = tq[..., 512:].reshape(b * s_q, h, 64).contiguous()
    o = torch.empty_like(q_nope)
    return _time_ms(lambda: wrapper.run(q_nope, q_pe, ckv, kpe, out=o), iters)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    return run_gpu(args) if _gpu_available() else run_cpu(args)


if __name__ == "__main__":
    sys.exit(main())
