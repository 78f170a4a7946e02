"""CPU tests of the Python layer's streams, memory lifetime and thread safety.

- The default stream (``stream=None``): torch's current stream when any tensor argument is a
  torch tensor (faked here by a stand-in ``torch`` module in ``sys.modules``), else CuPy's
  current stream; the value that reaches the producers' ``__dlpack__`` and the C call.
- ``OwnedMemory``: stream-ordered release of the memory a cache or plan allocated (with a
  stand-in ``cupy`` module whose events complete when the test says so).
- ``close()`` on one thread while another is inside an operation: it waits, with the C call
  faked by a function that blocks until the test releases it.

No test here reaches CUDA: the KVCache sits on a fake device address (as in
test_api_validation), and every GPU function of the library is replaced by a recorder.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
import threading
import time
import types
import weakref
from typing import Any, Callable

import pytest

from snapmla import DecodePlan, KVCache, SnapMLAError, _args, _lib, _tensor, decode, quantize_q
from snapmla import cache as cache_module
from snapmla import quantize as quantize_module
from snapmla._tensor import InUse, OwnedMemory, Stream
from snapmla.decode import DecodeConfig
from test_api_validation import LIBRARY, _buffer, bf16, fp8, host_function, i32, i64
from test_dlpack import CPU, CUDA0, FakeTensor

# (`from snapmla import decode` is the function, which shadows the module)
decode_module = importlib.import_module("snapmla.decode")

TORCH_STREAM = 0xCA97  # torch's current stream in the fake torch (e.g. a capture stream)
CUPY_STREAM = 0xC0FE  # CuPy's current stream in the fake cupy
FAKE_PLAN_PTR = 0x7D0000000000
# A one-term (fp8) plan's kernel options: every kernel (test_api_validation asks the library).
EVERY_KERNEL = types.MappingProxyType(dict(_args.KERNELS))

needs_library = pytest.mark.skipif(
    isinstance(LIBRARY, SnapMLAError),
    reason=f"needs the shared library (set SNAPMLA_LIBRARY): {LIBRARY}",
)


# ------------------------------------------------------------------------------ fakes


class _FakeTorchTensorBase:
    """The fake torch module's ``Tensor`` class."""


class TorchTensor(FakeTensor, _FakeTorchTensorBase):
    """A FakeTensor that is an instance of the fake ``torch.Tensor``."""


def _fake_torch(current: dict[int, int], capturing: bool = False) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.Tensor = _FakeTorchTensorBase  # type: ignore[attr-defined]

    class _Stream:
        def __init__(self, handle: int) -> None:
            self.cuda_stream = handle

    def current_stream(device: int) -> _Stream:
        return _Stream(current[device])

    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        current_stream=current_stream,
        is_initialized=lambda: True,
        is_current_stream_capturing=lambda: capturing,
    )
    return torch


class _FakeCupy:
    """Just enough of ``cupy`` for Stream (current stream) and OwnedMemory (events)."""

    def __init__(self) -> None:
        self.current = CUPY_STREAM
        self.capturing: set[int] = set()
        self.events: list[_FakeEvent] = []
        self.synchronized = 0
        cupy = self

        class Device:
            def __init__(self, device: int = 0) -> None:
                pass

            def __enter__(self) -> None:
                return None

            def __exit__(self, *exc_info: object) -> None:
                return None

        class ExternalStream:
            def __init__(self, ptr: int, device_id: int = -1) -> None:
                self.ptr = ptr

        class Event:
            def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
                self.recorded_on: list[int] = []
                self.done = True
                cupy.events.append(self)

            def record(self, stream: Any) -> None:
                self.recorded_on.append(stream.ptr)
                self.done = False

        def stream_is_capturing(handle: int) -> bool:
            return handle in cupy.capturing

        def device_synchronize() -> None:
            cupy.synchronized += 1

        self.cuda = types.SimpleNamespace(
            Device=Device,
            ExternalStream=ExternalStream,
            Event=Event,
            get_current_stream=lambda: types.SimpleNamespace(ptr=cupy.current),
            runtime=types.SimpleNamespace(
                streamIsCapturing=stream_is_capturing, deviceSynchronize=device_synchronize
            ),
        )


