"""CPU tests: every operation refuses wrong dtype / shape / stride / device / values with a
SnapMLAError naming the argument, before anything touches CUDA.

Tensors are NumPy arrays and hand-built DLPack producers (test_dlpack.FakeTensor) that claim
CUDA devices over host memory; an autouse fixture makes any use of CuPy or of a GPU function of
the library fail the test. Tests that need the shared library (``$SNAPMLA_LIBRARY`` or the
packaged one) to build a KVCache are skipped when it is absent; the KVCache they build sits on
a fake device address (snapmla_cache_create on caller memory with a device ordinal does not
touch CUDA).
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import snapmla
from snapmla import DecodePlan, KVCache, SnapMLAError, _args, _lib, _tensor, decode, quantize_q
from snapmla import cache as cache_module
from snapmla import quantize as quantize_module
from snapmla._tensor import Stream
from snapmla.cache import _validate_append_args, _validate_fetch_args
from snapmla.decode import DecodeConfig, _validate_decode_args, runnable_kernels
from snapmla.quantize import _validate_quantize_args
from test_dlpack import CPU, CUDA0, CUDA1, FakeTensor

# The submodule: the package's attribute `decode` is the function of that name.
decode_module = importlib.import_module("snapmla.decode")

STREAM = 0x5EED  # every call names its stream, so that no test asks CuPy for one
FAKE_CACHE_PTR = 0x7F0000000000  # 256-byte aligned, never dereferenced
NUM_LAYERS, NUM_PAGES = 2, 4
CACHE_BYTES = NUM_LAYERS * NUM_PAGES * 41216
CACHE_EXTENT = (FAKE_CACHE_PTR, CACHE_BYTES)
CUDA_MANAGED0 = (13, 0)

_REAL_LIB = _lib.lib


def _load_library() -> Any:
    try:
        return _REAL_LIB()
    except SnapMLAError as exc:
        return exc


LIBRARY = _load_library()
needs_library = pytest.mark.skipif(
    isinstance(LIBRARY, SnapMLAError),
    reason=f"needs the shared library (set SNAPMLA_LIBRARY): {LIBRARY}",
)

# C functions that never touch CUDA (for a cache on caller memory with a device ordinal).
_HOST_FUNCTIONS = {
    "snapmla_version",
    "snapmla_status_string",
    "snapmla_last_error",
    "snapmla_cache_bytes",
    "snapmla_cache_create",
    "snapmla_cache_destroy",
    "snapmla_cache_info",
    "snapmla_decode_select_kernel",
}


# The library functions the current test looked up (cleared by _no_cuda for each test).
LIBRARY_CALLS: list[str] = []


def host_function(lib: Any, name: str) -> Any:
    """``lib``'s function ``name``; snapmla_cache_create runs in validation-only mode, which
    makes the handle without asking the driver about the memory: these caches sit on fake
    device addresses, which a machine with a GPU would refuse."""
    function = getattr(lib, name)
    if name != "snapmla_cache_create":
        return function

    def create(*args: Any) -> int:
        previous = lib.snapmla_set_validate_only(1)
        try:
            return function(*args)
        finally:
            lib.snapmla_set_validate_only(previous)

    return create


class _HostOnlyLibrary:
    def __init__(self, lib: Any) -> None:
        self._lib = lib

    def __getattr__(self, name: str) -> Any:
        LIBRARY_CALLS.append(name)
        if name not in _HOST_FUNCTIONS:
            raise AssertionError(f"a test reached the GPU function {name}")
        return host_function(self._lib, name)


@pytest.fixture(autouse=True)
def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that reaches CuPy or a GPU function of the library."""

    def reached(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a test reached CuPy (allocation, device or stream)")

    for module in (_tensor, cache_module, decode_module, quantize_module):
        for name in ("cupy_module", "empty", "on_device"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, reached)
    LIBRARY_CALLS.clear()
    if not isinstance(LIBRARY, SnapMLAError):
        monkeypatch.setattr(_lib, "lib", lambda: _HostOnlyLibrary(LIBRARY))


def bf16(*shape: int, **kwargs: Any) -> FakeTensor:
    return FakeTensor(shape, "bfloat16", **kwargs)


def i32(*shape: int, **kwargs: Any) -> FakeTensor:
    return FakeTensor(shape, "int32", **kwargs)


def i64(*shape: int, **kwargs: Any) -> FakeTensor:
    return FakeTensor(shape, "int64", **kwargs)


def f32(*shape: int, **kwargs: Any) -> FakeTensor:
    return FakeTensor(shape, "float32", **kwargs)


def fp8(*shape: int, **kwargs: Any) -> FakeTensor:
    return FakeTensor(shape, "float8_e4m3fn", **kwargs)


ODD_BASE = 0x7E0000000000  # 256-byte aligned fake device address for alignment cases


def at(make: Callable[..., FakeTensor], *shape: int, offset: int, **kwargs: Any) -> FakeTensor:
    """A fake CUDA tensor at ``ODD_BASE`` with DLPack ``byte_offset = offset`` (no memory)."""
    return make(*shape, address=ODD_BASE, byte_offset=offset, data=np.zeros(1, np.uint8), **kwargs)


def refused(argument: str, pattern: str) -> Any:
    """``pytest.raises`` for a SnapMLAError on ``argument`` whose message matches."""
    return pytest.raises(SnapMLAError, match=rf"argument '{argument}'(?s:.)*{pattern}")


Case = tuple[str, Callable[[], dict[str, Any]], str, str]


# ================================================================== library and versions


def test_version_check() -> None:
    _lib.check_version(_lib.ABI_MAJOR * 10000 + _lib.ABI_MINOR * 100, "lib")
    _lib.check_version(_lib.ABI_MAJOR * 10000 + (_lib.ABI_MINOR + 3) * 100 + 7, "lib")
    with pytest.raises(SnapMLAError, match=r"version 1\.1\.0, but this package needs 0\.x"):
        _lib.check_version(10100, "lib")
    if _lib.ABI_MINOR > 0:
        with pytest.raises(SnapMLAError, match="needs"):
            _lib.check_version(_lib.ABI_MAJOR * 10000 + (_lib.ABI_MINOR - 1) * 100, "lib")
    assert _lib.split_version(10203) == (1, 2, 3)


def test_missing_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_lib, "_loaded", None)
    monkeypatch.setenv("SNAPMLA_LIBRARY", "/nonexistent/libsnapmla.so")
    with pytest.raises(SnapMLAError, match=r"shared library not found at /nonexistent/.*"):
        _REAL_LIB()
    monkeypatch.delenv("SNAPMLA_LIBRARY")
    assert _lib.library_path().endswith(os.path.join("snapmla", "lib", "libsnapmla.so"))


@needs_library
def test_c_error_carries_status_and_message() -> None:
    size = _lib.ffi.new("size_t*")
    status = LIBRARY.snapmla_cache_bytes(0, 1, size)
    with pytest.raises(SnapMLAError, match=r"^snapmla_cache_bytes: .*'num_layers'") as e:
        _lib.check(status, "snapmla_cache_bytes")
    assert str(e.value).endswith("[SNAPMLA_ERROR_INVALID_ARGUMENT]")
    assert str(e.value).count("snapmla_cache_bytes") == 1
    assert (e.value.status, e.value.argument) == (1, "num_layers")
    assert snapmla.version()[0] == _lib.ABI_MAJOR


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[1]
    environment = dict(os.environ, **env)
    paths = [str(root / "python"), str(root / "tests"), os.environ.get("PYTHONPATH", "")]
    environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=False
    )


def test_import_without_cupy_or_library() -> None:
    code = """
import sys
import snapmla
assert "cupy" not in sys.modules, "import snapmla imported cupy"
snapmla.reference  # the NumPy model needs no GPU either
sys.modules["cupy"] = None  # from now on 'import cupy' raises ImportError
from test_dlpack import FakeTensor
for call in (
    lambda: snapmla.version(),
    lambda: snapmla.KVCache(1, 1),
    lambda: snapmla.quantize_q(FakeTensor((2, 8, 576), "bfloat16", device=(2, 0))),
):
    try:
        call()
    except snapmla.SnapMLAError as exc:
        print("refused:", exc)
"""
    result = _run_python(code, SNAPMLA_LIBRARY="/nonexistent/libsnapmla.so")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    assert "shared library not found" in lines[0]
    assert "shared library not found" in lines[1]
    assert "quantize_q: CuPy is needed" in lines[2]


