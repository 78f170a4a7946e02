"""Read DLPack tensors (DLPack 1.x ABI) with ctypes, without taking ownership of them.

``view(obj)`` asks ``obj.__dlpack__()`` for a capsule, reads the ``DLTensor`` inside it and
returns a ``TensorView``: pointer, shape, strides in elements, dtype name and device. The
capsule is neither renamed nor consumed; the view keeps it (and ``obj``) alive, and the capsule
frees the producer's ``DLManagedTensor`` when it is collected, as the DLPack protocol says an
unconsumed capsule must.
"""

from __future__ import annotations

import ctypes
import datetime
import math
import struct
import sys
import types
from collections.abc import Callable
from typing import Any

from ._errors import SnapMLAError
from ._lib import ffi

__all__ = [
    "CPU",
    "CUDA",
    "CUDA_MANAGED",
    "DLDataType",
    "DLDevice",
    "DLManagedTensor",
    "DLManagedTensorVersioned",
    "DLPackVersion",
    "DLTensor",
    "TensorView",
    "device_name",
    "dlpack_stream",
    "dtype_name",
    "view",
]

# DLDeviceType values used here (dlpack.h).
CPU = 1
CUDA = 2
CUDA_HOST = 3
ROCM = 10
CUDA_MANAGED = 13

# DLManagedTensorVersioned.flags bits.
FLAG_READ_ONLY = 1 << 0

_DEVICE_NAMES = {
    1: "cpu",
    2: "cuda",
    3: "cuda_host",
    4: "opencl",
    7: "vulkan",
    8: "metal",
    9: "vpi",
    10: "rocm",
    11: "rocm_host",
    12: "ext_dev",
    13: "cuda_managed",
    14: "oneapi",
    15: "webgpu",
    16: "hexagon",
    17: "maia",
    18: "trn",
}

# (DLDataTypeCode, bits) -> name, for lanes == 1. The names of the dtypes snapmla consumes are
# bfloat16, float8_e4m3fn, float32, int32, int64, uint8, int8 (uint8 / uint16 also stand for raw
# FP8 / BF16 bytes); the others are named only so that refusals can say what they got.
_DTYPE_NAMES = {
    (0, 8): "int8",
    (0, 16): "int16",
    (0, 32): "int32",
    (0, 64): "int64",
    (1, 8): "uint8",
    (1, 16): "uint16",
    (1, 32): "uint32",
    (1, 64): "uint64",
    (2, 16): "float16",
    (2, 32): "float32",
    (2, 64): "float64",
    (4, 16): "bfloat16",
    (5, 64): "complex64",
    (5, 128): "complex128",
    (6, 8): "bool",
    (7, 8): "float8_e3m4",
    (8, 8): "float8_e4m3",
    (9, 8): "float8_e4m3b11fnuz",
    (10, 8): "float8_e4m3fn",
    (11, 8): "float8_e4m3fnuz",
    (12, 8): "float8_e5m2",
    (13, 8): "float8_e5m2fnuz",
    (14, 8): "float8_e8m0fnu",
    (15, 6): "float6_e2m3fn",
    (16, 6): "float6_e3m2fn",
    (17, 4): "float4_e2m1fn",
}


