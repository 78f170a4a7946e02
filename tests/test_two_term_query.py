"""CPU tests of the two-term FP8 query in the NumPy model (reference.quantize_q2,
decode_reference(q_terms=2)): the quantizer against its specification and error bound, its
exactness, zero, all-equal and NaN rows, and the decode model against exact attention.

These pin the model-side specification; the GPU tests hold the Q-quant kernel to it bit for
bit (tests/gpu/test_quantize.py) and both decode kernels to the decode model.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapmla import reference as ref

FP8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
SM_SCALE = 192**-0.5
F32 = np.float32


def _bf16(rng: np.random.Generator, shape: tuple[int, ...], std: float = 0.5) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * std).astype(BF16)


def _codes(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).view(np.uint8)


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float32).astype(np.float64)


def _parts(q: np.ndarray):
    """quantize_q2's outputs and q_nope as float64 values (exact): (q_nope, q_hi, s1, q_lo,
    s2), the scales shaped to broadcast over a row."""
    q_hi, _, s1, q_lo, s2 = ref.quantize_q2(q)
    qn = _f64(q[..., :512])
    s1d, s2d = s1.astype(np.float64)[..., None], s2.astype(np.float64)[..., None]
    return qn, _f64(q_hi), s1d, _f64(q_lo), s2d


def _check_spec(q: np.ndarray) -> None:
    """quantize_q2 against the specification, written independently of its code."""
    q_hi, qr, s1, q_lo, s2 = ref.quantize_q2(q)
    h1, r1, t1 = ref.quantize_q(q)
    assert np.array_equal(_codes(q_hi), _codes(h1))  # the first term is the one-term query
    assert np.array_equal(qr.view(np.uint16), r1.view(np.uint16))
    assert np.array_equal(s1.view(np.uint32), t1.view(np.uint32))
    assert q_lo.dtype == FP8 and s2.dtype == np.float32 and q_lo.shape == q_hi.shape
    qn = q[..., :512].astype(F32)
    x = qn / s1[..., None]  # fp32 division: the quotient that q_hi rounds
    assert np.array_equal(_codes(x.astype(FP8))[np.isfinite(x)], _codes(q_hi)[np.isfinite(x)])
    want_s2 = s1 * F32(1 / 16)
    finite = np.isfinite(s1)
    assert np.array_equal(s2[finite].view(np.uint32), want_s2[finite].view(np.uint32))
    r = x - q_hi.astype(F32)  # exact (test_quotient_residual_is_exact)
    assert np.all(np.abs(r[finite]) <= 16)
    want_lo = (F32(16) * r).astype(FP8)  # |16 r| <= 256: no saturation
    assert np.array_equal(_codes(q_lo)[finite], _codes(want_lo)[finite])


def _bound(qn: np.ndarray, s1d: np.ndarray, s2d: np.ndarray) -> np.ndarray:
    """The documented per-element reconstruction bound of a finite row."""
    return 1.0001 * (2.0**-8 * np.abs(qn) + 2.0**-14 * s1d + 2.0**-10 * s2d)


# ---------------------------------------------------------------------------- the quantizer


def test_first_term_is_the_one_term_query_and_the_rest_follows_the_spec() -> None:
    rng = np.random.default_rng(20)
    q = _bf16(rng, (2, 3, 5, 576), std=2.0)
    q_hi, qr, s1, q_lo, s2 = ref.quantize_q2(q)
    assert q_hi.shape == q_lo.shape == (2, 3, 5, 512) and qr.shape == (2, 3, 5, 64)
    assert s1.shape == s2.shape == (2, 3, 5)
    _check_spec(q)
    # Raw uint16 bits are accepted like BF16.
    again = ref.quantize_q2(q.view(np.uint16))
    assert np.array_equal(_codes(again[3]), _codes(q_lo)) and np.array_equal(again[4], s2)
    with pytest.raises(ValueError):
        ref.quantize_q2(q[..., :512])


def test_quotient_residual_is_exact() -> None:
    """x - q_hi (x = q / s1 in fp32, q_hi its E4M3 rounding) is exact in fp32 (Sterbenz), also
    with saturated, subnormal-E4M3, zero and floored-scale elements, and |x - q_hi| <= 16."""
    rng = np.random.default_rng(21)
    rows = [_bf16(rng, (512,), std) for std in (1.0, 1e-3, 1e3, 1e-8)]
    spiky = _bf16(rng, (512,), 1e-4)
    spiky[3] = 200.0  # everything else lands in (or under) E4M3's subnormal range
    rows.append(spiky)
    tiny = np.zeros(512, F32)
    tiny[:40] = np.float32(2.0**-130) * np.arange(1, 41)  # BF16 subnormals, s1 at its floor
    rows.append(tiny.astype(BF16))
    q = np.zeros((len(rows), 576), BF16)
    q[:, :512] = np.stack(rows)
    q_hi, _, s1, _, _ = ref.quantize_q2(q)
    x = q[:, :512].astype(F32) / s1[:, None]
    r = x - q_hi.astype(F32)
    for i in range(len(rows)):
        for j in range(0, 512, 7):
            exact = Fraction(float(x[i, j])) - Fraction(float(q_hi[i, j].astype(F32)))
            assert Fraction(float(r[i, j])) == exact, (i, j)
    assert np.all(np.abs(r) <= 16)
    _check_spec(q)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 12),
    log_std=st.floats(-30, 30),
    spike=st.floats(0, 12),
    seed=st.integers(0, 2**31 - 1),
)
def test_reconstruction_is_about_2_to_minus_8(
    rows: int, log_std: float, spike: float, seed: int
) -> None:
    """|q - s1 q_hi - s2 q_lo| <= 1.0001 (2^-8 |q| + 2^-14 s1 + 2^-10 s2) per element, the
    spec's bound; the one-term form's error is ~16x larger on the same rows."""
    rng = np.random.default_rng(seed)
    std = float(np.exp2(log_std))
    q = _bf16(rng, (rows, 576), std)
    q[0, int(rng.integers(512))] = std * float(np.exp2(spike))  # an outlier channel
    _check_spec(q)
    qn, hi, s1d, lo, s2d = _parts(q)
    err2 = np.abs(qn - s1d * hi - s2d * lo)
    assert np.all(err2 <= _bound(qn, s1d, s2d))
    above_floor = s1d[:, 0] > 2.0**-32
    err1 = np.abs(qn - s1d * hi)
    if above_floor.any():
        e1 = np.linalg.norm(err1[above_floor])
        e2 = np.linalg.norm(err2[above_floor])
        assert e2 <= e1 / 8, (e1, e2)  # ~2^-4 per term: ~16x typical, 8x pinned
    assert np.all(s2d == s1d / 16)  # the fixed ratio, exactly


@settings(max_examples=15, deadline=None)
@given(k=st.integers(-20, 40), seed=st.integers(0, 2**31 - 1))
def test_power_of_two_scaling_scales_only_the_scales(k: int, seed: int) -> None:
    """Scale invariance: q * 2^k gives the same codes and s1 * 2^k, s2 * 2^k while s1 stays
    above its floor and the values stay normal."""
    rng = np.random.default_rng(seed)
    q = _bf16(rng, (4, 576), 1.0)
    q2 = (q.astype(F32) * F32(2.0**k)).astype(BF16)
    assert np.array_equal(q2.astype(F32), q.astype(F32) * F32(2.0**k))  # exact scaling
    a, b = ref.quantize_q2(q), ref.quantize_q2(q2)
    for i in (0, 3):  # q_hi, q_lo
        assert np.array_equal(_codes(a[i]), _codes(b[i]))
    for i in (2, 4):  # s1, s2
        assert np.array_equal(b[i], a[i] * F32(2.0**k))


def test_zero_rows() -> None:
    q = np.zeros((3, 576), F32)
    q[1, :512] = -0.0
    q[2, 512:] = 5.0  # the RoPE part does not touch the scales
    q = q.astype(BF16)
    q_hi, qr, s1, q_lo, s2 = ref.quantize_q2(q)
    assert np.all(s1 == F32(2.0**-32)) and np.all(s2 == F32(2.0**-36))  # s2 = s1 / 16
    assert np.all(_codes(q_hi[[0, 2]]) == 0x00) and np.all(_codes(q_hi[1]) == 0x80)
    assert np.all(_codes(q_lo) == 0x00)  # the residual of +-0 is +0
    assert np.array_equal(qr[2].astype(F32), np.full(64, 5.0 * 2.0**32, F32))
    assert ref.q2_ratio(s1, s2).tolist() == [2.0**-4] * 3


def test_exactly_representable_rows_have_no_low_term() -> None:
    """Rows that the first term represents exactly: residual 0, q_lo all zero (s2 = s1 / 16
    as always); then decode_reference(q_terms=2) equals the one-term model bit for bit."""
    rng = np.random.default_rng(22)
    codes = rng.integers(0, 0x7F, (2, 1, 3, 512), dtype=np.uint8)  # finite, non-negative
    codes[..., 0] = 0x7E  # the row's amax is 448 -> s1 = 1 exactly
    signs = rng.choice([0, 0x80], codes.shape).astype(np.uint8)
    content = (codes | signs).view(FP8).astype(F32)
    q = np.zeros((2, 1, 3, 576), F32)
    q[..., :512] = content * F32(2.0**-5)  # s1 = 2^-5, every value a multiple of an E4M3 one
    q[..., 512:] = rng.standard_normal((2, 1, 3, 64))
    q = q.astype(BF16)
    _, _, s1, q_lo, s2 = ref.quantize_q2(q)
    assert np.all(s1 == F32(2.0**-5)) and np.all(s2 == F32(2.0**-9))
    assert np.all(_f64(q_lo) == 0)
    kvs = [ref.quantize_kv(_bf16(rng, (n, 512)), _bf16(rng, (n, 64), 3.0)) for n in (200, 70)]
    one = ref.decode_reference(q, kvs, [200, 70], SM_SCALE, True)
    two = ref.decode_reference(q, kvs, [200, 70], SM_SCALE, True, q_terms=2)
    for a, b in zip(one, two):
        assert np.array_equal(a, b)


def test_all_equal_rows() -> None:
    """A constant row: q_hi all +-448 (the amax maps to 448), one residual for all, so q_lo's
    codes are all equal; the reconstruction is within the bound."""
    vals = [1.0, -3.14159, 1e-6, 7e20, 0.1]
    q = np.zeros((len(vals), 576), F32)
    for i, v in enumerate(vals):
        q[i, :512] = v
    q = q.astype(BF16)
    q_hi, _, _, q_lo, _ = ref.quantize_q2(q)
    _check_spec(q)
    for i in range(len(vals)):
        assert np.all(np.abs(_f64(q_hi[i])) == 448)
        assert np.unique(_codes(q_lo[i])).size == 1
    qn, hi, s1d, lo, s2d = _parts(q)
    assert np.all(np.abs(qn - s1d * hi - s2d * lo) <= _bound(qn, s1d, s2d))


def test_nan_and_inf_make_their_row_nan_only() -> None:
    rng = np.random.default_rng(23)
    q = _bf16(rng, (5, 576))
    q[1, 100] = np.nan
    q[2, 7] = np.inf
    q[3, 0] = -np.inf
    q[4, 520] = np.nan  # in the RoPE part: only qr
    q_hi, qr, s1, q_lo, s2 = ref.quantize_q2(q)
    # A NaN: both rows all NaN. An inf: s1 and s2 inf, x = q / inf is 0 (finite q) or NaN
    # (the inf itself), so both rows hold zero codes and NaN codes, NaN where q was inf; the
    # ratio s2 / s1 is NaN, which makes the row's logits NaN (the decode model, below).
    assert np.isnan(s2[1]) and np.all(_codes(q_lo[1]) == 0x7F) and np.all(_codes(q_hi[1]) == 0x7F)
    for i, j in ((2, 7), (3, 0)):
        assert np.isposinf(s2[i]) and np.isnan(ref.q2_ratio(s1[i], s2[i])), i
        hi, lo = _codes(q_hi[i]), _codes(q_lo[i])
        assert hi[j] == 0x7F and np.all(np.isin(np.delete(hi, j), [0x00, 0x80])), i
        assert lo[j] == 0x7F and np.all(np.delete(lo, j) == 0x00), i  # +-0 - +-0 = +0
    assert np.isnan(s1[1]) and np.isposinf(s1[2]) and np.isposinf(s1[3])
    for i in (0, 4):
        assert np.isfinite(s1[i]) and np.isfinite(s2[i])
        assert np.all(np.isfinite(_f64(q_lo[i]))) and np.all(np.isfinite(_f64(q_hi[i])))
    assert np.isnan(qr[4, 8].astype(F32)) and np.isfinite(qr[4, 9].astype(F32))
    # In the decode model: exactly the rows with a non-finite content are NaN (and the RoPE
    # NaN's row, as in the one-term model).
    c, k = _bf16(rng, (100, 512)), _bf16(rng, (100, 64))
    out, lse = ref.decode_reference(q.reshape(1, 1, 5, 576), [ref.quantize_kv(c, k)], [100],
                                    SM_SCALE, True, q_terms=2)
    nan_rows = np.isnan(out[0, 0]).all(axis=1)
    assert nan_rows.tolist() == [False, True, True, True, True]
    assert np.isnan(lse[0, 1:, 0]).all() and np.isfinite(lse[0, 0, 0])


# ---------------------------------------------------------------------------- the decode model


def test_default_is_the_one_term_contract() -> None:
    """q_terms defaults to 1 and gives the contract's model bit for bit; 2 differs; other
    values are refused."""
    rng = np.random.default_rng(24)
    q = _bf16(rng, (2, 2, 4, 576))
    kvs = [ref.quantize_kv(_bf16(rng, (n, 512)), _bf16(rng, (n, 64), 3.0)) for n in (300, 65)]
    for quantize_p in (True, False):
        base = ref.decode_reference(q, kvs, [300, 65], SM_SCALE, True, quantize_p=quantize_p)
        one = ref.decode_reference(q, kvs, [300, 65], SM_SCALE, True, quantize_p, q_terms=1)
        two = ref.decode_reference(q, kvs, [300, 65], SM_SCALE, True, quantize_p, q_terms=2)
        for a, b in zip(base, one):
            assert np.array_equal(a.view(np.uint64), b.view(np.uint64))
        assert not np.array_equal(base[0], two[0])
        assert ref.rel_l2(two[0], base[0]) < 0.05
    for bad in (0, 3, True + 1.5):
        with pytest.raises(ValueError):
            ref.decode_reference(q, kvs, [300, 65], SM_SCALE, True, q_terms=bad)


def _dequantized_two_term(q: np.ndarray, kvs):
    q_hi, qr, s1, q_lo, s2 = ref.quantize_q2(q)
    rho = ref.q2_ratio(s1, s2).astype(np.float64)[..., None]
    s = s1.astype(np.float64)[..., None]
    qd = np.concatenate([(_f64(q_hi) + rho * _f64(q_lo)) * s, _f64(qr) * s], axis=-1)
    cs = [_f64(c) * sc.astype(np.float64)[:, None] for c, _, sc in kvs]
    ks = [_f64(r) * sc.astype(np.float64)[:, None] for _, r, sc in kvs]
    return qd, cs, ks


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    s_q=st.integers(1, 3),
    h=st.sampled_from([1, 5]),
    lens=st.lists(st.sampled_from([0, 1, 63, 64, 65, 200]), min_size=2, max_size=2),
    causal=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_two_term_logits_are_the_dequantized_query(
    s_q: int, h: int, lens: list[int], causal: bool, seed: int
) -> None:
    """With exact P, decode_reference(q_terms=2) is exact attention of the query
    s1 * (q_hi + rho * q_lo) | s1 * qr on the dequantized cache."""
    rng = np.random.default_rng(seed)
    q = _bf16(rng, (2, s_q, h, 576), std=1.0)
    kvs = [ref.quantize_kv(_bf16(rng, (n + 3, 512)), _bf16(rng, (n + 3, 64))) for n in lens]
    out, lse = ref.decode_reference(q, kvs, lens, SM_SCALE, causal, quantize_p=False, q_terms=2)
    want, want_lse = ref.exact_attention(*_dequantized_two_term(q, kvs), lens, SM_SCALE, causal)
    assert np.array_equal(np.isinf(lse), np.isinf(want_lse))
    assert ref.rel_l2(out, want) <= 1e-12
    finite = np.isfinite(want_lse)
    assert np.abs(lse[finite] - want_lse[finite]).max(initial=0) <= 1e-12


def test_two_term_query_error_is_about_16x_smaller() -> None:
    """The query's own share of the error: against exact attention of the BF16 query on the
    same dequantized cache (exact P, so the query's rounding is the only error), the two-term
    query's relative error is ~2^-4 of the one-term's (pinned: below 1/8)."""
    rng = np.random.default_rng(25)
    n, h = 1024, 8
    kv = ref.quantize_kv(_bf16(rng, (n, 512), 1.0), _bf16(rng, (n, 64), 1.0))
    for std in (0.3, 3.0):  # near-uniform and peaked attention
        q = _bf16(rng, (1, 2, h, 576), std=std)
        _, cs, ks = _dequantized_two_term(q, [kv])
        want, _ = ref.exact_attention(q, cs, ks, [n], SM_SCALE, True)
        one, _ = ref.decode_reference(q, [kv], [n], SM_SCALE, True, quantize_p=False)
        two, _ = ref.decode_reference(q, [kv], [n], SM_SCALE, True, quantize_p=False,
                                      q_terms=2)
        e1, e2 = ref.rel_l2(one, want), ref.rel_l2(two, want)
        assert e2 < e1 / 8, (std, e1, e2)
        assert e2 > 0, std
