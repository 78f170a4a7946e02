"""snapmla.decode against reference.decode_reference: the main grid and the hard cases.

Every case builds a fresh random cache whose pages are shuffled and interleaved across requests,
whose unused slots, pages and block-table columns hold NaN bytes, and decodes into NaN-poisoned
outputs. Tolerances (numerics contract v3): the reference kernel within 2e-3 relative L2 of
out (overall; 4e-3 per request) and 1e-3 on lse; the tensor-core kernel ("fast", and AUTO,
which runs it) within 2e-2 / 5e-3 on random inputs and 1e-3 on exact-logit inputs. Empty rows
exactly 0 / +inf, rows that see a NaN all NaN, every kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np
import pytest
from _util import (
    BF16,
    FAST_EXACT_RTOL,
    FAST_LSE_ATOL,
    FAST_OUT_RTOL,
    FRAMEWORKS,
    REF_LSE_ATOL,
    REF_OUT_RTOL,
    SM_SCALE,
    assert_all_nan,
    assert_rounds_to,
    check_decode,
    cupy_module,
    device_inputs,
    download,
    make_cache,
    make_case,
    make_plan,
    nan_cupy,
    page_slots,
    poisoned_outputs,
    random_bf16,
    run_decode,
    synchronize,
    to_cupy,
    to_numpy,
    to_torch,
    torch_module,
    upload,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapmla
from snapmla import reference as ref
from snapmla.decode import DecodeConfig, runnable_kernels

pytestmark = pytest.mark.gpu

GRID_LENS = [0, 1, 63, 64, 65, 1000, 16384]
KERNELS = ("reference", "fast", "auto")


def tolerances(kernel: str, exact_logits: bool = False) -> dict:
    """Agreement bounds with the contract's model (v3; every kernel's P block is 64 tokens, the
    model's default). The reference kernel meets 2e-3 everywhere; the tensor-core kernel
    ("fast", and AUTO, which runs it) computes S with FP8 wgmma, whose internal accumulation is
    not fp32: it meets 1e-3 on inputs whose logits every accumulator holds exactly (layout and
    logic), and 2e-2 / 5e-3 on lse on random inputs."""
    if kernel == "reference":
        return {"rtol": REF_OUT_RTOL, "lse_atol": REF_LSE_ATOL}
    if exact_logits:
        return {"rtol": FAST_EXACT_RTOL, "lse_atol": FAST_LSE_ATOL}
    return {"rtol": FAST_OUT_RTOL, "lse_atol": FAST_LSE_ATOL}


def _check_every_kernel(case, label: str, **run_kwargs) -> None:
    """Every kernel on ``case`` (default reference) against the model at its tier's bounds."""
    cache = make_cache(case)
    want = case.reference()
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel, **run_kwargs)
        check_decode(out, lse, *want, **tolerances(kernel), label=f"{label} kernel={kernel}")


# ---------------------------------------------------------------------------- the grid


@pytest.mark.parametrize("s_q", [1, 2, 4])
@pytest.mark.parametrize("h", [1, 16, 24, 64, 128])
def test_decode_grid(rng: np.random.Generator, h: int, s_q: int) -> None:
    """Mixed contexts in one batch (empty, one token, page edges, long), causal, both kernels."""
    lens = [int(x) for x in rng.permutation(GRID_LENS)]
    case = make_case(rng, lens, num_heads=h, q_len=s_q)
    cache = make_cache(case)
    want = case.reference(causal=True)
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel)
        check_decode(out, lse, *want, **tolerances(kernel), label=f"h={h} s_q={s_q} kernel={kernel} lens={lens}")


@pytest.mark.parametrize(("h", "s_q"), [(16, 2), (128, 4), (24, 1), (1, 3)])
def test_decode_non_causal(rng: np.random.Generator, h: int, s_q: int) -> None:
    lens = [1, 2, 200, 3000, 64]
    case = make_case(rng, lens, num_heads=h, q_len=s_q)
    cache = make_cache(case)
    want = case.reference(causal=False)
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, causal=False, kernel=kernel)
        check_decode(out, lse, *want, **tolerances(kernel), label=f"non-causal h={h} s_q={s_q} kernel={kernel}")
    # The causal twin of the same case (differs for every row but the last when s_q > 1).
    out_c, lse_c = run_decode(cache, case, causal=True)
    check_decode(out_c, lse_c, *case.reference(causal=True), label="causal twin")


@pytest.mark.parametrize(
    ("h", "s_q", "lens"), [(128, 1, [131072, 70001]), (16, 2, [131072]), (64, 4, [100000, 3])]
)
def test_decode_long_context(rng: np.random.Generator, h: int, s_q: int, lens: list) -> None:
    case = make_case(rng, lens, num_heads=h, q_len=s_q)
    cache = make_cache(case)
    want = case.reference()
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel)
        err = check_decode(out, lse, *want, **tolerances(kernel), label=f"long h={h} s_q={s_q} {kernel} lens={lens}")
        print(f"long context h={h} s_q={s_q} lens={lens} kernel={kernel}: rel L2 {err:.2e}")


def test_decode_empty_contexts(rng: np.random.Generator) -> None:
    """Zero context: out 0, lse +inf; contexts shorter than s_q leave the early rows empty."""
    case = make_case(rng, [0, 0, 0], num_heads=16, q_len=2)
    cache = make_cache(case)
    out, lse = run_decode(cache, case)
    assert np.all(to_numpy(out, BF16).astype(np.float32) == 0)
    assert np.all(np.isposinf(to_numpy(lse)))
    case = make_case(rng, [1, 2, 3, 0, 4], num_heads=8, q_len=4)
    cache = make_cache(case)
    want = case.reference()
    assert np.isposinf(want[1][0, :, :3]).all() and np.isfinite(want[1][0, :, 3]).all()
    for causal in (True, False):
        want = case.reference(causal=causal)
        out, lse = run_decode(cache, case, causal=causal)
        check_decode(out, lse, *want, label=f"short contexts causal={causal}")


EDGE_LENS = [0, 1, 2, 3, 4, 63, 64, 65, 127, 128, 129, 191, 192, 193, 4095, 4096, 4097]


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples on every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    h=st.integers(1, 128),
    s_q=st.integers(1, 4),
    lens=st.lists(
        st.one_of(st.sampled_from(EDGE_LENS), st.integers(0, 3000)), min_size=1, max_size=6
    ),
    causal=st.booleans(),
    kernel=st.sampled_from(KERNELS),
    num_sm_parts=st.sampled_from([0, 1, 2, 5, 200]),
    seed=st.integers(0, 2**32 - 1),
)
def test_decode_random_shapes(
    h: int, s_q: int, lens: list, causal: bool, kernel: str, num_sm_parts: int, seed: int
) -> None:
    """Property test over shapes: odd head counts, page edges, empty and short contexts."""
    rng = np.random.default_rng(seed)
    case = make_case(rng, lens, num_heads=h, q_len=s_q, spare_pages=int(rng.integers(1, 4)))
    cache = make_cache(case)
    out, lse = run_decode(cache, case, causal=causal, kernel=kernel, num_sm_parts=num_sm_parts)
    label = f"h={h} s_q={s_q} lens={lens} causal={causal} {kernel} parts={num_sm_parts}"
    check_decode(out, lse, *case.reference(causal=causal), **tolerances(kernel), label=label)


