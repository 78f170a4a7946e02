"""snapmla.quantize_q against reference.quantize_q: bit-exact, for any head count and strides."""

from __future__ import annotations

import numpy as np
import pytest
from _util import (
    BF16,
    FP8,
    download,
    nan_torch,
    random_bf16,
    synchronize,
    to_device,
    to_numpy,
    to_torch,
)

import snapmla
from snapmla import reference as ref

pytestmark = pytest.mark.gpu


def _check_exact(got: tuple, q: np.ndarray, label: str) -> None:
    """Outputs equal the reference bit for bit (NaN positions compared as NaN)."""
    want8, want_r, want_s = ref.quantize_q(q)
    got8 = to_numpy(got[0], FP8)
    got_r = to_numpy(got[1], BF16)
    got_s = to_numpy(got[2], np.float32)
    assert got8.shape == want8.shape and got_r.shape == want_r.shape, label
    assert got_s.shape == want_s.shape, label
    nan8 = np.isnan(want8.astype(np.float32))
    assert np.array_equal(np.isnan(got8.astype(np.float32)), nan8), f"{label}: content NaNs"
    diff = got8.view(np.uint8)[~nan8] != want8.view(np.uint8)[~nan8]
    assert not diff.any(), f"{label}: {int(diff.sum())} content bytes differ"
    nan_r = np.isnan(want_r.astype(np.float32))
    assert np.array_equal(np.isnan(got_r.astype(np.float32)), nan_r), f"{label}: rope NaNs"
    diff = got_r.view(np.uint16)[~nan_r] != want_r.view(np.uint16)[~nan_r]
    assert not diff.any(), f"{label}: {int(diff.sum())} rope values differ"
    nan_s = np.isnan(want_s)
    assert np.array_equal(np.isnan(got_s), nan_s), f"{label}: scale NaNs"
    diff = got_s.view(np.uint32)[~nan_s] != want_s.view(np.uint32)[~nan_s]
    assert not diff.any(), f"{label}: {int(diff.sum())} scales differ"


@pytest.mark.parametrize(
    ("n", "h"), [(1, 1), (7, 1), (3, 24), (64, 24), (5, 128), (33, 128), (2, 16), (1, 1024)]
)
def test_quantize_q_bit_exact(rng: np.random.Generator, n: int, h: int) -> None:
    q = random_bf16(rng, (n, h, 576), std=1.0, spread=10.0)
    q[0, 0, :512] = 0  # amax 0: scale 2^-32
    if n > 1:
        q[1, h - 1, :512] = np.float32(2.0**-100)  # floor
    # Raw uint8 FP8 bytes (torch may not export float8 through DLPack); 0x7F is FP8 NaN.
    q8 = to_torch(np.full((n, h, 512), 0x7F, np.uint8))
    qr, qs = nan_torch((n, h, 64)), nan_torch((n, h), "float32")
    got = snapmla.quantize_q(to_torch(q), out=(q8, qr, qs))
    assert got[0] is q8 and got[1] is qr and got[2] is qs
    synchronize()
    _check_exact(got, q, f"quantize_q n={n} h={h}")


@pytest.mark.parametrize("framework", ["torch", "cupy", "jax"])
def test_quantize_q_allocated_outputs(rng: np.random.Generator, framework: str) -> None:
    q = random_bf16(rng, (2, 3, 16, 576), spread=4.0)  # [b, s_q, h, 576]: leading dims flatten
    got = snapmla.quantize_q(to_device(q, framework))
    synchronize()
    assert tuple(got[0].shape) == (2, 3, 16, 512) and tuple(got[2].shape) == (2, 3, 16)
    _check_exact(got, q, f"quantize_q ({framework})")


@pytest.mark.parametrize("layout", ["head_slice", "padded_rows", "token_slice", "4d_slice"])
def test_quantize_q_strided(rng: np.random.Generator, layout: str) -> None:
    """q as a view of a bigger tensor: head, token and padding strides."""
    if layout == "head_slice":  # every other head of [n, 2h, 576]
        big = random_bf16(rng, (9, 48, 576), spread=4.0)
        q_dev, q = to_torch(big)[:, ::2], big[:, ::2]
    elif layout == "padded_rows":  # rows of 640 with 576 used, offset 32
        big = random_bf16(rng, (9, 24, 640), spread=4.0)
        q_dev, q = to_torch(big)[:, :, 32:608], big[:, :, 32:608]
    elif layout == "token_slice":  # every third token, heads transposed from [h, n, 576]
        big = random_bf16(rng, (128, 12, 576), spread=4.0)
        q_dev, q = to_torch(big).transpose(0, 1)[::3], big.transpose(1, 0, 2)[::3]
    else:  # [b, s_q, h, 576] sliced out of [b, s_q, h + 8, 600]
        big = random_bf16(rng, (3, 2, 24, 600), spread=4.0)
        q_dev, q = to_torch(big)[:, :, 4:20, 10:586], big[:, :, 4:20, 10:586]
    assert not q_dev.is_contiguous() and q_dev.stride(-1) == 1
    got = snapmla.quantize_q(q_dev)
    synchronize()
    _check_exact(got, np.ascontiguousarray(q), f"quantize_q ({layout})")


