"""Several GPUs in one process: per-device state of the library and of both Python front ends.

Caches, plans and decodes on devices 0 .. N-1 from one thread that switches the current device
between calls (and calls with another device current than the work's), and from one thread a
device at once: every cache byte and output bit equal to the same work run on one device at a
time. Calls whose tensors sit on another device than the cache are refused naming the argument
(snapmla.torch, the generic API, and the C API, which refuses a call made while another device
than the cache's is current). A plan sized and built with num_sm_parts 0 on one device, used on
another, behaves as include/snapmla/snapmla.h says: equal part counts (equal SM counts) decode as
that device's own plan; other part counts give NaN rows or, where the buffer is too small for
this device's config, a refusal naming 'plan'.

The tests that need two devices skip below that; the rest run on one (the threads then share it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import pytest
from _util import (
    BF16,
    POISON_BYTE,
    SM_SCALE,
    DecodeCase,
    c_decode_args,
    make_case,
    page_slots,
    to_torch,
)

import snapmla

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
smt = pytest.importorskip("snapmla.torch")

# (seqlens, heads, q_len) of the work: the 128-head kernel with an empty request and a page
# boundary, and the 16-head kernel with two new tokens a request.
OWN_SHAPE = ([700, 0, 130, 64], 128, 1)
SHARED_SHAPE = ([200, 65, 1], 16, 2)
THREAD_REPEATS = 6


# ---------------------------------------------------------------------------- devices


def device_count() -> int:
    return torch.cuda.device_count()


def need_devices(n: int) -> None:
    have = device_count()
    if have < n:
        pytest.skip(f"needs {n} CUDA devices, found {have}")


def sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def same_part_counts(parts: int) -> bool:
    """Whether one config plans the same split-KV part count on every device: an explicit count,
    or the default from SM counts that are all equal."""
    return parts > 0 or len({sm_count(d) for d in range(device_count())}) == 1


def sync_all() -> None:
    for d in range(device_count()):
        torch.cuda.synchronize(d)


@pytest.fixture(autouse=True)
def _keep_current_device() -> Iterator[None]:
    """Each test leaves the current device as it found it; its work is done on every device."""
    previous = torch.cuda.current_device()
    yield
    sync_all()
    torch.cuda.set_device(previous)


def to_dev(a: np.ndarray, device: int) -> Any:
    """Host array (bf16 / plain) -> a new contiguous torch tensor on cuda:``device``."""
    return to_torch(a).to(torch.device("cuda", device))


def bits(t: Any) -> np.ndarray:
    """A torch tensor's bytes on the host (after the work queued on its device)."""
    torch.cuda.synchronize(t.device)
    return t.contiguous().view(torch.uint8).cpu().numpy().copy()


def nan_on(shape: tuple[int, ...], dtype: Any, device: int) -> Any:
    return torch.full(shape, float("nan"), dtype=dtype, device=torch.device("cuda", device))


def case_of(seed: int, shape: tuple[list[int], int, int]) -> DecodeCase:
    seqlens, heads, q_len = shape
    return make_case(np.random.default_rng(seed), seqlens, num_heads=heads, q_len=q_len)


def appended_tokens(case: DecodeCase, layer: int = 0) -> tuple[np.ndarray, ...]:
    """(c_kv [n, 512], k_pe [n, 64], slots [n]) of every request's tokens in ``layer``."""
    c = np.concatenate(case.c_kv[layer]).astype(BF16)
    k = np.concatenate(case.k_pe[layer]).astype(BF16)
    slots = np.concatenate(
        [page_slots(case.block_table[r], int(n)) for r, n in enumerate(case.seqlens)]
    ).astype(np.int64)
    return c, k, slots


# ---------------------------------------------------------------------------- work


