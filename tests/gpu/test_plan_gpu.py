"""The split-KV plan, word for word against a model of cpp/decode/plan.cu, and decodes in the
regime where the plan aligns requests to parts (the aligned cost line).

The plan is int32 words (cpp/decode/decode.h, PlanHeader and PlanLayout): the header (what
the plan was built for, then the part cost T), the cost line's prefix [b + 1], blocks per
request [b], each request's first and last part [b], and each part's first and last request
[num_parts]. The kernels read it only through these words, so a plan equal to the model's is
the schedule the model describes.

Then plans that do not fit the call: one reused after a request's seqlen changed its block
count (NaN rows for that request only; a change within the block count is attended as it is
now), and one built for another config than the workspace and the call (every row NaN, nothing
written past the workspace).
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import pytest
from _util import (
    FAST_LSE_ATOL,
    FAST_OUT_RTOL,
    REF_LSE_ATOL,
    REF_OUT_RTOL,
    assert_all_nan,
    c_decode_args,
    check_decode,
    device_inputs,
    make_cache,
    make_case,
    make_plan,
    nan_torch,
    run_decode,
    synchronize,
    to_numpy,
    to_torch,
    torch_module,
)

MAGIC = 0x4D4C4131
HEADER_WORDS = 9  # PlanShape (magic .. q_terms), then the part cost T
T_WORD = 8
FIXED_COST = 2  # decode::kFixedCost
MIN_PART_COST = 2  # decode::kMinPartCost, with the default split count
QQ_WARPS = 8  # kQuantizeQWarps: the Q-quant kernel's rows (warps) a CTA
QQ_BLOCKS_PER_SM = 8  # kQuantizeQBlocksPerSm
BLOCK_N = 64
TILE_ROWS = 64
KERNELS = ("fast", "reference")

pytestmark = pytest.mark.gpu


def aligned_stride(batch: int, num_parts: int, min_part_cost: int, max_cost: int, t: int):
    """(stride, T) of the aligned cost line, or (0, t) for the plain one (plan.cu)."""
    if max_cost <= 0:
        return 0, t
    k0 = -(-max_cost // t)
    for k in range(k0, max(k0 - 2, 0), -1):
        t_k = max(-(-max_cost // k), min_part_cost)
        if batch * k <= num_parts and t_k * 8 <= t * 9 and batch * k * t_k < 2**31 - 1:
            return k * t_k, t_k
    return 0, t


def free_parts_model(batch: int, q_len: int, num_heads: int, num_parts: int, sm_count: int,
                     explicit_parts: bool) -> int:
    """The parts whose CTAs find an SM the Q-quant kernel leaves free (the C API's free_parts_of):
    with the default part count and one row tile a request, all but the Q-quant kernel's CTAs
    (no width fuses the Q by default, so a Q-quant kernel runs before every seesaw launch)."""
    if explicit_parts or math.ceil(q_len * num_heads / TILE_ROWS) != 1:
        return num_parts
    held = min(-(-batch * q_len * num_heads // QQ_WARPS), sm_count * QQ_BLOCKS_PER_SM)
    return num_parts - held if held < num_parts else num_parts


def usable_parts(total: int, num_parts: int, free_parts: int, min_part_cost: int) -> int:
    """plan.cu usable_parts: free_parts where the parts are short (at
    most 4 units) and that costs each part at most two units more."""
    if free_parts <= 0 or free_parts >= num_parts:
        return num_parts
    t_all = max(-(-total // num_parts), min_part_cost)
    t_free = max(-(-total // free_parts), min_part_cost)
    return free_parts if t_all <= 4 and t_free <= t_all + 2 else num_parts


def plan_model(seqlens, q_len: int, num_heads: int, max_pages: int, num_parts: int,
               min_part_cost: int, free_parts: int | None = None, q_terms: int = 1) -> np.ndarray:
    """The plan's int32 words for these sequence lengths (free_parts: None = num_parts;
    q_terms 2: a plan for the two-term query)."""
    batch = len(seqlens)
    nblocks = [
        -1 if n < 0 or n > max_pages * BLOCK_N else -(-n // BLOCK_N) for n in map(int, seqlens)
    ]
    costs = [max(nb, 0) + FIXED_COST for nb in nblocks]
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    total = prefix[-1]
    usable = usable_parts(total, num_parts, num_parts if free_parts is None else free_parts,
                          min_part_cost)
    t = max(-(-total // usable), min_part_cost)
    stride, t = aligned_stride(batch, usable, min_part_cost, max(costs, default=0), t)
    if stride:
        prefix = [b * stride for b in range(batch + 1)]
        total = prefix[-1]
    header = [MAGIC, batch, num_parts, math.ceil(q_len * num_heads / TILE_ROWS), q_len,
              num_heads, max_pages, q_terms, t]

    def last_le(value: int) -> int:  # the last index of prefix[0..batch] <= value
        return bisect.bisect_right(prefix, value) - 1

    part_begin, part_end = [], []
    for p in range(num_parts):
        c0 = p * t
        if c0 >= total:
            part_begin.append(batch)
            part_end.append(batch - 1)
        else:
            part_begin.append(last_le(c0))
            part_end.append(last_le(min(c0 + t, total) - 1))
    first, last = [], []
    for b, nb in enumerate(nblocks):
        first.append((prefix[b] + FIXED_COST if nb > 0 else prefix[b]) // t)
        last.append((prefix[b] + FIXED_COST + nb - 1 if nb > 0 else prefix[b]) // t)
    return np.array(header + prefix + nblocks + first + last + part_begin + part_end, np.int32)


def device_plan(seqlens, q_len: int, num_heads: int, max_pages: int, num_sm_parts: int,
                q_precision: int = 0):
    """(the plan's words as snapmla_decode_plan writes them, the part count it used)."""
    from snapmla import _lib

    torch = torch_module()
    lib, ffi = _lib.lib(), _lib.ffi
    config = ffi.new(
        "snapmla_decode_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_decode_config_t"),
            "batch_size": len(seqlens),
            "q_len": q_len,
            "num_heads": num_heads,
            "max_pages": max_pages,
            "num_sm_parts": num_sm_parts,
            "q_precision": q_precision,
        },
    )
    plan_bytes, ws_bytes = ffi.new("size_t*"), ffi.new("size_t*")
    assert lib.snapmla_decode_buffer_sizes(config, plan_bytes, ws_bytes) == 0
    config.plan_bytes = plan_bytes[0]
    plan = torch.full((plan_bytes[0] // 4,), -7, dtype=torch.int32, device="cuda")
    sl = to_torch(np.asarray(seqlens, np.int32))
    assert (
        lib.snapmla_decode_plan(
            config,
            ffi.cast("const int32_t*", sl.data_ptr()),
            ffi.cast("void*", plan.data_ptr()),
            ffi.NULL,
        )
        == 0
    ), ffi.string(lib.snapmla_last_error()).decode()
    synchronize()
    words = plan.cpu().numpy()
    return words, int(words[2])


def _sm_count() -> int:
    return torch_module().cuda.get_device_properties(0).multi_processor_count


# (lengths, q_len, heads, max_pages, num_sm_parts): uniform batches the aligned line takes
# (k = 1 and k > 1), mixed ones it leaves plain, empty and invalid lengths, explicit part counts.
CASES = [
    ([4096] * 64, 1, 128, 64, 0),  # cost 66 > T = 64: one part a request, no splits
    ([16384] * 32, 1, 128, 256, 0),  # two parts a request
    ([4096] * 8, 1, 128, 64, 0),  # eight parts a request
    ([16384] * 128, 1, 16, 256, 0),
    ([8192] * 128, 4, 16, 128, 0),
    ([1024] * 64, 1, 128, 16, 0),  # already aligned: the same line either way
    ([1024], 1, 128, 16, 0),
    ([0] * 5, 1, 16, 4, 0),
    ([5000, 100, 20000, 7, 0, 64, 65, 63], 1, 128, 400, 0),  # mixed: plain
    ([256, 192, 256, 128], 1, 16, 4, 4),  # padded with explicit parts (T = 6, k = 1)
    ([300, -1, 300, 99999], 2, 64, 8, 0),  # invalid lengths cost their fixed cost
    ([700] * 40, 1, 16, 16, 7),
    ([700] * 40, 1, 16, 16, 264),
    ([4096] * 8, 1, 16, 64, 0),  # 16 Q-quant CTAs: 5 blocks a part (112 with work), not 4 over 132
    ([8192], 1, 16, 128, 0),  # 2 Q-quant CTAs
    ([4096] * 16, 1, 16, 64, 0),  # 32 Q-quant CTAs, parts of 9 blocks (over 4): all parts
    ([4096] * 64, 1, 16, 64, 0),  # 128 Q-quant CTAs: all parts
    ([4096] * 8, 1, 32, 64, 0),
    ([4096] * 8, 2, 16, 64, 0),
]


@pytest.mark.parametrize("lens, q_len, h, max_pages, parts", CASES)
def test_plan_words_match_the_model(lens, q_len: int, h: int, max_pages: int, parts: int) -> None:
    words, num_parts = device_plan(lens, q_len, h, max_pages, parts)
    row_tiles = math.ceil(q_len * h / TILE_ROWS)
    assert num_parts == (parts or max(_sm_count() // row_tiles, 1))
    free = free_parts_model(len(lens), q_len, h, num_parts, _sm_count(), parts > 0)
    want = plan_model(lens, q_len, h, max_pages, num_parts, 1 if parts else MIN_PART_COST, free)
    n = len(want)
    assert (words[:n] == want).all(), (
        f"plan words differ at {np.flatnonzero(words[:n] != want)[:10].tolist()}: "
        f"got {words[:n][:16].tolist()}..., want {want[:16].tolist()}..."
    )


def test_plan_random_batches_match_the_model(rng: np.random.Generator) -> None:
    for _ in range(40):
        batch = int(rng.integers(1, 300))
        max_pages = int(rng.integers(1, 600))
        if rng.random() < 0.5:  # near-uniform batches, where the aligned line applies
            base = int(rng.integers(0, max_pages * BLOCK_N + 1))
            lens = np.clip(base - rng.integers(0, 200, batch), 0, None)
        else:
            lens = rng.integers(0, max_pages * BLOCK_N + 1, batch)
        h = int(rng.choice([16, 32, 64, 128]))
        q_len = int(rng.choice([1, 2]))
        parts = int(rng.choice([0, 0, 1, 5, 300]))
        words, num_parts = device_plan(lens.tolist(), q_len, h, max_pages, parts)
        free = free_parts_model(batch, q_len, h, num_parts, _sm_count(), parts > 0)
        want = plan_model(lens.tolist(), q_len, h, max_pages, num_parts,
                          1 if parts else MIN_PART_COST, free)
        assert (words[: len(want)] == want).all(), (batch, max_pages, h, q_len, parts)


def test_uniform_batch_is_not_split() -> None:
    """64 requests of 4k at 128 heads: each request in a part of its own (no partials)."""
    lens = [4096] * 64
    words, num_parts = device_plan(lens, 1, 128, 64, 0)
    if num_parts < 64:
        pytest.skip(f"{num_parts} parts: fewer than the batch")
    b = len(lens)
    first = words[HEADER_WORDS + 2 * b + 1 : HEADER_WORDS + 3 * b + 1]
    last = words[HEADER_WORDS + 3 * b + 1 : HEADER_WORDS + 4 * b + 1]
    assert (first == last).all() and len(set(first.tolist())) == b


@pytest.mark.parametrize(
    "lens, h, parts",
    [
        # each padded (the aligned line differs from the plain one), on a 132-SM H200
        ([256, 192, 256, 128], 16, 4),  # one part a request (k = 1), explicit part count
        ([1000, 960, 1024, 900] * 32, 16, 0),  # 128 requests, one part each (T 17 -> 18)
        ([130] * 16, 16, 0),  # three parts a request, the first holding only the fixed cost
        ([2000, 1990, 1900, 2048], 128, 0),  # 16 parts a request, two row tiles
        ([900, 1000, 1024, 960] * 8, 64, 0),
    ],
)
def test_decode_on_aligned_plans(rng: np.random.Generator, lens, h: int, parts: int) -> None:
    case = make_case(rng, lens, num_heads=h, q_len=1)
    cache = make_cache(case)
    want = case.reference()
    for kernel in KERNELS:
        out, lse = run_decode(cache, case, kernel=kernel, num_sm_parts=parts)
        tol = (
            {"rtol": FAST_OUT_RTOL, "lse_atol": FAST_LSE_ATOL}
            if kernel == "fast"
            else {"rtol": REF_OUT_RTOL, "lse_atol": REF_LSE_ATOL}
        )
        check_decode(out, lse, *want, **tol, label=f"lens={lens[:4]} h={h} parts={parts} {kernel}")


def test_aligned_and_plain_lines_agree_on_the_example() -> None:
    """The model's own check of the rule (CPU arithmetic): 64 x 4k at 128 heads over 66 parts
    takes one part a request at T = 66; a mixed batch keeps the plain line."""
    words = plan_model([4096] * 64, 1, 128, 64, 66, MIN_PART_COST)
    assert words[T_WORD] == 66
    assert words[HEADER_WORDS:HEADER_WORDS + 65].tolist() == [66 * b for b in range(65)]
    mixed = [5000, 100, 20000, 7]
    words = plan_model(mixed, 1, 128, 400, 66, MIN_PART_COST)
    costs = [-(-n // 64) + 2 for n in mixed]
    assert words[HEADER_WORDS:HEADER_WORDS + 5].tolist() == [0] + np.cumsum(costs).tolist()


def test_parts_leave_the_q_quant_kernels_sms_free() -> None:
    """The rule on 132 SMs (CPU arithmetic, an H200's count): 8 x 4k at 16 heads,
    16 Q-quant CTAs: T = 5 over the first 116 parts (the aligned line: 14 parts a request, 112
    with work), not T = 4 over all 132; at 32 heads (32 CTAs) T = 6 over 100; where the parts
    are longer (4 x 16k at 16 heads, T = 8) all parts stay usable."""
    free = free_parts_model(8, 1, 16, 132, 132, False)
    assert free == 116
    words = plan_model([4096] * 8, 1, 16, 64, 132, MIN_PART_COST, free)
    b, parts = 8, 132
    part_begin = words[HEADER_WORDS + 4 * b + 1 : HEADER_WORDS + 4 * b + 1 + parts]
    assert words[T_WORD] == 5 and (part_begin[112:] == b).all() and (part_begin[:112] < b).all()
    assert plan_model([4096] * 8, 1, 16, 64, 132, MIN_PART_COST)[T_WORD] == 4  # the rule off
    free = free_parts_model(8, 1, 32, 132, 132, False)
    words = plan_model([4096] * 8, 1, 32, 64, 132, MIN_PART_COST, free)
    part_begin = words[HEADER_WORDS + 4 * b + 1 : HEADER_WORDS + 4 * b + 1 + parts]
    assert free == 100 and words[T_WORD] == 6 and (part_begin[100:] == b).all()
    assert free_parts_model(8, 1, 16, 132, 132, True) == 132  # an explicit part count
    assert free_parts_model(8, 1, 128, 66, 132, False) == 66  # two row tiles
    free = free_parts_model(4, 1, 16, 132, 132, False)
    rule = plan_model([16384] * 4, 1, 16, 256, 132, MIN_PART_COST, free)
    assert free == 124 and (rule == plan_model([16384] * 4, 1, 16, 256, 132, MIN_PART_COST)).all()


def test_two_term_plan_records_its_precision() -> None:
    """A plan for the two-term query says so in its header (q_terms 2): its workspace holds the
    low rows past the one-term layout, and a call of the other precision must not follow it."""
    lens = [700, 64, 0, 65]
    for q_precision in (0, 1):
        words, num_parts = device_plan(lens, 1, 16, 16, 6, q_precision)
        want = plan_model(lens, 1, 16, 16, num_parts, 1, q_terms=1 + q_precision)
        assert (words[: len(want)] == want).all(), (q_precision, words[:HEADER_WORDS].tolist())


# ------------------------------------------------------------------ plans that do not fit


def _tolerances(kernel: str) -> dict[str, float]:
    if kernel == "fast":
        return {"rtol": FAST_OUT_RTOL, "lse_atol": FAST_LSE_ATOL}
    return {"rtol": REF_OUT_RTOL, "lse_atol": REF_LSE_ATOL}


def _nan_rows_for(want_out: np.ndarray, want_lse: np.ndarray, requests: list[int]):
    """The reference with ``requests``' rows NaN: what a call refusing them gives."""
    out, lse = want_out.copy(), want_lse.copy()
    out[requests] = np.nan
    lse[requests] = np.nan
    return out, lse


# (request 0's seqlen when planned, when decoded, q_len, num_sm_parts): the plan's block count
# ceil(seqlen / 64) against the seqlen's. Few parts split the long requests across parts (the
# combine's path), 0 the default.
STALE = [
    (64, 65, 1, 0),  # one block -> two: token 64 would be left out
    (128, 129, 1, 0),
    (65, 64, 1, 0),  # two -> one: a shrunk context (block 1 is past the seqlen)
    (0, 1, 1, 0),  # empty -> one block
    (1000, 1090, 2, 0),  # 16 -> 18 blocks, MTP: the seqlen counts the s_q new tokens
    (64 * 20, 64 * 20 + 1, 1, 3),  # a request split over parts: the combine leaves it NaN
    (64 * 20, 64 * 20 + 1, 2, 3),
]
# Seqlens whose block count stays: the plan holds them, the seqlen masks (63 -> 64 too: both
# are one block).
SAME_BLOCKS = [(60, 62, 1, 0), (63, 64, 1, 0), (1000, 1024, 2, 0), (64 * 20 - 5, 64 * 20, 1, 3)]


@pytest.mark.parametrize("planned, decoded, q_len, parts", STALE)
@pytest.mark.parametrize("kernel", KERNELS)
def test_stale_plan_gives_nan_rows_to_the_request_that_changed_blocks(
    rng: np.random.Generator, kernel: str, planned: int, decoded: int, q_len: int, parts: int
) -> None:
    """A plan reused after request 0's seqlen changed its block count: request 0's rows (out
    and lse) are NaN, as for an invalid seqlen; the other requests, whose seqlens the plan still
    fits, are correct (split or not)."""
    lens = [decoded, 64 * 20 + 7, 300, 64]
    case = make_case(rng, lens, num_heads=16, q_len=q_len)
    cache = make_cache(case)
    stale_seqlens = to_torch(np.array([planned, *lens[1:]], np.int32))
    plan = make_plan(case, stale_seqlens, parts)
    out, lse = run_decode(cache, case, kernel=kernel, plan=plan)
    want = _nan_rows_for(*case.reference(), [0])
    check_decode(out, lse, *want, **_tolerances(kernel), label=f"{planned}->{decoded} {kernel}")
    # Re-planned for the seqlens as they are: every request served.
    plan.update(to_torch(case.seqlens))
    out, lse = run_decode(cache, case, kernel=kernel, plan=plan)
    check_decode(out, lse, *case.reference(), **_tolerances(kernel), label=f"replanned {kernel}")


@pytest.mark.parametrize("planned, decoded, q_len, parts", SAME_BLOCKS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_plan_reused_within_the_block_count_attends_the_new_tokens(
    rng: np.random.Generator, kernel: str, planned: int, decoded: int, q_len: int, parts: int
) -> None:
    """A seqlen that grew within its block count: the plan's blocks hold the new tokens, and
    the call attends them (the result is the reference at the new seqlens, which differs from
    the one at the planned seqlens)."""
    lens = [decoded, 64 * 20 + 7, 300]
    case = make_case(rng, lens, num_heads=16, q_len=q_len)
    cache = make_cache(case)
    plan = make_plan(case, to_torch(np.array([planned, *lens[1:]], np.int32)), parts)
    out, lse = run_decode(cache, case, kernel=kernel, plan=plan)
    want = case.reference()
    check_decode(out, lse, *want, **_tolerances(kernel), label=f"{planned}->{decoded} {kernel}")
    old = case.reference(seqlens=np.array([planned, *lens[1:]], np.int32))
    assert not np.allclose(want[1][0], old[1][0]), "the new tokens change request 0's lse"


def _c_config(ffi: object, case, q_precision: int, parts: int, **sizes: int):
    return ffi.new(
        "snapmla_decode_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_decode_config_t"),
            "batch_size": case.batch,
            "q_len": case.q.shape[1],
            "num_heads": case.q.shape[2],
            "max_pages": case.max_pages,
            "num_sm_parts": parts,
            "q_precision": q_precision,
            **sizes,
        },
    )


# (what, the config of the plan and the buffers, the call's): precision, part count, heads.
MIXED = [
    ("fp8-plan-fp8x2-call", {"q_precision": 0}, {"q_precision": 1}),
    ("fp8x2-plan-fp8-call", {"q_precision": 1}, {"q_precision": 0}),
    ("parts-4-plan-parts-9-call", {"parts": 4}, {"parts": 9}),
    ("parts-4-fp8-plan-parts-9-fp8x2-call", {"parts": 4}, {"parts": 9, "q_precision": 1}),
]


@pytest.mark.parametrize("what, made, called", MIXED, ids=[m[0] for m in MIXED])
@pytest.mark.parametrize("kernel", (0, 1))  # AUTO (the fast kernel here), REFERENCE
def test_plan_of_another_config_writes_nan_rows_and_nothing_past_the_workspace(
    rng: np.random.Generator, what: str, made: dict, called: dict, kernel: int
) -> None:
    """Plan and workspace made for one config, the call for another (a C caller that does not
    say the buffers' sizes): every row NaN, and not a byte written past the workspace (the
    Q-quant kernel checks the plan's header before it stores; the two-term query's low rows
    would land past a one-term workspace). Saying the sizes (config.plan_bytes and
    workspace_bytes) gets a refusal naming the buffer instead, nothing enqueued."""
    from snapmla import _lib

    torch = torch_module()
    lib, ffi = _lib.lib(), _lib.ffi
    case = make_case(rng, [300, 64 * 9 + 1], num_heads=16, q_len=1)
    cache = make_cache(case)
    q, bt, sl = device_inputs(case)
    made = {"q_precision": 0, "parts": 4, **made}
    called = {"q_precision": 0, "parts": 4, **called}
    config = _c_config(ffi, case, made["q_precision"], made["parts"])
    sizes = ffi.new("size_t[2]")
    assert lib.snapmla_decode_buffer_sizes(config, sizes, sizes + 1) == 0
    # Each buffer inside a larger allocation: the call's own spans stay allocated (the kernels
    # load a plan's words with its header, before they compare it), and the bytes past each
    # buffer show what was written.
    guard = 4 << 20
    plan_region = torch.zeros(sizes[0] + guard, dtype=torch.uint8, device="cuda")
    plan = plan_region[: sizes[0]]
    region = torch.full((sizes[1] + guard,), 0xA5, dtype=torch.uint8, device="cuda")
    assert lib.snapmla_decode_plan(
        config, ffi.cast("const int32_t*", sl.data_ptr()), ffi.cast("void*", plan.data_ptr()),
        ffi.NULL,
    ) == 0  # fmt: skip
    out = nan_torch((2, 1, 16, 512))
    lse = nan_torch((2, 16, 1), "float32")
    args = c_decode_args(q, bt, sl, out, lse, kernel)
    plan_ptr, ws_ptr = ffi.cast("void*", plan.data_ptr()), ffi.cast("void*", region.data_ptr())
    call = _c_config(ffi, case, called["q_precision"], called["parts"])
    # The call's own sizes (its workspace, the span the library checks) lie inside the region.
    need = ffi.new("size_t[2]")
    assert lib.snapmla_decode_buffer_sizes(call, need, need + 1) == 0
    assert need[1] <= sizes[1] + guard and need[0] <= sizes[0] + guard
    handle = cache._handle  # the C handle of the KVCache (private, test only)
    status = lib.snapmla_decode(handle, call, args, plan_ptr, ws_ptr, ffi.NULL)
    assert status == 0, ffi.string(lib.snapmla_last_error()).decode()
    synchronize()
    assert_all_nan(out, f"{what}: out")
    assert_all_nan(lse, f"{what}: lse")
    # Not a byte of the region: the Q-quant kernel wrote nothing (not even inside the
    # workspace), the attention kernel and the combine no partials.
    written = int((to_numpy(region) != 0xA5).sum())
    assert written == 0, f"{what}: {written} workspace bytes written"
    # With the buffers' sizes said: refused where a buffer is too small, nothing enqueued.
    said = _c_config(ffi, case, called["q_precision"], called["parts"],
                     plan_bytes=sizes[0], workspace_bytes=sizes[1])  # fmt: skip
    short = [n for n, given, want in (("plan", sizes[0], need[0]), ("workspace", sizes[1], need[1]))
             if given < want]  # fmt: skip
    out.fill_(float("nan"))
    status = lib.snapmla_decode(handle, said, args, plan_ptr, ws_ptr, ffi.NULL)
    message = ffi.string(lib.snapmla_last_error()).decode()
    if short:
        assert status == 1 and f"argument '{short[0]}'" in message, message
        synchronize()
        assert_all_nan(out, f"{what}: out after the refused call")
    else:  # buffers large enough: the header check alone (NaN rows)
        assert status == 0, message
        synchronize()
        assert_all_nan(out, f"{what}: out with the sizes said")
    assert int((to_numpy(region) != 0xA5).sum()) == 0
