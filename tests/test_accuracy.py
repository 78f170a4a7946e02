"""CPU tests of the accuracy study: the workload generator (``snapmla.workload``) and the
emulated configurations, metrics and command line of ``snapmla.accuracy``.

The pinned numbers at the end come from ``python -m snapmla.accuracy --cpu --contexts 1k,2k
--layers all --seed 0`` (NumPy backend). They change when the generator or the contract
changes on purpose: re-run that command and update them in the same commit, saying why.
"""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from snapmla import accuracy as acc
from snapmla import reference as ref
from snapmla import workload as wl

PROFILES = {p.name: p for p in wl.DEFAULT_LAYERS}


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint8) if a.dtype.itemsize else a


def _same(a: wl.MLAWorkload, b: wl.MLAWorkload) -> bool:
    return (
        np.array_equal(_bits(a.c_kv), _bits(b.c_kv))
        and np.array_equal(_bits(a.k_pe), _bits(b.k_pe))
        and np.array_equal(_bits(a.q), _bits(b.q))
        and np.array_equal(a.sink_tokens, b.sink_tokens)
        and np.array_equal(a.outlier_tokens, b.outlier_tokens)
    )


@pytest.fixture(scope="module")
def layers_8k() -> dict[str, wl.MLAWorkload]:
    """Every default layer at 8k tokens, 16 heads, seed 0."""
    return {p.name: wl.generate_layer(p, 8192, 16, seed=0) for p in wl.DEFAULT_LAYERS}


# ---------------------------------------------------------------------------- generator


def test_generation_is_deterministic() -> None:
    p = PROFILES["mid"]
    a = wl.generate_layer(p, 1500, 4, seed=3)
    b = wl.generate_layer(p, 1500, 4, seed=3)
    c = wl.generate_layer(p, 1500, 4, seed=4)
    assert _same(a, b)
    assert not np.array_equal(_bits(a.c_kv), _bits(c.c_kv))
    assert a.c_kv.dtype == ml_dtypes.bfloat16 and a.c_kv.shape == (1500, 512)
    assert a.k_pe.dtype == ml_dtypes.bfloat16 and a.k_pe.shape == (1500, 64)
    assert a.q.dtype == ml_dtypes.bfloat16 and a.q.shape == (1, 1, 4, 576)


@pytest.mark.parametrize("short", [100, 700, 2048, 2900])
def test_a_shorter_context_is_a_prefix(short: int) -> None:
    """Contexts are prefixes of one another (the query is re-rotated at the new last
    position), also below the 2048 calibration tokens and with MTP rows."""
    p = PROFILES["last"]
    long = wl.generate_layer(p, 3000, 3, seed=1, q_len=2)
    assert _same(long.prefix(short), wl.generate_layer(p, short, 3, seed=1, q_len=2))
    np.testing.assert_array_equal(long.prefix(short).query_positions, [short - 2, short - 1])


def test_a_layer_does_not_depend_on_the_others() -> None:
    stack = wl.generate(1024, 4, seed=2)
    alone = wl.generate_layer(PROFILES["deep"], 1024, 4, seed=2, layer_index=4)
    assert [w.profile.name for w in stack] == list(PROFILES)
    assert _same(stack[4], alone)


def test_content_is_near_zero_with_a_few_outliers(layers_8k: dict[str, wl.MLAWorkload]) -> None:
    for name, w in layers_8k.items():
        c = np.abs(w.c_kv.astype(np.float64))
        assert 0.1 < np.median(c) < 0.5, name
        assert np.percentile(c, 99) < 3.0, name
        assert np.mean(c > 3.0) < 0.01, name  # "mostly < 10": the bulk is far below
        assert 4.0 <= c.max() <= 25.0, name  # a few values reach about 10
        # Outlier tokens: one spike of 4-10 in an otherwise ordinary token.
        assert w.outlier_tokens.size >= 3, name
        spikes = c[w.outlier_tokens].max(axis=1)
        assert np.all((spikes >= 4.0 - 1e-6) & (spikes <= 10.0 + 1e-6)), name
        # Per-token magnitude variation: the per-token amax spreads over several x.
        ordinary = np.setdiff1d(np.arange(w.context), np.r_[w.sink_tokens, w.outlier_tokens])
        amax = c[ordinary].max(axis=1)
        assert np.percentile(amax, 99) / np.percentile(amax, 1) > 2.0, name
        # Sinks: token 0 and rare others, nearly one-hot on two channels, value 5-10.
        assert w.sink_tokens[0] == 0 and w.sink_tokens.size <= 4, name
        sink = np.sort(c[0] ** 2)[::-1]
        assert sink[:2].sum() > 0.97 * sink.sum(), name
        assert 4.5 < c[0].max() < 10.5, name


