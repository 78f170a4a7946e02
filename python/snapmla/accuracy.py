"""``python -m snapmla.accuracy``: what snapmla's FP8 KV cache costs in accuracy, layer by layer.

The closest honest equivalent of the SnapMLA paper's appendix G (figure 5) without the paper's
models: decode inputs from :mod:`snapmla.workload` (synthetic MLA layers with the statistics of
real ones: content near zero, RoPE up to ~1e3, outlier and sink tokens, really rotated RoPE),
attended by several pipelines, each compared with exact float64 attention on the same BF16
inputs.

Configurations (``CONFIGS``). Every FP8 configuration quantizes the queries the same way (the
contract's per-(token, head) scale: FP8 ``q_nope``, BF16 ``q_pe`` pre-divided by the scale;
the query diagnostics ``ours-q-fp8x2`` and ``ours-q-bf16`` apart) and runs the same softmax /
PV pipeline as ours: per 64-token block, ``P' = e * t_j`` (``t_j`` = the token's V scale when
the scheme has one per token, else 1 with V dequantized),
``sigma = max P' / 448``, ``P8 = e4m3(P' / sigma)``, the block rescaling of the paper's
equations 12 and 13. Only the KV-cache scheme differs. Arithmetic outside the FP8 / BF16 / fp32
roundings that each scheme prescribes is float64.

* ``ours``: the numerics contract of ``snapmla.h`` (RoPE-aware per-token quantization: FP8
  content with one fp32 scale per token, ``s = amax(c_kv) / 448``; RoPE kept BF16, stored
  pre-divided by ``s``; FP8 P per 64-token block with the V scale fused). On a GPU it is the
  real kernel (``snapmla.decode``, ``kernel="auto"``), reported as ``ours``; its step-by-step
  NumPy model (``reference.decode_reference``) is ``ours-model`` and is what a CPU run reports.
  The kernel runs (``ours``, ``ours-fp8x2``) write BF16 out, or with ``--out-dtype float32``
  the fp32 values that BF16 rounds (``snapmla.decode(out_dtype="float32")``).
* ``ours-p-exact``: the contract with unquantized P (``decode_reference(quantize_p=False)``):
  the difference to ``ours-model`` is the error of the FP8 probabilities alone.
* ``ours-q-fp8x2``: the contract's KV cache and FP8 P with the two-term FP8 query
  (``reference.quantize_q2``: ``q_nope ~ s1 * q_hi + s2 * q_lo``, two FP8 rows, the second on
  the first's rounding residual at scale ``s2 = s1 / 16``; the RoPE part as in the contract),
  emulated (``decode_reference(q_terms=2)`` is its step-by-step model; the kernels' own
  two-term output is ``ours-fp8x2``). The summary compares its error with ``ours-q-bf16``
  (its target: at most 1.1x at every layer and context) and with ``ours-model``.
* ``ours-q-bf16``: the contract's KV cache and FP8 P with the BF16 query left unquantized
  (emulated): the difference to ``ours-model`` is the error of the query's FP8 rounding.
* ``bf16``: exact float64 attention on the BF16 inputs with the output rounded to BF16 (lse to
  fp32): what a BF16 kernel's output rounding alone costs; a floor, not a BF16 kernel.
* ``A``: one per-token scale over all 576 values (content and RoPE together,
  ``s = amax([c_kv | k_pe]) / 448``), RoPE in FP8 too: RoPE-unaware per-token quantization.
* ``B``: one per-tensor scale for the content (per layer and request: amax over the whole
  context), RoPE kept BF16 (unscaled).
* ``C``: per-channel content scales (one per latent channel, amax over the context), RoPE BF16.
* ``D``: per-block content scales (64 tokens x 64 channels), RoPE BF16.

Metrics per (context, layer, configuration), on the output over all heads and query rows
(float64 against exact attention): RMSE, ``1 - cosine similarity``, relative L2
(``||out - exact|| / ||exact||``), and the absolute error of the LSE (max and mean over rows).
The P share: ``p_only = ||ours-model - ours-p-exact|| / ||exact||`` is the relative error that
FP8 P adds, ``share = p_only**2 / rel_l2(ours-model)**2`` its share of the squared error; the
same for the query's rounding with ``ours-q-bf16``. (The query's and the cache's rounding
errors interact through the softmax, head by head, so the shares need not add up to 1.)
Per-row (head) relative L2 errors are kept too (median and max), since a few heads with
concentrated attention dominate the total.

B, C and D get the amax of the whole context (an oracle: a decoder sees the tokens one by
one, so a deployed per-tensor or per-channel scale is calibrated or running, and can only be
worse; D's tail block would need re-quantization or a BF16 tail buffer).

Outputs: a JSON file with the commit, date, device, mode, settings and every metric, an
optional PNG figure (error per layer and configuration at 32k, like the paper's figure 5, and
one across contexts), and printed tables. A GPU run (torch float64 on CUDA for the emulations,
the kernel through snapmla) covers 4k-128k in a few minutes; without a GPU (or with ``--cpu``)
it runs the NumPy emulation at small contexts and says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import reference as ref
from . import workload as wl

__all__ = [
    "CONFIGS",
    "FP8_CONFIGS",
    "Backend",
    "Metrics",
    "attention_fp8",
    "emulate",
    "evaluate",
    "exact",
    "main",
    "metrics",
    "quantize_kv_scheme",
    "two_term_query_ratios",
]

CONFIGS: dict[str, str] = {
    "ours": "snapmla kernel (GPU): RoPE-aware per-token FP8 KV, FP8 P per 64-token block",
    "ours-model": "the contract's NumPy model (decode_reference), FP8 P",
    "ours-p-exact": "the contract's NumPy model with unquantized P",
    "ours-q-fp8x2": "the contract with the two-term FP8 query (q_hi + q_lo, emulated)",
    "ours-fp8x2": "snapmla kernel (GPU) with the two-term FP8 query (--two-term-kernel)",
    "ours-q-bf16": "the contract with the BF16 query left unquantized (emulated diagnostic)",
    "ours-q-bf16-out": "ours-q-bf16 with its output rounded to BF16, as a BF16 out holds it",
    "bf16": "exact attention on the BF16 inputs, output rounded to BF16",
    "A": "per-token scale over content and RoPE together, RoPE in FP8",
    "B": "per-tensor content scale, RoPE BF16",
    "C": "per-channel content scales, RoPE BF16",
    "D": "per-block (64 tokens x 64 channels) content scales, RoPE BF16",
}
FP8_CONFIGS = ("ours-model", "A", "B", "C", "D")  # the KV schemes compared (plus the kernel)
ALTERNATIVES = ("A", "B", "C", "D")
METRICS = ("rmse", "cos_diff", "rel_l2", "lse_max", "lse_mean")
METRIC_LABELS = {
    "rmse": "RMSE",
    "cos_diff": "1 - cosine",
    "rel_l2": "relative L2",
    "lse_max": "LSE max |error|",
    "lse_mean": "LSE mean |error|",
}

_BLOCK = ref.PAGE_SIZE  # softmax / P-quantization block (tokens)
_D_BLOCK_CHANNELS = 64  # config D: channels per scale block
_E4M3_MAX = ref.E4M3_MAX
_MIN_SCALE = ref.MIN_SCALE

GPU_CONTEXTS = (4096, 16384, 32768, 65536, 131072)
CPU_CONTEXTS = (1024, 2048, 4096)
QUICK_CONTEXTS = (1024,)
FIGURE_CONTEXT = 32768


# ---------------------------------------------------------------------------- backends


class Backend:
    """Array operations of the emulation: NumPy (host) or torch float64 (CPU or CUDA).

    The emulation is written once against these methods; both backends round bit for bit the
    same (FP8 E4M3 round-to-nearest-even saturating, fp32, BF16), which the tests check.
    """

    def __init__(self, kind: str = "numpy", device: str = "cpu") -> None:
        """``kind``: ``"numpy"`` or ``"torch"``; ``device``: torch device (``"cuda"``)."""
        self.kind = kind
        self.device = device
        if kind == "torch":
            import torch

            self.xp: Any = torch
        elif kind == "numpy":
            self.xp = np
        else:
            raise ValueError(f"unknown backend {kind!r}")

    @property
    def name(self) -> str:
        """``numpy``, ``torch-cpu`` or ``torch-cuda``."""
        return "numpy" if self.kind == "numpy" else f"torch-{self.device}"

    def asarray(self, a: np.ndarray) -> Any:
        """Host array (any float dtype, BF16 / FP8 included) -> float64 backend array."""
        a = ref._to_f64(np.asarray(a))
        if self.kind == "numpy":
            return a
        return self.xp.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def numpy(self, x: Any) -> np.ndarray:
        """Backend array -> float64 NumPy array."""
        if self.kind == "numpy":
            return np.asarray(x, dtype=np.float64)
        return x.detach().to("cpu").double().numpy()

    def f32(self, x: Any) -> Any:
        """Rounds float64 values to fp32 (nearest even), returned as float64."""
        if self.kind == "numpy":
            return x.astype(np.float32).astype(np.float64)
        return x.float().double()

    def bf16(self, x: Any) -> Any:
        """Rounds fp32-representable float64 values to BF16 (nearest even), as float64."""
        if self.kind == "numpy":
            return ref._to_f64(x.astype(np.float32).astype(ref.BF16))
        return x.float().bfloat16().double()

    def e4m3_f32(self, x: Any) -> Any:
        """E4M3 of fp32-representable values (RNE, saturating to +-448), as float64."""
        if self.kind == "numpy":
            return ref._fp8_to_f64(ref.e4m3(x.astype(np.float32)))
        torch = self.xp
        return x.float().clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).double()

    def e4m3_round(self, x: Any) -> Any:
        """E4M3 of exact float64 values (single rounding: RNE, saturating), as float64.

        The same algorithm as ``reference.e4m3_round``: saturate, find the binade with frexp,
        round to the E4M3 quantum of that binade (2^-9 below the normal range).
        """
        if self.kind == "numpy":
            return ref.e4m3_round(x)
        torch = self.xp
        a = torch.clamp(torch.abs(x), max=_E4M3_MAX)
        _, exp = torch.frexp(a)
        quantum = torch.clamp(exp - 4, min=-9).to(torch.float64)
        r = torch.ldexp(torch.round(torch.ldexp(a, -quantum)), quantum)  # round: half to even
        return torch.copysign(r, x)

    def amax(self, x: Any, axis: int | tuple[int, ...], keepdims: bool = False) -> Any:
        """Maximum over ``axis``."""
        if self.kind == "numpy":
            return np.max(x, axis=axis, keepdims=keepdims)
        return self.xp.amax(x, dim=axis, keepdim=keepdims)

    def sum(self, x: Any, axis: int | tuple[int, ...], keepdims: bool = False) -> Any:
        """Sum over ``axis``."""
        if self.kind == "numpy":
            return np.sum(x, axis=axis, keepdims=keepdims)
        return self.xp.sum(x, dim=axis, keepdim=keepdims)

    def full(self, shape: Sequence[int], value: float) -> Any:
        """A new float64 array filled with ``value``."""
        if self.kind == "numpy":
            return np.full(tuple(shape), value, dtype=np.float64)
        return self.xp.full(tuple(shape), value, dtype=self.xp.float64, device=self.device)

    def concat(self, parts: Sequence[Any], axis: int) -> Any:
        """Concatenation along ``axis``."""
        if self.kind == "numpy":
            return np.concatenate(parts, axis=axis)
        return self.xp.cat(list(parts), dim=axis)

    def transpose(self, x: Any) -> Any:
        """Transpose of a 2-D array."""
        return x.T if self.kind == "numpy" else x.transpose(0, 1)

    def synchronize(self) -> None:
        """Waits for queued device work (timing)."""
        if self.kind == "torch" and self.device.startswith("cuda"):
            self.xp.cuda.synchronize()


def auto_backend(force_cpu: bool = False) -> Backend:
    """torch float64 on CUDA when torch sees a GPU (and not ``force_cpu``), else NumPy."""
    if force_cpu:
        return Backend("numpy")
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - torch missing or broken: NumPy does the job
        cuda = False
    return Backend("torch", "cuda") if cuda else Backend("numpy")


# ---------------------------------------------------------------------------- KV schemes


@dataclasses.dataclass
class QuantizedKV:
    """A KV cache as one scheme stores it, in float64 backend arrays.

    Attributes:
      k_content: dequantized content as K sees it ``[n, 512]``.
      k_rope: dequantized RoPE key ``[n, 64]``.
      values: what the FP8 probabilities multiply ``[n, 512]`` (the FP8 values for per-token
        schemes, the dequantized content otherwise).
      p_scale: per-token V scale fused into P (``P' = e * p_scale``) ``[n]``.
    """

    k_content: Any
    k_rope: Any
    values: Any
    p_scale: Any


def _scale(ops: Backend, amax: Any) -> Any:
    """``s = fp32(amax / 448)``, floored at 2^-32 (the contract's rule, for every scheme)."""
    return ops.f32(amax / _E4M3_MAX).clip(min=_MIN_SCALE)


def _fp8(ops: Backend, x: Any, s: Any) -> Any:
    """``e4m3(fp32(x) / s)`` with IEEE fp32 division (``x`` BF16 values, ``s`` fp32)."""
    return ops.e4m3_f32(ops.f32(x / s))


def quantize_kv_scheme(scheme: str, c_kv: Any, k_pe: Any, ops: Backend) -> QuantizedKV:
    """Quantizes a context's KV as configuration ``scheme`` does (see the module docstring).

    Args:
      scheme: ``"ours"``, ``"A"``, ``"B"``, ``"C"``, ``"D"`` or ``"exact"`` (no quantization).
      c_kv, k_pe: float64 backend arrays ``[n, 512]`` / ``[n, 64]`` holding BF16 values.
      ops: the backend.

    Returns:
      The :class:`QuantizedKV`.
    """
    xp = ops.xp
    n = c_kv.shape[0]
    ones = ops.full((n,), 1.0)
    if scheme == "exact":
        return QuantizedKV(c_kv, k_pe, c_kv, ones)
    if scheme in ("ours", "A"):
        amax = ops.amax(xp.abs(c_kv), axis=1)
        if scheme == "A":
            amax = xp.maximum(amax, ops.amax(xp.abs(k_pe), axis=1))
        s = _scale(ops, amax)
        content = _fp8(ops, c_kv, s[:, None])
        if scheme == "ours":
            rope = ops.bf16(ops.f32(k_pe / s[:, None]))  # stored RoPE: bf16(k_pe / s)
        else:
            rope = _fp8(ops, k_pe, s[:, None])
        return QuantizedKV(content * s[:, None], rope * s[:, None], content, s)
    if scheme == "B":
        s = _scale(ops, ops.amax(xp.abs(c_kv), axis=(0, 1)))
        content = _fp8(ops, c_kv, s)
        return QuantizedKV(content * s, k_pe, content, ones * s)
    if scheme == "C":
        s = _scale(ops, ops.amax(xp.abs(c_kv), axis=0))  # [512]
        deq = _fp8(ops, c_kv, s[None, :]) * s[None, :]
        return QuantizedKV(deq, k_pe, deq, ones)
    if scheme == "D":
        nb = -(-n // _BLOCK)
        pad = nb * _BLOCK - n
        c = c_kv if pad == 0 else ops.concat([c_kv, ops.full((pad, c_kv.shape[1]), 0.0)], 0)
        cb = c.reshape(nb, _BLOCK, -1, _D_BLOCK_CHANNELS)  # [blocks, 64, 8, 64]
        s = _scale(ops, ops.amax(xp.abs(cb), axis=(1, 3), keepdims=True))  # [nb, 1, 8, 1]
        deq = (_fp8(ops, cb, s) * s).reshape(nb * _BLOCK, -1)[:n]
        return QuantizedKV(deq, k_pe, deq, ones)
    raise ValueError(f"unknown KV scheme {scheme!r}")


def _quantized_queries(
    q: np.ndarray, ops: Backend, quantize: bool, q_terms: int = 1
) -> tuple[Any, Any]:
    """``(q_content [R, 512], q_rope [R, 64])``: the query rows (ordered ``[s_q, h]``)
    dequantized per the contract (``q_terms=2``: the two-term query, content
    ``s1 * (q_hi + rho * q_lo)`` with ``rho = fp32(s2 / s1)``, as the kernel would combine
    it), or as given when not ``quantize``."""
    s_q, h = q.shape[1], q.shape[2]
    rows = s_q * h
    if not quantize:
        qf = ref._to_f64(q[0]).reshape(rows, ref.HEAD_DIM)
        return ops.asarray(qf[:, : ref.CONTENT_DIM]), ops.asarray(qf[:, ref.CONTENT_DIM :])
    if q_terms == 2:
        q8, qr, sq, q_lo, s_lo = ref.quantize_q2(q[0])
        rho = ref.q2_ratio(sq, s_lo).astype(np.float64).reshape(rows, 1)
        q8f = ref._fp8_to_f64(q8).reshape(rows, ref.CONTENT_DIM)
        q8f = q8f + rho * ref._fp8_to_f64(q_lo).reshape(rows, ref.CONTENT_DIM)
    elif q_terms == 1:
        q8, qr, sq = ref.quantize_q(q[0])
        q8f = ref._fp8_to_f64(q8).reshape(rows, ref.CONTENT_DIM)
    else:
        raise ValueError(f"q_terms must be 1 or 2, got {q_terms!r}")
    sq = sq.astype(np.float64).reshape(rows, 1)
    qc = q8f * sq
    qp = ref._to_f64(qr).reshape(rows, ref.ROPE_DIM) * sq
    return ops.asarray(qc), ops.asarray(qp)


# ---------------------------------------------------------------------------- attention


def attention_fp8(
    z: Any,
    visible: Any,
    p_scale: Any,
    values: Any,
    ops: Backend,
    quantize_p: bool = True,
) -> tuple[Any, Any]:
    """The contract's softmax / PV pipeline on given logits, vectorized over blocks (float64).

    Equal to the sequential online form (``reference.attend_logits``) up to float64 rounding:
    ``P'_j / sigma_k = 448 * e^{z_j} t_j / max_{i in k} e^{z_i} t_i`` does not depend on the
    running max, and the rescaled states of equations 12-13 sum to
    ``out = sum_k (e^{M_k - Z} max_k(P') / 448) sum_j P8_j v_j / sum_j e^{z_j - Z}`` with ``M_k``
    the block's max logit and ``Z`` the row's. (The contract's floor on sigma only matters for
    blocks more than ~40 logits below the running max, whose weight is below 1e-17.)

    Args:
      z: logits ``[R, n]``; visible: bool ``[R, n]`` or None; p_scale: ``[n]`` (``t_j``);
      values: ``[n, dim]``; quantize_p: FP8 P (the contract) or exact P.

    Returns:
      ``(out [R, dim], lse [R])`` backend arrays; rows that see nothing get NaN.
    """
    xp = ops.xp
    r, n = z.shape
    nb = -(-n // _BLOCK)
    pad = nb * _BLOCK - n
    if visible is not None:
        z = xp.where(visible, z, -math.inf)
    if pad:
        z = ops.concat([z, ops.full((r, pad), -math.inf)], 1)
        p_scale = ops.concat([p_scale, ops.full((pad,), 0.0)], 0)
        values = ops.concat([values, ops.full((pad, values.shape[1]), 0.0)], 0)
    zb = z.reshape(r, nb, _BLOCK)
    m_blk = ops.amax(zb, axis=2)  # [R, nb]
    m_safe = xp.where(xp.isfinite(m_blk), m_blk, 0.0)
    e_blk = xp.exp(zb - m_safe[..., None])  # exp(-inf) = 0 for invisible / padding
    t = e_blk * p_scale.reshape(1, nb, _BLOCK)  # P' up to the block's e^{M_k}
    t_max = ops.amax(t, axis=2)  # [R, nb]
    t_safe = xp.where(t_max > 0, t_max, 1.0)
    p = t / t_safe[..., None] * _E4M3_MAX  # P' / sigma
    if quantize_p:
        p = ops.e4m3_round(p)
    top = ops.amax(m_blk, axis=1)  # [R]
    top_safe = xp.where(xp.isfinite(top), top, 0.0)
    shift = xp.exp(m_safe - top_safe[:, None])  # e^{M_k - Z}  [R, nb]
    w = shift * t_max / _E4M3_MAX  # sigma_k e^{M_k - Z}; 0 for empty blocks
    num = (p * w[..., None]).reshape(r, nb * _BLOCK) @ values  # [R, dim]
    den = ops.sum(e_blk * shift[..., None], axis=(1, 2))  # sum_j e^{z_j - Z}
    return num / den[:, None], top_safe + xp.log(den)


def _logits(qc: Any, qr: Any, kv: QuantizedKV, scale: float, ops: Backend) -> Any:
    return ((qc @ ops.transpose(kv.k_content)) + (qr @ ops.transpose(kv.k_rope))) * scale


def _visibility(n: int, s_q: int, h: int, ops: Backend) -> Any:
    """bool ``[R, n]`` of the bottom-right causal mask (None when s_q == 1: all visible)."""
    if s_q == 1:
        return None
    limit = ref.visibility_limits(n, s_q, h, causal=True)
    vis = np.arange(n)[None, :] <= limit[:, None]
    if ops.kind == "numpy":
        return vis
    return ops.xp.from_numpy(vis).to(ops.device)


def emulate(
    scheme: str,
    w: wl.MLAWorkload,
    ops: Backend,
    quantize_p: bool = True,
    kv_in: tuple[Any, Any] | None = None,
    quantize_q: bool = True,
    q_terms: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Runs one configuration's pipeline on a workload (float64 emulation).

    Args:
      scheme: a KV scheme of :func:`quantize_kv_scheme`; ``"exact"`` gives exact attention
        (unquantized queries, keys and P).
      w: the workload (batch 1, causal among its ``s_q`` rows).
      ops: the backend.
      quantize_p: FP8 P (every FP8 configuration) or exact P.
      kv_in: ``(c_kv, k_pe)`` already on the backend (float64), to save the transfer.
      quantize_q: the contract's query quantization (every FP8 configuration) or the BF16
        query as given (the ``ours-q-bf16`` diagnostic).
      q_terms: 1, the contract's FP8 query; 2, the two-term FP8 query
        (``reference.quantize_q2``, the ``ours-q-fp8x2`` configuration).

    Returns:
      ``(out float64 [1, s_q, h, 512], lse float64 [1, h, s_q])`` on the host.
    """
    c_kv, k_pe = kv_in if kv_in is not None else (ops.asarray(w.c_kv), ops.asarray(w.k_pe))
    is_exact = scheme == "exact"
    kv = quantize_kv_scheme(scheme, c_kv, k_pe, ops)
    qc, qr = _quantized_queries(w.q, ops, quantize=quantize_q and not is_exact, q_terms=q_terms)
    scale = float(np.float32(w.softmax_scale))
    z = _logits(qc, qr, kv, scale, ops)
    vis = _visibility(w.context, w.q_len, w.num_heads, ops)
    out, lse = attention_fp8(z, vis, kv.p_scale, kv.values, ops, quantize_p and not is_exact)
    s_q, h = w.q_len, w.num_heads
    out_h = ops.numpy(out).reshape(1, s_q, h, ref.CONTENT_DIM)
    lse_h = ops.numpy(lse).reshape(1, s_q, h).transpose(0, 2, 1)
    return out_h, lse_h


def exact(
    w: wl.MLAWorkload, ops: Backend, kv_in: tuple[Any, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Exact float64 attention on the workload's BF16 inputs (``emulate("exact", ...)``)."""
    return emulate("exact", w, ops, quantize_p=False, kv_in=kv_in)


# ---------------------------------------------------------------------------- metrics


@dataclasses.dataclass(frozen=True)
class Metrics:
    """Errors of one output against exact attention (see the module docstring)."""

    rmse: float
    cos_diff: float
    rel_l2: float
    lse_max: float
    lse_mean: float
    row_rel_l2_median: float
    row_rel_l2_max: float

    def as_dict(self) -> dict[str, float]:
        """The metrics by name."""
        return dataclasses.asdict(self)


def metrics(out: np.ndarray, lse: np.ndarray, ref_out: np.ndarray, ref_lse: np.ndarray) -> Metrics:
    """RMSE, 1 - cosine, relative L2 of ``out`` vs ``ref_out`` (all values flattened), the
    max / mean absolute LSE error, and the median / max relative L2 of single rows (the last
    axis is the row's 512 values)."""
    a2 = np.asarray(out, dtype=np.float64).reshape(-1, ref.CONTENT_DIM)
    b2 = np.asarray(ref_out, dtype=np.float64).reshape(-1, ref.CONTENT_DIM)
    rows = np.linalg.norm(a2 - b2, axis=1) / np.maximum(np.linalg.norm(b2, axis=1), 1e-300)
    a, b = a2.ravel(), b2.ravel()
    d = a - b
    cos = float(a @ b) / (float(np.linalg.norm(a)) * float(np.linalg.norm(b)))
    le = np.abs(np.asarray(lse, dtype=np.float64) - np.asarray(ref_lse, dtype=np.float64))
    return Metrics(
        rmse=float(np.sqrt(np.mean(d * d))),
        cos_diff=float(1.0 - cos),
        rel_l2=ref.rel_l2(a, b),
        lse_max=float(le.max()),
        lse_mean=float(le.mean()),
        row_rel_l2_median=float(np.median(rows)),
        row_rel_l2_max=float(rows.max()),
    )


# ---------------------------------------------------------------------------- the kernel


def _gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device
        return False


def _to_cupy(a: np.ndarray) -> Any:
    """Host array -> CuPy; BF16 as raw uint16 bits when CuPy refuses the dtype."""
    import cupy

    a = np.ascontiguousarray(a)
    if a.dtype == ref.BF16:
        try:
            return cupy.asarray(a)
        except (TypeError, ValueError, NotImplementedError):
            return cupy.asarray(a.view(np.uint16))
    return cupy.asarray(a)


class KernelRunner:
    """Runs snapmla's real decode kernel on workloads: one cache holds every layer's tokens at
    the longest context; shorter contexts decode its prefix (block table ``0, 1, ...``)."""

    def __init__(
        self,
        num_layers: int,
        max_context: int,
        kernel: str = "auto",
        two_term_kernel: str = "auto",
        num_sm_parts: int = 0,
        out_dtype: str = "bfloat16",
    ) -> None:
        """Allocate the cache (``num_layers`` layers of ``ceil(max_context / 64)`` pages).
        ``two_term_kernel``: the kernel of the two-term query's runs ("auto": the library's
        AUTO where it takes the two-term query, q_len * heads <= 32, else "reference";
        "reference"; or "fast", up to the same rows). ``num_sm_parts``: the plans' split count
        (0: the device's default; 1: one CTA a row tile takes the whole context, the longest
        chain of blocks a CTA's accumulators can see). ``out_dtype``: the kernel's output,
        ``"bfloat16"`` or ``"float32"`` (the values the BF16 output rounds, unrounded)."""
        import cupy

        import snapmla

        self._snapmla = snapmla
        self._cupy = cupy
        self.kernel = kernel
        self.two_term_kernel = two_term_kernel
        self.num_sm_parts = num_sm_parts
        self.out_dtype = out_dtype
        self.pages = -(-max_context // ref.PAGE_SIZE)
        self.cache = snapmla.KVCache(num_layers, self.pages)
        self.version = ".".join(str(v) for v in snapmla.version())

    def append(self, layer: int, w: wl.MLAWorkload) -> None:
        """Writes the workload's tokens ``0 .. n-1`` into ``layer`` (fused K-append)."""
        cupy = self._cupy
        slots = cupy.arange(w.context, dtype=cupy.int64)
        self.cache.append(layer, _to_cupy(w.c_kv), _to_cupy(w.k_pe), slots)

    def _two_term_kernel_for(self, w: wl.MLAWorkload) -> str:
        """The kernel of a two-term run: "auto" is the library's AUTO where it takes the
        two-term query and the reference kernel past it."""
        if self.two_term_kernel != "auto":
            return self.two_term_kernel
        from .decode import DecodeConfig, runnable_kernels

        config = DecodeConfig(1, w.q_len, w.num_heads, 1, q_precision="fp8x2")
        return "auto" if "auto" in runnable_kernels(config) else "reference"

    def decode(
        self, layer: int, w: wl.MLAWorkload, q_precision: str = "fp8"
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(out float64 [1, s_q, h, 512], lse float64 [1, h, s_q])`` of the kernel
        (``q_precision="fp8x2"``: the two-term query, on ``two_term_kernel``)."""
        cupy, snapmla = self._cupy, self._snapmla
        pages = -(-w.context // ref.PAGE_SIZE)
        block_table = cupy.arange(pages, dtype=cupy.int32).reshape(1, pages)
        seqlens = cupy.full((1,), w.context, dtype=cupy.int32)
        plan = snapmla.DecodePlan(
            seqlens, num_heads=w.num_heads, q_len=w.q_len, max_pages=pages,
            q_precision=q_precision, num_sm_parts=self.num_sm_parts,
        )
        out, lse = snapmla.decode(
            self.cache, layer, _to_cupy(w.q), block_table, seqlens, plan,
            softmax_scale=w.softmax_scale, causal=True,
            kernel=self.kernel if q_precision == "fp8" else self._two_term_kernel_for(w),
            out_dtype=self.out_dtype,
        )
        cupy.cuda.get_current_stream().synchronize()
        out_h = out.get()
        if out_h.dtype == np.uint16:  # BF16 bits (CuPy without the dtype); fp32 stays fp32
            out_h = out_h.view(ref.BF16)
        return ref._to_f64(out_h), lse.get().astype(np.float64)

    def close(self) -> None:
        """Releases the cache."""
        self.cache.close()


# ---------------------------------------------------------------------------- the study


@dataclasses.dataclass
class Settings:
    """What one run measures."""

    contexts: tuple[int, ...]
    layers: tuple[wl.LayerProfile, ...]
    heads: int = 16
    q_len: int = 1
    seed: int = 0
    softmax_scale: float = wl.DEFAULT_SOFTMAX_SCALE


def _git_commit() -> str:
    """The commit of the source tree (``SNAPMLA_COMMIT`` wins), with ``-dirty`` if modified."""
    env = os.environ.get("SNAPMLA_COMMIT")
    if env:
        return env
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
            text=True, timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "") if head else "unknown"


def _share(part: np.ndarray, total_err: float, ref_out: np.ndarray) -> tuple[float, float]:
    """``(part's relative L2, part**2 / total**2)``."""
    only = float(np.linalg.norm(part.ravel()) / np.linalg.norm(ref_out.ravel()))
    return only, (only / total_err) ** 2 if total_err > 0 else 0.0


def evaluate(
    settings: Settings,
    ops: Backend,
    kernel: KernelRunner | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Runs every configuration at every (context, layer) of ``settings``.

    Args:
      settings: contexts, layer profiles, heads, query length, seed.
      ops: the emulation backend.
      kernel: the GPU kernel runner (None: emulation only; ``ours`` is then absent).
      log: progress printer (``print`` or a no-op).

    Returns:
      ``{"results": [...], "shares": [...], "kernel_vs_model": [...], "layers": [...],
      "timing_s": {...}, "kernel_error": None or str}``, each result a dict of context,
      layer, config and the metrics. If the kernel fails, the run goes on without it (and
      without any ``ours`` result) and ``kernel_error`` says why.
    """
    kernel_error: str | None = None
    two_term_error: str | None = None

    def drop_kernel(exc: Exception) -> None:
        nonlocal kernel, kernel_error
        kernel_error = f"{type(exc).__name__}: {exc}"
        log(f"  the kernel failed ({kernel_error}); going on with emulation only")
        kernel = None
        results[:] = [r for r in results if r["config"] not in ("ours", "ours-fp8x2")]
        kernel_vs_model.clear()

    def drop_two_term(exc: Exception) -> None:
        nonlocal two_term_error
        two_term_error = f"{type(exc).__name__}: {exc}"
        log(f"  the two-term query failed in the kernel ({two_term_error}); going on without it")
        results[:] = [r for r in results if r["config"] != "ours-fp8x2"]

    results: list[dict[str, Any]] = []
    shares: list[dict[str, Any]] = []
    kernel_vs_model: list[dict[str, Any]] = []
    layer_info: list[dict[str, Any]] = []
    timing: dict[str, float] = {}
    max_ctx = max(settings.contexts)
    for li, profile in enumerate(settings.layers):
        t_layer = time.perf_counter()
        full = wl.generate_layer(
            profile, max_ctx, settings.heads, seed=settings.seed, layer_index=li,
            q_len=settings.q_len, softmax_scale=settings.softmax_scale,
        )
        stats_ctx = min(max_ctx, FIGURE_CONTEXT)
        layer_info.append({
            "index": li,
            "name": profile.name,
            "profile": dataclasses.asdict(profile),
            "stats_context": stats_ctx,
            "stats": wl.workload_stats(full.prefix(stats_ctx)),
        })
        if kernel is not None:
            try:
                kernel.append(li, full)
            except Exception as exc:  # noqa: BLE001 - report it, keep the emulation going
                drop_kernel(exc)
        c_dev, k_dev = ops.asarray(full.c_kv), ops.asarray(full.k_pe)
        kv_full = ref.quantize_kv(full.c_kv, full.k_pe)  # per token: a prefix is a prefix
        for n in settings.contexts:
            t0 = time.perf_counter()
            w = full.prefix(n)
            kv_in = (c_dev[:n], k_dev[:n])
            ex_out, ex_lse = exact(w, ops, kv_in)
            kv = tuple(x[:n] for x in kv_full)
            outs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            if kernel is not None:
                try:
                    outs["ours"] = kernel.decode(li, w)
                except Exception as exc:  # noqa: BLE001 - report it, keep the emulation going
                    drop_kernel(exc)
            if kernel is not None and two_term_error is None:
                try:
                    outs["ours-fp8x2"] = kernel.decode(li, w, q_precision="fp8x2")
                except Exception as exc:  # noqa: BLE001 - report it, keep the rest going
                    drop_two_term(exc)
            for name, qp in (("ours-model", True), ("ours-p-exact", False)):
                outs[name] = ref.decode_reference(
                    w.q, [kv], [n], w.softmax_scale, True, quantize_p=qp
                )
            outs["ours-q-fp8x2"] = emulate("ours", w, ops, kv_in=kv_in, q_terms=2)
            outs["ours-q-bf16"] = emulate("ours", w, ops, kv_in=kv_in, quantize_q=False)
            # The kernels write BF16 out (unless --out-dtype float32) and fp32 lse; the
            # emulations keep float64. The BF16 rounding alone is about 1.7e-3 relative L2
            # (the whole gap between the two-term kernel and ours-q-bf16), so the BF16
            # kernel's like-for-like diagnostic is this.
            q_out, q_lse = outs["ours-q-bf16"]
            outs["ours-q-bf16-out"] = (
                ref._to_f64(q_out.astype(np.float32).astype(ref.BF16)),
                q_lse.astype(np.float32).astype(np.float64),
            )
            outs["bf16"] = (
                ref._to_f64(ex_out.astype(np.float32).astype(ref.BF16)),
                ex_lse.astype(np.float32).astype(np.float64),
            )
            for scheme in ALTERNATIVES:
                outs[scheme] = emulate(scheme, w, ops, kv_in=kv_in)
            for name, (o, lse) in outs.items():
                m = metrics(o, lse, ex_out, ex_lse)
                results.append({
                    "context": n, "layer": li, "layer_name": profile.name, "config": name,
                    **m.as_dict(),
                })
            total = ref.rel_l2(outs["ours-model"][0], ex_out)
            p_only, p_share = _share(outs["ours-model"][0] - outs["ours-p-exact"][0], total,
                                     ex_out)
            q_only, q_share = _share(outs["ours-model"][0] - outs["ours-q-bf16"][0], total,
                                     ex_out)
            shares.append({
                "context": n, "layer": li, "layer_name": profile.name,
                "rel_l2_ours_model": total,
                "rel_l2_p_exact": ref.rel_l2(outs["ours-p-exact"][0], ex_out),
                "rel_l2_q_bf16": ref.rel_l2(outs["ours-q-bf16"][0], ex_out),
                "rel_l2_q_fp8x2": ref.rel_l2(outs["ours-q-fp8x2"][0], ex_out),
                "p_only_rel_l2": p_only, "p_share": p_share,
                "q_only_rel_l2": q_only, "q_share": q_share,
            })
            if "ours" in outs:
                kernel_vs_model.append({
                    "context": n, "layer": li,
                    "rel_l2": ref.rel_l2(outs["ours"][0], outs["ours-model"][0]),
                    "lse_max": float(np.max(np.abs(outs["ours"][1] - outs["ours-model"][1]))),
                })
            ops.synchronize()
            dt = time.perf_counter() - t0
            timing[f"{profile.name}@{n}"] = dt
            shown = ("ours" if "ours" in outs else "ours-model", *ALTERNATIVES)
            line = " ".join(
                f"{r['config']}={r['rel_l2']:.2e}" for r in results[-len(outs):]
                if r["config"] in shown
            )
            log(f"  layer {li} {profile.name:<9} ctx {n:>6}: rel L2 {line}  ({dt:.1f} s)")
        timing[f"{profile.name}"] = time.perf_counter() - t_layer
    return {
        "results": results,
        "shares": shares,
        "kernel_vs_model": kernel_vs_model,
        "layers": layer_info,
        "timing_s": timing,
        "kernel_error": kernel_error,
        "two_term_kernel_error": two_term_error,
    }


def check_claims(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's two claims, checked on ``results``.

    ``ours_lowest``: at every (context, layer), ours (the kernel when measured, else the model)
    has a lower relative L2 and RMSE than each of A, B, C and D; ``violations`` lists the
    exceptions. ``wins``: for each alternative, the (context, layer) cases ours beats it in
    relative L2, and the geometric-mean error ratio alternative / ours. ``max_rel_l2``: the
    largest relative L2 of ours; ``bound_1pct``: whether it is <= 1%.
    """
    table: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for r in results:
        table.setdefault((r["context"], r["layer"]), {})[r["config"]] = r
    violations = []
    wins = {a: {"wins": 0, "cases": 0, "log_ratio": 0.0} for a in ALTERNATIVES}
    max_err = 0.0
    for (n, li), row in sorted(table.items()):
        ours = row["ours"] if "ours" in row else row["ours-model"]
        err = ours["rel_l2"]
        max_err = max(max_err, err) if math.isfinite(err) else math.inf
        for a in ALTERNATIVES:
            alt = row[a]
            won = ours["rel_l2"] < alt["rel_l2"] and ours["rmse"] < alt["rmse"]
            wins[a]["cases"] += 1
            wins[a]["wins"] += int(won)
            ratio = alt["rel_l2"] / ours["rel_l2"] if ours["rel_l2"] > 0 else math.inf
            wins[a]["log_ratio"] += math.log(ratio) if 0 < ratio < math.inf else 0.0
            if not won:
                violations.append({
                    "context": n, "layer": li, "layer_name": ours["layer_name"],
                    "config": a, "ours_rel_l2": ours["rel_l2"], "alt_rel_l2": alt["rel_l2"],
                })
    for a in ALTERNATIVES:
        c = wins[a]
        c["ratio_geomean"] = math.exp(c.pop("log_ratio") / max(c["cases"], 1))
    return {
        "ours_lowest": not violations,
        "violations": violations,
        "wins": wins,
        "max_rel_l2": max_err,
        "bound_1pct": max_err <= 0.01,
    }


# ---------------------------------------------------------------------------- reporting


def _ctx_label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


# Diagnostics the README table and the figures leave out (the text tables show them).
_NOT_TABULATED = ("ours-p-exact", "ours-q-bf16-out")


def _configs_in(results: Sequence[dict[str, Any]]) -> list[str]:
    present = {r["config"] for r in results}
    return [c for c in CONFIGS if c in present]


def two_term_query_ratios(
    results: Sequence[dict[str, Any]], config: str = "ours-q-fp8x2"
) -> dict[str, Any] | None:
    """The two-term query's relative L2 error against exact attention over the BF16-query
    diagnostic's and over the one-term model's, per (context, layer): ``{"vs_q_bf16":
    {"max", "geomean"}, "vs_model": {"max", "geomean"}, "cases", "within_1_1x"}``
    (``within_1_1x``: the two-term query's target, ``ours-q-fp8x2 <= 1.1 * ours-q-bf16``
    everywhere); None when ``config`` was not run. ``config``: ``ours-q-fp8x2`` (the
    emulation) or ``ours-fp8x2`` (the kernel, on a GPU)."""
    by = {(r["context"], r["layer"], r["config"]): r["rel_l2"] for r in results}
    keys = sorted((c, ly) for (c, ly, cfg) in by if cfg == config)
    if not keys:
        return None

    def summary(other: str) -> dict[str, float]:
        ratios = [by[(c, ly, config)] / by[(c, ly, other)] for c, ly in keys]
        logs = [math.log(x) for x in ratios if 0 < x < math.inf]
        return {
            "max": max(ratios),
            "geomean": math.exp(sum(logs) / len(logs)) if logs else math.nan,
        }

    vs_bf16 = summary("ours-q-bf16")
    # the kernel against the diagnostic with the same BF16 output (None in older reports)
    has_out = all((c, ly, "ours-q-bf16-out") in by for c, ly in keys)
    return {
        "vs_q_bf16": vs_bf16,
        "vs_q_bf16_out": summary("ours-q-bf16-out") if has_out else None,
        "vs_model": summary("ours-model"),
        "cases": len(keys),
        "within_1_1x": vs_bf16["max"] <= 1.1,
    }


def format_tables(report: dict[str, Any]) -> str:
    """Plain-text tables: per context, relative L2 per layer and configuration, the shares of
    FP8 P and of the query rounding, and the claims."""
    results = report["results"]
    configs = _configs_in(results)
    lines = []
    by = {(r["context"], r["layer"], r["config"]): r for r in results}
    share = {(s["context"], s["layer"]): s for s in report["shares"]}
    for n in report["settings"]["contexts"]:
        lines.append(f"context {_ctx_label(n)}: relative L2 vs exact float64 attention")
        head = f"  {'layer':<10}" + "".join(f"{c:>13}" for c in configs)
        lines.append(head + f"{'P share':>9}{'q share':>9}")
        for layer in report["layers"]:
            li = layer["index"]
            cells = "".join(f"{by[(n, li, c)]['rel_l2']:>13.3e}" for c in configs)
            s = share[(n, li)]
            lines.append(f"  {layer['name']:<10}{cells}{s['p_share']:>9.1%}{s['q_share']:>9.1%}")
    claims = report["claims"]
    who = "ours (kernel)" if "ours" in configs else "ours (model)"
    lines.append("")
    lines.append(
        f"{who} below A, B, C and D at every context and layer: "
        + ("yes" if claims["ours_lowest"] else f"no ({len(claims['violations'])} exceptions)")
    )
    for a, c in claims["wins"].items():
        lines.append(
            f"  vs {a}: ours lower in {c['wins']}/{c['cases']} cases; "
            f"{a}'s error / ours (geometric mean) {c['ratio_geomean']:.2f}x"
        )
    lines.append(
        f"largest relative L2 of {who}: {claims['max_rel_l2']:.2%} "
        f"({'within' if claims['bound_1pct'] else 'above'} the 1% bound)"
    )
    q2 = two_term_query_ratios(results)
    if q2 is not None:
        b, m = q2["vs_q_bf16"], q2["vs_model"]
        lines.append(
            f"two-term FP8 query (ours-q-fp8x2) / BF16 query (ours-q-bf16): largest "
            f"{b['max']:.3f}x, geometric mean {b['geomean']:.3f}x over {q2['cases']} "
            f"(layer, context) ({'within' if q2['within_1_1x'] else 'above'} the target's 1.1x)"
        )
        lines.append(
            f"two-term FP8 query / one-term (ours-model): largest {m['max']:.3f}x, "
            f"geometric mean {m['geomean']:.3f}x"
        )
    q2k = two_term_query_ratios(results, "ours-fp8x2")
    if q2k is not None:
        b = q2k["vs_q_bf16"]
        # (a report without out_dtype: its kernels wrote BF16)
        fp32_out = report["settings"].get("out_dtype", "bfloat16") == "float32"
        output = "fp32 output, no BF16 rounding" if fp32_out else "BF16 output"
        lines.append(
            f"two-term FP8 query in the kernel (ours-fp8x2, {output}) / BF16 query: largest "
            f"{b['max']:.3f}x, geometric mean {b['geomean']:.3f}x over {q2k['cases']} "
            f"(layer, context) ({'within' if q2k['within_1_1x'] else 'above'} the target's 1.1x)"
        )
        bo = q2k.get("vs_q_bf16_out")
        if bo is not None:
            as_written = "" if fp32_out else ", as the kernel writes it"
            lines.append(
                f"  the same against the BF16 query with a BF16 output (ours-q-bf16-out"
                f"{as_written}): largest {bo['max']:.3f}x, geometric mean {bo['geomean']:.3f}x"
            )
    if report.get("two_term_kernel_error"):
        lines.append(f"two-term query in the kernel: not run ({report['two_term_kernel_error']})")
    if report.get("kernel_vs_model"):
        worst = max(k["rel_l2"] for k in report["kernel_vs_model"])
        lines.append(f"kernel vs its NumPy model: largest relative L2 {worst:.1e}")
    ratio = kernel_error_ratio(report["results"])
    if ratio is not None:
        lines.append(
            f"kernel's error / the model's, against exact attention: largest "
            f"{ratio['max']:.3f}x, geometric mean {ratio['geomean']:.3f}x over {ratio['cases']} "
            f"(layer, context) (contract v3, tensor-core tier: <= 1.15x and <= 1.05x)"
        )
    return "\n".join(lines)


def kernel_error_ratio(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The contract's accuracy check (v2, tensor-core tier): per (context, layer), the
    kernel's relative L2 error against exact attention over the model's (``ours`` over
    ``ours-model``); None when the kernel was not measured."""
    by = {(r["context"], r["layer"], r["config"]): r["rel_l2"] for r in results}
    ratios = [
        by[(c, ly, "ours")] / by[(c, ly, "ours-model")]
        for (c, ly, cfg) in by
        if cfg == "ours" and by.get((c, ly, "ours-model"), 0) > 0
    ]
    if not ratios:
        return None
    return {
        "max": max(ratios),
        "geomean": math.exp(sum(math.log(x) for x in ratios) / len(ratios)),
        "cases": len(ratios),
    }


def format_markdown(report: dict[str, Any]) -> str:
    """The README table: relative L2 (%) per layer at the figure context, and the mean over
    layers per context, with the commit and date."""
    results = report["results"]
    configs = [c for c in _configs_in(results) if c not in _NOT_TABULATED]
    by = {(r["context"], r["layer"], r["config"]): r for r in results}
    ctxs = report["settings"]["contexts"]
    fig_ctx = _figure_context(ctxs)
    settings = report["settings"]
    caption = (
        f"Relative L2 error of the attention output against exact float64 attention, in %, "
        f"{settings['heads']} heads, s_q = {settings['q_len']}, seed {settings['seed']} "
        f"({report['mode_line']}; commit `{report['commit']}`, {report['date'][:10]})."
    )
    out = [
        caption,
        "",
        f"Per layer at {_ctx_label(fig_ctx)}:",
        "",
        "| layer | " + " | ".join(configs) + " |",
        "|---|" + "---:|" * len(configs),
    ]
    for layer in report["layers"]:
        li = layer["index"]
        cells = " | ".join(f"{100 * by[(fig_ctx, li, c)]['rel_l2']:.2f}" for c in configs)
        out.append(f"| {layer['name']} | {cells} |")
    out += ["", "Mean over layers per context:", ""]
    out.append("| context | " + " | ".join(configs) + " |")
    out.append("|---|" + "---:|" * len(configs))
    for n in ctxs:
        vals = []
        for c in configs:
            errs = [by[(n, layer["index"], c)]["rel_l2"] for layer in report["layers"]]
            vals.append(f"{100 * float(np.mean(errs)):.2f}")
        out.append(f"| {_ctx_label(n)} | " + " | ".join(vals) + " |")
    return "\n".join(out) + "\n"


def _figure_context(contexts: Sequence[int]) -> int:
    at_most = [n for n in contexts if n <= FIGURE_CONTEXT]
    return max(at_most) if at_most else min(contexts)


_STYLE = {
    "ours": ("tab:red", "o", "-"),
    "ours-model": ("tab:red", "x", "--"),
    "ours-p-exact": ("tab:pink", ".", ":"),
    "ours-q-fp8x2": ("tab:olive", "*", "-."),
    "ours-fp8x2": ("tab:olive", "o", "-"),
    "ours-q-bf16": ("tab:brown", ".", ":"),
    "bf16": ("black", "s", ":"),
    "A": ("tab:blue", "^", "-"),
    "B": ("tab:orange", "v", "-"),
    "C": ("tab:green", "D", "-"),
    "D": ("tab:purple", "P", "-"),
}
_FIGURE_METRICS = ("rmse", "cos_diff", "rel_l2", "lse_mean")


def write_figures(report: dict[str, Any], path: str) -> list[str]:
    """Writes the per-layer figure at the figure context (the paper's figure 5) to ``path``
    and the across-contexts summary next to it (``*_contexts.png``); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    configs = [c for c in _configs_in(results) if c not in _NOT_TABULATED]
    by = {(r["context"], r["layer"], r["config"]): r for r in results}
    ctxs = report["settings"]["contexts"]
    fig_ctx = _figure_context(ctxs)
    names = [layer["name"] for layer in report["layers"]]
    stamp = f"{report['mode_line']} | commit {report['commit']} | {report['date'][:10]}"

    fig, axes = plt.subplots(1, len(_FIGURE_METRICS), figsize=(4.2 * len(_FIGURE_METRICS), 3.8))
    for ax, metric in zip(axes, _FIGURE_METRICS):
        for c in configs:
            color, marker, ls = _STYLE[c]
            ys = [by[(fig_ctx, layer["index"], c)][metric] for layer in report["layers"]]
            ax.plot(range(len(names)), ys, color=color, marker=marker, ls=ls, label=c)
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
        ax.set_title(METRIC_LABELS[metric])
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Layer-wise error vs exact attention, context {_ctx_label(fig_ctx)}\n{stamp}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)

    stem = Path(path)
    path2 = str(stem.with_name(stem.stem + "_contexts" + (stem.suffix or ".png")))
    fig, axes = plt.subplots(1, len(_FIGURE_METRICS), figsize=(4.2 * len(_FIGURE_METRICS), 3.8))
    for ax, metric in zip(axes, _FIGURE_METRICS):
        for c in configs:
            color, marker, ls = _STYLE[c]
            ys = [float(np.mean([by[(n, layer["index"], c)][metric]
                                 for layer in report["layers"]])) for n in ctxs]
            ax.plot(ctxs, ys, color=color, marker=marker, ls=ls, label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ctxs, [_ctx_label(n) for n in ctxs], fontsize=8)
        ax.set_title(METRIC_LABELS[metric] + " (mean over layers)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Error vs context length\n{stamp}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path2, dpi=130)
    plt.close(fig)
    return [path, path2]


# ---------------------------------------------------------------------------- CLI


def _parse_contexts(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1024 if part.endswith("k") else 1
        value = int(part.removesuffix("k")) * mult
        if value < 1:
            raise argparse.ArgumentTypeError(f"context {part!r} must be >= 1")
        out.append(value)
    if not out:
        raise argparse.ArgumentTypeError("no context given")
    return tuple(sorted(set(out)))


def _parse_layers(text: str) -> tuple[wl.LayerProfile, ...]:
    """``all``, a count ``N`` (N profiles spread over depth), or names / indices."""
    profiles = wl.DEFAULT_LAYERS
    text = text.strip()
    if text == "all":
        return profiles
    if text.isdigit() and "," not in text:
        k = int(text)
        if not 1 <= k <= len(profiles):
            raise argparse.ArgumentTypeError(f"--layers N: N in 1..{len(profiles)}")
        idx = sorted({round(i * (len(profiles) - 1) / max(k - 1, 1)) for i in range(k)})
        return tuple(profiles[i] for i in idx)
    chosen = []
    names = {p.name: p for p in profiles}
    for part in text.split(","):
        part = part.strip()
        if part in names:
            chosen.append(names[part])
        elif part.isdigit() and int(part) < len(profiles):
            chosen.append(profiles[int(part)])
        else:
            raise argparse.ArgumentTypeError(
                f"unknown layer {part!r}; names: {', '.join(names)} or indices 0-5"
            )
    return tuple(chosen)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m snapmla.accuracy",
        description="FP8 KV-cache accuracy of snapmla against exact attention, per layer "
        "and configuration (the SnapMLA paper's appendix G on synthetic MLA layers).",
    )
    p.add_argument("--contexts", type=_parse_contexts, default=None,
                   help="comma list, e.g. 4k,16k,32k (default: 4k-128k on a GPU, 1k-4k on CPU)")
    p.add_argument("--layers", type=_parse_layers, default=None,
                   help="'all', a count N, or names/indices of the profiles "
                   "(default: all 6 on a GPU, 4 on CPU)")
    p.add_argument("--heads", type=int, default=16, help="query heads (16 = TP8)")
    p.add_argument("--q-len", type=int, default=1, help="query tokens s_q (1-4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument("--figure", default=None,
                   help="write the per-layer PNG here (and *_contexts.png beside it)")
    p.add_argument("--markdown", default=None, help="write the README table here")
    p.add_argument("--cpu", action="store_true", help="emulation only, even with a GPU")
    p.add_argument("--backend", choices=("auto", "numpy", "torch"), default="auto",
                   help="emulation arrays: auto = torch float64 on CUDA if available")
    p.add_argument("--quick", action="store_true", help="smoke run: 1k, 2 layers, 8 heads")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--kernel", choices=("auto", "reference", "fast"), default="auto",
                   help="the decode kernel measured as 'ours' (default auto)")
    p.add_argument("--two-term-kernel", choices=("auto", "reference", "fast"), default="auto",
                   help="the decode kernel of 'ours-fp8x2' (auto: the library's AUTO where "
                   "q_len x heads <= 32, else reference; fast: only where q_len x heads <= 32)")
    p.add_argument("--out-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="the kernel runs' output (ours, ours-fp8x2): bfloat16, as served, or "
                   "float32, the values BF16 rounds (the two-term query's precision, compared "
                   "with the float64 ours-q-bf16 without the BF16 rounding)")
    p.add_argument("--num-sm-parts", type=int, default=0,
                   help="the kernel's split count (0: the device's default; 1: one CTA takes a "
                   "whole context)")
    args = p.parse_args(argv)
    if not 1 <= args.heads <= 128:
        p.error("--heads must be in 1..128")
    if not 1 <= args.q_len <= 4:
        p.error("--q-len must be in 1..4")
    if args.num_sm_parts < 0:
        p.error("--num-sm-parts must be >= 0")
    return args


def _device_name(gpu: bool) -> str:
    if gpu:
        try:
            import cupy

            return str(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
        except Exception as exc:  # noqa: BLE001 - a name is not worth failing for
            return f"CUDA device 0 (name unavailable: {exc})"
    import platform

    return f"CPU ({platform.processor() or platform.machine()})"


def _library_error() -> str | None:
    """None when snapmla's shared library loads, else why not."""
    try:
        import snapmla

        snapmla.version()
    except Exception as exc:  # noqa: BLE001 - reported, the run falls back to emulation
        return f"{type(exc).__name__}: {exc}"
    return None


def _backend(choice: str, force_cpu: bool) -> Backend:
    if choice == "numpy":
        return Backend("numpy")
    if choice == "torch":
        import torch

        return Backend("torch", "cuda" if not force_cpu and torch.cuda.is_available() else "cpu")
    return auto_backend(force_cpu=force_cpu)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: runs the study, prints the tables, writes what was asked.

    Returns 0 when the study ran (also when a claim does not hold: the report says so), 2 on
    bad arguments.
    """
    args = _parse(argv)
    log = (lambda *a, **k: None) if args.quiet else print
    gpu = not args.cpu and _gpu_present()
    library_error = _library_error() if gpu else None
    ops = _backend(args.backend, force_cpu=args.cpu)
    if args.quick:
        contexts = args.contexts or QUICK_CONTEXTS
        layers = args.layers or _parse_layers("2")
        heads = 8
    else:
        contexts = args.contexts or (GPU_CONTEXTS if gpu else CPU_CONTEXTS)
        layers = args.layers or (wl.DEFAULT_LAYERS if gpu else _parse_layers("4"))
        heads = args.heads
    if min(contexts) < args.q_len:
        print(f"error: contexts must be >= --q-len {args.q_len}", file=sys.stderr)
        return 2
    settings = Settings(tuple(contexts), tuple(layers), heads, args.q_len, args.seed)

    kernel = None
    kernel_error = library_error
    if gpu and library_error is None:
        try:
            kernel = KernelRunner(
                len(layers), max(contexts), kernel=args.kernel,
                two_term_kernel=args.two_term_kernel, num_sm_parts=args.num_sm_parts,
                out_dtype=args.out_dtype,
            )
        except Exception as exc:  # noqa: BLE001 - reported, the run falls back to emulation
            kernel_error = f"{type(exc).__name__}: {exc}"
    device = _device_name(gpu)
    if kernel is not None:
        log(f"GPU: kernel measured ({device}, snapmla {kernel.version}); emulations on "
            f"{ops.name}")
    else:
        log(f"{'GPU: kernel not run' if gpu else 'CPU'}: emulation only ({device}; "
            f"{ops.name})" + (f"; {kernel_error}" if kernel_error else ""))
    log(f"contexts {', '.join(_ctx_label(n) for n in contexts)}; layers "
        f"{', '.join(p.name for p in layers)}; {heads} heads; s_q {args.q_len}; seed {args.seed}")

    t0 = time.perf_counter()
    try:
        study = evaluate(settings, ops, kernel, log)
    finally:
        if kernel is not None:
            kernel.close()
    elapsed = time.perf_counter() - t0
    measured = kernel is not None and study["kernel_error"] is None
    kernel_error = study["kernel_error"] or kernel_error
    if measured:
        mode, mode_line = "gpu", "GPU: kernel measured"
    elif gpu:
        mode, mode_line = "gpu-emulation", "GPU: kernel not run, emulation only"
    else:
        mode, mode_line = "cpu", "CPU: emulation only"
    report: dict[str, Any] = {
        "tool": "snapmla.accuracy",
        "format": 1,
        "commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": mode,
        "mode_line": mode_line,
        "device": device,
        "backend": ops.name,
        "kernel": {"name": args.kernel, "two_term": args.two_term_kernel, "library": kernel.version,
                   "num_sm_parts": args.num_sm_parts}
        if measured
        else None,
        "kernel_error": kernel_error,
        "settings": {
            "contexts": list(contexts),
            "layers": [p.name for p in layers],
            "heads": heads,
            "q_len": args.q_len,
            "seed": args.seed,
            "batch": 1,
            "softmax_scale": settings.softmax_scale,
            "rope": {"dim": wl.ROPE_DIM, "base": wl.ROPE_BASE, "interleaved": True},
            "out_dtype": args.out_dtype,  # the kernel runs' output (ours, ours-fp8x2)
        },
        "configs": {c: CONFIGS[c] for c in CONFIGS if c != "ours" or measured},
        **{k: v for k, v in study.items() if k != "kernel_error"},
        "elapsed_s": elapsed,
    }
    report["claims"] = check_claims(report["results"])
    report["two_term_query"] = two_term_query_ratios(report["results"])
    report["two_term_query_kernel"] = two_term_query_ratios(report["results"], "ours-fp8x2")
    report["two_term_kernel_error"] = study.get("two_term_kernel_error")
    log("")
    print(format_tables(report))
    print(f"{mode_line}; {elapsed:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        log(f"wrote {args.out}")
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(report))
        log(f"wrote {args.markdown}")
    if args.figure:
        try:
            paths = write_figures(report, args.figure)
        except ImportError:
            print("matplotlib is not installed: no figure written", file=sys.stderr)
        else:
            log("wrote " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