@pytest.mark.parametrize("s_q", [1, 2])
def test_decode_large_batch(rng: np.random.Generator, s_q: int) -> None:
    """300 requests of short, varied contexts (many empty), shuffled pages."""
    lens = rng.integers(0, 600, 300)
    lens[::37] = 0
    lens[5::41] = 64
    case = make_case(rng, [int(x) for x in lens], num_heads=16, q_len=s_q)
    cache = make_cache(case)
    want = case.reference()
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel)
        check_decode(out, lse, *want, **tolerances(kernel), label=f"batch 300, s_q={s_q}, {kernel}")


def test_decode_reads_only_its_layer(rng: np.random.Generator) -> None:
    """Layers 0 and 2 hold nothing but NaN bytes; decoding layer 1 must not see them."""
    case = make_case(rng, [700, 64, 5, 1], num_heads=16, q_len=2, num_layers=3)
    layer_bytes = case.num_pages * ref.PAGE_BYTES
    case.image[:layer_bytes] = 0xFF
    case.image[2 * layer_bytes :] = 0xFF
    cache = make_cache(case)
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, 1, kernel=kernel)
        check_decode(out, lse, *case.reference(1), **tolerances(kernel), label=f"layer 1 between NaN layers, {kernel}")


# ---------------------------------------------------------------------------- plans and splits


def test_plan_reused_across_layers(rng: np.random.Generator) -> None:
    case = make_case(rng, [300, 4097, 64, 1, 2500], num_heads=32, q_len=2, num_layers=3)
    cache = make_cache(case)
    q_dev, bt_dev, sl_dev = device_inputs(case)
    plan = make_plan(case, sl_dev)
    for layer in (2, 0, 1, 2):
        out, lse = poisoned_outputs(*case.q.shape[:3])
        snapmla.decode(
            cache, layer, q_dev, bt_dev, sl_dev, plan, softmax_scale=SM_SCALE, out=out, lse=lse
        )
        synchronize()
        check_decode(out, lse, *case.reference(layer), label=f"layer {layer}")


def test_plan_update_in_place(rng: np.random.Generator) -> None:
    case = make_case(rng, [3000, 700, 130, 64], num_heads=16, q_len=1)
    cache = make_cache(case)
    q_dev, bt_dev, sl_dev = device_inputs(case)
    plan = make_plan(case, to_torch(np.array([1, 1, 1, 1], np.int32)))
    for lens in ([3000, 700, 130, 64], [5, 699, 0, 63], [2999, 1, 130, 1]):
        seqlens = np.array(lens, np.int32)
        sl_dev = to_torch(seqlens)
        plan.update(sl_dev)
        out, lse = poisoned_outputs(*case.q.shape[:3])
        snapmla.decode(
            cache, 0, q_dev, bt_dev, sl_dev, plan, softmax_scale=SM_SCALE, out=out, lse=lse
        )
        synchronize()
        check_decode(out, lse, *case.reference(seqlens=seqlens), label=f"update to {lens}")


@pytest.mark.parametrize("num_sm_parts", [1, 3, 7, 264])
def test_num_sm_parts(rng: np.random.Generator, num_sm_parts: int) -> None:
    """Few parts force many splits per request; many parts leave some idle."""
    case = make_case(rng, [16384, 65, 5000, 0, 1, 640], num_heads=64, q_len=2)
    _check_every_kernel(case, f"num_sm_parts={num_sm_parts}", num_sm_parts=num_sm_parts)


# The combine's kernels (cpp/decode/combine.cu, launch_combine), each aimed at by a case:
# the grouped kernel with 8, 4, 2 and 1 groups (parts a request ~ num_parts / batch, at most
# (max_pages + 1) / 2; make_case adds a block-table column), in one wave of CTAs; the wide
# kernel (up to 512 rows where the grouped CTAs would not fit one wave); the one-warp-per-row
# kernel (more rows); and a request with many more parts than the estimate (chunks in series).
COMBINE_PATHS = [
    ("grouped8", 128, [8192], 66),
    ("grouped4", 128, [3000], 66),
    ("grouped2", 128, [1500], 66),
    ("grouped1", 128, [800], 66),
    ("grouped1-batch8", 128, [4096] * 8, 66),
    ("wide", 128, [1024] * 4, 16),
    ("narrow", 128, [1024] * 8, 16),
    ("grouped8-uneven", 16, [16384, 64], 66),
]


@pytest.mark.parametrize(
    ("path", "h", "lens", "parts"), COMBINE_PATHS, ids=[c[0] for c in COMBINE_PATHS]
)
def test_combine_paths(
    rng: np.random.Generator, path: str, h: int, lens: list, parts: int
) -> None:
    case = make_case(rng, lens, num_heads=h, q_len=1)
    _check_every_kernel(case, f"combine {path}", num_sm_parts=parts)


# Batches of 1-20 requests at 40-128 heads whose requests the plan splits into up to 8 parts of
# their own (the aligned line), with requests that take fewer parts, one part or none, a partial
# second row tile, and two blocks a part at batch 1: the combine's inputs at their most
# ragged.
SPLIT_SHAPES = [
    ("ragged-8", 128, 1, [4096, 4000, 100, 0, 65, 4096, 1, 2048]),
    ("batch1-1k", 128, 1, [1024]),
    ("ragged-12", 128, 1, [3000, 2999, 64, 65, 1500, 2500, 0, 3000, 700, 128, 129, 2000]),
    ("batch20", 128, 1, [2000 - 97 * i for i in range(20)]),
    ("one-tile", 64, 1, [1000 + 50 * i for i in range(10)]),
    ("partial-tile", 40, 2, [1500, 1100, 63, 1500, 700, 1024]),
]


@pytest.mark.parametrize(
    ("name", "h", "s_q", "lens"), SPLIT_SHAPES, ids=[c[0] for c in SPLIT_SHAPES]
)
def test_split_shapes(
    rng: np.random.Generator, name: str, h: int, s_q: int, lens: list
) -> None:
    _check_every_kernel(make_case(rng, lens, num_heads=h, q_len=s_q), f"split {name}")