def test_rope_magnitudes_are_channel_dependent_up_to_1e3(
    layers_8k: dict[str, wl.MLAWorkload],
) -> None:
    peaks = []
    for name, w in layers_8k.items():
        r = w.k_pe.astype(np.float64)
        pair_rms = np.sqrt((r[:, 0::2] ** 2 + r[:, 1::2] ** 2).mean(axis=0))  # [32]
        assert pair_rms[0] < 3.0, name  # highest frequency: about 1
        assert pair_rms[-1] > 50 * pair_rms[0], name  # lowest: the massive ones
        assert np.all(np.diff(pair_rms) > -0.05 * pair_rms[1:]), name  # grows with i
        peaks.append(np.abs(r).max())
    assert 80 < peaks[0] < 600  # early layers: a few hundred
    assert 800 < max(peaks) < 3000  # deep layers: about 1e3, with tails
    assert peaks == sorted(peaks)


def test_rope_is_applied_at_each_tokens_position(layers_8k: dict[str, wl.MLAWorkload]) -> None:
    """Un-rotating k_pe by its own position recovers base vectors whose pair directions are
    shared by all tokens; without (or by other tokens' positions) they are scattered."""
    w = layers_8k["mid"]
    r = w.k_pe.astype(np.float64)
    n = w.context
    pos = np.arange(n)

    def resultant(x: np.ndarray, pair: int) -> float:
        z = x[:, 2 * pair] + 1j * x[:, 2 * pair + 1]
        return float(np.abs(np.mean(z / np.abs(z))))

    base = wl.rope_rotate(r, -pos)
    wrong = wl.rope_rotate(r, -np.random.default_rng(0).permutation(pos))
    for pair in (0, 1, 4):  # theta = 1, 0.75, 0.32 rad per token
        assert resultant(base, pair) > 0.8
        assert resultant(r, pair) < 0.1
        assert resultant(wrong, pair) < 0.1
    assert resultant(base, 31) > 0.8  # the lowest frequency too


def test_rope_term_depends_on_the_position_difference_only(
    layers_8k: dict[str, wl.MLAWorkload],
) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 1, 64))
    for interleaved in (True, False):
        def dot(p1: float, p2: float, il: bool = interleaved) -> float:
            x = wl.rope_rotate(a, np.array([p1]), interleaved=il)[0]
            y = wl.rope_rotate(b, np.array([p2]), interleaved=il)[0]
            return float(x @ y)

        assert dot(100, 40) == pytest.approx(dot(1060, 1000), rel=1e-9, abs=1e-9)
        assert dot(100, 40) != pytest.approx(dot(100, 41), rel=1e-3)
    # The workload: the query at position P and key j give the RoPE term that the query at
    # P + d gives with the same base key rotated at j + d.
    w = layers_8k["deep"]
    d = 3000
    keys = np.array([0, 17, 1000, 4000])
    base = wl.rope_rotate(w.k_pe[keys].astype(np.float64), -keys.astype(np.float64))
    q1 = wl.rope_rotate(w.q_pe_base[0], np.full(w.num_heads, 5000.0))
    q2 = wl.rope_rotate(w.q_pe_base[0], np.full(w.num_heads, 5000.0 + d))
    z1 = q1 @ wl.rope_rotate(base, keys + 0.0).T
    z2 = q2 @ wl.rope_rotate(base, keys + float(d)).T
    np.testing.assert_allclose(z1, z2, rtol=1e-9, atol=1e-9 * np.abs(z1).max())
    # And the workload's own query is rotated at the last position.
    q_last = w.q[0, 0, :, 512:].astype(np.float64)
    want = wl.rope_rotate(w.q_pe_base[0], np.full(w.num_heads, float(w.context - 1)))
    np.testing.assert_allclose(q_last, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())


