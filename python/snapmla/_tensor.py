"""Argument checks, CUDA streams, output allocation and object lifetime shared by the operations.

Every refusal is a ``SnapMLAError`` that names the operation, the argument, what was expected
and what was given. An operation checks, for every tensor argument in order, its dtype, then
its number of dimensions and shape, then its strides, then its address (aligned as the C API
requires, and the bytes it spans inside the 64-bit address space); the devices of all tensors
are checked last. CuPy is imported only when a stream must be resolved or memory allocated.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import _dlpack, _lib
from ._dlpack import TensorView
from ._errors import SnapMLAError, argument_error

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "BF16",
    "BYTES",
    "FP8",
    "FP32",
    "INT32",
    "INT64",
    "Checker",
    "InUse",
    "OwnedMemory",
    "Stream",
    "cupy_module",
    "empty",
    "extent",
    "on_device",
    "read_only",
    "remember",
]

# Accepted dtype names, the first being the real one: BF16 data may come as raw uint16 bits and
# FP8 E4M3 data as raw uint8 bytes (frameworks without those dtypes, CuPy's fallback below).
BF16 = ("bfloat16", "uint16")
FP8 = ("float8_e4m3fn", "uint8")
INT32 = ("int32",)
INT64 = ("int64",)
FP32 = ("float32",)
BYTES = ("uint8", "int8")

_RAW_NOTE = {"uint16": "raw bits", "uint8": "raw bytes"}

# The C API computes byte offsets in int64 and addresses in 64 bits (snapmla.h, "Pointers,
# sizes and offsets").
MAX_SPAN_BYTES = 2**63 - 1
ADDRESS_SPACE = 2**64


def _dtype_text(dtypes: Sequence[str]) -> str:
    """``dtype bfloat16 (or uint16 raw bits) or float32``: a raw dtype that follows its real one
    (BF16, FP8) is shown as its stand-in."""
    names: list[str] = []
    for i, d in enumerate(dtypes):
        if i and (dtypes[i - 1], d) in (BF16, FP8):
            names[-1] += f" (or {d} {_RAW_NOTE[d]})"
        else:
            names.append(d)
    return "dtype " + " or ".join(names)


def _shape_text(shape: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _shape_matches(got: Sequence[int], want: Sequence[int | str]) -> bool:
    if len(got) == len(want) and (not want or want[0] != "..."):
        for g, w in zip(got, want):
            if g != w and isinstance(w, int):
                return False
        return True
    if want and want[0] == "...":
        want = want[1:]
        if len(got) < len(want):
            return False
        got = got[len(got) - len(want) :]
    if len(got) != len(want):
        return False
    return all(not isinstance(w, int) or g == w for g, w in zip(got, want))


def cupy_module(op: str) -> Any:
    """Import CuPy, or refuse with a message saying what needed it."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA installation
        raise SnapMLAError(
            f"{op}: CuPy is needed to allocate GPU memory and to find the current CUDA stream, "
            f"but 'import cupy' failed: {exc}"
        ) from exc
    return cupy


# Whether ``import cupy`` failed with ImportError once: it is not tried again (a failed import
# searches sys.path, tens of microseconds at every call).
_cupy_missing = False


def _cupy_if_importable() -> Any:
    """The ``cupy`` module, or ``None`` when it cannot be imported (ImportError)."""
    global _cupy_missing
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return cupy
    if _cupy_missing:
        return None
    try:
        import cupy
    except ImportError:
        _cupy_missing = True
        return None
    return cupy


class _OnDevice:
    """The context of ``on_device``."""

    __slots__ = ("_context", "_device", "_op")

    def __init__(self, op: str, device: int) -> None:
        self._op = op
        self._device = device
        self._context: Any = None

    def __enter__(self) -> None:
        cupy = _cupy_if_importable()  # importable: on_device returns no _OnDevice otherwise
        try:
            context = cupy.cuda.Device(self._device)
            context.__enter__()
        except Exception as exc:
            raise SnapMLAError(
                f"{self._op}: cannot make CUDA device {self._device} current: {exc}"
            ) from exc
        self._context = context

    def __exit__(self, *exc_info: object) -> None:
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(None, None, None)