def test_split_count_changes_rounding_only(rng: np.random.Generator) -> None:
    case = make_case(rng, [20000, 333], num_heads=16, q_len=1)
    cache = make_cache(case)
    outs = [run_decode(cache, case, num_sm_parts=p)[0] for p in (1, 5, 132)]
    a = [to_numpy(o, BF16).astype(np.float64) for o in outs]
    for x in a[1:]:
        assert ref.rel_l2(x, a[0]) <= 2e-3


def _rescaled_case(case, k: int):
    """``case`` with every token's scale times 2^k and the query times 2^-k. The stored RoPE
    is k_pe / s, so the token's RoPE scales with s too: every logit is what it was (products
    of powers of two, the query's codes unchanged, its scale 2^-k times), V is 2^k times, and
    so is the output, exactly in the contract's model while the floors stay out of reach (the
    query scale's 2^-32 and sigma's 2^-64: k in [-30, 20] at std 0.5, with ~2^10 of room
    for sigma at -30). The token scales then go below the 2^-32 floor that quantization
    gives (snapmla_append could not write this cache; the decode reads any scale). Layer 0
    only; c_kv and k_pe are left unscaled (the test compares kernel with kernel)."""
    scaled = dataclasses.replace(case, image=case.image.copy(), kv=[list(case.kv[0])])
    f = np.float32(2.0**k)
    for r, n in enumerate(int(x) for x in case.seqlens):
        content, rope, scale = case.kv[0][r]
        kv = (content, rope, (scale * f).astype(np.float32))
        ref.write_tokens(scaled.image, case.num_pages, 0, page_slots(case.block_table[r], n), *kv)
        scaled.kv[0][r] = kv
    scaled.q = (case.q.astype(np.float32) / f).astype(BF16)
    return scaled


@pytest.mark.parametrize("k", [-30, -20, 20])
@pytest.mark.parametrize(("h", "lens"), [(128, [4096, 1000, 65]), (16, [8192, 300])])
def test_split_partials_keep_each_rows_range(
    rng: np.random.Generator, h: int, lens: list, k: int
) -> None:
    """Requests split into many parts, their tokens' scales times 2^k and the query times
    2^-k: every kernel's output is 2^k times the unscaled case's and its lse the same (fp32
    out; within 1e-4 relative L2, room for roundings that would not commute with the power of
    two). What it pins: the partials between the attention kernel and the combine keep each
    row's range (at 2^-30 the outputs are ~1e-10, below FP16's subnormals; at 2^20 ~1e6,
    past its largest value: an unscaled FP16 partial fails here; an unscaled BF16 one, with
    fp32's exponent range, would pass, and fails the decode tests' bounds instead)."""
    base = make_case(rng, lens, num_heads=h, q_len=1)
    scaled = _rescaled_case(base, k)
    cache_base, cache_scaled = make_cache(base), make_cache(scaled)
    for kernel in KERNELS:
        label = f"2^{k} h={h} lens={lens} kernel={kernel}"
        run = {"kernel": kernel, "num_sm_parts": 132, "out_dtype": "float32"}
        o0, l0 = run_decode(cache_base, base, **run)
        o1, l1 = run_decode(cache_scaled, scaled, **run)
        want = to_numpy(o0).astype(np.float64) * 2.0**k
        got = to_numpy(o1).astype(np.float64)
        assert np.isfinite(got).all(), f"{label}: non-finite rows"
        err = ref.rel_l2(got, want)
        assert err <= 1e-4, f"{label}: rel L2 {err:.3g} against 2^k times the unscaled output"
        lse0, lse1 = to_numpy(l0, np.float32), to_numpy(l1, np.float32)
        assert np.allclose(lse1, lse0, rtol=0, atol=1e-4), f"{label}: lse moved"


def _exact_logit_case(rng: np.random.Generator, lens: list[int], h: int, s_q: int):
    """A case whose logits every accumulator holds exactly, however it rounds.

    Stored content codes and RoPE values are integers in [-2, 2] (content channel 0 is 0), the
    query is integers in [-2, 2] with q_nope channel 0 = 448 (so its scale is exactly 1 and its
    codes are the integers themselves, and channel 0 contributes nothing): every partial sum
    of q8 . c8 + qr . kr is an integer below 574 * 4 < 2^12. Token scales are random fp32 in
    [0.5, 2], applied after the accumulation, so tokens still differ in V and in P'.
    """
    case = make_case(rng, lens, num_heads=h, q_len=s_q)
    for r, n in enumerate(int(x) for x in case.seqlens):
        content = rng.integers(-2, 3, (n, ref.CONTENT_DIM)).astype(np.float32)
        content[:, 0] = 0
        rope = rng.integers(-2, 3, (n, ref.ROPE_DIM)).astype(np.float32).astype(BF16)
        scale = np.exp2(rng.uniform(-1, 1, n)).astype(np.float32)
        kv = (content.astype(ref.FP8), rope, scale)
        ref.write_tokens(case.image, case.num_pages, 0, page_slots(case.block_table[r], n), *kv)
        case.kv[0][r] = kv
        case.c_kv[0][r], case.k_pe[0][r] = ref.dequantize(*kv)
    q = rng.integers(-2, 3, case.q.shape).astype(np.float32)
    q[..., 0] = 448
    case.q = q.astype(BF16)
    return case


@pytest.mark.parametrize(
    ("h", "s_q", "lens", "num_sm_parts"),
    [
        (1, 1, [64, 4096, 1, 65], 0),
        (16, 1, [1024, 65, 1000, 0, 63], 0),
        (16, 2, [2000, 64, 129], 0),
        (128, 1, [8192, 63], 0),
        (64, 4, [3000, 640], 0),
        (16, 1, [64 * 40, 64 * 3 + 7], 264),  # one-block split segments
    ],
)
def test_decode_with_exact_logits(
    rng: np.random.Generator, h: int, s_q: int, lens: list[int], num_sm_parts: int
) -> None:
    """With logits exact in any accumulator, every kernel meets the contract's bound.

    This separates the wgmma kernel's two possible sources of disagreement with the model: if
    it passes here but not on random data, what remains is the precision of QGMMA's internal
    accumulation of S (E4M3 roundings of P that flip), not the token layout or the softmax.
    """
    case = _exact_logit_case(rng, lens, h, s_q)
    cache = make_cache(case)
    want = case.reference()
    errs = {}
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel, num_sm_parts=num_sm_parts)
        label = f"exact logits h={h} s_q={s_q} lens={lens} parts={num_sm_parts} kernel={kernel}"
        errs[kernel] = check_decode(out, lse, *want, **tolerances(kernel, True), label=label)
    print(f"\nexact logits h={h} s_q={s_q} lens={lens}: out rel L2 vs model {errs}")


