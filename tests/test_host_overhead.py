"""CPU tests of what keeps a call's host time low: it must not make the call wrong, and must
stay in place.

- The memo of checked tensors (``_tensor._checked``): a tensor whose DLPack bytes changed
  (address, dtype, shape, strides, read-only flag, device) is read and checked again, and
  refused when it must be; a memoized view holds this call's producer and capsule.
- ``on_device`` tries ``import cupy`` once when CuPy is missing, not at every call, and
  enters no CuPy device context when the device is current already.
- ``decode``'s call memo: the same call on the same cache reuses the packed C arguments
  without the checks; a change of any scalar or tensor (q_pe given or not, a read-only flag)
  checks again; a refused call is never kept; each cache has its own, dropped at close; the
  first bad argument in the checks' order is still the one named.
- The same memo for ``KVCache.append``, ``KVCache.fetch_dequant`` (outputs given),
  ``quantize_q`` (outputs given) and ``DecodePlan.update``: checked once, a changed tensor
  checked (and refused) again, the order of refusals kept.
- A loose guard on the time of ``decode`` (outputs given, stream given, GPU calls faked): the
  minimum over 300 calls, so that a loaded machine does not fail it, against a bound an
  order of magnitude above it (bench/bench_host_overhead.py --fake measures it).
"""

from __future__ import annotations

import builtins
import importlib
import math
import sys
import time
import types
from typing import Any

import numpy as np
import pytest

from snapmla import SnapMLAError, _dlpack, _lib, _tensor
from snapmla._tensor import BF16, Checker, Stream
from test_dlpack import CPU, CUDA0, CUDA1, FakeTensor
from test_streams_lifetime import (  # noqa: F401 (the library fixture)
    EVERY_KERNEL,
    _cache,
    _decode,
    _decode_inputs,
    _plan,
    library,
)

STREAM = 0x5EED
decode_module = importlib.import_module("snapmla.decode")
cache_module = importlib.import_module("snapmla.cache")
quantize_module = importlib.import_module("snapmla.quantize")


def _check(obj: Any, *, writable: bool = False, shape: tuple[Any, ...] = ("n", 64)) -> Any:
    checker = Checker("op", Stream(STREAM, "op"))
    v = checker.tensor(obj, "x", dtypes=BF16, shape=shape, layout="inner", writable=writable)
    checker.devices(0)
    return v


@pytest.fixture(autouse=True)
def _empty_memo() -> None:
    _tensor._checked.clear()


def test_memo_hit_holds_this_calls_capsule(monkeypatch: pytest.MonkeyPatch) -> None:
    t = FakeTensor((4, 64), "bfloat16", address=0x7F0000000000)
    first = _check(t)
    reads = []
    real_read = _dlpack._read_capsule
    monkeypatch.setattr(_dlpack, "_read_capsule", lambda *a: reads.append(a) or real_read(*a))
    second = _check(t)
    assert reads == []  # memoized: the capsule was not parsed again
    assert (second.ptr, second.shape, second.strides, second.dtype) == (
        first.ptr,
        first.shape,
        first.strides,
        first.dtype,
    )
    obj, capsule = second.keepalive
    assert obj is t and capsule is not first.keepalive[1]
    assert all(v.keepalive is None for v in _tensor._checked.values())


@pytest.mark.parametrize(
    "changed, pattern",
    [
        ({"address": 0x7F0000000001}, "2-byte aligned address"),
        ({"dtype": "float32"}, "dtype bfloat16"),
        ({"shape": (4, 32)}, r"shape \[n, 64\]"),
        ({"strides": (64, 2)}, "unit stride in the last dimension"),
        ({"read_only": True}, "a writable tensor"),
        ({"device": CPU}, "a CUDA tensor on cuda:0"),
        ({"device": CUDA1}, "a CUDA tensor on cuda:0"),
    ],
)
def test_memo_rechecks_a_changed_tensor(changed: dict[str, Any], pattern: str) -> None:
    base = {"shape": (4, 64), "dtype": "bfloat16", "address": 0x7F0000000000, "device": CUDA0}
    _check(FakeTensor(**base), writable=True)
    _check(FakeTensor(**base), writable=True)  # a hit
    args = {**base, **changed}
    with pytest.raises(SnapMLAError, match=pattern):
        _check(FakeTensor(**args), writable=True)


