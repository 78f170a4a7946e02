"""Helpers of the GPU tests: device arrays, random requests, poisoned paged caches, checks.

Frameworks (torch, cupy, jax) are imported lazily so that the suite collects, and skips, on a
machine without them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import ml_dtypes
import numpy as np

import snapmla
from snapmla import reference as ref

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
SM_SCALE = 192**-0.5
POISON_BYTE = 0xFF  # FP8 0xFF, BF16 0xFFFF and fp32 0xFFFFFFFF are all NaN
# Agreement with the contract's model (numerics contract v3, include/snapmla/snapmla.h).
# The reference kernel (kernel="reference"): fp32 accumulation, 2e-3 relative L2 of out and
# 1e-3 on lse against decode_reference.
REF_OUT_RTOL = 2e-3
REF_LSE_ATOL = 1e-3
# The tensor-core tier (kernel="fast", and AUTO, which runs it): FP8 wgmma does not accumulate
# in fp32, and the logit differences flip E4M3 roundings of P. On random inputs: 2e-2 relative
# L2 and 5e-3 on lse; on inputs whose logits every accumulator holds exactly: 1e-3.
FAST_OUT_RTOL = 2e-2
FAST_LSE_ATOL = 5e-3
FAST_EXACT_RTOL = 1e-3
# What a call that names no kernel (AUTO) is held to.
OUT_RTOL = FAST_OUT_RTOL
LSE_ATOL = FAST_LSE_ATOL
FRAMEWORKS = ("torch", "cupy", "jax")


# ---------------------------------------------------------------------------- frameworks


def torch_module() -> Any:
    import torch

    return torch


def cupy_module() -> Any:
    import cupy

    return cupy


def jax_module() -> Any:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    jax.config.update("jax_enable_x64", True)  # int64 slots must stay int64
    return jax


def synchronize() -> None:
    """Waits for all work on the device (torch and cupy share the legacy default stream)."""
    torch_module().cuda.synchronize()
    cupy_module().cuda.Device().synchronize()


def to_torch(a: np.ndarray) -> Any:
    """Host array (bf16 / fp8 / plain) -> new contiguous CUDA torch tensor of the same dtype."""
    torch = torch_module()
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    elif a.dtype == FP8:
        t = torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    else:
        t = torch.from_numpy(a)
    return t.to("cuda")


def to_cupy(a: np.ndarray) -> Any:
    """Host array -> CuPy array; bf16 / fp8 as ml_dtypes arrays when CuPy accepts them, else as
    the raw uint16 / uint8 bits (which snapmla accepts in their place)."""
    cupy = cupy_module()
    a = np.ascontiguousarray(a)
    if a.dtype in (BF16, FP8):
        try:
            return cupy.asarray(a)
        except (TypeError, ValueError, NotImplementedError):
            return cupy.asarray(a.view(np.uint16 if a.dtype == BF16 else np.uint8))
    return cupy.asarray(a)


def to_jax(a: np.ndarray) -> Any:
    """Host array -> JAX array on the first GPU."""
    jax = jax_module()
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        device = jax.devices("cuda")[0]
    return jax.device_put(np.ascontiguousarray(a), device)


def to_device(a: np.ndarray, framework: str) -> Any:
    """Host array -> device array of ``framework`` ("torch", "cupy" or "jax")."""
    return {"torch": to_torch, "cupy": to_cupy, "jax": to_jax}[framework](a)


def to_numpy(x: Any, dtype: Any = None) -> np.ndarray:
    """Device (torch / cupy / jax) or host array -> NumPy; ``dtype`` reinterprets raw bits
    (uint16 -> bfloat16, uint8 -> float8_e4m3fn) of frameworks without those dtypes."""
    module = type(x).__module__
    if module.startswith("torch"):
        torch = torch_module()
        x = x.detach()
        if x.dtype == torch.bfloat16:
            a = x.view(torch.int16).cpu().numpy().view(BF16)
        elif x.dtype == torch.float8_e4m3fn:
            a = x.view(torch.uint8).cpu().numpy().view(FP8)
        else:
            a = x.cpu().numpy()
    elif module.startswith("cupy"):
        a = x.get()
    else:
        a = np.asarray(x)
    if dtype is not None and a.dtype != dtype:
        a = a.view(dtype)
    return a


def nan_torch(shape: tuple[int, ...], dtype: str = "bfloat16") -> Any:
    """A CUDA torch tensor filled with NaN (an output poisoned before a call)."""
    torch = torch_module()
    return torch.full(shape, float("nan"), dtype=getattr(torch, dtype), device="cuda")


def nan_cupy(shape: tuple[int, ...], dtype: Any) -> Any:
    """A CuPy array filled with NaN; bf16 falls back to uint16 NaN bits (0x7FC0)."""
    cupy = cupy_module()
    if dtype == BF16:
        return to_cupy(np.full(shape, np.nan, np.float32).astype(BF16))
    return cupy.full(shape, np.nan, dtype=dtype)


# ---------------------------------------------------------------------------- random data


def random_bf16(
    rng: np.random.Generator, shape: tuple[int, ...], std: float = 0.5, spread: float = 0.0
) -> np.ndarray:
    """``randn * std`` in BF16; ``spread`` > 0 also scales each row (all but the last axis)
    by ``2^u``, ``u ~ U(-spread, spread)``, so that per-row scales differ."""
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    if spread:
        x *= np.exp2(rng.uniform(-spread, spread, shape[:-1] + (1,))).astype(np.float32)
    return x.astype(BF16)


def page_slots(block_table_row: np.ndarray, n: int) -> np.ndarray:
    """Slots of tokens ``0 .. n-1`` of a request through its block-table row (int64)."""
    i = np.arange(n, dtype=np.int64)
    pages = np.asarray(block_table_row, np.int64)[i // ref.PAGE_SIZE]
    return pages * ref.PAGE_SIZE + i % ref.PAGE_SIZE


@dataclasses.dataclass
class DecodeCase:
    """One decode problem: a poisoned host image of a paged cache and the queries.

    Pages are a random permutation of the layer's pages, so the pages of different requests
    interleave; slots past a request's context and spare pages hold the poison (NaN).
    ``c_kv[layer][r]`` / ``k_pe[layer][r]`` are the BF16 tokens, ``kv[layer][r]`` their
    quantization (what the cache holds).
    """

    num_layers: int
    num_pages: int
    max_pages: int
    seqlens: np.ndarray  # int32 [b]
    block_table: np.ndarray  # int32 [b, max_pages]
    image: np.ndarray  # uint8 [num_layers * num_pages * 41216]
    q: np.ndarray  # bf16 [b, s_q, h, 576]
    c_kv: list[list[np.ndarray]]
    k_pe: list[list[np.ndarray]]
    kv: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]

    @property
    def batch(self) -> int:
        return int(self.q.shape[0])

    def set_token(self, layer: int, r: int, i: int, c_kv: np.ndarray, k_pe: np.ndarray) -> None:
        """Replaces token ``i`` of request ``r`` (BF16 rows), in the kv lists and the image."""
        self.c_kv[layer][r][i] = c_kv
        self.k_pe[layer][r][i] = k_pe
        content, rope, scale = ref.quantize_kv(c_kv[None], k_pe[None])
        kv = self.kv[layer][r]
        kv[0][i], kv[1][i], kv[2][i] = content[0], rope[0], scale[0]
        slot = page_slots(self.block_table[r], i + 1)[i : i + 1]
        ref.write_tokens(self.image, self.num_pages, layer, slot, content, rope, scale)

    def reference(
        self,
        layer: int = 0,
        *,
        causal: bool = True,
        q: np.ndarray | None = None,
        seqlens: np.ndarray | None = None,
        quantize_p: bool = True,
        q_terms: int = 1,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``decode_reference`` of this case (optionally other q / seqlens; ``q_terms=2``:
        the two-term query)."""
        return ref.decode_reference(
            self.q if q is None else q,
            self.kv[layer],
            self.seqlens if seqlens is None else seqlens,
            SM_SCALE,
            causal,
            quantize_p,
            q_terms,
        )


