"""NumPy model of snapmla's numerics contract v3 (see include/snapmla/snapmla.h).

This module is the executable statement of the contract on the host. It needs only NumPy and
ml_dtypes, never a GPU, and is what the test suites compare the CUDA kernels against.

Three layers:

* Quantization (bit-exact with the GPU): :func:`e4m3`, :func:`quantize_rows`,
  :func:`quantize_kv`, :func:`quantize_q`, :func:`quantize_q2`, :func:`dequantize`. All
  arithmetic that the kernels do in fp32 is done here in ``numpy.float32`` (IEEE division,
  round to nearest even), so the bytes must match the kernels' bytes exactly.
* The cache format: :func:`pack_page`, :func:`unpack_page`, :func:`write_tokens`,
  :func:`read_tokens`, :func:`gather_request`, :func:`fetch_dequant` build and read the byte
  image of a paged cache.
* Attention: :func:`decode_reference` models every step of the FP8 decode (per P block of 64
  or 128 tokens: the running max, ``P' = e * s``, the dynamic probability scale ``sigma``, FP8
  probabilities, the rescaling of equations 12 and 13) in float64 after the exact quantization
  of q and KV.
  :func:`exact_attention` is plain float64 softmax attention on unquantized inputs, the yardstick
  for end-to-end accuracy. The kernels match :func:`decode_reference` to their tier of the
  contract (v3), not bit for bit: the reference kernel accumulates in fp32 in its own order and
  is within 2e-3 (relative L2 of out; 1e-3 on lse); the tensor-core kernel (``"fast"``, and
  ``"auto"``, which runs it) accumulates on Hopper's FP8 wgmma, which is not fp32, and is within
  1e-3 on inputs whose logits every accumulator holds exactly, 2e-2 / 5e-3 on random inputs,
  and within 1.15x of this model's own error against :func:`exact_attention` per
  ``snapmla.workload`` layer (``python -m snapmla.accuracy --kernel fast`` reports it).

The two-term FP8 query (``q_precision="fp8x2"`` in ``snapmla.DecodePlan`` and the
C API's ``SNAPMLA_Q_PRECISION_FP8X2``: both kernels run it, the tensor-core one where
``q_len * num_heads <= 32``, and this model states it). A query row's content ``q_nope`` is
carried as two FP8 rows, the second at a sixteenth of the first's scale,
``q_nope ~ s1 * q_hi + s2 * q_lo``, so
that its rounding drops from about 2^-4 to about 2^-8 relative while QK stays on FP8 tensor
cores. With ``q`` the BF16 row's values as fp32 (exact) and every operation below an IEEE fp32
operation rounding to nearest even (:func:`quantize_q2` is the bit-exact statement):

* ``s1, q_hi, qr``: exactly the one-term quantization (:func:`quantize_q`):
  ``s1 = max(amax(q_nope) / 448, 2^-32)``, ``q_hi = e4m3(q_nope / s1)``,
  ``qr = bf16(q_pe / s1)``. The RoPE part gets no second term: it is BF16 already (2^-9
  relative, finer than the two-term content), and stays pre-divided by ``s1``.
* ``x = q_nope / s1`` per element, the quotient whose E4M3 rounding is ``q_hi``, and its
  rounding residual ``x - q_hi``: exact in fp32 (Sterbenz: a nonzero ``q_hi`` lies within a
  factor of 2 of ``x``; a zero one leaves ``x`` itself), and at most 16 in magnitude (half of
  E4M3's largest step, 32 in [256, 448]).
* ``s2 = s1 * 2^-4`` (:data:`Q_LO_RATIO`; exact, a power-of-two multiple) and
  ``q_lo = e4m3(16 * (x - q_hi))`` (the product is exact; one e4m3 rounding, RNE, within
  +-256 so never saturating). Each element alone: no second row maximum and no division, so
  a quantizer computes the low term from the first term's own quotients, in a shorter Q-quant
  kernel than a row scale of the residual (``max(amax(r) / 448, s1 * 2^-16)``) needs. The
  fixed ratio represents the query as well as that row scale on random rows (relative error
  6.2e-4 against 6.1e-4, half a BF16 query's) and up to ~25% worse on rows with a few large
  outliers (4.2e-4 against 3.4e-4), where the residual's maximum is smaller than 16 ``s1``.
  Scale invariance holds as in the one-term form (a power-of-two scaling of a row scales
  ``s1`` and ``s2`` and nothing else, down to ``s1``'s floor). Denormals are kept (IEEE);
  only a subnormal quotient ``x`` (an input more than ~2^135 below its row's maximum) would
  see flush-to-zero, and then only in the sign of its zero low code.
* NaN: a NaN in ``q_nope`` makes ``s1`` and ``s2`` NaN and every code of both rows NaN; an
  inf makes ``s1`` and ``s2`` inf, ``x`` 0 or NaN (``inf / inf``), so ``q_hi`` and ``q_lo``
  hold zero codes and NaN codes, and ``rho = s2 / s1`` is NaN: the row's logits are NaN as
  in the one-term form. Finite rows give finite ``s1``, ``q_hi``, ``s2`` and ``q_lo``. (NaN
  in ``q_pe`` only reaches ``qr``, as today.)
* Reconstruction: per element of a finite row, ``|q - s1*q_hi - s2*q_lo| <= 1.0001 *
  (2^-8 |q| + 2^-14 s1 + 2^-10 s2)`` (``q_hi``'s and ``q_lo``'s relative half-ulps of 2^-4
  each, their e4m3 subnormal half-steps of 2^-10, and the fp32 rounding of ``q / s1`` inside
  the 1.0001), against the one-term ``2^-4 |q| + 2^-10 s1``.

The logit then takes a second content dot product in its own fp32 accumulator (FP8 x FP8 on
the tensor cores, like the first), combined with one FFMA by the per-row ratio
``rho = fp32(s2 / s1)`` (IEEE division: ``2^-4`` exactly for every finite row) before the
existing scaling::

    acc_hi = q_hi . c8_j + qr . kr_j        (today's accumulator, scale s1)
    acc_lo = q_lo . c8_j                     (the low term's, scale s2 = s1 * rho)
    z_j    = fmaf(rho, acc_lo, acc_hi) * (s1 * softmax_scale) * s_j

which :func:`decode_reference` models in float64 with ``q_terms=2`` (the dot products and the
combination exact, ``rho`` the fp32 value); the softmax and PV are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

__all__ = [
    "CONTENT_DIM",
    "E4M3_MAX",
    "HEAD_DIM",
    "MIN_PROB_SCALE",
    "MIN_SCALE",
    "PAGE_BYTES",
    "PAGE_CONTENT_OFFSET",
    "PAGE_ROPE_OFFSET",
    "PAGE_SCALE_OFFSET",
    "PAGE_SIZE",
    "P_BLOCKS",
    "Q_LO_RATIO",
    "ROPE_DIM",
    "attend_logits",
    "decode_reference",
    "dequantize",
    "e4m3",
    "e4m3_round",
    "exact_attention",
    "fetch_dequant",
    "gather_request",
    "merge_lse",
    "pack_page",
    "q2_ratio",
    "quantize_kv",
    "quantize_q",
    "quantize_q2",
    "quantize_rows",
    "read_tokens",
    "rel_l2",
    "unpack_page",
    "visibility_limits",
    "write_tokens",
]

# ---------------------------------------------------------------------------- constants

E4M3_MAX = 448.0  # kFp8Max: largest finite float8_e4m3fn
MIN_SCALE = 2.0**-32  # kMinScale: floor of a token's (or query row's) content scale
MIN_PROB_SCALE = 2.0**-64  # kMinProbScale: floor of a block's probability scale sigma
Q_LO_RATIO = 2.0**-4  # two-term query: s2 = s1 * 2^-4 (q_lo = e4m3(16 (q / s1 - q_hi)))

PAGE_SIZE = 64
CONTENT_DIM = 512
ROPE_DIM = 64
HEAD_DIM = CONTENT_DIM + ROPE_DIM
PAGE_CONTENT_OFFSET = 0
PAGE_ROPE_OFFSET = 32768
PAGE_SCALE_OFFSET = 40960
PAGE_BYTES = 41216

FP8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16

_E4M3_EXP_MIN_QUANTUM = -9  # subnormal spacing 2^-9 (min normal 2^-6, 3 mantissa bits)
_E4M3_MANTISSA_BITS = 3
# float8 code -> float64 value, a lookup table is far faster than a ufunc cast for big arrays.
_E4M3_TABLE = np.arange(256, dtype=np.uint8).view(FP8).astype(np.float64)
_BLOCK = PAGE_SIZE  # the softmax works per 64-token block of the context
P_BLOCKS = (64, 128)  # the P blocks a kernel may choose (contract v3): tokens sharing one sigma
_CHUNK_TOKENS = 4096  # logits are computed this many tokens at a time (memory bound)


# ---------------------------------------------------------------------------- dtype helpers


def _as_dtype(x: np.ndarray, dtype: np.dtype, raw: str, cast_floats: bool) -> np.ndarray:
    """``x`` as ``dtype``: passed through, viewed from the same-size raw integers (``raw``:
    their unsigned dtype name; signed ones too), or, with ``cast_floats``, cast from any float
    array through float32 (RNE)."""
    x = np.asarray(x)
    if x.dtype == dtype:
        return x
    if x.dtype in (np.dtype(raw), np.dtype(raw[1:])):
        return x.view(dtype)
    if cast_floats and np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32).astype(dtype)
    raise TypeError(f"expected {np.dtype(dtype).name} (or raw {raw} values), got {x.dtype}")


def _as_fp8(x: np.ndarray) -> np.ndarray:
    """Views raw uint8/int8 bytes as float8_e4m3fn; passes float8_e4m3fn arrays through."""
    return _as_dtype(x, FP8, "uint8", cast_floats=False)


def _as_bf16(x: np.ndarray) -> np.ndarray:
    """Views raw uint16/int16 as bfloat16; casts any float array to bfloat16 (RNE)."""
    return _as_dtype(x, BF16, "uint16", cast_floats=True)


def _fp8_to_f64(x: np.ndarray) -> np.ndarray:
    """float8_e4m3fn (or raw bytes) -> float64, exactly."""
    return _E4M3_TABLE[_as_fp8(x).view(np.uint8)]


def _bf16_to_f32(x: np.ndarray) -> np.ndarray:
    """bfloat16 (or raw uint16 bits) -> float32, exactly (a bit shift)."""
    bits = _as_bf16(x).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32)


def _to_f64(x: np.ndarray) -> np.ndarray:
    """Any float array (bf16/fp8 views included) -> float64, exactly."""
    x = np.asarray(x)
    if x.dtype == FP8:
        return _fp8_to_f64(x)
    if x.dtype == BF16:
        return _bf16_to_f32(x).astype(np.float64)
    return x.astype(np.float64)


# ---------------------------------------------------------------------------- FP8 codec


def e4m3_round(x: np.ndarray) -> np.ndarray:
    """Rounds to the nearest float8_e4m3fn value, returned as float64 (single rounding).

    Round to nearest even, saturating to +-448 (so +-inf -> +-448); NaN stays NaN. The rounding
    is done on the exact binary value of ``x`` (float64 or narrower), not after a detour through
    float32: ml_dtypes' float64 -> float8 cast rounds twice and must not be used for this.
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        a = np.minimum(np.abs(x), E4M3_MAX)  # saturate first; NaN propagates
        _, exp = np.frexp(a)  # a = f * 2^exp, f in [0.5, 1): a in [2^(exp-1), 2^exp)
        # Spacing of e4m3 values near a: 2^(exp-1-3) in the normal range, 2^-9 below.
        quantum_exp = np.maximum(exp - 1 - _E4M3_MANTISSA_BITS, _E4M3_EXP_MIN_QUANTUM)
        r = np.ldexp(np.round(np.ldexp(a, -quantum_exp)), quantum_exp)  # np.round is RNE
    return np.copysign(r, x)