# ``on_device``'s context where there is nothing to make current (reusable: it holds nothing)
_NOTHING = contextlib.nullcontext()


def on_device(op: str, device: int) -> _OnDevice | contextlib.nullcontext[None]:
    """A context making ``device`` the current CUDA device for the body (through CuPy when
    importable; without CuPy the current device is left as it is and the C library checks
    it). Nothing is entered when ``device`` is current already (CuPy's ``Device`` context
    would set nothing and restore nothing then; entering it costs a microsecond a call)."""
    cupy = _cupy_if_importable()
    if cupy is None:
        return _NOTHING
    try:
        current = cupy.cuda.runtime.getDevice()
    except Exception:  # noqa: BLE001 (entering the context tries again and says what failed)
        current = None
    return _NOTHING if current == device else _OnDevice(op, device)


class Stream:
    """The CUDA stream of one operation, as given by the caller, resolved on first use.

    An ``int`` is a raw ``cudaStream_t`` handle (0 = the legacy default stream); an object with
    ``.ptr`` (CuPy) or ``.cuda_stream`` (PyTorch) gives its handle. ``None`` (the default) is
    the current stream of the inputs' framework, on the operation's device:

    - any of ``inputs`` is a PyTorch tensor: ``torch.cuda.current_stream(device)`` (inside
      ``torch.cuda.graph(...)`` that is the capture stream, so capture works without
      ``stream=``). torch is never imported here: a torch tensor means torch is loaded;
    - otherwise (CuPy, JAX, anything else): CuPy's current stream, which is the legacy
      default stream unless a CuPy stream was made current.

    The type is checked at once; the default is resolved only when first needed (CuPy or torch
    is asked then), and kept.
    """

    def __init__(self, stream: Any, op: str, inputs: Iterable[Any] = ()) -> None:
        self._op = op
        self._handle: int | None = None
        self._inputs: tuple[Any, ...] = ()
        if stream is None:
            self._inputs = tuple(x for x in inputs if x is not None)
            return
        if type(stream) is int and 0 <= stream < ADDRESS_SPACE:  # a handle, the common case
            self._handle = stream
            return
        if isinstance(stream, bool):
            raise argument_error(op, "stream", _STREAM_EXPECTED, repr(stream))
        for attribute in (None, "ptr", "cuda_stream"):
            try:
                raw = stream if attribute is None else getattr(stream, attribute)
                handle = operator.index(raw)
            except (AttributeError, TypeError):
                continue
            if not 0 <= handle < ADDRESS_SPACE:
                raise argument_error(op, "stream", _STREAM_EXPECTED, f"handle {handle}")
            self._handle = handle
            return
        raise argument_error(op, "stream", _STREAM_EXPECTED, type(stream).__name__)

    def handle(self, device: int) -> int:
        """The raw stream handle (resolving ``None`` as the class says, on ``device``)."""
        if self._handle is None:
            self._handle = self._default(device)
            self._inputs = ()  # resolved: the inputs are no longer needed
        return self._handle

    def _default(self, device: int) -> int:
        torch = sys.modules.get("torch")
        tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
        if isinstance(tensor_type, type) and any(isinstance(x, tensor_type) for x in self._inputs):
            try:
                return int(torch.cuda.current_stream(device).cuda_stream)
            except Exception as exc:
                raise SnapMLAError(
                    f"{self._op}: cannot get torch's current CUDA stream: {exc}"
                ) from exc
        cupy = cupy_module(self._op)
        try:
            with cupy.cuda.Device(device):
                return int(cupy.cuda.get_current_stream().ptr)
        except Exception as exc:
            raise SnapMLAError(f"{self._op}: cannot get CuPy's current CUDA stream: {exc}") from exc

    def c(self, device: int) -> Any:
        """The stream as the C API's ``snapmla_stream_t``."""
        handle = self._handle
        if handle is None:
            handle = self.handle(device)
        return _lib.stream_t(handle)


_STREAM_EXPECTED = (
    "None, a CUDA stream handle (int in [0, 2^64)), or an object with .ptr or .cuda_stream"
)


