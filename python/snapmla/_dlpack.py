"""Read DLPack tensors (DLPack 1.x ABI) with ctypes, without taking ownership of them.

``view(obj)`` asks ``obj.__dlpack__()`` for a capsule, reads the ``DLTensor`` inside it and
returns a ``TensorView``: pointer, shape, strides in elements, dtype name and device. The
capsule is neither renamed nor consumed; the view keeps it (and ``obj``) alive, and the capsule
frees the producer's ``DLManagedTensor`` when it is collected, as the DLPack protocol says an
unconsumed capsule must.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._errors import SnapMLAError

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


@dataclass(frozen=True)
class TensorView:
    """What snapmla reads of a DLPack tensor.

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
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device_type: int
    device_id: int
    itemsize: int
    read_only: bool = False
    keepalive: Any = field(default=None, repr=False, compare=False)

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def device(self) -> str:
        """The device as text, ``"cuda:0"`` or ``"cpu"``."""
        return device_name(self.device_type, self.device_id)

    def is_contiguous(self) -> bool:
        """Compact row-major (strides of size-1 dimensions are ignored; an empty tensor is
        contiguous, whatever strides its producer reports)."""
        if 0 in self.shape:
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def byte_extent(self) -> tuple[int, int]:
        """``[start, end)`` byte addresses spanned by the elements (empty tensor: ``(ptr, ptr)``)."""
        if self.numel == 0:
            return self.ptr, self.ptr
        low = high = 0
        for size, stride in zip(self.shape, self.strides):
            if stride >= 0:
                high += (size - 1) * stride
            else:
                low += (size - 1) * stride
        return self.ptr + low * self.itemsize, self.ptr + (high + 1) * self.itemsize


def _refuse(op: str, argument: str, what: str) -> SnapMLAError:
    return SnapMLAError(f"{op}: argument '{argument}': {what}", argument=argument)


def _export(obj: Any, kwargs: dict[str, Any], op: str, argument: str) -> Any:
    """Call ``obj.__dlpack__``, asking for a versioned capsule first (DLPack >= 1.0)."""
    try:
        try:
            return obj.__dlpack__(max_version=(1, 0), **kwargs)
        except TypeError:
            # A producer older than DLPack 1.0 has no max_version keyword.
            return obj.__dlpack__(**kwargs)
    except SnapMLAError:
        raise
    except Exception as exc:  # BufferError, ValueError, RuntimeError ... from the producer
        raise _refuse(op, argument, f"its __dlpack__() failed: {exc}") from exc


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
    if not hasattr(obj, "__dlpack__"):
        raise _refuse(
            op,
            argument,
            f"expected a DLPack tensor (an object with __dlpack__), got "
            f"{type(obj).__module__}.{type(obj).__qualname__}",
        )
    kwargs: dict[str, Any] = {}
    if hasattr(obj, "__dlpack_device__"):
        try:
            device_type, device_id = (int(x) for x in obj.__dlpack_device__())
        except Exception as exc:
            raise _refuse(op, argument, f"its __dlpack_device__() failed: {exc}") from exc
        if device_type in (CUDA, CUDA_MANAGED, ROCM) and stream is not None:
            handle = stream(device_id) if callable(stream) else stream
            kwargs["stream"] = dlpack_stream(int(handle))
    capsule = _export(obj, kwargs, op, argument)
    return _read_capsule(capsule, obj, op, argument)


def _read_capsule(capsule: Any, obj: Any, op: str, argument: str) -> TensorView:
    if type(capsule).__name__ != "PyCapsule":
        raise _refuse(
            op, argument, f"its __dlpack__() returned {type(capsule).__name__}, not a capsule"
        )
    name = _capsule_get_name(capsule)
    read_only = False
    if name == b"dltensor_versioned":
        managed_v = DLManagedTensorVersioned.from_address(_capsule_get_pointer(capsule, name))
        if managed_v.version.major != 1:
            raise _refuse(
                op,
                argument,
                f"expected a DLPack 1.x tensor, got DLPack {managed_v.version.major}."
                f"{managed_v.version.minor}",
            )
        tensor = managed_v.dl_tensor
        read_only = bool(managed_v.flags & FLAG_READ_ONLY)
    elif name == b"dltensor":
        tensor = DLManagedTensor.from_address(_capsule_get_pointer(capsule, name)).dl_tensor
    elif name in (b"used_dltensor", b"used_dltensor_versioned"):
        raise _refuse(op, argument, "its DLPack capsule was already consumed")
    else:
        raise _refuse(op, argument, f"unknown DLPack capsule name {name!r}")

    ndim = int(tensor.ndim)
    if ndim < 0:
        raise _refuse(op, argument, f"invalid DLPack ndim {ndim}")
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    if any(size < 0 for size in shape):
        raise _refuse(op, argument, f"invalid DLPack shape {list(shape)}")
    if ndim > 0 and tensor.strides:
        strides = tuple(int(tensor.strides[i]) for i in range(ndim))
    else:
        strides = _compact_strides(shape)
    dtype = tensor.dtype
    code, bits, lanes = int(dtype.code), int(dtype.bits), int(dtype.lanes)
    return TensorView(
        ptr=int(tensor.data or 0) + int(tensor.byte_offset),
        shape=shape,
        strides=strides,
        dtype=dtype_name(code, bits, lanes),
        device_type=int(tensor.device.device_type),
        device_id=int(tensor.device.device_id),
        itemsize=max(1, (bits * lanes + 7) // 8),
        read_only=read_only,
        keepalive=(obj, capsule),
    )


def _compact_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