def make_case(
    rng: np.random.Generator,
    seqlens: list[int],
    *,
    num_heads: int,
    q_len: int = 1,
    num_layers: int = 1,
    std: float = 0.5,
    spread: float = 1.0,
    spare_pages: int = 2,
    extra_columns: int = 1,
) -> DecodeCase:
    """A random decode case with a shuffled, interleaved page assignment.

    ``extra_columns`` block-table columns beyond the longest request (and the unused columns of
    shorter requests) point at spare, poisoned pages.
    """
    seqlens = np.asarray(seqlens, dtype=np.int32)
    b = len(seqlens)
    need = [math.ceil(int(n) / ref.PAGE_SIZE) for n in seqlens]
    max_pages = max(need + [1]) + extra_columns
    spare_pages = max(spare_pages, 1)
    num_pages = sum(need) + spare_pages
    perm = rng.permutation(num_pages).astype(np.int32)
    used, spare = perm[: sum(need)], perm[sum(need) :]
    block_table = rng.choice(spare, size=(b, max_pages)).astype(np.int32)
    start = 0
    for r, k in enumerate(need):
        block_table[r, :k] = used[start : start + k]
        start += k
    image = np.full(num_layers * num_pages * ref.PAGE_BYTES, POISON_BYTE, np.uint8)
    c_all, k_all, kv_all = [], [], []
    for layer in range(num_layers):
        cs, ks, kvs = [], [], []
        for r, n in enumerate(seqlens):
            c = random_bf16(rng, (int(n), ref.CONTENT_DIM), std, spread)
            k = random_bf16(rng, (int(n), ref.ROPE_DIM), std, spread)
            kv = ref.quantize_kv(c, k)
            ref.write_tokens(image, num_pages, layer, page_slots(block_table[r], int(n)), *kv)
            cs.append(c)
            ks.append(k)
            kvs.append(kv)
        c_all.append(cs)
        k_all.append(ks)
        kv_all.append(kvs)
    q = random_bf16(rng, (b, q_len, num_heads, ref.HEAD_DIM), std, spread)
    return DecodeCase(
        num_layers, num_pages, max_pages, seqlens, block_table, image, q, c_all, k_all, kv_all
    )


