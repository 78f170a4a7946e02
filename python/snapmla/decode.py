"""Decode attention: ``DecodePlan`` (the split-KV schedule of one step) and ``decode``."""

from __future__ import annotations

import functools
import math
import numbers
import struct
import types
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import _lib
from ._args import (
    KERNELS,
    OUT_DTYPES,
    Q_PRECISIONS,
    check_batch,
    check_config,
    check_int,
    decode_config,
    kernel_code,
    pack_decode_args,
    q_precision_code,
)
from ._dlpack import TensorView
from ._errors import SnapMLAError, argument_error
from ._lib import CONTENT_DIM, HEAD_DIM, MAX_HEADS, ROPE_DIM
from ._lib import CTYPES as _CT
from ._tensor import (
    BF16,
    FP32,
    INT32,
    Checker,
    Closable,
    InUse,
    OwnedMemory,
    Stream,
    empty,
    extent,
    on_device,
    read_only,
    remember,
)
from .cache import Extent, KVCache, layer_extent

__all__ = ["KERNELS", "DecodeConfig", "DecodePlan", "decode", "runnable_kernels", "select_kernel"]

# decode(out_dtype=...) names -> the dtypes of ``out`` each takes (BF16 also as raw uint16 bits).
_OUT_DTYPE_NAMES = {"bfloat16": BF16, "float32": FP32, None: (*BF16, *FP32)}
# snapmla_decode_kernel_t of the kernel that runs -> its name.
_KERNEL_NAMES = {1: "reference", 2: "fast"}

OUT_ALIGNMENT = 16  # the combine kernel's 16-byte stores
# Calls kept in a cache's decode memo (_decode); cleared when full. A serving step calls each
# layer with the same tensors, so a few entries per layer and batch size are in use.
_DECODE_MEMO_SIZE = 1024
# DecodePlan.update's call memo: cache_seqlens's C pointer by (batch size, device, key), for
# the tensors that passed its checks; they depend on nothing else. Cleared when full.
_update_memo: dict[Any, Any] = {}
_UPDATE_MEMO_SIZE = 1024


def _plan_buffers(plan: DecodePlan) -> tuple[Any, Any, Any]:
    """The plan's buffers as the C calls take them (``const void*`` plan, ``void*`` workspace,
    ``void*`` plan), cast once per plan and kept (re-cast if the addresses changed)."""
    cached = plan.__dict__.get("_c_buffers")
    ptrs = (plan._plan_ptr, plan._workspace_ptr)
    if cached is None or cached[0] != ptrs:
        ffi = _lib.ffi
        cached = (
            ptrs,
            (
                ffi.cast(_CT["const void*"], ptrs[0]),
                ffi.cast(_CT["void*"], ptrs[1]),
                ffi.cast(_CT["void*"], ptrs[0]),
            ),
        )
        plan._c_buffers = cached
    return cached[1]


@dataclass(frozen=True)
class DecodeConfig:
    """The shape of one decode step (``snapmla_decode_config_t``).

    Attributes:
        batch_size: Requests ``b``, 1..65536.
        q_len: New tokens per request ``s_q``, 1..4.
        num_heads: Query heads ``h``, 1..128.
        max_pages: Columns of the block table (contexts are at most ``max_pages * 64``).
        num_sm_parts: Split-KV parallelism, 0..65535; 0 = derived from the device's SM count.
        q_precision: ``"fp8"`` or ``"fp8x2"`` (the two-term query; see ``DecodePlan``).
    """

    batch_size: int
    q_len: int
    num_heads: int
    max_pages: int
    num_sm_parts: int = 0
    q_precision: str = "fp8"


def select_kernel(config: DecodeConfig, kernel: str = "auto", op: str = "decode") -> str:
    """The kernel ``decode`` runs for ``config`` and the option ``kernel`` (``"auto"``,
    ``"reference"`` or ``"fast"``): ``"reference"`` or ``"fast"``, as the library decides
    (``snapmla_decode_select_kernel``; no device is touched).

    Raises:
        SnapMLAError: ``kernel`` is not a kernel name, or the library refuses the option for
            this config (its message, naming ``'kernel'``: the two-term query past 32 rows a
            request runs only on ``"reference"``), or the config is out of range.
    """
    code = kernel_code(op, kernel)
    selected = _lib.ffi.new("int32_t*")
    _lib.check(_lib.lib().snapmla_decode_select_kernel(_c_config(config), code, selected), op)
    return _KERNEL_NAMES[selected[0]]


