"""The paged FP8 MLA KV cache: ``KVCache`` (create, append, fetch-dequant, close)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _lib
from ._args import (
    INT32_MAX,
    MAX_DEVICE,
    MAX_PAGES,
    PAGE_STRIDES,
    PLANE_ALIGNMENT,
    check_int,
    page_stride_ok,
)
from ._dlpack import TensorView
from ._errors import SnapMLAError, argument_error
from ._lib import CONTENT_DIM, PAGE_BYTES, ROPE_DIM
from ._lib import CTYPES as _CT
from ._tensor import (
    ADDRESS_SPACE,
    BF16,
    BYTES,
    INT32,
    INT64,
    MAX_SPAN_BYTES,
    Checker,
    Closable,
    InUse,
    OwnedMemory,
    Stream,
    cupy_module,
    empty,
    extent,
    on_device,
    read_only,
    remember,
)

__all__ = ["KVCache"]

_MEMORY_ALIGNMENT = 256  # cudaMalloc's, as the C library asks of a cache's memory
# Calls kept in a cache's memo of append and fetch_dequant calls (KVCache._call_memo).
_CALL_MEMO_SIZE = 1024


def _validate_shape_args(op: str, num_layers: Any, num_pages: Any) -> tuple[int, int]:
    """``(num_layers, num_pages)``, refused as ``snapmla_cache_bytes`` refuses them: the cache's
    ``num_layers * num_pages * 41216`` bytes must be at most 2^63 - 1 (int64 offsets)."""
    pages = check_int(num_pages, op, "num_pages", 1, MAX_PAGES)
    layers = check_int(num_layers, op, "num_layers", 1, INT32_MAX)
    most = MAX_SPAN_BYTES // (pages * PAGE_BYTES)
    if layers > most:
        raise argument_error(
            op,
            "num_layers",
            f"at most {most} layers of {pages} pages (the cache's bytes must be at most 2^63 - 1)",
            str(layers),
        )
    return layers, pages


def _validate_buffer(
    buffer: Any, nbytes: int, device: int | None, argument: str = "buffer", align: int = 0
) -> tuple[TensorView, int]:
    """Check a caller-owned cache buffer (or one layer's); return its view and device."""
    op = "KVCache"
    checker = Checker(op, None)
    v = checker.tensor(buffer, argument, dtypes=BYTES, shape=("nbytes",), writable=True)
    if v.shape[0] < nbytes:
        what = "the cache's bytes" if argument == "buffer" else "a layer: num_pages * page_stride"
        raise argument_error(
            op, argument, f"at least {nbytes} bytes ({what})", f"{v.shape[0]} bytes"
        )
    device = checker.devices(device)
    align = align or _MEMORY_ALIGNMENT
    if v.ptr % align:
        raise argument_error(op, argument, f"a {align}-byte aligned address", f"{v.ptr:#x}")
    if v.ptr + v.shape[0] > ADDRESS_SPACE:
        raise argument_error(
            op, argument, "bytes inside the 64-bit address space", f"{v.shape[0]} from {v.ptr:#x}"
        )
    if device > MAX_DEVICE:
        raise argument_error(op, argument, f"a CUDA device ordinal <= {MAX_DEVICE}", v.device)
    return v, device


Extent = tuple[int, int]  # (address, bytes)


def layer_extent(cache_extent: Extent | list[Extent], layer: int) -> Extent:
    """The memory a call on ``layer`` must not alias: the whole cache when it is one block,
    the layer's own when each layer has its own memory (``KVCache(layers=...)``)."""
    return cache_extent[layer] if isinstance(cache_extent, list) else cache_extent


def _validate_layer(op: str, layer: Any, num_layers: int) -> int:
    return check_int(layer, op, "layer", 0, num_layers - 1)


def _validate_append_args(
    num_layers: int,
    device: int,
    cache_extent: Extent | list[Extent],
    layer: Any,
    c_kv: Any,
    k_pe: Any,
    slots: Any,
    stream: Stream,
    checker: Checker | None = None,
) -> tuple[int, TensorView, int, TensorView, int, TensorView]:
    """Checks of ``KVCache.append``; returns ``(layer, c_kv, c_kv_stride, k_pe, k_pe_stride,
    slots)``. ``cache_extent`` is ``(data_ptr, nbytes)`` of the cache memory, or one such pair
    per layer (see ``layer_extent``). The call memo may give a ``checker`` that has ``read()``
    some of the tensors already."""
    op = "KVCache.append"
    layer = _validate_layer(op, layer, num_layers)
    if checker is None:
        checker = Checker(op, stream)
    c = checker.tensor(c_kv, "c_kv", dtypes=BF16, shape=("n", CONTENT_DIM), layout="inner")
    n = c.shape[0]
    c_stride = checker.stride(c, "c_kv", 0, CONTENT_DIM, "row")
    k = checker.tensor(k_pe, "k_pe", dtypes=BF16, shape=(n, ROPE_DIM), layout="inner")
    k_stride = checker.stride(k, "k_pe", 0, ROPE_DIM, "row")
    s = checker.tensor(slots, "slots", dtypes=INT64, shape=(n,))
    checker.devices(device)
    cache_view = extent(*layer_extent(cache_extent, layer))
    for name, v in (("c_kv", c), ("k_pe", k), ("slots", s)):
        checker.no_overlap(name, v, [("the cache", cache_view)])
    return layer, c, c_stride, k, k_stride, s


def _validate_fetch_args(
    num_layers: int,
    device: int,
    cache_extent: Extent | list[Extent],
    layer: Any,
    slots: Any,
    c_kv: Any,
    k_pe: Any,
    stream: Stream,
    checker: Checker | None = None,
) -> tuple[int, TensorView, TensorView | None, int, TensorView | None, int]:
    """Checks of ``KVCache.fetch_dequant``; returns ``(layer, slots, c_kv, c_kv_stride, k_pe,
    k_pe_stride)`` with ``None`` for outputs still to allocate. The call memo may give a
    ``checker`` that has ``read()`` some of the tensors already."""
    op = "KVCache.fetch_dequant"
    layer = _validate_layer(op, layer, num_layers)
    if checker is None:
        checker = Checker(op, stream)
    s = checker.tensor(slots, "slots", dtypes=INT64, shape=("n",))
    n = s.shape[0]
    c = k = None
    c_stride, k_stride = CONTENT_DIM, ROPE_DIM
    if c_kv is not None:
        c = checker.tensor(
            c_kv, "c_kv", dtypes=BF16, shape=(n, CONTENT_DIM), layout="inner", writable=True
        )
        c_stride = checker.stride(c, "c_kv", 0, CONTENT_DIM, "row")
    if k_pe is not None:
        k = checker.tensor(
            k_pe, "k_pe", dtypes=BF16, shape=(n, ROPE_DIM), layout="inner", writable=True
        )
        k_stride = checker.stride(k, "k_pe", 0, ROPE_DIM, "row")
    checker.devices(device)
    cache_view = extent(*layer_extent(cache_extent, layer))
    if c is not None:
        checker.no_overlap("c_kv", c, [("the cache", cache_view), ("slots", s), ("k_pe", k)])
    if k is not None:
        checker.no_overlap("k_pe", k, [("the cache", cache_view), ("slots", s)])
    return layer, s, c, c_stride, k, k_stride


class KVCache(Closable):
    """A paged FP8 MLA KV cache on one GPU, in the byte format documented in ``snapmla.h``.

    Each of ``num_layers`` layers holds ``num_pages`` pages of 64 token slots; token slot ``t``
    is page ``t // 64``, row ``t % 64`` (644 bytes per token and layer). The memory is either
    the caller's ``buffer`` or a new CuPy allocation owned by this object; its contents start
    undefined.

    Use as a context manager or call ``close()`` to release the C handle (and the memory, if
    owned) deterministically. ``close()`` never blocks on the GPU, and may be called while
    work using the cache is still queued: memory this object allocated is allocated under
    CuPy's current stream at creation and freed stream-ordered (freed at once when only that
    stream used it, else once the work queued on the other streams has completed; see
    ``_tensor.OwnedMemory``); a caller's ``buffer`` is the caller's to keep alive until its
    work is done. Operations are thread-safe against ``close()``: a ``close()`` on one thread
    waits until the calls of other threads inside ``append``, ``fetch_dequant`` or ``decode``
    with this cache have returned (they only enqueue work), and later calls are refused
    ("the cache is closed"). CUDA graphs that captured calls with the cache hold its raw
    addresses: keep the cache open while they may be replayed.
    """

    _what = "the cache"

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        *,
        buffer: Any = None,
        layers: Sequence[Any] | None = None,
        page_stride: int = 0,
        device: int | None = None,
    ) -> None:
        """Create the cache.

        Args:
            num_layers: Layers, >= 1; the cache's ``num_layers * num_pages * 41216`` bytes
                must be at most 2^63 - 1.
            num_pages: Pages per layer, >= 1 (``num_pages * 64`` must fit in int32).
            buffer: Caller-owned CUDA DLPack tensor (uint8 or int8, contiguous, 256-byte
                aligned, at least ``snapmla_cache_bytes`` bytes) that the cache lives in; the
                caller keeps it alive (this object also holds a reference). ``None``: CuPy
                allocates the memory, on ``device``.
            layers: Instead of ``buffer``, one caller-owned tensor per layer (``num_layers`` of
                them, each as ``buffer`` is but at least a layer's bytes, on one
                device, not overlapping), for engines that hold a tensor per layer. Calls on
                layer ``l`` then refuse tensors that alias layer ``l``'s memory (not the other
                layers', which are the caller's own tensors).
            page_stride: Bytes from one page to the next within a layer: 0 (41216, the pages
                packed), or a multiple of 128 above it, so that the pages sit inside an
                engine's larger slots (64 x 656 = 41984 for vLLM's fp8_ds_mla). A layer is then
                ``num_pages * page_stride`` bytes.
            device: CUDA device ordinal, 0..63. With ``buffer`` it must match the buffer's
                device (``None``: the buffer's); without, ``None`` means CuPy's current device.

        Raises:
            SnapMLAError: An argument is out of range, the library is missing, or allocation
                or creation failed.
        """
        self._handle: Any = None
        self._buffer: Any = None
        self._buffer_view: TensorView | None = None  # holds the DLPack capsule too
        self._owned: OwnedMemory | None = None  # the memory, when allocated here
        self._in_use = InUse()
        # decode's call memo (decode._decode): the packed C arguments of calls that passed
        # every check, by the call's scalars and tensor keys
        self._decode_memo: dict[Any, Any] = {}
        # The same for append and fetch_dequant (by the operation's name, the layer and the
        # tensor keys): their C arguments but the handle and the stream
        self._call_memo: dict[Any, Any] = {}
        op = "KVCache"
        num_layers, num_pages = _validate_shape_args(op, num_layers, num_pages)
        if device is not None:
            device = check_int(device, op, "device", 0, MAX_DEVICE)
        lib = _lib.lib()
        nbytes_c = _lib.ffi.new("size_t*")
        _lib.check(lib.snapmla_cache_bytes(num_layers, num_pages, nbytes_c), "snapmla_cache_bytes")
        nbytes = int(nbytes_c[0])
        page_stride = check_int(page_stride, op, "page_stride", 0, MAX_SPAN_BYTES)
        if page_stride:
            if not page_stride_ok(page_stride):
                raise argument_error(op, "page_stride", f"0 or {PAGE_STRIDES}", str(page_stride))
            if num_layers * num_pages * page_stride > MAX_SPAN_BYTES:
                raise argument_error(
                    op, "page_stride", "a cache of at most 2^63 - 1 bytes", str(page_stride)
                )
            nbytes = num_layers * num_pages * page_stride
        layer_ptrs: list[int] = []
        layer_bytes = num_pages * (page_stride or PAGE_BYTES)
        if layers is not None:
            if buffer is not None:
                raise argument_error(
                    op, "layers", "None when buffer is given (one or the other)", "a sequence"
                )
            if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
                raise argument_error(
                    op, "layers", "a sequence of num_layers tensors", type(layers).__name__
                )
            if len(layers) != num_layers:
                raise argument_error(
                    op, "layers", f"{num_layers} tensors (num_layers)", f"{len(layers)} tensors"
                )
            views = []
            for index, tensor in enumerate(layers):
                v, device = _validate_buffer(
                    tensor, layer_bytes, device, f"layers[{index}]", PLANE_ALIGNMENT
                )
                views.append(v)
            order = sorted(range(num_layers), key=lambda i: views[i].ptr)
            for prev, nxt in zip(order, order[1:]):
                if views[nxt].ptr - views[prev].ptr < layer_bytes:
                    raise argument_error(
                        op,
                        f"layers[{nxt}]",
                        f"no bytes in common with layers[{prev}]",
                        "overlapping memory",
                    )
            layer_ptrs = [v.ptr for v in views]
            ptr, memory_bytes = 0, 0
            buffer = tuple(layers)
            self._buffer_view = tuple(views)
        elif buffer is not None:
            v, device = _validate_buffer(buffer, nbytes, device)
            ptr, memory_bytes = v.ptr, v.shape[0]
            self._buffer_view = v
        else:
            if device is None:
                cupy = cupy_module(op)
                try:
                    device = int(cupy.cuda.Device().id)
                except Exception as exc:
                    raise SnapMLAError(f"{op}: cannot get the current CUDA device: {exc}") from exc
            stream = Stream(None, op)
            buffer, ptr = empty(op, (nbytes,), "uint8", device, stream)
            self._owned = OwnedMemory((buffer,), stream.handle(device), device)
            memory_bytes = nbytes
        config = _lib.new_struct(
            "snapmla_cache_config_t",
            num_layers=num_layers,
            num_pages=num_pages,
            device=device,
            memory=_lib.ffi.cast("void*", ptr),
            memory_bytes=memory_bytes,
            page_stride=page_stride,
        )
        layer_array = None
        if layer_ptrs:
            layer_array = _lib.ffi.new("void*[]", [_lib.ffi.cast("void*", q) for q in layer_ptrs])
            config.layer_memory = layer_array
        handle = _lib.ffi.new("snapmla_cache_t*")
        _lib.check(lib.snapmla_cache_create(config, handle), "snapmla_cache_create")
        self._handle = handle[0]
        self._buffer = buffer
        info = _lib.new_struct("snapmla_cache_info_t")
        _lib.check(lib.snapmla_cache_info(self._handle, info), "snapmla_cache_info")
        self._num_layers = int(info.num_layers)
        self._num_pages = int(info.num_pages)
        self._page_size = int(info.page_size)
        self._device = int(info.device)
        self._data_ptr = int(_lib.ffi.cast("uintptr_t", info.data))
        self._layer_bytes = int(info.layer_bytes)
        self._nbytes = int(info.total_bytes)
        # What calls must not alias: the whole block, or each layer's own memory.
        self._extents: Extent | list[Extent] = (
            [(q, self._layer_bytes) for q in layer_ptrs]
            if layer_ptrs
            else (self._data_ptr, self._nbytes)
        )

    # ------------------------------------------------------------------------- properties

    num_layers = read_only("_num_layers", "Number of layers.")
    num_pages = read_only("_num_pages", "Pages per layer.")
    page_size = read_only("_page_size", "Token slots per page (64).")
    nbytes = read_only("_nbytes", "Bytes of cache memory (all layers).")
    layer_bytes = read_only("_layer_bytes", "Bytes per layer (``num_pages * page_stride``).")
    data_ptr = read_only(
        "_data_ptr",
        "Device address of the first page of layer 0 (with ``layers=``, the layers are not one "
        "range from it: ``layer_data_ptr``).",
    )
    device = read_only("_device", "CUDA device ordinal.")
    buffer = read_only(
        "_buffer",
        "The array object holding the memory (the caller's ``buffer``, the tuple of its "
        "``layers``, or the CuPy array); ``None`` once closed.",
    )

    @property
    def capacity(self) -> int:
        """Token slots per layer (``num_pages * 64``)."""
        return self._num_pages * self._page_size

    def layer_data_ptr(self, layer: int) -> int:
        """Device address of the first page of ``layer`` (``layer_bytes`` follow it)."""
        layer = _validate_layer("KVCache.layer_data_ptr", layer, self._num_layers)
        if isinstance(self._extents, list):
            return self._extents[layer][0]
        return self._data_ptr + layer * self._layer_bytes

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._handle is None or self._in_use.closed

    # ------------------------------------------------------------------------- operations

    def append(self, layer: int, c_kv: Any, k_pe: Any, slots: Any, *, stream: Any = None) -> None:
        """Quantize ``n`` new tokens and write them into ``layer`` (one launch, graph-safe).

        Args:
            layer: Layer index, ``0 <= layer < num_layers``.
            c_kv: BF16 ``[n, 512]`` (row stride >= 512 elements, unit inner stride).
            k_pe: BF16 ``[n, 64]`` (row stride >= 64 elements, unit inner stride).
            slots: int64 ``[n]``, contiguous: token ``i`` goes to slot ``slots[i]``; a negative
                slot (padding) or one ``>= capacity`` skips the token.
            stream: CUDA stream: an int handle, or an object with ``.ptr`` (CuPy) or
                ``.cuda_stream`` (PyTorch). ``None``: the current stream of the inputs'
                framework: torch's current stream if any input is a torch tensor (so that
                CUDA graph capture works without ``stream=``), else CuPy's current stream.
                The producers' ``__dlpack__(stream=...)`` is given this stream.

        All tensors must be CUDA tensors on the cache's device, aligned to their element size
        (a DLPack ``byte_offset`` of 1 is refused), and must not alias the cache. ``n = 0`` is
        a no-op.
        """
        op = "KVCache.append"
        self._enter(op)
        try:
            self._append(op, layer, c_kv, k_pe, slots, stream)
        finally:
            self._in_use.exit()

    def _append(self, op: str, layer: Any, c_kv: Any, k_pe: Any, slots: Any, stream: Any) -> None:
        s = Stream(stream, op, (c_kv, k_pe, slots))
        checker = Checker(op, s)
        # The call memo (host time), as decode's: a call whose layer and tensors
        # (each by Checker.read's key: address, device, dtype, shape, strides, flags) equal an
        # earlier call's on this cache passed every check then and takes the same C arguments.
        # The layer is checked first, as without the memo; each tensor is still read (with the
        # stream handshake).
        layer = _validate_layer(op, layer, self._num_layers)
        keys = checker.read_keys((("c_kv", c_kv), ("k_pe", k_pe), ("slots", slots)))
        memo_key = None if keys is None else (op, layer, keys)
        args = None if memo_key is None else self._call_memo.get(memo_key)
        if args is None:
            layer, c, c_stride, k, k_stride, sl = _validate_append_args(
                self._num_layers,
                self._device,
                self._extents,
                layer,
                c_kv,
                k_pe,
                slots,
                s,
                checker,
            )
            ffi = _lib.ffi
            args = (
                layer,
                ffi.cast(_CT["const void*"], c.ptr),
                c_stride,
                ffi.cast(_CT["const void*"], k.ptr),
                k_stride,
                ffi.cast(_CT["const int64_t*"], sl.ptr),
                c.shape[0],
            )
            if memo_key is not None:
                remember(self._call_memo, memo_key, args, _CALL_MEMO_SIZE)
        if args[-1] == 0:  # n = 0: a no-op
            return
        self._launch(op, "snapmla_append", s, args)

    def gather_dequant(
        self,
        layer: int,
        block_table: Any,
        seqlens: Any,
        out_rows: Any,
        *,
        c_kv: Any,
        k_pe: Any,
        stream: Any = None,
    ) -> None:
        """Gather requests' tokens by their block tables and dequantize them to BF16 (one
        launch, graph-safe): token ``i < seqlens[r]`` of request ``r`` goes to row
        ``out_rows[r] + i`` of ``c_kv`` / ``k_pe``.

        Args:
            layer: Layer index, ``0 <= layer < num_layers``.
            block_table: int32 ``[b, max_pages]``; row stride >= max_pages, unit inner stride.
            seqlens: int32 ``[b]``, contiguous: tokens to read (< 0 reads as 0; tokens past
                ``max_pages * 64`` are skipped).
            out_rows: int64 ``[b]``, contiguous: each request's first output row.
            c_kv: Output BF16 ``[rows, 512]`` (row stride >= 512, unit inner stride).
            k_pe: Output BF16 ``[rows, 64]`` (row stride >= 64). Rows outside ``[0, rows)``
                are skipped, rows no token maps to keep their contents; a page id outside the
                layer gives a NaN row.
            stream: CUDA stream, as for ``append``.
        """
        op = "KVCache.gather_dequant"
        self._enter(op)
        try:
            s = Stream(stream, op, (block_table, seqlens, out_rows, c_kv, k_pe))
            layer = _validate_layer(op, layer, self._num_layers)
            checker = Checker(op, s)
            bt = checker.tensor(
                block_table, "block_table", dtypes=INT32, shape=("b", "max_pages"), layout="inner"
            )
            b, max_pages = bt.shape
            bt_stride = checker.stride(bt, "block_table", 0, max_pages, "row")
            sl = checker.tensor(seqlens, "seqlens", dtypes=INT32, shape=(b,))
            rows = checker.tensor(out_rows, "out_rows", dtypes=INT64, shape=(b,))
            c = checker.tensor(
                c_kv,
                "c_kv",
                dtypes=BF16,
                shape=("rows", CONTENT_DIM),
                layout="inner",
                writable=True,
            )
            n = c.shape[0]
            c_stride = checker.stride(c, "c_kv", 0, CONTENT_DIM, "row")
            k = checker.tensor(
                k_pe, "k_pe", dtypes=BF16, shape=(n, ROPE_DIM), layout="inner", writable=True
            )
            k_stride = checker.stride(k, "k_pe", 0, ROPE_DIM, "row")
            checker.devices(self._device)
            inputs = [
                ("the cache", extent(*layer_extent(self._extents, layer))),
                ("block_table", bt),
                ("seqlens", sl),
                ("out_rows", rows),
            ]
            checker.no_overlap("c_kv", c, [*inputs, ("k_pe", k)])
            checker.no_overlap("k_pe", k, inputs)
            if n == 0 or b == 0:
                return
            cast = _lib.ffi.cast
            args = (
                layer,
                cast(_CT["const int32_t*"], bt.ptr),
                bt_stride,
                b,
                max_pages,
                cast(_CT["const int32_t*"], sl.ptr),
                cast(_CT["const int64_t*"], rows.ptr),
                n,
                cast(_CT["void*"], c.ptr),
                c_stride,
                cast(_CT["void*"], k.ptr),
                k_stride,
            )
            self._launch(op, "snapmla_gather_dequant", s, args)
        finally:
            self._in_use.exit()

    def copy_slots(self, layer: int, src_slots: Any, dst_slots: Any, *, stream: Any = None) -> None:
        """Copy tokens byte for byte between slots of ``layer`` (one launch, graph-safe): token
        ``src_slots[i]`` to ``dst_slots[i]`` (its FP8 content, RoPE and scale), for engines that
        compact or reorder their caches.

        Args:
            layer: Layer index, ``0 <= layer < num_layers``.
            src_slots, dst_slots: int64 ``[n]``, contiguous, on the cache's device. A negative
                slot (in either) or one ``>= capacity`` skips the token. A slot written for one
                token and read or written for another races: keep the destinations distinct and
                apart from the sources.
            stream: CUDA stream, as for ``append``.
        """
        op = "KVCache.copy_slots"
        self._enter(op)
        try:
            s = Stream(stream, op, (src_slots, dst_slots))
            layer = _validate_layer(op, layer, self._num_layers)
            checker = Checker(op, s)
            src = checker.tensor(src_slots, "src_slots", dtypes=INT64, shape=("n",))
            n = src.shape[0]
            dst = checker.tensor(dst_slots, "dst_slots", dtypes=INT64, shape=(n,))
            checker.devices(self._device)
            cache_view = extent(*layer_extent(self._extents, layer))
            for name, v in (("src_slots", src), ("dst_slots", dst)):
                checker.no_overlap(name, v, [("the cache", cache_view)])
            if n == 0:
                return
            cast = _lib.ffi.cast
            args = (
                layer,
                cast(_CT["const int64_t*"], src.ptr),
                cast(_CT["const int64_t*"], dst.ptr),
                n,
            )
            self._launch(op, "snapmla_copy_slots", s, args)
        finally:
            self._in_use.exit()

    def fetch_dequant(
        self,
        layer: int,
        slots: Any,
        *,
        c_kv: Any = None,
        k_pe: Any = None,
        stream: Any = None,
    ) -> tuple[Any, Any]:
        """Gather tokens from ``layer`` and dequantize them to BF16 (one launch, graph-safe).

        Args:
            layer: Layer index, ``0 <= layer < num_layers``.
            slots: int64 ``[n]``, contiguous. A negative slot yields a row of zeros, a slot
                ``>= capacity`` a row of NaN.
            c_kv: Output BF16 ``[n, 512]`` (row stride >= 512, unit inner stride), or ``None``
                for a new CuPy array.
            k_pe: Output BF16 ``[n, 64]`` (row stride >= 64, unit inner stride), or ``None``.
            stream: CUDA stream, as for ``append``.

        All tensors must be CUDA tensors on the cache's device, aligned to their element size.

        Returns:
            ``(c_kv, k_pe)``: the given outputs, or new CuPy arrays of dtype
            ``ml_dtypes.bfloat16`` (``uint16`` holding the bits if CuPy refuses that dtype),
            allocated under the call's stream.
        """
        op = "KVCache.fetch_dequant"
        self._enter(op)
        try:
            return self._fetch_dequant(op, layer, slots, c_kv, k_pe, stream)
        finally:
            self._in_use.exit()

    def _fetch_dequant(
        self, op: str, layer: Any, slots: Any, c_kv: Any, k_pe: Any, stream: Any
    ) -> tuple[Any, Any]:
        s = Stream(stream, op, (slots, c_kv, k_pe))
        checker = Checker(op, s)
        # The call memo, as append's (outputs given only: nothing to allocate).
        layer = _validate_layer(op, layer, self._num_layers)
        args = memo_key = None
        if c_kv is not None and k_pe is not None:
            keys = checker.read_keys((("slots", slots), ("c_kv", c_kv), ("k_pe", k_pe)))
            memo_key = None if keys is None else (op, layer, keys)
            args = None if memo_key is None else self._call_memo.get(memo_key)
        call = None
        if args is None:
            call = _validate_fetch_args(
                self._num_layers,
                self._device,
                self._extents,
                layer,
                slots,
                c_kv,
                k_pe,
                s,
                checker,
            )
        with on_device(op, self._device):
            if call is not None:
                layer, sl, c, c_stride, k, k_stride = call
                n = sl.shape[0]
                if c is None:
                    c_kv, c_ptr = empty(op, (n, CONTENT_DIM), "bfloat16", self._device, s)
                else:
                    c_ptr = c.ptr
                if k is None:
                    k_pe, k_ptr = empty(op, (n, ROPE_DIM), "bfloat16", self._device, s)
                else:
                    k_ptr = k.ptr
                ffi = _lib.ffi
                args = (
                    layer,
                    ffi.cast(_CT["const int64_t*"], sl.ptr),
                    n,
                    ffi.cast(_CT["void*"], c_ptr),
                    c_stride,
                    ffi.cast(_CT["void*"], k_ptr),
                    k_stride,
                )
                if memo_key is not None:
                    remember(self._call_memo, memo_key, args, _CALL_MEMO_SIZE)
            if args[2] == 0:  # n = 0: nothing to fetch
                return c_kv, k_pe
            status = _lib.lib().snapmla_fetch_dequant(self._handle, *args, s.c(self._device))
            if status:  # (_lib.check's own test, without the call on success)
                _lib.check(status, "snapmla_fetch_dequant")
        self._used_on(s)
        return c_kv, k_pe

    # ------------------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Destroy the C handle and drop the memory. Idempotent, thread-safe, never blocks on
        the GPU: waits only for calls of other threads still inside an operation with this
        cache (raises ``SnapMLAError`` when called from inside one on this thread); owned
        memory is freed stream-ordered after the queued work (see the class)."""
        if not self._in_use.close("KVCache.close"):
            return
        try:
            handle, self._handle = self._handle, None
            owned, self._owned = self._owned, None
            self._buffer = self._buffer_view = None
            self._decode_memo.clear()
            self._call_memo.clear()
            try:
                if handle is not None:
                    _lib.check(_lib.lib().snapmla_cache_destroy(handle), "snapmla_cache_destroy")
            finally:
                if owned is not None:
                    owned.release()
        finally:
            self._in_use.closed_done()

    def __repr__(self) -> str:
        if self.closed and not hasattr(self, "_num_layers"):
            return "KVCache(<not created>)"
        state = ", closed" if self.closed else ""
        return (
            f"KVCache(num_layers={self._num_layers}, num_pages={self._num_pages}, "
            f"device={self._device}, nbytes={self._nbytes}{state})"
        )

    def _enter(self, op: str, argument: str | None = None) -> None:
        """Count a call as inside an operation (``_in_use.exit()`` ends it), or refuse it when
        the cache is closed."""
        if self._handle is None or not self._in_use.enter():
            raise self._refuse_closed(op, argument)

    def _launch(self, op: str, function: str, stream: Stream, args: tuple[Any, ...]) -> None:
        """Call the C ``function`` on this cache with ``args`` (those after the handle, before
        the stream) on ``stream``, with the cache's device current."""
        with on_device(op, self._device):
            status = getattr(_lib.lib(), function)(self._handle, *args, stream.c(self._device))
            if status:  # (_lib.check's own test, without the call on success)
                _lib.check(status, function)
        self._used_on(stream)

    def _used_on(self, stream: Stream) -> None:
        """After a launch on ``stream``: order the release of owned memory after it."""
        if self._owned is not None:
            self._owned.used_on(stream.handle(self._device))