_FakeEvent = Any


class _TorchImportGuard:
    """A meta path finder that fails the test if anything imports torch."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise AssertionError("snapmla imported torch")


@pytest.fixture
def no_torch_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_TorchImportGuard(), *sys.meta_path])


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """A stand-in torch in sys.modules; returns {device: current stream handle} to edit."""
    current = {0: TORCH_STREAM, 1: TORCH_STREAM + 1}
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(current))
    return current


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> _FakeCupy:
    cupy = _FakeCupy()
    monkeypatch.setattr(_tensor, "cupy_module", lambda op: cupy)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return cupy


def _no_device_switch(monkeypatch: pytest.MonkeyPatch, modules: tuple[Any, ...]) -> None:
    """Making a device current is a no-op in these modules (the tensors here are fakes)."""
    for module in modules:
        if hasattr(module, "on_device"):
            monkeypatch.setattr(module, "on_device", lambda op, device: contextlib.nullcontext())


@pytest.fixture(autouse=True)
def _no_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may allocate; making the device current is a no-op."""

    def reached(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a test allocated GPU memory")

    modules = (_tensor, cache_module, decode_module, quantize_module)
    for module in modules:
        if hasattr(module, "empty"):
            monkeypatch.setattr(module, "empty", reached)
    _no_device_switch(monkeypatch, modules)


class _RecordingLibrary:
    """The real library for host functions; GPU entry points replaced by recorders that
    note the stream handle they got and can block until released."""

    GPU = ("snapmla_append", "snapmla_fetch_dequant", "snapmla_decode", "snapmla_decode_plan")

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.inside = threading.Event()  # set when a blocking call is inside
        self.release = threading.Event()
        self.release.set()
        self.hook: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Any:
        if name in self.GPU:

            def call(*args: Any) -> int:
                self.calls.append((name, int(_lib.ffi.cast("uintptr_t", args[-1]))))
                if self.hook is not None:
                    self.hook()
                self.inside.set()
                assert self.release.wait(10), "the test never released the call"
                return 0

            return call
        return host_function(LIBRARY, name)


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch) -> _RecordingLibrary:
    if isinstance(LIBRARY, SnapMLAError):
        pytest.skip(f"needs the shared library (set SNAPMLA_LIBRARY): {LIBRARY}")
    recorder = _RecordingLibrary()
    monkeypatch.setattr(_lib, "lib", lambda: recorder)
    # The recorded calls run on no device: the front-ends make none current (with CuPy
    # importable and no driver, trying would fail before the call is recorded).
    _no_device_switch(monkeypatch, (cache_module, decode_module, quantize_module))
    return recorder


def _cache() -> KVCache:
    return KVCache(2, 4, buffer=_buffer(device=CUDA0))


def _plan(batch_size: int = 2, max_pages: int = 8) -> DecodePlan:
    """A DecodePlan on fake device buffers, as the constructor would leave it."""
    plan = DecodePlan.__new__(DecodePlan)
    plan._in_use = InUse()
    plan._owned = None
    plan.config = DecodeConfig(batch_size, 1, 16, max_pages)
    plan.device = 0
    plan._c_config = _args.decode_config(batch_size, 1, 16, max_pages, 0)
    plan._kernels = EVERY_KERNEL  # (an fp8 config runs on every kernel)
    plan.plan_bytes = plan.workspace_bytes = 256
    plan._plan_ptr = FAKE_PLAN_PTR
    plan._workspace_ptr = FAKE_PLAN_PTR + 4096
    return plan