# ---------------------------------------------------------------------------- CUDA graphs


def _graph_case(rng: np.random.Generator, num_heads: int = 64):
    lens_max = [3000, 700, 64, 129, 2]
    case = make_case(rng, lens_max, num_heads=num_heads, q_len=2)
    lens_a = np.array([2000, 700, 1, 100, 0], np.int32)
    lens_b = np.array([3000, 3, 64, 129, 2], np.int32)
    q_b = random_bf16(rng, case.q.shape, 0.5, 1.0)
    return case, lens_a, lens_b, q_b


def _eager(cache, case, q: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out, lse = run_decode(cache, case, q=q, seqlens=lens)
    return to_numpy(out, BF16), to_numpy(lse, np.float32)


def _assert_same(out, lse, eager: tuple[np.ndarray, np.ndarray], label: str) -> None:
    """A replay equals a fresh eager call bit for bit (same kernels, same schedule)."""
    o, ls = to_numpy(out, BF16), to_numpy(lse, np.float32)
    assert np.array_equal(o.view(np.uint16), eager[0].view(np.uint16)), f"{label}: out differs"
    assert np.array_equal(ls, eager[1], equal_nan=True), f"{label}: lse differs"


def _step(cache, q_t, bt_t, sl_t, plan, out, lse, stream) -> None:
    """A decode step on ``stream``: the plan updated from the lengths, then the decode."""
    plan.update(sl_t, stream=stream)
    snapmla.decode(
        cache, 0, q_t, bt_t, sl_t, plan, softmax_scale=SM_SCALE, out=out, lse=lse, stream=stream
    )


def test_cuda_graph_torch(rng: np.random.Generator) -> None:
    torch = torch_module()
    case, lens_a, lens_b, q_b = _graph_case(rng)
    cache = make_cache(case)
    q_t, bt_t, sl_t = device_inputs(case, seqlens=lens_a)
    plan = make_plan(case, sl_t)
    out, lse = poisoned_outputs(*case.q.shape[:3])
    synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stream = torch.cuda.current_stream()
        _step(cache, q_t, bt_t, sl_t, plan, out, lse, stream)
    synchronize()
    assert_all_nan(out, "out during capture")  # capture only records
    graph.replay()
    synchronize()
    check_decode(out, lse, *case.reference(seqlens=lens_a), label="torch graph, first replay")
    _assert_same(out, lse, _eager(cache, case, case.q, lens_a), "torch graph, first replay")
    # New step: q and seqlens change in place, the graph (plan + decode) is replayed.
    q_t.copy_(to_torch(q_b))
    sl_t.copy_(to_torch(lens_b))
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    synchronize()
    check_decode(out, lse, *case.reference(q=q_b, seqlens=lens_b), label="torch graph, step 2")
    _assert_same(out, lse, _eager(cache, case, q_b, lens_b), "torch graph, step 2")


def test_cuda_graph_cupy(rng: np.random.Generator) -> None:
    cupy = cupy_module()
    case, lens_a, lens_b, q_b = _graph_case(rng)
    cache = make_cache(case)
    b, s_q, h, _ = case.q.shape
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        q_c, bt_c, sl_c = device_inputs(case, "cupy", seqlens=lens_a)
        plan = make_plan(case, sl_c, stream=stream)
        out, lse = nan_cupy((b, s_q, h, 512), BF16), nan_cupy((b, h, s_q), np.float32)
        stream.synchronize()
        stream.begin_capture()
        plan.update(sl_c, stream=stream)
        snapmla.decode(
            cache,
            0,
            q_c,
            bt_c,
            sl_c,
            plan,
            softmax_scale=SM_SCALE,
            out=out,
            lse=lse,
            stream=stream,
        )
        graph = stream.end_capture()
    stream.synchronize()
    assert_all_nan(out, "out during capture")
    graph.launch(stream)
    stream.synchronize()
    check_decode(out, lse, *case.reference(seqlens=lens_a), label="cupy graph, first launch")
    _assert_same(out, lse, _eager(cache, case, case.q, lens_a), "cupy graph, first launch")
    with stream:
        q_c[...] = to_cupy(q_b)
        sl_c[...] = cupy.asarray(lens_b)
        out[...] = nan_cupy(out.shape, BF16)
        lse.fill(np.nan)
    stream.synchronize()
    graph.launch(stream)
    stream.synchronize()
    check_decode(out, lse, *case.reference(q=q_b, seqlens=lens_b), label="cupy graph, step 2")
    _assert_same(out, lse, _eager(cache, case, q_b, lens_b), "cupy graph, step 2")


@pytest.mark.parametrize("stream_kind", ["side", "legacy"])
@pytest.mark.parametrize("h", [8, 64])  # 16 query rows a request (N = 16) and 128 (N = 64)
def test_repeated_call_follows_its_inputs(
    rng: np.random.Generator, h: int, stream_kind: str
) -> None:
    """Decode calls in a row with the same pointers and sizes, their query and lengths changed
    in place between them, and two output buffers taken in turn (the Python call memo keeps a
    repeated call's checks: it must read the inputs anew and write where its own call says):
    each output is a fresh call's, bit for bit, and the buffer a call does not name stays
    untouched. On a stream of torch's and on the legacy default stream (torch's current stream
    unless one is set)."""
    torch = torch_module()
    case, lens_a, lens_b, q_b = _graph_case(rng, h)
    cache = make_cache(case)
    steps = [
        (case.q, lens_a, 0),
        (q_b, lens_b, 0),
        (case.q, lens_b, 1),
        (q_b, lens_a, 0),
        (case.q, lens_a, 1),
        (q_b, lens_b, 1),
    ]
    # the fresh calls first: their own buffers would come between the repeated calls
    fresh = [_eager(cache, case, q, lens) for q, lens, _ in steps]
    q_t, bt_t, sl_t = device_inputs(case, seqlens=lens_a)
    plan = make_plan(case, sl_t)
    outputs = [poisoned_outputs(*case.q.shape[:3]) for _ in range(2)]
    synchronize()
    stream = torch.cuda.Stream() if stream_kind == "side" else torch.cuda.default_stream()
    if stream_kind == "legacy":
        assert stream.cuda_stream == 0  # the legacy default stream
    for k, (q, lens, which) in enumerate(steps):
        with torch.cuda.stream(stream):
            q_t.copy_(to_torch(q))
            sl_t.copy_(to_torch(lens))
            for out, lse in outputs:
                out.fill_(float("nan"))
                lse.fill_(float("nan"))
            _step(cache, q_t, bt_t, sl_t, plan, *outputs[which], stream)
        stream.synchronize()
        _assert_same(*outputs[which], fresh[k], f"repeated call {k}")
        for t in outputs[1 - which]:
            assert_all_nan(t, f"repeated call {k}: the buffer it does not name")


# ---------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_decode_inputs_from_frameworks(rng: np.random.Generator, framework: str) -> None:
    case = make_case(rng, [777, 64, 2050, 0], num_heads=16, q_len=2)
    cache = make_cache(case)
    q_dev, bt_dev, sl_dev = device_inputs(case, framework)
    plan = make_plan(case, sl_dev)
    out, lse = snapmla.decode(cache, 0, q_dev, bt_dev, sl_dev, plan, softmax_scale=SM_SCALE)
    synchronize()
    assert tuple(out.shape) == (4, 2, 16, 512) and tuple(lse.shape) == (4, 16, 2)
    check_decode(out, lse, *case.reference(), label=f"inputs from {framework}")
    # And into caller outputs of the same framework where it has mutable arrays.
    if framework == "cupy":
        out2, lse2 = nan_cupy((4, 2, 16, 512), BF16), nan_cupy((4, 16, 2), np.float32)
        snapmla.decode(
            cache, 0, q_dev, bt_dev, sl_dev, plan, softmax_scale=SM_SCALE, out=out2, lse=lse2
        )
        synchronize()
        check_decode(out2, lse2, *case.reference(), label="cupy outputs")


@pytest.mark.parametrize("batch_stride", ["merged", "free"])
def test_strided_q_and_block_table(rng: np.random.Generator, batch_stride: str) -> None:
    """q with head stride 2x and padded rows, the block table with a wider row stride.

    "merged": batch stride = s_q * token stride. "free": every other batch entry of a bigger
    tensor; the header allows any q_stride_batch.
    """
    case = make_case(rng, [1000, 65, 3, 4096], num_heads=24, q_len=2)
    cache = make_cache(case)
    b, s_q, h, _ = case.q.shape
    if batch_stride == "merged":
        big = random_bf16(rng, (b, s_q, 2 * h, 640))
        big[:, :, 1::2, 16:592] = case.q
        q_dev = to_torch(big)[:, :, 1::2, 16:592]
    else:
        big = random_bf16(rng, (2 * b, s_q, 2 * h, 640))
        big[::2, :, 1::2, 16:592] = case.q
        q_dev = to_torch(big)[::2, :, 1::2, 16:592]
    mp = case.max_pages
    bt_big = np.full((b, mp + 5), -1, np.int32)
    bt_big[:, 2 : 2 + mp] = case.block_table
    bt_dev = to_torch(bt_big)[:, 2 : 2 + mp]
    sl_dev = to_torch(case.seqlens)
    plan = make_plan(case, sl_dev)
    for kernel in KERNELS:
        out, lse = poisoned_outputs(b, s_q, h)
        snapmla.decode(
            cache,
            0,
            q_dev,
            bt_dev,
            sl_dev,
            plan,
            softmax_scale=SM_SCALE,
            out=out,
            lse=lse,
            kernel=kernel,
        )
        synchronize()
        check_decode(
            out, lse, *case.reference(), **tolerances(kernel), label=f"strided inputs ({batch_stride}), {kernel}"
        )


def test_unused_block_table_entries_are_never_read(rng: np.random.Generator) -> None:
    case = make_case(rng, [100, 64, 1, 0, 129], num_heads=16, q_len=2, extra_columns=3)
    cache = make_cache(case)
    bt = case.block_table.copy()
    garbage = np.array([-1, 2**31 - 1, case.num_pages, -(2**31)], np.int32)
    for r, n in enumerate(case.seqlens):
        used = -(-int(n) // 64)
        bt[r, used:] = garbage[np.arange(used, case.max_pages) % garbage.size]
    want = case.reference()
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel, block_table=bt)
        check_decode(out, lse, *want, **tolerances(kernel), label=f"garbage in unused columns, {kernel}")


def test_bad_pages_and_lengths_give_nan_rows_only(rng: np.random.Generator) -> None:
    """Device metadata that cannot be honoured gives NaN rows, never an out-of-bounds read."""
    case = make_case(rng, [300, 300, 300, 300], num_heads=16, q_len=1)
    cache = make_cache(case)
    bt = case.block_table.copy()
    bt[1, 0] = case.num_pages  # a page outside the layer
    bt[2, 1] = -1  # a negative page
    seqlens = case.seqlens.copy()
    seqlens[3] = case.max_pages * 64 + 1  # longer than the block table
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel, block_table=bt, seqlens=seqlens)
        o, ls = to_numpy(out, BF16).astype(np.float32), to_numpy(lse)
        for r in (1, 2, 3):
            assert np.isnan(o[r]).all() and np.isnan(ls[r]).all(), f"request {r} ({kernel})"
        want_o, want_l = ref.decode_reference(
            case.q[:1], case.kv[0][:1], case.seqlens[:1], SM_SCALE, True
        )
        check_decode(out[:1], lse[:1], want_o, want_l, **tolerances(kernel), label=f"healthy request ({kernel})")