class Job:
    """One device's step, in stages (cache, append, plan, decode) that can be interleaved with
    other devices' stages: a poisoned cache, the case's tokens appended, a plan, a decode into
    poisoned outputs. ``api`` picks the front end: "torch" (snapmla.torch) or "generic"
    (snapmla.KVCache, DecodePlan, decode on torch tensors)."""

    def __init__(
        self, api: str, device: int, case: DecodeCase, kernel: str = "auto", parts: int = 0
    ) -> None:
        self.api, self.device, self.case, self.kernel, self.parts = api, device, case, kernel, parts
        self.stages: list[Callable[[], None]] = [self.make, self.append, self.plan, self.decode]

    def make(self) -> None:
        case, d = self.case, self.device
        self.q, self.bt, self.sl = (to_dev(a, d) for a in (case.q, case.block_table, case.seqlens))
        self.tokens = tuple(to_dev(a, d) for a in appended_tokens(case))
        b, s_q, h, _ = case.q.shape
        self.out = nan_on((b, s_q, h, 512), torch.bfloat16, d)
        self.lse = nan_on((b, h, s_q), torch.float32, d)
        if self.api == "torch":
            self.memory = smt.empty_cache(1, case.num_pages, device=torch.device("cuda", d))
        else:
            self.memory = torch.empty(
                case.num_pages * 41216, dtype=torch.uint8, device=torch.device("cuda", d)
            )
        self.memory.fill_(POISON_BYTE)
        if self.api == "generic":
            self.cache = snapmla.KVCache(1, case.num_pages, buffer=self.memory)
            assert self.cache.device == d

    def append(self) -> None:
        if self.api == "torch":
            smt.append(self.memory, 0, *self.tokens)
        else:
            self.cache.append(0, *self.tokens)

    def plan(self) -> None:
        case = self.case
        _, s_q, h, _ = case.q.shape
        config = {"num_heads": h, "q_len": s_q, "max_pages": case.max_pages}
        if self.api == "torch":
            self.plan_t, self.workspace = smt.decode_buffers(
                case.batch, num_sm_parts=self.parts, device=self.q.device, **config
            )
            smt.plan(self.plan_t, self.sl, num_sm_parts=self.parts, **config)
        else:
            self.plan_t = snapmla.DecodePlan(self.sl, num_sm_parts=self.parts, **config)
            assert self.plan_t.device == self.device

    def decode(self) -> None:
        if self.api == "torch":
            smt.decode(
                self.memory, 0, self.q, self.bt, self.sl, self.plan_t, self.workspace,
                softmax_scale=SM_SCALE, kernel=self.kernel, num_sm_parts=self.parts,
                out=self.out, lse=self.lse,
            )  # fmt: skip
        else:
            snapmla.decode(
                self.cache, 0, self.q, self.bt, self.sl, self.plan_t,
                softmax_scale=SM_SCALE, kernel=self.kernel, out=self.out, lse=self.lse,
            )  # fmt: skip

    def run(self) -> None:
        for stage in self.stages:
            stage()

    def result(self) -> dict[str, np.ndarray]:
        """The cache's bytes and the outputs' bits, after the work queued on the device."""
        return {"cache": bits(self.memory), "out": bits(self.out), "lse": bits(self.lse)}


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], label: str) -> None:
    for key in ("cache", "out", "lse"):
        g, w = got[key], want[key]
        assert g.shape == w.shape, f"{label}: {key} {g.shape} vs {w.shape}"
        differ = int((g != w).sum())
        assert differ == 0, f"{label}: {differ} of {g.size} {key} bytes differ"


def require_api(api: str) -> None:
    if api == "generic":
        # DecodePlan allocates its buffers through CuPy, and without CuPy the generic calls
        # leave the current device as it is (the C library then refuses another one).
        pytest.importorskip("cupy")


def make_jobs(api: str, kernel: str, parts: int) -> list[Job]:
    """Two jobs a device: its own data (seeded by the device) and data every device shares."""
    jobs = []
    for d in range(device_count()):
        jobs.append(Job(api, d, case_of(100 + d, OWN_SHAPE), kernel, parts))
        jobs.append(Job(api, d, case_of(7, SHARED_SHAPE), kernel, parts))
    return jobs


def one_device_at_a_time(jobs: list[Job]) -> list[dict[str, np.ndarray]]:
    """Each job alone, start to end, with its device current, before the next one starts."""
    results = []
    for job in jobs:
        torch.cuda.set_device(job.device)
        job.run()
        results.append(job.result())
    return results


def check_shared_across_devices(jobs: list[Job], results: list[dict[str, np.ndarray]]) -> None:
    """The shared data decodes to the same bits on every device (one part count everywhere)."""
    shared = [(j, r) for j, r in zip(jobs, results) if j.case.q.shape[2] == SHARED_SHAPE[1]]
    if not same_part_counts(shared[0][0].parts):
        return  # devices with other SM counts split the default plan differently
    for job, result in shared[1:]:
        assert_same(result, shared[0][1], f"device {job.device} against device 0")


# ---------------------------------------------------------------------------- (a) one process