def _decode_inputs(make: Callable[..., FakeTensor] = FakeTensor) -> dict[str, Any]:
    return {
        "q": make((2, 1, 16, 576), "bfloat16"),
        "block_table": make((2, 8), "int32"),
        "cache_seqlens": make((2,), "int32"),
        "out": make((2, 1, 16, 512), "bfloat16"),
        "lse": make((2, 16, 1), "float32"),
    }


def _decode(cache: KVCache, plan: DecodePlan, inputs: dict[str, Any], **kwargs: Any) -> Any:
    return decode(
        cache,
        0,
        inputs["q"],
        inputs["block_table"],
        inputs["cache_seqlens"],
        plan,
        softmax_scale=192**-0.5,
        out=inputs["out"],
        lse=inputs["lse"],
        **kwargs,
    )


# ====================================================================== default stream


def test_default_stream_of_torch_inputs_is_torchs_current_stream(
    fake_torch: dict[int, int],
) -> None:
    q = TorchTensor((2, 4, 576), "bfloat16")
    with pytest.raises(SnapMLAError, match="got cpu"):
        quantize_q(q, out=(fp8(2, 4, 512, device=CPU), None, None))
    assert q.stream_seen == TORCH_STREAM  # never 1: valid during torch graph capture

    # The stream of the operation's device.
    q = TorchTensor((2, 4, 576), "bfloat16", device=(2, 1))
    with pytest.raises(SnapMLAError, match="got cpu"):
        quantize_q(q, out=(fp8(2, 4, 512, device=CPU), None, None))
    assert q.stream_seen == TORCH_STREAM + 1

    # Outside a capture torch's current stream may be the legacy default stream: 0 -> 1.
    fake_torch[0] = 0
    q = TorchTensor((2, 4, 576), "bfloat16")
    with pytest.raises(SnapMLAError, match="got cpu"):
        quantize_q(q, out=(fp8(2, 4, 512, device=CPU), None, None))
    assert q.stream_seen == 1


def test_any_torch_argument_selects_torchs_stream(fake_torch: dict[int, int]) -> None:
    # q is not a torch tensor, an output is: every producer gets torch's stream.
    q = bf16(2, 4, 576)
    scale = TorchTensor((2, 4), "float32")
    with pytest.raises(SnapMLAError, match="got cpu"):
        quantize_q(q, out=(None, bf16(2, 4, 64, device=CPU), scale))
    assert q.stream_seen == TORCH_STREAM


def test_default_stream_without_torch_is_cupys_and_torch_is_not_imported(
    no_torch_import: None, fake_cupy: _FakeCupy
) -> None:
    q = bf16(2, 4, 576)
    with pytest.raises(SnapMLAError, match="got cpu"):
        quantize_q(q, out=(fp8(2, 4, 512, device=CPU), None, None))
    assert q.stream_seen == CUPY_STREAM
    assert "torch" not in sys.modules


def test_torch_loaded_but_no_torch_input_uses_cupy(
    fake_torch: dict[int, int], fake_cupy: _FakeCupy
) -> None:
    q = bf16(2, 4, 576)
    with pytest.raises(SnapMLAError, match="got cpu"):
        quantize_q(q, out=(fp8(2, 4, 512, device=CPU), None, None))
    assert q.stream_seen == CUPY_STREAM


def test_explicit_stream_wins_over_torch(fake_torch: dict[int, int]) -> None:
    q = TorchTensor((2, 4, 576), "bfloat16")
    with pytest.raises(SnapMLAError, match="got cpu"):
        quantize_q(q, out=(fp8(2, 4, 512, device=CPU), None, None), stream=0x1234)
    assert q.stream_seen == 0x1234


def test_torch_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = _fake_torch({})  # no device: current_stream raises KeyError
    monkeypatch.setitem(sys.modules, "torch", torch)
    with pytest.raises(SnapMLAError, match="cannot get torch's current CUDA stream"):
        Stream(None, "op", [TorchTensor((1,), "int32")]).handle(0)