def test_attention_statistics_are_plausible(layers_8k: dict[str, wl.MLAWorkload]) -> None:
    for name, w in layers_8k.items():
        s = wl.workload_stats(w)
        assert 0.7 < s["logit_std"] < 4.0, name
        assert 0.005 < s["sink_mass"] < 0.8, name
        assert 2.0 < s["eff_tokens"] < 3000, name


# ---------------------------------------------------------------------------- rounding


def _rounding_probes() -> np.ndarray:
    rng = np.random.default_rng(7)
    mags = np.exp(rng.uniform(np.log(1e-5), np.log(1e3), 20000))
    x = mags * rng.choice([-1.0, 1.0], mags.size)
    # Exact ties and their neighbours in the normal and subnormal ranges, saturation, zeros.
    k = np.arange(1, 200, dtype=np.float64)
    ties = np.concatenate([(k + 0.5) * 2.0**-9, (k + 0.5) * 2.0**-6, (k + 0.5) * 2.0**3])
    near = np.concatenate([ties, np.nextafter(ties, 0), np.nextafter(ties, np.inf)])
    special = np.array([0.0, -0.0, 448.0, 464.0, 480.0, 1e6, -1e6, 2.0**-10, 2.0**-9])
    return np.concatenate([x, near, -near, special])


def test_numpy_backend_rounds_like_the_reference() -> None:
    ops = acc.Backend("numpy")
    x = _rounding_probes()
    np.testing.assert_array_equal(ops.e4m3_round(x).view(np.uint64),
                                  ref.e4m3_round(x).view(np.uint64))
    x32 = x.astype(np.float32).astype(np.float64)
    want = ref._fp8_to_f64(ref.e4m3(x32.astype(np.float32)))
    np.testing.assert_array_equal(ops.e4m3_f32(x32), want)


def test_torch_rounding_matches_the_reference_bit_for_bit() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    ops = acc.Backend("torch", "cpu")
    x = _rounding_probes()
    got = ops.numpy(ops.e4m3_round(torch.from_numpy(x)))
    np.testing.assert_array_equal(got.view(np.uint64), ref.e4m3_round(x).view(np.uint64))
    x32 = x.astype(np.float32).astype(np.float64)
    got = ops.numpy(ops.e4m3_f32(torch.from_numpy(x32)))
    want = ref._fp8_to_f64(ref.e4m3(x32.astype(np.float32)))
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
    got = ops.numpy(ops.bf16(torch.from_numpy(x32)))
    want = x32.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ops.numpy(ops.f32(torch.from_numpy(x))),
                                  x.astype(np.float32).astype(np.float64))


# ---------------------------------------------------------------------------- emulation


@pytest.mark.parametrize(("context", "q_len"), [(1000, 1), (700, 2), (193, 4)])
def test_emulated_ours_is_the_contracts_model(context: int, q_len: int) -> None:
    """The vectorized block pipeline with the contract's KV is decode_reference (float64
    rounding apart), with and without FP8 P, causal MTP rows included."""
    w = wl.generate_layer(PROFILES["mid-deep"], context, 5, seed=5, q_len=q_len)
    ops = acc.Backend("numpy")
    kv = ref.quantize_kv(w.c_kv, w.k_pe)
    for quantize_p in (True, False):
        want, want_lse = ref.decode_reference(
            w.q, [kv], [context], w.softmax_scale, True, quantize_p=quantize_p
        )
        got, got_lse = acc.emulate("ours", w, ops, quantize_p=quantize_p)
        assert ref.rel_l2(got, want) < 1e-9
        np.testing.assert_allclose(got_lse, want_lse, rtol=0, atol=1e-9)