@pytest.mark.parametrize("api", ["torch", "generic"])
@pytest.mark.parametrize(("kernel", "parts"), [("auto", 0), ("reference", 0), ("auto", 7)])
@pytest.mark.parametrize("current", ["own", "other"])
def test_one_thread_switching_devices(api: str, kernel: str, parts: int, current: str) -> None:
    """Every stage of every device's job, one stage at a time across the devices, from one
    thread; ``current``: the job's device is made current before each call, or another one (the
    front ends make the cache's device current themselves and restore the caller's)."""
    require_api(api)
    want = one_device_at_a_time(make_jobs(api, kernel, parts))
    jobs = make_jobs(api, kernel, parts)
    n = device_count()
    for step in range(len(jobs[0].stages) + 1):  # the decode twice: the call memos' hits
        for job in jobs:
            here = job.device if current == "own" else (job.device + 1) % n
            torch.cuda.set_device(here)
            job.stages[min(step, len(job.stages) - 1)]()
            assert torch.cuda.current_device() == here, "a call left another device current"
    sync_all()
    got = [job.result() for job in jobs]
    for job, g, w in zip(jobs, got, want):
        assert_same(g, w, f"{api} device {job.device} {job.case.q.shape}")
    check_shared_across_devices(jobs, got)
    out = got[0]["out"].view(np.uint16).view(BF16).astype(np.float32)
    assert np.isfinite(out.reshape(jobs[0].case.q.shape[:3] + (512,))[[0, 2, 3]]).all()


@pytest.mark.parametrize("api", ["torch", "generic"])
def test_one_thread_per_device(api: str) -> None:
    """One thread a job (at least two threads: on one GPU they share it), all started together,
    each on its own device, decoding repeatedly: every result equal to the job run alone."""
    require_api(api)
    n = device_count()
    jobs = make_jobs(api, "auto", 0)
    want = one_device_at_a_time(make_jobs(api, "auto", 0))
    start = threading.Barrier(len(jobs))
    errors: list[BaseException] = []
    got: list[list[dict[str, np.ndarray]]] = [[] for _ in jobs]

    def work(i: int) -> None:
        try:
            job = jobs[i]
            torch.cuda.set_device(job.device)
            start.wait(timeout=60)
            job.run()
            got[i].append(job.result())
            for _ in range(THREAD_REPEATS):
                job.decode()
                got[i].append(job.result())
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test's thread)
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    for i, job in enumerate(jobs):
        for k, g in enumerate(got[i]):
            assert_same(g, want[i], f"thread {i} (device {job.device} of {n}), result {k}")
    check_shared_across_devices(jobs, [g[0] for g in got])


# ---------------------------------------------------------------------------- (b) refusals


@pytest.fixture
def on_two(rng: np.random.Generator) -> dict[str, Any]:
    """A decode step whose cache and tensors live on device 0, the outputs poisoned, and a copy
    on device 1 of every tensor."""
    need_devices(2)
    case = make_case(rng, [150, 64, 3], num_heads=16, q_len=1)
    job = Job("torch", 0, case)
    torch.cuda.set_device(0)
    job.run()
    sync_all()
    job.out.fill_(float("nan"))
    job.lse.fill_(float("nan"))
    return {"job": job, "cache_bytes": bits(job.memory)}


def expect_refusal(call: Callable[[], Any], argument: str, *text: str) -> str:
    with pytest.raises(snapmla.SnapMLAError) as info:
        call()
    message = str(info.value)
    assert info.value.argument == argument, message
    assert f"'{argument}'" in message and all(t in message for t in text), message
    return message


def assert_untouched(job: Job, cache_bytes: np.ndarray, label: str) -> None:
    sync_all()
    assert np.array_equal(bits(job.memory), cache_bytes), f"{label}: the cache was written"
    assert torch.isnan(job.out.float()).all(), f"{label}: out was written"
    assert torch.isnan(job.lse).all(), f"{label}: lse was written"


def refuse_tokens_on_device_1(
    job: Job, cache_bytes: np.ndarray, append: Callable[..., None]
) -> None:
    """``append(c_kv, k_pe, slots)`` of the job's tokens with each of them in turn on device 1
    is refused naming it, the cache and the outputs untouched."""
    for i, name in enumerate(("c_kv", "k_pe", "slots")):
        tokens = list(job.tokens)
        tokens[i] = tokens[i].to(torch.device("cuda", 1))
        expect_refusal(lambda t=tokens: append(*t), name, "cuda:1")
        assert_untouched(job, cache_bytes, f"append with {name} on cuda:1")