def test_memo_keys_on_the_expectations() -> None:
    t = FakeTensor((4, 64), "bfloat16", address=0x7F0000000000)
    _check(t, shape=("n", 64))
    with pytest.raises(SnapMLAError, match=r"shape \[5, 64\]"):
        _check(t, shape=(5, 64))
    read_only = FakeTensor((4, 64), "bfloat16", address=0x7F0000000000, read_only=True)
    _check(read_only)  # an input may be read-only
    with pytest.raises(SnapMLAError, match="a writable tensor"):
        _check(read_only, writable=True)


def _key(t: Any) -> Any:
    return _dlpack.export_key(t, STREAM, "op", "x")[1]


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_export_key_holds_every_field_read(versioned: bool) -> None:
    """The key of a DLPack export is the same for the same bytes (not the struct's or the
    arrays' addresses, new at each export) and differs when anything _read_capsule reads does:
    the checks memoized on it depend on all of that."""
    base: dict[str, Any] = {
        "shape": (4, 64),
        "dtype": "bfloat16",
        "address": 0x7F0000000000,
        "strides": (64, 1),
        "versioned": versioned,
    }
    key = _key(FakeTensor(**base))
    assert key is not None and key == _key(FakeTensor(**base))
    changes: list[dict[str, Any]] = [
        {"address": 0x7F0000000040},
        {"byte_offset": 64},
        {"dtype": "float32"},
        {"lanes": 2},
        {"shape": (4, 32)},
        {"shape": (4, 64, 1), "strides": (64, 1, 1)},
        {"strides": (128, 1)},
        {"strides": "null"},
        {"device": CUDA1},
    ]
    if versioned:
        changes += [{"read_only": True}, {"version": (1, 1)}]
    for change in changes:
        assert _key(FakeTensor(**{**base, **change})) != key, change
    other = {**base, "versioned": not versioned}
    assert _key(FakeTensor(**other)) != key  # a legacy and a versioned capsule never match


def test_export_key_reads_high_addresses_as_ctypes_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The struct and arrays past _MEMORY's end are read with _read_bytes: the same key."""
    t = FakeTensor((4, 64), "bfloat16", address=0x7F0000000000, strides=(64, 1))
    fast = _key(t)
    monkeypatch.setattr(_dlpack, "_MEMORY_END", 0)
    monkeypatch.setattr(_dlpack, "_MEMORY", b"")
    assert _key(t) == fast


def test_export_key_of_what_read_capsule_refuses() -> None:
    """No key (the checks then read the capsule and refuse it, as before) for a capsule
    with no dimension, a NULL shape, an unknown name, or for something else than a capsule."""
    assert _key(FakeTensor((), "bfloat16")) is None

    class Returns:
        def __init__(self, value: Any) -> None:
            self.value = value

        def __dlpack__(self, **kwargs: Any) -> Any:
            return self.value

    assert _dlpack.export_key(Returns(b"no capsule"), None, "op", "x") == (b"no capsule", None)
    with pytest.raises(SnapMLAError, match="argument 'x': expected a DLPack tensor"):
        _dlpack.export_key(object(), None, "op", "x")


def test_on_device_tries_a_missing_cupy_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(_tensor, "_cupy_missing", False)
    attempts = []
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "cupy":
            attempts.append(name)
            raise ImportError("no cupy here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    for _ in range(3):
        with _tensor.on_device("op", 0):
            pass
    assert attempts == ["cupy"]


def test_on_device_enters_cupy_only_to_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    entered = []

    class Device:
        def __init__(self, device: int) -> None:
            self.device = device

        def __enter__(self) -> None:
            entered.append(self.device)

        def __exit__(self, *exc: object) -> None:
            pass

    runtime = types.SimpleNamespace(getDevice=lambda: 0)
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device, runtime=runtime))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    for device in (0, 1, 0):
        with _tensor.on_device("op", device):
            pass
    assert entered == [1]  # device 0 was current already