def test_quantize_q_nan_row_stays_in_its_row(rng: np.random.Generator) -> None:
    q = random_bf16(rng, (4, 8, 576))
    q[2, 3, 100] = np.nan
    q[1, 5, 540] = np.nan  # in q_pe: only that rope element
    got = snapmla.quantize_q(to_torch(q))
    synchronize()
    _check_exact(got, q, "quantize_q with NaN")
    scale = to_numpy(got[2], np.float32)
    assert np.isnan(scale[2, 3]) and np.isfinite(np.delete(scale.ravel(), 2 * 8 + 3)).all()


def test_quantize_q_zero_tokens() -> None:
    q = to_torch(np.zeros((0, 4, 576), np.float32).astype(BF16))
    got = snapmla.quantize_q(q)
    assert tuple(got[0].shape) == (0, 4, 512) and tuple(got[1].shape) == (0, 4, 64)
    assert tuple(got[2].shape) == (0, 4)


def _same_bits(got: np.ndarray, want: np.ndarray, view: type, label: str) -> None:
    """``got`` equals ``want`` bit for bit where ``want`` is not NaN, and NaN where it is."""
    assert got.shape == want.shape, f"{label}: shape {got.shape} vs {want.shape}"
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan), f"{label}: NaN positions"
    diff = got.view(view)[~nan] != want.view(view)[~nan]
    assert not diff.any(), f"{label}: {int(diff.sum())} values differ"


@pytest.mark.parametrize(("n", "h"), [(1, 1), (7, 1), (3, 24), (64, 24), (5, 128), (1, 1024)])
def test_quantize_q2_bit_exact(rng: np.random.Generator, n: int, h: int) -> None:
    """precision="fp8x2" (snapmla_quantize_q2) against reference.quantize_q2, bit for bit:
    the first three outputs are quantize_q's, the low row and its scale the two-term model's,
    with the edge rows: all zero (s1 floored), exactly representable (zero residual: q_lo all
    zero), tiny, huge, an infinity, a NaN, and a RoPE value that overflows its quotient (the
    row's quotients, high and low term alike, by the IEEE division)."""
    q = random_bf16(rng, (n, h, 576), std=1.0, spread=10.0)
    rows = q.reshape(n * h, 576)
    edges = [
        np.zeros(512, np.float32),
        np.tile(np.float32([1.0, -0.5, 448.0, 2.0**-9]), 128),  # E4M3 values x s1 = 1
        np.full(512, 2.0**-100, np.float32),
        np.full(512, 3.0e38, np.float32),
        np.where(np.arange(512) == 7, np.inf, 1.0).astype(np.float32),
        np.where(np.arange(512) == 300, np.nan, 1.0).astype(np.float32),
        np.linspace(-1.0, 1.0, 512, dtype=np.float32),  # + q_pe[0] = 3e38 below
    ]
    for i, edge in enumerate(edges[: len(rows)]):
        rows[i, :512] = edge.astype(BF16)
    if len(rows) >= len(edges):
        rows[len(edges) - 1, 512] = np.float32(3e38).astype(BF16)  # / s1 = 1/448: inf
    q = rows.reshape(n, h, 576)
    outs = (
        to_torch(np.full((n, h, 512), 0x7F, np.uint8)),
        nan_torch((n, h, 64)),
        nan_torch((n, h), "float32"),
        to_torch(np.full((n, h, 512), 0x7F, np.uint8)),
        nan_torch((n, h), "float32"),
    )
    got = snapmla.quantize_q(to_torch(q), out=outs, precision="fp8x2")
    assert len(got) == 5 and all(g is o for g, o in zip(got, outs))
    synchronize()
    want = ref.quantize_q2(q)
    label = f"quantize_q2 n={n} h={h}"
    _same_bits(to_numpy(got[0], FP8), want[0], np.uint8, f"{label} q_content")
    _same_bits(to_numpy(got[1], BF16), want[1], np.uint16, f"{label} q_rope")
    _same_bits(to_numpy(got[2], np.float32), want[2], np.uint32, f"{label} q_scale")
    _same_bits(to_numpy(got[3], FP8), want[3], np.uint8, f"{label} q_lo")
    _same_bits(to_numpy(got[4], np.float32), want[4], np.uint32, f"{label} q_lo_scale")
    # The point of it: the kernel's two rows rebuild q_nope to about 2^-8 relative (finite rows).
    s1 = to_numpy(got[2], np.float32)[..., None].astype(np.float64)
    s2 = to_numpy(got[4], np.float32)[..., None].astype(np.float64)
    hi, lo = to_numpy(got[0], FP8).astype(np.float64), to_numpy(got[3], FP8).astype(np.float64)
    rebuilt = s1 * hi + s2 * lo
    qn = q[..., :512].astype(np.float64)
    bound = 1.0001 * (2.0**-8 * np.abs(qn) + 2.0**-14 * s1 + 2.0**-10 * s2)
    finite = np.isfinite(rebuilt) & np.isfinite(qn)
    assert np.all(np.abs(rebuilt - qn)[finite] <= bound[finite]), label


