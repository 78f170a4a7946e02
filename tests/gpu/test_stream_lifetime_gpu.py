"""The Python layer's default stream and memory lifetime on the GPU.

- ``stream=None`` with torch tensors is torch's current stream: ``plan.update`` + ``decode``
  captured in a ``torch.cuda.CUDAGraph`` without ``stream=`` replay bit for bit like eager
  calls (``__dlpack__(stream=1)`` would break the capture).
- Dropping a KVCache / DecodePlan (memory allocated by snapmla through CuPy) right after
  enqueuing work on a non-blocking torch stream, then allocating and overwriting memory on the
  legacy default stream while that work still waits behind a sleep kernel, leaves the result
  intact: the memory is released stream-ordered (``_tensor.OwnedMemory``).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from _util import (
    BF16,
    SM_SCALE,
    assert_all_nan,
    check_decode,
    cupy_module,
    device_inputs,
    make_case,
    make_plan,
    poisoned_outputs,
    random_bf16,
    run_decode,
    synchronize,
    to_numpy,
    to_torch,
    torch_module,
    upload,
)

import snapmla
from snapmla import _tensor

pytestmark = pytest.mark.gpu

SLEEP_CYCLES = (
    4_000_000_000  # ~2 s on an H200: still pending when dropped (a quarter second is not)
)


def _same(out, lse, want: tuple[np.ndarray, np.ndarray], label: str) -> None:
    o, ls = to_numpy(out, BF16), to_numpy(lse, np.float32)
    assert np.array_equal(o.view(np.uint16), want[0].view(np.uint16)), f"{label}: out differs"
    assert np.array_equal(ls, want[1], equal_nan=True), f"{label}: lse differs"


def _eager(case, q: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An eager decode on a fresh caller-buffer cache, explicit legacy stream."""
    cache = snapmla.KVCache(case.num_layers, case.num_pages, buffer=to_torch(case.image))
    out, lse = run_decode(cache, case, q=q, seqlens=lens)
    return to_numpy(out, BF16), to_numpy(lse, np.float32)


def test_cuda_graph_torch_without_stream(rng: np.random.Generator) -> None:
    torch = torch_module()
    lens_max = [3000, 700, 64, 129, 2]
    case = make_case(rng, lens_max, num_heads=64, q_len=2)
    lens_a = np.array([2000, 700, 1, 100, 0], np.int32)
    lens_b = np.array([3000, 3, 64, 129, 2], np.int32)
    q_b = random_bf16(rng, case.q.shape, 0.5, 1.0)
    cache = snapmla.KVCache(case.num_layers, case.num_pages, buffer=to_torch(case.image))
    q_t, bt_t, sl_t = device_inputs(case, seqlens=lens_a)
    plan = make_plan(case, sl_t)
    out, lse = poisoned_outputs(*case.q.shape[:3])
    synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # no stream= anywhere: torch's current (capture) stream
        plan.update(sl_t)
        snapmla.decode(cache, 0, q_t, bt_t, sl_t, plan, softmax_scale=SM_SCALE, out=out, lse=lse)
    synchronize()
    assert_all_nan(out, "out during capture")  # capture only records
    graph.replay()
    synchronize()
    check_decode(out, lse, *case.reference(seqlens=lens_a), label="graph without stream=")
    _same(out, lse, _eager(case, case.q, lens_a), "graph without stream=, first replay")
    q_t.copy_(to_torch(q_b))
    sl_t.copy_(to_torch(lens_b))
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    synchronize()
    _same(out, lse, _eager(case, q_b, lens_b), "graph without stream=, step 2")


def test_default_stream_is_torchs_current_stream(rng: np.random.Generator) -> None:
    """Eager calls without stream= inside ``with torch.cuda.stream(s)`` run on ``s``, behind a
    sleep queued there: a synchronous copy on the legacy stream (which does not wait for the
    non-blocking ``s``, but would wait for work on itself) still sees the poisoned output."""
    torch = torch_module()
    cupy = cupy_module()
    case = make_case(rng, [900, 64, 1], num_heads=16, q_len=1)
    cache = snapmla.KVCache(case.num_layers, case.num_pages, buffer=to_torch(case.image))
    q_t, bt_t, sl_t = device_inputs(case)
    want = _eager(case, case.q, case.seqlens)
    s = torch.cuda.Stream()
    out, lse = poisoned_outputs(*case.q.shape[:3])
    synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        plan = make_plan(case, sl_t)
        snapmla.decode(cache, 0, q_t, bt_t, sl_t, plan, softmax_scale=SM_SCALE, out=out, lse=lse)
    host = np.empty(out.numel(), np.uint16)
    cupy.cuda.runtime.memcpy(
        host.ctypes.data, out.data_ptr(), host.nbytes, cupy.cuda.runtime.memcpyDeviceToHost
    )
    assert np.all(np.isnan(host.view(BF16).astype(np.float32))), (
        "the decode did not run behind the sleep on torch's current stream"
    )
    s.synchronize()
    _same(out, lse, want, "eager on torch's current stream")


