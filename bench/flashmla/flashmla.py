"""FlashMLA's sm90 decode kernels through our C shim, for bench_decode.py.

``bench/flashmla/build.sh`` builds FlashMLA's kernels and ``shim.cu`` into
``.carry/flashmla/libflashmla_shim.so`` (``$SNAPMLA_FLASHMLA_LIB`` names another path); this
module loads it with ctypes and runs two of its kernels on the benchmark's data:

- ``DenseBF16``: FlashMLA's BF16 dense decode (``flash_mla_with_kvcache`` on a
  ``[pages, 64, 1, 576]`` cache holding each token's 512 content and 64 RoPE values), on the
  benchmark's block tables and lengths, causal for ``q_len > 1``;
- ``SparseFP8``: FlashMLA's FP8 sparse decode (DeepSeek V3.2's, 64 or 128 heads) used as dense
  attention: its 656-byte cache made from the same BF16 pages (``quantize_fp8_cache``) and
  indices naming every token each query token may see (``dense_indices``).

Each class's ``prepare(torch, case, ckv, kpe, block_tables, seqlens_t, q)`` allocates what the
kernel needs, computes its schedule once, and returns ``call(i)``, which launches the decode on
block-table copy ``i % copies`` on torch's current stream (no allocation, graph-capturable) and
returns the output ``[b, s_q, h, 512]`` BF16 it writes. ``case`` needs ``batch``, ``q_len`` and
``heads``. The quantizer and the index builder are plain torch and run on the CPU too.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LIB_ENV = "SNAPMLA_FLASHMLA_LIB"
DEFAULT_LIB = os.path.join(REPO, ".carry", "flashmla", "libflashmla_shim.so")
ABI_VERSION = 1  # fm_abi_version() of the shim this module speaks to

PAGE_SIZE = 64
CONTENT_DIM = 512
ROPE_DIM = 64
HEAD_DIM = CONTENT_DIM + ROPE_DIM
SCALE_TILE = 128  # content values that share one scale
NUM_SCALES = CONTENT_DIM // SCALE_TILE
FP8_MAX = 448.0  # largest finite E4M3 value
# FlashMLA's FP8 token: bytes [0, 512) E4M3 content, [512, 528) four fp32 scales (little-endian,
# scale k for content values 128k .. 128k + 127), [528, 656) 64 BF16 RoPE values.
SCALES_OFFSET = CONTENT_DIM
ROPE_OFFSET = SCALES_OFFSET + 4 * NUM_SCALES
FP8_TOKEN_BYTES = ROPE_OFFSET + 2 * ROPE_DIM  # 656
TOPK_BLOCK = 64  # the sparse kernel's indices come in steps of 64
SPARSE_HEADS = (64, 128)


class Unavailable(RuntimeError):
    """The shim library is missing, cannot be loaded, or is not the shim this module expects."""


# ------------------------------------------------------------------------------ the library


def library_path() -> str:
    """$SNAPMLA_FLASHMLA_LIB, else .carry/flashmla/libflashmla_shim.so in the repository."""
    return os.environ.get(LIB_ENV) or DEFAULT_LIB


_P = ctypes.c_void_p
_I = ctypes.c_int
_I64 = ctypes.c_int64
_F = ctypes.c_float
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "fm_abi_version": (_I, []),
    "fm_flashmla_commit": (ctypes.c_char_p, []),
    "fm_last_error": (ctypes.c_char_p, []),
    "fm_num_sm_parts": (_I, [_I, _I, _I, ctypes.POINTER(_I)]),
    "fm_workspace_bytes": (_I, [_I, _I, _I, _I, ctypes.POINTER(_I64)]),
    "fm_dense_metadata": (_I, [_P, _I, _I, _I, _I, _P, _P]),
    # q, kcache, num_pages, block_table, its row stride, seqlens, out, lse, b, s_q, h_q,
    # softmax_scale, causal, num_sm_parts, workspace, stream
    "fm_dense_decode": (_I, [_P, _P, _I, _P, _I64, _P, _P, _P, _I, _I, _I, _F, _I, _I, _P, _P]),
    "fm_sparse_fp8_metadata": (_I, [_I, _I, _I, _I, _I, _P, _P]),
    # q, kv, num_pages, indices, topk, out, lse, b, s_q, h_q, softmax_scale, num_sm_parts,
    # workspace, stream
    "fm_sparse_fp8_decode": (_I, [_P, _P, _I, _P, _I, _P, _P, _I, _I, _I, _F, _I, _P, _P]),
}
_loaded: dict[str, ctypes.CDLL] = {}


def load(path: str | None = None) -> ctypes.CDLL:
    """The shim library at ``path`` (default ``library_path()``), its functions typed; raises
    ``Unavailable`` saying why not. Loading needs no GPU (the CUDA driver is opened at the
    first CUDA call)."""
    path = path or library_path()
    if path in _loaded:
        return _loaded[path]
    if not os.path.isfile(path):
        raise Unavailable(f"no FlashMLA shim at {path} (build it: bash bench/flashmla/build.sh)")
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise Unavailable(f"cannot load {path}: {exc}") from None
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise Unavailable(f"{path} is not the FlashMLA shim (no {name})") from None
        fn.restype, fn.argtypes = restype, argtypes
    if lib.fm_abi_version() != ABI_VERSION:
        raise Unavailable(
            f"{path}: shim ABI {lib.fm_abi_version()}, this adapter speaks {ABI_VERSION} "
            "(rebuild: bash bench/flashmla/build.sh)"
        )
    _loaded[path] = lib
    return lib


def available() -> bool:
    """Whether the shim library loads (not whether a GPU is there to run it)."""
    return unavailable_reason() is None


def unavailable_reason() -> str | None:
    """Why the shim cannot be used, or None where it loads."""
    try:
        load()
    except Unavailable as exc:
        return str(exc)
    return None


def version() -> str:
    """FlashMLA's commit the library was built from, and the library's path."""
    lib = load()
    return f"FlashMLA {lib.fm_flashmla_commit().decode()} via shim {library_path()}"


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: error {rc}: {lib.fm_last_error().decode()}")


# ------------------------------------------------------------------------------ the FP8 cache


def pow2_ceil(torch: Any, x: Any) -> Any:
    """The smallest power of two >= x (x <= 2^127), elementwise: float32 built from its bits
    (exact on any device), at least 2^-126 (a normal float); 1 where x == 0."""
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
    k = torch.where(mantissa == 0.5, exponent - 1, exponent)  # frexp(0) = (0, 0): 2^0
    k = k.clamp(-126, 127).to(torch.int32)
    return ((k + 127) << 23).view(torch.float32)  # sign 0, biased exponent k + 127, mantissa 0


def quantize_fp8_cache(torch: Any, ckv: Any, kpe: Any, chunk_pages: int = 2048) -> Any:
    """FlashMLA's FP8 cache ``[pages, 64, 656]`` uint8 from BF16 pages ``ckv [pages, 64, 512]``
    and ``kpe [pages, 64, 64]``: per token and tile of 128 content values the scale is the
    smallest power of two >= amax / 448 (the kernel rounds each scale to BF16, which a power of
    two survives exactly), the content E4M3(value / scale), the RoPE values copied as they are.
    Works in chunks of pages to bound the fp32 temporaries."""
    pages = ckv.shape[0]
    if tuple(ckv.shape[1:]) != (PAGE_SIZE, CONTENT_DIM) or tuple(kpe.shape) != (
        pages,
        PAGE_SIZE,
        ROPE_DIM,
    ):
        raise ValueError(
            f"ckv must be [pages, {PAGE_SIZE}, {CONTENT_DIM}] and kpe [pages, {PAGE_SIZE}, "
            f"{ROPE_DIM}]; got {tuple(ckv.shape)} and {tuple(kpe.shape)}"
        )
    if kpe.dtype != torch.bfloat16:
        raise ValueError(f"kpe must be bfloat16, got {kpe.dtype}")
    out = torch.empty(pages, PAGE_SIZE, FP8_TOKEN_BYTES, dtype=torch.uint8, device=ckv.device)
    for p0 in range(0, pages, chunk_pages):
        p1 = min(pages, p0 + chunk_pages)
        tokens = out[p0:p1].view(-1, FP8_TOKEN_BYTES)  # [n, 656]
        c = ckv[p0:p1].reshape(-1, NUM_SCALES, SCALE_TILE).float()  # [n, 4, 128]
        scale = pow2_ceil(torch, c.abs().amax(dim=-1) / FP8_MAX)  # [n, 4]
        e4m3 = (c / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        tokens[:, :SCALES_OFFSET] = e4m3.view(torch.uint8).reshape(-1, CONTENT_DIM)
        tokens[:, SCALES_OFFSET:ROPE_OFFSET] = scale.contiguous().view(torch.uint8)
        tokens[:, ROPE_OFFSET:] = kpe[p0:p1].reshape(-1, ROPE_DIM).contiguous().view(torch.uint8)
    return out


def dense_indices(torch: Any, block_table: Any, seqlens: Any, q_len: int, causal: bool) -> Any:
    """Indices ``[..., b, q_len, topk]`` int32 that make the sparse decode dense attention.

    ``block_table [..., b, max_pages]`` (leading dims: copies) and ``seqlens [b]``: entry ``j``
    of request ``r`` is token ``j``'s slot, ``block_table[..., r, j // 64] * 64 + j % 64``,
    for the tokens query token ``t`` sees (``j < seqlens[r]``, and with ``causal``
    ``j <= seqlens[r] - q_len + t``), else -1. ``topk`` is the longest length rounded up to a
    multiple of 64: every request walks that many (the sparse kernel has no per-request length
    in this layout)."""
    dev = block_table.device
    lens = torch.as_tensor(seqlens, device=dev).long()
    b, width = block_table.shape[-2], block_table.shape[-1]
    if lens.shape != (b,):
        raise ValueError(f"seqlens must have shape ({b},), got {tuple(lens.shape)}")
    if b == 0 or int(lens.min()) < 1:
        raise ValueError("every request needs a length >= 1")
    longest = int(lens.max())
    topk = -(-longest // TOPK_BLOCK) * TOPK_BLOCK
    if width * PAGE_SIZE < longest:
        raise ValueError(f"block_table has {width} pages a request; {longest} tokens need more")
    if int(block_table.max()) >= 2**31 // PAGE_SIZE or int(block_table.min()) < 0:
        raise ValueError("block_table pages must be in 0 .. 2^25 - 1 (slots are int32)")
    j = torch.arange(topk, device=dev)
    slots = block_table.long()[..., j // PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE  # [..., b, topk]
    t = torch.arange(q_len, device=dev)
    hidden = (q_len - 1 - t) if causal else torch.zeros_like(t)  # tokens query t may not see
    ends = lens[:, None] - hidden[None, :]  # [b, q_len]
    visible = j[None, None, :] < ends[:, :, None]  # [b, q_len, topk]
    return torch.where(visible, slots.unsqueeze(-2), -1).to(torch.int32).contiguous()


# ------------------------------------------------------------------------------ the kernels


def _stream(torch: Any) -> int:
    return torch.cuda.current_stream().cuda_stream


class _Launch:
    """``call(i)``: one decode on torch's current stream with the arguments of block-table copy
    ``i % copies``; returns the output it writes. Holds every tensor the arguments point to."""

    def __init__(
        self, torch: Any, lib: ctypes.CDLL, name: str, args: list[tuple], held: tuple, out: Any
    ) -> None:
        self.torch, self.lib, self.name = torch, lib, name
        self.fn = getattr(lib, name)
        self.args, self.held, self.out = args, held, out

    def __call__(self, i: int) -> Any:
        rc = self.fn(*self.args[i % len(self.args)], _stream(self.torch))
        _check(self.lib, rc, self.name)
        return self.out


class _Shim:
    """The loaded library and the softmax scale of a run; ``info``: the last case's schedule."""

    sparse = 0  # fm_num_sm_parts's kernel: 0 dense, 1 sparse

    def __init__(self, softmax_scale: float) -> None:
        self.lib = load()
        self.version = version()
        self.softmax_scale = float(softmax_scale)
        self.info: dict[str, Any] = {}

    def _setup(self, torch: Any, case: Any, q: Any, block_tables: Any) -> tuple:
        """Checks q and the block tables; num_sm_parts, workspace, out, lse and the tables as
        contiguous int32 ``[copies, b, max_pages]``."""
        b, s_q, h = case.batch, case.q_len, case.heads
        if tuple(q.shape) != (b, s_q, h, HEAD_DIM) or q.dtype != torch.bfloat16:
            raise ValueError(f"q must be [{b}, {s_q}, {h}, {HEAD_DIM}] bfloat16")
        if not q.is_contiguous():
            raise ValueError("q must be contiguous")
        if block_tables.dim() != 3 or block_tables.shape[1] != b:
            raise ValueError(f"block_tables must be [copies, {b}, max_pages]")
        parts, size = ctypes.c_int(), ctypes.c_int64()
        rc = self.lib.fm_num_sm_parts(self.sparse, s_q, h, ctypes.byref(parts))
        _check(self.lib, rc, "fm_num_sm_parts")
        rc = self.lib.fm_workspace_bytes(b, s_q, h, parts.value, ctypes.byref(size))
        _check(self.lib, rc, "fm_workspace_bytes")
        dev = q.device
        workspace = torch.empty(size.value, dtype=torch.uint8, device=dev)
        out = torch.empty(b, s_q, h, CONTENT_DIM, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(b, s_q, h, dtype=torch.float32, device=dev)
        tables = block_tables.to(torch.int32).contiguous()
        self.info = {"num_sm_parts": parts.value, "workspace_bytes": size.value}
        return parts.value, workspace, out, lse, tables


class DenseBF16(_Shim):
    """FlashMLA's BF16 dense decode with its combine (``flash_mla_with_kvcache``)."""

    sparse = 0

    def prepare(
        self,
        torch: Any,
        case: Any,
        ckv: Any,
        kpe: Any,
        block_tables: Any,
        seqlens_t: Any,
        q: Any,
    ) -> Callable[[int], Any]:
        """``call(i)``: the decode of ``q`` over block-table copy ``i % copies`` of the
        ``[pages, 64, 576]`` cache made from ``ckv`` and ``kpe``; causal for ``q_len > 1``."""
        b, s_q, h = case.batch, case.q_len, case.heads
        kv = torch.cat([ckv, kpe], dim=-1).contiguous()  # [pages, 64, 576]
        lens = seqlens_t.to(torch.int32).contiguous()
        parts, workspace, out, lse, tables = self._setup(torch, case, q, block_tables)
        ws = workspace.data_ptr()
        rc = self.lib.fm_dense_metadata(lens.data_ptr(), b, s_q, h, parts, ws, _stream(torch))
        _check(self.lib, rc, "fm_dense_metadata")
        head = (q.data_ptr(), kv.data_ptr(), kv.shape[0])
        tail = (lens.data_ptr(), out.data_ptr(), lse.data_ptr(), b, s_q, h)
        tail += (self.softmax_scale, int(s_q > 1), parts, ws)
        args = [(*head, t.data_ptr(), tables.stride(1), *tail) for t in tables]
        held = (q, kv, lens, workspace, lse, tables)
        return _Launch(torch, self.lib, "fm_dense_decode", args, held, out)


class SparseFP8(_Shim):
    """FlashMLA's FP8 sparse decode (V3.2 cache layout) with its combine, as dense attention."""

    sparse = 1
    heads = SPARSE_HEADS

    def prepare(
        self,
        torch: Any,
        case: Any,
        ckv: Any,
        kpe: Any,
        block_tables: Any,
        seqlens_t: Any,
        q: Any,
    ) -> Callable[[int], Any]:
        """``call(i)``: the decode of ``q`` over the 656-byte cache made from ``ckv`` and
        ``kpe``, through the indices of block-table copy ``i % copies`` (causal ones for
        ``q_len > 1``). ``info`` gets topk and the tokens the kernel walks a call."""
        b, s_q, h = case.batch, case.q_len, case.heads
        if h not in SPARSE_HEADS:
            raise ValueError(f"FlashMLA's FP8 sparse decode runs 64 or 128 heads, not {h}")
        parts, workspace, out, lse, tables = self._setup(torch, case, q, block_tables)
        indices = dense_indices(torch, tables, seqlens_t, s_q, causal=s_q > 1)
        kv = quantize_fp8_cache(torch, ckv, kpe)  # [pages, 64, 656]
        topk = indices.shape[-1]
        ws = workspace.data_ptr()
        rc = self.lib.fm_sparse_fp8_metadata(b, s_q, h, topk, parts, ws, _stream(torch))
        _check(self.lib, rc, "fm_sparse_fp8_metadata")
        self.info.update(topk=topk, tokens_walked=b * s_q * topk)
        head = (q.data_ptr(), kv.data_ptr(), kv.shape[0])
        tail = (topk, out.data_ptr(), lse.data_ptr(), b, s_q, h, self.softmax_scale, parts, ws)
        args = [(*head, x.data_ptr(), *tail) for x in indices]
        held = (q, kv, indices, workspace, lse)
        return _Launch(torch, self.lib, "fm_sparse_fp8_decode", args, held, out)