class DLDevice(ctypes.Structure):
    """``DLDevice``: ``{int32 device_type; int32 device_id}``."""

    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    """``DLDataType``: ``{uint8 code; uint8 bits; uint16 lanes}``."""

    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """``DLTensor``; ``strides`` (in elements) may be NULL for a compact row-major tensor."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    """``DLManagedTensor`` (capsule name ``"dltensor"``, DLPack < 1.0)."""

    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
    ]


class DLPackVersion(ctypes.Structure):
    """``DLPackVersion``: ``{uint32 major; uint32 minor}``."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    """``DLManagedTensorVersioned`` (capsule name ``"dltensor_versioned"``, DLPack >= 1.0)."""

    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# Private prototypes bound to the C API, so that no other module's argtypes on the shared
# ctypes.pythonapi attributes can change how these are called.
_capsule_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def device_name(device_type: int, device_id: int) -> str:
    """Human-readable device, as in messages: ``"cuda:0"``, ``"cpu"``."""
    name = _DEVICE_NAMES.get(device_type, f"device_type {device_type}")
    return name if device_type == CPU else f"{name}:{device_id}"


def dtype_name(code: int, bits: int, lanes: int) -> str:
    """Name of a DLPack dtype: ``"bfloat16"``, ``"float8_e4m3fn"``, ``"int32"``, ..."""
    base = _DTYPE_NAMES.get((code, bits))
    if base is None:
        return f"dlpack dtype (code {code}, bits {bits}, lanes {lanes})"
    return base if lanes == 1 else f"{base}x{lanes}"


def dlpack_stream(handle: int) -> int:
    """The ``__dlpack__(stream=...)`` value for a CUDA stream handle: 0 (legacy default) -> 1."""
    return 1 if handle == 0 else handle


_set_slot = object.__setattr__


class TensorView:
    """What snapmla reads of a DLPack tensor (immutable).

    Attributes:
        ptr: Address of element ``[0, ..., 0]`` (``data + byte_offset``); 0 when ``data`` is NULL.
        shape: Sizes per dimension.
        strides: Strides per dimension, in elements (compact row-major when DLPack gave none).
        dtype: Name of the element type (see ``dtype_name``).
        device_type: ``DLDeviceType`` (1 = CPU, 2 = CUDA, 13 = CUDA managed, ...).
        device_id: Device ordinal.
        itemsize: Bytes per element (rounded up for sub-byte types).
        read_only: The producer flagged the tensor read-only (DLPack >= 1.0).
        keepalive: ``(producer object, capsule)``; holding it keeps the memory valid.
        numel: Number of elements (computed once).

    A ``__slots__`` class rather than a frozen dataclass: it is built for every tensor argument
    of every call, where a dataclass's construction is a measurable part of the host
    overhead. ``byte_extent()`` is computed once and kept.
    """

    __slots__ = (
        "_extent",
        "device_id",
        "device_type",
        "dtype",
        "itemsize",
        "keepalive",
        "numel",
        "ptr",
        "read_only",
        "shape",
        "strides",
    )

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str,
                 device_type: int, device_id: int, itemsize: int, read_only: bool = False,
                 keepalive: Any = None) -> None:  # fmt: skip
        init = _set_slot
        init(self, "ptr", ptr)
        init(self, "shape", shape)
        init(self, "strides", strides)
        init(self, "dtype", dtype)
        init(self, "device_type", device_type)
        init(self, "device_id", device_id)
        init(self, "itemsize", itemsize)
        init(self, "read_only", read_only)
        init(self, "keepalive", keepalive)
        init(self, "numel", math.prod(shape))
        init(self, "_extent", None)

    def with_keepalive(self, keepalive: Any) -> TensorView:
        """The same view holding ``keepalive`` instead (what a memoized view is handed out
        as)."""
        clone = _new_view(TensorView)
        init = _set_slot
        init(clone, "ptr", self.ptr)
        init(clone, "shape", self.shape)
        init(clone, "strides", self.strides)
        init(clone, "dtype", self.dtype)
        init(clone, "device_type", self.device_type)
        init(clone, "device_id", self.device_id)
        init(clone, "itemsize", self.itemsize)
        init(clone, "read_only", self.read_only)
        init(clone, "keepalive", keepalive)
        init(clone, "numel", self.numel)
        init(clone, "_extent", self._extent)
        return clone

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TensorView is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"TensorView is immutable (cannot delete {name!r})")

    def __repr__(self) -> str:
        return (
            f"TensorView(ptr={self.ptr:#x}, shape={self.shape}, strides={self.strides}, "
            f"dtype={self.dtype!r}, device={self.device!r}, itemsize={self.itemsize}, "
            f"read_only={self.read_only})"
        )

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def device(self) -> str:
        """The device as text, ``"cuda:0"`` or ``"cpu"``."""
        return device_name(self.device_type, self.device_id)

    def is_contiguous(self) -> bool:
        """Compact row-major (strides of size-1 dimensions are ignored; an empty tensor is
        contiguous, whatever strides its producer reports)."""
        if self.numel == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def byte_extent(self) -> tuple[int, int]:
        """``[start, end)`` byte addresses spanned by the elements (empty tensor:
        ``(ptr, ptr)``)."""
        extent = self._extent
        if extent is not None:
            return extent
        if self.numel == 0:
            extent = (self.ptr, self.ptr)
        else:
            low = high = 0
            for size, stride in zip(self.shape, self.strides):
                if stride >= 0:
                    high += (size - 1) * stride
                else:
                    low += (size - 1) * stride
            extent = (self.ptr + low * self.itemsize, self.ptr + (high + 1) * self.itemsize)
        _set_slot(self, "_extent", extent)
        return extent


_new_view = object.__new__


def _refuse(op: str, argument: str, what: str) -> SnapMLAError:
    return SnapMLAError(f"{op}: argument '{argument}': {what}", argument=argument)


def view(
    obj: Any,
    *,
    stream: int | Callable[[int], int] | None = None,
    op: str = "snapmla",
    argument: str = "tensor",
) -> TensorView:
    """Read ``obj``'s DLPack tensor without consuming it.

    Args:
        obj: Any object with ``__dlpack__`` (and ``__dlpack_device__``): CuPy, PyTorch, JAX,
            NumPy arrays, ...
        stream: For CUDA tensors, the CUDA stream handle of the operation that will use the
            tensor, or a callable that takes the tensor's device ordinal and returns it (called
            only for CUDA tensors). It is passed to
            ``__dlpack__(stream=...)`` so that the producer orders its pending work first
            (handle 0, the legacy default stream, is passed as 1). ``None``: no stream is given
            (the producer assumes the legacy default stream). Never passed for other devices.
        op, argument: Names for error messages.

    Raises:
        SnapMLAError: ``obj`` is not a DLPack tensor, its export failed, or its capsule is
            already consumed or of an unsupported DLPack major version.
    """
    return _read_capsule(export(obj, stream, op, argument), obj, op, argument)


def export(obj: Any, stream: int | Callable[[int], int] | None, op: str, argument: str) -> Any:
    """``obj.__dlpack__(...)``'s capsule, asked for as ``view`` says (the first half of
    ``view``; ``_read_capsule`` is the second)."""
    return export_key(obj, stream, op, argument)[0]


def export_key(
    obj: Any, stream: int | Callable[[int], int] | None, op: str, argument: str
) -> tuple[Any, tuple[Any, ...] | None]:
    """``(capsule, key)``: ``export``'s capsule and what ``_read_capsule`` will read from it,
    for memoizing what was derived from it: the DLPack version, flags and DLTensor fields (not
    the manager context, deleter or the shape / strides pointers), then the bytes of the shape
    and strides arrays (``None`` for no strides). The key is ``None`` when the capsule is not
    one that ``_read_capsule`` would accept without a closer look (it then reads it, and
    refuses it if need be).

    This runs for every tensor argument of every call, so it is one function with each method
    looked up once; the DLPack struct is unpacked straight from ``_MEMORY`` into
    the key's parts, and the arrays are slices of it (``_read_bytes`` past its end)."""
    dlpack = getattr(obj, "__dlpack__", _MISSING)
    if dlpack is _MISSING:
        raise _refuse(
            op,
            argument,
            f"expected a DLPack tensor (an object with __dlpack__), got "
            f"{type(obj).__module__}.{type(obj).__qualname__}",
        )
    handle = None
    dlpack_device = getattr(obj, "__dlpack_device__", _MISSING)
    if dlpack_device is not _MISSING:
        try:
            device_type, device_id = dlpack_device()
            device_type, device_id = int(device_type), int(device_id)
        except Exception as exc:
            raise _refuse(op, argument, f"its __dlpack_device__() failed: {exc}") from exc
        if stream is not None and device_type in _STREAM_DEVICES:
            handle = stream
            if type(handle) is not int:  # a resolver of the device's handle, or an int-like
                handle = int(stream(device_id) if callable(stream) else stream)
            # The stream the producer's pending work is on already: nothing to order, and
            # PyTorch's stream handshake (an ExternalStream, a current-stream query, device
            # checks) would be half of the host time of a decode call.
            # (_producer_stream's test of the type first: no call for other producers)
            torch_type = type(obj).__module__.startswith("torch")
            if torch_type and _producer_stream(obj, device_id) == handle:
                handle = None
            else:
                handle = dlpack_stream(handle)
    try:
        try:
            if handle is None:
                capsule = dlpack(max_version=(1, 0))
            else:
                capsule = dlpack(max_version=(1, 0), stream=handle)
        except TypeError:
            # A producer older than DLPack 1.0 has no max_version keyword.
            capsule = dlpack() if handle is None else dlpack(stream=handle)
    except SnapMLAError:
        raise
    except Exception as exc:  # BufferError, ValueError, RuntimeError ... from the producer
        raise _refuse(op, argument, f"its __dlpack__() failed: {exc}") from exc

    if type(capsule) is not _CAPSULE:
        return capsule, None
    # A DLPack 1.x capsule, the common case, in one call (no PyCapsule_GetName first).
    try:
        pointer = _capsule_get_pointer(capsule, b"dltensor_versioned")
    except ValueError:  # another name (or an invalid capsule: _read_capsule says which)
        pointer = None
    memory = _MEMORY
    if pointer is not None:
        if pointer <= _MEMORY_END - _VERSIONED_KEY.size:
            fields = _VERSIONED_KEY.unpack_from(memory, pointer)
        else:
            fields = _VERSIONED_KEY.unpack(_read_bytes(pointer, _VERSIONED_KEY.size))
        version, head, ndim, dtype, shape_ptr, strides_ptr, byte_offset = fields
    elif _capsule_get_name(capsule) == b"dltensor":
        raw = _read_bytes(_capsule_get_pointer(capsule, b"dltensor"), _LEGACY_KEY.size)
        head, ndim, dtype, shape_ptr, strides_ptr, byte_offset = _LEGACY_KEY.unpack(raw)
        version = None  # never equal to a versioned key's
    else:
        return capsule, None
    if not 0 < ndim <= _MAX_KEY_NDIM or not shape_ptr:
        return capsule, None
    nbytes = 8 * ndim
    shape = memory[shape_ptr : shape_ptr + nbytes]
    if len(shape) != nbytes:
        shape = _read_bytes(shape_ptr, nbytes)
    strides = None
    if strides_ptr:
        strides = memory[strides_ptr : strides_ptr + nbytes]
        if len(strides) != nbytes:
            strides = _read_bytes(strides_ptr, nbytes)
    return capsule, (version, head, ndim, dtype, byte_offset, shape, strides)