def test_torch_front_end_refuses_tensors_on_another_device(on_two: dict[str, Any]) -> None:
    job, cache_bytes = on_two["job"], on_two["cache_bytes"]
    one = torch.device("cuda", 1)
    tensors = {
        "q": job.q,
        "block_table": job.bt,
        "cache_seqlens": job.sl,
        "plan": job.plan_t,
        "workspace": job.workspace,
        "out": job.out,
        "lse": job.lse,
    }
    for current in (0, 1):
        torch.cuda.set_device(current)
        for name, tensor in tensors.items():
            moved = dict(tensors, **{name: tensor.to(one)})

            def call(moved: dict[str, Any] = moved) -> None:
                smt.decode(
                    job.memory, 0, moved["q"], moved["block_table"], moved["cache_seqlens"],
                    moved["plan"], moved["workspace"], softmax_scale=SM_SCALE,
                    out=moved["out"], lse=moved["lse"],
                )  # fmt: skip

            expect_refusal(call, name, "cuda:1")
            assert_untouched(job, cache_bytes, f"decode with {name} on cuda:1")
        refuse_tokens_on_device_1(job, cache_bytes, lambda *t: smt.append(job.memory, 0, *t))
        plan_1 = job.plan_t.to(one)
        expect_refusal(
            lambda p=plan_1: smt.plan(p, job.sl, num_heads=16, max_pages=job.case.max_pages),
            "plan",
            "cuda:1",
        )
        assert torch.cuda.current_device() == current


def test_generic_front_end_refuses_tensors_on_another_device(on_two: dict[str, Any]) -> None:
    require_api("generic")
    job, cache_bytes = on_two["job"], on_two["cache_bytes"]
    cache = snapmla.KVCache(1, job.case.num_pages, buffer=job.memory)
    one = torch.device("cuda", 1)
    plan_0 = snapmla.DecodePlan(job.sl, num_heads=16, max_pages=job.case.max_pages)
    plan_1 = snapmla.DecodePlan(job.sl.to(one), num_heads=16, max_pages=job.case.max_pages)
    tensors = {"q": job.q, "block_table": job.bt, "cache_seqlens": job.sl, "out": job.out}
    tensors["lse"] = job.lse
    for name in [*tensors, "plan"]:
        moved = dict(tensors)
        if name != "plan":
            moved[name] = tensors[name].to(one)

        def call(moved: dict[str, Any] = moved, plan: Any = plan_1 if name == "plan" else plan_0):
            snapmla.decode(
                cache, 0, moved["q"], moved["block_table"], moved["cache_seqlens"], plan,
                softmax_scale=SM_SCALE, out=moved["out"], lse=moved["lse"],
            )  # fmt: skip

        expect_refusal(call, name, "cuda:")
        assert_untouched(job, cache_bytes, f"decode with {name} on cuda:1")
    refuse_tokens_on_device_1(job, cache_bytes, lambda *t: cache.append(0, *t))