def test_stream_resolution_is_lazy_and_kept(fake_torch: dict[int, int]) -> None:
    s = Stream(None, "op", [None, TorchTensor((1,), "int32")])
    fake_torch[0] = 0x99
    assert s.handle(0) == 0x99
    fake_torch[0] = 0x77
    assert s.handle(0) == 0x99


@needs_library
def test_default_stream_reaches_dlpack_and_the_c_calls(
    fake_torch: dict[int, int], library: _RecordingLibrary
) -> None:
    cache = _cache()
    c_kv = TorchTensor((3, 512), "bfloat16")
    cache.append(0, c_kv, TorchTensor((3, 64), "bfloat16"), TorchTensor((3,), "int64"))
    assert c_kv.stream_seen == TORCH_STREAM
    plan = _plan()
    inputs = _decode_inputs(TorchTensor)
    plan.update(inputs["cache_seqlens"])
    assert inputs["cache_seqlens"].stream_seen == TORCH_STREAM
    assert _decode(cache, plan, inputs) == (inputs["out"], inputs["lse"])
    for name in ("q", "block_table", "cache_seqlens", "out", "lse"):
        assert inputs[name].stream_seen == TORCH_STREAM, name
    slots = TorchTensor((3,), "int64")
    c_out, k_out = TorchTensor((3, 512), "bfloat16"), TorchTensor((3, 64), "bfloat16")
    cache.fetch_dequant(0, slots, c_kv=c_out, k_pe=k_out)
    assert slots.stream_seen == c_out.stream_seen == k_out.stream_seen == TORCH_STREAM
    assert library.calls == [
        ("snapmla_append", TORCH_STREAM),
        ("snapmla_decode_plan", TORCH_STREAM),
        ("snapmla_decode", TORCH_STREAM),
        ("snapmla_fetch_dequant", TORCH_STREAM),
    ]
    cache.close()


# ====================================================================== OwnedMemory


class _Buffer:
    """Stands for a CuPy array (weak-referenceable, so the test sees when it is dropped)."""


def test_owned_memory_same_stream_is_released_at_once(fake_cupy: _FakeCupy) -> None:
    buffer = _Buffer()
    dropped = weakref.ref(buffer)
    owned = OwnedMemory((buffer,), 0x10, 0)
    owned.used_on(0x10)
    assert fake_cupy.events == []  # the pool orders reuse on the allocation stream
    del buffer
    owned.release()
    gc.collect()
    assert dropped() is None


def test_owned_memory_waits_for_other_streams(fake_cupy: _FakeCupy) -> None:
    buffer = _Buffer()
    dropped = weakref.ref(buffer)
    owned = OwnedMemory((buffer,), 0x10, 0)
    owned.used_on(0x20)
    owned.used_on(0x20)  # one event per stream, re-recorded
    fake_cupy.capturing.add(0x30)
    owned.used_on(0x30)  # capturing: graphs are the caller's to keep valid
    assert len(fake_cupy.events) == 1
    assert fake_cupy.events[0].recorded_on == [0x20, 0x20]
    del buffer
    owned.release()
    owned.release()  # idempotent
    gc.collect()
    assert dropped() is not None  # work on 0x20 still pending: kept
    _tensor.sweep_released()
    assert dropped() is not None
    fake_cupy.events[0].done = True
    _tensor.sweep_released()
    gc.collect()
    assert dropped() is None
    assert fake_cupy.synchronized == 0  # never blocks the host