# Views that passed Checker.tensor, by (export_key's key, dtypes, shape, layout, writable, align):
# a call with the same tensor (same DLPack bytes: address, device, dtype, shape, strides,
# flags) and the same expectations skips the parsing and the checks that depend on nothing
# else (host overhead). The views hold no producer object or capsule. Cleared
# when full; dict operations are atomic under the GIL, and a lost entry only costs a check.
_checked: dict[tuple[Any, ...], TensorView] = {}
_MEMO_SIZE = 4096


class Checker:
    """Reads and checks the tensor arguments of one operation call.

    ``tensor()`` reads an argument (through DLPack, with the call's stream handshake) and
    checks its dtype, shape and strides at once; ``devices()`` then checks that every tensor
    read so far lives on the operation's CUDA device, and ``no_overlap()`` that outputs do not
    alias. Nothing is written by any of these.
    """

    def __init__(self, op: str, stream: Stream | None) -> None:
        self.op = op
        self.stream = stream
        self.views: list[tuple[str, TensorView]] = []
        # read() results by argument, for the tensor() call that checks that argument
        self._reads: dict[str, tuple[Any, Any, Any]] = {}

    def read(self, obj: Any, argument: str) -> Any:
        """Read ``obj`` as ``tensor()`` would (torch attributes, or the DLPack export with the
        call's stream handshake) without checking it, and return its memo key: what the checks
        of the tensor depend on (``None``: not memoizable; DLPack bytes that need a closer
        look). ``tensor()`` on the same argument then uses this read. A caller can key its own
        memo on the keys of every tensor of a call (``read_keys``); what keeps a DLPack export
        alive is held here until ``tensor()`` takes it, or by the checker itself."""
        return self._read_all(((argument, obj),), skip_none=False)[0]

    def read_keys(self, arguments: Iterable[tuple[str, Any]]) -> tuple[Any, ...] | None:
        """``read()`` each ``(argument, obj)`` of a call (``obj`` ``None``: skipped), for a call
        memo's key: the tuple of their keys, or ``None`` when one is not memoizable or cannot
        be read. The call's checks then read (again) and check the tensors in their order, so
        that the first bad argument is still the one named."""
        try:
            keys = self._read_all(arguments)
        except SnapMLAError:
            return None
        return None if None in keys else tuple(keys)

    def _read_all(
        self, arguments: Iterable[tuple[str, Any]], skip_none: bool = True
    ) -> list[Any]:
        """``read()``'s work for each ``(argument, obj)`` (``obj`` ``None``: skipped, unless
        ``skip_none`` is false: ``read()`` of one argument refuses it as it refuses any object
        without ``__dlpack__``), in one loop: this runs for every tensor argument of every
        call. Raises at the first tensor that cannot be read; the reads before it
        are kept."""
        op, stream, reads = self.op, self.stream, self._reads
        export_key = _dlpack.export_key
        # The handle once resolved, else the resolver (which keeps the handle it resolves: the
        # later tensors get the same one through it).
        handle = None
        if stream is not None:
            handle = stream._handle
            if handle is None:
                handle = stream.handle
        keys = []
        producers: dict[int, int | None] = {}  # torch's current stream by device, asked once
        for argument, obj in arguments:
            if obj is None and skip_none:
                continue
            # A CUDA torch tensor whose work is on this call's stream: its attributes, no
            # capsule (torch_fields is asked only about tensors of torch's own module).
            direct = None
            if type(obj).__module__ == "torch":
                direct = _dlpack.torch_fields(obj, handle, producers)
            if direct is not None:
                read = (direct, direct, None)
            else:
                capsule, key = export_key(obj, handle, op, argument)
                read = (key, None, (obj, capsule))
            reads[argument] = read
            keys.append(read[0])
        return keys

    def tensor(
        self,
        obj: Any,
        argument: str,
        *,
        dtypes: Sequence[str],
        shape: Sequence[int | str],
        layout: str = "contiguous",
        writable: bool = False,
        shape_note: str = "",
        align: int = 0,
        align_note: str = "",
    ) -> TensorView:
        """Read and check one tensor argument.

        Args:
            obj: The caller's DLPack tensor.
            argument: Its name in the public API.
            dtypes: Accepted dtype names.
            shape: Expected shape; an ``int`` must match, a ``str`` (a symbol such as ``"n"``)
                matches any size and is shown as is in messages. A first entry ``"..."``
                matches any number of leading dimensions.
            layout: ``"contiguous"`` (compact row-major) or ``"inner"`` (unit stride in the
                last dimension; the caller checks the other strides with ``stride()``).
            writable: The tensor is an output: refuse read-only tensors.
            shape_note: Text appended to the expected shape in messages.
            align: Required alignment of the address in bytes; 0: the element size. Not
                checked for an empty tensor (the C API does not read its pointer).
            align_note: Why (shown in messages); default: the element type.
        """
        read = self._reads.pop(argument, None)
        if read is None:
            self.read(obj, argument)
            read = self._reads.pop(argument)
        # direct: a torch tensor's fields (the caller's frame holds the tensor for the call);
        # else keepalive holds the DLPack export and its producer for the view
        key, direct, keepalive = read
        capsule = keepalive[1] if keepalive is not None else None
        # A tensor whose DLPack bytes (see export_key), or torch attributes, passed these same
        # checks before passes them again: hand out that view, holding this call's capsule.
        if key is not None:
            memo_key = (key, dtypes, shape, layout, writable, align)
            try:
                checked = _checked.get(memo_key)
            except TypeError:  # an unhashable shape or dtypes (never from snapmla's ops)
                checked = memo_key = key = None
            if checked is not None:
                v = checked if keepalive is None else checked.with_keepalive(keepalive)
                self.views.append((argument, v))
                return v
        if direct is not None:
            ptr, dims, strides, name, device_id, itemsize = direct
            v = _dlpack.TensorView(ptr, dims, strides, name, _dlpack.CUDA, device_id, itemsize)
        else:
            v = _dlpack._read_capsule(capsule, obj, self.op, argument)
        if v.dtype not in dtypes:
            raise argument_error(self.op, argument, _dtype_text(dtypes), v.dtype)
        if not _shape_matches(v.shape, shape):
            raise argument_error(
                self.op,
                argument,
                f"shape {_shape_text(shape)}{shape_note}",
                _shape_text(v.shape),
            )
        if layout == "contiguous":
            if not v.is_contiguous():
                raise argument_error(
                    self.op,
                    argument,
                    "a contiguous tensor",
                    f"strides (elements) {_shape_text(v.strides)} for shape {_shape_text(v.shape)}",
                )
        elif v.ndim and v.shape[-1] > 1 and v.numel > 0 and v.strides[-1] != 1:
            raise argument_error(
                self.op,
                argument,
                "unit stride in the last dimension",
                f"strides (elements) {_shape_text(v.strides)}",
            )
        if writable and v.read_only:
            raise argument_error(self.op, argument, "a writable tensor", "a read-only one")
        if v.numel > 0:
            self._check_address(v, argument, align or v.itemsize, align_note)
        self.views.append((argument, v))
        if key is not None:
            if len(_checked) >= _MEMO_SIZE:
                _checked.clear()
            _checked[memo_key] = v.with_keepalive(None)
        return v

    def _check_address(self, v: TensorView, argument: str, align: int, note: str) -> None:
        """The C API's checks of a pointer: aligned, and the bytes spanned addressable
        (``note``: why that alignment; empty: the element type)."""
        if v.ptr % align:
            raise argument_error(
                self.op,
                argument,
                f"a {align}-byte aligned address ({note or v.dtype})",
                f"{v.ptr:#x}",
            )
        start, end = v.byte_extent()
        if end - start > MAX_SPAN_BYTES:
            raise argument_error(
                self.op,
                argument,
                "at most 2^63 - 1 bytes spanned by its shape and strides",
                f"{end - start} bytes (shape {_shape_text(v.shape)}, strides (elements) "
                f"{_shape_text(v.strides)})",
            )
        if start < 0 or end > ADDRESS_SPACE:
            raise argument_error(
                self.op,
                argument,
                "bytes inside the 64-bit address space",
                f"[{start:#x}, {end:#x})",
            )

    def stride(
        self,
        v: TensorView,
        argument: str,
        dim: int,
        minimum: int,
        what: str,
        default: int | None = None,
    ) -> int:
        """Stride of dimension ``dim`` in elements, refused below ``minimum``. A dimension of
        size <= 1 has no meaningful stride: ``default`` (else ``minimum``) is returned for it,
        the stride a compact tensor would have."""
        if v.shape[dim] <= 1 or v.numel == 0:  # no element is addressed through it
            return minimum if default is None else default
        got = v.strides[dim]
        if got < minimum:
            raise argument_error(
                self.op, argument, f"a {what} stride >= {minimum} elements", str(got)
            )
        return got

    def devices(self, device: int | None) -> int:
        """Check that every tensor read is a CUDA tensor on ``device`` (``None``: on the
        device of the first tensor); return that device."""
        for argument, v in self.views:
            if device is None and v.device_type == _dlpack.CUDA:
                device = v.device_id
            if v.device_type != _dlpack.CUDA or v.device_id != device:
                expected = "a CUDA tensor" if device is None else f"a CUDA tensor on cuda:{device}"
                raise argument_error(self.op, argument, expected, v.device)
        if device is None:
            raise SnapMLAError(f"{self.op}: no tensor argument to take the CUDA device from")
        return device

    def no_overlap(
        self, argument: str, v: TensorView, others: Sequence[tuple[str, TensorView | None]]
    ) -> None:
        """Refuse an output ``v`` whose bytes overlap any of ``others``."""
        start, end = v.byte_extent()
        for name, other in others:
            if other is None or start == end:
                continue
            other_start, other_end = other.byte_extent()
            if start < other_end and other_start < end:
                raise argument_error(
                    self.op,
                    argument,
                    f"memory that does not overlap {name}",
                    f"bytes [{start:#x}, {end:#x}) against [{other_start:#x}, {other_end:#x})",
                )