_MISSING = object()
_STREAM_DEVICES = frozenset((CUDA, CUDA_MANAGED, ROCM))

# torch dtype -> snapmla's name, for the dtypes snapmla's calls take (built on first use, so that
# torch is never imported here); other dtypes go through DLPack, which names them.
_torch_dtypes: dict[Any, str] | None = None


# Bytes an element, by dtype name (torch_fields: no torch call for it).
_ITEMSIZES = {name: bits // 8 for (_, bits), name in _DTYPE_NAMES.items()}


def _torch_dtype_names(torch: Any) -> dict[Any, str]:
    global _torch_dtypes
    if _torch_dtypes is None:
        names = ("bfloat16", "float32", "int32", "int64", "uint8", "float8_e4m3fn")
        _torch_dtypes = {getattr(torch, n): n for n in names if hasattr(torch, n)}
        if getattr(getattr(torch, "version", None), "hip", None):  # ROCm: DLPack decides
            _torch_dtypes = {}
    return _torch_dtypes


def torch_fields(
    obj: Any,
    stream: int | Callable[[int], int] | None,
    producers: dict[int, int | None] | None = None,
) -> tuple[int, tuple[int, ...], tuple[int, ...], str, int, int] | None:
    """``(ptr, shape, strides, dtype, device_id, itemsize)`` of a CUDA ``torch.Tensor``, read
    from its attributes without a DLPack capsule, for a call on ``stream`` (a handle, or a
    resolver of the device's handle) that the tensor's pending work is already on, so that
    ``__dlpack__(stream=...)`` would order nothing. Only a plain tensor qualifies: exactly
    ``torch.Tensor``, strided, not nested, not requiring grad, no negative bit, one of
    snapmla's dtypes, readable (a functorch wrapper has no storage). ``None`` otherwise, and
    with no stream: the caller then goes through DLPack, which orders the streams, or refuses
    the tensor, as before. (The device is the caller's to check, as for DLPack tensors:
    ``Checker.devices``.)

    The strides are torch's own; some PyTorch versions' DLPack export rewrites the strides of
    size-1 dimensions to 1. Nothing in snapmla reads the stride of a dimension of size 1 or 0.

    ``producers``: torch's current stream by device, as read by earlier calls for the same
    operation call (filled here): the tensors of one call ask it once.

    PyTorch's ``__dlpack__`` plus reading its capsule costs several times what this does, and
    a decode call reads five to seven tensors."""
    torch = sys.modules.get("torch")
    if torch is None or stream is None or type(obj) is not torch.Tensor:
        return None
    try:
        if (
            not obj.is_cuda
            or obj.is_nested
            or obj.requires_grad
            or obj.layout is not torch.strided
            or obj.is_neg()
        ):
            return None
        name = _torch_dtype_names(torch).get(obj.dtype)
        if name is None:
            return None
        device_id = obj.get_device()
        handle = int(stream(device_id) if callable(stream) else stream)
        producer = producers.get(device_id, _MISSING) if producers is not None else _MISSING
        if producer is _MISSING:
            producer = _producer_stream(obj, device_id)
            if producers is not None:
                producers[device_id] = producer
        if producer != handle:
            return None
        # (the shape as torch.Size, a tuple; the item size from the dtype's name: two torch
        # calls fewer a tensor)
        return obj.data_ptr(), obj.shape, obj.stride(), name, device_id, _ITEMSIZES[name]
    except Exception:  # noqa: BLE001 (a tensor without storage, ...: DLPack decides and says why)
        return None


def _producer_stream(obj: Any, device_id: int) -> int | None:
    """The producer's current stream handle on ``device_id`` where it is known cheaply (PyTorch:
    its current raw stream, 0 for the legacy default stream), else None."""
    if not type(obj).__module__.startswith("torch"):
        return None
    torch = sys.modules.get("torch")
    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    if raw is None:
        return None
    try:
        return int(raw(device_id))
    except Exception:  # noqa: BLE001 (no CUDA build, a bad device: the handshake decides)
        return None


# The bytes of DLManagedTensorVersioned up to the end of its DLTensor (native byte order, no
# padding: the offsets are checked against ctypes' layout below): version (major, minor),
# manager_ctx, deleter, flags, then the DLTensor: data, device (type, id), ndim, dtype (code,
# bits, lanes), shape, strides, byte_offset.
_VERSIONED = struct.Struct("=II8x8xQQiiiBBHQQQ")
# DLManagedTensor starts with its DLTensor.
_LEGACY = struct.Struct("=QiiiBBHQQQ")
assert _VERSIONED.size == ctypes.sizeof(DLManagedTensorVersioned)
assert DLManagedTensorVersioned.dl_tensor.offset == 32 and ctypes.sizeof(DLTensor) == 48
assert _LEGACY.size == ctypes.sizeof(DLTensor)
assert [
    getattr(DLTensor, f).offset
    for f in ("data", "device", "ndim", "dtype", "shape", "strides", "byte_offset")
] == [0, 8, 16, 20, 24, 32, 40]
# ctypes.string_at is a Python wrapper around this foreign function (a third of the cost).
_string_at = getattr(ctypes, "_string_at", ctypes.string_at)
# The process's address space as one cffi buffer, never read as a whole: a slice of it copies
# host bytes into a new bytes object in one C call, a quarter of the cost of a ctypes foreign
# call (a call reads three such ranges per DLPack tensor). Reading an invalid
# address faults exactly as ctypes.string_at would.
_MEMORY = ffi.buffer(ffi.cast("char *", 0), sys.maxsize)
_MEMORY_END = sys.maxsize  # export_key unpacks the structs that end below it in place


def _read_bytes(address: int, nbytes: int) -> bytes:
    """The ``nbytes`` host bytes at ``address`` (a producer's DLPack structs and arrays)."""
    data = _MEMORY[address : address + nbytes]
    if len(data) != nbytes:  # past the buffer's end (an address >= 2^63): let ctypes read it
        data = _string_at(address, nbytes)
    return data


_int64s: dict[int, struct.Struct] = {}


def _read_int64s(address: int, count: int) -> tuple[int, ...]:
    """``count`` int64 values at ``address`` (a producer's shape or strides array)."""
    reader = _int64s.get(count)
    if reader is None:
        reader = _int64s.setdefault(count, struct.Struct(f"={count}q"))
    return reader.unpack(_read_bytes(address, 8 * count))


# The type of PyCapsule objects (types.CapsuleType from Python 3.13; a capsule of the
# standard library's before).
_CAPSULE = getattr(types, "CapsuleType", None) or type(datetime.datetime_CAPI)
# What export_key reads of the structs: _VERSIONED and _LEGACY with the fields of the key
# that are not needed apart as raw bytes (the version; the flags, data pointer and device),
# then ndim, the dtype as one uint32, the shape and strides pointers and the byte offset.
_VERSIONED_KEY = struct.Struct("=8s16x24siIQQQ")
_LEGACY_KEY = struct.Struct("=16siIQQQ")
assert _VERSIONED_KEY.size == _VERSIONED.size and _LEGACY_KEY.size == _LEGACY.size
_MAX_KEY_NDIM = 64


def _read_capsule(capsule: Any, obj: Any, op: str, argument: str) -> TensorView:
    if type(capsule).__name__ != "PyCapsule":
        raise _refuse(
            op, argument, f"its __dlpack__() returned {type(capsule).__name__}, not a capsule"
        )
    name = _capsule_get_name(capsule)
    if name in (b"dltensor_versioned", b"dltensor"):
        layout = _VERSIONED if name == b"dltensor_versioned" else _LEGACY
        fields = layout.unpack(_read_bytes(_capsule_get_pointer(capsule, name), layout.size))
        read_only = False
        if layout is _VERSIONED:  # version and flags ahead of the DLTensor
            major, minor, flags = fields[:3]
            if major != 1:
                raise _refuse(
                    op, argument, f"expected a DLPack 1.x tensor, got DLPack {major}.{minor}"
                )
            read_only = bool(flags & FLAG_READ_ONLY)
            fields = fields[3:]
    elif name in (b"used_dltensor", b"used_dltensor_versioned"):
        raise _refuse(op, argument, "its DLPack capsule was already consumed")
    else:
        raise _refuse(op, argument, f"unknown DLPack capsule name {name!r}")
    data, device_type, device_id, ndim, code, bits, lanes, shape_ptr, strides_ptr, byte_offset = (
        fields
    )

    if ndim < 0:
        raise _refuse(op, argument, f"invalid DLPack ndim {ndim}")
    if ndim == 0:
        shape: tuple[int, ...] = ()
    elif not shape_ptr:
        raise _refuse(op, argument, f"invalid DLPack shape (NULL for ndim {ndim})")
    else:
        shape = _read_int64s(shape_ptr, ndim)
        for size in shape:
            if size < 0:
                raise _refuse(op, argument, f"invalid DLPack shape {list(shape)}")
    if ndim > 0 and strides_ptr:
        strides = _read_int64s(strides_ptr, ndim)
    else:
        strides = _compact_strides(shape)
    return TensorView(
        data + byte_offset,
        shape,
        strides,
        _dtype_names.get((code, bits, lanes)) or dtype_name(code, bits, lanes),
        device_type,
        device_id,
        max(1, (bits * lanes + 7) // 8),
        read_only,
        (obj, capsule),
    )


# (code, bits, lanes) -> name, for lanes == 1 (the common case, looked up first).
_dtype_names = {(code, bits, 1): name for (code, bits), name in _DTYPE_NAMES.items()}


def _compact_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