@pytest.mark.usefixtures("library")
def test_decode_host_time_loose_bound() -> None:
    cache, plan, inputs = _cache(), _plan(), _decode_inputs()
    try:
        for _ in range(20):
            _decode(cache, plan, inputs, stream=STREAM)
        best = float("inf")
        for _ in range(300):
            start = time.perf_counter()
            _decode(cache, plan, inputs, stream=STREAM)
            best = min(best, time.perf_counter() - start)
    finally:
        cache.close()
    # Tens of microseconds on a 2-core CPU machine (this FakeTensor's __dlpack__ builds its
    # managed tensor with ctypes at each call). 1 ms: a 10x regression, not a busy machine.
    assert best < 1e-3, f"decode host time {best * 1e6:.0f} us"


# ==================================================================== decode's call memo


class _ArgsRecorder:
    """The ``library`` fixture's recorder, with ``snapmla_decode``'s packed arguments kept."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.args: list[bytes] = []

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)
        if name != "snapmla_decode":
            return fn

        def call(*args: Any) -> int:
            self.args.append(bytes(_lib.ffi.buffer(args[2])))
            return fn(*args)

        return call


@pytest.fixture
def recorder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> _ArgsRecorder:
    rec = _ArgsRecorder(request.getfixturevalue("library"))
    monkeypatch.setattr(_lib, "lib", lambda: rec)
    return rec


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the full validations of decode calls (the memo's misses)."""
    count: list[int] = []
    real = decode_module._validate_decode_args

    def counting(*args: Any, **kwargs: Any) -> Any:
        count.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(decode_module, "_validate_decode_args", counting)
    return count


def test_decode_memo_reuses_a_checked_call(recorder: _ArgsRecorder, validations: list) -> None:
    cache, plan, inputs = _cache(), _plan(), _decode_inputs()
    try:
        for _ in range(3):
            _decode(cache, plan, inputs, stream=STREAM)
    finally:
        cache.close()
    assert len(validations) == 1  # the second and third calls were hits
    assert len(recorder.args) == 3 and len(set(recorder.args)) == 1  # the same C arguments


def _call(cache: Any, plan: Any, inputs: dict[str, Any], **overrides: Any) -> None:
    kwargs = {
        "layer": 0,
        "softmax_scale": 192**-0.5,
        "stream": STREAM,
        **{k: inputs[k] for k in ("q", "block_table", "cache_seqlens", "out", "lse")},
        **overrides,
    }
    decode_module.decode(cache, plan=plan, **kwargs)


@pytest.mark.parametrize(
    "change",
    [
        {"layer": 1},
        {"softmax_scale": 0.125},
        {"causal": False},
        {"kernel": "reference"},
        {"out": FakeTensor((2, 1, 16, 512), "bfloat16", address=0x7F0000100000)},
        {"out": FakeTensor((2, 1, 16, 512), "float32")},  # an fp32 out
        {"block_table": FakeTensor((2, 8), "int32", address=0x7F0000200000)},
        {"q": FakeTensor((2, 1, 16, 576), "bfloat16", address=0x7F0000300000)},
    ],
    ids=lambda c: next(iter(c)),
)
def test_decode_memo_misses_on_any_change(
    recorder: _ArgsRecorder, validations: list, change: dict[str, Any]
) -> None:
    cache, plan, inputs = _cache(), _plan(), _decode_inputs()
    try:
        _call(cache, plan, inputs)
        _call(cache, plan, inputs)  # a hit
        _call(cache, plan, inputs, **change)
    finally:
        cache.close()
    assert len(validations) == 2  # the changed call was checked again
    assert len(recorder.args) == 3 and recorder.args[2] != recorder.args[1]