@pytest.mark.parametrize(("context", "q_len"), [(1000, 1), (193, 4)])
def test_emulated_two_term_query_is_its_model(context: int, q_len: int) -> None:
    """ours-q-fp8x2's emulation is decode_reference(q_terms=2) (float64 rounding apart)."""
    w = wl.generate_layer(PROFILES["last"], context, 5, seed=6, q_len=q_len)
    ops = acc.Backend("numpy")
    kv = ref.quantize_kv(w.c_kv, w.k_pe)
    want, want_lse = ref.decode_reference(w.q, [kv], [context], w.softmax_scale, True, q_terms=2)
    got, got_lse = acc.emulate("ours", w, ops, q_terms=2)
    assert ref.rel_l2(got, want) < 1e-9
    np.testing.assert_allclose(got_lse, want_lse, rtol=0, atol=1e-9)
    one, _ = acc.emulate("ours", w, ops)
    assert ref.rel_l2(got, one) > 1e-4  # the two-term query is not the one-term one
    with pytest.raises(ValueError):
        acc.emulate("ours", w, ops, q_terms=3)


def test_exact_is_float64_attention() -> None:
    w = wl.generate_layer(PROFILES["early"], 900, 6, seed=1, q_len=3)
    got, got_lse = acc.exact(w, acc.Backend("numpy"))
    want, want_lse = ref.exact_attention(w.q, [w.c_kv], [w.k_pe], [900], w.softmax_scale, True)
    assert ref.rel_l2(got, want) < 1e-12
    np.testing.assert_allclose(got_lse, want_lse, rtol=0, atol=1e-10)


def test_kv_schemes_quantize_as_documented() -> None:
    w = wl.generate_layer(PROFILES["last"], 1000, 2, seed=0)
    ops = acc.Backend("numpy")
    c = ops.asarray(w.c_kv)
    k = ops.asarray(w.k_pe)
    half_ulp = 2.0**-4  # E4M3 relative rounding bound in the normal range

    def check(deq: np.ndarray, scale: np.ndarray) -> None:
        bound = half_ulp * np.abs(c) + 2.0**-10 * scale + 1e-12  # + half a subnormal step
        assert np.all(np.abs(deq - c) <= bound)

    ours = acc.quantize_kv_scheme("ours", c, k, ops)
    content, rope, s = ref.quantize_kv(w.c_kv, w.k_pe)
    np.testing.assert_array_equal(ours.values, ref._fp8_to_f64(content))
    np.testing.assert_array_equal(ours.p_scale, s.astype(np.float64))
    np.testing.assert_array_equal(ours.k_rope, ref._to_f64(rope) * s[:, None])
    assert np.all(np.abs(ours.k_rope - k) <= 2.0**-8 * np.abs(k) + 1e-12)  # BF16 re-rounding

    a = acc.quantize_kv_scheme("A", c, k, ops)
    s_a = np.maximum(np.abs(c).max(1), np.abs(k).max(1)).astype(np.float32) / np.float32(448)
    np.testing.assert_array_equal(a.p_scale, s_a.astype(np.float64))
    assert np.abs(a.k_rope - k).max() > 1.0  # the RoPE key went through FP8

    b = acc.quantize_kv_scheme("B", c, k, ops)
    s_b = float(np.float32(np.abs(c).max()) / np.float32(448))
    check(b.k_content, np.full_like(c, s_b))
    np.testing.assert_array_equal(b.k_rope, k)
    assert np.unique(b.p_scale).size == 1

    cc = acc.quantize_kv_scheme("C", c, k, ops)
    s_c = (np.abs(c).max(0).astype(np.float32) / np.float32(448)).astype(np.float64)
    check(cc.k_content, np.broadcast_to(s_c, c.shape))
    np.testing.assert_array_equal(cc.values / s_c, ref._to_f64(ref.e4m3(
        (c.astype(np.float32) / s_c.astype(np.float32)).astype(np.float32))))

    d = acc.quantize_kv_scheme("D", c, k, ops)
    s_d = np.zeros_like(c)
    for t0 in range(0, 1000, 64):  # 64 x 64 blocks; the last token block is partial
        for c0 in range(0, 512, 64):
            blk = np.abs(c[t0:t0 + 64, c0:c0 + 64]).max()
            s_d[t0:t0 + 64, c0:c0 + 64] = float(np.float32(blk) / np.float32(448))
    check(d.k_content, s_d)
    for x in (b, cc, d):
        np.testing.assert_array_equal(x.k_rope, k)  # RoPE kept BF16 as given