def test_c_api_refuses_a_call_on_another_device_than_the_cache(on_two: dict[str, Any]) -> None:
    """The C API does not ask the driver about per-call pointers (snapmla.h, "Pointers, sizes
    and offsets"); it refuses a call made while a device other than the cache's is current,
    naming 'cache', and a cache whose caller memory belongs to another device than
    config.device, naming 'config.memory'."""
    from snapmla import _lib

    lib, ffi = _lib.lib(), _lib.ffi
    job, cache_bytes = on_two["job"], on_two["cache_bytes"]
    case = job.case
    one = torch.device("cuda", 1)

    def create(device: int, memory: Any) -> tuple[int, Any, str]:
        config = ffi.new(
            "snapmla_cache_config_t*",
            {
                "struct_size": ffi.sizeof("snapmla_cache_config_t"),
                "num_layers": 1,
                "num_pages": case.num_pages,
                "device": device,
                "memory": ffi.cast("void*", memory.data_ptr()),
                "memory_bytes": memory.numel(),
            },
        )
        handle = ffi.new("snapmla_cache_t*")
        status = lib.snapmla_cache_create(config, handle)
        return status, handle[0], ffi.string(lib.snapmla_last_error()).decode()

    torch.cuda.set_device(0)
    status, cache_0, message = create(0, job.memory)
    assert status == 0, message
    memory_1 = torch.full_like(job.memory, POISON_BYTE, device=one)
    status, _, message = create(0, memory_1)
    assert status == 1 and "argument 'config.memory'" in message, message
    assert "memory of device 1" in message, message
    status, cache_1, message = create(1, memory_1)
    assert status == 0, message  # the same memory with its own device: accepted
    assert lib.snapmla_cache_destroy(cache_1) == 0

    try:
        torch.cuda.set_device(1)
        q, bt, sl = (t.to(one) for t in (job.q, job.bt, job.sl))
        c_kv, k_pe, slots = (t.to(one) for t in job.tokens)
        out = nan_on(tuple(job.out.shape), torch.bfloat16, 1)
        lse = nan_on(tuple(job.lse.shape), torch.float32, 1)
        config = ffi.new(
            "snapmla_decode_config_t*",
            {
                "struct_size": ffi.sizeof("snapmla_decode_config_t"),
                "batch_size": case.batch,
                "q_len": 1,
                "num_heads": 16,
                "max_pages": case.max_pages,
            },
        )
        plan_bytes, ws_bytes = ffi.new("size_t*"), ffi.new("size_t*")
        assert lib.snapmla_decode_buffer_sizes(config, plan_bytes, ws_bytes) == 0
        plan = torch.zeros(plan_bytes[0], dtype=torch.uint8, device=one)
        workspace = torch.zeros(ws_bytes[0], dtype=torch.uint8, device=one)

        def ptr(t: Any, ctype: str = "void*") -> Any:
            return ffi.cast(ctype, t.data_ptr())

        sl_ptr = ptr(sl, "const int32_t*")
        assert lib.snapmla_decode_plan(config, sl_ptr, ptr(plan), ffi.NULL) == 0
        args = c_decode_args(q, bt, sl, out, lse)
        n = slots.shape[0]
        slot_ptr = ptr(slots, "const int64_t*")
        dst = slots.clone()
        dst_ptr = ptr(dst, "const int64_t*")
        c_ptr, k_ptr = ptr(c_kv, "const void*"), ptr(k_pe, "const void*")
        calls = {
            "snapmla_decode": lambda: lib.snapmla_decode(
                cache_0, config, args, ptr(plan), ptr(workspace), ffi.NULL
            ),
            "snapmla_append": lambda: lib.snapmla_append(
                cache_0, 0, c_ptr, 512, k_ptr, 64, slot_ptr, n, ffi.NULL
            ),
            "snapmla_fetch_dequant": lambda: lib.snapmla_fetch_dequant(
                cache_0, 0, slot_ptr, n, ptr(c_kv), 512, ptr(k_pe), 64, ffi.NULL
            ),
            "snapmla_copy_slots": lambda: lib.snapmla_copy_slots(
                cache_0, 0, slot_ptr, dst_ptr, n, ffi.NULL
            ),
        }
        for name, call in calls.items():
            assert call() == 1, name
            message = ffi.string(lib.snapmla_last_error()).decode()
            assert message.startswith(name) and "argument 'cache'" in message, message
            assert "lives on CUDA device 0 but the current device is 1" in message, message
        torch.cuda.synchronize(1)
        assert torch.isnan(out.float()).all() and torch.isnan(lse).all()
    finally:
        torch.cuda.set_device(0)
        assert lib.snapmla_cache_destroy(cache_0) == 0
    assert_untouched(job, cache_bytes, "C calls with device 1 current")


def test_c_cache_of_another_device_is_created_and_freed_there() -> None:
    """A cache whose memory the library allocates lands on config.device and is freed there by
    snapmla_cache_destroy, whichever device is current at either call; the current device is
    left as the caller set it."""
    need_devices(2)
    from snapmla import _lib

    lib, ffi = _lib.lib(), _lib.ffi
    pages = 4096  # 161 MiB: well above the allocator's granularity
    torch.cuda.set_device(0)
    sync_all()
    free_0, free_1 = torch.cuda.mem_get_info(0)[0], torch.cuda.mem_get_info(1)[0]
    config = ffi.new(
        "snapmla_cache_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_cache_config_t"),
            "num_layers": 1,
            "num_pages": pages,
            "device": 1,
        },
    )
    handle = ffi.new("snapmla_cache_t*")
    assert lib.snapmla_cache_create(config, handle) == 0, ffi.string(lib.snapmla_last_error())
    assert torch.cuda.current_device() == 0
    used_1 = free_1 - torch.cuda.mem_get_info(1)[0]
    assert used_1 >= pages * 41216, used_1
    assert abs(free_0 - torch.cuda.mem_get_info(0)[0]) < pages * 41216 // 2
    assert lib.snapmla_cache_destroy(handle[0]) == 0, ffi.string(lib.snapmla_last_error())
    assert torch.cuda.current_device() == 0
    assert free_1 - torch.cuda.mem_get_info(1)[0] < pages * 41216 // 2