def test_decode_packs_the_out_dtype(recorder: _ArgsRecorder) -> None:
    """args.out_dtype from out's dtype, in the memo's hits too; out_dtype, checked
    before the memo, must agree with out (a hit of the same tensors is refused all the same)."""
    cache, plan, inputs = _cache(), _plan(), _decode_inputs()
    fp32 = {**inputs, "out": FakeTensor((2, 1, 16, 512), "float32", address=0x7F0000100000)}
    at = _lib.ffi.offsetof("snapmla_decode_args_t", "out_dtype")
    try:
        for _ in range(2):  # a miss, then a hit
            _decode(cache, plan, fp32, stream=STREAM)
            _decode(cache, plan, inputs, stream=STREAM)
        for dtype, bad in (("bfloat16", fp32), ("float32", inputs)):
            with pytest.raises(SnapMLAError, match="argument 'out': expected dtype " + dtype):
                _decode(cache, plan, bad, stream=STREAM, out_dtype=dtype)
        with pytest.raises(SnapMLAError, match="argument 'out_dtype'"):
            _decode(cache, plan, inputs, stream=STREAM, out_dtype=["float32"])  # unhashable
    finally:
        cache.close()
    codes = [int.from_bytes(a[at : at + 4], "little") for a in recorder.args]
    assert codes == [1, 0, 1, 0]


def test_decode_memo_never_keeps_a_refused_call(recorder: _ArgsRecorder) -> None:
    cache, plan, inputs = _cache(), _plan(), _decode_inputs()
    q = inputs["q"]
    # out inside q's bytes: refused at every call, never memoized
    overlapping = FakeTensor((2, 1, 16, 512), "bfloat16", address=_dlpack_address(q))
    try:
        for _ in range(2):
            with pytest.raises(SnapMLAError, match="argument 'out'"):
                _decode(cache, plan, {**inputs, "out": overlapping}, stream=STREAM)
    finally:
        cache.close()
    assert recorder.args == []  # nothing was launched


def test_decode_memo_is_per_cache(recorder: _ArgsRecorder, validations: list) -> None:
    plan, inputs = _plan(), _decode_inputs()
    first, second = _cache(), _cache()
    try:
        _decode(first, plan, inputs, stream=STREAM)
        _decode(second, plan, inputs, stream=STREAM)  # another cache: checked again
        assert len(validations) == 2 and second._decode_memo and first._decode_memo
    finally:
        first.close()
        second.close()


def _dlpack_address(t: Any) -> int:
    """The data pointer a FakeTensor exports."""
    return _dlpack.view(t).ptr


def test_decode_memo_with_q_pe_and_a_read_only_output(
    recorder: _ArgsRecorder, validations: list
) -> None:
    cache, plan, inputs = _cache(), _plan(), _decode_inputs()
    split = {
        **inputs,
        "q": FakeTensor((2, 1, 16, 512), "bfloat16", address=0x7F0000400000),
        "q_pe": FakeTensor((2, 1, 16, 64), "bfloat16", address=0x7F0000500000),
    }
    read_only_out = FakeTensor(
        (2, 1, 16, 512), "bfloat16", address=_dlpack_address(inputs["out"]), read_only=True
    )
    try:
        for _ in range(2):
            _call(cache, plan, split, q_pe=split["q_pe"])
        assert len(validations) == 1  # q_pe's call memoized too
        _call(cache, plan, inputs)  # the same tensors without q_pe: another call
        assert len(validations) == 2 and recorder.args[2] != recorder.args[1]
        with pytest.raises(SnapMLAError, match="argument 'out': expected a writable tensor"):
            _call(cache, plan, {**inputs, "out": read_only_out})  # only its flag differs
    finally:
        cache.close()
    assert cache._decode_memo == {}  # dropped with the cache


