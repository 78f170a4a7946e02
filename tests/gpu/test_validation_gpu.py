"""Refused calls on real device tensors: SnapMLAError naming the argument, nothing written.

Every output starts as NaN and the cache as 0xFF bytes; after each refused call they must be
exactly as they were.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pytest
from _util import (
    POISON_BYTE,
    SM_SCALE,
    assert_all_nan,
    c_decode_args,
    device_inputs,
    download,
    make_cache,
    make_case,
    make_plan,
    nan_torch,
    random_bf16,
    synchronize,
    to_torch,
    torch_module,
)

import snapmla
from snapmla import reference as ref

pytestmark = pytest.mark.gpu


def expect_refusal(call: Callable[[], Any], *arguments: str, untouched: tuple = ()) -> None:
    """``call`` raises SnapMLAError naming one of ``arguments``; ``untouched`` stay NaN."""
    with pytest.raises(snapmla.SnapMLAError) as info:
        call()
    err = info.value
    text = str(err)
    assert any(f"'{a}" in text or a in text for a in arguments), (
        f"message does not name {arguments}: {text}"
    )
    if err.argument is not None:
        assert any(err.argument.startswith(a) for a in arguments), (err.argument, text)
    synchronize()
    for i, x in enumerate(untouched):
        assert_all_nan(x, f"output {i} of a refused call ({text})")


@pytest.fixture
def setup(rng: np.random.Generator) -> dict[str, Any]:
    """A valid decode call (b=3, s_q=2, h=16) with poisoned outputs and a poisoned cache."""
    case = make_case(rng, [200, 64, 1], num_heads=16, q_len=2)
    case.image[:] = POISON_BYTE  # the cache holds nothing but poison: refused calls keep it
    cache = make_cache(case)
    q, bt, sl = device_inputs(case)
    plan = make_plan(case, sl)
    out = nan_torch((3, 2, 16, 512))
    lse = nan_torch((3, 16, 2), "float32")
    synchronize()
    return {
        "case": case,
        "cache": cache,
        "kwargs": {
            "cache": cache,
            "layer": 0,
            "q": q,
            "block_table": bt,
            "cache_seqlens": sl,
            "plan": plan,
            "softmax_scale": SM_SCALE,
            "out": out,
            "lse": lse,
            "kernel": "auto",
        },
    }


def _decode(kwargs: dict[str, Any]) -> Any:
    kw = dict(kwargs)
    positional = [kw.pop(k) for k in ("cache", "layer", "q", "block_table", "cache_seqlens")]
    return snapmla.decode(*positional, kw.pop("plan"), **kw)


def _bad_decode_arguments(setup: dict[str, Any]) -> list[tuple[str, Any, tuple[str, ...]]]:
    torch = torch_module()
    kw = setup["kwargs"]
    q, bt, sl = kw["q"], kw["block_table"], kw["cache_seqlens"]
    other_case = make_case(np.random.default_rng(0), [5, 5], num_heads=16, q_len=2)
    other_plan = make_plan(other_case, to_torch(other_case.seqlens))
    storage = torch.empty(q.numel() + 3 * 2 * 16 * 512, dtype=torch.bfloat16, device="cuda")
    q_alias = storage[: q.numel()].view(q.shape)
    q_alias.copy_(q)
    out_alias = storage[q.numel() // 2 : q.numel() // 2 + 3 * 2 * 16 * 512].view(3, 2, 16, 512)
    out_alias.fill_(float("nan"))
    return [
        ("layer", -1, ("layer",)),
        ("layer", 1, ("layer",)),
        ("q", q.float(), ("q",)),
        ("q", q.half(), ("q",)),
        ("q", q[:, :, :15], ("q",)),
        ("q", q[:2], ("q",)),
        ("q", torch.cat([q, q], dim=-1)[..., ::2], ("q",)),  # inner stride 2
        ("q", q.cpu(), ("q",)),
        ("q", q[..., :575], ("q",)),
        ("block_table", bt.long(), ("block_table",)),
        ("block_table", bt[:, :-1], ("block_table",)),
        ("block_table", torch.cat([bt, bt], dim=1)[:, ::2], ("block_table",)),
        ("block_table", bt.cpu(), ("block_table",)),
        ("cache_seqlens", sl.long(), ("cache_seqlens",)),
        ("cache_seqlens", torch.cat([sl, sl]), ("cache_seqlens",)),
        ("cache_seqlens", torch.cat([sl, sl])[::2], ("cache_seqlens",)),
        ("out", nan_torch((3, 2, 16, 512), "float16"), ("out",)),  # (fp32 is accepted)
        ("out", nan_torch((3, 2, 16, 511)), ("out",)),
        ("out", nan_torch((3, 16, 2, 512)).transpose(1, 2), ("out",)),  # not contiguous
        ("out", nan_torch((3, 2, 16, 512)).cpu(), ("out",)),
        ("lse", nan_torch((3, 16, 2), "float16"), ("lse",)),
        ("lse", nan_torch((3, 2, 16), "float32"), ("lse",)),
        ("lse", nan_torch((3, 2, 16), "float32").transpose(1, 2), ("lse",)),
        ("softmax_scale", 0.0, ("softmax_scale",)),
        ("softmax_scale", -0.1, ("softmax_scale",)),
        ("softmax_scale", float("nan"), ("softmax_scale",)),
        ("softmax_scale", float("inf"), ("softmax_scale",)),
        ("softmax_scale", 1e39, ("softmax_scale",)),  # overflows fp32
        ("softmax_scale", "0.1", ("softmax_scale",)),
        ("kernel", "bogus", ("kernel",)),
        ("kernel", 1, ("kernel",)),
        ("plan", other_plan, ("plan", "q", "block_table", "cache_seqlens")),
        ("plan", None, ("plan",)),
        ("cache", "not a cache", ("cache",)),
        ("stream", "not a stream", ("stream",)),
        ("q+out", (q_alias, out_alias), ("out",)),
    ]


def test_decode_refusals_write_nothing(setup: dict[str, Any]) -> None:
    kw = setup["kwargs"]
    for name, value, expected in _bad_decode_arguments(setup):
        bad = dict(kw)
        if name == "q+out":
            bad["q"], bad["out"] = value
        else:
            bad[name] = value
        untouched = [kw["out"], kw["lse"]]
        if name in ("out", "lse") and hasattr(value, "is_cuda") and value.is_cuda:
            untouched.append(value)
        try:
            expect_refusal(lambda b=bad: _decode(b), *expected, untouched=tuple(untouched))
        except AssertionError as exc:
            raise AssertionError(f"bad {name}: {exc}") from exc
    assert np.all(download(setup["cache"]) == POISON_BYTE)


def test_decode_refuses_closed_cache(setup: dict[str, Any]) -> None:
    kw = setup["kwargs"]
    cache = snapmla.KVCache(1, setup["case"].num_pages)
    cache.close()
    bad = dict(kw, cache=cache)
    expect_refusal(lambda: _decode(bad), "cache", untouched=(kw["out"], kw["lse"]))


def test_append_refusals_write_nothing(rng: np.random.Generator) -> None:
    torch = torch_module()
    num_pages = 3
    poison = np.full(2 * num_pages * ref.PAGE_BYTES, POISON_BYTE, np.uint8)
    cache = snapmla.KVCache(2, num_pages, buffer=to_torch(poison))
    n = 5
    c = to_torch(random_bf16(rng, (n, 512)))
    k = to_torch(random_bf16(rng, (n, 64)))
    slots = to_torch(np.arange(n, dtype=np.int64))
    cache_as_bf16 = cache.buffer[: n * 1024].view(torch.bfloat16).view(n, 512)
    cases = [
        ("layer", (2, c, k, slots), ("layer",)),
        ("layer", (-1, c, k, slots), ("layer",)),
        ("c_kv", (0, c.float(), k, slots), ("c_kv",)),
        ("c_kv", (0, c[:, :511], k, slots), ("c_kv",)),
        ("c_kv", (0, torch.cat([c, c], 1)[:, ::2], k, slots), ("c_kv",)),
        ("c_kv", (0, c.cpu(), k, slots), ("c_kv",)),
        ("c_kv", (0, cache_as_bf16, k, slots), ("c_kv",)),  # aliases the cache
        ("k_pe", (0, c, k[:4], slots), ("k_pe",)),
        ("k_pe", (0, c, k.half(), slots), ("k_pe",)),
        ("k_pe", (0, c, torch.cat([k, k], 1), slots), ("k_pe",)),
        ("slots", (0, c, k, slots.int()), ("slots",)),
        ("slots", (0, c, k, slots[:4]), ("slots",)),
        ("slots", (0, c, k, slots.cpu()), ("slots",)),
        ("slots", (0, c, k, torch.cat([slots, slots])[::2]), ("slots",)),
    ]
    for name, args, expected in cases:
        try:
            expect_refusal(lambda a=args: cache.append(*a), *expected)
        except AssertionError as exc:
            raise AssertionError(f"bad {name}: {exc}") from exc
    expect_refusal(lambda: cache.append(0, c, k, slots, stream="x"), "stream")
    assert np.all(download(cache) == POISON_BYTE)


def test_fetch_dequant_refusals_write_nothing(rng: np.random.Generator) -> None:
    num_pages = 3
    poison = np.full(num_pages * ref.PAGE_BYTES, POISON_BYTE, np.uint8)
    cache = snapmla.KVCache(1, num_pages, buffer=to_torch(poison))
    n = 4
    slots = to_torch(np.arange(n, dtype=np.int64))
    c_out, k_out = nan_torch((n, 512)), nan_torch((n, 64))
    both = nan_torch((n, 576))
    cases = [
        ("layer", {"layer": 1}, ("layer",)),
        ("slots", {"slots": slots.int()}, ("slots",)),
        ("slots", {"slots": slots.cpu()}, ("slots",)),
        ("c_kv", {"c_kv": nan_torch((n, 511))}, ("c_kv",)),
        ("c_kv", {"c_kv": nan_torch((n, 512), "float32")}, ("c_kv",)),
        ("c_kv", {"c_kv": nan_torch((n + 1, 512))}, ("c_kv",)),
        ("k_pe", {"k_pe": nan_torch((n, 64), "float32")}, ("k_pe",)),
        ("k_pe", {"k_pe": nan_torch((n, 64)).cpu()}, ("k_pe",)),
        ("c_kv+k_pe", {"c_kv": both[:, :512], "k_pe": both[:, 500:564]}, ("c_kv", "k_pe")),
    ]
    for name, override, expected in cases:
        kw = {"layer": 0, "slots": slots, "c_kv": c_out, "k_pe": k_out}
        kw.update(override)
        given = [v for v in override.values() if hasattr(v, "is_cuda")]
        untouched = [u for u in [c_out, k_out, *given] if u.is_floating_point() and u.is_cuda]
        try:
            expect_refusal(
                lambda kw=kw: cache.fetch_dequant(
                    kw["layer"], kw["slots"], c_kv=kw["c_kv"], k_pe=kw["k_pe"]
                ),
                *expected,
                untouched=tuple(untouched),
            )
        except AssertionError as exc:
            raise AssertionError(f"bad {name}: {exc}") from exc


def test_quantize_q_refusals_write_nothing(rng: np.random.Generator) -> None:
    n, h = 3, 8
    q = to_torch(random_bf16(rng, (n, h, 576)))
    q8 = to_torch(np.full((n, h, 512), 0x7F, np.uint8))
    qr, qs = nan_torch((n, h, 64)), nan_torch((n, h), "float32")
    cases = [
        ({"q": q.float()}, ("q",)),
        ({"q": q[..., :575]}, ("q",)),
        ({"q": to_torch(random_bf16(rng, (1, 1025, 576)))}, ("q",)),
        ({"q": q.cpu()}, ("q",)),
        ({"out": (nan_torch((n, h, 512)), qr, qs)}, ("out",)),  # bf16 where FP8 is due
        ({"out": (q8, nan_torch((n, h, 63)), qs)}, ("out",)),
        ({"out": (q8, qr, nan_torch((n, h), "float16"))}, ("out",)),
        ({"out": (q8, qr)}, ("out",)),
        ({"out": q8}, ("out",)),
    ]
    for override, expected in cases:
        kw = {"q": q, "out": (q8, qr, qs)}
        kw.update(override)
        expect_refusal(
            lambda kw=kw: snapmla.quantize_q(kw["q"], out=kw["out"]),
            *expected,
            untouched=(qr, qs),
        )
    synchronize()
    assert np.all(q8.cpu().numpy() == 0x7F)


def test_plan_refusals(rng: np.random.Generator) -> None:
    sl = to_torch(np.array([10, 20], np.int32))
    good = {"num_heads": 16, "q_len": 1, "max_pages": 4, "num_sm_parts": 0}
    cases = [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": 129}, "num_heads"),
        ({"q_len": 0}, "q_len"),
        ({"q_len": 5}, "q_len"),
        ({"max_pages": 0}, "max_pages"),
        ({"num_sm_parts": -1}, "num_sm_parts"),
    ]
    for override, name in cases:
        kw = dict(good, **override)
        expect_refusal(lambda kw=kw: snapmla.DecodePlan(sl, **kw), name)
    expect_refusal(lambda: snapmla.DecodePlan(sl.long(), **good), "cache_seqlens")
    expect_refusal(lambda: snapmla.DecodePlan(sl[:0], **good), "cache_seqlens")
    expect_refusal(lambda: snapmla.DecodePlan(sl.cpu(), **good), "cache_seqlens")
    plan = snapmla.DecodePlan(sl, **good)
    expect_refusal(lambda: plan.update(to_torch(np.array([1, 2, 3], np.int32))), "cache_seqlens")


def test_cache_refusals() -> None:
    torch = torch_module()
    nbytes = 2 * 3 * ref.PAGE_BYTES
    expect_refusal(lambda: snapmla.KVCache(0, 3), "num_layers")
    expect_refusal(lambda: snapmla.KVCache(2, 0), "num_pages")
    expect_refusal(lambda: snapmla.KVCache(2, 2**25), "num_pages")  # 2^25 * 64 > int32
    small = torch.zeros(nbytes - 1, dtype=torch.uint8, device="cuda")
    expect_refusal(lambda: snapmla.KVCache(2, 3, buffer=small), "buffer")
    big = torch.zeros(nbytes + 256, dtype=torch.uint8, device="cuda")
    expect_refusal(lambda: snapmla.KVCache(2, 3, buffer=big[1:]), "buffer")  # misaligned
    expect_refusal(lambda: snapmla.KVCache(2, 3, buffer=big.float()), "buffer")
    expect_refusal(lambda: snapmla.KVCache(2, 3, buffer=big.cpu()), "buffer")


def test_c_api_validates_too(setup: dict[str, Any]) -> None:
    """The C library refuses bad arguments itself, naming them in snapmla_last_error()."""
    from snapmla import _lib

    lib, ffi = _lib.lib(), _lib.ffi
    assert lib.snapmla_version() // 10000 == snapmla.version()[0]
    assert ffi.string(lib.snapmla_status_string(1)).decode() == "SNAPMLA_ERROR_INVALID_ARGUMENT"
    size = ffi.new("size_t*")
    assert lib.snapmla_cache_bytes(0, 3, size) == 1
    assert "num_layers" in ffi.string(lib.snapmla_last_error()).decode()
    assert lib.snapmla_cache_bytes(2, 3, size) == 0 and size[0] == 2 * 3 * ref.PAGE_BYTES
    config = ffi.new(
        "snapmla_decode_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_decode_config_t"),
            "batch_size": 3,
            "q_len": 2,
            "num_heads": 0,
            "max_pages": setup["case"].max_pages,
            "num_sm_parts": 0,
        },
    )
    plan_bytes, ws_bytes = ffi.new("size_t*"), ffi.new("size_t*")
    assert lib.snapmla_decode_buffer_sizes(config, plan_bytes, ws_bytes) == 1
    assert "num_heads" in ffi.string(lib.snapmla_last_error()).decode()
    # A decode whose q pointer is NULL: refused before any launch, outputs untouched.
    config.num_heads = 16
    assert lib.snapmla_decode_buffer_sizes(config, plan_bytes, ws_bytes) == 0
    torch = torch_module()
    plan = torch.zeros(max(plan_bytes[0], 1), dtype=torch.uint8, device="cuda")
    ws = torch.zeros(max(ws_bytes[0], 1), dtype=torch.uint8, device="cuda")
    kw = setup["kwargs"]
    seqlens_ptr = ffi.cast("const int32_t*", kw["cache_seqlens"].data_ptr())
    plan_ptr = ffi.cast("void*", plan.data_ptr())
    assert lib.snapmla_decode_plan(config, seqlens_ptr, plan_ptr, ffi.NULL) == 0
    ws_ptr = ffi.cast("void*", ws.data_ptr())
    q, bt, sl, out, lse = kw["q"], kw["block_table"], kw["cache_seqlens"], kw["out"], kw["lse"]
    args = c_decode_args(q, bt, sl, out, lse)
    args.q = ffi.NULL
    handle = setup["cache"]._handle  # the C handle of the KVCache (private, test only)
    assert lib.snapmla_decode(handle, config, args, plan_ptr, ws_ptr, ffi.NULL) == 1
    message = ffi.string(lib.snapmla_last_error()).decode()
    assert re.search(r"\bq\b", message), message
    args.q = ffi.cast("const void*", q.data_ptr())
    args.softmax_scale = float("nan")
    assert lib.snapmla_decode(handle, config, args, plan_ptr, ws_ptr, ffi.NULL) == 1
    assert "softmax_scale" in ffi.string(lib.snapmla_last_error()).decode()
    # The workspace apart from q, out apart from the plan: with num_sm_parts 0 these are
    # checked once the device's split count is known (the CPU tests' validation-only mode
    # stops before that).
    args.softmax_scale = SM_SCALE
    on_q = ffi.cast("void*", q.data_ptr() & ~255)  # (it may reach other inputs too)
    assert lib.snapmla_decode(handle, config, args, plan_ptr, on_q, ffi.NULL) == 1
    message = ffi.string(lib.snapmla_last_error()).decode()
    assert "argument 'workspace'" in message and "overlap" in message, message
    # a plan inside out's bytes, both in memory of their own
    region = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    args.out = ffi.cast("void*", region.data_ptr())
    inside = ffi.cast("void*", region.data_ptr() + 256)
    assert lib.snapmla_decode(handle, config, args, inside, ws_ptr, ffi.NULL) == 1
    message = ffi.string(lib.snapmla_last_error()).decode()
    assert "argument 'args.out'" in message and "argument 'plan'" in message, message
    assert not region.any().item()  # nothing written there either
    synchronize()
    assert_all_nan(out, "out after refused C calls")
    assert_all_nan(lse, "lse after refused C calls")


def test_c_api_refuses_misaligned_pointers_and_a_cache_on_another_device(
    setup: dict[str, Any],
) -> None:
    """What only a GPU reaches: real device pointers a few bytes off (an odd BF16 pointer, a
    DLPack byte_offset of 1) are refused by the C library before any launch, so no
    cudaErrorMisalignedAddress poisons the context; and a handle whose cache claims another
    device ordinal is refused for a launch on this one."""
    from snapmla import _lib

    lib, ffi = _lib.lib(), _lib.ffi
    torch = torch_module()
    kw, cache = setup["kwargs"], setup["cache"]
    q, bt, sl, out, lse = kw["q"], kw["block_table"], kw["cache_seqlens"], kw["out"], kw["lse"]
    config = ffi.new(
        "snapmla_decode_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_decode_config_t"),
            "batch_size": 3,
            "q_len": 2,
            "num_heads": 16,
            "max_pages": setup["case"].max_pages,
            "num_sm_parts": 0,
        },
    )
    plan_bytes, ws_bytes = ffi.new("size_t*"), ffi.new("size_t*")
    assert lib.snapmla_decode_buffer_sizes(config, plan_bytes, ws_bytes) == 0
    plan = torch.zeros(plan_bytes[0] + 256, dtype=torch.uint8, device="cuda")
    ws = torch.zeros(ws_bytes[0] + 256, dtype=torch.uint8, device="cuda")
    plan_ptr, ws_ptr = plan.data_ptr(), ws.data_ptr()
    seqlens = ffi.cast("const int32_t*", sl.data_ptr())
    assert lib.snapmla_decode_plan(config, seqlens, ffi.cast("void*", plan_ptr), ffi.NULL) == 0
    assert lib.snapmla_decode_plan(config, seqlens, ffi.cast("void*", plan_ptr + 4), ffi.NULL) == 1
    assert "argument 'plan'" in ffi.string(lib.snapmla_last_error()).decode()

    fields = {
        "struct_size": ffi.sizeof("snapmla_decode_args_t"),
        "layer": 0,
        "causal": 1,
        "softmax_scale": SM_SCALE,
        "kernel": 0,
        "q": q.data_ptr(),
        "q_stride_batch": q.stride(0),
        "q_stride_token": q.stride(1),
        "q_stride_head": q.stride(2),
        "block_table": bt.data_ptr(),
        "block_table_stride": bt.stride(0),
        "cache_seqlens": sl.data_ptr(),
        "out": out.data_ptr(),
        "lse": lse.data_ptr(),
    }
    pointer_fields = {"q", "block_table", "cache_seqlens", "out", "lse"}

    def decode(handle: Any, plan_at: int, ws_at: int, **changes: int) -> tuple[int, str]:
        values = {**fields, **changes}
        args = ffi.new(
            "snapmla_decode_args_t*",
            {k: ffi.cast("void*", v) if k in pointer_fields else v for k, v in values.items()},
        )
        status = lib.snapmla_decode(
            handle, config, args, ffi.cast("void*", plan_at), ffi.cast("void*", ws_at), ffi.NULL
        )
        return status, ffi.string(lib.snapmla_last_error()).decode()

    handle = cache._handle  # the C handle of the KVCache (private, test only)
    for name, offset in (
        ("q", 1),
        ("block_table", 2),
        ("cache_seqlens", 1),
        ("out", 8),
        ("out", 2),
        ("lse", 2),
    ):
        status, message = decode(handle, plan_ptr, ws_ptr, **{name: fields[name] + offset})
        assert status == 1 and f"argument 'args.{name}'" in message, message
    for plan_at, ws_at, name in (
        (plan_ptr + 8, ws_ptr, "plan"),
        (plan_ptr, ws_ptr + 128, "workspace"),
    ):
        status, message = decode(handle, plan_at, ws_at)
        assert status == 1 and f"argument '{name}'" in message, message

    # The same memory under a handle that says it lives on another device ordinal.
    other_device = torch.cuda.current_device() + 1
    cfg = ffi.new(
        "snapmla_cache_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_cache_config_t"),
            "num_layers": cache.num_layers,
            "num_pages": cache.num_pages,
            "device": other_device,
            "memory": ffi.cast("void*", cache.data_ptr),
            "memory_bytes": cache.nbytes,
        },
    )
    other = ffi.new("snapmla_cache_t*")
    # snapmla_cache_create asks the driver whose memory it is and refuses this (another
    # device's ordinal for this device's memory, or no such device); validation-only mode makes
    # the handle without asking, as a cache whose device changed under it would look.
    status = lib.snapmla_cache_create(cfg, other)
    named = "config.memory" if torch.cuda.device_count() > other_device else "config.device"
    assert status == 1 and f"argument '{named}'" in ffi.string(lib.snapmla_last_error()).decode()
    previous = lib.snapmla_set_validate_only(1)
    try:
        assert lib.snapmla_cache_create(cfg, other) == 0  # caller memory, given ordinal: no CUDA
    finally:
        lib.snapmla_set_validate_only(previous)
    try:
        status, message = decode(other[0], plan_ptr, ws_ptr)
        assert status == 1 and f"lives on CUDA device {other_device}" in message, message
        c_kv = torch.zeros(4, 512, dtype=torch.bfloat16, device="cuda")
        k_pe = torch.zeros(4, 64, dtype=torch.bfloat16, device="cuda")
        slots = torch.arange(4, dtype=torch.int64, device="cuda")
        status = lib.snapmla_append(
            other[0], 0, ffi.cast("const void*", c_kv.data_ptr()), 512,
            ffi.cast("const void*", k_pe.data_ptr()), 64,
            ffi.cast("const int64_t*", slots.data_ptr()), 4, ffi.NULL,
        )  # fmt: skip
        assert (
            status == 1 and "lives on CUDA device" in ffi.string(lib.snapmla_last_error()).decode()
        )
    finally:
        assert lib.snapmla_cache_destroy(other[0]) == 0
    assert lib.snapmla_cache_destroy(other[0]) == 1  # destroyed: refused, not a double free
    synchronize()
    assert_all_nan(out, "out after refused C calls")
    assert_all_nan(lse, "lse after refused C calls")
    assert np.all(download(cache) == POISON_BYTE)
    assert decode(handle, plan_ptr, ws_ptr)[0] == 0  # the context is still usable
    synchronize()


def _cache_config(ffi: Any, memory: int, memory_bytes: int, **fields: Any) -> Any:
    return ffi.new(
        "snapmla_cache_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_cache_config_t"),
            "num_layers": 2,
            "num_pages": 3,
            "device": torch_module().cuda.current_device(),
            "memory": ffi.cast("void*", memory),
            "memory_bytes": memory_bytes,
            **fields,
        },
    )


def _create(lib: Any, ffi: Any, config: Any) -> tuple[int, str]:
    """snapmla_cache_create's status and message (a created cache is destroyed at once)."""
    handle = ffi.new("snapmla_cache_t*")
    status = lib.snapmla_cache_create(config, handle)
    message = ffi.string(lib.snapmla_last_error()).decode() if status else ""
    if status == 0:
        assert lib.snapmla_cache_destroy(handle[0]) == 0
    return status, message


