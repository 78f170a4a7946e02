"""CPU tests of snapmla._dlpack: capsule parsing, strides, dtypes, stream handshake, lifetime.

``FakeTensor`` is a DLPack producer built by hand with ctypes (a real PyCapsule around a real
DLManagedTensor or DLManagedTensorVersioned), so that dtypes NumPy cannot export (bfloat16,
float8), CUDA devices and the stream argument can be tested without a GPU.
test_api_validation.py imports it from here.
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from snapmla import SnapMLAError
from snapmla._dlpack import (
    DELETER,
    DLManagedTensor,
    DLManagedTensorVersioned,
    TensorView,
    dlpack_stream,
    dtype_name,
    torch_fields,
    view,
)

# ------------------------------------------------------------------------- fake producer

# DLPack (code, bits) of the dtypes the fake producer can claim.
DL_DTYPES = {
    "bfloat16": (4, 16),
    "float8_e4m3fn": (10, 8),
    "float16": (2, 16),
    "float32": (2, 32),
    "int8": (0, 8),
    "int32": (0, 32),
    "int64": (0, 64),
    "uint8": (1, 8),
    "uint16": (1, 16),
}
NP_DTYPES = {
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float16": np.float16,
    "float32": np.float32,
    "int8": np.int8,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
}

CPU = (1, 0)
CUDA0 = (2, 0)
CUDA1 = (2, 1)

_NAME_LEGACY = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"

_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", ctypes.pythonapi))
_capsule_name_raw = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_capsule_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)

_NOT_GIVEN = object()  # FakeTensor.__dlpack__'s default: tells "no stream" from stream=None

# Managed tensors alive (address -> record); the deleter removes them.
_LIVE: dict[int, Any] = {}


def _deleter(address: int | None) -> None:
    record = _LIVE.pop(address, None)
    if record is not None:
        record["owner"].deleted += 1


_DELETER = DELETER(_deleter)


def _capsule_destructor(capsule: int | None) -> None:
    # As a producer must: free the managed tensor unless a consumer renamed the capsule.
    name = _capsule_name_raw(capsule)
    if name not in (_NAME_LEGACY, _NAME_VERSIONED):
        return
    address = _capsule_pointer_raw(capsule, name)
    kind = DLManagedTensorVersioned if name == _NAME_VERSIONED else DLManagedTensor
    kind.from_address(address).deleter(address)


_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_capsule_destructor)


class FakeTensor:
    """A DLPack producer over host memory that may claim any device and dtype.

    Args:
        shape: The tensor's shape.
        dtype: A key of DL_DTYPES (or pass ``code_bits`` for anything else).
        strides: In elements; ``None`` = compact row-major; ``"null"`` = a NULL strides pointer.
        byte_offset: Put into DLTensor.byte_offset (the data pointer is the buffer start).
        device: ``(device_type, device_id)`` it claims.
        versioned: Export DLManagedTensorVersioned when asked with max_version >= (1, 0);
            ``False`` behaves as a pre-1.0 producer (TypeError on max_version).
        read_only: Set the versioned read-only flag.
        data: Backing bytes (a NumPy array); allocated (zeros) when ``None``.
        version: DLPackVersion reported by the versioned capsule.
        address: Claim this data pointer instead of the backing buffer's (never dereferenced).
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: str = "bfloat16",
        *,
        strides: Any = None,
        byte_offset: int = 0,
        device: tuple[int, int] = CUDA0,
        versioned: bool = True,
        read_only: bool = False,
        data: np.ndarray | None = None,
        code_bits: tuple[int, int] | None = None,
        lanes: int = 1,
        version: tuple[int, int] = (1, 0),
        address: int | None = None,
    ) -> None:
        self.shape = tuple(shape)
        self.code, self.bits = code_bits or DL_DTYPES[dtype]
        self.lanes = lanes
        self.strides = strides
        self.byte_offset = byte_offset
        self.device = device
        self.versioned = versioned
        self.read_only = read_only
        self.version = version
        self.calls: list[dict[str, Any]] = []
        self.deleted = 0
        if data is None:
            itemsize = max(1, self.bits // 8)
            span = 1
            if strides is None or strides == "null":
                span = int(np.prod(self.shape)) if self.shape else 1
            else:
                span = 1 + sum((s - 1) * abs(st) for s, st in zip(self.shape, strides) if s > 0)
            data = np.zeros(byte_offset + span * itemsize + 64, dtype=np.uint8)
        self.data = data
        self.address = address

    @classmethod
    def from_array(cls, array: np.ndarray, dtype: str | None = None, **kwargs: Any) -> FakeTensor:
        """Export a NumPy array (any dtype, e.g. ml_dtypes.bfloat16) under its real layout."""
        dtype = dtype or {np.dtype(v): k for k, v in NP_DTYPES.items()}[array.dtype]
        strides = tuple(s // array.itemsize for s in array.strides)
        base = array.base if array.base is not None else array
        fake = cls(array.shape, dtype, strides=strides, data=base, **kwargs)
        fake.address = array.__array_interface__["data"][0]
        fake.array = array
        return fake

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(
        self, *, stream: Any = _NOT_GIVEN, max_version: Any = None, **kwargs: Any
    ) -> Any:
        # Record the keywords as given: "stream" only when the consumer passed one.
        given = {} if stream is _NOT_GIVEN else {"stream": stream}
        self.calls.append({**given, "max_version": max_version, **kwargs})
        stream = None if stream is _NOT_GIVEN else stream
        if max_version is not None and not self.versioned:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        if self.device[0] == 1 and stream is not None:
            raise BufferError("stream must be None for CPU tensors")
        use_versioned = max_version is not None and tuple(max_version) >= (1, 0)
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        strides = None
        if self.strides is not None and self.strides != "null":
            strides = (ctypes.c_int64 * max(ndim, 1))(*self.strides)
        managed = DLManagedTensorVersioned() if use_versioned else DLManagedTensor()
        t = managed.dl_tensor
        t.data = self.address if self.address is not None else self.data.ctypes.data
        t.device.device_type, t.device.device_id = self.device
        t.ndim = ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = self.code, self.bits, self.lanes
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        if strides is not None:
            t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = self.byte_offset
        managed.deleter = _DELETER
        if use_versioned:
            managed.version.major, managed.version.minor = self.version
            managed.flags = 1 if self.read_only else 0
        address = ctypes.addressof(managed)
        _LIVE[address] = {"owner": self, "keep": (managed, shape, strides, self.data)}
        name = _NAME_VERSIONED if use_versioned else _NAME_LEGACY
        return _capsule_new(address, name, ctypes.cast(_DESTRUCTOR, ctypes.c_void_p))

    @property
    def stream_seen(self) -> Any:
        """The ``stream`` of the latest ``__dlpack__`` call (``None`` if none was passed)."""
        return self.calls[-1].get("stream")


# ------------------------------------------------------------------------------ NumPy


@pytest.mark.parametrize(
    ("np_dtype", "name"),
    [
        (np.float32, "float32"),
        (np.int32, "int32"),
        (np.int64, "int64"),
        (np.uint8, "uint8"),
        (np.int8, "int8"),
    ],
)
def test_numpy_dtypes(np_dtype: Any, name: str) -> None:
    a = np.arange(24, dtype=np_dtype).reshape(2, 3, 4)
    v = view(a)
    assert v.dtype == name
    assert v.shape == (2, 3, 4)
    assert v.strides == (12, 4, 1)
    assert v.ptr == a.ctypes.data
    assert (v.device_type, v.device_id, v.device) == (1, 0, "cpu")
    assert v.itemsize == a.itemsize
    assert v.is_contiguous()
    assert not v.read_only


def test_numpy_non_contiguous() -> None:
    a = np.zeros((6, 8), dtype=np.float32)
    v = view(a[1:, ::2])
    assert v.shape == (5, 4)
    assert v.strides == (8, 2)
    assert v.ptr == a.ctypes.data + 8 * 4
    assert not v.is_contiguous()
    t = view(a.T)
    assert t.shape == (8, 6)
    assert t.strides == (1, 8)
    r = view(a[::-1])
    assert r.strides == (-8, 1)
    assert r.byte_extent() == (a.ctypes.data, a.ctypes.data + a.nbytes)


def test_numpy_zero_dim_and_empty() -> None:
    s = view(np.array(3.0, dtype=np.float32))
    assert (s.shape, s.strides, s.numel, s.ndim) == ((), (), 1, 0)
    e = view(np.zeros((0, 5), dtype=np.int32))
    assert e.shape == (0, 5)
    assert e.numel == 0
    assert e.byte_extent()[0] == e.byte_extent()[1]


def test_numpy_other_dtypes_are_named() -> None:
    assert view(np.zeros(3, np.float16)).dtype == "float16"
    assert view(np.zeros(3, np.float64)).dtype == "float64"
    assert view(np.zeros(3, np.complex64)).dtype == "complex64"
    assert view(np.zeros(3, np.bool_)).dtype == "bool"


def test_numpy_read_only_flag() -> None:
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    assert view(a).read_only


def test_numpy_is_asked_for_a_versioned_capsule_without_stream() -> None:
    calls = []

    class Spy:
        def __init__(self) -> None:
            self.a = np.zeros(3, np.int32)

        def __dlpack__(self, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> Any:
            return self.a.__dlpack_device__()

    view(Spy(), stream=5)
    assert calls == [{"max_version": (1, 0)}]


# ------------------------------------------------------------------ fake producer: layout


@pytest.mark.parametrize("versioned", [True, False])
def test_fake_bfloat16_strides_and_byte_offset(versioned: bool) -> None:
    values = (np.arange(4 * 10, dtype=np.float32) / 8).astype(ml_dtypes.bfloat16).reshape(4, 10)
    raw = np.zeros(64 + values.nbytes, dtype=np.uint8)
    raw[64:] = values.view(np.uint8).ravel()
    # Columns 1, 3, 5 of rows 0..3, reached through byte_offset 64 + 2 and strides (10, 2).
    fake = FakeTensor(
        (4, 3),
        "bfloat16",
        strides=(10, 2),
        byte_offset=64 + 2,
        data=raw,
        device=CPU,
        versioned=versioned,
    )
    v = view(fake)
    assert fake.calls[0]["max_version"] == (1, 0)
    assert len(fake.calls) == (1 if versioned else 2)
    assert capsule_name(v.keepalive[1]) == (b"dltensor_versioned" if versioned else b"dltensor")
    assert v.dtype == "bfloat16"
    assert v.itemsize == 2
    assert v.shape == (4, 3)
    assert v.strides == (10, 2)
    assert v.ptr == raw.ctypes.data + 66
    # Read the elements back through the view's pointer and strides.
    got = np.empty((4, 3), dtype=ml_dtypes.bfloat16)
    for i in range(4):
        for j in range(3):
            address = v.ptr + (i * v.strides[0] + j * v.strides[1]) * v.itemsize
            got[i, j] = np.frombuffer(ctypes.string_at(address, 2), ml_dtypes.bfloat16)[0]
    np.testing.assert_array_equal(got.astype(np.float32), values[:, 1:6:2].astype(np.float32))


def test_fake_null_strides_are_compact() -> None:
    v = view(FakeTensor((2, 3, 5), "bfloat16", strides="null", device=CPU))
    assert v.strides == (15, 5, 1)
    assert v.is_contiguous()


def test_fake_zero_dim_and_empty() -> None:
    v = view(FakeTensor((), "float32", device=CPU))
    assert (v.shape, v.strides, v.numel) == ((), (), 1)
    e = view(FakeTensor((0, 512), "bfloat16", device=CPU))
    assert e.shape == (0, 512)
    assert e.numel == 0


def test_fake_null_data_pointer_of_empty_tensor() -> None:
    v = view(FakeTensor((0,), "int64", address=0, device=CPU))
    assert v.ptr == 0


def test_from_array_helper_matches_numpy() -> None:
    a = np.zeros((3, 7), dtype=ml_dtypes.bfloat16)[:, 2:]
    v = view(FakeTensor.from_array(a, device=CPU))
    assert v.ptr == a.__array_interface__["data"][0]
    assert v.strides == (7, 1)


@pytest.mark.parametrize(
    ("code_bits", "lanes", "name"),
    [
        ((10, 8), 1, "float8_e4m3fn"),
        ((12, 8), 1, "float8_e5m2"),
        ((4, 16), 1, "bfloat16"),
        ((2, 16), 1, "float16"),
        ((2, 32), 4, "float32x4"),
        ((99, 8), 1, "dlpack dtype (code 99, bits 8, lanes 1)"),
    ],
)
def test_dtype_names(code_bits: tuple[int, int], lanes: int, name: str) -> None:
    assert dtype_name(*code_bits, lanes) == name
    fake = FakeTensor((4,), code_bits=code_bits, lanes=lanes, device=CPU)
    assert view(fake).dtype == name


def test_read_only_flag_of_versioned_capsule() -> None:
    assert view(FakeTensor((4,), "int32", read_only=True, device=CPU)).read_only
    assert not view(FakeTensor((4,), "int32", device=CPU)).read_only


# ------------------------------------------------------------------ fake producer: streams


@pytest.mark.parametrize(("handle", "passed"), [(0, 1), (1, 1), (2, 2), (0x7F00DEAD, 0x7F00DEAD)])
def test_stream_is_passed_for_cuda(handle: int, passed: int) -> None:
    fake = FakeTensor((2, 512), "bfloat16", device=CUDA0)
    view(fake, stream=handle)
    assert fake.stream_seen == passed


def test_stream_callable_gets_the_device_and_runs_only_for_cuda() -> None:
    seen = []

    def resolve(device: int) -> int:
        seen.append(device)
        return 0

    fake = FakeTensor((3,), "int32", device=CUDA1)
    view(fake, stream=resolve)
    assert seen == [1]
    assert fake.stream_seen == 1
    view(FakeTensor((3,), "int32", device=CPU), stream=resolve)
    assert seen == [1]


def test_no_stream_for_cpu_and_none_stream() -> None:
    # The stream keyword is not passed at all (DLPack: CPU producers refuse one), rather than
    # passed as None.
    cpu = FakeTensor((3,), "int32", device=CPU)
    view(cpu, stream=1234)
    assert cpu.calls == [{"max_version": (1, 0)}]
    cuda = FakeTensor((3,), "int32", device=CUDA0)
    view(cuda)
    assert cuda.calls == [{"max_version": (1, 0)}]
    view(cuda, stream=0)
    assert cuda.calls[-1] == {"stream": 1, "max_version": (1, 0)}


class _TorchLikeTensor(FakeTensor):
    """A fake producer that passes for a PyTorch tensor (module name), for _producer_stream."""


_TorchLikeTensor.__module__ = "torch.fake"


@pytest.mark.parametrize(
    ("current", "handle", "passed"), [(0, 0, None), (77, 77, None), (77, 0, 1), (0, 77, 77)]
)
def test_no_handshake_when_the_stream_is_the_producers_current_one(
    monkeypatch: pytest.MonkeyPatch, current: int, handle: int, passed: int | None
) -> None:
    # PyTorch's handshake costs more than the rest of a decode call's host path;
    # on the producer's own current stream it has nothing to order, so it is skipped.
    import sys
    import types

    asked = []

    def current_raw_stream(device: int) -> int:
        asked.append(device)
        return current

    torch = types.SimpleNamespace(
        _C=types.SimpleNamespace(_cuda_getCurrentRawStream=current_raw_stream)
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    fake = _TorchLikeTensor((2, 512), "bfloat16", device=CUDA1)
    view(fake, stream=handle)
    assert asked == [1]
    if passed is None:
        assert fake.calls == [{"max_version": (1, 0)}]
    else:
        assert fake.calls == [{"stream": passed, "max_version": (1, 0)}]
    # Other producers always get the stream.
    other = FakeTensor((2, 512), "bfloat16", device=CUDA1)
    view(other, stream=current)
    assert other.stream_seen == (1 if current == 0 else current) and asked == [1]


def test_dlpack_stream_mapping() -> None:
    assert dlpack_stream(0) == 1
    assert dlpack_stream(5) == 5


# ---------------------------------------------------------------- fake producer: lifetime


def test_view_keeps_capsule_alive_and_does_not_rename_it() -> None:
    fake = FakeTensor((8,), "int64", device=CPU)
    v = view(fake)
    gc.collect()
    assert fake.deleted == 0
    assert capsule_name(v.keepalive[1]) == b"dltensor_versioned"
    assert v.keepalive[0] is fake
    del v
    gc.collect()
    assert fake.deleted == 1


@pytest.mark.parametrize("versioned", [True, False])
def test_every_export_is_freed_once(versioned: bool) -> None:
    fake = FakeTensor((2, 2), "float32", device=CPU, versioned=versioned)
    for _ in range(3):
        view(fake)
    gc.collect()
    assert fake.deleted == 3


def test_view_is_immutable() -> None:
    v = view(np.zeros(2, np.int32))
    assert isinstance(v, TensorView)
    with pytest.raises(AttributeError):
        v.ptr = 0  # type: ignore[misc]


# ----------------------------------------------------------------------------- refusals


def test_not_a_dlpack_object() -> None:
    with pytest.raises(SnapMLAError, match=r"op: argument 'x': expected a DLPack tensor") as e:
        view([1, 2, 3], op="op", argument="x")
    assert e.value.argument == "x"
    assert e.value.status is None


def test_producer_failure_is_reported() -> None:
    class Broken:
        def __dlpack__(self, **kwargs: Any) -> Any:
            raise BufferError("cannot export")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    with pytest.raises(SnapMLAError, match=r"argument 't': its __dlpack__\(\) failed: cannot"):
        view(Broken(), argument="t")


def test_consumed_and_foreign_capsules_are_refused() -> None:
    class Producer:
        def __init__(self, capsule: Any) -> None:
            self.capsule = capsule

        def __dlpack__(self, **kwargs: Any) -> Any:
            return self.capsule

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    value = ctypes.c_int(0)
    used = _capsule_new(ctypes.addressof(value), b"used_dltensor", None)
    with pytest.raises(SnapMLAError, match="already consumed"):
        view(Producer(used))
    other = _capsule_new(ctypes.addressof(value), b"something_else", None)
    with pytest.raises(SnapMLAError, match="unknown DLPack capsule name"):
        view(Producer(other))
    with pytest.raises(SnapMLAError, match="not a capsule"):
        view(Producer(object()))


def test_unsupported_dlpack_major_version() -> None:
    fake = FakeTensor((2,), "int32", device=CPU, version=(2, 0))
    with pytest.raises(SnapMLAError, match=r"expected a DLPack 1.x tensor, got DLPack 2.0"):
        view(fake)
    gc.collect()
    assert fake.deleted == 1  # the refused capsule still frees itself


def test_torch_view_leaves_cpu_tensors_and_other_objects_to_dlpack() -> None:
    """The direct torch read applies to CUDA ``torch.Tensor`` objects only; the GPU
    suite compares it with DLPack field by field (tests/gpu/test_torch_view_gpu.py)."""
    assert torch_fields(object(), 7) is None
    assert torch_fields(np.zeros(3), 7) is None
    torch = pytest.importorskip("torch")
    assert torch_fields(torch.zeros(3), 7) is None