# ========================================================================= small helpers


def test_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    class CupyLike:
        ptr = 77

    class TorchLike:
        cuda_stream = 88

    assert Stream(5, "op").handle(0) == 5
    assert Stream(CupyLike(), "op").handle(0) == 77
    assert Stream(TorchLike(), "op").handle(0) == 88
    assert Stream(np.int64(9), "op").handle(0) == 9
    for bad in (-1, True, 1.5, "s", object(), 2**64):
        with refused("stream", "expected None, a CUDA stream handle"):
            Stream(bad, "op")

    # None is CuPy's current stream of the operation's device, resolved on first use only
    # (constructing it here would fail the test through _no_cuda otherwise), then kept.
    lazy = Stream(None, "op")
    devices: list[int] = []

    class FakeCupy:
        class cuda:  # mirrors cupy.cuda
            class Device:
                def __init__(self, device: int) -> None:
                    devices.append(device)

                def __enter__(self) -> None:
                    return None

                def __exit__(self, *exc_info: object) -> None:
                    return None

            @staticmethod
            def get_current_stream() -> Any:
                return CupyLike() if devices[-1] == 3 else None

    monkeypatch.setattr(_tensor, "cupy_module", lambda op: FakeCupy)
    assert lazy.handle(3) == 77 and devices == [3]
    assert lazy.handle(5) == 77 and devices == [3]  # resolved once
    assert Stream(None, "op").c(3) == _lib.stream_t(77)


def test_check_int() -> None:
    assert _args.check_int(np.int32(3), "op", "x", 0, 4) == 3
    with refused("x", r"expected an integer in \[0, 4\], got 5"):
        _args.check_int(5, "op", "x", 0, 4)
    with refused("x", r"expected an integer >= 1, got 0"):
        _args.check_int(0, "op", "x", 1)
    with refused("x", "got float 2.0"):
        _args.check_int(2.0, "op", "x", 0, 4)
    with refused("x", "got True"):
        _args.check_int(True, "op", "x", 0, 4)


def test_error_attributes_and_message_shape() -> None:
    with pytest.raises(SnapMLAError) as e:
        quantize_q(np.zeros((2, 4, 576), np.float32), stream=STREAM)
    assert str(e.value) == (
        "quantize_q: argument 'q': expected dtype bfloat16 (or uint16 raw bits), got float32"
    )
    assert e.value.argument == "q"
    assert e.value.status is None


def test_check_order_dtype_shape_stride_device() -> None:
    # One tensor with several faults: dtype is reported first, then shape, stride, device.
    def append_c_kv(c_kv: Any) -> None:
        _validate_append_args(
            NUM_LAYERS, 0, CACHE_EXTENT, 0, c_kv, bf16(3, 64), i64(3), Stream(STREAM, "op")
        )

    with refused("c_kv", "expected dtype bfloat16"):
        append_c_kv(np.zeros((3, 7), np.float32))
    with refused("c_kv", r"expected shape \[n, 512\], got \[3, 7\]"):
        append_c_kv(bf16(3, 7, strides=(14, 2), device=CPU))
    with refused("c_kv", "expected unit stride in the last dimension"):
        append_c_kv(bf16(3, 512, strides=(1024, 2), device=CPU))
    with refused("c_kv", "expected a CUDA tensor on cuda:0, got cpu"):
        append_c_kv(bf16(3, 512, device=CPU))
    # Across arguments: every argument's dtype/shape/strides come before any device.
    with refused("k_pe", "expected shape"):
        _validate_append_args(
            NUM_LAYERS,
            0,
            CACHE_EXTENT,
            0,
            bf16(3, 512, device=CPU),
            bf16(3, 65),
            i64(3),
            Stream(STREAM, "op"),
        )


# ============================================================================ quantize_q


def _q_defaults() -> dict[str, Any]:
    return {"q": bf16(2, 4, 576), "out": None, "stream": STREAM}


QUANTIZE_CASES: list[Case] = [
    ("q-dtype", lambda: {"q": np.zeros((2, 4, 576), np.float32)}, "q", "got float32"),
    ("q-fp16", lambda: {"q": np.zeros((2, 4, 576), np.float16)}, "q", "got float16"),
    ("q-unknown", lambda: {"q": FakeTensor((4, 576), code_bits=(99, 16))}, "q", "code 99"),
    ("q-last", lambda: {"q": bf16(2, 4, 575)}, "q", r"\[\.\.\., h, 576\], got \[2, 4, 575\]"),
    ("q-1d", lambda: {"q": bf16(576)}, "q", r"expected shape \[\.\.\., h, 576\], got \[576\]"),
    ("q-inner", lambda: {"q": bf16(4, 576, strides=(1152, 2))}, "q", "unit stride"),
    ("q-heads", lambda: {"q": bf16(1, 1025, 576)}, "q", "1 to 1024 heads"),
    ("q-head-stride", lambda: {"q": bf16(2, 4, 576, strides=(2304, 100, 1))}, "q", "head stride"),
    (
        "q-lead",
        lambda: {"q": bf16(2, 3, 4, 576, strides=(99999, 2304, 576, 1))},
        "q",
        "flatten to one token stride",
    ),
    ("q-token-stride", lambda: {"q": bf16(3, 1, 576, strides=(8, 576, 1))}, "q", "token stride"),
    ("not-dlpack", lambda: {"q": [[0.0] * 576]}, "q", "expected a DLPack tensor"),
    ("out-type", lambda: {"out": bf16(2, 4, 512)}, "out", "sequence"),
    ("out-len", lambda: {"out": (None, None)}, "out", "sequence"),
    ("out0-dtype", lambda: {"out": (f32(2, 4, 512), None, None)}, r"out\[0\]", "float8_e4m3fn"),
    ("out1-shape", lambda: {"out": (None, bf16(8, 64), None)}, r"out\[1\]", r"\[2, 4, 64\]"),
    (
        "out2-strides",
        lambda: {"out": (None, None, f32(2, 4, strides=(1, 2)))},
        r"out\[2\]",
        "a contiguous tensor",
    ),
    (
        "out0-read-only",
        lambda: {"out": (fp8(2, 4, 512, read_only=True), None, None)},
        r"out\[0\]",
        "a writable tensor",
    ),
    ("q-device", lambda: {"q": bf16(2, 4, 576, device=CPU)}, "q", "got cpu"),
    (
        "out-device",
        lambda: {"out": (None, bf16(2, 4, 64, device=CUDA1), None)},
        r"out\[1\]",
        "a CUDA tensor on cuda:0, got cuda:1",
    ),
    (
        "out-managed",
        lambda: {"out": (None, None, f32(2, 4, device=CUDA_MANAGED0))},
        r"out\[2\]",
        "got cuda_managed:0",
    ),
    ("stream", lambda: {"stream": "default"}, "stream", "expected None"),
    ("stream-2^64", lambda: {"stream": 2**64}, "stream", r"int in \[0, 2\^64\)"),
    ("q-odd", lambda: {"q": at(bf16, 2, 4, 576, offset=1)}, "q", "2-byte aligned address"),
    (
        "out0-align",
        lambda: {"out": (at(fp8, 2, 4, 512, offset=4), None, None)},
        r"out\[0\]",
        "8-byte aligned address .*got 0x7e0000000004",
    ),
    (
        "out1-align",
        lambda: {"out": (None, at(bf16, 2, 4, 64, offset=8), None)},
        r"out\[1\]",
        "16-byte aligned address",
    ),
    (
        "out2-align",
        lambda: {"out": (None, None, at(f32, 2, 4, offset=2))},
        r"out\[2\]",
        "4-byte aligned address",
    ),
    (
        "q-span",
        lambda: {"q": at(bf16, 2, 4, 576, offset=0, strides=(2**62, 576, 1))},
        "q",
        "at most 2\\^63 - 1 bytes",
    ),
    (
        "q-wrap",
        lambda: {"q": FakeTensor((2, 4, 576), address=2**64 - 4096, data=np.zeros(1, np.uint8))},
        "q",
        "inside the 64-bit address space",
    ),
]


def _alias_case() -> dict[str, Any]:
    q = bf16(2, 4, 576)
    scale = f32(2, 4, address=q.data.ctypes.data + 128)
    return {"q": q, "out": (None, None, scale)}


QUANTIZE_CASES.append(("out-alias", _alias_case, r"out\[2\]", "does not overlap q"))