def _c_config(config: DecodeConfig, plan_bytes: int = 0, workspace_bytes: int = 0) -> Any:
    """``config`` as the C calls take it (``_args.decode_config``: built once, read-only), with
    the sizes of the plan and workspace buffers the calls pass (0: not said)."""
    c = config
    return decode_config(
        c.batch_size,
        c.q_len,
        c.num_heads,
        c.max_pages,
        c.num_sm_parts,
        Q_PRECISIONS[c.q_precision],
        plan_bytes,
        workspace_bytes,
    )


@functools.lru_cache(maxsize=256)
def runnable_kernels(config: DecodeConfig) -> types.MappingProxyType[str, int]:
    """The kernel options that can run ``config`` (name -> snapmla_decode_kernel_t), by
    ``select_kernel``."""
    runnable = {}
    for name, code in KERNELS.items():
        try:
            select_kernel(config, name)
        except SnapMLAError as exc:
            if exc.argument != "kernel":
                raise
            continue
        runnable[name] = code
    return types.MappingProxyType(runnable)


def _validate_seqlens(
    op: str,
    cache_seqlens: Any,
    batch_size: int | None,
    device: int | None,
    stream: Stream,
    checker: Checker | None = None,
) -> tuple[TensorView, int]:
    """Check ``cache_seqlens`` (int32 ``[b]``, contiguous); return its view and device (the
    call memo of ``update`` may give a ``checker`` that has ``read()`` it already)."""
    if checker is None:
        checker = Checker(op, stream)
    shape: tuple[int | str] = ("b",) if batch_size is None else (batch_size,)
    v = checker.tensor(
        cache_seqlens,
        "cache_seqlens",
        dtypes=INT32,
        shape=shape,
        shape_note="" if batch_size is None else " (batch_size of the plan)",
    )
    check_batch(op, "cache_seqlens", v.shape[0])
    return v, checker.devices(device)