def test_cache_create_checks_caller_memory_with_the_driver() -> None:
    """Caller memory must be device memory of config.device (or managed memory), its bytes
    inside one allocation: pageable and pinned host memory, a span past the allocation's end and
    a device that does not exist are refused naming the argument; device memory from PyTorch's
    allocator (inside a larger segment), cudaMalloc'ed memory of exactly the size, and managed
    memory are accepted."""
    from snapmla import _lib

    lib, ffi = _lib.lib(), _lib.ffi
    torch = torch_module()
    nbytes = 2 * 3 * ref.PAGE_BYTES
    device = torch.cuda.current_device()
    pageable = np.zeros(nbytes + 256, np.uint8)
    host = pageable.ctypes.data + (-pageable.ctypes.data) % 256
    pinned = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)
    tensor = torch.zeros(nbytes + 4096, dtype=torch.uint8, device="cuda")
    for memory, size, fields, named, pattern in (
        (host, nbytes, {}, "config.memory", "memory CUDA does not know"),
        (pinned.data_ptr(), nbytes, {}, "config.memory", r"host memory \(pinned or registered\)"),
        (tensor.data_ptr(), nbytes, {"device": torch.cuda.device_count()}, "config.device",
         "CUDA reports"),
    ):  # fmt: skip
        status, message = _create(lib, ffi, _cache_config(ffi, memory, size, **fields))
        assert status == 1, (named, message)
        assert message.startswith(f"snapmla_cache_create: argument '{named}'"), message
        assert re.search(pattern, message), message
    # PyTorch's memory: inside one of its allocator's segments, anywhere in it
    for offset in (0, 256, 4096):
        status, message = _create(lib, ffi, _cache_config(ffi, tensor.data_ptr() + offset, nbytes))
        assert status == 0, (offset, message)
    # memory of exactly the cache's size from cudaMalloc: a span past its end is refused
    cupy = pytest.importorskip("cupy")
    exact = cupy.cuda.runtime.malloc(nbytes)
    try:
        assert _create(lib, ffi, _cache_config(ffi, exact, nbytes)) == (0, "")
        status, message = _create(lib, ffi, _cache_config(ffi, exact, nbytes + (64 << 20)))
        assert status == 1 and "argument 'config.memory_bytes'" in message, message
        assert "runs past the end of its allocation" in message, message
    finally:
        cupy.cuda.runtime.free(exact)
    managed = cupy.cuda.runtime.mallocManaged(nbytes)
    try:
        assert _create(lib, ffi, _cache_config(ffi, managed, nbytes)) == (0, "")
    finally:
        cupy.cuda.runtime.free(managed)
    # per-layer memory: each layer checked, the refused one named
    layer_bytes = 3 * ref.PAGE_BYTES
    layers = [tensor.data_ptr(), host]
    array = ffi.new("void*[]", [ffi.cast("void*", a) for a in layers])
    config = _cache_config(ffi, 0, 0, layer_memory=array)
    status, message = _create(lib, ffi, config)
    assert status == 1 and "argument 'config.layer_memory[1]'" in message, message
    array[1] = ffi.cast("void*", tensor.data_ptr() + layer_bytes)
    assert _create(lib, ffi, config) == (0, "")
    assert device == torch.cuda.current_device()  # the check restores the current device
    # In validation-only mode nothing is asked (the CPU tests' fake addresses make caches).
    previous = lib.snapmla_set_validate_only(1)
    try:
        assert _create(lib, ffi, _cache_config(ffi, host, nbytes)) == (0, "")
    finally:
        lib.snapmla_set_validate_only(previous)