@pytest.mark.parametrize(
    ("make", "argument", "pattern"),
    [c[1:] for c in QUANTIZE_CASES],
    ids=[c[0] for c in QUANTIZE_CASES],
)
def test_quantize_q_refuses(
    make: Callable[[], dict[str, Any]], argument: str, pattern: str
) -> None:
    kwargs = {**_q_defaults(), **make()}
    with refused(argument, pattern):
        quantize_q(kwargs.pop("q"), **kwargs)


TWO_TERM_CASES = [
    ("precision-name", {"precision": "fp16"}, "precision", "'fp8' or 'fp8x2'"),
    ("precision-type", {"precision": 2}, "precision", "got 2"),
    ("out-three", {"out": (None, None, None)}, "out", "q_lo, q_lo_scale"),
    ("q_lo-dtype", {"out": (None,) * 3 + (f32(2, 4, 512), None)}, r"out\[3\]", "float8"),
    ("q_lo-shape", {"out": (None,) * 3 + (fp8(2, 4, 511), None)}, r"out\[3\]", "shape"),
    ("q_lo_scale-shape", {"out": (None,) * 4 + (f32(2, 5),)}, r"out\[4\]", "shape"),
    (
        "q_lo-align",
        {"out": (None,) * 3 + (at(fp8, 2, 4, 512, offset=4), None)},
        r"out\[3\]",
        "8-byte aligned address",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "argument", "pattern"),
    [c[1:] for c in TWO_TERM_CASES],
    ids=[c[0] for c in TWO_TERM_CASES],
)
def test_quantize_q_two_term_refuses(
    overrides: dict[str, Any], argument: str, pattern: str
) -> None:
    kwargs = {**_q_defaults(), "precision": "fp8x2", **overrides}
    with refused(argument, pattern):
        quantize_q(kwargs.pop("q"), **kwargs)


def test_quantize_q_two_term_overlap_is_refused() -> None:
    q = bf16(2, 4, 576)
    lo_scale = f32(2, 4, address=q.data.ctypes.data + 256)
    with refused(r"out\[4\]", "does not overlap q"):
        quantize_q(q, out=(None,) * 4 + (lo_scale,), precision="fp8x2", stream=STREAM)


def test_quantize_q_layouts() -> None:
    def check(q: FakeTensor) -> tuple[int, int, int, int]:
        _, n, h, token, head, outputs, device = _validate_quantize_args(
            q, None, Stream(STREAM, "quantize_q")
        )
        assert outputs == [None, None, None]
        assert device == 0
        return n, h, token, head

    assert check(bf16(2, 3, 4, 576)) == (6, 4, 2304, 576)
    assert check(bf16(4, 576)) == (1, 4, 2304, 576)
    # Head-major storage seen as [n, h, 576]: token stride 576, head stride n * 576.
    assert check(bf16(5, 4, 576, strides=(576, 5 * 576, 1))) == (5, 4, 576, 2880)
    # Padded rows: token stride 4096.
    assert check(bf16(3, 4, 576, strides=(4096, 576, 1))) == (3, 4, 4096, 576)
    assert check(bf16(0, 4, 576))[0] == 0


def test_quantize_q_passes_the_stream_to_producers() -> None:
    q = bf16(2, 4, 576)
    with refused(r"out\[0\]", "got cpu"):
        quantize_q(q, out=(fp8(2, 4, 512, device=CPU), None, None), stream=0)
    assert q.stream_seen == 1  # legacy default stream 0 is passed as 1

    class TorchStream:
        cuda_stream = 0xABC

    q = bf16(2, 4, 576)
    with refused(r"out\[2\]", "got cpu"):
        quantize_q(q, out=(None, None, f32(2, 4, device=CPU)), stream=TorchStream())
    assert q.stream_seen == 0xABC


# ============================================================================== KVCache


@pytest.mark.parametrize(
    ("args", "argument", "pattern"),
    [
        ((0, 4), "num_layers", r"expected an integer in \[1, "),
        ((2, 0), "num_pages", r"expected an integer in \[1, 33554431\], got 0"),
        ((2, 2**25), "num_pages", "got 33554432"),
        ((2.0, 4), "num_layers", "got float"),
        # The issue's example: the product wraps to 5376 bytes in unchecked 64-bit arithmetic.
        ((2133428917, 14684993), "num_layers", "at most 15238777 layers of 14684993 pages"),
        ((2**31 - 1, 2**25 - 1), "num_layers", "at most 6669204 layers of 33554431 pages"),
    ],
)
def test_kv_cache_refuses_shape(args: tuple[Any, Any], argument: str, pattern: str) -> None:
    with refused(argument, pattern):
        KVCache(*args)


def test_kv_cache_refuses_device() -> None:
    with refused("device", "got -1"):
        KVCache(2, 4, device=-1)
    with refused("device", r"\[0, 63\], got 64"):
        KVCache(2, 4, device=64)


@needs_library
@pytest.mark.parametrize("num_pages", [1, 3, 4096, 14684993, 2**25 - 1])
def test_kv_cache_size_bound_is_the_c_librarys(num_pages: int) -> None:
    # Python refuses exactly the shapes snapmla_cache_bytes refuses: the largest num_layers
    # whose bytes fit in 2^63 - 1 is accepted by both, one more layer by neither.
    size = _lib.ffi.new("size_t*")
    most = (2**63 - 1) // (num_pages * snapmla.PAGE_BYTES)
    for layers in (most, most + 1):
        c_ok = LIBRARY.snapmla_cache_bytes(min(layers, 2**31 - 1), num_pages, size) == 0
        if layers <= 2**31 - 1:
            try:
                cache_module._validate_shape_args("KVCache", layers, num_pages)
                python_ok = True
            except SnapMLAError as exc:
                assert exc.argument == "num_layers"
                python_ok = False
            assert python_ok == c_ok == (layers == most), (layers, num_pages)
        if c_ok:
            assert size[0] == min(layers, 2**31 - 1) * num_pages * snapmla.PAGE_BYTES


def _buffer(**kwargs: Any) -> FakeTensor:
    kwargs.setdefault("address", FAKE_CACHE_PTR)
    shape = kwargs.pop("shape", (CACHE_BYTES,))
    return FakeTensor(shape, kwargs.pop("dtype", "uint8"), data=np.zeros(1, np.uint8), **kwargs)