# ---------------------------------------------------------------------------- device objects


def make_cache(case: DecodeCase) -> Any:
    """A KVCache on a torch-owned buffer holding ``case.image``."""
    buffer = to_torch(case.image)
    return snapmla.KVCache(case.num_layers, case.num_pages, buffer=buffer)


def download(cache: Any) -> np.ndarray:
    """The cache's whole memory as host uint8 (after the work queued so far)."""
    synchronize()
    return to_numpy(cache.buffer).view(np.uint8).reshape(-1).copy()


def upload(cache: Any, image: np.ndarray) -> None:
    """Overwrites the cache's whole memory with ``image`` (uint8)."""
    buf = cache.buffer
    if type(buf).__module__.startswith("torch"):
        buf.copy_(to_torch(image).view(buf.dtype))
    else:
        buf.set(image.view(buf.dtype))
    synchronize()


def device_inputs(
    case: DecodeCase,
    framework: str = "torch",
    *,
    q: np.ndarray | None = None,
    seqlens: np.ndarray | None = None,
) -> tuple[Any, Any, Any]:
    """``(q, block_table, cache_seqlens)`` of a case on the device, in ``framework``."""
    q = case.q if q is None else q
    seqlens = case.seqlens if seqlens is None else np.asarray(seqlens, np.int32)
    return (
        to_device(q, framework),
        to_device(case.block_table, framework),
        to_device(seqlens, framework),
    )


def make_plan(case: DecodeCase, seqlens_dev: Any, num_sm_parts: int = 0, **kw: Any) -> Any:
    """A DecodePlan for the case's shape."""
    _, s_q, h, _ = case.q.shape
    return snapmla.DecodePlan(
        seqlens_dev,
        num_heads=h,
        q_len=s_q,
        max_pages=case.max_pages,
        num_sm_parts=num_sm_parts,
        **kw,
    )


def poisoned_outputs(b: int, s_q: int, h: int, out_dtype: str = "bfloat16") -> tuple[Any, Any]:
    """NaN-filled torch ``out [b, s_q, h, 512]`` (bf16, or ``out_dtype``) and
    ``lse [b, h, s_q]`` (fp32)."""
    return nan_torch((b, s_q, h, ref.CONTENT_DIM), out_dtype), nan_torch((b, h, s_q), "float32")