def e4m3(x: np.ndarray) -> np.ndarray:
    """fp32 (or any float) -> float8_e4m3fn, round to nearest even, saturating to +-448.

    NaN stays NaN (canonical 0x7F; the sign of a NaN is not modelled), +-inf become +-448, -0
    stays -0 (0x80). float32 (and narrower) inputs are clipped and cast by ml_dtypes, whose
    float32 -> float8 cast rounds once; wider inputs go through :func:`e4m3_round`.
    """
    x = np.asarray(x)
    if x.dtype in (np.float32, np.float16, BF16):
        with np.errstate(invalid="ignore"):
            out = np.clip(x.astype(np.float32), -E4M3_MAX, E4M3_MAX).astype(FP8)
        nan = np.isnan(x)
    else:
        r = e4m3_round(x)
        out = r.astype(FP8)  # exact: r is already representable
        nan = np.isnan(r)
    if nan.any():
        out.view(np.uint8)[nan] = 0x7F
    return out


# ---------------------------------------------------------------------------- quantization


def quantize_rows(
    x_nope: np.ndarray, x_pe: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantizes rows exactly as the contract says (one scale per row), bit-exact with the GPU.

    Args:
      x_nope: BF16 ``[..., 512]`` content (c_kv or q_nope). Raw uint16 bits are accepted.
      x_pe: BF16 ``[..., 64]`` RoPE part (k_pe or q_pe), same leading shape.

    Returns:
      ``(content, rope, scale)``: float8_e4m3fn ``[..., 512]``, bfloat16 ``[..., 64]``,
      float32 ``[...]`` where, in fp32 arithmetic,
      ``s = max(amax / 448, 2^-32)`` (NaN-propagating amax; NaN stays NaN),
      ``content = e4m3(c / s)``, ``rope = bf16(k_pe / s)``.
    """
    c = _bf16_to_f32(x_nope)
    p = _bf16_to_f32(x_pe)
    if c.shape[:-1] != p.shape[:-1]:
        raise ValueError(f"leading shapes differ: {c.shape} vs {p.shape}")
    with np.errstate(all="ignore"):
        if c.shape[-1] == 0:
            amax = np.zeros(c.shape[:-1], np.float32)
        else:
            amax = np.max(np.abs(c), axis=-1)  # np.max propagates NaN
        s = (amax.astype(np.float32) / np.float32(E4M3_MAX)).astype(np.float32)
        s = np.where(s < np.float32(MIN_SCALE), np.float32(MIN_SCALE), s).astype(np.float32)
        content = e4m3(c / s[..., None])  # fp32 division, then one e4m3 rounding
        rope = (p / s[..., None]).astype(np.float32).astype(BF16)  # fp32 division, RNE to bf16
    return content, rope, s


def quantize_kv(c_kv: np.ndarray, k_pe: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantizes key/value tokens: BF16 ``c_kv [..., 512]`` and ``k_pe [..., 64]``.

    Returns ``(content fp8 [..., 512], rope bf16 [..., 64], scale fp32 [...])``.
    """
    c_kv = _as_bf16(c_kv)
    k_pe = _as_bf16(k_pe)
    if c_kv.shape[-1] != CONTENT_DIM or k_pe.shape[-1] != ROPE_DIM:
        raise ValueError(f"expected [..., 512] and [..., 64], got {c_kv.shape}, {k_pe.shape}")
    return quantize_rows(c_kv, k_pe)


def quantize_q(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantizes query rows: BF16 ``q [..., 576]`` split into q_nope (512) | q_pe (64).

    Returns ``(q8 fp8 [..., 512], qr bf16 [..., 64], s_q fp32 [...])``, one scale per
    (token, head) row.
    """
    q = _as_bf16(q)
    if q.shape[-1] != HEAD_DIM:
        raise ValueError(f"expected q [..., 576], got {q.shape}")
    return quantize_rows(q[..., :CONTENT_DIM], q[..., CONTENT_DIM:])


def quantize_q2(
    q: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Quantizes query rows in the two-term form (see the module docstring), bit-exactly.

    Args:
      q: BF16 ``[..., 576]`` (raw uint16 bits accepted), split into q_nope (512) | q_pe (64).

    Returns:
      ``(q_hi fp8 [..., 512], qr bf16 [..., 64], s1 fp32 [...], q_lo fp8 [..., 512],
      s2 fp32 [...])``: the first three are :func:`quantize_q`'s, bit for bit; in fp32,
      ``x = q_nope / s1`` (the quotient ``q_hi`` rounds), ``s2 = s1 * 2^-4`` and
      ``q_lo = e4m3(16 * (x - q_hi))`` (both exact but the e4m3 rounding), so that
      ``q_nope ~ s1 * q_hi + s2 * q_lo`` to about 2^-8 relative.
    """
    q_hi, qr, s1 = quantize_q(q)
    qn = _bf16_to_f32(_as_bf16(q)[..., :CONTENT_DIM])
    with np.errstate(all="ignore"):
        x = (qn / s1[..., None]).astype(np.float32)  # quantize_rows' quotient, bit for bit
        r = (x - _fp8_to_f64(q_hi).astype(np.float32)).astype(np.float32)  # exact
        q_lo = e4m3(np.float32(1.0 / Q_LO_RATIO) * r)  # exact product, one e4m3 rounding
        s2 = (s1 * np.float32(Q_LO_RATIO)).astype(np.float32)
    return q_hi, qr, s1, q_lo, s2


def q2_ratio(s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """The two-term query's combination factor per row, ``rho = fp32(s2 / s1)`` (IEEE fp32
    division): the logit's content part is ``acc_hi + rho * acc_lo`` at scale ``s1``."""
    with np.errstate(all="ignore"):
        return (np.asarray(s2, np.float32) / np.asarray(s1, np.float32)).astype(np.float32)


def dequantize(
    content: np.ndarray, rope: np.ndarray, scale: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Dequantizes to BF16: ``(bf16(fp32(content) * s), bf16(fp32(rope) * s))``."""
    c = _fp8_to_f64(content).astype(np.float32)  # exact
    r = _bf16_to_f32(rope)
    s = np.asarray(scale, dtype=np.float32)[..., None]
    with np.errstate(all="ignore"):
        return (c * s).astype(np.float32).astype(BF16), (r * s).astype(np.float32).astype(BF16)


# ---------------------------------------------------------------------------- cache format


def pack_page(content: np.ndarray, rope: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Packs one page: content fp8 ``[64, 512]``, rope bf16 ``[64, 64]``, scale fp32 ``[64]``.

    Returns ``uint8 [41216]`` laid out as the header's cache format says (little-endian).
    """
    content = _as_fp8(content)
    rope = _as_bf16(rope)
    scale = np.asarray(scale, dtype=np.float32)
    if content.shape != (PAGE_SIZE, CONTENT_DIM) or rope.shape != (PAGE_SIZE, ROPE_DIM):
        raise ValueError(f"bad page shapes {content.shape}, {rope.shape}")
    if scale.shape != (PAGE_SIZE,):
        raise ValueError(f"bad scale shape {scale.shape}")
    page = np.empty(PAGE_BYTES, dtype=np.uint8)
    page[PAGE_CONTENT_OFFSET:PAGE_ROPE_OFFSET] = content.view(np.uint8).reshape(-1)
    page[PAGE_ROPE_OFFSET:PAGE_SCALE_OFFSET] = (
        rope.view(np.uint16).astype("<u2").view(np.uint8).reshape(-1)
    )
    page[PAGE_SCALE_OFFSET:] = scale.astype("<f4").view(np.uint8).reshape(-1)
    return page


def unpack_page(page: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of :func:`pack_page`: ``uint8 [41216]`` -> (content, rope, scale) copies."""
    page = np.asarray(page)
    if page.dtype != np.uint8 or page.shape != (PAGE_BYTES,):
        raise ValueError(f"expected uint8 [{PAGE_BYTES}], got {page.dtype} {page.shape}")
    content = page[PAGE_CONTENT_OFFSET:PAGE_ROPE_OFFSET].copy().view(FP8)
    rope = page[PAGE_ROPE_OFFSET:PAGE_SCALE_OFFSET].copy().view("<u2").astype(np.uint16)
    scale = page[PAGE_SCALE_OFFSET:].copy().view("<f4").astype(np.float32)
    return (
        content.reshape(PAGE_SIZE, CONTENT_DIM),
        rope.view(BF16).reshape(PAGE_SIZE, ROPE_DIM),
        scale,
    )


def _planes(
    cache: np.ndarray, num_pages: int, layer: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Writable views of one layer's planes: content/rope/scale bytes ``[num_pages, 64, k]``."""
    if cache.dtype != np.uint8 or cache.ndim != 1 or not cache.flags.c_contiguous:
        raise ValueError("cache must be a contiguous 1-D uint8 array")
    if num_pages < 1 or cache.size % (num_pages * PAGE_BYTES) != 0:
        raise ValueError(f"cache of {cache.size} bytes is not a whole number of layers")
    num_layers = cache.size // (num_pages * PAGE_BYTES)
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} outside [0, {num_layers})")
    lay = cache[layer * num_pages * PAGE_BYTES : (layer + 1) * num_pages * PAGE_BYTES]

    def plane(offset: int, row_bytes: int) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(
            lay[offset:],
            shape=(num_pages, PAGE_SIZE, row_bytes),
            strides=(PAGE_BYTES, row_bytes, 1),
            writeable=True,
        )

    return (
        plane(PAGE_CONTENT_OFFSET, CONTENT_DIM),
        plane(PAGE_ROPE_OFFSET, 2 * ROPE_DIM),
        plane(PAGE_SCALE_OFFSET, 4),
    )


def write_tokens(
    cache: np.ndarray,
    num_pages: int,
    layer: int,
    slots: np.ndarray,
    content: np.ndarray,
    rope: np.ndarray,
    scale: np.ndarray,
) -> None:
    """Writes quantized tokens into a host image of a cache, as ``snapmla_append`` would.

    Args:
      cache: ``uint8 [num_layers * num_pages * 41216]``, modified in place.
      num_pages: pages per layer.
      layer: the layer written.
      slots: int ``[n]``; token i goes to slot ``slots[i]`` (page ``slot // 64``, row
        ``slot % 64``). Negative slots and slots ``>= num_pages * 64`` are skipped.
      content, rope, scale: fp8 ``[n, 512]``, bf16 ``[n, 64]``, fp32 ``[n]`` (from
        :func:`quantize_kv`).
    """
    cplane, rplane, splane = _planes(cache, num_pages, layer)
    slots = np.asarray(slots, dtype=np.int64).reshape(-1)
    keep = (slots >= 0) & (slots < num_pages * PAGE_SIZE)
    pages, rows = slots[keep] // PAGE_SIZE, slots[keep] % PAGE_SIZE
    cplane[pages, rows] = _as_fp8(content).reshape(-1, CONTENT_DIM)[keep].view(np.uint8)
    rbytes = _as_bf16(rope).reshape(-1, ROPE_DIM)[keep].view(np.uint16).astype("<u2")
    rplane[pages, rows] = rbytes.view(np.uint8)
    sbytes = np.asarray(scale, dtype=np.float32).reshape(-1)[keep].astype("<f4")
    splane[pages, rows] = sbytes.view(np.uint8).reshape(-1, 4)


def read_tokens(
    cache: np.ndarray, num_pages: int, layer: int, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reads the quantized tokens at ``slots`` (all must be in range) from a host cache image.

    Returns ``(content fp8 [n, 512], rope bf16 [n, 64], scale fp32 [n])``.
    """
    cplane, rplane, splane = _planes(cache, num_pages, layer)
    slots = np.asarray(slots, dtype=np.int64).reshape(-1)
    if slots.size and (slots.min() < 0 or slots.max() >= num_pages * PAGE_SIZE):
        raise ValueError("read_tokens: slot out of range")
    pages, rows = slots // PAGE_SIZE, slots % PAGE_SIZE
    content = np.ascontiguousarray(cplane[pages, rows]).view(FP8)
    rope = np.ascontiguousarray(rplane[pages, rows]).view("<u2").astype(np.uint16).view(BF16)
    scale = np.ascontiguousarray(splane[pages, rows]).view("<f4").astype(np.float32)
    return content, rope, scale.reshape(-1)


def gather_request(
    cache: np.ndarray, num_pages: int, layer: int, block_table_row: np.ndarray, seqlen: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reads tokens ``0 .. seqlen-1`` of one request through its block-table row."""
    i = np.arange(int(seqlen), dtype=np.int64)
    pages = np.asarray(block_table_row, dtype=np.int64)[i // PAGE_SIZE]
    return read_tokens(cache, num_pages, layer, pages * PAGE_SIZE + i % PAGE_SIZE)


def fetch_dequant(
    cache: np.ndarray, num_pages: int, layer: int, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """What ``snapmla_fetch_dequant`` returns: BF16 ``c_kv [n, 512]``, ``k_pe [n, 64]``.

    A negative slot yields zeros; a slot ``>= num_pages * 64`` yields NaN.
    """
    slots = np.asarray(slots, dtype=np.int64).reshape(-1)
    n = slots.size
    c_kv = np.zeros((n, CONTENT_DIM), np.float32).astype(BF16)
    k_pe = np.zeros((n, ROPE_DIM), np.float32).astype(BF16)
    ok = (slots >= 0) & (slots < num_pages * PAGE_SIZE)
    c_kv[slots >= num_pages * PAGE_SIZE] = np.nan
    k_pe[slots >= num_pages * PAGE_SIZE] = np.nan
    if ok.any():
        c, r = dequantize(*read_tokens(cache, num_pages, layer, slots[ok]))
        c_kv[ok], k_pe[ok] = c, r
    return c_kv, k_pe


# ---------------------------------------------------------------------------- attention


def visibility_limits(seqlen: int, q_len: int, num_heads: int, causal: bool) -> np.ndarray:
    """Last visible token index per query row (rows ordered ``[q_len, num_heads]``).

    Row (t, head) sees token j iff ``j <= limit`` (and ``j < seqlen``); ``limit < 0`` means the
    row sees nothing. With causal masking (bottom-right aligned) ``limit = seqlen - q_len + t``.
    """
    t = np.repeat(np.arange(q_len, dtype=np.int64), num_heads)
    if causal:
        return np.minimum(seqlen - q_len + t, seqlen - 1)
    return np.full(q_len * num_heads, seqlen - 1, dtype=np.int64)


class _SoftmaxState:
    """Per-row online-softmax state of the contract: m, sigma, l, O (float64)."""

    def __init__(self, rows: int, dim: int) -> None:
        self.m = np.full(rows, -np.inf)
        self.sig = np.ones(rows)
        self.l = np.zeros(rows)  # the paper's l
        self.o = np.zeros((rows, dim))
        self.seen = np.zeros(rows, dtype=bool)

    def update(
        self,
        z: np.ndarray,
        visible: np.ndarray,
        scale: np.ndarray,
        values: np.ndarray,
        quantize_p: bool,
        pv: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> None:
        """Consumes one block: logits ``z [R, k]``, mask ``[R, k]``, token scales ``[k]``,
        values ``[k, dim]`` (FP8 content as float64, or any V). ``pv(P, values)`` computes the
        block's product (default exact, ``P @ values``; a kernel's emulation may stand in)."""
        active = visible.any(axis=1)
        if not active.any():
            return
        with np.errstate(all="ignore"):
            zb = np.where(visible, z, -np.inf)
            m_new = np.maximum(self.m, np.max(zb, axis=1))  # both propagate NaN
            e = np.where(visible, np.exp(zb - m_new[:, None]), 0.0)
            p = np.where(visible, e * scale[None, :], 0.0)  # P' = e * s (V scale fused)
            sig_new = np.max(p, axis=1) / E4M3_MAX
            sig_new = np.where(sig_new < MIN_PROB_SCALE, MIN_PROB_SCALE, sig_new)
            p = p / sig_new[:, None]
            if quantize_p:
                p = e4m3_round(p)  # P8
            g = np.exp(self.m - m_new) * self.sig / sig_new
            g = np.where(np.isneginf(self.m) & ~np.isnan(m_new), 0.0, g)  # first block: O = 0
            if not np.isfinite(values).all():  # invisible NaN slots must add exactly nothing
                values = np.where(np.isfinite(values), values, 0.0)
            l_new = self.l * g + e.sum(axis=1) / sig_new  # eq. 12
            o_new = self.o * g[:, None] + (p @ values if pv is None else pv(p, values))  # eq. 13
        # A row that sees nothing in this block keeps its state (the contract's update would
        # rescale by sigma_{k-1} / 2^-64, which cancels exactly in O / l and sigma * l).
        self.m = np.where(active, m_new, self.m)
        self.sig = np.where(active, sig_new, self.sig)
        self.l = np.where(active, l_new, self.l)
        self.o = np.where(active[:, None], o_new, self.o)
        self.seen |= active

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``(out [R, dim], lse [R])``; rows that saw nothing get out 0 and lse +inf."""
        with np.errstate(all="ignore"):
            out = self.o / self.l[:, None]
            lse = self.m + np.log(self.sig * self.l)
        out = np.where(self.seen[:, None], out, 0.0)
        lse = np.where(self.seen, lse, np.inf)
        return out, lse


def attend_logits(
    z: np.ndarray,
    scale: np.ndarray,
    values: np.ndarray,
    visible: np.ndarray | None = None,
    *,
    quantize_p: bool = True,
    block: int = _BLOCK,
    pv: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The softmax / PV half of the contract on given logits, in float64.

    Args:
      z: logits ``[R, n]`` (float64).
      scale: per-token V scale ``s_j [n]`` (fused into P' = e * s).
      values: ``[n, dim]``: the FP8 content values (V = content * s).
      visible: bool ``[R, n]``; None = all visible.
      quantize_p: round P'/sigma to FP8 (the contract) or keep it exact.
      block: tokens per softmax block (64 in the contract).
      pv: ``pv(P [R, k], values [k, dim])``, each block's P V; None is the exact product (an
        emulation of a kernel's tensor-core accumulation may stand in, bench/qgmma_precision.py).

    Returns:
      ``(out [R, dim], lse [R])``, ``out = sum_j softmax(z)_j * s_j * values_j``; rows with no
      visible token get out 0, lse +inf.
    """
    z = np.asarray(z, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if visible is None:
        visible = np.ones(z.shape, dtype=bool)
    state = _SoftmaxState(z.shape[0], values.shape[1])
    for j0 in range(0, z.shape[1], block):
        j1 = min(j0 + block, z.shape[1])
        state.update(z[:, j0:j1], visible[:, j0:j1], scale[j0:j1], values[j0:j1], quantize_p, pv)
    return state.result()


def merge_lse(outs: Sequence[np.ndarray], lses: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Merges partial results of disjoint token segments by log-sum-exp (the split-KV combine).

    ``outs[i]`` is ``[R, dim]``, ``lses[i]`` is ``[R]``; an lse of +inf marks an empty segment
    (FlashMLA's convention). Returns ``(out [R, dim], lse [R])`` with the same convention.
    """
    lse = np.stack([np.where(np.isposinf(x), -np.inf, x) for x in lses])  # [S, R]
    with np.errstate(all="ignore"):
        top = np.max(lse, axis=0)
        top_safe = np.where(np.isneginf(top), 0.0, top)
        w = np.exp(lse - top_safe[None, :])  # [S, R]
        total = w.sum(axis=0)
        out = sum(w[i][:, None] * np.asarray(o, np.float64) for i, o in enumerate(outs))
        out = out / total[:, None]
        merged = top_safe + np.log(total)
    empty = np.isneginf(top)
    return np.where(empty[:, None], 0.0, out), np.where(empty, np.inf, merged)


def _check_batch(q: np.ndarray, seqlens: Sequence[int], kv_len: Sequence[int]) -> None:
    if q.ndim != 4 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"expected q [b, s_q, h, 576], got {q.shape}")
    if len(seqlens) != q.shape[0] or len(kv_len) != q.shape[0]:
        raise ValueError("q, kv and seqlens disagree on the batch size")
    for b, (n, have) in enumerate(zip(seqlens, kv_len)):
        if not 0 <= n <= have:
            raise ValueError(f"request {b}: seqlen {n} but {have} tokens given")


def decode_reference(
    q: np.ndarray,
    kv: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    seqlens: Sequence[int],
    softmax_scale: float,
    causal: bool,
    quantize_p: bool = True,
    q_terms: int = 1,
    p_block: int = _BLOCK,
) -> tuple[np.ndarray, np.ndarray]:
    """Models snapmla_decode step by step (contract v3) in float64.

    Args:
      q: BF16 ``[b, s_q, h, 576]`` (raw uint16 bits accepted); quantized here with
        :func:`quantize_q`, bit-exactly as the kernel does (or :func:`quantize_q2`).
      kv: per request, ``(content fp8 [n, 512], rope bf16 [n, 64], scale fp32 [n])`` in token
        order with ``n >= seqlen`` (tokens past seqlen are ignored), e.g. from
        :func:`quantize_kv` or :func:`gather_request`.
      seqlens: context length per request, including the s_q new tokens.
      softmax_scale: rounded to fp32 first, as the C API takes it.
      causal: bottom-right-aligned causal mask among the s_q new tokens.
      quantize_p: False skips the FP8 rounding of P'/sigma (isolates its share of the error).
      q_terms: 1, the contract (one FP8 query row, :func:`quantize_q`); 2, the two-term FP8
        query of the module docstring (:func:`quantize_q2`; ``q_precision="fp8x2"``
        plans): ``z_j = (acc_hi + rho * acc_lo) * s1 * softmax_scale * s_j`` with
        ``rho = fp32(s2 / s1)``. The default's results are unchanged, bit for bit.
      p_block: the P block, 64 or 128 tokens from the context's start (one P' maximum, sigma
        and running-maximum step each; the last block may be shorter): the kernel's choice,
        which the contract's agreement checks take from the kernel.

    Returns:
      ``(out float64 [b, s_q, h, 512], lse float64 [b, h, s_q])``; rows with no visible token
      get out 0 and lse +inf. Non-finite visible inputs make the rows that see them NaN.
    """
    if q_terms not in (1, 2):
        raise ValueError(f"q_terms must be 1 or 2, got {q_terms!r}")
    if p_block not in P_BLOCKS:
        raise ValueError(f"p_block must be one of {P_BLOCKS}, got {p_block!r}")
    q = _as_bf16(q)
    seqlens = [int(n) for n in seqlens]
    _check_batch(q, seqlens, [len(x[2]) for x in kv])
    b, s_q, h, _ = q.shape
    rows = s_q * h
    scale = float(np.float32(softmax_scale))
    if q_terms == 2:
        q8, qr, sq, q_lo, s_lo = quantize_q2(q)
        rho = q2_ratio(sq, s_lo).astype(np.float64)
    else:
        q8, qr, sq = quantize_q(q)
    out = np.zeros((b, s_q, h, CONTENT_DIM))
    lse = np.full((b, h, s_q), np.inf)
    for r in range(b):
        n = seqlens[r]
        q8_r = _fp8_to_f64(q8[r]).reshape(rows, CONTENT_DIM)
        qr_r = _bf16_to_f32(qr[r]).astype(np.float64).reshape(rows, ROPE_DIM)
        row_scale = sq[r].astype(np.float64).reshape(rows) * scale  # s_q,i * softmax_scale
        if q_terms == 2:
            lo_r = _fp8_to_f64(q_lo[r]).reshape(rows, CONTENT_DIM)
            rho_r = rho[r].reshape(rows)
        limit = visibility_limits(n, s_q, h, causal)
        content, rope, s_tok = kv[r]
        state = _SoftmaxState(rows, CONTENT_DIM)
        for c0 in range(0, n, _CHUNK_TOKENS):
            c1 = min(c0 + _CHUNK_TOKENS, n)
            c_f = _fp8_to_f64(content[c0:c1])  # [k, 512]
            r_f = _bf16_to_f32(rope[c0:c1]).astype(np.float64)  # [k, 64]
            s_f = np.asarray(s_tok[c0:c1], dtype=np.float32).astype(np.float64)
            with np.errstate(all="ignore"):
                acc = q8_r @ c_f.T + qr_r @ r_f.T  # acc_hi
                if q_terms == 2:
                    acc = acc + rho_r[:, None] * (lo_r @ c_f.T)  # fmaf(rho, acc_lo, acc_hi)
                z = acc * row_scale[:, None] * s_f[None, :]
            vis = np.arange(c0, c1)[None, :] <= limit[:, None]
            for j0 in range(0, c1 - c0, p_block):  # c0 is a multiple of 128: blocks align
                j1 = min(j0 + p_block, c1 - c0)
                state.update(z[:, j0:j1], vis[:, j0:j1], s_f[j0:j1], c_f[j0:j1], quantize_p)
        o, ls = state.result()
        out[r] = o.reshape(s_q, h, CONTENT_DIM)
        lse[r] = ls.reshape(s_q, h).T
    return out, lse


def exact_attention(
    q: np.ndarray,
    c_kv: Sequence[np.ndarray],
    k_pe: Sequence[np.ndarray],
    seqlens: Sequence[int],
    softmax_scale: float,
    causal: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Float64 softmax attention on unquantized inputs (absorbed MLA: K = [c_kv | k_pe], V = c_kv).

    Args:
      q: ``[b, s_q, h, 576]``, BF16 or any float dtype (computed in float64).
      c_kv, k_pe: per request ``[n, 512]`` and ``[n, 64]`` (n >= seqlen), BF16 or any float.
      seqlens, softmax_scale, causal: as in :func:`decode_reference` (same masking, same fp32
        rounding of softmax_scale).

    Returns:
      ``(out float64 [b, s_q, h, 512], lse float64 [b, h, s_q])``, empty rows out 0, lse +inf.
    """
    q = np.asarray(q)
    seqlens = [int(n) for n in seqlens]
    _check_batch(q, seqlens, [len(x) for x in c_kv])
    b, s_q, h, _ = q.shape
    rows = s_q * h
    scale = float(np.float32(softmax_scale))
    out = np.zeros((b, s_q, h, CONTENT_DIM))
    lse = np.full((b, h, s_q), np.inf)
    for r in range(b):
        n = seqlens[r]
        qf = _to_f64(q[r]).reshape(rows, HEAD_DIM)
        cf = _to_f64(np.asarray(c_kv[r])[:n])
        kf = np.concatenate([cf, _to_f64(np.asarray(k_pe[r])[:n])], axis=1)
        limit = visibility_limits(n, s_q, h, causal)
        o = np.zeros((rows, CONTENT_DIM))
        ls = np.full(rows, np.inf)
        step = max(1, (1 << 24) // max(n, 1))  # rows per pass, bounds the logits' memory
        for i0 in range(0, rows, step):
            i1 = min(i0 + step, rows)
            with np.errstate(all="ignore"):
                z = (qf[i0:i1] @ kf.T) * scale
                vis = np.arange(n)[None, :] <= limit[i0:i1, None]
                z = np.where(vis, z, -np.inf)
                top = np.max(z, axis=1, initial=-np.inf)
                top_safe = np.where(np.isfinite(top), top, 0.0)
                e = np.where(vis, np.exp(z - top_safe[:, None]), 0.0)
                total = e.sum(axis=1)
                o_blk = (e @ cf) / total[:, None]
                ls_blk = top_safe + np.log(total)
            seen = vis.any(axis=1)
            o[i0:i1] = np.where(seen[:, None], o_blk, 0.0)
            ls[i0:i1] = np.where(seen, ls_blk, np.inf)
        out[r] = o.reshape(s_q, h, CONTENT_DIM)
        lse[r] = ls.reshape(s_q, h).T
    return out, lse


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """Relative L2 error ``||a - b|| / ||b||`` in float64 (0 when both are all zero)."""
    a = _to_f64(np.asarray(a))
    b = _to_f64(np.asarray(b))
    den = float(np.linalg.norm(b.ravel()))
    num = float(np.linalg.norm((a - b).ravel()))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den