@needs_library
@pytest.mark.parametrize(
    ("make", "kwargs", "argument", "pattern"),
    [
        (lambda: _buffer(dtype="float32"), {}, "buffer", "expected dtype uint8 or int8"),
        (lambda: _buffer(shape=(2, CACHE_BYTES // 2)), {}, "buffer", r"shape \[nbytes\]"),
        (lambda: _buffer(strides=(2,)), {}, "buffer", "a contiguous tensor"),
        (lambda: _buffer(shape=(CACHE_BYTES - 1,)), {}, "buffer", f"at least {CACHE_BYTES}"),
        (lambda: _buffer(read_only=True), {}, "buffer", "a writable tensor"),
        (lambda: _buffer(device=CPU), {}, "buffer", "got cpu"),
        (lambda: _buffer(), {"device": 1}, "buffer", "on cuda:1, got cuda:0"),
        (lambda: _buffer(address=FAKE_CACHE_PTR + 128), {}, "buffer", "256-byte aligned"),
        (lambda: _buffer(address=2**64 - 256), {}, "buffer", "inside the 64-bit address space"),
        (lambda: _buffer(device=(2, 64)), {}, "buffer", "device ordinal <= 63, got cuda:64"),
        (lambda: [0] * 10, {}, "buffer", "expected a DLPack tensor"),
    ],
)
def test_kv_cache_refuses_buffer(
    make: Callable[[], Any], kwargs: dict[str, Any], argument: str, pattern: str
) -> None:
    with refused(argument, pattern):
        KVCache(NUM_LAYERS, NUM_PAGES, buffer=make(), **kwargs)


@pytest.fixture
def fake_cache() -> Any:
    if isinstance(LIBRARY, SnapMLAError):
        pytest.skip(f"needs the shared library (set SNAPMLA_LIBRARY): {LIBRARY}")
    cache = KVCache(NUM_LAYERS, NUM_PAGES, buffer=_buffer(device=CUDA0))
    yield cache
    cache.close()


def test_kv_cache_on_caller_memory(fake_cache: KVCache) -> None:
    c = fake_cache
    assert (c.num_layers, c.num_pages, c.page_size) == (NUM_LAYERS, NUM_PAGES, 64)
    assert c.capacity == NUM_PAGES * 64
    assert c.nbytes == CACHE_BYTES
    assert c.layer_bytes == NUM_PAGES * snapmla.PAGE_BYTES
    assert c.data_ptr == FAKE_CACHE_PTR
    assert c.device == 0
    assert isinstance(c.buffer, FakeTensor)
    assert "num_layers=2" in repr(c)
    c.close()
    c.close()  # idempotent
    assert c.closed
    assert c.buffer is None
    with pytest.raises(SnapMLAError, match="KVCache.append: the cache is closed"):
        c.append(0, bf16(1, 512), bf16(1, 64), i64(1), stream=STREAM)
    with pytest.raises(SnapMLAError, match="fetch_dequant: the cache is closed"):
        c.fetch_dequant(0, i64(1), stream=STREAM)
    with refused("cache", "the cache is closed"):
        decode(c, 0, None, None, None, None, softmax_scale=1.0)


LAYER_BYTES = NUM_PAGES * snapmla.PAGE_BYTES


def _layers(*addresses: int, **kwargs: Any) -> list[FakeTensor]:
    return [_buffer(address=a, shape=(LAYER_BYTES,), **kwargs) for a in addresses]


@needs_library
def test_kv_cache_on_per_layer_memory() -> None:
    """``layers=``: each layer at its own tensor (engines hold one per layer), in any order; a
    call on layer l refuses tensors that alias layer l only."""
    layer0, layer1 = FAKE_CACHE_PTR + 4 * 2**20, FAKE_CACHE_PTR  # layer 1 below layer 0
    tensors = _layers(layer0, layer1)
    with KVCache(NUM_LAYERS, NUM_PAGES, layers=tensors) as c:
        assert c.data_ptr == layer0 and c.layer_data_ptr(1) == layer1
        assert c.nbytes == NUM_LAYERS * LAYER_BYTES and c.buffer == tuple(tensors)
        with refused("c_kv", "does not overlap the cache"):
            c.append(1, bf16(3, 512, address=layer1 + 512), bf16(3, 64), i64(3), stream=STREAM)
        # Layer 0's memory is not layer 1's: every check passes and the call goes on to the
        # device (which this file's fixture turns into an error).
        with pytest.raises(AssertionError, match="reached CuPy"):
            c.append(1, bf16(3, 512, address=layer0 + 512), bf16(3, 64), i64(3), stream=STREAM)
        with refused("layer", "got 2"):
            c.layer_data_ptr(2)
    with KVCache(NUM_LAYERS, NUM_PAGES, buffer=_buffer()) as c:
        assert c.layer_data_ptr(1) == FAKE_CACHE_PTR + LAYER_BYTES


@needs_library
@pytest.mark.parametrize(
    ("kwargs", "argument", "pattern"),
    [
        (
            {"layers": _layers(FAKE_CACHE_PTR), "buffer": None},
            "layers",
            r"2 tensors \(num_layers\), got 1",
        ),
        ({"layers": "ab"}, "layers", "a sequence of num_layers tensors"),
        (
            {"layers": _layers(FAKE_CACHE_PTR, FAKE_CACHE_PTR + 2**20), "buffer": 1},
            "layers",
            "None when buffer",
        ),
        (
            {"layers": _layers(FAKE_CACHE_PTR, FAKE_CACHE_PTR + LAYER_BYTES - 256)},
            "layers\\[1\\]",
            r"no bytes in common with layers\[0\]",
        ),
        (
            {"layers": [_buffer(shape=(LAYER_BYTES - 1,)), *_layers(FAKE_CACHE_PTR + 2**20)]},
            "layers\\[0\\]",
            rf"at least {LAYER_BYTES} bytes",
        ),
        (
            {
                "layers": [
                    *_layers(FAKE_CACHE_PTR),
                    _buffer(address=FAKE_CACHE_PTR + 2**20 + 64, shape=(LAYER_BYTES,)),
                ]
            },
            "layers\\[1\\]",
            "128-byte aligned",
        ),
        (
            {
                "layers": [
                    *_layers(FAKE_CACHE_PTR),
                    _buffer(address=FAKE_CACHE_PTR + 2**20, shape=(LAYER_BYTES,), device=CUDA1),
                ]
            },
            "layers\\[1\\]",
            "on cuda:0, got cuda:1",
        ),
    ],
)
def test_kv_cache_refuses_layers(kwargs: dict[str, Any], argument: str, pattern: str) -> None:
    with refused(argument, pattern):
        KVCache(NUM_LAYERS, NUM_PAGES, **kwargs)


@needs_library
def test_kv_cache_with_a_page_stride() -> None:
    """page_stride: pages inside an engine's larger slots; the sizes follow it."""
    stride = 64 * 656  # vLLM's fp8_ds_mla slots
    nbytes = NUM_LAYERS * NUM_PAGES * stride
    with KVCache(NUM_LAYERS, NUM_PAGES, buffer=_buffer(shape=(nbytes,)), page_stride=stride) as c:
        assert c.nbytes == nbytes and c.layer_bytes == NUM_PAGES * stride
        assert c.layer_data_ptr(1) == FAKE_CACHE_PTR + NUM_PAGES * stride
    with refused("buffer", f"at least {nbytes} bytes"):
        KVCache(NUM_LAYERS, NUM_PAGES, buffer=_buffer(), page_stride=stride)
    for bad in (snapmla.PAGE_BYTES + 64, snapmla.PAGE_BYTES - 128, 2**40, -128):
        with refused("page_stride", "multiple of 128|got -128"):
            KVCache(NUM_LAYERS, NUM_PAGES, buffer=_buffer(shape=(nbytes,)), page_stride=bad)
    layers = _layers(FAKE_CACHE_PTR, FAKE_CACHE_PTR + 2**20)  # LAYER_BYTES each: too short now
    with refused("layers\\[0\\]", f"at least {NUM_PAGES * stride} bytes"):
        KVCache(NUM_LAYERS, NUM_PAGES, layers=layers, page_stride=stride)


@needs_library
def test_copy_slots_checks(fake_cache: KVCache) -> None:
    """KVCache.copy_slots: int64 [n] sources and destinations on the cache's device, not
    aliasing it; a valid call goes on to the device."""
    c = fake_cache
    with refused("layer", "got 2"):
        c.copy_slots(2, i64(3), i64(3), stream=STREAM)
    with refused("dst_slots", r"\[3\], got \[2\]"):
        c.copy_slots(0, i64(3), i64(2), stream=STREAM)
    with refused("src_slots", "int64, got int32"):
        c.copy_slots(0, np.zeros(3, np.int32), i64(3), stream=STREAM)
    with refused("dst_slots", "does not overlap the cache"):
        c.copy_slots(0, i64(3), i64(3, address=FAKE_CACHE_PTR + 64), stream=STREAM)
    c.copy_slots(0, i64(0), i64(0), stream=STREAM)  # n = 0: checked, nothing launched
    with pytest.raises(AssertionError, match="reached CuPy"):  # past every check
        c.copy_slots(1, i64(3), i64(3), stream=STREAM)


@needs_library
def test_gather_dequant_checks(fake_cache: KVCache) -> None:
    """KVCache.gather_dequant: block table, lengths and first rows per request; outputs
    of one row count; a valid call goes on to the device."""
    c = fake_cache
    ok = {"c_kv": bf16(10, 512), "k_pe": bf16(10, 64), "stream": STREAM}
    with refused("seqlens", r"\[2\], got \[3\]"):
        c.gather_dequant(0, i32(2, 8), i32(3), i64(2), **ok)
    with refused("out_rows", "int64, got int32"):
        c.gather_dequant(0, i32(2, 8), i32(2), i32(2), **ok)
    with refused("k_pe", r"\[10, 64\], got \[9, 64\]"):
        c.gather_dequant(
            0, i32(2, 8), i32(2), i64(2), c_kv=bf16(10, 512), k_pe=bf16(9, 64), stream=STREAM
        )
    with refused("c_kv", "does not overlap the cache"):
        c.gather_dequant(
            0,
            i32(2, 8),
            i32(2),
            i64(2),
            c_kv=bf16(10, 512, address=FAKE_CACHE_PTR),
            k_pe=bf16(10, 64),
            stream=STREAM,
        )
    with pytest.raises(AssertionError, match="reached CuPy"):  # past every check
        c.gather_dequant(1, i32(2, 8), i32(2), i64(2), **ok)


@needs_library
def test_kv_cache_context_manager() -> None:
    with KVCache(1, 1, buffer=_buffer(shape=(41216,), device=CUDA1)) as c:
        assert c.device == 1
    assert c.closed


def _append_defaults() -> dict[str, Any]:
    return {"layer": 0, "c_kv": bf16(3, 512), "k_pe": bf16(3, 64), "slots": i64(3)}


APPEND_CASES: list[Case] = [
    ("layer-high", lambda: {"layer": 2}, "layer", r"expected an integer in \[0, 1\], got 2"),
    ("layer-neg", lambda: {"layer": -1}, "layer", "got -1"),
    ("layer-float", lambda: {"layer": 1.0}, "layer", "got float 1.0"),
    ("c_kv-dtype", lambda: {"c_kv": np.zeros((3, 512), np.float32)}, "c_kv", "got float32"),
    ("c_kv-shape", lambda: {"c_kv": bf16(3, 576)}, "c_kv", r"\[n, 512\], got \[3, 576\]"),
    ("c_kv-inner", lambda: {"c_kv": bf16(3, 512, strides=(1024, 2))}, "c_kv", "unit stride"),
    (
        "c_kv-row",
        lambda: {"c_kv": bf16(3, 512, strides=(256, 1))},
        "c_kv",
        "row stride >= 512 elements, got 256",
    ),
    ("k_pe-dtype", lambda: {"k_pe": np.zeros((3, 64), np.float32)}, "k_pe", "got float32"),
    ("k_pe-n", lambda: {"k_pe": bf16(2, 64)}, "k_pe", r"\[3, 64\], got \[2, 64\]"),
    ("k_pe-row", lambda: {"k_pe": bf16(3, 64, strides=(32, 1))}, "k_pe", "row stride >= 64"),
    ("slots-dtype", lambda: {"slots": np.zeros(3, np.int32)}, "slots", "int64, got int32"),
    ("slots-shape", lambda: {"slots": i64(3, 1)}, "slots", r"\[3\], got \[3, 1\]"),
    (
        "slots-strided",
        lambda: {"slots": np.arange(6, dtype=np.int64)[::2]},
        "slots",
        "a contiguous tensor",
    ),
    ("slots-list", lambda: {"slots": [0, 1, 2]}, "slots", "expected a DLPack tensor"),
    ("slots-cpu", lambda: {"slots": np.zeros(3, np.int64)}, "slots", "on cuda:0, got cpu"),
    ("k_pe-cuda1", lambda: {"k_pe": bf16(3, 64, device=CUDA1)}, "k_pe", "got cuda:1"),
    ("c_kv-managed", lambda: {"c_kv": bf16(3, 512, device=CUDA_MANAGED0)}, "c_kv", "managed"),
    (
        "c_kv-alias",
        lambda: {"c_kv": bf16(3, 512, address=FAKE_CACHE_PTR + 41216)},
        "c_kv",
        "does not overlap the cache",
    ),
    ("stream", lambda: {"stream": 2.5}, "stream", "expected None"),
    ("c_kv-odd", lambda: {"c_kv": at(bf16, 3, 512, offset=1)}, "c_kv", "2-byte aligned"),
    ("k_pe-odd", lambda: {"k_pe": at(bf16, 3, 64, offset=3)}, "k_pe", "2-byte aligned"),
    ("slots-align", lambda: {"slots": at(i64, 3, offset=4)}, "slots", "8-byte aligned"),
    (
        "c_kv-span",
        lambda: {"c_kv": at(bf16, 3, 512, offset=0, strides=(2**61, 1))},
        "c_kv",
        "at most 2\\^63 - 1 bytes",
    ),
]


def _append(via: str, cache: Any, kwargs: dict[str, Any]) -> None:
    stream = kwargs.pop("stream", STREAM)
    if via == "method":
        cache.append(
            kwargs["layer"], kwargs["c_kv"], kwargs["k_pe"], kwargs["slots"], stream=stream
        )
    else:
        _validate_append_args(
            NUM_LAYERS,
            0,
            CACHE_EXTENT,
            kwargs["layer"],
            kwargs["c_kv"],
            kwargs["k_pe"],
            kwargs["slots"],
            Stream(stream, "KVCache.append"),
        )


@pytest.mark.parametrize("via", ["validator", "method"])
@pytest.mark.parametrize(
    ("make", "argument", "pattern"), [c[1:] for c in APPEND_CASES], ids=[c[0] for c in APPEND_CASES]
)
def test_append_refuses(
    request: pytest.FixtureRequest,
    via: str,
    make: Callable[[], dict[str, Any]],
    argument: str,
    pattern: str,
) -> None:
    cache = request.getfixturevalue("fake_cache") if via == "method" else None
    with refused(argument, pattern) as e:
        _append(via, cache, {**_append_defaults(), **make()})
    assert e.value.argument == argument.replace("\\", "")
    assert e.value.status is None  # refused by Python: no status from the C library
    assert str(e.value).startswith("KVCache.append: argument")
    assert "snapmla_append" not in LIBRARY_CALLS


def test_append_accepts_row_strides_and_empty_input() -> None:
    stream = Stream(STREAM, "KVCache.append")
    layer, _, c_stride, _, k_stride, _ = _validate_append_args(
        NUM_LAYERS,
        0,
        CACHE_EXTENT,
        1,
        bf16(3, 512, strides=(576, 1)),
        bf16(3, 64, strides=(576, 1), byte_offset=1024),
        i64(3),
        stream,
    )
    assert (layer, c_stride, k_stride) == (1, 576, 576)
    # One row: any row stride is fine and the compact one is passed.
    _, _, c_stride, _, k_stride, _ = _validate_append_args(
        NUM_LAYERS, 0, CACHE_EXTENT, 0, bf16(1, 512, strides=(1, 1)), bf16(1, 64), i64(1), stream
    )
    assert (c_stride, k_stride) == (512, 64)


def test_append_empty_is_a_no_op(fake_cache: KVCache) -> None:
    # n = 0: checked, then nothing reaches the library.
    LIBRARY_CALLS.clear()
    c_kv = bf16(0, 512)
    assert fake_cache.append(0, c_kv, bf16(0, 64), i64(0), stream=STREAM) is None
    assert LIBRARY_CALLS == []
    assert c_kv.stream_seen == STREAM  # the tensors were read (and checked)
    with refused("k_pe", r"expected shape \[0, 64\], got \[0, 65\]"):
        fake_cache.append(0, bf16(0, 512), bf16(0, 65), i64(0), stream=STREAM)
    with refused("layer", "got 2"):
        fake_cache.append(2, bf16(0, 512), bf16(0, 64), i64(0), stream=STREAM)
    assert LIBRARY_CALLS == []


def test_append_passes_the_stream(fake_cache: KVCache) -> None:
    c_kv = bf16(3, 512)

    class CupyStream:
        ptr = 0xFEED

    with refused("slots", "got cpu"):
        fake_cache.append(0, c_kv, bf16(3, 64), np.zeros(3, np.int64), stream=CupyStream())
    assert c_kv.stream_seen == 0xFEED


def _fetch_defaults() -> dict[str, Any]:
    return {"layer": 1, "slots": i64(3), "c_kv": None, "k_pe": None}


def _fetch_alias() -> dict[str, Any]:
    c = bf16(3, 512)
    return {"c_kv": c, "k_pe": bf16(3, 64, address=c.data.ctypes.data + 512)}


FETCH_CASES: list[Case] = [
    ("layer", lambda: {"layer": 5}, "layer", r"\[0, 1\], got 5"),
    ("slots-dtype", lambda: {"slots": i32(3)}, "slots", "expected dtype int64, got int32"),
    ("slots-2d", lambda: {"slots": i64(3, 2)}, "slots", r"expected shape \[n\], got \[3, 2\]"),
    ("slots-strided", lambda: {"slots": i64(3, strides=(2,))}, "slots", "contiguous"),
    ("c_kv-dtype", lambda: {"c_kv": f32(3, 512)}, "c_kv", "bfloat16 .*got float32"),
    ("c_kv-n", lambda: {"c_kv": bf16(2, 512)}, "c_kv", r"\[3, 512\], got \[2, 512\]"),
    ("c_kv-inner", lambda: {"c_kv": bf16(3, 512, strides=(1024, 2))}, "c_kv", "unit stride"),
    ("c_kv-row", lambda: {"c_kv": bf16(3, 512, strides=(100, 1))}, "c_kv", "row stride >= 512"),
    ("c_kv-read-only", lambda: {"c_kv": bf16(3, 512, read_only=True)}, "c_kv", "writable"),
    ("k_pe-fp16", lambda: {"k_pe": FakeTensor((3, 64), "float16")}, "k_pe", "got float16"),
    ("k_pe-shape", lambda: {"k_pe": bf16(3, 576)}, "k_pe", r"\[3, 64\]"),
    ("slots-cpu", lambda: {"slots": np.zeros(3, np.int64)}, "slots", "got cpu"),
    ("c_kv-cuda1", lambda: {"c_kv": bf16(3, 512, device=CUDA1)}, "c_kv", "got cuda:1"),
    ("alias", _fetch_alias, "c_kv", "does not overlap k_pe"),
    (
        "alias-cache",
        lambda: {"k_pe": bf16(3, 64, address=FAKE_CACHE_PTR)},
        "k_pe",
        "does not overlap the cache",
    ),
    ("slots-align", lambda: {"slots": at(i64, 3, offset=2)}, "slots", "8-byte aligned"),
    ("c_kv-odd", lambda: {"c_kv": at(bf16, 3, 512, offset=1)}, "c_kv", "2-byte aligned"),
    ("k_pe-odd", lambda: {"k_pe": at(bf16, 3, 64, offset=1)}, "k_pe", "2-byte aligned"),
]


@pytest.mark.parametrize("via", ["validator", "method"])
@pytest.mark.parametrize(
    ("make", "argument", "pattern"), [c[1:] for c in FETCH_CASES], ids=[c[0] for c in FETCH_CASES]
)
def test_fetch_dequant_refuses(
    request: pytest.FixtureRequest,
    via: str,
    make: Callable[[], dict[str, Any]],
    argument: str,
    pattern: str,
) -> None:
    kwargs = {**_fetch_defaults(), **make()}
    with refused(argument, pattern):
        if via == "method":
            cache = request.getfixturevalue("fake_cache")
            cache.fetch_dequant(
                kwargs["layer"],
                kwargs["slots"],
                c_kv=kwargs["c_kv"],
                k_pe=kwargs["k_pe"],
                stream=STREAM,
            )
        else:
            _validate_fetch_args(
                NUM_LAYERS,
                0,
                CACHE_EXTENT,
                kwargs["layer"],
                kwargs["slots"],
                kwargs["c_kv"],
                kwargs["k_pe"],
                Stream(STREAM, "KVCache.fetch_dequant"),
            )


# =========================================================================== DecodePlan


@pytest.mark.parametrize(
    ("kwargs", "argument", "pattern"),
    [
        ({"num_heads": 0}, "num_heads", r"expected an integer in \[1, 128\], got 0"),
        ({"num_heads": 129}, "num_heads", "got 129"),
        ({"num_heads": "16"}, "num_heads", "got str"),
        ({"q_len": 0}, "q_len", r"expected an integer in \[1, 4\], got 0"),
        ({"q_len": 5}, "q_len", "got 5"),
        ({"max_pages": 0}, "max_pages", r"expected an integer in \[1, .*got 0"),
        ({"num_sm_parts": -1}, "num_sm_parts", "got -1"),
        ({"num_sm_parts": 65536}, "num_sm_parts", r"\[0, 65535\], got 65536"),
        ({"q_precision": "bf16"}, "q_precision", "expected 'fp8' or 'fp8x2', got 'bf16'"),
        ({"q_precision": 1}, "q_precision", "got 1"),
        ({"cache_seqlens": i64(4)}, "cache_seqlens", "expected dtype int32, got int64"),
        ({"cache_seqlens": i32(4, 1)}, "cache_seqlens", r"expected shape \[b\], got \[4, 1\]"),
        ({"cache_seqlens": i32(0)}, "cache_seqlens", r"b in 1\.\.65536, got \[0\]"),
        ({"cache_seqlens": i32(4, strides=(2,))}, "cache_seqlens", "contiguous"),
        ({"cache_seqlens": np.zeros(4, np.int32)}, "cache_seqlens", "a CUDA tensor, got cpu"),
        ({"cache_seqlens": (1, 2)}, "cache_seqlens", "expected a DLPack tensor"),
        ({"stream": -5}, "stream", "expected None"),
    ],
)
def test_decode_plan_refuses(kwargs: dict[str, Any], argument: str, pattern: str) -> None:
    args = {"num_heads": 16, "q_len": 1, "max_pages": 8, "stream": STREAM, **kwargs}
    seqlens = args.pop("cache_seqlens", i32(4))
    with refused(argument, pattern):
        DecodePlan(seqlens, **args)


class _ValidatingLibrary:
    """The library with its GPU calls made in validation-only mode: each records the config it
    was given and must be accepted (SNAPMLA_VALIDATED), then reports success."""

    def __init__(self) -> None:
        self.configs: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        function = getattr(LIBRARY, name)
        if name not in ("snapmla_decode_plan", "snapmla_decode"):
            return function

        def call(*args: Any) -> int:
            config = args[0] if name == "snapmla_decode_plan" else args[1]
            self.configs[name] = {
                f: getattr(config, f) for f, _ in _lib.ffi.typeof(config).item.fields
            }
            previous = LIBRARY.snapmla_set_validate_only(1)
            try:
                status = function(*args)
            finally:
                LIBRARY.snapmla_set_validate_only(previous)
            message = _lib.ffi.string(LIBRARY.snapmla_last_error()).decode()
            assert status == 6, message  # SNAPMLA_VALIDATED
            return 0

        return call


@needs_library
@pytest.mark.parametrize("q_precision", ["fp8", "fp8x2"])
def test_decode_plan_passes_its_buffer_sizes(
    monkeypatch: pytest.MonkeyPatch, fake_cache: KVCache, q_precision: str
) -> None:
    """DecodePlan says its buffers' sizes in the config of its plan and decode calls
    (config.plan_bytes, workspace_bytes), the sizes the library asked for: the library then
    refuses buffers too small for a call instead of writing past them. (Fake buffers; the C calls
    run in validation-only mode.)"""
    recorder = _ValidatingLibrary()
    monkeypatch.setattr(_lib, "lib", lambda: recorder)
    allocated: list[int] = []

    def fake_empty(op: str, shape: Any, dtype: str, device: int, stream: Any = None) -> Any:
        allocated.append(int(shape[0]))
        return object(), 0x7D0000000000 + 2**24 * len(allocated)

    plan_module = sys.modules["snapmla.decode"]  # (snapmla.decode is also the function)
    monkeypatch.setattr(plan_module, "empty", fake_empty)
    monkeypatch.setattr(plan_module, "on_device", lambda op, device: _NullContext())
    plan = DecodePlan(
        i32(2), num_heads=16, max_pages=8, num_sm_parts=4, stream=STREAM, q_precision=q_precision
    )
    sizes = _lib.ffi.new("size_t[2]")
    config = _args.decode_config(2, 1, 16, 8, 4, _args.Q_PRECISIONS[q_precision])
    assert LIBRARY.snapmla_decode_buffer_sizes(config, sizes, sizes + 1) == 0
    assert allocated == [sizes[0], sizes[1]] == [plan.plan_bytes, plan.workspace_bytes]
    said = recorder.configs["snapmla_decode_plan"]
    assert (said["plan_bytes"], said["workspace_bytes"]) == (sizes[0], sizes[1])
    assert said["q_precision"] == _args.Q_PRECISIONS[q_precision]
    decode(fake_cache, 1, bf16(2, 1, 16, 576), i32(2, 8), i32(2), plan, softmax_scale=0.1,
           out=bf16(2, 1, 16, 512), stream=STREAM)  # fmt: skip
    assert recorder.configs["snapmla_decode"] == said


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# =============================================================================== decode

CONFIG = DecodeConfig(batch_size=2, q_len=1, num_heads=16, max_pages=8)
PLAN_NOTE = r"\(from the plan: batch_size 2, q_len 1, num_heads 16\)"


def _decode_defaults() -> dict[str, Any]:
    return {
        "layer": 1,
        "q": bf16(2, 1, 16, 576),
        "block_table": i32(2, 8),
        "cache_seqlens": i32(2),
        "softmax_scale": 192**-0.5,
        "causal": True,
        "out": None,
        "lse": None,
        "kernel": "auto",
        "stream": STREAM,
        "plan_device": 0,
    }


def _validate_decode(**overrides: Any) -> Any:
    kwargs = {**_decode_defaults(), **overrides}
    return _validate_decode_args(
        NUM_LAYERS,
        0,
        CACHE_EXTENT,
        CONFIG,
        kwargs.pop("plan_device"),
        kwargs.pop("layer"),
        kwargs.pop("q"),
        kwargs.pop("block_table"),
        kwargs.pop("cache_seqlens"),
        stream=Stream(kwargs.pop("stream"), "decode"),
        **kwargs,
    )


@needs_library
def test_decode_with_a_two_term_plan_past_32_rows_needs_the_reference_kernel() -> None:
    """The two-term query runs on every kernel where q_len * num_heads <= 32 ("auto" runs the
    fast one); past 32 "auto" and "fast" are refused with the library's message, naming the
    row count (the reference kernel takes it, by name: the GPU suite's
    test_two_term_query_on_auto)."""
    kwargs = {**_decode_defaults()}
    args = [kwargs.pop(k) for k in ("plan_device", "layer", "q", "block_table", "cache_seqlens")]
    stream = Stream(kwargs.pop("stream"), "decode")

    def validate(config: DecodeConfig, kernel: str) -> Any:
        return _validate_decode_args(
            NUM_LAYERS,
            0,
            CACHE_EXTENT,
            config,
            *args,
            stream=stream,
            **{**kwargs, "kernel": kernel},
        )

    assert dict(runnable_kernels(CONFIG)) == {"auto": 0, "reference": 1, "fast": 2}
    two_term = DecodeConfig(batch_size=2, q_len=1, num_heads=16, max_pages=8, q_precision="fp8x2")
    assert validate(two_term, "auto").kernel == 0
    assert validate(two_term, "reference").kernel == 1
    assert validate(two_term, "fast").kernel == 2
    wide = DecodeConfig(batch_size=2, q_len=3, num_heads=11, max_pages=8, q_precision="fp8x2")
    for kernel, code in (("auto", 0), ("fast", 2)):
        with refused(
            "kernel",
            r"expected 1 \(reference\) for config\.q_precision 1 \(fp8x2\) where q_len \*"
            r" num_heads > 32 \(the fast kernel takes it only up to 32; here 33\), got "
            f"{code}",
        ):
            validate(wide, kernel)


def _decode_overlap() -> dict[str, Any]:
    q = bf16(2, 1, 16, 576)
    return {"q": q, "out": bf16(2, 1, 16, 512, address=q.data.ctypes.data + 4096)}


def _lse_overlap() -> dict[str, Any]:
    out = bf16(2, 1, 16, 512)
    return {"out": out, "lse": f32(2, 16, 1, address=out.data.ctypes.data)}


def _fp32_out_overlap() -> dict[str, Any]:
    # an out 40 KiB before q: its BF16 bytes (32 KiB) would end before q, its fp32 bytes reach q
    # (both inside one backing buffer, so that no other tensor's memory sits in out's range)
    backing = np.zeros(40960 + 2 * 16 * 576 * 2 + 64, np.uint8)
    q = bf16(2, 1, 16, 576, address=backing.ctypes.data + 40960, data=backing)
    out = f32(2, 1, 16, 512, address=backing.ctypes.data, data=np.zeros(1, np.uint8))
    return {"q": q, "out": out}


def _fp32_lse_overlap() -> dict[str, Any]:
    # lse right after where a BF16 out would end: inside the fp32 out
    out = f32(2, 1, 16, 512)
    return {"out": out, "lse": f32(2, 16, 1, address=out.data.ctypes.data + 2 * 16 * 512 * 2)}


DECODE_CASES: list[Case] = [
    ("layer", lambda: {"layer": 2}, "layer", r"\[0, 1\], got 2"),
    ("kernel-name", lambda: {"kernel": "fastest"}, "kernel", "'auto', 'reference', 'fast'"),
    ("kernel-int", lambda: {"kernel": 0}, "kernel", "got 0"),
    ("scale-zero", lambda: {"softmax_scale": 0.0}, "softmax_scale", "finite number > 0"),
    ("scale-neg", lambda: {"softmax_scale": -0.1}, "softmax_scale", "got -0.1"),
    ("scale-nan", lambda: {"softmax_scale": math.nan}, "softmax_scale", "got nan"),
    ("scale-inf", lambda: {"softmax_scale": math.inf}, "softmax_scale", "got inf"),
    ("scale-fp32-zero", lambda: {"softmax_scale": 1e-60}, "softmax_scale", "fp32"),
    ("scale-fp32-inf", lambda: {"softmax_scale": 1e39}, "softmax_scale", "fp32"),
    ("scale-bool", lambda: {"softmax_scale": True}, "softmax_scale", "got bool"),
    ("scale-str", lambda: {"softmax_scale": "0.1"}, "softmax_scale", "got str"),
    ("q-dtype", lambda: {"q": np.zeros((2, 1, 16, 576), np.float32)}, "q", "got float32"),
    ("q-heads", lambda: {"q": bf16(2, 1, 8, 576)}, "q", PLAN_NOTE + r", got \[2, 1, 8, 576\]"),
    ("q-batch", lambda: {"q": bf16(3, 1, 16, 576)}, "q", r"\[2, 1, 16, 576\] .*got \[3, 1"),
    ("q-len", lambda: {"q": bf16(2, 2, 16, 576)}, "q", r"got \[2, 2, 16, 576\]"),
    ("q-3d", lambda: {"q": bf16(2, 16, 576)}, "q", r"got \[2, 16, 576\]"),
    (
        "q-inner",
        lambda: {"q": bf16(2, 1, 16, 576, strides=(18432, 18432, 1152, 2))},
        "q",
        "unit stride",
    ),
    (
        "q-head-stride",
        lambda: {"q": bf16(2, 1, 16, 576, strides=(9216, 9216, 64, 1))},
        "q",
        "head stride >= 576",
    ),
    ("bt-dtype", lambda: {"block_table": i64(2, 8)}, "block_table", "int32, got int64"),
    (
        "bt-pages",
        lambda: {"block_table": i32(2, 7)},
        "block_table",
        r"\[2, 8\] \(from the plan: batch_size 2, max_pages 8\), got \[2, 7\]",
    ),
    ("bt-row", lambda: {"block_table": i32(2, 8, strides=(4, 1))}, "block_table", "row stride"),
    ("bt-inner", lambda: {"block_table": i32(2, 8, strides=(16, 2))}, "block_table", "unit"),
    ("sl-dtype", lambda: {"cache_seqlens": i64(2)}, "cache_seqlens", "int32, got int64"),
    ("sl-shape", lambda: {"cache_seqlens": i32(3)}, "cache_seqlens", r"\[2\] .*got \[3\]"),
    ("sl-strided", lambda: {"cache_seqlens": i32(2, strides=(2,))}, "cache_seqlens", "contig"),
    (
        "out-dtype",
        lambda: {"out": FakeTensor((2, 1, 16, 512), "float16")},
        "out",
        r"dtype bfloat16 \(or uint16 raw bits\) or float32, got float16",
    ),
    ("out-shape", lambda: {"out": bf16(2, 1, 16, 576)}, "out", r"\[2, 1, 16, 512\]"),
    # fp32 out: the same shape, layout, alignment and overlap rules as BF16
    ("out-fp32-shape", lambda: {"out": f32(2, 1, 16, 256)}, "out", r"\[2, 1, 16, 512\]"),
    (
        "out-fp32-strided",
        lambda: {"out": f32(2, 1, 16, 512, strides=(16384, 8192, 512, 1))},
        "out",
        "a contiguous tensor",
    ),
    (
        "out-fp32-align",
        lambda: {"out": at(f32, 2, 1, 16, 512, offset=8)},
        "out",
        "16-byte aligned address \\(the combine kernel's 16-byte stores\\)",
    ),
    ("out-fp32-alias-q", _fp32_out_overlap, "out", "does not overlap q"),
    ("out-fp32-alias-lse", _fp32_lse_overlap, "out", "does not overlap lse"),
    (
        "out_dtype-name",
        lambda: {"out_dtype": "float16"},
        "out_dtype",
        "'bfloat16' or 'float32' or None, got 'float16'",
    ),
    ("out_dtype-type", lambda: {"out_dtype": np.float32}, "out_dtype", "got <class"),
    (
        "out_dtype-not-out",
        lambda: {"out": bf16(2, 1, 16, 512), "out_dtype": "float32"},
        "out",
        "expected dtype float32, got bfloat16",
    ),
    (
        "out_dtype-not-fp32-out",
        lambda: {"out": f32(2, 1, 16, 512), "out_dtype": "bfloat16"},
        "out",
        r"expected dtype bfloat16 \(or uint16 raw bits\), got float32",
    ),
    (
        "out-strided",
        lambda: {"out": bf16(2, 1, 16, 512, strides=(16384, 8192, 512, 1))},
        "out",
        "a contiguous tensor",
    ),
    ("out-read-only", lambda: {"out": bf16(2, 1, 16, 512, read_only=True)}, "out", "writable"),
    ("lse-order", lambda: {"lse": f32(2, 1, 16)}, "lse", r"\[2, 16, 1\] .*got \[2, 1, 16\]"),
    ("lse-dtype", lambda: {"lse": bf16(2, 16, 1)}, "lse", "float32, got bfloat16"),
    ("q-cpu", lambda: {"q": bf16(2, 1, 16, 576, device=CPU)}, "q", "on cuda:0, got cpu"),
    ("bt-cuda1", lambda: {"block_table": i32(2, 8, device=CUDA1)}, "block_table", "cuda:1"),
    ("sl-cpu", lambda: {"cache_seqlens": np.zeros(2, np.int32)}, "cache_seqlens", "got cpu"),
    ("lse-cuda1", lambda: {"lse": f32(2, 16, 1, device=CUDA1)}, "lse", "got cuda:1"),
    ("plan-device", lambda: {"plan_device": 1}, "plan", "a plan made on cuda:0, got cuda:1"),
    ("out-alias-q", _decode_overlap, "out", "does not overlap q"),
    ("lse-alias-out", _lse_overlap, "out", "does not overlap lse"),
    (
        "out-alias-cache",
        lambda: {"out": bf16(2, 1, 16, 512, address=FAKE_CACHE_PTR + 512)},
        "out",
        "does not overlap the cache",
    ),
    ("stream", lambda: {"stream": object()}, "stream", "expected None"),
    ("q-odd", lambda: {"q": at(bf16, 2, 1, 16, 576, offset=1)}, "q", "2-byte aligned"),
    ("bt-align", lambda: {"block_table": at(i32, 2, 8, offset=2)}, "block_table", "4-byte"),
    ("sl-align", lambda: {"cache_seqlens": at(i32, 2, offset=1)}, "cache_seqlens", "4-byte"),
    (
        "out-align",
        lambda: {"out": at(bf16, 2, 1, 16, 512, offset=8)},
        "out",
        "16-byte aligned address \\(the combine kernel's 16-byte stores\\), got 0x7e0000000008",
    ),
    ("lse-align", lambda: {"lse": at(f32, 2, 16, 1, offset=2)}, "lse", "4-byte aligned"),
    (
        "q-span",
        lambda: {"q": at(bf16, 2, 1, 16, 576, offset=0, strides=(2**62, 2**62, 576, 1))},
        "q",
        "at most 2\\^63 - 1 bytes",
    ),
    (
        "bt-wrap",
        lambda: {"block_table": FakeTensor((2, 8), "int32", address=2**64 - 32, data=np.zeros(1))},
        "block_table",
        "inside the 64-bit address space",
    ),
]


@needs_library
@pytest.mark.parametrize(
    ("make", "argument", "pattern"), [c[1:] for c in DECODE_CASES], ids=[c[0] for c in DECODE_CASES]
)
def test_decode_refuses(make: Callable[[], dict[str, Any]], argument: str, pattern: str) -> None:
    with refused(argument, pattern):
        _validate_decode(**make())


@needs_library
def test_decode_accepts_strided_inputs() -> None:
    # q as a slice of a wider [b, s_q, h, 640] tensor, block table rows padded to 16 columns.
    call = _validate_decode(
        q=bf16(2, 1, 16, 576, strides=(16 * 640, 16 * 640, 640, 1)),
        block_table=i32(2, 8, strides=(16, 1)),
        out=bf16(2, 1, 16, 512),
        lse=f32(2, 16, 1),
        kernel="reference",
        causal=0,
    )
    assert call.q_strides == (10240, 10240, 640)  # s_q = 1: the compact token stride
    assert call.block_table_stride == 16
    assert (call.layer, call.kernel, call.causal) == (1, 1, False)
    assert call.softmax_scale == pytest.approx(192**-0.5)


@needs_library
def test_decode_out_dtype() -> None:
    """out's dtype is the output's: BF16 (or raw uint16 bits) or fp32; with no out,
    out_dtype says what to allocate (None: BF16)."""
    assert _validate_decode().out_dtype == "bfloat16"
    assert _validate_decode(out_dtype="float32").out_dtype == "float32"
    assert _validate_decode(out_dtype="bfloat16").out_dtype == "bfloat16"
    for out, dtype in (
        (f32(2, 1, 16, 512), "float32"),
        (bf16(2, 1, 16, 512), "bfloat16"),
        (FakeTensor((2, 1, 16, 512), "uint16"), "bfloat16"),
    ):
        call = _validate_decode(out=out)
        assert call.out is not None and call.out_dtype == dtype
        assert _validate_decode(out=out, out_dtype=dtype).out_dtype == dtype
    # an lse right after an fp32 out is apart from it (both inside one backing buffer, so that
    # no other test tensor's memory can sit at lse's address, where the call would rightly
    # refuse an lse overlapping q)
    out_bytes = 2 * 16 * 512 * 4
    backing = np.zeros(out_bytes + 2 * 16 * 4, np.uint8)
    out = f32(2, 1, 16, 512, data=backing)
    lse = f32(2, 16, 1, address=backing.ctypes.data + out_bytes, data=np.zeros(1, np.uint8))
    assert _validate_decode(out=out, lse=lse).lse is not None


@needs_library
def test_decode_accepts_q_nope_and_q_pe_apart() -> None:
    """q_pe: q holds q_nope [b, s_q, h, 512], q_pe the RoPE part; each strided its own
    way (here slices of wider tensors, as an engine's projections give them)."""
    call = _validate_decode(
        q=bf16(2, 1, 16, 512, strides=(16 * 768, 16 * 768, 768, 1)),
        q_pe=bf16(2, 1, 16, 64, strides=(16 * 128, 16 * 128, 128, 1)),
        out=bf16(2, 1, 16, 512),
    )
    assert call.q_strides == (12288, 12288, 768)
    assert call.q_pe is not None and call.q_pe_strides == (2048, 2048, 128)
    assert _validate_decode().q_pe is None


@needs_library
@pytest.mark.parametrize(
    ("overrides", "argument", "pattern"),
    [
        ({"q_pe": bf16(2, 1, 16, 64)}, "q", r"\[2, 1, 16, 512\] .*got \[2, 1, 16, 576\]"),
        ({"q": bf16(2, 1, 16, 512), "q_pe": bf16(2, 1, 16, 576)}, "q_pe", r"\[2, 1, 16, 64\]"),
        ({"q": bf16(2, 1, 16, 512), "q_pe": f32(2, 1, 16, 64)}, "q_pe", "bfloat16"),
        (
            {
                "q": bf16(2, 1, 16, 512),
                "q_pe": bf16(2, 1, 16, 64, strides=(16 * 64, 16 * 64, 32, 1)),
            },
            "q_pe",
            "head stride >= 64 elements, got 32",
        ),
        (
            {
                "q": bf16(2, 1, 16, 512, strides=(16 * 512, 16 * 512, 256, 1)),
                "q_pe": bf16(2, 1, 16, 64),
            },
            "q",
            "head stride >= 512 elements, got 256",
        ),
    ],
)
def test_decode_refuses_bad_q_pe(overrides: dict[str, Any], argument: str, pattern: str) -> None:
    with refused(argument, pattern):
        _validate_decode(**overrides)


def test_decode_type_checks() -> None:
    with refused("cache", "expected a snapmla.KVCache, got str"):
        decode("cache", 0, None, None, None, None, softmax_scale=1.0)


def test_decode_refuses_non_plan(fake_cache: KVCache) -> None:
    with refused("plan", "expected a snapmla.DecodePlan, got dict"):
        decode(fake_cache, 0, bf16(2, 1, 16, 576), i32(2, 8), i32(2), {}, softmax_scale=1.0)