def _overwrite_free_memory(nbytes: int, rounds: int = 4) -> list:
    """Allocate and fill with 0xFF (NaN in FP8, BF16, fp32) on the legacy default stream.

    By cudaMemsetAsync, not CuPy's ``fill``: on a fresh machine the first ``fill`` compiles a
    kernel, which took longer than the sleep meant to keep the decode pending (0d8aa48, 383283d).
    """
    cupy = cupy_module()
    junk = []
    with cupy.cuda.Stream.null:
        for _ in range(rounds):
            a = cupy.empty(nbytes, np.uint8)
            cupy.cuda.runtime.memsetAsync(a.data.ptr, 0xFF, nbytes, 0)
            junk.append(a)
    return junk


def test_drop_cache_and_plan_with_work_queued(rng: np.random.Generator) -> None:
    torch = torch_module()
    cupy = cupy_module()
    case = make_case(rng, [2000, 700, 64, 1], num_heads=64, q_len=1)
    want = _eager(case, case.q, case.seqlens)
    # Memory owned by snapmla (CuPy, allocated on CuPy's current stream: the legacy one).
    cache = snapmla.KVCache(case.num_layers, case.num_pages)
    upload(cache, case.image)
    nbytes = cache.nbytes
    q_t, bt_t, sl_t = device_inputs(case)
    plan = make_plan(case, sl_t)  # on the legacy stream too
    plan_sizes = (max(plan.plan_bytes, 1), max(plan.workspace_bytes, 1))
    out, lse = poisoned_outputs(*case.q.shape[:3])
    synchronize()
    s = torch.cuda.Stream()  # non-blocking: no implicit order with the legacy stream
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        plan.update(sl_t)
        snapmla.decode(cache, 0, q_t, bt_t, sl_t, plan, softmax_scale=SM_SCALE, out=out, lse=lse)
        done = torch.cuda.Event()
        done.record(s)
    cache.close()
    del cache, plan
    gc.collect()
    junk = [_overwrite_free_memory(size) for size in (nbytes, *plan_sizes)]
    assert not done.query(), "the work finished before the memory was reused: sleep longer"
    s.synchronize()
    cupy.cuda.Device().synchronize()
    _same(out, lse, want, "after dropping the cache and the plan")
    del junk
    # Once the work is done, the parked memory goes back to CuPy's pool.
    _tensor.sweep_released()
    assert _tensor._released == []


def test_dropped_outputs_are_stream_ordered(rng: np.random.Generator) -> None:
    """Outputs snapmla allocates belong to the call's stream in CuPy's pool: dropped while a
    copy of them is still queued on a non-blocking stream, they are not handed to the legacy
    stream (whose fill would otherwise land before the copy)."""
    torch = torch_module()
    case = make_case(rng, [1500, 64], num_heads=64, q_len=1)
    cache = snapmla.KVCache(case.num_layers, case.num_pages, buffer=to_torch(case.image))
    q_t, bt_t, sl_t = device_inputs(case)
    want = _eager(case, case.q, case.seqlens)
    s = torch.cuda.Stream()
    synchronize()
    with torch.cuda.stream(s):
        plan = make_plan(case, sl_t)
        out, lse = snapmla.decode(cache, 0, q_t, bt_t, sl_t, plan, softmax_scale=SM_SCALE)
        decoded = torch.cuda.Event()
        decoded.record(s)
        torch.cuda._sleep(SLEEP_CYCLES)
        keep_out = torch.empty(tuple(out.shape), dtype=torch.int16, device="cuda")
        keep_lse = torch.empty(tuple(lse.shape), dtype=torch.float32, device="cuda")
        keep_out.copy_(torch.from_dlpack(out.view(np.int16)))
        keep_lse.copy_(torch.from_dlpack(lse))
        out_bytes = out.nbytes
    decoded.synchronize()  # the outputs are written; the copies wait behind the sleep
    del out, lse
    junk = _overwrite_free_memory(out_bytes)
    s.synchronize()
    o = keep_out.cpu().numpy().view(BF16)
    ls = keep_lse.cpu().numpy()
    _same(o, ls, want, "outputs dropped with a copy queued")
    del junk