class DecodePlan(Closable):
    """The split-KV schedule of one decode step, with its device workspace.

    Built on the device from ``cache_seqlens`` (no host synchronization); serves every layer
    of the step, as long as ``cache_seqlens`` does not change. ``update()`` re-plans in place
    for the next step (same config, same buffers, so CUDA graphs that captured ``decode``
    stay valid). The workspace is scratch shared by every ``decode`` call with this plan:
    calls on different streams must not run concurrently.

    Lifetime: the plan and workspace are CuPy arrays allocated under the constructor's
    stream; ``close()`` (or dropping the plan) frees them stream-ordered, never blocking on
    the GPU: at once when only that stream used them, else once the work queued on the other
    streams (``update``, ``decode``) has completed (``_tensor.OwnedMemory``). ``close()`` on
    one thread waits for calls of other threads inside ``update`` or ``decode`` with this
    plan; later calls are refused. CUDA graphs that captured calls with the plan hold its raw
    addresses: keep the plan alive while they may be replayed.

    Attributes:
        config: The ``DecodeConfig``; also as ``batch_size``, ``q_len``, ``num_heads``,
            ``max_pages``, ``num_sm_parts``.
        device: CUDA device ordinal (that of ``cache_seqlens``).
        plan_bytes, workspace_bytes: Sizes of the two device buffers (CuPy arrays).
    """

    _what = "the plan"

    def __init__(
        self,
        cache_seqlens: Any,
        *,
        num_heads: int,
        q_len: int = 1,
        max_pages: int,
        num_sm_parts: int = 0,
        stream: Any = None,
        q_precision: str = "fp8",
    ) -> None:
        """Allocate the plan and workspace and build the plan (one small launch).

        Args:
            cache_seqlens: int32 ``[b]`` CUDA tensor, contiguous: context length of each
                request including its ``q_len`` new tokens; ``b`` in 1..65536.
            num_heads: Query heads, 1..128.
            q_len: New tokens per request, 1..4.
            max_pages: Columns of the block table, >= 1.
            num_sm_parts: Split-KV parallelism, 0..65535; 0 derives it from the device's SM
                count.
            stream: CUDA stream of the planning launch, under which the buffers are also
                allocated: an int handle, or an object with ``.ptr`` (CuPy) or
                ``.cuda_stream`` (PyTorch). ``None``: torch's current stream if
                ``cache_seqlens`` is a torch tensor, else CuPy's current stream.
            q_precision: ``"fp8"`` (the numerics contract: one FP8 row per query) or
                ``"fp8x2"`` (the two-term query: a second FP8 row on the first's residual at
                scale s1 / 16 and a second content QK pass,
                ``snapmla.reference.decode_reference(q_terms=2)``;
                about half the error where the query's rounding dominates). ``"fp8x2"``
                reserves 516 more workspace bytes per query row. ``decode`` with this plan
                runs the tensor-core kernel (``"auto"`` or ``"fast"``) where
                ``q_len * num_heads <= 32``, its QK tile's empty half holding the low rows, at
                about the one-term time; past 32 it needs ``kernel="reference"`` (several
                times slower), which ``"auto"`` does not pick for you (``select_kernel``).
        """
        self._owned: OwnedMemory | None = None
        self._in_use = InUse()
        op = "DecodePlan"
        num_heads, q_len, max_pages, num_sm_parts = check_config(
            op, num_heads, q_len, max_pages, num_sm_parts
        )
        q_precision_code(op, "q_precision", q_precision)
        s = Stream(stream, op, (cache_seqlens,))
        seqlens, device = _validate_seqlens(op, cache_seqlens, None, None, s)
        self.config = DecodeConfig(
            seqlens.shape[0], q_len, num_heads, max_pages, num_sm_parts, q_precision
        )
        self.device = device
        ffi = _lib.ffi
        lib = _lib.lib()
        plan_bytes = ffi.new("size_t*")
        workspace_bytes = ffi.new("size_t*")
        with on_device(op, device):
            _lib.check(
                lib.snapmla_decode_buffer_sizes(
                    _c_config(self.config), plan_bytes, workspace_bytes
                ),
                "snapmla_decode_buffer_sizes",
            )
            self.plan_bytes = int(plan_bytes[0])
            self.workspace_bytes = int(workspace_bytes[0])
            # the kernel options decode takes with this plan (the library's rule)
            self._kernels = runnable_kernels(self.config)
            plan, self._plan_ptr = empty(op, (max(self.plan_bytes, 1),), "uint8", device, s)
            workspace, self._workspace_ptr = empty(
                op, (max(self.workspace_bytes, 1),), "uint8", device, s
            )
            self._owned = OwnedMemory((plan, workspace), s.handle(device), device)
            # The config of the plan's and decode's C calls says the buffers' sizes: the library
            # refuses a buffer smaller than the config needs rather than write past it.
            self._c_config = _c_config(
                self.config, max(self.plan_bytes, 1), max(self.workspace_bytes, 1)
            )
            self._run(ffi.cast(_CT["const int32_t*"], seqlens.ptr), s)

    batch_size = read_only("config.batch_size", "Requests ``b``.")
    q_len = read_only("config.q_len", "New tokens per request ``s_q``.")
    num_heads = read_only("config.num_heads", "Query heads ``h``.")
    max_pages = read_only("config.max_pages", "Columns of the block table.")
    num_sm_parts = read_only(
        "config.num_sm_parts", "Split-KV parallelism as requested (0 = derived from the device)."
    )

    def update(self, cache_seqlens: Any, stream: Any = None) -> None:
        """Re-plan in place for new ``cache_seqlens`` (int32 ``[batch_size]``, same device).

        Args:
            cache_seqlens: The next step's context lengths.
            stream: CUDA stream of the planning launch, as for the constructor.
        """
        op = "DecodePlan.update"
        self._enter(op)
        try:
            s = Stream(stream, op, (cache_seqlens,))
            checker = Checker(op, s)
            # The call memo (host time), as decode's: a tensor with the key of one
            # that passed these checks before, for a plan of the same batch size and device,
            # passes them again. It is still read (with the stream handshake).
            keys = checker.read_keys((("cache_seqlens", cache_seqlens),))
            memo_key = None if keys is None else (self.config.batch_size, self.device, keys)
            seqlens = None if memo_key is None else _update_memo.get(memo_key)
            if seqlens is None:
                view, _ = _validate_seqlens(
                    op, cache_seqlens, self.batch_size, self.device, s, checker
                )
                seqlens = _lib.ffi.cast(_CT["const int32_t*"], view.ptr)
                if memo_key is not None:
                    remember(_update_memo, memo_key, seqlens, _UPDATE_MEMO_SIZE)
            with on_device(op, self.device):
                self._run(seqlens, s)
        finally:
            self._in_use.exit()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._in_use.closed

    def close(self) -> None:
        """Free the plan and workspace (stream-ordered, see the class). Idempotent,
        thread-safe, never blocks on the GPU (raises ``SnapMLAError`` when called from inside
        an operation with this plan on this thread)."""
        if not self._in_use.close("DecodePlan.close"):
            return
        try:
            owned, self._owned = self._owned, None
            if owned is not None:
                owned.release()
        finally:
            self._in_use.closed_done()

    def _enter(self, op: str, argument: str | None = None) -> None:
        if not self._in_use.enter():
            raise self._refuse_closed(op, argument)

    def _run(self, seqlens: Any, stream: Stream) -> None:
        """Plan from ``seqlens`` (a checked ``const int32_t*``) on ``stream``."""
        status = _lib.lib().snapmla_decode_plan(
            self._c_config, seqlens, _plan_buffers(self)[2], stream.c(self.device)
        )
        if status:  # (_lib.check's own test, without the call on success)
            _lib.check(status, "snapmla_decode_plan")
        if self._owned is not None:
            self._owned.used_on(stream.handle(self.device))

    def __repr__(self) -> str:
        c = self.config
        return (
            f"DecodePlan(batch_size={c.batch_size}, q_len={c.q_len}, num_heads={c.num_heads}, "
            f"max_pages={c.max_pages}, num_sm_parts={c.num_sm_parts}, device={self.device})"
        )