@pytest.mark.parametrize(
    "value, pattern",
    [
        (True, "got bool"),  # == 1.0 and of its hash, but not a float
        (math.nan, "got nan"),
        (-0.0, "got -0.0"),
        (1e-60, "fp32"),
        (np.float64(-1.0), r"got (np\.float64\()?-1\.0"),  # a float subclass: no fast path
    ],
)
def test_scalar_fast_paths_refuse_as_before(
    monkeypatch: pytest.MonkeyPatch, value: Any, pattern: str
) -> None:
    """decode's scalars once good softmax scales are memoized: a value equal to one of them
    but not a float (True == 1.0) and the bad values are still refused with the same message,
    as are layers out of range or of the wrong type."""
    monkeypatch.setattr(decode_module, "_checked_scales", set())
    config = decode_module.DecodeConfig(2, 1, 16, 8)

    def scalars(layer: Any, kernel: str, scale: Any) -> Any:
        return decode_module._decode_scalars(2, config, layer, kernel, scale, EVERY_KERNEL)

    for good in (1.0, 192**-0.5):
        assert scalars(1, "auto", good) == (1, 0, good)
    assert decode_module._checked_scales == {1.0, 192**-0.5}
    assert scalars(np.int64(1), "fast", 1) == (1, 2, 1.0)
    with pytest.raises(SnapMLAError, match=f"argument 'softmax_scale'.*{pattern}"):
        scalars(0, "auto", value)
    for layer, got in ((2, "got 2"), (-1, "got -1"), (True, "got True")):
        with pytest.raises(SnapMLAError, match=f"argument 'layer'.*{got}"):
            scalars(layer, "auto", 1.0)


def test_decode_memo_keeps_the_order_of_refusals(recorder: _ArgsRecorder) -> None:
    """With several bad arguments the first in the checks' order is named, as without the
    memo: a later one that cannot even be read does not jump ahead."""
    cache, plan, inputs = _cache(), _plan(), _decode_inputs()
    bad_q = FakeTensor((2, 1, 16, 576), "float32")
    try:
        with pytest.raises(SnapMLAError, match="argument 'q'"):
            _call(cache, plan, {**inputs, "q": bad_q, "out": object()})
    finally:
        cache.close()


# ============================================= the call memos of append, fetch, quantize, update

_VALIDATIONS = (
    (cache_module, "_validate_append_args"),
    (cache_module, "_validate_fetch_args"),
    (quantize_module, "_validate_quantize_args"),
    (decode_module, "_validate_seqlens"),
)


def _counting(real: Any, name: str, counts: dict[str, int]) -> Any:
    def counting(*args: Any, **kwargs: Any) -> Any:
        counts[name] = counts.get(name, 0) + 1
        return real(*args, **kwargs)

    return counting


