"""Every GPU operation once on small shapes, for compute-sanitizer (memcheck, racecheck).

Not a pytest module: run as `compute-sanitizer --tool memcheck python3 tests/gpu/smoke.py`.
Shapes cover page boundaries, an empty request, s_q > 1 with causal masking, odd head counts
and many splits per request (num_sm_parts small), so every branch of the kernels runs.
"""

from __future__ import annotations

import sys

import cupy
import ml_dtypes
import numpy as np

import snapmla
from snapmla.decode import runnable_kernels


def main() -> int:
    rs = cupy.random.RandomState(3)
    bf16 = ml_dtypes.bfloat16
    seqlens_h = np.array([0, 1, 63, 64, 65, 300], dtype=np.int32)
    b, max_pages = len(seqlens_h), 5
    cache = snapmla.KVCache(num_layers=2, num_pages=b * max_pages)
    cache.buffer.fill(0x7F)  # NaN everywhere nothing was appended
    table = cupy.asarray(np.random.default_rng(0).permutation(b * max_pages).astype(np.int32))
    table = table.reshape(b, max_pages)
    slots = []
    for i, n in enumerate(seqlens_h):
        pos = np.arange(n)
        slots.append(cupy.asnumpy(table[i])[pos // 64].astype(np.int64) * 64 + pos % 64)
    slots = cupy.asarray(np.concatenate(slots))
    n = int(slots.size)
    c_kv = (rs.standard_normal((n, 512), dtype=cupy.float32) * 0.5).astype(bf16)
    k_pe = (rs.standard_normal((n, 64), dtype=cupy.float32) * 0.5).astype(bf16)
    for layer in range(2):
        cache.append(layer, c_kv, k_pe, slots)
    cache.fetch_dequant(1, slots)
    seqlens = cupy.asarray(seqlens_h)
    for heads, q_len, parts in [(16, 1, 0), (24, 2, 3), (128, 4, 0), (1, 1, 2)]:
        q = (rs.standard_normal((b, q_len, heads, 576), dtype=cupy.float32) * 0.5).astype(bf16)
        snapmla.quantize_q(q)
        plan = snapmla.DecodePlan(seqlens, num_heads=heads, q_len=q_len, max_pages=max_pages,
                                  num_sm_parts=parts)
        for layer, kernel in [(0, "fast"), (1, "reference")]:
            out, _ = snapmla.decode(cache, layer, q, table, seqlens, plan,
                                    softmax_scale=192**-0.5, causal=True, kernel=kernel)
        cupy.cuda.get_current_stream().synchronize()
        bits = out.view(cupy.uint16)[1:] & 0x7FFF
        bad = (bits >= 0x7F80).any()  # Inf or NaN in a request that has context
        print(f"heads {heads} q_len {q_len} parts {parts}: non-finite rows: {bool(bad)}")
    # Device-side data the host cannot check: page ids below 0 and past the layer, lengths
    # below 0 and past the block table, slots past the cache. NaN rows (or skipped slots),
    # and no access outside the cache, the workspace or the outputs.
    bad_table = table.copy()
    bad_table[1, 0] = -7
    bad_table[4, 1] = cache.num_pages + 1000
    bad_lens = cupy.asarray(np.array([-5, 1, 63, 64, max_pages * 64 + 1, 300], np.int32))
    q_bad = (rs.standard_normal((b, 2, 16, 576), dtype=cupy.float32) * 0.5).astype(bf16)
    bad_plan = snapmla.DecodePlan(bad_lens, num_heads=16, q_len=2, max_pages=max_pages)
    for kernel in ("fast", "reference"):
        out, lse = snapmla.decode(cache, 0, q_bad, bad_table, bad_lens, bad_plan,
                                  softmax_scale=192**-0.5, causal=True, kernel=kernel)
    far = cupy.asarray(np.array([-1, cache.num_pages * 64, 2**40, 5], np.int64))
    cache.append(1, c_kv[:4], k_pe[:4], far)
    cache.fetch_dequant(1, far)
    cupy.cuda.get_current_stream().synchronize()
    print("out-of-range pages, lengths and slots: done")

    # A plan overwritten with garbage: every kernel must write NaN rows and nothing else.
    buffer = plan._owned._buffers[0]  # the plan's device words (private, test only)
    buffer[:] = cupy.asarray(np.random.default_rng(1).integers(0, 256, buffer.size,
                                                              dtype=np.uint8))
    for kernel in ("fast", "reference"):
        out, lse = snapmla.decode(cache, 0, q, table, seqlens, plan, softmax_scale=192**-0.5,
                                  causal=True, kernel=kernel)
        cupy.cuda.get_current_stream().synchronize()
        print(f"garbage plan, {kernel}: all NaN: {bool(cupy.isnan(lse).all())}")

    # Engine layouts: pages inside larger slots, one buffer per layer, q_nope and q_pe
    # apart, slot copies and reads by block table, including out-of-range ids and rows.
    stride = 64 * 656
    pages = b * max_pages
    strided = cupy.full(2 * pages * stride, 0x7F, dtype=cupy.uint8)
    per_layer = [cupy.full(pages * stride, 0x7F, dtype=cupy.uint8) for _ in range(2)]
    plan = snapmla.DecodePlan(seqlens, num_heads=16, q_len=2, max_pages=max_pages)
    q2 = (rs.standard_normal((b, 2, 16, 576), dtype=cupy.float32) * 0.5).astype(bf16)
    for engine in (
        snapmla.KVCache(2, pages, buffer=strided, page_stride=stride),
        snapmla.KVCache(2, pages, layers=per_layer, page_stride=stride),
    ):
        for layer in range(2):
            engine.append(layer, c_kv, k_pe, slots)
        engine.append(1, c_kv[:4], k_pe[:4], far)
        engine.fetch_dequant(1, far)
        for kernel in ("fast", "reference"):
            snapmla.decode(engine, 1, q2[..., :512], table, seqlens, plan, softmax_scale=192**-0.5,
                           kernel=kernel, q_pe=q2[..., 512:])
            snapmla.decode(engine, 0, q_bad, bad_table, bad_lens, bad_plan,
                           softmax_scale=192**-0.5, kernel=kernel)
        dst = cupy.arange(4 * 64, 4 * 64 + 8, dtype=cupy.int64)
        engine.copy_slots(0, far[:4].copy(), dst[:4])  # out-of-range sources: skipped
        engine.copy_slots(0, slots[:8].copy(), dst)
        rows = cupy.asarray(np.array([0, 10, 400, -3, 50, 700], np.int64))
        out_c = cupy.zeros((800, 512), dtype=bf16)
        out_k = cupy.zeros((800, 64), dtype=bf16)
        engine.gather_dequant(0, bad_table, bad_lens, rows, c_kv=out_c, k_pe=out_k)
        cupy.cuda.get_current_stream().synchronize()
        engine.close()
    print("engine layouts: done")

    # The two-term query: its quantizer, and decode with it (the reference kernel, and the
    # fast one where the library runs it, s_q * h <= 32: its N = 16 and 32 instantiations), on the
    # mixed contexts, a strided cache, out-of-range pages and lengths, and many splits.
    for heads, q_len, parts in [(16, 1, 0), (24, 2, 3), (1, 3, 2), (7, 1, 5), (8, 4, 0)]:
        q = (rs.standard_normal((b, q_len, heads, 576), dtype=cupy.float32) * 0.5).astype(bf16)
        snapmla.quantize_q(q, precision="fp8x2")
        plan = snapmla.DecodePlan(seqlens, num_heads=heads, q_len=q_len, max_pages=max_pages,
                                  num_sm_parts=parts, q_precision="fp8x2")
        for kernel in [k for k in ("reference", "fast") if k in runnable_kernels(plan.config)]:
            snapmla.decode(cache, 1, q, table, seqlens, plan, softmax_scale=192**-0.5,
                           kernel=kernel)
    engine = snapmla.KVCache(2, pages, buffer=strided, page_stride=stride)
    bad_plan2 = snapmla.DecodePlan(bad_lens, num_heads=16, q_len=2, max_pages=max_pages,
                                   q_precision="fp8x2")
    for kernel in ("reference", "fast"):
        snapmla.decode(engine, 0, q_bad, bad_table, bad_lens, bad_plan2,
                       softmax_scale=192**-0.5, kernel=kernel)
    cupy.cuda.get_current_stream().synchronize()
    engine.close()
    print("two-term query: done")

    # Parts of more than 4 blocks: the seesaw kernels' ring of 4 row-statistics
    # slots is reused within a part, which the shapes above never do (at most 5 blocks a
    # request). One part a request of 10 blocks, and one part across two requests, at 16 and 32
    # query rows (the two-term layout's N = 16 and 32 kernels) and 64, both query precisions.
    long_lens = np.array([640, 600], dtype=np.int32)
    long_pages = 10
    long_cache = snapmla.KVCache(1, 2 * long_pages)
    long_cache.buffer.fill(0x7F)  # NaN everywhere nothing was appended
    long_table = cupy.arange(2 * long_pages, dtype=cupy.int32).reshape(2, long_pages)
    n_long = int(long_lens.sum())
    long_slots = cupy.concatenate([cupy.arange(640), long_pages * 64 + cupy.arange(600)])
    ck = (rs.standard_normal((n_long, 512), dtype=cupy.float32) * 0.5).astype(bf16)
    kp = (rs.standard_normal((n_long, 64), dtype=cupy.float32) * 0.5).astype(bf16)
    long_cache.append(0, ck, kp, long_slots.astype(cupy.int64))
    long_seqlens = cupy.asarray(long_lens)
    for heads, q_len, parts, precision in [(16, 1, 2, "fp8"), (16, 1, 2, "fp8x2"),
                                           (32, 1, 2, "fp8"), (32, 1, 2, "fp8x2"),
                                           (16, 2, 1, "fp8"), (16, 1, 1, "fp8x2"),
                                           (64, 1, 2, "fp8")]:
        q = (rs.standard_normal((2, q_len, heads, 576), dtype=cupy.float32) * 0.5).astype(bf16)
        plan = snapmla.DecodePlan(long_seqlens, num_heads=heads, q_len=q_len,
                                  max_pages=long_pages, num_sm_parts=parts, q_precision=precision)
        snapmla.decode(long_cache, 0, q, long_table, long_seqlens, plan, softmax_scale=192**-0.5,
                       causal=True, kernel="fast")
    cupy.cuda.get_current_stream().synchronize()
    long_cache.close()
    print("parts of more than 4 blocks: done")
    print("smoke done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
