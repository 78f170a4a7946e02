"""Synthetic, weight-free MLA decode workloads with the statistics of real MLA activations.

snapmla's accuracy study (``python -m snapmla.accuracy``) needs inputs that look like what a
DeepSeek-style MLA layer writes into its KV cache and asks of it at decode time, without
loading a model. This module makes them, layer by layer, from a handful of documented knobs.
Each choice and the evidence behind it (written out in the README's accuracy section):

Latent content ``c_kv`` (512 values per token)
  * In DeepSeek-V2/V3 (and LongCat-Flash, which reuses MLA) the cached latent is the output of
    an RMSNorm (``kv_a_layernorm``) applied to ``W_DKV h``. We generate it that way: a
    pre-norm activation ``x = rho * mu + noise`` (``mu`` a direction shared by all tokens of
    the layer: hidden states have a large common component, Sun et al. 2024, "Massive
    activations in large language models"), normalized to unit RMS and multiplied by a
    per-channel weight ``gamma``. The norm is why the content is "tightly concentrated around
    zero (within +-10)" in the SnapMLA paper's figure 3(a): typical magnitudes are ``gamma``'s
    (median |c_kv| 0.17-0.34 over the default layers, 99th percentile below 2).
  * ``gamma`` varies per channel (lognormal) and a few channels carry a 2.5x larger weight:
    KV caches have outlier channels (KIVI, Liu et al. 2024; KVQuant, Hooper et al. 2024).
  * Per-token magnitude variation: a lognormal per-token gain (sigma 0.1-0.2). RMSNorm
    keeps the per-token RMS near that of ``gamma``, so the spread is modest, as it is in the
    real cache; the gamma weighting and the spikes below add to it.
  * Outlier tokens (0.1-0.5%): the pre-norm activation has a spike in one channel (massive
    activations live in a few channels of a few tokens, Sun et al. 2024). After the norm the
    spike is 4-10 and the rest of that token shrinks by 0.35-0.9: the per-token amax then
    varies by an order of magnitude across tokens, the case per-token scales are for.
  * Attention sinks: token 0 and rare later tokens (about one per 8k, like delimiters) whose
    pre-norm activation is dominated by two "sink" channels, so after the norm they are nearly
    one-hot, with values ``sqrt(256) * gamma`` = 5-10 there (their norm is then that of an
    ordinary token, as RMSNorm dictates), and every head's query has a component along those
    channels that lifts the sinks' logits 3-13 above the background mean (StreamingLLM, Xiao et
    al. 2023; Gu et al. 2024, "When attention sink emerges": sinks act as key biases).

Decoupled RoPE key ``k_pe`` (64 values per token)
  * ``k_pe = RoPE(W_KR h)`` is not normalized, which is why its range is two orders of
    magnitude wider (the paper's figure 3(a): up to about +-1e3, with outlier tails).
  * Channel-dependent magnitudes: before rotation each frequency pair ``i`` (of 32) has an
    amplitude growing from about 1 for the highest frequency to ``rope_peak`` (100-600) for
    the lowest ones, ``A_i = floor * (peak / floor) ** ((i / 31) ** 2)``: massive values in Q
    and K concentrate in the low-frequency RoPE dimensions (Jin et al. 2025, "Massive values in
    self-attention modules are the key to contextual knowledge understanding"; Barbero et al.
    2024, "Round and round we go! What makes rotary positional encodings useful?"). Each pair
    has a direction shared by all tokens (the massive values are consistent across tokens)
    plus per-token noise, and a per-token lognormal gain makes the tails (max |k_pe| 250-1600
    at 32k).
  * The base vectors are then actually rotated with RoPE (rotary dim 64, base 10000, no YaRN)
    at each token's position ``0 .. n-1``; pairs are interleaved ``(2i, 2i+1)`` as DeepSeek's
    released weights expect (vLLM's ``is_neox_style=False``).

Queries (absorbed: ``q = [q_nope W_UK (512) | q_pe (64)]`` per head)
  * Each head draws a logit spread (std over tokens, 0.8-3.0) and the share of its variance
    that the RoPE term carries (10-70%, more in deeper layers). The spread sets how
    concentrated the attention is: 150 to 2400 effective tokens at 32k.
  * ``q_nope``: a head-specific random direction scaled to the content share of the spread,
    plus the sink component.
  * ``q_pe``: per pair a magnitude ``~ exp(tilt * i / 31) / A_i`` (a per-head tilt: positional
    heads favour high frequencies, semantic ones the low) scaled to the RoPE share, rotated at
    the query's own position (the last ``s_q`` positions).
  * The calibration uses the first 2048 tokens (generated even for shorter contexts) with the
    query at position 2048, so the query does not depend on the context length.

Layers: :data:`DEFAULT_LAYERS` holds six profiles from "early" to "last" whose RoPE peak, RoPE
logit share, sink strength and outlier rates grow with depth (the paper sees the RoPE-unaware
configuration A degrade most in deep layers).

Contexts: a workload is generated once at the longest context and shorter contexts are its
prefixes (:meth:`MLAWorkload.prefix`): every random stream is drawn token by token, so the
first ``n`` tokens do not depend on the total length; the query is re-rotated at the new last
position. Everything is deterministic in ``(seed, profile name)``.

Only NumPy and ml_dtypes are needed; nothing here touches a GPU.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import ml_dtypes
import numpy as np

__all__ = [
    "CONTENT_DIM",
    "DEFAULT_LAYERS",
    "DEFAULT_SOFTMAX_SCALE",
    "ROPE_BASE",
    "ROPE_DIM",
    "LayerProfile",
    "MLAWorkload",
    "generate",
    "generate_layer",
    "rope_frequencies",
    "rope_rotate",
    "workload_stats",
]

CONTENT_DIM = 512
ROPE_DIM = 64
ROPE_BASE = 10000.0
DEFAULT_SOFTMAX_SCALE = 192**-0.5  # DeepSeek-V3: qk_nope_head_dim 128 + qk_rope_head_dim 64
BF16 = ml_dtypes.bfloat16

_PAIRS = ROPE_DIM // 2
_SINK_CHANNELS = 2  # a sink's latent is nearly one-hot on this many channels
_SINK_EVERY = 8192  # later sinks: about one per this many tokens
_CALIBRATION_TOKENS = 2048  # the query is calibrated on the first tokens (context-independent)
_ROPE_FLOOR = 1.0  # pre-rotation amplitude of the highest-frequency pair
_ROPE_NOISE = 0.3  # per-token noise of a RoPE pair relative to its shared direction


@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """The statistics of one synthetic MLA layer (see the module docstring for the evidence).

    Attributes:
      name: label used in tables and figures.
      gamma_rms: RMS of the RMSNorm weight: the typical magnitude of ``c_kv``.
      outlier_channels: channels whose weight is ``outlier_gain`` times larger.
      outlier_gain: weight ratio of the outlier channels.
      mean_strength: ``rho``, the shared direction's strength relative to per-token noise
        before the norm.
      token_sigma: lognormal sigma of the per-token gain of ``c_kv``.
      spike_rate: fraction of outlier tokens (one spiking channel before the norm).
      sink_value: latent value of a sink in its two sink channels: about ``16 * gamma_rms``,
        what RMSNorm gives a one-hot token on channels of ordinary weight (5 to 10).
      rope_peak: pre-rotation amplitude of the lowest-frequency RoPE pairs (100-600).
      rope_token_sigma: lognormal sigma of the per-token gain of ``k_pe`` (the tails).
      logit_std: per-head range ``(lo, hi)`` of the logits' std over tokens (content + RoPE).
      rope_share: per-head range of the share of that variance that the RoPE term carries.
      sink_logit: per-head range of the sinks' logit lift over the background mean.
    """

    name: str
    gamma_rms: float = 0.45
    outlier_channels: int = 8
    outlier_gain: float = 2.5
    mean_strength: float = 0.6
    token_sigma: float = 0.15
    spike_rate: float = 2e-3
    sink_value: float = 9.0
    rope_peak: float = 400.0
    rope_token_sigma: float = 0.15
    logit_std: tuple[float, float] = (1.0, 2.5)
    rope_share: tuple[float, float] = (0.2, 0.5)
    sink_logit: tuple[float, float] = (4.0, 11.0)


# The default layers, shallow to deep (the other fields at LayerProfile's defaults).
_LAYER_FIELDS = (
    "name", "gamma_rms", "token_sigma", "spike_rate", "sink_value", "rope_peak", "logit_std",
    "rope_share", "sink_logit",
)  # fmt: skip
_LAYER_TABLE = (
    ("early", 0.30, 0.10, 1e-3, 5.0, 100.0, (0.8, 2.0), (0.1, 0.3), (3.0, 9.0)),
    ("early-mid", 0.40, 0.12, 2e-3, 6.5, 200.0, (0.9, 2.2), (0.15, 0.4), (4.0, 10.0)),
    ("mid", 0.45, 0.15, 2e-3, 7.0, 300.0, (1.0, 2.4), (0.2, 0.5), (4.0, 11.0)),
    ("mid-deep", 0.50, 0.15, 3e-3, 8.0, 400.0, (1.0, 2.6), (0.25, 0.6), (5.0, 12.0)),
    ("deep", 0.55, 0.18, 4e-3, 9.0, 500.0, (1.1, 2.8), (0.3, 0.65), (5.0, 12.0)),
    ("last", 0.60, 0.20, 5e-3, 10.0, 600.0, (1.2, 3.0), (0.3, 0.7), (6.0, 13.0)),
)
DEFAULT_LAYERS: tuple[LayerProfile, ...] = tuple(
    LayerProfile(**dict(zip(_LAYER_FIELDS, row))) for row in _LAYER_TABLE
)


# ---------------------------------------------------------------------------- RoPE


def rope_frequencies(dim: int = ROPE_DIM, base: float = ROPE_BASE) -> np.ndarray:
    """Angular frequency of each rotary pair, ``theta_i = base ** (-2 i / dim)`` (float64)."""
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def rope_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    base: float = ROPE_BASE,
    interleaved: bool = True,
) -> np.ndarray:
    """Applies rotary position embedding to ``x [..., n, dim]`` at ``positions [n]`` (float64).

    Pair ``i`` is ``(x[2i], x[2i+1])`` when ``interleaved`` (GPT-J / DeepSeek layout) or
    ``(x[i], x[i + dim/2])`` otherwise (GPT-NeoX), rotated by the angle ``position * theta_i``.
    The dot product of two rotated vectors then depends on their positions only through the
    difference.
    """
    x = np.asarray(x, dtype=np.float64)
    dim = x.shape[-1]
    angle = np.asarray(positions, dtype=np.float64)[:, None] * rope_frequencies(dim, base)
    cos, sin = np.cos(angle), np.sin(angle)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : dim // 2], x[..., dim // 2 :]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : dim // 2], out[..., dim // 2 :] = ra, rb
    return out


def _to_bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(BF16)


def _unit_rms(v: np.ndarray) -> np.ndarray:
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True))


# ---------------------------------------------------------------------------- the workload


@dataclasses.dataclass
class MLAWorkload:
    """One layer's decode inputs for one request (batch 1).

    Attributes:
      profile: the layer's statistics.
      layer_index: position of the layer in the generated stack.
      seed: the seed it was generated from (with the profile's name).
      c_kv: BF16 ``[n, 512]``, the latent content of tokens ``0 .. n-1``.
      k_pe: BF16 ``[n, 64]``, their rotated RoPE keys.
      q: BF16 ``[1, s_q, h, 576]``, the absorbed queries of the last ``s_q`` positions.
      softmax_scale: the attention's softmax scale.
      sink_tokens: int64 indices of the attention-sink tokens (< n).
      outlier_tokens: int64 indices of the spiking outlier tokens (< n).
      q_nope: float64 ``[s_q, h, 512]`` (unrounded), kept to re-rotate the query.
      q_pe_base: float64 ``[s_q, h, 64]``, the query's RoPE part before rotation.
    """

    profile: LayerProfile
    layer_index: int
    seed: int
    c_kv: np.ndarray
    k_pe: np.ndarray
    q: np.ndarray
    softmax_scale: float
    sink_tokens: np.ndarray
    outlier_tokens: np.ndarray
    q_nope: np.ndarray
    q_pe_base: np.ndarray

    @property
    def context(self) -> int:
        """Context length ``n`` (tokens in the cache, the query's own included)."""
        return int(self.c_kv.shape[0])

    @property
    def num_heads(self) -> int:
        """Query heads ``h``."""
        return int(self.q.shape[2])

    @property
    def q_len(self) -> int:
        """New tokens ``s_q`` (the last ``s_q`` positions of the context)."""
        return int(self.q.shape[1])

    @property
    def query_positions(self) -> np.ndarray:
        """Positions at which the queries are rotated: ``n - s_q .. n - 1``."""
        return np.arange(self.context - self.q_len, self.context, dtype=np.int64)

    def prefix(self, context: int) -> MLAWorkload:
        """The same layer read at a shorter context: tokens ``0 .. context-1`` and the query
        rotated at the new last position(s). Identical to generating at ``context``."""
        if not self.q_len <= context <= self.context:
            raise ValueError(f"prefix context {context} outside [{self.q_len}, {self.context}]")
        return dataclasses.replace(
            self,
            c_kv=self.c_kv[:context],
            k_pe=self.k_pe[:context],
            q=_assemble_q(self.q_nope, self.q_pe_base, context),
            sink_tokens=self.sink_tokens[self.sink_tokens < context],
            outlier_tokens=self.outlier_tokens[self.outlier_tokens < context],
        )


def _assemble_q(q_nope: np.ndarray, q_pe_base: np.ndarray, context: int) -> np.ndarray:
    """BF16 ``[1, s_q, h, 576]`` with q_pe rotated at positions ``context - s_q + t``."""
    s_q = q_nope.shape[0]
    positions = np.arange(context - s_q, context, dtype=np.float64)
    # rope_rotate rotates the second-to-last axis by position: put s_q there.
    q_pe = rope_rotate(np.swapaxes(q_pe_base, 0, 1), positions).swapaxes(0, 1)  # [s_q, h, 64]
    q = np.concatenate([q_nope, q_pe], axis=-1)
    return _to_bf16(q)[None]


def _streams(seed: int, profile: LayerProfile) -> dict[str, np.random.Generator]:
    """Independent generators per quantity, keyed on the seed and the profile's name (so a
    layer's data do not depend on which other layers are generated)."""
    names = ("params", "content", "gain", "spike", "sink", "rope", "rope_gain", "query")
    key = zlib.crc32(profile.name.encode())
    children = np.random.SeedSequence([int(seed), key, 0x534E4150]).spawn(len(names))
    return {name: np.random.default_rng(child) for name, child in zip(names, children)}


def _content(
    profile: LayerProfile, n: int, rng: dict[str, np.random.Generator]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(c_kv float32 [n, 512], sink channels, sinks, outliers)``."""
    p = rng["params"]
    gamma = np.exp(p.normal(0.0, 0.3, CONTENT_DIM))
    channels = p.permutation(CONTENT_DIM)
    outlier_ch = channels[: profile.outlier_channels]
    sink_ch = channels[profile.outlier_channels : profile.outlier_channels + _SINK_CHANNELS]
    ordinary_ch = channels[profile.outlier_channels + _SINK_CHANNELS :]
    gamma[outlier_ch] *= profile.outlier_gain
    gamma *= profile.gamma_rms / np.sqrt(np.mean(gamma * gamma))
    # A nearly one-hot sink has the value sqrt(512 / k) on its k channels after the norm.
    gamma[sink_ch] = profile.sink_value / np.sqrt(CONTENT_DIM / _SINK_CHANNELS)
    mu = _unit_rms(p.standard_normal(CONTENT_DIM))

    # Per-token draws, each from its own stream, so that a prefix does not depend on n.
    x = rng["content"].standard_normal((n, CONTENT_DIM), dtype=np.float32)
    x += np.float32(profile.mean_strength) * mu.astype(np.float32)
    gain = np.exp(rng["gain"].normal(0.0, profile.token_sigma, n))
    spike_draw = rng["spike"].random((n, 4))  # [is outlier, channel, value, shrink]
    sink_draw = rng["sink"].random(n)

    sinks = np.flatnonzero((sink_draw < 1.0 / _SINK_EVERY) | (np.arange(n) == 0))
    x[sinks] *= np.float32(0.005)
    x[np.ix_(sinks, sink_ch)] = np.float32(1.0)  # dominates the RMS: nearly one-hot
    x = x / np.sqrt(np.mean(np.square(x, dtype=np.float32), axis=1, keepdims=True))  # RMSNorm
    c_kv = x * gamma.astype(np.float32)
    gain[sinks] = 1.0
    c_kv *= gain.astype(np.float32)[:, None]

    # Outlier tokens: a pre-norm spike in one ordinary channel. After the norm the spike is
    # 4-10 and the token's other values shrink by the spike's share of the RMS (0.35-0.9).
    outliers = np.flatnonzero(spike_draw[:, 0] < profile.spike_rate)
    outliers = np.setdiff1d(outliers, sinks)
    d = spike_draw[outliers]
    ch = ordinary_ch[(d[:, 1] * ordinary_ch.size).astype(np.int64)]
    c_kv[outliers] *= (0.35 + 0.55 * d[:, 3]).astype(np.float32)[:, None]
    sign = np.where(c_kv[outliers, ch] < 0, -1.0, 1.0)
    c_kv[outliers, ch] = (sign * (4.0 + 6.0 * d[:, 2])).astype(np.float32)
    return c_kv, sink_ch, sinks, outliers


def _rope_amplitudes(profile: LayerProfile) -> np.ndarray:
    """Pre-rotation amplitude per frequency pair, low for high frequencies (i = 0)."""
    t = np.arange(_PAIRS, dtype=np.float64) / (_PAIRS - 1)
    return _ROPE_FLOOR * (profile.rope_peak / _ROPE_FLOOR) ** (t**2)


def _rope_keys(
    profile: LayerProfile, n: int, rng: dict[str, np.random.Generator]
) -> tuple[np.ndarray, np.ndarray]:
    """``(k_pe float64 [n, 64] rotated, shared pair directions [32, 2])``."""
    amp = _rope_amplitudes(profile)
    phase = rng["params"].uniform(0.0, 2 * np.pi, _PAIRS)
    direction = np.stack([np.cos(phase), np.sin(phase)], axis=1)  # [32, 2]
    noise = rng["rope"].standard_normal((n, _PAIRS, 2), dtype=np.float32)
    gain = np.exp(rng["rope_gain"].normal(0.0, profile.rope_token_sigma, n))
    base = (direction[None] + _ROPE_NOISE * noise) * amp[None, :, None] * gain[:, None, None]
    base = base.reshape(n, ROPE_DIM)  # interleaved pairs (2i, 2i+1)
    return rope_rotate(base, np.arange(n)), direction


def _queries(
    profile: LayerProfile,
    rng: np.random.Generator,
    c_kv: np.ndarray,
    k_pe: np.ndarray,
    sink_ch: np.ndarray,
    sinks: np.ndarray,
    num_heads: int,
    q_len: int,
    softmax_scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(q_nope [s_q, h, 512], q_pe_base [s_q, h, 64])``.

    Calibrated on the first 2048 non-sink tokens with the query at position 2048, so that the
    query does not depend on the context it is later used at.
    """
    calib = np.setdiff1d(np.arange(_CALIBRATION_TOKENS), sinks)
    cal_c = c_kv[calib].astype(np.float64)
    cal_mean = cal_c.mean(axis=0)
    cal_r = k_pe[calib].astype(np.float64)
    amp = _rope_amplitudes(profile)
    sink_val = float(np.mean(c_kv[0, sink_ch]))  # token 0 is always a sink
    q_nope = np.empty((q_len, num_heads, CONTENT_DIM))
    q_pe = np.empty((q_len, num_heads, ROPE_DIM))
    for h in range(num_heads):
        total = rng.uniform(*profile.logit_std)
        share = rng.uniform(*profile.rope_share)
        lift = rng.uniform(*profile.sink_logit)
        tilt = rng.uniform(-3.0, 3.0)  # < 0: positional head (high frequencies), > 0: semantic
        head_dir = rng.standard_normal(CONTENT_DIM)
        pair_phase = rng.uniform(0.0, 2 * np.pi, _PAIRS)
        for t in range(q_len):
            # Content: a head direction (MTP rows are related queries), std as asked.
            w = head_dir + 0.3 * rng.standard_normal(CONTENT_DIM)
            w[sink_ch] = 0.0
            w *= total * np.sqrt(1.0 - share) / (softmax_scale * np.std(cal_c @ w))
            # Sink component: logit(sink) - mean background logit = lift.
            w[sink_ch] = (lift / softmax_scale + cal_mean @ w) / (sink_val * _SINK_CHANNELS)
            q_nope[t, h] = w
            # RoPE: per-pair magnitude from the head's frequency tilt, then the std as asked.
            weight = np.exp(tilt * np.arange(_PAIRS) / (_PAIRS - 1))
            mag = weight / amp
            ang = rng.uniform(0.0, 2 * np.pi) + pair_phase
            base = np.empty(ROPE_DIM)
            base[0::2], base[1::2] = mag * np.cos(ang), mag * np.sin(ang)
            rot = rope_rotate(base[None], np.array([float(_CALIBRATION_TOKENS)]))[0]
            base *= total * np.sqrt(share) / (softmax_scale * np.std(cal_r @ rot))
            q_pe[t, h] = base
    return q_nope, q_pe


def generate_layer(
    profile: LayerProfile,
    context: int,
    num_heads: int = 16,
    *,
    seed: int = 0,
    layer_index: int = 0,
    q_len: int = 1,
    softmax_scale: float = DEFAULT_SOFTMAX_SCALE,
) -> MLAWorkload:
    """Generates one layer's decode inputs for a request of ``context`` tokens.

    Args:
      profile: the layer's statistics (e.g. one of :data:`DEFAULT_LAYERS`).
      context: tokens in the cache, ``>= q_len`` (the query's own tokens are the last ones).
      num_heads: query heads (16 = DeepSeek-V3 at TP8).
      seed: the random streams, with the profile's name: the same seed and profile give the
        same data, and a shorter context gives a prefix of a longer one.
      layer_index: the layer's position in the generated stack (a label; the cache layer).
      q_len: new tokens ``s_q`` (1 = plain decoding; 2-4 = MTP).
      softmax_scale: the attention's scale (the query is calibrated in logit units).

    Returns:
      The :class:`MLAWorkload`.
    """
    if context < max(q_len, 1):
        raise ValueError(f"context {context} < q_len {q_len}")
    rng = _streams(seed, profile)
    # At least the calibration tokens are generated, so that the query never depends on the
    # context (a short context is then exactly a prefix of a long one).
    total = max(context, _CALIBRATION_TOKENS)
    c_kv, sink_ch, sinks, outliers = _content(profile, total, rng)
    k_pe, _ = _rope_keys(profile, total, rng)
    q_nope, q_pe_base = _queries(
        profile, rng["query"], c_kv, k_pe, sink_ch, sinks, num_heads, q_len, softmax_scale
    )
    return MLAWorkload(
        profile=profile,
        layer_index=layer_index,
        seed=seed,
        c_kv=_to_bf16(c_kv[:context]),
        k_pe=_to_bf16(k_pe[:context]),
        q=_assemble_q(q_nope, q_pe_base, context),
        softmax_scale=float(softmax_scale),
        sink_tokens=sinks[sinks < context].astype(np.int64),
        outlier_tokens=outliers[outliers < context].astype(np.int64),
        q_nope=q_nope,
        q_pe_base=q_pe_base,
    )


def generate(
    context: int,
    num_heads: int = 16,
    *,
    seed: int = 0,
    layers: Sequence[LayerProfile] = DEFAULT_LAYERS,
    q_len: int = 1,
    softmax_scale: float = DEFAULT_SOFTMAX_SCALE,
) -> list[MLAWorkload]:
    """One :class:`MLAWorkload` per profile in ``layers`` (layer index = position)."""
    return [
        generate_layer(
            p,
            context,
            num_heads,
            seed=seed,
            layer_index=i,
            q_len=q_len,
            softmax_scale=softmax_scale,
        )
        for i, p in enumerate(layers)
    ]


# ---------------------------------------------------------------------------- statistics


def workload_stats(w: MLAWorkload) -> dict[str, float]:
    """Summary statistics of a workload (what the README's generator table shows).

    Keys: ``content_p50`` / ``content_p99`` / ``content_max`` (|c_kv|), ``content_token_amax_
    p01`` / ``_p99`` (per-token amax spread), ``rope_p50`` / ``rope_p99`` / ``rope_max``
    (|k_pe|), ``sinks``, ``outliers`` (counts), and from exact attention of the first query
    row per head (float64): ``sink_mass`` (mean attention on the sinks), ``eff_tokens`` (mean
    ``1 / sum p^2``), ``logit_std`` (mean std of the logits over tokens).
    """
    c = np.abs(w.c_kv.astype(np.float64))
    r = np.abs(w.k_pe.astype(np.float64))
    amax = c.max(axis=1)
    q = w.q[0, 0].astype(np.float64)  # [h, 576]
    k = np.concatenate([w.c_kv, w.k_pe], axis=1).astype(np.float64)
    z = (q @ k.T) * float(np.float32(w.softmax_scale))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return {
        "content_p50": float(np.percentile(c, 50)),
        "content_p99": float(np.percentile(c, 99)),
        "content_max": float(c.max()),
        "content_token_amax_p01": float(np.percentile(amax, 1)),
        "content_token_amax_p99": float(np.percentile(amax, 99)),
        "rope_p50": float(np.percentile(r, 50)),
        "rope_p99": float(np.percentile(r, 99)),
        "rope_max": float(r.max()),
        "sinks": float(w.sink_tokens.size),
        "outliers": float(w.outlier_tokens.size),
        "sink_mass": float(p[:, w.sink_tokens].sum(axis=1).mean()),
        "eff_tokens": float((1.0 / np.sum(p * p, axis=1)).mean()),
        "logit_std": float(z.std(axis=1).mean()),
    }