@pytest.fixture
def checked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Counts the full checks (the call memos' misses) by function, under ``"launches"`` the
    launches the library fixture recorded (quantize_q's too)."""
    recording = request.getfixturevalue("library")
    recording.GPU = (*recording.GPU, "snapmla_quantize_q")
    monkeypatch.setattr(quantize_module, "_call_memo", {})
    monkeypatch.setattr(decode_module, "_update_memo", {})
    counts: dict[str, Any] = {"launches": recording.calls}
    for module, name in _VALIDATIONS:
        monkeypatch.setattr(module, name, _counting(getattr(module, name), name, counts))
    return counts


def _validations(counts: dict[str, Any]) -> int:
    return sum(n for name, n in counts.items() if name != "launches")


def _append(cache: Any, c_kv: Any) -> None:
    k_pe = FakeTensor((3, 64), "bfloat16", address=0x7F0100010000)
    slots = FakeTensor((3,), "int64", address=0x7F0100020000)
    cache.append(0, c_kv, k_pe, slots, stream=STREAM)


def _fetch(cache: Any, c_kv: Any) -> None:
    slots = FakeTensor((3,), "int64", address=0x7F0100020000)
    k_pe = FakeTensor((3, 64), "bfloat16", address=0x7F0100010000)
    cache.fetch_dequant(0, slots, c_kv=c_kv, k_pe=k_pe, stream=STREAM)


@pytest.mark.parametrize("op", [_append, _fetch], ids=["append", "fetch_dequant"])
def test_cache_call_memo(checked: dict[str, Any], op: Any) -> None:
    cache = _cache()
    c_kv = FakeTensor((3, 512), "bfloat16", address=0x7F0100000000)
    try:
        for _ in range(3):
            op(cache, c_kv)
        assert _validations(checked) == 1 and len(checked["launches"]) == 3
        assert cache._call_memo
        wrong = FakeTensor((3, 512), "float32", address=0x7F0100000000)  # only its dtype
        with pytest.raises(SnapMLAError, match="argument 'c_kv': expected dtype bfloat16"):
            op(cache, wrong)
        with pytest.raises(SnapMLAError, match="argument 'layer'"):  # first, as before
            cache.append(2, object(), None, None, stream=STREAM)
        with pytest.raises(SnapMLAError, match="argument 'c_kv'"):  # not the unreadable k_pe
            cache.append(0, wrong, object(), None, stream=STREAM)
        assert _validations(checked) == 3 and len(checked["launches"]) == 3
    finally:
        cache.close()
    assert cache._call_memo == {}  # dropped with the cache


def test_quantize_call_memo(checked: dict[str, Any]) -> None:
    q = FakeTensor((2, 16, 576), "bfloat16", address=0x7F0100000000)
    out = [
        FakeTensor((2, 16, 512), "float8_e4m3fn", address=0x7F0100100000),
        FakeTensor((2, 16, 64), "bfloat16", address=0x7F0100200000),
        FakeTensor((2, 16), "float32", address=0x7F0100300000),
    ]
    for _ in range(3):
        assert quantize_module.quantize_q(q, out=out, stream=STREAM) == tuple(out)
    assert checked["_validate_quantize_args"] == 1 and len(checked["launches"]) == 3
    overlapping = FakeTensor((2, 16), "float32", address=0x7F0100000000)  # inside q
    with pytest.raises(SnapMLAError, match=r"argument 'out\[2\]': expected memory that"):
        quantize_module.quantize_q(q, out=[*out[:2], overlapping], stream=STREAM)
    with pytest.raises(SnapMLAError, match="argument 'precision'"):
        quantize_module.quantize_q(q, out=out, stream=STREAM, precision="fp4")
    assert _validations(checked) == 2 and len(checked["launches"]) == 3


def test_update_call_memo(checked: dict[str, Any]) -> None:
    plan = _plan()
    seqlens = FakeTensor((2,), "int32", address=0x7F0100000000)
    for _ in range(3):
        plan.update(seqlens, stream=STREAM)
    assert checked["_validate_seqlens"] == 1 and len(checked["launches"]) == 3
    with pytest.raises(SnapMLAError, match=r"shape \[2\] \(batch_size of the plan\)"):
        plan.update(FakeTensor((3,), "int32", address=0x7F0100000000), stream=STREAM)
    other = _plan(batch_size=3)  # another plan's batch size: checked again
    other.update(FakeTensor((3,), "int32", address=0x7F0100000000), stream=STREAM)
    assert _validations(checked) == 3 and len(checked["launches"]) == 4


def test_checker_refuses_a_missing_tensor_by_name() -> None:
    """``tensor()`` of an argument given as ``None`` names it, whether or not ``read_keys`` (which
    skips ``None``, for optional arguments) ran first."""
    checker = Checker("decode", Stream(None, "decode", ()))
    with pytest.raises(SnapMLAError, match=r"argument 'q': expected a DLPack tensor"):
        checker.tensor(None, "q", dtypes=("bfloat16",), shape=(1,))
    checker = Checker("decode", Stream(None, "decode", ()))
    assert checker.read_keys((("q", None),)) == ()
    with pytest.raises(SnapMLAError, match=r"argument 'q': expected a DLPack tensor"):
        checker.tensor(None, "q", dtypes=("bfloat16",), shape=(1,))