def test_no_event_query_while_capturing(
    fake_cupy: _FakeCupy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cudaEventQuery during a global-mode capture would break it: the sweep waits."""
    buffer = _Buffer()
    dropped = weakref.ref(buffer)
    owned = OwnedMemory((buffer,), 0x10, 0)
    owned.used_on(0x20)
    fake_cupy.events[0].done = True
    queried: list[bool] = []
    event_type = type(fake_cupy.events[0])
    monkeypatch.setattr(
        event_type, "done", property(lambda self: queried.append(True) or True), raising=False
    )
    del buffer
    monkeypatch.setitem(sys.modules, "torch", _fake_torch({0: 7}, capturing=True))
    owned.release()  # torch's current stream captures: parked, no query
    gc.collect()
    assert dropped() is not None and queried == []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch({0: 7}, capturing=False))
    fake_cupy.capturing.add(CUPY_STREAM)  # CuPy's current stream captures
    _tensor.sweep_released()
    assert dropped() is not None and queried == []
    fake_cupy.capturing.clear()
    _tensor.sweep_released()
    gc.collect()
    assert dropped() is None and queried


def test_owned_memory_falls_back_to_synchronize(fake_cupy: _FakeCupy) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no context")

    fake_cupy.cuda.Event = broken
    buffer = _Buffer()
    dropped = weakref.ref(buffer)
    owned = OwnedMemory((buffer,), 0x10, 0)
    owned.used_on(0x20)  # does not raise: the launch is already queued
    del buffer
    owned.release()
    gc.collect()
    assert fake_cupy.synchronized == 1 and dropped() is None


def test_owned_memory_release_never_raises(
    fake_cupy: _FakeCupy, monkeypatch: pytest.MonkeyPatch
) -> None:
    owned = OwnedMemory((_Buffer(),), 0x10, 0)
    owned.used_on(0x20)

    class Broken:
        @property
        def done(self) -> bool:
            raise RuntimeError("context destroyed")

    owned._events = {0x20: Broken()}
    owned.release()  # kept (the safe choice), no exception
    _tensor.sweep_released()
    _tensor._released.clear()


def test_del_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    KVCache.__new__(KVCache).__del__()  # never initialized
    DecodePlan.__new__(DecodePlan).__del__()
    plan = _plan()
    plan.__del__()
    assert plan.closed


# ====================================================================== concurrency


def _run(target: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, errors


@needs_library
def test_close_waits_for_an_append_in_flight(library: _RecordingLibrary) -> None:
    cache = _cache()
    destroyed: list[float] = []
    real_destroy = LIBRARY.snapmla_cache_destroy

    def destroy(handle: Any) -> int:
        destroyed.append(time.monotonic())
        return real_destroy(handle)

    library.snapmla_cache_destroy = destroy  # type: ignore[attr-defined]
    library.release.clear()
    appender, append_errors = _run(
        lambda: cache.append(0, bf16(3, 512), bf16(3, 64), i64(3), stream=5)
    )
    assert library.inside.wait(10)
    closer, close_errors = _run(cache.close)
    closer.join(0.3)
    assert closer.is_alive() and destroyed == []  # waiting for the append
    assert cache.closed  # ... and new calls are already refused
    with pytest.raises(SnapMLAError, match="KVCache.append: the cache is closed"):
        cache.append(0, bf16(3, 512), bf16(3, 64), i64(3), stream=5)
    with pytest.raises(SnapMLAError, match="argument 'cache': the cache is closed"):
        _decode(cache, _plan(), _decode_inputs(), stream=5)
    released = time.monotonic()
    library.release.set()
    appender.join(10)
    closer.join(10)
    assert not appender.is_alive() and not closer.is_alive()
    assert append_errors == [] and close_errors == []
    assert len(destroyed) == 1 and destroyed[0] >= released
    assert cache._handle is None
    cache.close()  # idempotent
    assert len(destroyed) == 1


@needs_library
def test_close_waits_for_a_decode_in_flight(library: _RecordingLibrary) -> None:
    cache, plan = _cache(), _plan()
    library.release.clear()
    decoder, decode_errors = _run(lambda: _decode(cache, plan, _decode_inputs(), stream=5))
    assert library.inside.wait(10)
    cache_closer, cache_errors = _run(cache.close)
    plan_closer, plan_errors = _run(plan.close)
    cache_closer.join(0.3)
    plan_closer.join(0.01)
    assert cache_closer.is_alive() and plan_closer.is_alive()
    assert cache._handle is not None
    library.release.set()
    for thread in (decoder, cache_closer, plan_closer):
        thread.join(10)
        assert not thread.is_alive()
    assert decode_errors == cache_errors == plan_errors == []
    assert cache._handle is None and plan.closed
    with pytest.raises(SnapMLAError, match="argument 'cache': the cache is closed"):
        _decode(cache, plan, _decode_inputs(), stream=5)
    with pytest.raises(SnapMLAError, match="DecodePlan.update: the plan is closed"):
        plan.update(i32(2), stream=5)
    cache2 = _cache()
    with pytest.raises(SnapMLAError, match="argument 'plan': the plan is closed") as info:
        _decode(cache2, plan, _decode_inputs(), stream=5)
    assert info.value.argument == "plan"
    cache2.close()


@needs_library
def test_concurrent_closes_all_wait(library: _RecordingLibrary) -> None:
    cache = _cache()
    library.release.clear()
    appender, _ = _run(lambda: cache.append(0, bf16(3, 512), bf16(3, 64), i64(3), stream=5))
    assert library.inside.wait(10)
    closers = [_run(cache.close) for _ in range(3)]
    time.sleep(0.2)
    assert all(thread.is_alive() for thread, _ in closers)
    library.release.set()
    for thread, errors in [(appender, []), *closers]:
        thread.join(10)
        assert not thread.is_alive() and errors == []
    assert cache._handle is None


@needs_library
def test_close_from_inside_an_operation_is_refused(library: _RecordingLibrary) -> None:
    cache = _cache()
    refusals: list[SnapMLAError] = []

    def close_inside() -> None:
        try:
            cache.close()
        except SnapMLAError as exc:
            refusals.append(exc)

    library.hook = close_inside
    cache.append(0, bf16(3, 512), bf16(3, 64), i64(3), stream=5)
    assert len(refusals) == 1
    assert "KVCache.close: called from inside an operation" in str(refusals[0])
    assert not cache.closed
    library.hook = None
    cache.close()
    assert cache.closed


@needs_library
def test_many_threads_with_closes(library: _RecordingLibrary) -> None:
    """Stress: operations on several threads while the cache closes; each call either
    completes before the destroy or is refused as closed, never anything else."""
    for _ in range(20):
        cache = _cache()
        destroyed = threading.Event()
        real_destroy = LIBRARY.snapmla_cache_destroy
        late: list[str] = []

        def destroy(handle: Any, _real: Any = real_destroy, _done: Any = destroyed) -> int:
            _done.set()
            return _real(handle)

        def record(_late: list[str] = late, _done: Any = destroyed) -> None:
            if _done.is_set():
                _late.append("a C call after the destroy")

        library.snapmla_cache_destroy = destroy  # type: ignore[attr-defined]
        library.hook = record

        def work(c: KVCache = cache) -> None:
            for _ in range(50):
                try:
                    c.append(0, bf16(1, 512), bf16(1, 64), i64(1), stream=5)
                except SnapMLAError as exc:
                    assert "the cache is closed" in str(exc)
                    return

        threads = [_run(work) for _ in range(3)]
        time.sleep(0.001)
        cache.close()
        for thread, errors in threads:
            thread.join(10)
            assert errors == []
        assert late == []
    library.hook = None


def test_quantize_outputs_argument_still_checked(fake_torch: dict[int, int]) -> None:
    with pytest.raises(SnapMLAError, match="argument 'out'"):
        quantize_q(TorchTensor((2, 4, 576), "bfloat16"), out="abc")
    with pytest.raises(SnapMLAError, match="argument 'out'"):
        quantize_q(TorchTensor((2, 4, 576), "bfloat16"), out=(None,))