class _DecodeCall(NamedTuple):
    """Checked arguments of one ``decode`` call (``out`` / ``lse`` ``None``: allocate)."""

    layer: int
    kernel: int
    softmax_scale: float
    causal: bool
    q: TensorView
    q_strides: tuple[int, int, int]
    block_table: TensorView
    block_table_stride: int
    cache_seqlens: TensorView
    out: TensorView | None
    lse: TensorView | None
    q_pe: TensorView | None = None  # the RoPE part apart (q then holds q_nope only)
    q_pe_strides: tuple[int, int, int] = (0, 0, 0)
    out_dtype: str = "bfloat16"  # out's (given or to allocate): a key of OUT_DTYPES


def _decode_scalars(
    num_layers: int,
    config: DecodeConfig,
    layer: Any,
    kernel: Any,
    softmax_scale: Any,
    kernels: types.MappingProxyType[str, int] | None = None,
) -> tuple[int, int, float]:
    """``decode``'s checks of its scalar arguments, first (before any tensor is read): the
    layer, the kernel's C code, the softmax scale. ``kernels``: ``runnable_kernels(config)``
    (the plan keeps it)."""
    op = "decode"
    if type(layer) is not int or not 0 <= layer < num_layers:  # else check_int's common case
        layer = check_int(layer, op, "layer", 0, num_layers - 1)
    if kernels is None:
        kernels = runnable_kernels(config)
    code = kernels.get(kernel) if type(kernel) is str else None
    if code is None:
        # Not a kernel name, or an option this config cannot run ("auto" refuses the two-term
        # query past the fast kernel's rows rather than run a kernel several times slower
        # unasked): the library's refusal, naming 'kernel'.
        select_kernel(config, kernel, op)
        code = KERNELS[kernel]
    return layer, code, _check_softmax_scale(op, softmax_scale)