def test_nan_token_poisons_only_rows_that_see_it(rng: np.random.Generator) -> None:
    case = make_case(rng, [500, 500, 130, 70, 64], num_heads=16, q_len=2)
    nan_c = case.c_kv[0][1][3].copy()
    nan_c[17] = np.nan
    case.set_token(0, 1, 3, nan_c, case.k_pe[0][1][3])  # request 1: seen by every row
    nan_c = case.c_kv[0][2][129].copy()
    nan_c[0] = np.nan
    case.set_token(0, 2, 129, nan_c, case.k_pe[0][2][129])  # request 2: last token, row t=1
    nan_k = case.k_pe[0][3][10].copy()
    nan_k[5] = np.nan
    case.set_token(0, 3, 10, case.c_kv[0][3][10], nan_k)  # request 3: NaN in RoPE only
    q = case.q.copy()
    q[4, 0, 7, 3] = np.nan  # request 4: one query row
    cache = make_cache(case)
    want_o, want_l = case.reference(q=q)
    assert np.isnan(want_l[1]).all() and np.isnan(want_l[3]).all()
    assert np.isnan(want_l[2, :, 1]).all() and np.isfinite(want_l[2, :, 0]).all()
    assert np.isfinite(want_l[0]).all() and np.isnan(want_l[4, 7, 0])
    assert np.isfinite(np.delete(want_l[4].ravel(), 7 * 2)).all()
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, q=q, kernel=kernel)
        check_decode(out, lse, want_o, want_l, **tolerances(kernel), label=f"NaN inputs, {kernel}")