def remember(memo: dict[Any, Any], key: Any, value: Any, size: int) -> None:
    """Keep ``value`` in a call memo (cleared when it holds ``size`` entries: a serving loop
    repeats a few calls, so a full memo means the calls changed). ``value`` must be read-only
    from here on: other threads may use it at once (dict operations are atomic)."""
    if len(memo) >= size:
        memo.clear()
    memo[key] = value


@functools.lru_cache(maxsize=256)
def extent(ptr: int, nbytes: int) -> TensorView:
    """A flat byte range as a view, for ``Checker.no_overlap`` (e.g. the cache's memory; the
    views are immutable, so the same one is returned for the same range)."""
    return TensorView(
        ptr=ptr,
        shape=(nbytes,),
        strides=(1,),
        dtype="uint8",
        device_type=_dlpack.CUDA,
        device_id=0,
        itemsize=1,
    )


# dtype name -> whether CuPy accepted the ml_dtypes type last time (None: not tried yet).
_cupy_accepts: dict[str, bool] = {}
_RAW_DTYPES = {"bfloat16": "uint16", "float8_e4m3fn": "uint8"}


def empty(
    op: str, shape: Sequence[int], dtype: str, device: int, stream: Stream | None = None
) -> tuple[Any, int]:
    """A new uninitialized CuPy array on ``device`` and its device pointer.

    ``stream``: the operation's stream, made CuPy's current stream for the allocation, so
    that the block belongs to that stream's part of CuPy's memory pool: once the array is
    dropped, CuPy hands the block out again only to allocations on the same stream, which are
    ordered after the work already queued there (``None``: CuPy's current stream).

    ``bfloat16`` and ``float8_e4m3fn`` arrays are CuPy arrays of ``ml_dtypes.bfloat16`` /
    ``ml_dtypes.float8_e4m3fn`` when the installed CuPy accepts those dtypes, else of the
    same-size raw dtype ``uint16`` / ``uint8`` holding the bits (view them with
    ``.view(ml_dtypes.bfloat16)`` after ``.get()``); ``float32`` and ``uint8`` are plain.
    """
    import numpy

    cupy = cupy_module(op)
    shape = tuple(int(s) for s in shape)
    sweep_released()
    try:
        with cupy.cuda.Device(device), _current_stream(cupy, stream, device):
            if dtype in _RAW_DTYPES:
                if _cupy_accepts.get(dtype, True):
                    import ml_dtypes

                    try:
                        array = cupy.empty(shape, dtype=getattr(ml_dtypes, dtype))
                        _cupy_accepts[dtype] = True
                        return array, int(array.data.ptr)
                    except (TypeError, ValueError, NotImplementedError):
                        _cupy_accepts[dtype] = False
                array = cupy.empty(shape, dtype=numpy.dtype(_RAW_DTYPES[dtype]))
            else:
                array = cupy.empty(shape, dtype=numpy.dtype(dtype))
    except SnapMLAError:
        raise
    except Exception as exc:
        raise SnapMLAError(
            f"{op}: cannot allocate a {dtype} array of shape {list(shape)} on cuda:{device}: {exc}"
        ) from exc
    return array, int(array.data.ptr)