def _check_out_dtype(op: str, out_dtype: Any) -> None:
    """``decode``'s ``out_dtype``: ``None``, ``"bfloat16"`` or ``"float32"``."""
    if out_dtype is not None and (type(out_dtype) is not str or out_dtype not in OUT_DTYPES):
        raise argument_error(
            op,
            "out_dtype",
            " or ".join(repr(k) for k in OUT_DTYPES) + " or None",
            repr(out_dtype),
        )


def _validate_decode_args(
    num_layers: int,
    device: int,
    cache_extent: Extent | list[Extent],
    config: DecodeConfig,
    plan_device: int,
    layer: Any,
    q: Any,
    block_table: Any,
    cache_seqlens: Any,
    *,
    softmax_scale: Any,
    causal: Any,
    out: Any,
    lse: Any,
    kernel: Any,
    stream: Stream,
    q_pe: Any = None,
    checker: Checker | None = None,
    scalars: tuple[int, int, float] | None = None,
    out_dtype: Any = None,
) -> _DecodeCall:
    """Checks of ``decode`` against the cache (``num_layers``, ``device``, ``cache_extent`` =
    ``(data_ptr, nbytes)``) and the plan (``config``, ``plan_device``). ``_decode``'s call memo
    may give a ``checker`` that has ``read()`` some of the tensors already, and the
    ``_decode_scalars`` result of these same arguments."""
    op = "decode"
    if scalars is None:  # (else _decode checked them and out_dtype for its memo key)
        scalars = _decode_scalars(num_layers, config, layer, kernel, softmax_scale)
        _check_out_dtype(op, out_dtype)
    layer, kernel_code, scale = scalars
    spec = _decode_spec(config)
    s_q, h, max_pages = config.q_len, config.num_heads, config.max_pages
    if checker is None:
        checker = Checker(op, stream)
    # With q_pe, q holds q_nope only (512 a row) and q_pe the RoPE part (64 a row).
    row = HEAD_DIM if q_pe is None else CONTENT_DIM
    q_shape = spec.q_shape if q_pe is None else spec.out_shape
    qv = checker.tensor(q, "q", dtypes=BF16, shape=q_shape, layout="inner", shape_note=spec.note)
    head_stride = checker.stride(qv, "q", 2, row, "head")
    token_stride = checker.stride(qv, "q", 1, row, "token", h * head_stride)
    batch_stride = checker.stride(qv, "q", 0, row, "batch", s_q * token_stride)
    pv = None
    pe_strides = (0, 0, 0)
    if q_pe is not None:
        pv = checker.tensor(
            q_pe,
            "q_pe",
            dtypes=BF16,
            shape=(*spec.out_shape[:3], ROPE_DIM),
            layout="inner",
            shape_note=spec.note,
        )
        pe_head = checker.stride(pv, "q_pe", 2, ROPE_DIM, "head")
        pe_token = checker.stride(pv, "q_pe", 1, ROPE_DIM, "token", h * pe_head)
        pe_strides = (
            checker.stride(pv, "q_pe", 0, ROPE_DIM, "batch", s_q * pe_token),
            pe_token,
            pe_head,
        )
    bt = checker.tensor(
        block_table,
        "block_table",
        dtypes=INT32,
        shape=spec.block_table_shape,
        layout="inner",
        shape_note=spec.block_table_note,
    )
    bt_stride = checker.stride(bt, "block_table", 0, max_pages, "row")
    sl = checker.tensor(
        cache_seqlens,
        "cache_seqlens",
        dtypes=INT32,
        shape=spec.seqlens_shape,
        shape_note=spec.seqlens_note,
    )
    ov = None
    if out is not None:
        # out's dtype is the output's (BF16 or fp32); out_dtype, if given, must agree
        ov = checker.tensor(
            out,
            "out",
            dtypes=_OUT_DTYPE_NAMES[out_dtype],
            shape=spec.out_shape,
            writable=True,
            shape_note=spec.note,
            align=OUT_ALIGNMENT,
            align_note="the combine kernel's 16-byte stores",
        )
    lv = None
    if lse is not None:
        lv = checker.tensor(
            lse, "lse", dtypes=FP32, shape=spec.lse_shape, writable=True, shape_note=spec.note
        )
    checker.devices(device)
    if plan_device != device:
        raise argument_error(op, "plan", f"a plan made on cuda:{device}", f"cuda:{plan_device}")
    if ov is not None or lv is not None:
        inputs = [
            ("the cache", extent(*layer_extent(cache_extent, layer))),
            ("q", qv),
            ("block_table", bt),
            ("cache_seqlens", sl),
            *([("q_pe", pv)] if pv is not None else []),
        ]
        if ov is not None:
            checker.no_overlap("out", ov, [*inputs, ("lse", lv)])
        if lv is not None:
            checker.no_overlap("lse", lv, inputs)
    if ov is not None:
        out_dtype = "float32" if ov.dtype in FP32 else "bfloat16"
    return _DecodeCall(
        layer,
        kernel_code,
        scale,
        bool(causal),
        qv,
        (batch_stride, token_stride, head_stride),
        bt,
        bt_stride,
        sl,
        ov,
        lv,
        pv,
        pe_strides,
        out_dtype or "bfloat16",
    )