def test_decode_after_gpu_append(rng: np.random.Generator) -> None:
    """End to end: tokens appended on the GPU, in shuffled pages, then decoded."""
    case = make_case(rng, [1500, 64, 333], num_heads=32, q_len=3, num_layers=2)
    cache = make_cache(case)
    upload(cache, np.full_like(case.image, 0xFF))
    for layer in range(2):
        for r, n in enumerate(case.seqlens):
            slots = page_slots(case.block_table[r], int(n))
            order = rng.permutation(int(n))  # any order of tokens
            cache.append(
                layer,
                to_torch(case.c_kv[layer][r][order]),
                to_torch(case.k_pe[layer][r][order]),
                to_torch(slots[order]),
            )
    assert np.array_equal(download(cache), case.image), "appended bytes differ"
    for layer in range(2):
        out, lse = run_decode(cache, case, layer)
        check_decode(out, lse, *case.reference(layer), label=f"after append, layer {layer}")


# ---------------------------------------------------------------------------- accuracy


def test_error_against_exact_attention_8k(rng: np.random.Generator) -> None:
    """FP8 decode vs float64 attention on the BF16 inputs (randn * 0.5, 8k, 128 heads).

    Not a contract check: the number is printed for the record (pytest -s). The GPU may not be
    worse than the float64 model of the same contract by more than bf16 output rounding.
    """
    case = make_case(rng, [8192], num_heads=128, q_len=1, spread=0.0)
    cache = make_cache(case)
    out, lse = run_decode(cache, case)
    want = case.reference()
    check_decode(out, lse, *want, label="8k randn*0.5")
    exact_o, exact_l = ref.exact_attention(
        case.q, case.c_kv[0], case.k_pe[0], case.seqlens, SM_SCALE, True
    )
    no_p8, _ = case.reference(quantize_p=False)
    err_gpu = ref.rel_l2(to_numpy(out, BF16), exact_o)
    err_ref = ref.rel_l2(want[0], exact_o)
    err_kv = ref.rel_l2(no_p8, exact_o)
    lse_err = float(np.abs(to_numpy(lse).astype(np.float64) - exact_l).max())
    print(
        f"\n8k context, h=128, randn*0.5: rel L2 vs exact attention: GPU {err_gpu:.4f}, "
        f"reference {err_ref:.4f}, reference without FP8 P {err_kv:.4f}; "
        f"lse max abs err {lse_err:.2e}"
    )
    assert err_gpu <= err_ref + 2e-3, f"GPU {err_gpu:.4f} vs model {err_ref:.4f}"
    assert err_gpu < 0.05


@pytest.mark.parametrize(
    ("seqlens", "extra_columns", "num_sm_parts"),
    [
        ([700, 65, 1], 1, 0),  # N = 64, short chains
        ([700, 65, 1], 8192, 0),  # a wide block table: a part may hold 373 blocks
        ([16000], 1, 1),  # one CTA a tile: a 250-block chain
        ([16448], 1, 1),  # one CTA a tile: 257 blocks
    ],
)
def test_n64_pv_paths(
    rng: np.random.Generator, seqlens: list[int], extra_columns: int, num_sm_parts: int
) -> None:
    """N = 64 on long single-CTA chains and wide block tables, against the model and, on the
    long chains, against float64 attention: at most 1.05x the model's own error (the
    contract's randn limit). The cases lie on both sides of the scaled PV's bound (the dispatch
    rule's typical chain from the launch's shape against kScaledPvMinChain, cpp/decode/
    dispatch.h): the first takes the promoted PV's kernel, the others the scaled one's (the
    second with short real chains and edge blocks)."""
    case = make_case(rng, seqlens, num_heads=128, q_len=1, spread=0.0, extra_columns=extra_columns)
    cache = make_cache(case)
    out, lse = run_decode(cache, case, num_sm_parts=num_sm_parts)
    want = case.reference()
    check_decode(out, lse, *want, **tolerances("auto"), label=f"N = 64, {seqlens}")
    if num_sm_parts:
        exact_o, _ = ref.exact_attention(
            case.q, case.c_kv[0], case.k_pe[0], case.seqlens, SM_SCALE, True
        )
        err_gpu = ref.rel_l2(to_numpy(out, BF16), exact_o)
        err_ref = ref.rel_l2(want[0], exact_o)
        print(f"\n{seqlens[0]} tokens in one CTA: vs exact GPU {err_gpu:.5f}, model {err_ref:.5f}")
        assert err_gpu <= 1.05 * err_ref, f"GPU {err_gpu:.5f} vs model {err_ref:.5f}"


# ---------------------------------------------------------------------------- untrusted plans


@pytest.mark.parametrize("corrupt", ["magic", "num_parts", "garbage"])
def test_corrupted_plan_gives_nan_rows(rng: np.random.Generator, corrupt: str) -> None:
    """A plan the kernels cannot trust (never built, built for another split count, which is
    what another GPU's SM count gives, or overwritten) is caught on the device: every row of
    the launch is NaN, with no error and nothing written out of bounds (tests/gpu/smoke.py
    runs the same under memcheck). The same call on the intact plan is finite and right."""
    cupy = cupy_module()
    case = make_case(rng, [3000, 64, 1, 700], num_heads=16, q_len=2)
    cache = make_cache(case)
    _, _, sl_dev = device_inputs(case)
    plan = make_plan(case, sl_dev)
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel, plan=plan)
        check_decode(out, lse, *case.reference(), **tolerances(kernel), label=f"intact, {kernel}")
    buffer = plan._owned._buffers[0]  # the plan's device words (private, test only)
    words = buffer.view(cupy.int32)
    if corrupt == "magic":
        words[0] = 0
    elif corrupt == "num_parts":
        words[2] = 3
    else:
        buffer[:] = cupy.asarray(rng.integers(0, 256, buffer.size, dtype=np.uint8))
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel, plan=plan)
        assert_all_nan(out, f"out with a plan whose {corrupt} is wrong ({kernel})")
        assert_all_nan(lse, f"lse with a plan whose {corrupt} is wrong ({kernel})")


# ------------------------------------------------------------------ the two-term query (#9)


@pytest.mark.parametrize(("h", "s_q"), [(1, 1), (16, 1), (24, 2), (128, 1), (64, 4)])
def test_two_term_query_reference_kernel(rng: np.random.Generator, h: int, s_q: int) -> None:
    """q_precision="fp8x2" with the reference kernel against decode_reference(q_terms=2), at
    the reference tier's bounds, over the grid's contexts (empty, one token, page edges, long)
    and non-causal; it must also differ from the one-term result (the low row is used)."""
    lens = [int(x) for x in rng.permutation(GRID_LENS)]
    case = make_case(rng, lens, num_heads=h, q_len=s_q)
    cache = make_cache(case)
    tol = tolerances("reference")
    for causal in (True, False):
        want = case.reference(causal=causal, q_terms=2)
        out, lse = run_decode(
            cache, case, causal=causal, kernel="reference", q_precision="fp8x2"
        )
        label = f"fp8x2 h={h} s_q={s_q} causal={causal} lens={lens}"
        err = check_decode(out, lse, *want, **tol, label=label)
        one_o, _ = case.reference(causal=causal)
        visible = np.isfinite(one_o) & np.isfinite(want[0])
        gap = ref.rel_l2(want[0][visible], one_o[visible])
        assert gap > 4 * max(err, 1e-6), f"{label}: one- and two-term models {gap:.2e} apart"