def _current_stream(cupy: Any, stream: Stream | None, device: int) -> Any:
    """A context making ``stream`` CuPy's current stream (nothing to do when it already is)."""
    if stream is None:
        return contextlib.nullcontext()
    handle = stream.handle(device)
    if int(cupy.cuda.get_current_stream().ptr) == handle:
        return contextlib.nullcontext()
    return cupy.cuda.ExternalStream(handle, device)


# ------------------------------------------------------------------------- lifetime

# Released memory still used by queued work: (buffers, events), dropped by sweep_released()
# once every event has completed.
_released: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
_released_lock = threading.Lock()


def sweep_released() -> None:
    """Drop the released buffers whose streams' work has completed (no waiting, never raises).

    Skipped while this thread's current torch or CuPy stream is capturing a CUDA graph (or
    that cannot be told): querying an event then would break a global-mode capture.
    """
    if not _released:
        return
    cupy = sys.modules.get("cupy")
    if cupy is None or _capture_underway(cupy):
        return
    with _released_lock:
        keep = []
        for buffers, events in _released:
            try:
                done = all(event.done for event in events)
            except Exception:  # noqa: BLE001 (a broken context: keeping the memory is safe)
                done = False
            if not done:
                keep.append((buffers, events))
        _released[:] = keep


def _capture_underway(cupy: Any) -> bool:
    """Whether this thread's current torch or CuPy stream is capturing (True when unknown)."""
    try:
        torch = sys.modules.get("torch")
        if (
            torch is not None
            and torch.cuda.is_initialized()
            and torch.cuda.is_current_stream_capturing()
        ):
            return True
        # On the legacy stream this fails while a blocking stream captures: True then.
        return bool(cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr))
    except Exception:  # noqa: BLE001 (unknown: do not risk an event query)
        return True