@dataclass(frozen=True)
class _DecodeSpec:
    """The shapes ``decode`` expects for one plan config, and their notes in messages."""

    q_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...]
    block_table_shape: tuple[int, ...]
    seqlens_shape: tuple[int, ...]
    note: str
    block_table_note: str
    seqlens_note: str


@functools.lru_cache(maxsize=256)
def _decode_spec(config: DecodeConfig) -> _DecodeSpec:
    b, s_q, h, max_pages = config.batch_size, config.q_len, config.num_heads, config.max_pages
    return _DecodeSpec(
        q_shape=(b, s_q, h, HEAD_DIM),
        out_shape=(b, s_q, h, CONTENT_DIM),
        lse_shape=(b, h, s_q),
        block_table_shape=(b, max_pages),
        seqlens_shape=(b,),
        note=f" (from the plan: batch_size {b}, q_len {s_q}, num_heads {h})",
        block_table_note=f" (from the plan: batch_size {b}, max_pages {max_pages})",
        seqlens_note=f" (from the plan: batch_size {b})",
    )


def _check_softmax_scale(op: str, softmax_scale: Any) -> float:
    """``softmax_scale`` as a float, finite and > 0, also as fp32 (the C API takes a float)."""
    if type(softmax_scale) is float and softmax_scale in _checked_scales:
        return softmax_scale
    if type(softmax_scale) is not float and (
        isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real)
    ):
        raise argument_error(
            op, "softmax_scale", "a finite number > 0", type(softmax_scale).__name__
        )
    scale = float(softmax_scale)
    # The C API takes a float: the value must also stay finite and > 0 in fp32.
    scale32 = _to_float32(scale)
    if not (math.isfinite(scale) and scale > 0 and math.isfinite(scale32) and scale32 > 0):
        raise argument_error(
            op, "softmax_scale", "a finite number > 0 (also as fp32)", repr(softmax_scale)
        )
    if type(softmax_scale) is float:
        if len(_checked_scales) >= 256:
            _checked_scales.clear()
        _checked_scales.add(scale)
    return scale


# Floats that passed _check_softmax_scale (a serving loop passes the same one at every call).
# Only finite values > 0 get here, so no NaN or -0.0 can match another value.
_checked_scales: set[float] = set()


_FLOAT32 = struct.Struct("f")


def _to_float32(value: float) -> float:
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:
        return math.inf