@pytest.mark.parametrize(
    ("h", "s_q"), [(1, 1), (7, 1), (16, 1), (5, 3), (8, 4), (16, 2), (24, 1), (32, 1)]
)
def test_two_term_query_fast_kernel(rng: np.random.Generator, h: int, s_q: int) -> None:
    """q_precision="fp8x2" with the seesaw kernel (experimental, kernel="fast" where
    s_q * h <= 32: the N = 16 and 32 two-term instantiations) against
    decode_reference(q_terms=2) at the tensor-core tier's bounds, on the grid's contexts,
    causal and not; nearer the two-term model than the one-term one (the low rows are used)."""
    lens = [int(x) for x in rng.permutation(GRID_LENS)]
    case = make_case(rng, lens, num_heads=h, q_len=s_q)
    cache = make_cache(case)
    for causal in (True, False):
        want = case.reference(causal=causal, q_terms=2)
        one_o, _ = case.reference(causal=causal)
        out, lse = run_decode(cache, case, causal=causal, kernel="fast", q_precision="fp8x2")
        label = f"fast fp8x2 h={h} s_q={s_q} causal={causal} lens={lens}"
        err = check_decode(out, lse, *want, **tolerances("fast"), label=label)
        got = to_numpy(out, BF16).astype(np.float64)
        visible = np.isfinite(one_o) & np.isfinite(want[0])
        err_one = ref.rel_l2(got[visible], one_o[visible])
        assert err < err_one, f"{label}: {err:.2e} from the two-term model, {err_one:.2e} from one"