class _DeviceSync:
    """Stands for the events of a release whose events could not be recorded: done once the
    whole device has synchronized (done by the first sweep that may)."""

    def __init__(self, cupy: Any, device: int) -> None:
        self._cupy = cupy
        self._device = device

    @property
    def done(self) -> bool:
        with self._cupy.cuda.Device(self._device):
            self._cupy.cuda.runtime.deviceSynchronize()
        return True


class OwnedMemory:
    """CuPy buffers owned by a long-lived object (a cache's memory, a plan and its workspace).

    The buffers are allocated under one stream (``stream``, see ``empty``): CuPy's pool will
    reuse them, once dropped, only for allocations on that stream, ordered after its queued
    work. Work on other streams is tracked here: ``used_on(handle)`` is called after each
    launch and, when ``handle`` is another stream, records an event there (one per stream,
    re-recorded; nothing is recorded on a stream that is capturing a CUDA graph: graphs hold
    the raw addresses, so the object must outlive the graphs that use it). ``release()`` drops
    the buffers at once when only the allocation stream used them, and otherwise keeps them in
    a module-level list until the events have completed (checked without waiting by
    ``sweep_released``, called at each release and allocation, and never while this thread
    captures a graph): a stream-ordered free that never blocks the host, never touches a
    caller's stream handle after its launch (the stream may be gone by then), and is safe at
    interpreter shutdown (it then only drops references). If an event cannot be recorded, the
    release waits for a device synchronization at a later sweep instead.
    """

    def __init__(self, buffers: tuple[Any, ...], stream: int, device: int) -> None:
        self._buffers = buffers
        self._stream = stream
        self._device = device
        self._events: dict[int, Any] = {}
        self._synchronize = False
        self._lock = threading.Lock()

    def used_on(self, handle: int) -> None:
        """Note a launch using the buffers on stream ``handle`` (after it was enqueued)."""
        if handle == self._stream:
            return
        cupy = sys.modules.get("cupy")
        if cupy is None:  # no CuPy, so these buffers cannot be CuPy's
            return
        try:
            with cupy.cuda.Device(self._device):
                if cupy.cuda.runtime.streamIsCapturing(handle):
                    return
                with self._lock:
                    event = self._events.get(handle)
                    if event is None:
                        event = cupy.cuda.Event(block=False, disable_timing=True)
                        self._events[handle] = event
                    event.record(cupy.cuda.ExternalStream(handle, self._device))
        except Exception:  # noqa: BLE001
            # The launch is already queued, so do not fail the call: release() will then
            # wait for the whole device instead.
            self._synchronize = True

    def release(self) -> None:
        """Drop the buffers, after the work queued on other streams (see the class). Never
        raises."""
        with self._lock:
            buffers, self._buffers = self._buffers, ()
            events, self._events = tuple(self._events.values()), {}
        if not buffers or sys.is_finalizing():
            return
        if self._synchronize:  # an event could not be recorded (see used_on)
            events = (_DeviceSync(sys.modules.get("cupy"), self._device),)
        if not events:
            return  # only the allocation stream used them: CuPy's pool orders the reuse
        with _released_lock:
            _released.append((buffers, events))
        sweep_released()