# ---------------------------------------------------------------------------- (c) plans


def _decode_with(job: Job, plan: Any, workspace: Any) -> tuple[Any, Any]:
    b, s_q, h, _ = job.case.q.shape
    out = nan_on((b, s_q, h, 512), torch.bfloat16, job.device)
    lse = nan_on((b, h, s_q), torch.float32, job.device)
    smt.decode(
        job.memory, 0, job.q, job.bt, job.sl, plan, workspace,
        softmax_scale=SM_SCALE, out=out, lse=lse,
    )  # fmt: skip
    torch.cuda.synchronize(job.device)
    return out, lse


def test_a_plan_of_another_part_count_gives_nan_rows(rng: np.random.Generator) -> None:
    """What a plan from a GPU with another SM count is to a num_sm_parts 0 decode here: a plan
    whose header records another part count. snapmla.h: every row NaN, the workspace unwritten.
    The buffers are this device's (large enough), the plan built with one part."""
    case = make_case(rng, [300, 64, 129], num_heads=16, q_len=1)
    d = torch.cuda.current_device()
    job = Job("torch", d, case)
    job.run()
    config = {"num_heads": 16, "max_pages": case.max_pages}
    plan, workspace = smt.decode_buffers(case.batch, device=job.q.device, **config)
    _, workspace_1 = smt.decode_buffers(case.batch, num_sm_parts=1, device=job.q.device, **config)
    if workspace.numel() == workspace_1.numel():
        pytest.skip("this device's default split is one part (the workspace sizes agree)")
    smt.plan(plan, job.sl, num_sm_parts=1, **config)
    workspace.fill_(0xA5)
    out, lse = _decode_with(job, plan, workspace)
    assert torch.isnan(out.float()).all(), "a row decoded with a plan of another part count"
    assert torch.isnan(lse).all()
    assert bool((workspace == 0xA5).all()), "the workspace was written"


def test_a_default_plan_from_another_device(rng: np.random.Generator) -> None:
    """A plan sized and built with num_sm_parts 0 on device 0, its bytes copied to device 1 and
    used there. Equal workspace sizes at num_sm_parts 0 mean equal part counts (the workspace
    holds a partial output per part): the plan decodes as device 1's own, bit for bit. Else
    the header does not match: NaN rows, or a refusal naming 'plan' where the copy is smaller
    than device 1's config needs. The buffer sizes follow the current device's SM count."""
    need_devices(2)
    case = make_case(rng, [300, 64, 129, 1000], num_heads=16, q_len=1)
    jobs = [Job("torch", d, case) for d in (0, 1)]
    for job in jobs:
        torch.cuda.set_device(job.device)
        job.run()
    config = {"num_heads": 16, "max_pages": case.max_pages}
    sizes = {}
    for d in range(device_count()):
        plan_d, ws_d = smt.decode_buffers(case.batch, device=torch.device("cuda", d), **config)
        sizes[d] = (plan_d.numel(), ws_d.numel())
    for d, size_d in sizes.items():
        for e, size_e in sizes.items():
            if sm_count(d) == sm_count(e):
                assert size_d == size_e, f"devices {d}, {e}: same SM count, other sizes"

    plan_0 = jobs[0].plan_t  # sized and built on device 0
    copied = plan_0.to(torch.device("cuda", 1))
    own_out, own_lse = _decode_with(jobs[1], jobs[1].plan_t, jobs[1].workspace)
    if sizes[0][1] == sizes[1][1]:
        out, lse = _decode_with(jobs[1], copied, jobs[1].workspace)
        assert torch.equal(out.view(torch.int16), own_out.view(torch.int16))
        assert torch.equal(lse.view(torch.int32), own_lse.view(torch.int32))
        assert torch.isfinite(out.float()).all()
        return
    if copied.numel() < sizes[1][0]:
        expect_refusal(lambda: _decode_with(jobs[1], copied, jobs[1].workspace), "plan")
    else:
        out, lse = _decode_with(jobs[1], copied, jobs[1].workspace)
        assert torch.isnan(out.float()).all() and torch.isnan(lse).all()