def decode(
    cache: KVCache,
    layer: int,
    q: Any,
    block_table: Any,
    cache_seqlens: Any,
    plan: DecodePlan,
    *,
    softmax_scale: float,
    causal: bool = True,
    out: Any = None,
    lse: Any = None,
    kernel: str = "auto",
    stream: Any = None,
    q_pe: Any = None,
    out_dtype: str | None = None,
) -> tuple[Any, Any]:
    """FP8 MLA decode attention of one layer for one step (graph-safe: only enqueues work).

    Args:
        cache: The KV cache; the new tokens must already be appended.
        layer: Layer to read, ``0 <= layer < cache.num_layers``.
        q: BF16 ``[b, s_q, h, 576]`` (``q_nope`` absorbed | ``q_pe``); any non-negative
            batch / token / head strides (>= 576 elements), unit stride in the last dimension.
        block_table: int32 ``[b, max_pages]``; row stride >= max_pages, unit inner stride.
        cache_seqlens: int32 ``[b]``, contiguous: context lengths including the ``s_q`` new
            tokens; the same values the plan was built from.
        plan: The step's ``DecodePlan``; ``(b, s_q, h, max_pages)`` must match its config.
        softmax_scale: Finite and > 0 (also in fp32), e.g. ``192 ** -0.5``.
        causal: Causal mask among the ``s_q`` new tokens (bottom-right aligned).
        out: Output BF16 ``[b, s_q, h, 512]``, contiguous, 16-byte aligned, or ``None`` for a
            new CuPy array. Or fp32 (same shape and alignment): it then receives
            the fp32 values the BF16 output rounds, ``O / l`` unrounded (rounded to nearest
            even, bit for bit the BF16 output of the same call): the two-term query's
            precision (``q_precision="fp8x2"``) that BF16 rounding would mostly hide.
        lse: Output fp32 ``[b, h, s_q]``, contiguous, or ``None`` for a new CuPy array.
        kernel: ``"auto"`` (the library's choice, ``select_kernel``: ``"fast"``, which meets
            the numerics contract's tensor-core tier and is the faster one), ``"fast"``
            (the seesaw kernel: FP8 wgmma, the contract's tensor-core tier) or
            ``"reference"`` (the simple kernel that states the contract with fp32
            accumulation, within 2e-3 of its NumPy model; several times slower). Measured
            speeds and errors: README.
        stream: CUDA stream: an int handle, or an object with ``.ptr`` (CuPy) or
            ``.cuda_stream`` (PyTorch). ``None``: the current stream of the inputs'
            framework: torch's current stream if any tensor argument is a torch tensor (so
            that ``torch.cuda.graph`` capture works without ``stream=``), else CuPy's current
            stream (for JAX inputs, the legacy default stream unless a CuPy stream is made
            current). The producers' ``__dlpack__(stream=...)`` is given this stream.
        q_pe: Optional: the RoPE part of the queries in its own BF16
            ``[b, s_q, h, 64]`` tensor (strides >= 64, unit inner stride); ``q`` then holds
            ``q_nope`` only, ``[b, s_q, h, 512]``. Engines keep the two apart: no concat per layer
            and step.
        out_dtype: Optional: ``"bfloat16"`` or ``"float32"``, the dtype of the
            ``out`` allocated when none is given; with ``out`` given, ``out``'s dtype decides
            and ``out_dtype``, if not ``None``, must be that dtype. ``None``: ``"bfloat16"``.

    All tensors must be CUDA tensors on the cache's device, aligned to their element size
    (``out``: 16 bytes); outputs must not overlap inputs.

    Thread safety: the call counts as inside ``cache`` and ``plan`` until it returns, so a
    ``close()`` of either on another thread waits for it.

    Returns:
        ``(out, lse)``: the given outputs, or new CuPy arrays (``out`` of dtype
        ``ml_dtypes.bfloat16``, or ``uint16`` holding the bits if CuPy refuses that dtype, or
        float32 with ``out_dtype="float32"``; ``lse`` float32), allocated under the call's
        stream.

    Raises:
        SnapMLAError: An argument is refused (nothing is written) or the library failed.
    """
    op = "decode"
    if not isinstance(cache, KVCache):
        raise argument_error(op, "cache", "a snapmla.KVCache", type(cache).__name__)
    cache._enter(op, "cache")
    try:
        if not isinstance(plan, DecodePlan):
            raise argument_error(op, "plan", "a snapmla.DecodePlan", type(plan).__name__)
        plan._enter(op, "plan")
        try:
            # (positional: keywords cost a tenth of a microsecond here)
            return _decode(
                op,
                cache,
                layer,
                q,
                block_table,
                cache_seqlens,
                plan,
                softmax_scale,
                causal,
                out,
                lse,
                kernel,
                stream,
                q_pe,
                out_dtype,
            )
        finally:
            plan._in_use.exit()
    finally:
        cache._in_use.exit()