_get_ident = threading.get_ident


class InUse:
    """Counts the calls inside an object's operations, so that ``close()`` on one thread waits
    for the operations in flight on others instead of freeing what they use.

    ``enter()`` (False once closing began: the caller refuses the call) and ``exit()``
    bracket each operation; ``close()`` marks the object closed (new calls are refused), waits
    until no call is inside, and returns True for the one call that must then free the
    object (False when already closed; a concurrent ``close()`` also waits). A ``close()``
    from inside an operation of the same object on the same thread is refused (it would wait
    for itself).
    """

    def __init__(self) -> None:
        # enter() and exit() take the lock directly (cheaper than the Condition's Python-level
        # __enter__); only close() waits on the condition, and exit() notifies only then.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._inside: dict[int, int] = {}
        self._closing = False
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closing

    def enter(self) -> bool:
        tid = _get_ident()
        with self._lock:
            if self._closing:
                return False
            inside = self._inside
            inside[tid] = inside.get(tid, 0) + 1
            return True

    def exit(self) -> None:
        tid = _get_ident()
        with self._lock:
            inside = self._inside
            count = inside.get(tid, 0) - 1
            if count > 0:
                inside[tid] = count
            else:
                inside.pop(tid, None)
            # Only close() waits for the calls inside, and only once _closing is set.
            if not inside and self._closing:
                self._cond.notify_all()

    def close(self, op: str) -> bool:
        with self._cond:
            if threading.get_ident() in self._inside:
                raise SnapMLAError(f"{op}: called from inside an operation on the same object")
            if self._closing:
                while not self._closed:
                    self._cond.wait()
                return False
            self._closing = True
            while self._inside:
                self._cond.wait()
            return True

    def closed_done(self) -> None:
        """Called by the closer once the object is freed: wakes concurrent ``close()`` calls."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def read_only(attribute: str, doc: str) -> Any:
    """A read-only property whose value is ``attribute`` of the object (dotted names reach
    into its attributes)."""
    return property(operator.attrgetter(attribute), doc=doc)


class Closable:
    """The lifetime manners shared by the objects whose ``close()`` an ``InUse`` guards
    (``self._in_use``): ``with obj:`` closes it on exit, dropping it closes it without ever
    raising (at interpreter exit anything may be gone; no operation can be in flight then, since
    each holds the object), and a call on a closed object is refused by ``_refuse_closed``."""

    _in_use: InUse
    _what = "the object"  # how refusals name it: "the cache", "the plan"

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if getattr(self, "_in_use", None) is not None:
                self.close()

    def _refuse_closed(self, op: str, argument: str | None) -> SnapMLAError:
        if argument is None:
            return SnapMLAError(f"{op}: {self._what} is closed")
        return SnapMLAError(f"{op}: argument '{argument}': {self._what} is closed",
                            argument=argument)