def test_torch_backend_matches_numpy() -> None:
    """The torch backend computes what the numpy one does. Torch's CPU BLAS may pick its thread
    count by the machine's load, and another reduction order can flip an FP8 rounding of P
    (seen: 2 failures in ~30 full-suite runs beside a compile); one thread makes it repeatable."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    w = wl.generate_layer(PROFILES["deep"], 1100, 4, seed=2, q_len=2)
    np_ops, torch_ops = acc.Backend("numpy"), acc.Backend("torch", "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for scheme in ("exact", "ours", "A", "B", "C", "D"):
            a, la = acc.emulate(scheme, w, np_ops)
            b, lb = acc.emulate(scheme, w, torch_ops)
            assert ref.rel_l2(b, a) < 1e-12, scheme
            np.testing.assert_allclose(lb, la, rtol=0, atol=1e-11)
    finally:
        torch.set_num_threads(threads)


def test_metrics() -> None:
    rng = np.random.default_rng(0)
    e = rng.standard_normal((1, 1, 4, 512))
    o = e + 0.01 * rng.standard_normal(e.shape)
    lse = np.zeros((1, 4, 1))
    m = acc.metrics(o, lse + 0.5, e, lse)
    assert m.rel_l2 == pytest.approx(ref.rel_l2(o, e))
    assert m.rmse == pytest.approx(np.sqrt(np.mean((o - e) ** 2)))
    cos = float(o.ravel() @ e.ravel()) / (np.linalg.norm(o) * np.linalg.norm(e))
    assert m.cos_diff == pytest.approx(1 - cos)
    assert m.lse_max == pytest.approx(0.5) and m.lse_mean == pytest.approx(0.5)
    assert m.row_rel_l2_median <= m.row_rel_l2_max


# ---------------------------------------------------------------------------- the study

# rel L2 of ours-model per (context, layer) at seed 0, 16 heads, s_q 1: the ceiling a change
# may not exceed by more than PIN_SLACK (improvements pass; update the pins with them).
PINNED_OURS_REL_L2 = {
    (1024, 0): 2.3723e-02,
    (1024, 1): 4.8847e-02,
    (1024, 2): 1.4660e-02,
    (1024, 3): 2.7153e-02,
    (1024, 4): 1.9381e-02,
    (1024, 5): 4.0561e-02,
    (2048, 0): 2.0373e-02,
    (2048, 1): 5.3669e-02,
    (2048, 2): 1.9056e-02,
    (2048, 3): 2.3388e-02,
    (2048, 4): 1.1845e-02,
    (2048, 5): 4.3819e-02,
}
PIN_SLACK = 1.03


@pytest.fixture(scope="module")
def study() -> dict:
    settings = acc.Settings(contexts=(1024, 2048), layers=wl.DEFAULT_LAYERS, heads=16, seed=0)
    out = acc.evaluate(settings, acc.Backend("numpy"), log=lambda *a: None)
    out["claims"] = acc.check_claims(out["results"])
    return out


def _table(study: dict) -> dict[tuple[int, int], dict[str, dict]]:
    t: dict[tuple[int, int], dict[str, dict]] = {}
    for r in study["results"]:
        t.setdefault((r["context"], r["layer"]), {})[r["config"]] = r
    return t


def test_ours_error_does_not_regress(study: dict) -> None:
    """A change to the contract (or the kernel's model of it) that costs accuracy fails."""
    got = {k: v["ours-model"]["rel_l2"] for k, v in _table(study).items()}
    assert set(got) == set(PINNED_OURS_REL_L2)
    for key, pinned in PINNED_OURS_REL_L2.items():
        assert got[key] <= pinned * PIN_SLACK, (key, got[key], pinned)


def test_ordering_against_the_papers_alternatives(study: dict) -> None:
    """The ordering the paper reports, as far as it holds on this data (see the README):

    * A (RoPE in FP8 under the per-token scale of all 576 values) and B (one per-tensor
      scale) are worse than ours at every layer and context of this study (seed 0), and by
      >= 1.5x in geometric mean. (Over 8 seeds x 6 layers at 1k and 4k, ours is below A in 93
      of 96 cases and below B in 83; a generator change may move a case, then check there.)
    * C (per-channel) and D (per-block 64x64), given the oracle amax of the whole context,
      are as accurate as per-token quantization: E4M3's exponent makes the scale granularity
      nearly irrelevant except for the elements it makes exact, and the per-layer ordering
      against them flips with the rounding of the few tokens that concentrated heads attend
      (over the same 96 cases ours is lower in 51 against C and 56 against D, geometric-mean
      ratios 1.00x and 1.02x). Only parity is pinned: ours at most 10% worse in geometric
      mean.
    """
    t = _table(study)
    for (n, layer), v in t.items():
        for alt in ("A", "B"):
            for metric in ("rel_l2", "rmse"):
                assert v["ours-model"][metric] < v[alt][metric], (n, layer, alt, metric)
    for metric in ("rel_l2", "rmse"):
        for alt, floor in (("A", 1.5), ("B", 1.5), ("C", 0.9), ("D", 0.9)):
            logs = [math.log(v[alt][metric] / v["ours-model"][metric]) for v in t.values()]
            ratio = math.exp(sum(logs) / len(logs))
            assert ratio >= floor, (metric, alt, ratio)


def test_fp8_p_costs_little_and_bf16_output_is_a_floor(study: dict) -> None:
    for s in study["shares"]:
        assert s["p_share"] < 0.05, s
        assert abs(s["rel_l2_p_exact"] - s["rel_l2_ours_model"]) < 0.1 * s["rel_l2_ours_model"]
    for v in _table(study).values():
        assert v["bf16"]["rel_l2"] < 3e-3
        assert v["bf16"]["rel_l2"] < 0.2 * v["ours-model"]["rel_l2"]


def test_two_term_query_reaches_the_bf16_query(study: dict) -> None:
    """The two-term FP8 query's target (ours-q-fp8x2): at every layer and context
    its error against exact attention is at most 1.1x the BF16-query diagnostic's
    (ours-q-bf16), and below the one-term contract's (ours-model) by a clear margin (on this
    study the largest ratio is ~0.7x and the geometric mean ~0.45x)."""
    for (n, layer), v in _table(study).items():
        two = v["ours-q-fp8x2"]["rel_l2"]
        assert two <= 1.1 * v["ours-q-bf16"]["rel_l2"], (n, layer, two)
        assert two < 0.85 * v["ours-model"]["rel_l2"], (n, layer, two)
    ratios = acc.two_term_query_ratios(study["results"])
    assert ratios is not None and ratios["cases"] == len(_table(study))
    assert ratios["within_1_1x"] and ratios["vs_q_bf16"]["max"] <= 1.1
    assert ratios["vs_model"]["geomean"] < 0.6
    for s in study["shares"]:
        assert s["rel_l2_q_fp8x2"] == _table(study)[(s["context"], s["layer"])][
            "ours-q-fp8x2"]["rel_l2"]
    no_q2 = [r for r in study["results"] if r["config"] != "ours-q-fp8x2"]
    assert acc.two_term_query_ratios(no_q2) is None


class _StandInKernel:
    """Plays the GPU kernel: the contract's model with a BF16 output (fp32 with
    ``out_dtype="float32"``) and an fp32 lse."""

    version = "stand-in"

    def __init__(
        self, fail_at: int | None = None, two_term: bool = True, out_dtype: str = "bfloat16"
    ) -> None:
        self.calls = 0  # one-term calls (fail_at counts these)
        self.fail_at = fail_at
        self.two_term = two_term  # False: the two-term query fails (an older library)
        self.out_dtype = out_dtype

    def append(self, layer: int, w: wl.MLAWorkload) -> None:
        pass

    def decode(
        self, layer: int, w: wl.MLAWorkload, q_precision: str = "fp8"
    ) -> tuple[np.ndarray, np.ndarray]:
        q_terms = 2 if q_precision == "fp8x2" else 1
        if q_terms == 1:
            self.calls += 1
            if self.fail_at is not None and self.calls >= self.fail_at:
                raise RuntimeError("no kernel for this device")
        elif not self.two_term:
            raise RuntimeError("no q_precision in this library")
        kv = ref.quantize_kv(w.c_kv, w.k_pe)
        out, lse = ref.decode_reference(
            w.q, [kv], [w.context], w.softmax_scale, True, q_terms=q_terms
        )
        out = out.astype(np.float32)
        if self.out_dtype != "float32":
            out = out.astype(ref.BF16)
        return ref._to_f64(out), lse.astype(np.float32)


def test_the_kernel_is_reported_as_ours() -> None:
    settings = acc.Settings(contexts=(512,), layers=wl.DEFAULT_LAYERS[:2], heads=4)
    out = acc.evaluate(settings, acc.Backend("numpy"), _StandInKernel(), log=lambda *a: None)
    assert out["kernel_error"] is None
    assert {r["config"] for r in out["results"]} == set(acc.CONFIGS)
    assert len(out["kernel_vs_model"]) == 2
    assert all(k["rel_l2"] < 3e-3 for k in out["kernel_vs_model"])
    claims = acc.check_claims(out["results"])
    ours = [r["rel_l2"] for r in out["results"] if r["config"] == "ours"]
    assert claims["max_rel_l2"] == pytest.approx(max(ours))


def test_the_kernels_two_term_query_is_reported_and_can_fail_alone() -> None:
    settings = acc.Settings(contexts=(512,), layers=wl.DEFAULT_LAYERS[:2], heads=4)
    out = acc.evaluate(settings, acc.Backend("numpy"), _StandInKernel(), log=lambda *a: None)
    q2k = acc.two_term_query_ratios(out["results"], "ours-fp8x2")
    q2e = acc.two_term_query_ratios(out["results"])
    assert q2k is not None and q2e is not None and q2k["cases"] == 2
    # The stand-in runs the model; the emulation runs the same query through other code.
    assert q2k["vs_q_bf16"]["max"] == pytest.approx(q2e["vs_q_bf16"]["max"], rel=0.05)
    # Against the diagnostic with the same BF16 output, the stand-in's ratio is the
    # emulation's: the output's rounding is not the two-term query's cost.
    assert q2k["vs_q_bf16_out"]["max"] == pytest.approx(q2e["vs_q_bf16"]["max"], rel=0.01)
    assert q2k["vs_q_bf16"]["max"] > q2k["vs_q_bf16_out"]["max"]
    assert q2e["vs_q_bf16_out"] is not None  # (the emulation's own, float64 against BF16)
    out = acc.evaluate(
        settings, acc.Backend("numpy"), _StandInKernel(two_term=False), log=lambda *a: None
    )
    configs = {r["config"] for r in out["results"]}
    assert "ours" in configs and "ours-fp8x2" not in configs
    assert out["kernel_error"] is None and "q_precision" in out["two_term_kernel_error"]


def test_the_kernels_fp32_output_is_compared_without_the_bf16_rounding() -> None:
    """--out-dtype float32: the kernel runs write fp32 (the values BF16 rounds), so the
    two-term kernel meets the float64 BF16-query diagnostic as the emulation does, and the
    summary line says the output is fp32."""
    settings = acc.Settings(contexts=(512,), layers=wl.DEFAULT_LAYERS[:2], heads=4)
    reports = {}
    for dtype in ("bfloat16", "float32"):
        kernel = _StandInKernel(out_dtype=dtype)
        out = acc.evaluate(settings, acc.Backend("numpy"), kernel, log=lambda *a: None)
        report = {
            **out,
            "settings": {"contexts": [512], "out_dtype": dtype},
            "claims": acc.check_claims(out["results"]),
        }
        reports[dtype] = (report, acc.format_tables(report))
    q2e = acc.two_term_query_ratios(reports["float32"][0]["results"])
    q2k = acc.two_term_query_ratios(reports["float32"][0]["results"], "ours-fp8x2")
    q2k_bf16 = acc.two_term_query_ratios(reports["bfloat16"][0]["results"], "ours-fp8x2")
    # fp32: the stand-in's ratio to ours-q-bf16 is the emulation's (no BF16 rounding in it)
    assert q2k["vs_q_bf16"]["max"] == pytest.approx(q2e["vs_q_bf16"]["max"], rel=0.01)
    assert q2k_bf16["vs_q_bf16"]["max"] > q2k["vs_q_bf16"]["max"]
    text = reports["float32"][1]
    assert "two-term FP8 query in the kernel (ours-fp8x2, fp32 output, no BF16 rounding)" in text
    assert "ours-q-bf16-out, as the kernel writes it" not in text
    text = reports["bfloat16"][1]
    assert "two-term FP8 query in the kernel (ours-fp8x2, BF16 output) / BF16 query" in text
    assert "(ours-q-bf16-out, as the kernel writes it)" in text


def test_a_failing_kernel_leaves_an_emulation_only_study() -> None:
    settings = acc.Settings(contexts=(256, 512), layers=wl.DEFAULT_LAYERS[:2], heads=4)
    out = acc.evaluate(settings, acc.Backend("numpy"), _StandInKernel(fail_at=2),
                       log=lambda *a: None)
    assert "no kernel" in out["kernel_error"]
    assert "ours" not in {r["config"] for r in out["results"]}
    assert out["kernel_vs_model"] == []
    assert len(out["results"]) == 4 * (len(acc.CONFIGS) - 2)  # no "ours", no "ours-fp8x2"


def test_command_line_on_cpu(tmp_path, capsys) -> None:
    j, md = tmp_path / "acc.json", tmp_path / "acc.md"
    assert acc.main(["--quick", "--cpu", "--out", str(j), "--markdown", str(md)]) == 0
    printed = capsys.readouterr().out
    assert "CPU: emulation only" in printed
    report = json.loads(j.read_text())
    assert report["mode"] == "cpu" and report["kernel"] is None
    assert report["settings"]["contexts"] == [1024] and report["settings"]["heads"] == 8
    assert report["settings"]["out_dtype"] == "bfloat16"
    assert {r["config"] for r in report["results"]} == set(acc.CONFIGS) - {"ours", "ours-fp8x2"}
    for key in ("commit", "date", "device", "backend", "claims", "shares", "layers"):
        assert key in report
    assert report["commit"] in md.read_text()
    assert "ours-q-fp8x2" in md.read_text()
    assert report["two_term_query"]["cases"] == 2
    assert "two-term FP8 query (ours-q-fp8x2) / BF16 query (ours-q-bf16)" in printed


def test_command_line_figure(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    fig = tmp_path / "fig.png"
    assert acc.main(["--quick", "--cpu", "--quiet", "--contexts", "512,1k",
                     "--figure", str(fig)]) == 0
    for path in (fig, tmp_path / "fig_contexts.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_line_arguments() -> None:
    assert acc._parse_contexts("4k, 1024,4k") == (1024, 4096)
    assert [p.name for p in acc._parse_layers("3")] == ["early", "mid", "last"]
    assert [p.name for p in acc._parse_layers("mid,0")] == ["mid", "early"]
    with pytest.raises(SystemExit):
        acc._parse(["--heads", "0"])
    assert acc._parse([]).out_dtype == "bfloat16"
    assert acc._parse(["--out-dtype", "float32"]).out_dtype == "float32"
    with pytest.raises(SystemExit):
        acc._parse(["--out-dtype", "float16"])