def _decode(op: str, cache: KVCache, layer: Any, q: Any, block_table: Any, cache_seqlens: Any,
            plan: DecodePlan, softmax_scale: Any, causal: Any, out: Any, lse: Any, kernel: Any,
            stream: Any, q_pe: Any, out_dtype: Any = None) -> tuple[Any, Any]:  # fmt: skip
    """The body of ``decode`` (``op``, then its arguments in order), run while the call is
    inside its cache and plan."""
    s = Stream(stream, op, (q, block_table, cache_seqlens, out, lse, q_pe))
    c = plan.config
    device = cache._device
    num_layers = cache._num_layers
    checker = Checker(op, s)
    # The call memo (host time): with the outputs given, a call whose scalars and
    # tensors (each by Checker.read's key: torch attributes or DLPack bytes, so the address,
    # device, dtype, shape and strides) equal an earlier call's on this cache and a plan of
    # the same config and device passed every check then and packs the same C arguments: it
    # reuses them. Each tensor is still read (with the stream handshake); nothing else of the
    # checks depends on anything else. The scalars are checked first, as without the memo.
    # A tensor that cannot be read ends the memo's try: the checks below then read and check
    # the tensors in their order, so the first bad argument is still the one named.
    memo_key: Any = None
    args = None
    scalars = None
    if out is not None and lse is not None:
        scalars = _decode_scalars(num_layers, c, layer, kernel, softmax_scale, plan._kernels)
        _check_out_dtype(op, out_dtype)  # (before it enters the memo key: a str or None)
        keys = checker.read_keys(
            (
                ("q", q),
                ("q_pe", q_pe),
                ("block_table", block_table),
                ("cache_seqlens", cache_seqlens),
                ("out", out),
                ("lse", lse),
            )
        )
        if keys is not None:
            memo_key = (c, plan.device, scalars, bool(causal), q_pe is not None, out_dtype, keys)
            args = cache._decode_memo.get(memo_key)
    if args is None:
        call = _validate_decode_args(
            num_layers,
            device,
            cache._extents,
            c,
            plan.device,
            layer,
            q,
            block_table,
            cache_seqlens,
            softmax_scale=softmax_scale,
            causal=causal,
            out=out,
            lse=lse,
            kernel=kernel,
            stream=s,
            q_pe=q_pe,
            checker=checker,
            scalars=scalars,
            out_dtype=out_dtype,
        )
    with on_device(op, device):
        if args is None:
            if call.out is None:
                out, out_ptr = empty(
                    op, (c.batch_size, c.q_len, c.num_heads, CONTENT_DIM), call.out_dtype, device, s
                )
            else:
                out_ptr = call.out.ptr
            if call.lse is None:
                lse, lse_ptr = empty(op, (c.batch_size, c.num_heads, c.q_len), "float32", device, s)
            else:
                lse_ptr = call.lse.ptr
            args = pack_decode_args(
                call.layer,
                call.causal,
                call.softmax_scale,
                call.kernel,
                call.q.ptr,
                call.q_strides,
                call.block_table.ptr,
                call.block_table_stride,
                call.cache_seqlens.ptr,
                out_ptr,
                lse_ptr,
                call.q_pe.ptr if call.q_pe is not None else 0,
                call.q_pe_strides,
                OUT_DTYPES[call.out_dtype],
            )
            if memo_key is not None:  # read-only from here on (the C call only reads it)
                remember(cache._decode_memo, memo_key, args, _DECODE_MEMO_SIZE)
        buffers = _plan_buffers(plan)
        status = _lib.lib().snapmla_decode(
            cache._handle, plan._c_config, args, buffers[0], buffers[1], s.c(device)
        )
        if status:  # (_lib.check's own test, without the call on success)
            _lib.check(status, "snapmla_decode")
    cache._used_on(s)
    if plan._owned is not None:
        plan._owned.used_on(s.handle(device))
    return out, lse