def test_cache_create_refuses_another_devices_memory() -> None:
    """Memory of device 1 for a cache on device 0: refused naming config.memory."""
    from snapmla import _lib

    torch = torch_module()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    lib, ffi = _lib.lib(), _lib.ffi
    nbytes = 2 * 3 * ref.PAGE_BYTES
    elsewhere = torch.zeros(nbytes, dtype=torch.uint8, device="cuda:1")
    status, message = _create(lib, ffi, _cache_config(ffi, elsewhere.data_ptr(), nbytes, device=0))
    assert status == 1 and "argument 'config.memory'" in message, message
    assert "as memory of device 1; expected device 0" in message, message
    assert _create(lib, ffi, _cache_config(ffi, elsewhere.data_ptr(), nbytes, device=1)) == (0, "")


def test_decode_refuses_buffers_smaller_than_the_config_says(setup: dict[str, Any]) -> None:
    """config.plan_bytes / workspace_bytes (0.4) on a real device, num_sm_parts 0 (the part
    count from this GPU's SMs, known only after the device check): a plan or workspace smaller
    than the config needs is refused naming it, nothing enqueued; the sizes it needs or more are
    accepted."""
    from snapmla import _lib

    lib, ffi = _lib.lib(), _lib.ffi
    torch = torch_module()
    kw = setup["kwargs"]
    q, bt, sl, out, lse = kw["q"], kw["block_table"], kw["cache_seqlens"], kw["out"], kw["lse"]
    config = ffi.new(
        "snapmla_decode_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_decode_config_t"),
            "batch_size": 3,
            "q_len": 2,
            "num_heads": 16,
            "max_pages": setup["case"].max_pages,
        },
    )
    need = ffi.new("size_t[2]")
    assert lib.snapmla_decode_buffer_sizes(config, need, need + 1) == 0
    plan = torch.zeros(need[0], dtype=torch.uint8, device="cuda")
    ws = torch.zeros(need[1], dtype=torch.uint8, device="cuda")
    plan_ptr, ws_ptr = ffi.cast("void*", plan.data_ptr()), ffi.cast("void*", ws.data_ptr())
    seqlens = ffi.cast("const int32_t*", sl.data_ptr())
    args = c_decode_args(q, bt, sl, out, lse)
    handle = setup["cache"]._handle
    for plan_bytes, ws_bytes, named in (
        (need[0] - 1, need[1], "plan"),
        (need[0], need[1] - 1, "workspace"),
        (need[0] // 2, 1, "plan"),
    ):
        config.plan_bytes, config.workspace_bytes = plan_bytes, ws_bytes
        status = lib.snapmla_decode(handle, config, args, plan_ptr, ws_ptr, ffi.NULL)
        message = ffi.string(lib.snapmla_last_error()).decode()
        assert status == 1 and f"argument '{named}'" in message, message
        if named == "plan":
            status = lib.snapmla_decode_plan(config, seqlens, plan_ptr, ffi.NULL)
            assert (
                status == 1 and "argument 'plan'" in ffi.string(lib.snapmla_last_error()).decode()
            )
    synchronize()
    assert_all_nan(out, "out after refused C calls")
    assert_all_nan(lse, "lse after refused C calls")
    assert not plan.any().item() and not ws.any().item()
    for extra in (0, 256):  # (the cache holds poison: the rows are NaN either way)
        config.plan_bytes, config.workspace_bytes = need[0] + extra, need[1] + extra
        assert lib.snapmla_decode_plan(config, seqlens, plan_ptr, ffi.NULL) == 0
        status = lib.snapmla_decode(handle, config, args, plan_ptr, ws_ptr, ffi.NULL)
        assert status == 0, ffi.string(lib.snapmla_last_error()).decode()
    synchronize()