def _exact_two_term_query(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A query the two-term form holds exactly, with a low term that matters: integers in
    [-2, 2] (channel 0 = 448, so s1 = 1), channel 1 = +-8.4375 (its residual 0.4375 makes
    s2 = 0.4375 / 448 = 2^-10 and rho = 2^-10), and 8 channels n + k / 64 (|n| = 1) or
    n + k / 32 (|n| = 2), |k| <= 3, below half the E4M3 spacing at n: low codes 16 .. 448.
    Every partial sum of q_hi . c8 and q_lo . c8 stays below 2^12 with the exact-logit cache."""
    q = rng.integers(-2, 3, shape).astype(np.float32)
    q[..., 0] = 448
    q[..., 1] = np.where(rng.random(shape[:-1]) < 0.5, -1.0, 1.0) * 8.4375
    ch = rng.choice(np.arange(2, ref.CONTENT_DIM), 8, replace=False)
    n = rng.choice([-2, -1, 1, 2], shape[:-1] + (8,))
    k = rng.integers(-3, 4, shape[:-1] + (8,))
    q[..., ch] = n + np.where(np.abs(n) == 1, k / 64, k / 32)
    q_bf16 = q.astype(BF16)
    assert np.array_equal(q_bf16.astype(np.float32), q)
    return q_bf16


@pytest.mark.parametrize(("h", "s_q", "lens"), [(16, 1, [64 * 9 + 5, 63, 1]), (8, 4, [3000, 65])])
def test_two_term_query_with_exact_logits(
    rng: np.random.Generator, h: int, s_q: int, lens: list[int]
) -> None:
    """The two-term query at the exact-logit bound, both kernels: a query the two terms hold
    exactly with a low term far from zero (rho = 2^-10), on the exact-logit cache, so that
    every accumulator holds both terms' logits exactly. This pins the fast kernel's two-term
    tile (high and low rows interleaved by eights, one query row per thread in the softmax)
    and rho per row at 1e-3, where random data leaves only the tier's 2e-2."""
    case = _exact_logit_case(rng, lens, h, s_q)
    case.q = _exact_two_term_query(rng, case.q.shape)
    cache = make_cache(case)
    want = case.reference(q_terms=2)
    one_o, _ = case.reference()
    visible = np.isfinite(one_o) & np.isfinite(want[0])
    gap = ref.rel_l2(want[0][visible], one_o[visible])
    assert gap > 1e-2, f"the low term moves the model by only {gap:.1e}"
    for kernel in ("reference", "fast"):
        out, lse = run_decode(cache, case, kernel=kernel, q_precision="fp8x2")
        label = f"fp8x2 exact logits h={h} s_q={s_q} lens={lens} kernel={kernel}"
        check_decode(out, lse, *want, **tolerances(kernel, True), label=label)


def test_two_term_query_on_auto(rng: np.random.Generator) -> None:
    """AUTO runs the two-term query on the fast kernel where s_q * h <= 32: bit for bit what
    kernel="fast" writes, at the tier's bounds against the two-term model; past 32 both AUTO
    and "fast" refuse it (the reference kernel takes it, by name)."""
    for h, s_q, lens in ((16, 2, [100, 64, 1, 0]), (5, 1, [65, 63])):
        case = make_case(rng, lens, num_heads=h, q_len=s_q)
        cache = make_cache(case)
        auto = run_decode(cache, case, kernel="auto", q_precision="fp8x2")
        fast = run_decode(cache, case, kernel="fast", q_precision="fp8x2")
        for a, f, dtype in zip(auto, fast, (BF16, np.float32)):
            np.testing.assert_array_equal(
                to_numpy(a, dtype).view(np.uint8), to_numpy(f, dtype).view(np.uint8)
            )
        label = f"fp8x2 auto h={h} s_q={s_q} lens={lens}"
        check_decode(*auto, *case.reference(q_terms=2), **tolerances("fast"), label=label)
    wide = make_case(rng, [100], num_heads=11, q_len=3)
    cache = make_cache(wide)
    for kernel in ("auto", "fast"):
        with pytest.raises(snapmla.SnapMLAError, match="q_len \\* num_heads > 32"):
            run_decode(cache, wide, kernel=kernel, q_precision="fp8x2")
    out, lse = run_decode(cache, wide, kernel="reference", q_precision="fp8x2")
    want = wide.reference(q_terms=2)
    check_decode(out, lse, *want, **tolerances("reference"), label="fp8x2 reference h=11 s_q=3")


# ------------------------------------------------------------ fp32 output (args.out_dtype)


class _Fp32OutCase(NamedTuple):
    case: Any
    seqlens: np.ndarray  # the case's, one past the block table
    block_table: np.ndarray  # the case's, one page outside the layer
    nan_requests: list[int]
    empty_request: int


def _fp32_out_case(rng: np.random.Generator, h: int, s_q: int) -> _Fp32OutCase:
    """Contexts 0, 1, 63, 64, 65 and 1000, and three requests of NaN rows: a NaN token every
    row sees (1000 tokens: split where the plan splits), a length past the block table (the
    kernels' invalid-request rows) and a page outside the layer (their bad-page rows)."""
    case = make_case(rng, [0, 1, 63, 64, 65, 1000, 1000, 300, 200], num_heads=h, q_len=s_q)
    nan_c = case.c_kv[0][6][3].copy()
    nan_c[5] = np.nan
    case.set_token(0, 6, 3, nan_c, case.k_pe[0][6][3])
    seqlens = case.seqlens.copy()
    seqlens[7] = case.max_pages * 64 + 1
    block_table = case.block_table.copy()
    block_table[8, 1] = case.num_pages
    return _Fp32OutCase(case, seqlens, block_table, [6, 7, 8], 0)


def _decode_both_outputs(
    cache: Any, case: Any, label: str, **run_kwargs: Any
) -> tuple[Any, np.ndarray, np.ndarray]:
    """One decode with BF16 out and one with fp32 out into NaN-poisoned outputs: the fp32 out
    rounds (to nearest even) to the BF16 one bit for bit and the lse are the same bits.
    Returns ``(out16, out32, lse32)``, the last two as NumPy arrays."""
    out16, lse16 = run_decode(cache, case, out_dtype="bfloat16", **run_kwargs)
    out32, lse32 = run_decode(cache, case, out_dtype="float32", **run_kwargs)
    assert_rounds_to(out32, out16, label)
    l16, l32 = to_numpy(lse16, np.float32), to_numpy(lse32, np.float32)
    assert np.array_equal(l16.view(np.uint32), l32.view(np.uint32)), f"{label}: lse differs"
    return out16, to_numpy(out32), l32


def _check_fp32_out(cache: Any, c: _Fp32OutCase, label: str, **run_kwargs: Any) -> None:
    """_decode_both_outputs, and the requests' rows are what they must be (NaN, 0 or finite:
    nothing left unwritten), and the fp32 values are not BF16 values (the output kept its
    precision)."""
    kw = {"seqlens": c.seqlens, "block_table": c.block_table, **run_kwargs}
    out16, o32, l32 = _decode_both_outputs(cache, c.case, label, **kw)
    healthy = [r for r in range(c.case.batch) if r not in c.nan_requests]
    assert np.isnan(o32[c.nan_requests]).all(), f"{label}: NaN requests"
    assert np.isfinite(o32[healthy]).all(), f"{label}: unwritten or poisoned rows"
    empty = c.empty_request
    assert (o32[empty] == 0).all() and np.isposinf(l32[empty]).all(), f"{label}: empty request"
    o16 = to_numpy(out16, BF16).astype(np.float32)[healthy]
    assert (o32[healthy] != o16).any(), f"{label}: the fp32 out holds only BF16 values"


@pytest.mark.parametrize("num_sm_parts", [1, 64])
@pytest.mark.parametrize(("h", "s_q"), [(16, 1), (16, 2), (128, 1), (128, 2)])
@pytest.mark.parametrize("q_precision", ["fp8", "fp8x2"])
def test_fp32_out_is_what_the_bf16_out_rounds(
    rng: np.random.Generator, q_precision: str, h: int, s_q: int, num_sm_parts: int
) -> None:
    """out_dtype="float32" (args.out_dtype FP32): every kernel, both query precisions (the
    two-term query on "fast" and "auto" where s_q * h <= 32), one part a row tile (every
    request written by the attention kernel itself, the seesaw epilogue's direct store) and
    64 (the long requests split, written by the combine), empty and NaN rows."""
    c = _fp32_out_case(rng, h, s_q)
    cache = make_cache(c.case)
    runnable = runnable_kernels(DecodeConfig(1, s_q, h, 1, q_precision=q_precision))
    assert set(runnable) == (
        set(KERNELS) if q_precision == "fp8" or s_q * h <= 32 else {"reference"}
    ), runnable
    for kernel in (k for k in KERNELS if k in runnable):
        label = f"fp32 out {q_precision} h={h} s_q={s_q} parts={num_sm_parts} {kernel}"
        run = {"kernel": kernel, "num_sm_parts": num_sm_parts, "q_precision": q_precision}
        _check_fp32_out(cache, c, label, **run)


@pytest.mark.parametrize(
    ("path", "h", "lens", "parts"), COMBINE_PATHS, ids=[c[0] for c in COMBINE_PATHS]
)
def test_fp32_out_on_every_combine_path(
    rng: np.random.Generator, path: str, h: int, lens: list, parts: int
) -> None:
    """Each of the combine's kernels (test_combine_paths) writes fp32 out as the values its
    BF16 store rounds, for every kernel."""
    case = make_case(rng, lens, num_heads=h, q_len=1)
    cache = make_cache(case)
    for kernel in KERNELS:
        label = f"fp32 out, combine {path}, {kernel}"
        _, o32, _ = _decode_both_outputs(cache, case, label, kernel=kernel, num_sm_parts=parts)
        assert np.isfinite(o32).all(), f"{label}: unwritten rows"


def test_fp32_out_allocated_and_from_cupy(rng: np.random.Generator) -> None:
    """decode(out_dtype="float32") allocates a float32 CuPy out; a CuPy fp32 out works as a
    torch one; both round to the BF16 output."""
    cupy = cupy_module()
    case = make_case(rng, [777, 64, 0], num_heads=16, q_len=2)
    cache = make_cache(case)
    q_dev, bt_dev, sl_dev = device_inputs(case, "cupy")
    plan = make_plan(case, sl_dev)
    want, _ = snapmla.decode(cache, 0, q_dev, bt_dev, sl_dev, plan, softmax_scale=SM_SCALE)
    got, _ = snapmla.decode(
        cache, 0, q_dev, bt_dev, sl_dev, plan, softmax_scale=SM_SCALE, out_dtype="float32"
    )
    given = nan_cupy((3, 2, 16, 512), np.float32)
    snapmla.decode(cache, 0, q_dev, bt_dev, sl_dev, plan, softmax_scale=SM_SCALE, out=given)
    synchronize()
    assert got.dtype == cupy.float32 and tuple(got.shape) == (3, 2, 16, 512)
    assert_rounds_to(got, want, "allocated fp32 out")
    assert_rounds_to(given, want, "CuPy fp32 out")