def test_quantize_q2_allocates_and_matches_one_term(rng: np.random.Generator) -> None:
    q = to_torch(random_bf16(rng, (2, 3, 16, 576), spread=4.0))
    one = snapmla.quantize_q(q)
    two = snapmla.quantize_q(q, precision="fp8x2")
    synchronize()
    assert len(one) == 3 and len(two) == 5
    assert tuple(two[3].shape) == (2, 3, 16, 512) and tuple(two[4].shape) == (2, 3, 16)
    for a, b in zip(one, two):
        assert np.array_equal(to_numpy(a).view(np.uint8), to_numpy(b).view(np.uint8))


# A -0 element quantizes to -0 (code 0x80, the contract's), not +0 (0x00): the fast divider of
# cpp/common/row_quant.cuh keeps the sign of a zero quotient.
@pytest.mark.parametrize("precision", ["fp8", "fp8x2"])
def test_quantize_q_keeps_the_sign_of_zero(rng: np.random.Generator, precision: str) -> None:
    q = random_bf16(rng, (3, 4, 576), std=1.0, spread=4.0)
    q[:, :, ::7] = np.float32(-0.0)  # content and RoPE elements that are -0
    got = snapmla.quantize_q(to_torch(q), precision=precision)
    synchronize()
    want = ref.quantize_q2(q) if precision == "fp8x2" else ref.quantize_q(q)
    assert np.any(want[0].view(np.uint8) == 0x80)  # the model keeps -0
    _same_bits(to_numpy(got[0], FP8), want[0], np.uint8, f"{precision} q_content")
    _same_bits(to_numpy(got[1], BF16), want[1], np.uint16, f"{precision} q_rope")


def _tiny_rope_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """n rows (content, RoPE) where the fast divider of cpp/common/row_quant.cuh could misround
    a RoPE quotient: RoPE values from the BF16 subnormals up to 2^-90 in rows of content amax
    1 .. 2^100, and, in every fourth row, RoPE values of 2^-40 .. 2^-5 in a row of content amax
    ~2^120, whose quotients are fp32 subnormals (below 2^-126)."""
    rows = np.empty((n, 576), np.float32)
    amax_exp = rng.choice([0.0, 7.0, 20.0, 60.0, 100.0], n)
    amax_exp[::4] = 120.0
    rows[:, :512] = rng.uniform(-1.0, 1.0, (n, 512)) * np.exp2(amax_exp)[:, None]
    bits = rng.integers(0, 1 << 16, (n, 64), dtype=np.uint32) & 0x807F  # sign, mantissa
    exps = rng.integers(0, 44, (n, 64), dtype=np.uint32)  # biased: 0 (subnormal) .. 2^-84
    exps[::4] = rng.integers(87, 123, exps[::4].shape, dtype=np.uint32)
    rope16 = (bits | (exps << 7)).astype(np.uint16)
    rows[:, 512:] = (rope16.astype(np.uint32) << 16).view(np.float32)
    return rows.astype(BF16)


# FastDivider's correction underflows for numerators below ~2^-100 (q_pe = 41 * 2^-133 in a
# row of content amax 128 would round to BF16 0x008F, the model's 0x0090): its checked() form
# sends such rows to the IEEE division. Query and key paths both.
@pytest.mark.parametrize("path", ["fp8", "fp8x2", "append"])
def test_tiny_rope_values_round_as_the_model(rng: np.random.Generator, path: str) -> None:
    n = 1024  # ~30 quotients the unchecked divider misrounds (exact emulation: 7-11 per 256)
    rows = _tiny_rope_rows(rng, n)
    rows[0, :512] = np.float32(128.0)
    rows[0, 512] = np.uint16(41).view(BF16)  # 41 * 2^-133, the review's case
    if path == "append":
        cache = snapmla.KVCache(1, n // 64)
        slots = np.arange(n, dtype=np.int64)
        cache.append(0, to_torch(rows[:, :512]), to_torch(rows[:, 512:]), to_torch(slots))
        got = ref.read_tokens(download(cache), n // 64, 0, slots)
        want = ref.quantize_kv(rows[:, :512], rows[:, 512:])
    else:
        q = rows.reshape(n // 16, 16, 576)
        out = snapmla.quantize_q(to_torch(q), precision=path)
        synchronize()
        want = ref.quantize_q2(q) if path == "fp8x2" else ref.quantize_q(q)
        got = tuple(to_numpy(o, d) for o, d in zip(out, (FP8, BF16, np.float32, FP8, np.float32)))
    for i, (g, w) in enumerate(zip(got, want)):
        view = {1: np.uint8, 2: np.uint16, 4: np.uint32}[np.dtype(w.dtype).itemsize]
        _same_bits(np.asarray(g).reshape(w.shape), w, view, f"{path} output {i}")