def run_decode(
    cache: Any,
    case: DecodeCase,
    layer: int = 0,
    *,
    causal: bool = True,
    kernel: str = "auto",
    num_sm_parts: int = 0,
    framework: str = "torch",
    q: np.ndarray | None = None,
    seqlens: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    plan: Any = None,
    q_precision: str = "fp8",
    out_dtype: str = "bfloat16",
) -> tuple[Any, Any]:
    """Plans (unless given ``plan``; ``q_precision`` is the plan's) and runs one decode into
    poisoned (NaN) torch outputs (``out`` of ``out_dtype``: "bfloat16" or "float32").

    ``q`` / ``seqlens`` / ``block_table`` override the case's. Returns ``(out, lse)`` after a
    device synchronization.
    """
    q = case.q if q is None else q
    b, s_q, h, _ = q.shape
    q_dev, bt_dev, sl_dev = device_inputs(case, framework, q=q, seqlens=seqlens)
    if block_table is not None:
        bt_dev = to_device(np.asarray(block_table, np.int32), framework)
    if plan is None:
        plan = make_plan(case, sl_dev, num_sm_parts, q_precision=q_precision)
    out, lse = poisoned_outputs(b, s_q, h, out_dtype)
    got = snapmla.decode(
        cache,
        layer,
        q_dev,
        bt_dev,
        sl_dev,
        plan,
        softmax_scale=SM_SCALE,
        causal=causal,
        out=out,
        lse=lse,
        kernel=kernel,
    )
    assert got[0] is out and got[1] is lse
    synchronize()
    return out, lse


# ---------------------------------------------------------------------------- checks


def check_decode(
    out: Any,
    lse: Any,
    want_out: np.ndarray,
    want_lse: np.ndarray,
    label: str = "",
    rtol: float = OUT_RTOL,
    lse_atol: float = LSE_ATOL,
) -> float:
    """Compares a decode result with the reference; returns the relative L2 error of out.

    Rows the reference leaves empty must be exactly 0 / +inf, NaN rows must be all NaN, and
    every other element must be finite (a NaN there means unwritten output or a leak from a
    poisoned slot), within ``rtol`` (relative L2, overall and per request) and ``lse_atol``.
    """
    o = to_numpy(out, BF16).astype(np.float64)
    ls = to_numpy(lse, np.float32).astype(np.float64)
    assert o.shape == want_out.shape and ls.shape == want_lse.shape, label
    empty_l, nan_l = np.isposinf(want_lse), np.isnan(want_lse)  # [b, h, s_q]
    empty_o, nan_o = empty_l.transpose(0, 2, 1), nan_l.transpose(0, 2, 1)  # [b, s_q, h]
    assert np.all(o[empty_o] == 0), f"{label}: empty rows must be 0"
    assert np.all(np.isposinf(ls[empty_l])), f"{label}: empty rows must have lse +inf"
    assert np.all(np.isnan(o[nan_o])), f"{label}: rows that see a NaN must be NaN"
    assert np.all(np.isnan(ls[nan_l])), f"{label}: rows that see a NaN must have lse NaN"
    ok_o, ok_l = ~(empty_o | nan_o), ~(empty_l | nan_l)
    bad_rows = np.argwhere(ok_o & ~np.isfinite(o).all(axis=-1))  # [k, (b, t, head)]
    assert bad_rows.size == 0, (
        f"{label}: {len(bad_rows)} rows with non-finite out (unwritten, or poison leaked), "
        f"(request, t, head) = {[tuple(int(v) for v in x) for x in bad_rows[:6]]}"
    )
    bad = np.argwhere(ok_l & ~np.isfinite(ls))  # [k, (b, head, t)]
    assert bad.size == 0, (
        f"{label}: {len(bad)} non-finite lse values (unwritten, or poison leaked), "
        f"(request, head, t) = {[tuple(int(v) for v in x) for x in bad[:6]]}"
    )
    if not ok_o.any():
        return 0.0
    # The contract's last step, out = bf16(O / l): the kernels round to BF16, so the model does
    # too. What remains between them is accumulation order (and the BF16 ties it flips).
    want_out = want_out.astype(BF16).astype(np.float64)
    err = ref.rel_l2(o[ok_o], want_out[ok_o])
    assert err <= rtol, f"{label}: out rel L2 {err:.3e} > {rtol:.1e}"
    for r in range(o.shape[0]):
        if ok_o[r].any():
            e_r = ref.rel_l2(o[r][ok_o[r]], want_out[r][ok_o[r]])
            assert e_r <= 2 * rtol, f"{label}: request {r}: out rel L2 {e_r:.3e}"
    lse_err = float(np.abs(ls[ok_l] - want_lse[ok_l]).max(initial=0.0))
    assert lse_err <= lse_atol, f"{label}: lse max abs error {lse_err:.3e} > {lse_atol:.1e}"
    return err


def c_decode_args(
    q: Any, block_table: Any, seqlens: Any, out: Any, lse: Any, kernel: int = 0
) -> Any:
    """A ``snapmla_decode_args_t*`` for a C-level call over torch tensors (layer 0, causal,
    SM_SCALE); the caller keeps the tensors alive."""
    from snapmla import _lib

    ffi = _lib.ffi
    return ffi.new(
        "snapmla_decode_args_t*",
        {
            "struct_size": ffi.sizeof("snapmla_decode_args_t"),
            "layer": 0,
            "causal": 1,
            "softmax_scale": SM_SCALE,
            "kernel": kernel,
            "q": ffi.cast("const void*", q.data_ptr()),
            "q_stride_batch": q.stride(0),
            "q_stride_token": q.stride(1),
            "q_stride_head": q.stride(2),
            "block_table": ffi.cast("const int32_t*", block_table.data_ptr()),
            "block_table_stride": block_table.stride(0),
            "cache_seqlens": ffi.cast("const int32_t*", seqlens.data_ptr()),
            "out": ffi.cast("void*", out.data_ptr()),
            "lse": ffi.cast("float*", lse.data_ptr()),
        },
    )


def assert_all_nan(x: Any, what: str) -> None:
    """Every element of a float output still holds NaN (the poison of an untouched output)."""
    a = to_numpy(x)
    if a.dtype in (np.uint16, np.int16):
        a = a.view(BF16)
    assert np.all(np.isnan(a.astype(np.float32))), f"{what} was written"


def describe_offset(offset: int, num_pages: int) -> str:
    """Where a byte of a cache image lives: layer, page, plane, row."""
    page_index, within = divmod(int(offset), ref.PAGE_BYTES)
    layer, page = divmod(page_index, num_pages)
    if within < ref.PAGE_ROPE_OFFSET:
        plane, row = "content", within // ref.CONTENT_DIM
    elif within < ref.PAGE_SCALE_OFFSET:
        plane, row = "rope", (within - ref.PAGE_ROPE_OFFSET) // (2 * ref.ROPE_DIM)
    else:
        plane, row = "scale", (within - ref.PAGE_SCALE_OFFSET) // 4
    return f"layer {layer} page {page} {plane} row {row} (slot {page * 64 + row})"


def assert_bytes_equal(got: np.ndarray, want: np.ndarray, num_pages: int, label: str) -> None:
    """Byte-exact comparison of two cache images, naming the first differing slots."""
    assert got.shape == want.shape, f"{label}: {got.shape} vs {want.shape}"
    diff = np.flatnonzero(got != want)
    if diff.size:
        where = "; ".join(describe_offset(o, num_pages) for o in diff[:3])
        raise AssertionError(f"{label}: {diff.size} bytes differ, first at {where}")


def bf16_round_nearest_even(x: np.ndarray) -> np.ndarray:
    """fp32 -> BF16, round to nearest even (what the kernels' BF16 stores do), written out
    on the bits: add 0x7FFF plus the kept part's lowest bit, keep the high half. Finite values
    past the largest BF16 round to +-inf; a NaN stays a NaN (its payload is not modelled)."""
    x = np.ascontiguousarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(x)] = 0x7FC0
    return rounded.view(BF16)


def assert_rounds_to(out_fp32: Any, out_bf16: Any, label: str) -> None:
    """An fp32 decode output (``out_dtype="float32"``) is what the BF16 one rounds: rounded to
    nearest even, the BF16 output bit for bit (any NaN matching any NaN)."""
    o32 = to_numpy(out_fp32)
    assert o32.dtype == np.float32, f"{label}: out is {o32.dtype}, not float32"
    assert_bf16_equal(bf16_round_nearest_even(o32), to_numpy(out_bf16, BF16), label)


def assert_bf16_equal(got: np.ndarray, want: np.ndarray, label: str) -> None:
    """Bit-exact BF16 equality, except that any NaN matches any NaN."""
    got, want = np.asarray(got).view(BF16), np.asarray(want).view(BF16)
    assert got.shape == want.shape, f"{label}: {got.shape} vs {want.shape}"
    g_nan, w_nan = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    assert np.array_equal(g_nan, w_nan), f"{label}: NaN positions differ"
    same = got.view(np.uint16)[~w_nan] == want.view(np.uint16)[~w_nan]
    assert same.all(), f"{label}: {int((~same).sum())} of {same.size} values differ"
