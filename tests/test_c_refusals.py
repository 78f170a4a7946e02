"""The C API's own refusals, called through cffi on a CPU: no GPU, no host wrapper.

Every refusal path of every entry point in include/snapmla/snapmla.h is called once with one
argument wrong and the others valid (``CASES``), and must return
SNAPMLA_ERROR_INVALID_ARGUMENT with a message ``"<function>: argument '<name>'..."`` naming
that argument, having written nothing. ``test_every_refusal_message_is_reached`` checks that
every refusal message written in cpp/api/ is produced by some case, so a new check without a
test fails here.

The calls run in validation-only mode (``snapmla_set_validate_only``): an accepted call returns
SNAPMLA_VALIDATED where it would make its first CUDA call, on a machine with or without a GPU,
so nothing here ever launches. Caches sit on a fake device address (snapmla_cache_create on
caller memory with a device ordinal makes no CUDA call); device pointers are fake addresses,
never dereferenced. Host out-parameters are real memory, checked untouched after a refusal.

Then hypothesis fuzzes every entry point with random sizes, strides, dimensions, struct sizes
(with random bytes past the library's sizeof), pointers (NULL, unaligned, near 2^64) and
handles (live, destroyed, made up): no crash, every refusal names an argument that the Python
model below (``violations``, the header's rules) also finds wrong, and every accepted call is
one the model accepts. ``SNAPMLA_FUZZ_EXAMPLES`` sets the examples per entry point.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapmla import SnapMLAError, _lib

ROOT = Path(__file__).resolve().parents[1]
API_SOURCES = sorted((ROOT / "cpp" / "api").glob("*.cu")) + sorted(
    (ROOT / "cpp" / "api").glob("*.h")
)
HEADER = ROOT / "include" / "snapmla" / "snapmla.h"

try:
    LIB = _lib.lib()
except SnapMLAError as exc:  # pragma: no cover - depends on the installation
    pytest.skip(f"needs the shared library (set SNAPMLA_LIBRARY): {exc}", allow_module_level=True)
ffi = _lib.ffi

SUCCESS, INVALID, CUDA, INTERNAL, VALIDATED = 0, 1, 3, 5, 6
INT32_MAX, INT64_MAX, ADDRESS_END = 2**31 - 1, 2**63 - 1, 2**64
MAX_STRUCT = _lib.MAX_STRUCT_SIZE
PAGE_BYTES = _lib.PAGE_BYTES
MAX_PAGES = INT32_MAX // _lib.PAGE_SIZE
FIXED_COST = 2  # decode::kFixedCost, the plan's cost per request beyond its blocks

# Fake device memory: a cache of 2 layers x 4 pages at CACHE_MEMORY, buffers at DEV + k MiB.
CACHE_MEMORY = 0x7F0000000000
NUM_LAYERS, NUM_PAGES = 2, 4
CACHE_BYTES = NUM_LAYERS * NUM_PAGES * PAGE_BYTES
DEV = 0x7E0000000000


def dev(k: int) -> int:
    return DEV + k * 2**20


FUZZ_EXAMPLES = int(os.environ.get("SNAPMLA_FUZZ_EXAMPLES", "300"))
FUZZ_COUNTS: dict[str, int] = {}
FUZZ_OUTCOMES: dict[str, dict[str, int]] = {}  # per function: accepted / refused naming X

# Parameter names of every entry point, in order (checked against the header below).
PARAMS: dict[str, tuple[str, ...]] = {
    "snapmla_cache_bytes": ("num_layers", "num_pages", "bytes"),
    "snapmla_cache_create": ("config", "cache"),
    "snapmla_cache_destroy": ("cache",),
    "snapmla_cache_info": ("cache", "info"),
    "snapmla_cache_layer_data": ("cache", "layer", "data"),
    "snapmla_copy_slots": ("cache", "layer", "src_slots", "dst_slots", "num_tokens", "stream"),
    "snapmla_gather_dequant": (
        "cache",
        "layer",
        "block_table",
        "block_table_stride",
        "batch",
        "max_pages",
        "seqlens",
        "out_rows",
        "num_rows",
        "c_kv",
        "c_kv_stride",
        "k_pe",
        "k_pe_stride",
        "stream",
    ),
    "snapmla_append": (
        "cache",
        "layer",
        "c_kv",
        "c_kv_stride",
        "k_pe",
        "k_pe_stride",
        "slots",
        "num_tokens",
        "stream",
    ),
    "snapmla_fetch_dequant": (
        "cache",
        "layer",
        "slots",
        "num_tokens",
        "c_kv",
        "c_kv_stride",
        "k_pe",
        "k_pe_stride",
        "stream",
    ),
    "snapmla_quantize_q": (
        "q",
        "num_tokens",
        "num_heads",
        "q_stride_token",
        "q_stride_head",
        "q_content",
        "q_rope",
        "q_scale",
        "stream",
    ),
    "snapmla_quantize_q2": (
        "q",
        "num_tokens",
        "num_heads",
        "q_stride_token",
        "q_stride_head",
        "q_content",
        "q_rope",
        "q_scale",
        "q_lo",
        "q_lo_scale",
        "stream",
    ),
    "snapmla_decode_buffer_sizes": ("config", "plan_bytes", "workspace_bytes"),
    "snapmla_decode_select_kernel": ("config", "kernel", "selected"),
    "snapmla_decode_plan": ("config", "cache_seqlens", "plan", "stream"),
    "snapmla_decode": ("cache", "config", "args", "plan", "workspace", "stream"),
}
# Functions that take no argument that can be refused.
NO_REFUSALS = {
    "snapmla_version",
    "snapmla_status_string",
    "snapmla_last_error",
    "snapmla_set_validate_only",
}


@pytest.fixture(autouse=True, scope="module")
def _validate_only() -> Iterator[None]:
    """Validation-only mode for this module (thread-local: this thread only)."""
    previous = LIB.snapmla_set_validate_only(1)
    yield
    LIB.snapmla_set_validate_only(previous)


def last_error() -> str:
    return ffi.string(LIB.snapmla_last_error()).decode()


# ============================================================================ arguments


@dataclass
class Struct:
    """A config struct argument: field values, struct_size (None: the library's sizeof) and
    the bytes past the library's sizeof (zero-padded up to struct_size)."""

    ctype: str
    fields: dict[str, Any]
    struct_size: int | None = None
    tail: bytes = b""

    def build(self) -> tuple[Any, Any]:
        """(pointer to pass, buffer keeping it alive)."""
        size = ffi.sizeof(self.ctype)
        struct_size = size if self.struct_size is None else self.struct_size
        total = max(size, min(struct_size, MAX_STRUCT) if struct_size > size else size)
        buffer = ffi.new("unsigned char[]", max(total, size + len(self.tail)))
        pointer = ffi.cast(self.ctype + "*", buffer)
        for name, value in self.fields.items():
            setattr(
                pointer, name, ffi.cast("void*", value) if _is_pointer(self.ctype, name) else value
            )
        pointer.struct_size = struct_size
        buffer[size : size + len(self.tail)] = self.tail
        return pointer, buffer

    def read_back(self) -> dict[str, Any]:
        """The fields as the library reads them (fields past a short struct_size read 0)."""
        pointer, _ = self.build()
        size = ffi.sizeof(self.ctype)
        struct_size = size if self.struct_size is None else self.struct_size
        values = {}
        for name, f in ffi.typeof(self.ctype).fields:
            if name == "struct_size":
                continue
            covered = f.offset + ffi.sizeof(f.type) <= struct_size
            value = getattr(pointer, name) if covered else 0
            if f.type.kind == "pointer":
                value = int(ffi.cast("uintptr_t", value)) if covered else 0
            values[name] = value
        return values


def _is_pointer(ctype: str, name: str) -> bool:
    return dict(ffi.typeof(ctype).fields)[name].type.kind == "pointer"


@dataclass
class Out:
    """A host out-parameter: real memory preset to a sentinel, checked after the call."""

    ctype: str  # the pointer type, e.g. "size_t*"
    nbytes: int = 0  # for struct outputs: bytes to allocate (>= sizeof)
    struct_size: int | None = None

    def build(self) -> tuple[Any, Any]:
        base = ffi.typeof(self.ctype).item
        nbytes = max(self.nbytes, ffi.sizeof(base))
        buffer = ffi.new("unsigned char[]", nbytes)
        buffer[0:nbytes] = b"\xab" * nbytes
        pointer = ffi.cast(self.ctype, buffer)
        if self.struct_size is not None:
            pointer.struct_size = self.struct_size
        return pointer, buffer


@dataclass
class Result:
    status: int
    message: str
    outputs: dict[str, bytes] = field(default_factory=dict)  # bytes after the call
    before: dict[str, bytes] = field(default_factory=dict)  # bytes before the call
    created: list[Any] = field(default_factory=list)

    @property
    def wrote(self) -> bool:
        return self.outputs != self.before


def invoke(fn: str, values: dict[str, Any]) -> Result:
    """Call ``fn`` with ``values`` by parameter name (ints for pointers and handles)."""
    function = getattr(LIB, fn)
    keep, outputs = [], {}
    args = []
    for name, ctype in zip(PARAMS[fn], ffi.typeof(function).args):
        value = values[name]
        if isinstance(value, (Struct, Out)):
            pointer, buffer = value.build()
            keep.append(buffer)
            if isinstance(value, Out):
                outputs[name] = buffer
            value = pointer
        elif isinstance(value, int) and ctype.kind == "pointer":
            value = ffi.cast(ctype, value)
        args.append(value)
    before = {name: bytes(ffi.buffer(b)) for name, b in outputs.items()}
    status = int(function(*args))
    result = Result(status, last_error() if status != SUCCESS else "", before=before)
    result.outputs = {name: bytes(ffi.buffer(b)) for name, b in outputs.items()}
    if fn == "snapmla_cache_create" and status == SUCCESS:
        handle = ffi.cast("snapmla_cache_t*", outputs["cache"])[0]
        result.created.append(handle)
        assert LIB.snapmla_cache_destroy(handle) == SUCCESS
    return result


# ============================================================================== handles


def new_handle(num_layers: int = NUM_LAYERS, num_pages: int = NUM_PAGES) -> int:
    """A live cache on the fake device memory (its handle as an int)."""
    config = ffi.new(
        "snapmla_cache_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_cache_config_t"),
            "num_layers": num_layers,
            "num_pages": num_pages,
            "device": 0,
            "memory": ffi.cast("void*", CACHE_MEMORY),
            "memory_bytes": num_layers * num_pages * PAGE_BYTES,
        },
    )
    handle = ffi.new("snapmla_cache_t*")
    # Validation-only mode makes the handle without asking the driver about the (fake) memory.
    previous = LIB.snapmla_set_validate_only(1)
    try:
        assert LIB.snapmla_cache_create(config, handle) == SUCCESS, last_error()
    finally:
        LIB.snapmla_set_validate_only(previous)
    return int(ffi.cast("uintptr_t", handle[0]))


LIVE = new_handle()  # lives for the whole session
DESTROYED = new_handle()
assert LIB.snapmla_cache_destroy(ffi.cast("snapmla_cache_t", DESTROYED)) == SUCCESS
_FAKE_OBJECT = ffi.new("uint64_t[8]", [0x534E41504D4C4131, CACHE_MEMORY, CACHE_BYTES, 0, 0, 0, 0])
# Host memory laid out like a live cache object (magic word included): still not a handle.
LOOKALIKE = int(ffi.cast("uintptr_t", _FAKE_OBJECT))


# ====================================================================== valid arguments


def base_cache_config() -> Struct:
    return Struct(
        "snapmla_cache_config_t",
        {
            "num_layers": NUM_LAYERS,
            "num_pages": NUM_PAGES,
            "page_size": 0,
            "device": 0,
            "memory": CACHE_MEMORY,
            "memory_bytes": CACHE_BYTES,
        },
    )


def base_decode_config() -> Struct:
    return Struct(
        "snapmla_decode_config_t",
        {"batch_size": 2, "q_len": 2, "num_heads": 16, "max_pages": 8, "num_sm_parts": 4},
    )


def base_decode_args() -> Struct:
    return Struct(
        "snapmla_decode_args_t",
        {
            "layer": 1,
            "causal": 1,
            "softmax_scale": 0.1,
            "kernel": 0,
            "q": dev(1),
            "q_stride_batch": 2 * 16 * 576,
            "q_stride_token": 16 * 576,
            "q_stride_head": 576,
            "block_table": dev(2),
            "block_table_stride": 8,
            "cache_seqlens": dev(3),
            "out": dev(4),
            "lse": dev(5),
        },
    )


def decode_sizes(**fields: Any) -> tuple[int, int]:
    """(plan bytes, workspace bytes) of ``base_decode_config()`` with ``fields`` changed (an
    explicit num_sm_parts: no device query)."""
    config, keep = Struct(
        "snapmla_decode_config_t", {**base_decode_config().fields, **fields}
    ).build()
    plan, workspace = ffi.new("size_t*"), ffi.new("size_t*")
    assert LIB.snapmla_decode_buffer_sizes(config, plan, workspace) == SUCCESS, last_error()
    del keep
    return int(plan[0]), int(workspace[0])


def base(fn: str) -> dict[str, Any]:
    """A valid call of ``fn`` (accepted: see ACCEPTED)."""
    if fn == "snapmla_cache_bytes":
        return {"num_layers": NUM_LAYERS, "num_pages": NUM_PAGES, "bytes": Out("size_t*")}
    if fn == "snapmla_cache_create":
        return {"config": base_cache_config(), "cache": Out("snapmla_cache_t*")}
    if fn == "snapmla_cache_destroy":
        return {"cache": new_handle()}
    if fn == "snapmla_cache_info":
        size = ffi.sizeof("snapmla_cache_info_t")
        return {"cache": LIVE, "info": Out("snapmla_cache_info_t*", size, size)}
    if fn == "snapmla_cache_layer_data":
        return {"cache": LIVE, "layer": 1, "data": Out("void**")}
    if fn == "snapmla_gather_dequant":
        return {
            "cache": LIVE,
            "layer": 1,
            "block_table": dev(2),
            "block_table_stride": 8,
            "batch": 2,
            "max_pages": 8,
            "seqlens": dev(3),
            "out_rows": dev(7),
            "num_rows": 100,
            "c_kv": dev(4),
            "c_kv_stride": 512,
            "k_pe": dev(5),
            "k_pe_stride": 64,
            "stream": 0,
        }
    if fn == "snapmla_copy_slots":
        return {
            "cache": LIVE,
            "layer": 1,
            "src_slots": dev(7),
            "dst_slots": dev(8),
            "num_tokens": 5,
            "stream": 0,
        }
    if fn == "snapmla_append":
        return {
            "cache": LIVE,
            "layer": 1,
            "c_kv": dev(1),
            "c_kv_stride": 512,
            "k_pe": dev(2),
            "k_pe_stride": 64,
            "slots": dev(3),
            "num_tokens": 3,
            "stream": 0,
        }
    if fn == "snapmla_fetch_dequant":
        return {
            "cache": LIVE,
            "layer": 1,
            "slots": dev(3),
            "num_tokens": 3,
            "c_kv": dev(1),
            "c_kv_stride": 512,
            "k_pe": dev(2),
            "k_pe_stride": 64,
            "stream": 0,
        }
    if fn in ("snapmla_quantize_q", "snapmla_quantize_q2"):
        two_term = {"q_lo": dev(5), "q_lo_scale": dev(6)} if fn.endswith("2") else {}
        return {
            "q": dev(1),
            "num_tokens": 3,
            "num_heads": 8,
            "q_stride_token": 8 * 576,
            "q_stride_head": 576,
            "q_content": dev(2),
            "q_rope": dev(3),
            "q_scale": dev(4),
            **two_term,
            "stream": 0,
        }
    if fn == "snapmla_decode_buffer_sizes":
        return {
            "config": base_decode_config(),
            "plan_bytes": Out("size_t*"),
            "workspace_bytes": Out("size_t*"),
        }
    if fn == "snapmla_decode_select_kernel":
        return {"config": base_decode_config(), "kernel": 0, "selected": Out("int32_t*")}
    if fn == "snapmla_decode_plan":
        return {
            "config": base_decode_config(),
            "cache_seqlens": dev(3),
            "plan": dev(6),
            "stream": 0,
        }
    if fn == "snapmla_decode":
        return {
            "cache": LIVE,
            "config": base_decode_config(),
            "args": base_decode_args(),
            "plan": dev(6),
            "workspace": dev(7),
            "stream": 0,
        }
    raise KeyError(fn)


# What a valid call returns in validation-only mode: host-only functions succeed.
ACCEPTED = {
    "snapmla_cache_bytes": SUCCESS,
    "snapmla_cache_create": SUCCESS,  # caller memory, device >= 0: no CUDA call
    "snapmla_cache_destroy": SUCCESS,
    "snapmla_cache_info": SUCCESS,
    "snapmla_cache_layer_data": SUCCESS,
    "snapmla_copy_slots": VALIDATED,
    "snapmla_gather_dequant": VALIDATED,
    "snapmla_append": VALIDATED,
    "snapmla_fetch_dequant": VALIDATED,
    "snapmla_quantize_q": VALIDATED,
    "snapmla_quantize_q2": VALIDATED,
    "snapmla_decode_buffer_sizes": SUCCESS,  # num_sm_parts given: no device query
    "snapmla_decode_select_kernel": SUCCESS,  # host only
    "snapmla_decode_plan": VALIDATED,
    "snapmla_decode": VALIDATED,
}


def with_overrides(fn: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """``base(fn)`` with ``overrides``; ``"config.x"`` sets a struct field, ``"config.struct_size"``
    and ``"config.tail"`` the struct's size and trailing bytes."""
    values = base(fn)
    for key, value in overrides.items():
        if "." in key:
            name, attribute = key.split(".", 1)
            target = values[name]
            if attribute in ("struct_size", "tail"):
                setattr(target, attribute, value)
            elif isinstance(target, Out):
                raise KeyError(key)
            else:
                target.fields[attribute] = value
        else:
            values[key] = value
    return values


# ============================================================================ the cases

# (id, function, overrides, argument named, message pattern)
Case = tuple[str, str, dict[str, Any], str, str]

TOP = 2**64  # addresses near it: spans that run past the end of the address space


def _size(ctype: str) -> int:
    return ffi.sizeof(ctype)


def _handle_cases(fn: str) -> list[Case]:
    return [
        (f"{fn}/cache-null", fn, {"cache": 0}, "cache", "is NULL"),
        (f"{fn}/cache-destroyed", fn, {"cache": DESTROYED}, "cache", "not a live cache handle"),
        (f"{fn}/cache-made-up", fn, {"cache": 0xDEADBEEF}, "cache", "not a live cache handle"),
        (f"{fn}/cache-lookalike", fn, {"cache": LOOKALIKE}, "cache", "not a live cache handle"),
    ]


def _struct_cases(fn: str, name: str, ctype: str, min_size: int) -> list[Case]:
    size = _size(ctype)
    cases: list[Case] = [
        (f"{fn}/{name}-null", fn, {name: 0}, name, "is NULL"),
        (f"{fn}/{name}-size-0", fn, {f"{name}.struct_size": 0}, name, "expected struct_size"),
        (
            f"{fn}/{name}-size-short",
            fn,
            {f"{name}.struct_size": min_size - 1},
            name,
            f"expected struct_size {min_size} .. {MAX_STRUCT} .*got {min_size - 1}",
        ),
        (
            f"{fn}/{name}-size-over-max",
            fn,
            {f"{name}.struct_size": MAX_STRUCT + 1},
            name,
            f"got {MAX_STRUCT + 1}",
        ),
        (f"{fn}/{name}-size-2^64-1", fn, {f"{name}.struct_size": 2**64 - 1}, name, "struct_size"),
        (
            f"{fn}/{name}-unknown-field-set",
            fn,
            {f"{name}.struct_size": size + 16, f"{name}.tail": bytes(9) + b"\x07"},
            name,
            f"byte {size + 9}, beyond the fields it knows, is 7",
        ),
    ]
    return cases


def _decode_config_cases(fn: str) -> list[Case]:
    cases = _struct_cases(fn, "config", "snapmla_decode_config_t", 24)
    for size, field_name in (
        (25, "num_sm_parts"),
        (27, "num_sm_parts"),
        (30, "q_precision"),
        (33, "plan_bytes"),  # (0.4's fields)
        (39, "plan_bytes"),
        (44, "workspace_bytes"),
    ):
        cases.append(
            (
                f"{fn}/config-size-{size}",
                fn,
                {"config.struct_size": size},
                "config",
                f"ends inside field 'config.{field_name}'",
            )
        )
    for field_name, bad, pattern in (
        ("batch_size", 0, "expected 1 .. 65536, got 0"),
        ("batch_size", 65537, "got 65537"),
        ("q_len", 0, "expected 1 .. 4, got 0"),
        ("q_len", 5, "got 5"),
        ("num_heads", 0, "expected 1 .. 128, got 0"),
        ("num_heads", 129, "got 129"),
        ("max_pages", 0, f"expected 1 .. {MAX_PAGES}, got 0"),
        ("max_pages", MAX_PAGES + 1, f"got {MAX_PAGES + 1}"),
        ("num_sm_parts", -1, "expected 0 .. 65535, got -1"),
        ("num_sm_parts", 65536, "got 65536"),
        ("q_precision", 2, r"expected 0 \(fp8\) or 1 \(fp8x2\), got 2"),
        ("q_precision", -1, "got -1"),
    ):
        cases.append(
            (
                f"{fn}/config.{field_name}={bad}",
                fn,
                {f"config.{field_name}": bad},
                f"config.{field_name}",
                pattern,
            )
        )
    cases.append(
        (
            f"{fn}/config-cost-line",
            fn,
            {"config.batch_size": 65536, "config.max_pages": 32767},
            "config.max_pages",
            r"batch_size \* \(max_pages \+ 2\) < 2\^31, got 65536 \* \(32767 \+ 2\)",
        )
    )
    return cases


def _pointer_cases(fn: str, name: str, align: int, prefix: str = "") -> list[Case]:
    key = prefix + name
    return [
        (f"{fn}/{key}-null", fn, {key: 0}, key, "is NULL"),
        (
            f"{fn}/{key}-misaligned",
            fn,
            {key: dev(9) + align // 2},
            key,
            f"expected a {align}-byte aligned address .*got 0x7e0000900{align // 2:03x}",
        ),
    ]


def _append_fetch_cases(fn: str) -> list[Case]:
    cases = _handle_cases(fn)
    cases += [
        (f"{fn}/layer-negative", fn, {"layer": -1}, "layer", r"expected 0 <= layer < 2, got -1"),
        (f"{fn}/layer-too-large", fn, {"layer": 2}, "layer", "got 2"),
        (f"{fn}/num_tokens-negative", fn, {"num_tokens": -1}, "num_tokens", "expected >= 0"),
    ]
    cases += _pointer_cases(fn, "c_kv", 2) + _pointer_cases(fn, "k_pe", 2)
    cases += _pointer_cases(fn, "slots", 8)
    cases += [
        (f"{fn}/c_kv_stride-short", fn, {"c_kv_stride": 511}, "c_kv_stride", ">= 512 elements"),
        (f"{fn}/c_kv_stride-negative", fn, {"c_kv_stride": -512}, "c_kv_stride", "got -512"),
        (f"{fn}/k_pe_stride-short", fn, {"k_pe_stride": 63}, "k_pe_stride", ">= 64 elements"),
    ]
    # (argument, its stride, an address whose 3-row span runs past 2^64)
    for arg, stride, top in (
        ("c_kv", "c_kv_stride", TOP - 2048),
        ("k_pe", "k_pe_stride", TOP - 256),
    ):
        cases += [
            (
                f"{fn}/{stride}-offsets-overflow",
                fn,
                {stride: 2**62},
                stride,
                f"2 x {2**62} elements overflows the int64 offsets of argument '{arg}'",
            ),
            (
                f"{fn}/{stride}-bytes-overflow",
                fn,
                {stride: 2**62, "num_tokens": 2},
                stride,
                rf"argument '{arg}' would span .* over 2\^63 - 1 bytes",
            ),
            (
                f"{fn}/{arg}-wraps",
                fn,
                {arg: top},
                arg,
                "runs past the end of the address space",
            ),
        ]
    cases.append((f"{fn}/slots-wraps", fn, {"slots": TOP - 16}, "slots", "runs past the end"))
    if fn == "snapmla_fetch_dequant":  # in append, c_kv's span is checked (and refused) first
        cases.append(
            (
                f"{fn}/slots-bytes-overflow",
                fn,
                {"num_tokens": 2**61},
                "num_tokens",
                r"argument 'slots' would span 2305843009213693952 elements of 8 bytes",
            )
        )
    return cases


def _quantize_cases(fn: str) -> list[Case]:
    cases: list[Case] = [
        (f"{fn}/num_tokens-negative", fn, {"num_tokens": -3}, "num_tokens", "got -3"),
        (f"{fn}/num_heads-0", fn, {"num_heads": 0}, "num_heads", "expected 1 .. 1024, got 0"),
        (f"{fn}/num_heads-1025", fn, {"num_heads": 1025}, "num_heads", "got 1025"),
        (
            f"{fn}/rows-overflow",
            fn,
            {"num_tokens": 2**62, "num_heads": 4},
            "num_tokens",
            "4611686018427387904 tokens x 4 heads overflows int64",
        ),
    ]
    cases += _pointer_cases(fn, "q", 2)
    cases += [
        (f"{fn}/q_stride_token-short", fn, {"q_stride_token": 575}, "q_stride_token", ">= 576"),
        (f"{fn}/q_stride_head-short", fn, {"q_stride_head": 100}, "q_stride_head", "got 100"),
        (
            f"{fn}/q_stride_token-overflow",
            fn,
            {"q_stride_token": 2**62},
            "q_stride_token",
            "overflows the int64 offsets of argument 'q'",
        ),
        (
            f"{fn}/q_stride_head-overflow",
            fn,
            {"q_stride_head": 2**62},
            "q_stride_head",
            "7 x 4611686018427387904 elements overflows",
        ),
        (
            f"{fn}/q-bytes-overflow",
            fn,
            {"q_stride_token": 2**61},
            "q_stride_token",
            r"argument 'q' would span .* over 2\^63 - 1 bytes",
        ),
        (f"{fn}/q-wraps", fn, {"q": TOP - 4096}, "q", "runs past the end"),
    ]
    cases += _pointer_cases(fn, "q_content", 8) + _pointer_cases(fn, "q_rope", 16)
    cases += _pointer_cases(fn, "q_scale", 4)
    cases += [
        (
            # q's rows may overlap (an input), so q stays small while n x h rows do not.
            f"{fn}/q_content-offsets-overflow",
            fn,
            {"num_tokens": 2**45, "num_heads": 1024, "q_stride_token": 576},
            "num_tokens",
            "overflows the int64 offsets of argument 'q_content'",
        ),
        (f"{fn}/q_content-wraps", fn, {"q_content": TOP - 4096}, "q_content", "runs past"),
        (f"{fn}/q_rope-wraps", fn, {"q_rope": TOP - 1024}, "q_rope", "runs past"),
        (f"{fn}/q_scale-wraps", fn, {"q_scale": TOP - 64}, "q_scale", "runs past"),
    ]
    if fn.endswith("2"):
        cases += _pointer_cases(fn, "q_lo", 8) + _pointer_cases(fn, "q_lo_scale", 4)
        cases += [
            (f"{fn}/q_lo-wraps", fn, {"q_lo": TOP - 4096}, "q_lo", "runs past"),
            (f"{fn}/q_lo_scale-wraps", fn, {"q_lo_scale": TOP - 64}, "q_lo_scale", "runs past"),
        ]
    return cases


OVERLAP = r"bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\] overlap argument '{}' at"


def _apart(fn: str, pairs: list[tuple[str, dict[str, Any], str, str]]) -> list[Case]:
    """Overlap cases: (what, overrides, argument named, the argument it overlaps)."""
    return [
        (f"{fn}/{what}", fn, overrides, named, OVERLAP.format(other))
        for what, overrides, named, other in pairs
    ]


def _cache_ops_overlap_cases() -> list[Case]:
    """Outputs apart from the inputs and each other, inputs apart from the cache the call
    writes; the live cache is one block: a call on layer 1 must not alias layer 0 either."""
    layer_0, layer_1 = CACHE_MEMORY, CACHE_MEMORY + NUM_PAGES * PAGE_BYTES
    end = CACHE_MEMORY + CACHE_BYTES
    cases = _apart(
        "snapmla_append",
        [
            ("c_kv-in-cache", {"c_kv": layer_1 + 4096}, "c_kv", "cache"),
            ("c_kv-in-other-layer", {"c_kv": layer_0}, "c_kv", "cache"),
            ("c_kv-ends-in-cache", {"c_kv": layer_0 - 3 * 1024 + 2}, "c_kv", "cache"),
            # rows 2^39 bytes apart: the bytes from the first row to the last hold the cache
            ("c_kv-stride-reaches-cache", {"c_kv_stride": 2**38}, "c_kv", "cache"),
            ("k_pe-in-cache", {"k_pe": end - 2}, "k_pe", "cache"),
            ("slots-in-cache", {"slots": layer_1}, "slots", "cache"),
        ],
    )
    cases += _apart(
        "snapmla_fetch_dequant",
        [
            # BF16 rows written over FP8 pages: the other layer's too
            ("c_kv-in-cache", {"c_kv": layer_0}, "c_kv", "cache"),
            ("c_kv-in-layer", {"c_kv": layer_1 + 512}, "c_kv", "cache"),
            ("k_pe-in-cache", {"k_pe": end - 128}, "k_pe", "cache"),
            ("c_kv-on-slots", {"c_kv": dev(3) - 1024}, "c_kv", "slots"),
            ("k_pe-on-slots", {"k_pe": dev(3) + 16}, "k_pe", "slots"),
            ("c_kv-on-k_pe", {"c_kv": dev(2) - 2048}, "c_kv", "k_pe"),
            # rows 1 MiB apart: the third is on slots
            ("c_kv-stride-reaches-slots", {"c_kv_stride": 2**19}, "c_kv", "slots"),
        ],
    )
    cases += _apart(
        "snapmla_gather_dequant",
        [
            ("c_kv-in-cache", {"c_kv": layer_0 + 1024}, "c_kv", "cache"),
            ("k_pe-in-cache", {"k_pe": layer_1}, "k_pe", "cache"),
            ("c_kv-on-block_table", {"c_kv": dev(2)}, "c_kv", "block_table"),
            ("c_kv-on-seqlens", {"c_kv": dev(3) - 1024}, "c_kv", "seqlens"),
            ("c_kv-on-out_rows", {"c_kv": dev(7) + 8}, "c_kv", "out_rows"),
            ("c_kv-on-k_pe", {"c_kv": dev(5) - 1024}, "c_kv", "k_pe"),
            ("k_pe-on-block_table", {"k_pe": dev(2) + 32}, "k_pe", "block_table"),
            ("k_pe-on-seqlens", {"k_pe": dev(3)}, "k_pe", "seqlens"),
            ("k_pe-on-out_rows", {"k_pe": dev(7) - 128}, "k_pe", "out_rows"),
            # block_table's second row, 2 MiB on, is in c_kv
            (
                "block_table-stride-reaches-c_kv",
                {"block_table_stride": 2**19},
                "c_kv",
                "block_table",
            ),
        ],
    )
    cases += _apart(
        "snapmla_copy_slots",
        [
            ("src_slots-in-cache", {"src_slots": layer_1 + 64}, "src_slots", "cache"),
            ("dst_slots-in-other-layer", {"dst_slots": layer_0}, "dst_slots", "cache"),
            ("src_slots-ends-in-cache", {"src_slots": layer_0 - 32}, "src_slots", "cache"),
            ("dst_slots-ends-the-cache", {"dst_slots": end - 8}, "dst_slots", "cache"),
        ],
    )
    return cases


def _quantize_overlap_cases(fn: str) -> list[Case]:
    """The outputs apart from q and from each other (the earlier output of a pair named). The
    base: q 3 x 8 rows of 576 BF16 at dev(1), q_content ... q_lo_scale at dev(2) ... dev(6)."""
    q_bytes = 3 * 8 * 576 * 2
    pairs = [
        ("q_content-on-q", {"q_content": dev(1)}, "q_content", "q"),
        ("q_rope-in-q", {"q_rope": dev(1) + 4096}, "q_rope", "q"),
        ("q_scale-ends-q", {"q_scale": dev(1) + q_bytes - 4}, "q_scale", "q"),
        ("q_content-on-q_rope", {"q_content": dev(3) - 8}, "q_content", "q_rope"),
        ("q_content-on-q_scale", {"q_content": dev(4)}, "q_content", "q_scale"),
        ("q_rope-on-q_scale", {"q_rope": dev(4) - 16}, "q_rope", "q_scale"),
        # q's second token, 1 MiB on, is q_content
        ("q-stride-reaches-q_content", {"q_stride_token": 2**19}, "q_content", "q"),
    ]
    if fn.endswith("2"):
        pairs += [
            ("q_content-on-q_lo", {"q_content": dev(5) + 512}, "q_content", "q_lo"),
            ("q_content-on-q_lo_scale", {"q_content": dev(6)}, "q_content", "q_lo_scale"),
            ("q_rope-on-q_lo", {"q_rope": dev(5)}, "q_rope", "q_lo"),
            ("q_rope-on-q_lo_scale", {"q_rope": dev(6) - 16}, "q_rope", "q_lo_scale"),
            ("q_scale-on-q_lo", {"q_scale": dev(5) + 64}, "q_scale", "q_lo"),
            ("q_scale-on-q_lo_scale", {"q_scale": dev(6) + 8}, "q_scale", "q_lo_scale"),
            ("q_lo-on-q", {"q_lo": dev(1) + 8}, "q_lo", "q"),
            ("q_lo-on-q_lo_scale", {"q_lo": dev(6) - 8}, "q_lo", "q_lo_scale"),
            ("q_lo_scale-in-q", {"q_lo_scale": dev(1) + 1024}, "q_lo_scale", "q"),
        ]
    return _apart(fn, pairs)


def _decode_cases() -> list[Case]:
    fn = "snapmla_decode"
    cases = _decode_config_cases(fn)
    q_pe_at = ffi.offsetof("snapmla_decode_args_t", "q_pe")  # 0.1's layout ends here
    cases += _struct_cases(fn, "args", "snapmla_decode_args_t", q_pe_at)
    out_dtype_at = ffi.offsetof("snapmla_decode_args_t", "out_dtype")
    for name, size in (
        ("q_pe", q_pe_at + 4),
        ("q_pe_stride_head", q_pe_at + 8 * 3 + 5),
        ("out_dtype", out_dtype_at + 2),
    ):
        cases.append(
            (
                f"{fn}/args-size-{size}",
                fn,
                {"args.struct_size": size},
                "args",
                f"ends inside field 'args.{name}'",
            )
        )
    # The two-term query (config.q_precision FP8X2, 0.2): auto or fast where q_len x heads
    # <= 32 (the base config's 2 x 16), only the reference kernel past it (here 3 x 11 = 33).
    cases += [
        (
            f"{fn}/q_precision-fp8x2-kernel-{kernel}-rows-33",
            fn,
            {
                "config.q_precision": 1,
                "config.q_len": 3,
                "config.num_heads": 11,
                "args.kernel": kernel,
            },
            "args.kernel",
            r"expected 1 \(reference\) for config.q_precision 1 \(fp8x2\) where q_len \* "
            + rf"num_heads > 32 \(the fast kernel takes it only up to 32; here 33\), got {kernel}",
        )
        for kernel in (0, 2)
    ]
    # The output's dtype (args.out_dtype, 0.2): 0 (BF16) or 1 (fp32, 4 bytes an element for
    # the alignment, span and overlap checks of out).
    cases += [
        (
            f"{fn}/out_dtype={bad}",
            fn,
            {"args.out_dtype": bad},
            "args.out_dtype",
            rf"expected 0 \(bf16\) or 1 \(fp32\), got {bad}",
        )
        for bad in (2, -1, INT32_MAX)
    ]
    fp32_out = {"args.out_dtype": 1}
    out_end_bf16 = dev(4) + 2 * 2 * 16 * 512 * 2  # base_decode_config: b 2, s_q 2, h 16
    cases += [
        (
            f"{fn}/fp32-out-misaligned",
            fn,
            {**fp32_out, "args.out": dev(4) + 8},
            "args.out",
            "expected a 16-byte aligned address",
        ),
        # out's bf16 bytes end at the address space's end; its fp32 bytes would run past it
        (f"{fn}/fp32-out-wraps", fn, {**fp32_out, "args.out": TOP - 2**16}, "args.out", "runs"),
        # an lse right after a BF16 out lies inside an fp32 one
        (
            f"{fn}/fp32-out-on-lse",
            fn,
            {**fp32_out, "args.lse": out_end_bf16},
            "args.out",
            r"bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\] overlap argument 'args.lse' at",
        ),
    ]
    # q_nope and q_pe apart (0.2): q's rows are 512 elements, q_pe's 64.
    split = {"args.q_pe": dev(6), "args.q_pe_stride_batch": 2 * 16 * 64}
    split |= {"args.q_pe_stride_token": 16 * 64, "args.q_pe_stride_head": 64}
    cases += [
        (
            f"{fn}/split-q_stride_head-short",
            fn,
            {**split, "args.q_stride_head": 511},
            "args.q_stride_head",
            "expected >= 512 elements, got 511",
        ),
        (
            f"{fn}/q_pe-misaligned",
            fn,
            {**split, "args.q_pe": dev(6) + 1},
            "args.q_pe",
            "2-byte aligned",
        ),
        (
            f"{fn}/q_pe_stride_token-short",
            fn,
            {**split, "args.q_pe_stride_token": 63},
            "args.q_pe_stride_token",
            "expected >= 64 elements, got 63",
        ),
        (f"{fn}/q_pe-wraps", fn, {**split, "args.q_pe": TOP - 2**10}, "args.q_pe", "runs past"),
    ]
    # Outputs apart from the inputs and each other (0.2): each pair once, the output named.
    overlap = r"bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\] overlap argument '{}' at"
    cases += [
        (f"{fn}/out-on-q", fn, {"args.out": dev(1)}, "args.out", overlap.format("args.q")),
        (
            f"{fn}/out-in-cache",
            fn,
            {"args.out": CACHE_MEMORY + PAGE_BYTES},
            "args.out",
            overlap.format("cache"),
        ),
        (
            f"{fn}/lse-in-cache",
            fn,
            {"args.lse": CACHE_MEMORY + CACHE_BYTES - 4},
            "args.lse",
            overlap.format("cache"),
        ),
        (f"{fn}/out-in-q", fn, {"args.out": dev(1) + 4096}, "args.out", overlap.format("args.q")),
        (
            f"{fn}/out-on-q_pe",
            fn,
            {**split, "args.out": dev(6)},
            "args.out",
            overlap.format("args.q_pe"),
        ),
        (
            f"{fn}/out-on-block_table",
            fn,
            {"args.out": dev(2)},
            "args.out",
            overlap.format("args.block_table"),
        ),
        (
            f"{fn}/out-on-cache_seqlens",
            fn,
            {"args.out": dev(3)},
            "args.out",
            overlap.format("args.cache_seqlens"),
        ),
        (f"{fn}/out-on-lse", fn, {"args.out": dev(5)}, "args.out", overlap.format("args.lse")),
        (f"{fn}/lse-on-q", fn, {"args.lse": dev(1) + 64}, "args.lse", overlap.format("args.q")),
        (
            f"{fn}/lse-on-cache_seqlens",
            fn,
            {"args.lse": dev(3)},
            "args.lse",
            overlap.format("args.cache_seqlens"),
        ),
        (
            f"{fn}/lse-on-q_pe",
            fn,
            {**split, "args.lse": dev(6) + 8},
            "args.lse",
            overlap.format("args.q_pe"),
        ),
        (
            f"{fn}/lse-on-block_table",
            fn,
            {"args.lse": dev(2) + 4},
            "args.lse",
            overlap.format("args.block_table"),
        ),
        # a q whose batch stride reaches out's address overlaps it
        (
            f"{fn}/q-stride-reaches-out",
            fn,
            {"args.q_stride_batch": 3 * 2**19},
            "args.out",
            overlap.format("args.q"),
        ),
        # the workspace (written) apart from everything, the plan (read) from the outputs
        (f"{fn}/workspace-on-q", fn, {"workspace": dev(1)}, "workspace", overlap.format("args.q")),
        (
            f"{fn}/workspace-in-cache",
            fn,
            {"workspace": CACHE_MEMORY + 4096},
            "workspace",
            overlap.format("cache"),
        ),
        (
            f"{fn}/workspace-on-out",
            fn,
            {"workspace": dev(4)},
            "workspace",
            overlap.format("args.out"),
        ),
        (
            f"{fn}/plan-in-workspace",
            fn,
            {"plan": dev(7) + 4096},
            "workspace",
            overlap.format("plan"),
        ),
        (f"{fn}/out-on-plan", fn, {"args.out": dev(6)}, "args.out", overlap.format("plan")),
        (f"{fn}/lse-on-plan", fn, {"args.lse": dev(6)}, "args.lse", overlap.format("plan")),
    ]
    cases += _handle_cases(fn)
    cases += [
        (f"{fn}/layer-negative", fn, {"args.layer": -1}, "args.layer", "got -1"),
        (f"{fn}/layer-too-large", fn, {"args.layer": 2}, "args.layer", "< 2, got 2"),
    ]
    for bad in (0.0, -0.5, math.inf, math.nan, 1e39):
        cases.append(
            (
                f"{fn}/softmax_scale={bad}",
                fn,
                {"args.softmax_scale": bad},
                "args.softmax_scale",
                "expected a finite value > 0",
            )
        )
    cases += [
        (f"{fn}/kernel=-1", fn, {"args.kernel": -1}, "args.kernel", "got -1"),
        (f"{fn}/kernel=3", fn, {"args.kernel": 3}, "args.kernel", "or 2 \\(fast\\), got 3"),
    ]
    cases += _pointer_cases(fn, "q", 2, "args.")
    for stride in ("q_stride_batch", "q_stride_token", "q_stride_head"):
        cases.append(
            (
                f"{fn}/{stride}-short",
                fn,
                {f"args.{stride}": 575},
                f"args.{stride}",
                "expected >= 576 elements, got 575",
            )
        )
        cases.append(
            (
                f"{fn}/{stride}-overflow",
                fn,
                {f"args.{stride}": INT64_MAX},
                f"args.{stride}",
                "overflows the int64 offsets of argument 'args.q'",
            )
        )
    cases += [
        (
            f"{fn}/q-bytes-overflow",
            fn,
            {"args.q_stride_batch": 2**62},
            "args.q_stride_batch",
            r"argument 'args.q' would span .* over 2\^63 - 1 bytes",
        ),
        (f"{fn}/q-wraps", fn, {"args.q": TOP - 2**16}, "args.q", "runs past"),
    ]
    cases += _pointer_cases(fn, "block_table", 4, "args.")
    cases += [
        (
            f"{fn}/block_table_stride-short",
            fn,
            {"args.block_table_stride": 7},
            "args.block_table_stride",
            "expected >= max_pages = 8, got 7",
        ),
        (
            f"{fn}/block_table_stride-overflow",
            fn,
            {"args.block_table_stride": INT64_MAX},
            "args.block_table_stride",
            "overflows the int64 offsets of argument 'args.block_table'",
        ),
        (
            f"{fn}/block_table-bytes-overflow",
            fn,
            {"args.block_table_stride": 2**61},
            "args.block_table_stride",
            r"argument 'args.block_table' would span .* over 2\^63 - 1 bytes",
        ),
        (f"{fn}/block_table-wraps", fn, {"args.block_table": TOP - 32}, "args.block_table", "runs"),
    ]
    cases += _pointer_cases(fn, "cache_seqlens", 4, "args.")
    cases.append(
        (f"{fn}/cache_seqlens-wraps", fn, {"args.cache_seqlens": TOP - 4}, "args.cache_seqlens", "")
    )
    cases += _pointer_cases(fn, "out", 16, "args.")
    cases.append((f"{fn}/out-wraps", fn, {"args.out": TOP - 2**15}, "args.out", "runs past"))
    cases += [
        (
            f"{fn}/args.lse-misaligned",
            fn,
            {"args.lse": dev(9) + 2},
            "args.lse",
            "expected a 4-byte aligned address",
        ),
        (f"{fn}/lse-wraps", fn, {"args.lse": TOP - 64}, "args.lse", "runs past"),
    ]
    cases += _pointer_cases(fn, "plan", 16)
    cases.append((f"{fn}/plan-wraps", fn, {"plan": TOP - 128}, "plan", "runs past"))
    cases += _pointer_cases(fn, "workspace", 256)
    cases.append((f"{fn}/workspace-wraps", fn, {"workspace": TOP - 256}, "workspace", "runs"))
    cases += _buffer_size_cases(fn)
    return cases


# Buffers sized for another config than the call's (config.plan_bytes and workspace_bytes,
# 0.4): (what, the call's config changes, the changes of the config the buffers were sized for).
# The call runs the two-term query (the fast kernel takes it at base_decode_config's 2 x 16 rows).
MIXED_BUFFERS: list[tuple[str, dict[str, int], dict[str, int]]] = [
    # the two-term query's low rows follow the one-term workspace: 516 bytes a query row more
    ("fp8-buffers-fp8x2-call", {}, {"q_precision": 0}),
    ("fewer-parts", {}, {"num_sm_parts": 3}),  # the partials
    ("fewer-heads", {}, {"num_heads": 8}),
    ("shorter-q_len", {}, {"q_len": 1}),
    ("smaller-batch", {}, {"batch_size": 1}),
    ("parts-200-buffers-4", {"num_sm_parts": 200}, {"num_sm_parts": 4}),  # the plan's words too
    ("more-parts", {}, {"num_sm_parts": 9}),  # larger buffers: accepted
    ("more-heads", {}, {"num_heads": 64}),
    ("fp8x2-buffers-fp8-call", {"q_precision": 0}, {"q_precision": 1}),
]


def mixed_buffer_outcome(fn: str, call: dict[str, int], sized_for: dict[str, int]) -> Any:
    """(the call's overrides, the argument refused or None, its message pattern): buffers sized
    for base_decode_config + q_precision 1 + sized_for, passed to a call of that + call."""
    call = {"q_precision": 1, **call}
    plan_need, ws_need = decode_sizes(**call)
    plan_bytes, ws_bytes = decode_sizes(**{**call, **sized_for})
    overrides: dict[str, Any] = {f"config.{k}": v for k, v in call.items()}
    overrides["config.plan_bytes"] = plan_bytes
    checked = [("plan", plan_bytes, plan_need)]
    if fn == "snapmla_decode":
        overrides["config.workspace_bytes"] = ws_bytes
        checked.append(("workspace", ws_bytes, ws_need))
    for name, said, need in checked:  # the plan first, as the C checks
        if said < need:
            pattern = rf"config.{name}_bytes is {said}, smaller than the {need} bytes this config"
            return overrides, name, pattern
    return overrides, None, ""


def _buffer_size_cases(fn: str) -> list[Case]:
    plan_need, ws_need = decode_sizes(q_precision=1)
    two_term = {"config.q_precision": 1}
    cases: list[Case] = [
        (
            f"{fn}/plan_bytes-short",
            fn,
            {**two_term, "config.plan_bytes": plan_need - 1},
            "plan",
            (
                rf"config.plan_bytes is {plan_need - 1}, smaller than the {plan_need} bytes "
                r"this config needs \(snapmla_decode_buffer_sizes; sized for another config, "
                r"or with num_sm_parts 0 on a GPU with fewer SMs\)"
            ),
        )
    ]
    if fn == "snapmla_decode":
        cases.append(
            (
                f"{fn}/workspace_bytes-short",
                fn,
                {**two_term, "config.plan_bytes": plan_need, "config.workspace_bytes": ws_need - 1},
                "workspace",
                rf"config.workspace_bytes is {ws_need - 1}, smaller than the {ws_need} bytes",
            )
        )
    for what, call, sized_for in MIXED_BUFFERS:
        overrides, named, pattern = mixed_buffer_outcome(fn, call, sized_for)
        if named is not None:
            cases.append((f"{fn}/{what}", fn, overrides, named, pattern))
    return cases


_HOST_ARRAYS: list[Any] = []  # host pointer arrays passed as config.layer_memory, kept alive


def _host_pointers(addresses: tuple[int, ...]) -> int:
    """The address of a host array holding ``addresses`` (for ``config.layer_memory``)."""
    array = ffi.new("void*[]", [ffi.cast("void*", a) for a in addresses])
    _HOST_ARRAYS.append(array)
    return int(ffi.cast("uintptr_t", array))


def _all_cases() -> list[Case]:
    cases: list[Case] = []
    fn = "snapmla_cache_bytes"
    cases += [
        (f"{fn}/bytes-null", fn, {"bytes": 0}, "bytes", "is NULL"),
        (f"{fn}/num_layers-0", fn, {"num_layers": 0}, "num_layers", "expected >= 1, got 0"),
        (f"{fn}/num_layers-negative", fn, {"num_layers": -7}, "num_layers", "got -7"),
        (f"{fn}/num_pages-0", fn, {"num_pages": 0}, "num_pages", f"1 .. {MAX_PAGES}, got 0"),
        (f"{fn}/num_pages-2^25", fn, {"num_pages": 2**25}, "num_pages", "got 33554432"),
        (
            f"{fn}/total-overflow",  # the issue's example: unchecked, it wraps to 5376 bytes
            fn,
            {"num_layers": 2133428917, "num_pages": 14684993},
            "num_layers",
            "expected <= 15238777 for num_pages = 14684993",
        ),
        (
            f"{fn}/total-overflow-edge",
            fn,
            {"num_layers": 6669205, "num_pages": MAX_PAGES},
            "num_layers",
            "expected <= 6669204",
        ),
    ]
    fn = "snapmla_cache_create"
    config_size = ffi.offsetof("snapmla_cache_config_t", "layer_memory")  # 0.1's layout
    cases.append((f"{fn}/cache-null", fn, {"cache": 0}, "cache", "is NULL"))
    cases += _struct_cases(fn, "config", "snapmla_cache_config_t", config_size)
    cases += [
        (
            f"{fn}/config-size-{size}",
            fn,
            {"config.struct_size": size},
            "config",
            "ends inside field 'config.layer_memory'",
        )
        for size in (config_size + 1, config_size + 7)
    ]
    stride_at = ffi.offsetof("snapmla_cache_config_t", "page_stride")
    cases += [
        (
            f"{fn}/config-size-{stride_at + 3}",
            fn,
            {"config.struct_size": stride_at + 3},
            "config",
            "ends inside field 'config.page_stride'",
        ),
        (
            f"{fn}/page_stride-not-128",
            fn,
            {"config.page_stride": PAGE_BYTES + 64},
            "config.page_stride",
            f"expected 0 \\(packed\\) or a multiple of 128 >= {PAGE_BYTES}",
        ),
        (
            f"{fn}/page_stride-small",
            fn,
            {"config.page_stride": PAGE_BYTES - 128},
            "config.page_stride",
            f"got {PAGE_BYTES - 128}",
        ),
        (
            f"{fn}/page_stride-2^40",
            fn,
            {"config.page_stride": 2**40},
            "config.page_stride",
            "< 2\\^40 \\(TMA\\)",
        ),
        (
            f"{fn}/page_stride-overflow",
            fn,
            {"config.num_layers": 2**20, "config.num_pages": 2**24, "config.page_stride": 2**30},
            "config.page_stride",
            "more than 2\\^63 - 1 bytes",
        ),
        (
            f"{fn}/memory_bytes-short-for-stride",
            fn,
            {"config.page_stride": 41984},
            "config.memory_bytes",
            f"expected >= {NUM_LAYERS * NUM_PAGES * 41984}",
        ),
    ]
    cases += [
        (f"{fn}/page_size", fn, {"config.page_size": 32}, "config.page_size", "0 or 64, got 32"),
        (f"{fn}/num_layers", fn, {"config.num_layers": 0}, "config.num_layers", "got 0"),
        (f"{fn}/num_pages", fn, {"config.num_pages": -1}, "config.num_pages", "got -1"),
        (
            f"{fn}/total-overflow",
            fn,
            {"config.num_layers": 2133428917, "config.num_pages": 14684993},
            "config.num_layers",
            "for config.num_pages = 14684993",
        ),
        (f"{fn}/device-low", fn, {"config.device": -2}, "config.device", "-1 .. 63, got -2"),
        (f"{fn}/device-high", fn, {"config.device": 64}, "config.device", "got 64"),
        (
            f"{fn}/memory-misaligned",
            fn,
            {"config.memory": CACHE_MEMORY + 128},
            "config.memory",
            "expected a 256-byte aligned address",
        ),
        (
            f"{fn}/memory_bytes-short",
            fn,
            {"config.memory_bytes": CACHE_BYTES - 1},
            "config.memory_bytes",
            f"expected >= {CACHE_BYTES} for 2 layers x 4 pages, got {CACHE_BYTES - 1}",
        ),
        (
            f"{fn}/memory-wraps",
            fn,
            {"config.memory": TOP - 2**20, "config.memory_bytes": 2**21},
            "config.memory_bytes",
            "runs past the end of the address space",
        ),
    ]
    layer_bytes = NUM_PAGES * PAGE_BYTES

    def layers(*addresses: int) -> dict[str, int]:  # config.layer_memory instead of memory
        return {
            "config.memory": 0,
            "config.memory_bytes": 0,
            "config.layer_memory": _host_pointers(addresses),
        }

    cases += [
        (
            f"{fn}/layer_memory-with-memory",
            fn,
            {"config.layer_memory": _host_pointers((dev(20), dev(21)))},
            "config.layer_memory",
            "expected NULL when config.memory is set",
        ),
        (
            f"{fn}/layer_memory-null-entry",
            fn,
            layers(dev(20), 0),
            "config.layer_memory[1]",
            "is NULL",
        ),
        (
            f"{fn}/layer_memory-misaligned",
            fn,
            layers(dev(20) + 64, dev(21)),
            "config.layer_memory[0]",
            "expected a 128-byte aligned address",
        ),
        (
            f"{fn}/layer_memory-wraps",
            fn,
            layers(dev(20), TOP - 2**16),
            "config.layer_memory[1]",
            "runs past the end of the address space",
        ),
        (
            f"{fn}/layer_memory-overlap",
            fn,
            layers(dev(20) + layer_bytes - 256, dev(20)),
            "config.layer_memory[0]",
            "overlaps layer 1",
        ),
    ]
    fn = "snapmla_cache_destroy"
    cases += [c for c in _handle_cases(fn) if not c[0].endswith("cache-null")]
    fn = "snapmla_gather_dequant"
    cases += _handle_cases(fn)
    cases += [
        (f"{fn}/layer-2", fn, {"layer": 2}, "layer", "expected 0 <= layer < 2, got 2"),
        (f"{fn}/num_rows-negative", fn, {"num_rows": -1}, "num_rows", "got -1"),
        (f"{fn}/batch-0", fn, {"batch": 0}, "batch", "expected 1 .. 65536, got 0"),
        (f"{fn}/max_pages-0", fn, {"max_pages": 0}, "max_pages", "got 0"),
        (
            f"{fn}/block_table_stride-short",
            fn,
            {"block_table_stride": 7},
            "block_table_stride",
            "expected >= max_pages = 8, got 7",
        ),
        (
            f"{fn}/c_kv_stride-short",
            fn,
            {"c_kv_stride": 511},
            "c_kv_stride",
            "expected >= 512 elements",
        ),
        (
            f"{fn}/k_pe_stride-short",
            fn,
            {"k_pe_stride": 63},
            "k_pe_stride",
            "expected >= 64 elements",
        ),
        (f"{fn}/out_rows-wraps", fn, {"out_rows": TOP - 8}, "out_rows", "runs past"),
        (f"{fn}/seqlens-wraps", fn, {"seqlens": TOP - 4}, "seqlens", "runs past"),
        (f"{fn}/block_table-wraps", fn, {"block_table": TOP - 32}, "block_table", "runs past"),
        (f"{fn}/c_kv-wraps", fn, {"c_kv": TOP - 1024}, "c_kv", "runs past"),
        (f"{fn}/k_pe-wraps", fn, {"k_pe": TOP - 128}, "k_pe", "runs past"),
    ]
    for name, align in (
        ("block_table", 4),
        ("seqlens", 4),
        ("out_rows", 8),
        ("c_kv", 2),
        ("k_pe", 2),
    ):
        cases += _pointer_cases(fn, name, align)
    fn = "snapmla_copy_slots"
    cases += _handle_cases(fn)
    cases += [
        (f"{fn}/layer-2", fn, {"layer": 2}, "layer", "expected 0 <= layer < 2, got 2"),
        (f"{fn}/num_tokens-negative", fn, {"num_tokens": -1}, "num_tokens", "got -1"),
        (f"{fn}/src-wraps", fn, {"src_slots": TOP - 16}, "src_slots", "runs past"),
        (f"{fn}/dst-wraps", fn, {"dst_slots": TOP - 16}, "dst_slots", "runs past"),
    ]
    cases += _pointer_cases(fn, "src_slots", 8) + _pointer_cases(fn, "dst_slots", 8)
    fn = "snapmla_cache_layer_data"
    cases += _handle_cases(fn)
    cases += [
        (f"{fn}/layer-2", fn, {"layer": 2}, "layer", "expected 0 <= layer < 2, got 2"),
        (f"{fn}/layer-negative", fn, {"layer": -1}, "layer", "got -1"),
        (f"{fn}/data-null", fn, {"data": 0}, "data", "is NULL"),
    ]
    fn = "snapmla_cache_info"
    cases += _handle_cases(fn)
    cases += [
        (f"{fn}/info-null", fn, {"info": 0}, "info", "is NULL"),
        (
            f"{fn}/info-size-15",
            fn,
            {"info": Out("snapmla_cache_info_t*", 256, 15)},
            "info",
            "expected struct_size 16 .. 4096",
        ),
        (
            f"{fn}/info-size-over-max",
            fn,
            {"info": Out("snapmla_cache_info_t*", 256, MAX_STRUCT + 1)},
            "info",
            "got 4097",
        ),
    ]
    cases += _append_fetch_cases("snapmla_append")
    cases += _append_fetch_cases("snapmla_fetch_dequant")
    cases += _quantize_cases("snapmla_quantize_q") + _quantize_cases("snapmla_quantize_q2")
    fn = "snapmla_decode_buffer_sizes"
    cases += _decode_config_cases(fn)
    cases += [
        (f"{fn}/plan_bytes-null", fn, {"plan_bytes": 0}, "plan_bytes", "is NULL"),
        (f"{fn}/workspace_bytes-null", fn, {"workspace_bytes": 0}, "workspace_bytes", "is NULL"),
    ]
    fn = "snapmla_decode_select_kernel"
    cases += _decode_config_cases(fn)
    cases += [
        (f"{fn}/selected-null", fn, {"selected": 0}, "selected", "is NULL"),
        (f"{fn}/kernel-3", fn, {"kernel": 3}, "kernel", "expected 0 .auto., 1 .reference. or 2"),
        (f"{fn}/kernel--1", fn, {"kernel": -1}, "kernel", "got -1"),
    ]
    cases += [
        (
            f"{fn}/q_precision-fp8x2-kernel-{k}-rows-33",
            fn,
            {"config.q_precision": 1, "config.q_len": 1, "config.num_heads": 33, "kernel": k},
            "kernel",
            r"expected 1 \(reference\) for config.q_precision 1 \(fp8x2\)",
        )
        for k in (0, 2)
    ]
    fn = "snapmla_decode_plan"
    cases += _decode_config_cases(fn)
    cases += _pointer_cases(fn, "cache_seqlens", 4) + _pointer_cases(fn, "plan", 16)
    cases += [
        (f"{fn}/cache_seqlens-wraps", fn, {"cache_seqlens": TOP - 4}, "cache_seqlens", "runs"),
        (f"{fn}/plan-wraps", fn, {"plan": TOP - 128}, "plan", "runs past the end"),
    ]
    cases += _buffer_size_cases(fn)
    cases += _cache_ops_overlap_cases()
    cases += _quantize_overlap_cases("snapmla_quantize_q")
    cases += _quantize_overlap_cases("snapmla_quantize_q2")
    cases += _decode_cases()
    return cases


CASES = _all_cases()


def test_case_ids_are_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]


@pytest.mark.parametrize(
    ("fn", "overrides", "argument", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_refusal(fn: str, overrides: dict[str, Any], argument: str, pattern: str) -> None:
    result = invoke(fn, with_overrides(fn, overrides))
    assert result.status == INVALID, (result.status, result.message)
    assert re.match(rf"{fn}: argument '{re.escape(argument)}'", result.message), result.message
    assert re.search(pattern, result.message), result.message
    assert not result.wrote, "a refused call wrote an output"
    assert not result.created


@pytest.mark.parametrize("fn", sorted(PARAMS))
def test_valid_call_is_accepted(fn: str) -> None:
    # The base every case changes one argument of: accepted, so each refusal is that argument's.
    result = invoke(fn, base(fn))
    assert result.status == ACCEPTED[fn], result.message
    if result.status == VALIDATED:
        assert (
            result.message
            == f"{fn}: validation-only mode: the arguments are valid, nothing was run"
        )


def test_decode_outputs_next_to_each_other_are_accepted() -> None:
    # The overlap rule is on bytes: an lse that starts at out's end is apart, one four bytes
    # earlier overlaps (and out, checked first, is the one named).
    fn = "snapmla_decode"
    b, s_q, h = 2, 2, 16  # base_decode_config()
    out_end = dev(4) + b * s_q * h * 512 * 2
    result = invoke(fn, with_overrides(fn, {"args.lse": out_end}))
    assert result.status == VALIDATED, result.message
    result = invoke(fn, with_overrides(fn, {"args.lse": out_end - 4}))
    assert result.status == INVALID, result.message
    assert result.message.startswith(f"{fn}: argument 'args.out': bytes "), result.message


# Arrays that touch: (function, overrides where one ends where the other begins, the same one
# element further (overlapping), the argument then named). The base's shapes: append / fetch
# 3 rows (c_kv 3072 bytes at dev(1)), gather 100 rows (c_kv 102400 bytes at dev(4), k_pe at
# dev(5)), copy_slots 5 slots (40 bytes), quantize 3 x 8 rows (q 27648 bytes at dev(1)).
TOUCHING = [
    ("snapmla_append", {"c_kv": CACHE_MEMORY - 3072}, {"c_kv": CACHE_MEMORY - 3070}, "c_kv"),
    (
        "snapmla_append",
        {"slots": CACHE_MEMORY + CACHE_BYTES},
        {"slots": CACHE_MEMORY + CACHE_BYTES - 8},
        "slots",
    ),
    ("snapmla_fetch_dequant", {"k_pe": dev(1) + 3072}, {"k_pe": dev(1) + 3070}, "c_kv"),
    (
        "snapmla_fetch_dequant",
        {"c_kv": CACHE_MEMORY + CACHE_BYTES},
        {"c_kv": CACHE_MEMORY + CACHE_BYTES - 2},
        "c_kv",
    ),
    ("snapmla_fetch_dequant", {"k_pe": dev(3) - 384}, {"k_pe": dev(3) - 382}, "k_pe"),
    ("snapmla_gather_dequant", {"c_kv": dev(5) - 102400}, {"c_kv": dev(5) - 102398}, "c_kv"),
    ("snapmla_gather_dequant", {"k_pe": dev(7) + 16}, {"k_pe": dev(7) + 14}, "k_pe"),
    ("snapmla_gather_dequant", {"c_kv": dev(3) + 8}, {"c_kv": dev(3) + 6}, "c_kv"),
    (
        "snapmla_copy_slots",
        {"dst_slots": CACHE_MEMORY - 40},
        {"dst_slots": CACHE_MEMORY - 32},
        "dst_slots",
    ),
    (
        "snapmla_quantize_q",
        {"q_content": dev(1) + 27648},
        {"q_content": dev(1) + 27640},
        "q_content",
    ),
    ("snapmla_quantize_q", {"q_scale": dev(3) + 3072}, {"q_scale": dev(3) + 3068}, "q_rope"),
    ("snapmla_quantize_q2", {"q_lo_scale": dev(5) + 12288}, {"q_lo_scale": dev(5) + 12284}, "q_lo"),
    ("snapmla_quantize_q2", {"q_lo": dev(1) - 12288}, {"q_lo": dev(1) - 12280}, "q_lo"),
]


@pytest.mark.parametrize(("fn", "apart", "overlapping", "named"), TOUCHING)
def test_arrays_that_touch_are_accepted(
    fn: str, apart: dict[str, Any], overlapping: dict[str, Any], named: str
) -> None:
    # The overlap rule is on bytes [first, last]: an array that starts right after another's
    # last byte is apart, one element earlier overlaps.
    result = invoke(fn, with_overrides(fn, apart))
    assert result.status == VALIDATED, result.message
    result = invoke(fn, with_overrides(fn, overlapping))
    assert result.status == INVALID, result.message
    assert result.message.startswith(f"{fn}: argument '{named}': bytes "), result.message
    assert not result.wrote


def test_per_layer_cache_aliasing_is_the_layers_own_memory() -> None:
    """A cache made from config.layer_memory: a call on layer 1 refuses arrays in layer 1's
    memory and accepts them in layer 0's (another allocation), as snapmla_decode does."""
    layer_bytes = NUM_PAGES * PAGE_BYTES
    config = base_cache_config()
    config.fields.update(memory=0, memory_bytes=0, layer_memory=_host_pointers((dev(30), dev(40))))
    pointer, keep = config.build()
    handle = ffi.new("snapmla_cache_t*")
    assert LIB.snapmla_cache_create(pointer, handle) == SUCCESS, last_error()
    cache = int(ffi.cast("uintptr_t", handle[0]))
    try:
        for fn, name in (
            ("snapmla_append", "c_kv"),
            ("snapmla_fetch_dequant", "k_pe"),
            ("snapmla_gather_dequant", "c_kv"),
            ("snapmla_copy_slots", "src_slots"),
        ):
            for address in (dev(30), dev(40) - 2**17, dev(40) + layer_bytes):
                result = invoke(fn, with_overrides(fn, {"cache": cache, name: address}))
                assert result.status == VALIDATED, (fn, address, result.message)
            for address in (dev(40), dev(40) + layer_bytes - 8):
                result = invoke(fn, with_overrides(fn, {"cache": cache, name: address}))
                assert result.status == INVALID, (fn, address, result.message)
                assert result.message.startswith(f"{fn}: argument '{name}': bytes "), result.message
                assert re.search(OVERLAP.format("cache"), result.message), result.message
    finally:
        assert LIB.snapmla_cache_destroy(handle[0]) == SUCCESS
    del keep


@pytest.mark.parametrize("fn", ["snapmla_decode_plan", "snapmla_decode"])
def test_buffers_the_config_fits_are_accepted(fn: str) -> None:
    """config.plan_bytes / workspace_bytes (0.4): 0 is not checked, the sizes the config needs
    or more are accepted, mixed configs whose buffers are large enough too; the plan call does
    not look at workspace_bytes."""
    plan_need, ws_need = decode_sizes(q_precision=1)
    for plan_bytes, ws_bytes in (
        (0, 0),
        (plan_need, ws_need),
        (plan_need + 1, ws_need + 256),
        (2**64 - 1, 2**64 - 1),
        (0, ws_need if fn == "snapmla_decode" else 1),
    ):
        overrides = {"config.q_precision": 1, "config.plan_bytes": plan_bytes}
        overrides["config.workspace_bytes"] = ws_bytes
        result = invoke(fn, with_overrides(fn, overrides))
        assert result.status == VALIDATED, (plan_bytes, ws_bytes, result.message)
    named = []
    for what, call, sized_for in MIXED_BUFFERS:
        overrides, name, _ = mixed_buffer_outcome(fn, call, sized_for)
        named.append(name)
        if name is None:
            result = invoke(fn, with_overrides(fn, overrides))
            assert result.status == VALIDATED, (what, result.message)
    # the list refuses each buffer somewhere and accepts some mixed configs
    assert {"plan", None} <= set(named), named
    assert fn == "snapmla_decode_plan" or "workspace" in named, named


def test_buffer_sizes_and_select_kernel_ignore_the_buffer_sizes() -> None:
    fn = "snapmla_decode_buffer_sizes"
    plain = invoke(fn, base(fn))
    said = invoke(fn, with_overrides(fn, {"config.plan_bytes": 1, "config.workspace_bytes": 1}))
    assert plain.status == said.status == SUCCESS and plain.outputs == said.outputs
    fn = "snapmla_decode_select_kernel"
    said = invoke(fn, with_overrides(fn, {"config.plan_bytes": 1, "config.workspace_bytes": 1}))
    assert said.status == SUCCESS, said.message


def test_fp32_out_spans_four_bytes_an_element() -> None:
    # args.out_dtype FP32 (0.2): out's span, end and overlaps count 4 bytes an element. An lse
    # right after the fp32 out is apart; the BF16 out's end is inside it (fp32-out-on-lse); an
    # out whose BF16 bytes end at the top of the address space is accepted as BF16 only.
    fn = "snapmla_decode"
    fp32_end = dev(4) + 2 * 2 * 16 * 512 * 4  # base_decode_config()
    for overrides in ({"args.lse": fp32_end}, {"args.out": TOP - 2**17, "args.lse": 0}):
        result = invoke(fn, with_overrides(fn, {"args.out_dtype": 1, **overrides}))
        assert result.status == VALIDATED, (overrides, result.message)
    result = invoke(fn, with_overrides(fn, {"args.out": TOP - 2**16}))
    assert result.status == VALIDATED, result.message
    result = invoke(fn, with_overrides(fn, {"args.out_dtype": 1, "args.lse": fp32_end - 4}))
    assert result.status == INVALID, result.message
    assert result.message.startswith(f"{fn}: argument 'args.out': bytes "), result.message


def test_decode_args_without_out_dtype_read_bf16() -> None:
    # A struct_size that ends before args.out_dtype (0.2's q_pe layout) reads it as 0 (BF16),
    # whatever the bytes past struct_size hold: the lse right after a BF16 out is then apart
    # (as FP32 it would overlap), and one byte more of struct_size ends inside the field.
    fn = "snapmla_decode"
    out_dtype_at = ffi.offsetof("snapmla_decode_args_t", "out_dtype")
    lse = {"args.lse": dev(4) + 2 * 2 * 16 * 512 * 2, "args.out_dtype": 1}
    result = invoke(fn, with_overrides(fn, {**lse, "args.struct_size": out_dtype_at}))
    assert result.status == VALIDATED, result.message
    result = invoke(fn, with_overrides(fn, lse))
    assert result.status == INVALID and "overlap argument 'args.lse'" in result.message
    result = invoke(fn, with_overrides(fn, {**lse, "args.struct_size": out_dtype_at + 1}))
    assert result.status == INVALID, result.message
    assert "ends inside field 'args.out_dtype'" in result.message


def test_every_entry_point_is_covered() -> None:
    import pycparser
    from pycparser import c_ast

    from test_cdef import _PRELUDE, strip_to_declarations

    ast = pycparser.CParser().parse(_PRELUDE + strip_to_declarations(HEADER.read_text()))
    params = {}
    for node in ast.ext:
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            args = node.type.args.params if node.type.args else []
            params[node.name] = tuple(a.name for a in args if a.name is not None)
    assert set(params) == set(PARAMS) | NO_REFUSALS
    for fn, names in PARAMS.items():
        assert params[fn] == names, fn
        assert any(c[1] == fn for c in CASES), f"no refusal case for {fn}"


def _refusal_templates() -> list[tuple[str, str, str]]:
    """(status, function, message template) of every failure message in cpp/api/: the literal
    pieces of a C string concatenation joined; function is the entry point whose body holds
    the message ("" for a message in a helper, which any entry point may produce)."""
    templates = []
    for source in API_SOURCES:
        text = re.sub(r"//[^\n]*", "", source.read_text())
        bodies = []  # (start, end, name) of each entry point's body
        for m in re.finditer(r'extern "C" SNAPMLA_API[^(]*?\b(snapmla_\w+)\(', text):
            bodies.append((m.start(), text.index("\n}\n", m.start()), m.group(1)))
        for match in re.finditer(r"(SNAPMLA_REQUIRE\(|fail\(\s*(SNAPMLA_\w+))", text):
            status = match.group(2) or "SNAPMLA_ERROR_INVALID_ARGUMENT"
            literals = re.match(
                r'(?:[^";]|"(?:[^"\\]|\\.)*")*?((?:"(?:[^"\\]|\\.)*"\s*)+)',
                text[match.end() :],
            )
            if literals:
                template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', literals.group(1)))
                owner = next((n for s, e, n in bodies if s < match.start() < e), "")
                templates.append((status, owner, template))
    return templates


def _template_regex(template: str, function: str) -> str:
    out, i = "", 0
    for m in re.finditer(r"%(?:zu|lld|d|s|p|g)", template):
        out += re.escape(template[i : m.start()]) + ".*?"
        i = m.end()
    out = "^" + out + re.escape(template[i:]) + "$"
    return out.replace("^.*?", f"^{function}", 1) if function else out


def test_every_refusal_message_is_reached() -> None:
    """Every INVALID_ARGUMENT message of cpp/api/ is produced by some case (of its entry point,
    for a message written in an entry point's body), except check_device's and the cache memory
    checks' ("CUDA reports ..."), which need a GPU (tests/gpu/test_validation_gpu.py): a refusal
    added without a test fails here."""
    messages = []
    for _, fn, overrides, _, _ in CASES:
        messages.append(invoke(fn, with_overrides(fn, overrides)).message)
    templates = [
        (f, t) for s, f, t in _refusal_templates() if s == "SNAPMLA_ERROR_INVALID_ARGUMENT"
    ]
    assert len(templates) > 40, templates
    unreached = []
    for function, template in templates:
        if "lives on CUDA device" in template or "CUDA reports" in template:  # need a GPU
            continue
        regex = _template_regex(template, function)
        if not any(re.match(regex, m, flags=re.DOTALL) for m in messages):
            unreached.append((function, template))
    assert not unreached, unreached


def test_refusal_counts(capsys: pytest.CaptureFixture[str]) -> None:
    per_function: dict[str, int] = {}
    for _, fn, _, _, _ in CASES:
        per_function[fn] = per_function.get(fn, 0) + 1
    with capsys.disabled():
        print(
            f"\nC refusal cases: {len(CASES)} over {len(per_function)} entry points: "
            + ", ".join(
                f"{k.removeprefix('snapmla_')} {v}" for k, v in sorted(per_function.items())
            )
        )
    assert len(CASES) >= 200


# ===================================================================== struct_size rule


def test_larger_struct_size_with_zero_tail_is_accepted() -> None:
    size = _size("snapmla_cache_config_t")
    for struct_size in (size + 1, size + 8, MAX_STRUCT):
        result = invoke(
            "snapmla_cache_create",
            with_overrides(
                "snapmla_cache_create",
                {"config.struct_size": struct_size, "config.tail": bytes(64)},
            ),
        )
        assert result.status == SUCCESS, result.message
    # A nonzero byte past the struct_size is not read: accepted.
    result = invoke(
        "snapmla_cache_create",
        with_overrides(
            "snapmla_cache_create",
            {"config.struct_size": size + 4, "config.tail": bytes(4) + b"\1"},
        ),
    )
    assert result.status == SUCCESS, result.message


def test_shorter_decode_config_reads_num_sm_parts_as_zero() -> None:
    fn = "snapmla_decode_buffer_sizes"
    full = invoke(fn, base(fn))
    assert full.status == SUCCESS
    # num_sm_parts (bytes 24..27) covered; q_precision (28..31, since 0.2) read as 0 or given 0;
    # plan_bytes and workspace_bytes (32..47, since 0.4) ignored here
    for struct_size in (28, 32, 40, 48):
        result = invoke(fn, with_overrides(fn, {"config.struct_size": struct_size}))
        assert result.status == SUCCESS and result.outputs == full.outputs, struct_size
    # FP8X2 reserves the low row: 516 bytes a query row (2 x 2 x 16 rows here), 256-aligned.
    two = invoke(fn, with_overrides(fn, {"config.q_precision": 1}))
    assert two.status == SUCCESS and two.outputs["plan_bytes"] == full.outputs["plan_bytes"]
    ws = [int.from_bytes(r.outputs["workspace_bytes"], "little") for r in (two, full)]
    assert ws[0] - ws[1] == 512 * 64 + 256, ws
    # Without num_sm_parts, the parts come from the device: validation-only mode stops there.
    result = invoke(fn, with_overrides(fn, {"config.struct_size": 24}))
    assert result.status == VALIDATED, result.message
    assert not result.wrote


def _info_bytes(struct_size: int, nbytes: int) -> tuple[int, bytes]:
    pointer, buffer = Out("snapmla_cache_info_t*", nbytes, struct_size).build()
    status = LIB.snapmla_cache_info(ffi.cast("snapmla_cache_t", LIVE), pointer)
    return status, bytes(ffi.buffer(buffer))


def test_cache_info_writes_what_struct_size_covers() -> None:
    size = _size("snapmla_cache_info_t")
    status, full = _info_bytes(size, size)
    assert status == SUCCESS
    info = ffi.cast("snapmla_cache_info_t*", ffi.from_buffer(bytearray(full)))
    assert (info.num_layers, info.num_pages, info.total_bytes) == (2, 4, CACHE_BYTES)
    assert int(ffi.cast("uintptr_t", info.data)) == CACHE_MEMORY
    assert info.owns_memory == 0
    for struct_size in (16, 20, 44, size - 4, size + 1, size + 40, 600):
        nbytes = max(struct_size, size) + 32
        status, got = _info_bytes(struct_size, nbytes)
        assert status == SUCCESS, struct_size
        n = min(struct_size, size)
        assert got[8:n] == full[8:n], struct_size  # the fields it covers
        assert int.from_bytes(got[:8], "little") == struct_size  # struct_size kept
        assert got[size:struct_size] == bytes(max(0, struct_size - size))  # unknown: zeroed
        assert got[max(struct_size, n) :] == b"\xab" * (nbytes - max(struct_size, n))  # past it


def test_cache_bytes_at_the_bound() -> None:
    size = ffi.new("size_t*")
    assert LIB.snapmla_cache_bytes(6669204, MAX_PAGES, size) == SUCCESS
    assert size[0] == 6669204 * MAX_PAGES * PAGE_BYTES <= INT64_MAX
    assert LIB.snapmla_cache_bytes(6669205, MAX_PAGES, size) == INVALID
    assert LIB.snapmla_cache_bytes(1, 1, size) == SUCCESS and size[0] == PAGE_BYTES


# ================================================================= validation-only mode


def test_validation_only_mode_is_per_thread_and_returns_the_previous_setting() -> None:
    assert LIB.snapmla_set_validate_only(1) == 1  # this module turned it on
    seen = []
    thread = threading.Thread(target=lambda: seen.append(LIB.snapmla_set_validate_only(0)))
    thread.start()
    thread.join()
    assert seen == [0]  # off by default, in every other thread
    assert LIB.snapmla_set_validate_only(7) == 1 and LIB.snapmla_set_validate_only(1) == 1


@pytest.mark.parametrize(
    "overrides",
    [{"config.memory": 0}, {"config.device": -1}],
    ids=["library-memory", "current-device"],
)
def test_validation_only_cache_create_stops_before_cuda(overrides: dict[str, Any]) -> None:
    result = invoke("snapmla_cache_create", with_overrides("snapmla_cache_create", overrides))
    assert result.status == VALIDATED, result.message
    assert not result.wrote and not result.created


def test_zero_tokens_are_a_no_op_that_checks_little() -> None:
    # n = 0 returns before the pointers are looked at (documented), after cache and layer.
    for fn, nulls in (
        ("snapmla_append", ("c_kv", "k_pe", "slots")),
        ("snapmla_fetch_dequant", ("c_kv", "k_pe", "slots")),
        ("snapmla_quantize_q", ("q", "q_content", "q_rope", "q_scale")),
        ("snapmla_quantize_q2", ("q", "q_content", "q_rope", "q_scale", "q_lo", "q_lo_scale")),
    ):
        overrides: dict[str, Any] = {"num_tokens": 0, **{n: 0 for n in nulls}}
        assert invoke(fn, with_overrides(fn, overrides)).status == SUCCESS, fn
    overrides = {"num_tokens": 0, "layer": 5}
    assert invoke("snapmla_append", with_overrides("snapmla_append", overrides)).status == INVALID


def test_destroy_is_not_affected_by_validation_only_mode() -> None:
    handle = new_handle()
    assert LIB.snapmla_cache_destroy(ffi.cast("snapmla_cache_t", handle)) == SUCCESS
    assert LIB.snapmla_cache_destroy(ffi.NULL) == SUCCESS


def test_status_string_of_validated() -> None:
    assert ffi.string(LIB.snapmla_status_string(VALIDATED)).decode() == "SNAPMLA_VALIDATED"


# ============================================================================== handles


def test_handles_are_never_reused() -> None:
    handles = [new_handle() for _ in range(64)]
    assert len(set(handles)) == 64 and LIVE not in handles
    for handle in handles:
        assert LIB.snapmla_cache_destroy(ffi.cast("snapmla_cache_t", handle)) == SUCCESS
    later = [new_handle() for _ in range(64)]
    assert not set(later) & set(handles)
    info = ffi.new("snapmla_cache_info_t*", {"struct_size": _size("snapmla_cache_info_t")})
    for handle in handles:
        assert LIB.snapmla_cache_info(ffi.cast("snapmla_cache_t", handle), info) == INVALID
        assert LIB.snapmla_cache_destroy(ffi.cast("snapmla_cache_t", handle)) == INVALID
    for handle in later:
        assert LIB.snapmla_cache_destroy(ffi.cast("snapmla_cache_t", handle)) == SUCCESS


def test_handles_under_concurrent_create_use_and_destroy() -> None:
    errors: list[str] = []
    destroyed: list[int] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        info = ffi.new("snapmla_cache_info_t*", {"struct_size": _size("snapmla_cache_info_t")})
        for i in range(300):
            handle = new_handle(1 + (seed + i) % 3, 1 + i % 5)
            h = ffi.cast("snapmla_cache_t", handle)
            if LIB.snapmla_cache_info(h, info) != SUCCESS or info.num_pages != 1 + i % 5:
                errors.append(f"live handle refused: {last_error()}")
            with lock:
                stale = destroyed[-1] if destroyed else DESTROYED
            if LIB.snapmla_cache_info(ffi.cast("snapmla_cache_t", stale), info) != INVALID:
                errors.append("a destroyed handle was accepted")
            if LIB.snapmla_cache_destroy(h) != SUCCESS:
                errors.append(f"destroy refused: {last_error()}")
            with lock:
                destroyed.append(handle)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:5]
    assert len(set(destroyed)) == 8 * 300


# ============================================================= initializer macros (cc)


_INIT_PROGRAM = r"""
#include <snapmla/snapmla.h>
#include <stdio.h>
int main(void) {
  snapmla_cache_config_t cc = SNAPMLA_CACHE_CONFIG_INIT;
  snapmla_cache_info_t ci = SNAPMLA_CACHE_INFO_INIT;
  snapmla_decode_config_t dc = SNAPMLA_DECODE_CONFIG_INIT;
  snapmla_decode_args_t da = SNAPMLA_DECODE_ARGS_INIT;
  printf("%zu %d %d %d %d %d %zu\n", cc.struct_size, cc.num_layers, cc.num_pages, cc.page_size,
         cc.device, cc.memory == NULL, cc.memory_bytes);
  printf("%zu %d %d %zu %d\n", ci.struct_size, ci.data == NULL, ci.num_layers, ci.total_bytes,
         ci.owns_memory);
  printf("%zu %d %d %d %d %d %d %zu %zu\n", dc.struct_size, dc.batch_size, dc.q_len,
         dc.num_heads, dc.max_pages, dc.num_sm_parts, dc.q_precision, dc.plan_bytes,
         dc.workspace_bytes);
  printf("%zu %d %d %g %d %d %lld %lld %lld %d %lld %d %d %d\n", da.struct_size, da.layer,
         da.causal, (double)da.softmax_scale, da.kernel, da.q == NULL,
         (long long)da.q_stride_batch, (long long)da.q_stride_token, (long long)da.q_stride_head,
         da.block_table == NULL, (long long)da.block_table_stride, da.cache_seqlens == NULL,
         da.out == NULL, da.lse == NULL);
  printf("%d %lld %d\n", da.q_pe == NULL, (long long)da.q_pe_stride_head, da.out_dtype);
  return 0;
}
"""


@pytest.mark.parametrize("compiler", ["cc", "c++"])
def test_initializer_macros(tmp_path: Path, compiler: str) -> None:
    import shutil

    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    source = tmp_path / ("init.c" if compiler == "cc" else "init.cpp")
    source.write_text(_INIT_PROGRAM)
    exe = tmp_path / "init"
    flags = ["-std=c99", "-pedantic"] if compiler == "cc" else ["-std=c++11"]
    subprocess.run(
        [
            compiler,
            *flags,
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{ROOT / 'include'}",
            str(source),
            "-o",
            str(exe),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split(
        "\n"
    )
    sizes = [
        _size(t)
        for t in (
            "snapmla_cache_config_t",
            "snapmla_cache_info_t",
            "snapmla_decode_config_t",
            "snapmla_decode_args_t",
        )
    ]
    assert lines[0] == f"{sizes[0]} 0 0 0 -1 1 0"  # layers, pages to set; 64; current device
    assert lines[1] == f"{sizes[1]} 1 0 0 0"
    # q_len 1, num_sm_parts 0 (from the device), FP8, the buffers' sizes not checked
    assert lines[2] == f"{sizes[2]} 0 1 0 0 0 0 0 0"
    assert lines[3] == f"{sizes[3]} 0 1 0 0 1 0 0 0 1 0 1 1 1"  # causal, AUTO, no lse
    assert lines[4] == "1 0 0"  # no q_pe, BF16 out


# ================================================================================ fuzz


def _int(value: int, bits: int = 64) -> bool:
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


def span_ok(pointer: int, elem: int, inner: int, dims: list[tuple[int, int]]) -> bool:
    """check_span's rule: sum((count - 1) * stride) + inner elements of `elem` bytes, in int64;
    the last byte inside the 64-bit address space."""
    elems = inner
    for count, stride in dims:
        if count <= 1:
            continue
        term = (count - 1) * stride
        elems += term
        if not (_int(term) and _int(elems)):
            return False
    nbytes = elems * elem
    return _int(nbytes) and pointer + (nbytes - 1) % 2**64 < 2**64


def struct_ok(value: Any, min_size: int, optional: tuple[tuple[int, int], ...] = ()) -> bool:
    if not isinstance(value, Struct):
        return False  # NULL
    size = _size(value.ctype)
    struct_size = size if value.struct_size is None else value.struct_size
    if not min_size <= struct_size <= MAX_STRUCT:
        return False
    if any(offset < struct_size < offset + n for offset, n in optional):
        return False
    return not any(value.tail[: max(0, struct_size - size)])


def handle_ok(handle: int) -> bool:
    return handle == LIVE


Extent = tuple[int, int] | None  # bytes [first, last] of an argument; None: no bytes


def extent(pointer: int, elem: int, inner: int, dims: list[tuple[int, int]]) -> Extent:
    """C extent_of: the bytes from the first element to the last of a strided array."""
    elems = inner + sum((count - 1) * stride for count, stride in dims if count > 1)
    return None if pointer == 0 or elems <= 0 else (pointer, pointer + elems * elem - 1)


def overlap(x: Extent, y: Extent) -> bool:
    return x is not None and y is not None and x[0] <= y[1] and y[0] <= x[1]


# What a call on a layer of the live cache must not alias: all of it (one block).
LIVE_EXTENT = (CACHE_MEMORY, CACHE_MEMORY + CACHE_BYTES - 1)


def rows_apart(v: dict[str, Any], rows: int, inputs: list[Extent]) -> set[str]:
    """The outputs c_kv [rows, 512] and k_pe [rows, 64] apart from the inputs and each other
    (c_kv named for the pair)."""
    c_kv = extent(v["c_kv"], 2, 512, [(rows, v["c_kv_stride"])])
    k_pe = extent(v["k_pe"], 2, 64, [(rows, v["k_pe_stride"])])
    bad = set()
    if any(overlap(c_kv, x) for x in [*inputs, k_pe]):
        bad.add("c_kv")
    if any(overlap(k_pe, x) for x in inputs):
        bad.add("k_pe")
    return bad


def pointer_bad(v: dict[str, Any], name: str, align: int, key: str | None = None) -> bool:
    value = v[key or name]
    return value == 0 or value % align != 0


# num_sm_parts, q_precision (0.2), plan_bytes and workspace_bytes (0.4): (offset, size)
DECODE_CONFIG_OPTIONAL = ((24, 4), (28, 4), (32, 8), (40, 8))


def decode_config_violations(config: Any) -> tuple[set[str], dict[str, int] | None]:
    if not struct_ok(config, 24, DECODE_CONFIG_OPTIONAL):
        return {"config"}, None
    c = config.read_back()
    bad = set()
    if not 1 <= c["batch_size"] <= 65536:
        bad.add("config.batch_size")
    if not 1 <= c["q_len"] <= 4:
        bad.add("config.q_len")
    if not 1 <= c["num_heads"] <= 128:
        bad.add("config.num_heads")
    # The plan's cost line is int32: batch_size * (max_pages + kFixedCost) < 2^31.
    cost = c["batch_size"] * (c["max_pages"] + FIXED_COST)
    batch_ok = 1 <= c["batch_size"] <= 65536
    if not 1 <= c["max_pages"] <= MAX_PAGES or (batch_ok and cost >= 2**31):
        bad.add("config.max_pages")
    if not 0 <= c["num_sm_parts"] <= 65535:
        bad.add("config.num_sm_parts")
    if c["q_precision"] not in (0, 1):
        bad.add("config.q_precision")
    return bad, (None if bad else c)


def buffer_sizes(c: dict[str, int]) -> tuple[int, int]:
    config = ffi.new(
        "snapmla_decode_config_t*", {"struct_size": _size("snapmla_decode_config_t"), **c}
    )
    plan, workspace = ffi.new("size_t*"), ffi.new("size_t*")
    assert LIB.snapmla_decode_buffer_sizes(config, plan, workspace) == SUCCESS, last_error()
    return int(plan[0]), int(workspace[0])


def violations(fn: str, v: dict[str, Any]) -> tuple[set[str], int]:
    """(the arguments the header's rules find wrong, the status of an accepted call), written
    from the header independently of the C checks' order."""
    bad: set[str] = set()
    if fn == "snapmla_cache_bytes":
        if v["bytes"] == 0:
            bad.add("bytes")
        layers, pages = v["num_layers"], v["num_pages"]
        if layers < 1:
            bad.add("num_layers")
        if not 1 <= pages <= MAX_PAGES:
            bad.add("num_pages")
        if not bad & {"num_layers", "num_pages"} and layers * pages * PAGE_BYTES > INT64_MAX:
            bad.add("num_layers")
        return bad, SUCCESS
    if fn == "snapmla_cache_create":
        if v["cache"] == 0:
            bad.add("cache")
        layer_memory = ffi.offsetof("snapmla_cache_config_t", "layer_memory")
        page_stride = ffi.offsetof("snapmla_cache_config_t", "page_stride")
        if not struct_ok(v["config"], layer_memory, ((layer_memory, 8), (page_stride, 8))):
            return bad | {"config"}, SUCCESS
        c = v["config"].read_back()
        if c["page_size"] not in (0, 64):
            bad.add("config.page_size")
        layers, pages = c["num_layers"], c["num_pages"]
        if layers < 1:
            bad.add("config.num_layers")
        if not 1 <= pages <= MAX_PAGES:
            bad.add("config.num_pages")
        total = layers * pages * PAGE_BYTES
        if not bad & {"config.num_layers", "config.num_pages"} and total > INT64_MAX:
            bad.add("config.num_layers")
        if not -1 <= c["device"] <= 63:
            bad.add("config.device")
        if c["memory"]:
            if c["memory"] % 256:
                bad.add("config.memory")
            if c["memory_bytes"] < total:
                bad.add("config.memory_bytes")
            if c["memory_bytes"] == 0 or c["memory"] + c["memory_bytes"] - 1 >= 2**64:
                bad.add("config.memory_bytes")
        return bad, SUCCESS if c["memory"] and c["device"] >= 0 else VALIDATED
    if fn == "snapmla_cache_destroy":
        return (set() if v["cache"] in (0, LIVE) or v["cache"] in FRESH else {"cache"}), SUCCESS
    if fn == "snapmla_cache_info":
        if not handle_ok(v["cache"]):
            bad.add("cache")
        info = v["info"]
        if info == 0 or not 16 <= info.struct_size <= MAX_STRUCT:
            bad.add("info")
        return bad, SUCCESS
    if fn == "snapmla_gather_dequant":
        if not handle_ok(v["cache"]):
            bad.add("cache")
        elif not 0 <= v["layer"] < NUM_LAYERS:
            bad.add("layer")
        rows = v["num_rows"]
        if rows < 0:
            bad.add("num_rows")
        if rows <= 0:
            return bad, SUCCESS
        batch, pages = v["batch"], v["max_pages"]
        if not 1 <= batch <= 65536:
            return bad | {"batch"}, VALIDATED
        if not 1 <= pages <= MAX_PAGES:
            return bad | {"max_pages"}, VALIDATED
        stride = v["block_table_stride"]
        if pointer_bad(v, "block_table", 4):
            bad.add("block_table")
        if batch > 1 and stride < pages:
            bad.add("block_table_stride")
        if not span_ok(v["block_table"], 4, pages, [(batch, stride)]):
            bad |= {"block_table", "block_table_stride"}
        for name, align in (("seqlens", 4), ("out_rows", 8)):
            if pointer_bad(v, name, align) or not span_ok(v[name], align, batch, []):
                bad.add(name)
        for name, width in (("c_kv", 512), ("k_pe", 64)):
            if pointer_bad(v, name, 2):
                bad.add(name)
            if rows > 1 and v[f"{name}_stride"] < width:
                bad.add(f"{name}_stride")
            if not span_ok(v[name], 2, width, [(rows, v[f"{name}_stride"])]):
                bad |= {name, f"{name}_stride"}
        inputs = [
            LIVE_EXTENT,
            extent(v["block_table"], 4, pages, [(batch, stride)]),
            extent(v["seqlens"], 4, batch, []),
            extent(v["out_rows"], 8, batch, []),
        ]
        return bad | rows_apart(v, rows, inputs), VALIDATED
    if fn == "snapmla_copy_slots":
        if not handle_ok(v["cache"]):
            bad.add("cache")
        elif not 0 <= v["layer"] < NUM_LAYERS:
            bad.add("layer")
        n = v["num_tokens"]
        if n < 0:
            bad.add("num_tokens")
        if n <= 0:
            return bad, SUCCESS
        for name in ("src_slots", "dst_slots"):
            if pointer_bad(v, name, 8):
                bad.add(name)
            elif not span_ok(v[name], 8, 1, [(n, 1)]):
                bad |= {name, "num_tokens"}  # the count that makes the span too long
            if overlap(extent(v[name], 8, n, []), LIVE_EXTENT):
                bad.add(name)  # an input apart from the cache the call writes
        return bad, VALIDATED
    if fn == "snapmla_cache_layer_data":
        if not handle_ok(v["cache"]):
            bad.add("cache")
        elif not 0 <= v["layer"] < NUM_LAYERS:
            bad.add("layer")
        if v["data"] == 0:
            bad.add("data")
        return bad, SUCCESS
    if fn in ("snapmla_append", "snapmla_fetch_dequant"):
        if not handle_ok(v["cache"]):
            bad.add("cache")
        elif not 0 <= v["layer"] < NUM_LAYERS:
            bad.add("layer")
        n = v["num_tokens"]
        if n < 0:
            bad.add("num_tokens")
        if n == 0:
            return bad, SUCCESS
        for name, align in (("c_kv", 2), ("k_pe", 2), ("slots", 8)):
            if pointer_bad(v, name, align):
                bad.add(name)
        for name, width in (("c_kv", 512), ("k_pe", 64)):
            stride = v[f"{name}_stride"]
            if n > 1 and stride < width:
                bad.add(f"{name}_stride")
            if not span_ok(v[name], 2, width, [(n, stride)]):
                bad |= {name, f"{name}_stride"}
        if not span_ok(v["slots"], 8, 1, [(n, 1)]):
            bad |= {"slots", "num_tokens"}
        slots = extent(v["slots"], 8, n, [])
        if fn == "snapmla_fetch_dequant":
            return bad | rows_apart(v, n, [LIVE_EXTENT, slots]), VALIDATED
        # append: the inputs apart from the cache it writes
        for name, elem, width in (("c_kv", 2, 512), ("k_pe", 2, 64), ("slots", 8, 1)):
            dims = [(n, v[f"{name}_stride"])] if name != "slots" else [(n, 1)]
            if overlap(extent(v[name], elem, width, dims), LIVE_EXTENT):
                bad.add(name)
        return bad, VALIDATED
    if fn in ("snapmla_quantize_q", "snapmla_quantize_q2"):
        n, h = v["num_tokens"], v["num_heads"]
        if n < 0:
            bad.add("num_tokens")
        if not 1 <= h <= 1024:
            bad.add("num_heads")
        if n == 0 or bad:
            return bad, SUCCESS
        rows = n * h
        if not _int(rows):
            return bad | {"num_tokens"}, VALIDATED
        if pointer_bad(v, "q", 2):
            bad.add("q")
        st_, sh = v["q_stride_token"], v["q_stride_head"]
        if n > 1 and st_ < 576:
            bad.add("q_stride_token")
        if h > 1 and sh < 576:
            bad.add("q_stride_head")
        if not span_ok(v["q"], 2, 576, [(n, st_), (h, sh)]):
            bad |= {"q", "q_stride_token", "q_stride_head"}
        outputs = [("q_content", 8, 512, 1), ("q_rope", 16, 64, 2), ("q_scale", 4, 1, 4)]
        if fn.endswith("2"):
            outputs += [("q_lo", 8, 512, 1), ("q_lo_scale", 4, 1, 4)]
        for name, align, width, elem in outputs:
            if pointer_bad(v, name, align):
                bad.add(name)
            if not span_ok(v[name], elem, width, [(rows, width)]):
                bad |= {name, "num_tokens"}
        # The outputs apart from q and from each other (of a pair, the earlier one is named).
        spans = [extent(v["q"], 2, 576, [(n, st_), (h, sh)])]
        spans += [extent(v[name], elem, rows * width, []) for name, _, width, elem in outputs]
        for i, (name, *_) in enumerate(outputs):
            if any(overlap(spans[i + 1], x) for x in [spans[0], *spans[i + 2 :]]):
                bad.add(name)
        return bad, VALIDATED
    config_bad, c = decode_config_violations(v["config"])
    if c is None:
        return config_bad, SUCCESS
    parts = c["num_sm_parts"]
    sizes = buffer_sizes(c) if parts > 0 else None
    if fn == "snapmla_decode_buffer_sizes":
        bad = {n for n in ("plan_bytes", "workspace_bytes") if v[n] == 0}
        return bad, SUCCESS if parts > 0 else VALIDATED
    if fn == "snapmla_decode_select_kernel":
        if v["selected"] == 0:
            bad.add("selected")
        rows = c["q_len"] * c["num_heads"]
        if v["kernel"] not in (0, 1, 2) or (
            c["q_precision"] == 1 and rows > 32 and v["kernel"] != 1
        ):
            bad.add("kernel")
        return bad, SUCCESS
    b, s_q, h, max_pages = c["batch_size"], c["q_len"], c["num_heads"], c["max_pages"]
    if fn == "snapmla_decode_plan":
        if pointer_bad(v, "cache_seqlens", 4):
            bad.add("cache_seqlens")
        if not span_ok(v["cache_seqlens"], 4, b, []):
            bad.add("cache_seqlens")
        if pointer_bad(v, "plan", 16):
            bad.add("plan")
        if sizes and not span_ok(v["plan"], 1, sizes[0], []):
            bad.add("plan")
        if sizes and 0 < c["plan_bytes"] < sizes[0]:  # buffers sized for another config
            bad.add("plan")
        return bad, VALIDATED
    # snapmla_decode
    q_pe_at = ffi.offsetof("snapmla_decode_args_t", "q_pe")
    optional = tuple((q_pe_at + 8 * k, 8) for k in range(4))  # q_pe and its three strides
    optional += ((ffi.offsetof("snapmla_decode_args_t", "out_dtype"), 4),)
    if not struct_ok(v["args"], q_pe_at, optional):
        return {"args"}, VALIDATED
    a = v["args"].read_back()
    if not handle_ok(v["cache"]):
        bad.add("cache")
    elif not 0 <= a["layer"] < NUM_LAYERS:
        bad.add("args.layer")
    if not (math.isfinite(a["softmax_scale"]) and a["softmax_scale"] > 0):
        bad.add("args.softmax_scale")
    if not 0 <= a["kernel"] <= 2:
        bad.add("args.kernel")
    # The two-term query: the reference kernel, or AUTO / FAST (the seesaw kernel) where
    # q_len x heads <= 32.
    fast_two_term = a["kernel"] in (0, 2) and c["q_len"] * c["num_heads"] <= 32
    if c["q_precision"] == 1 and a["kernel"] != 1 and not fast_two_term:
        bad.add("args.kernel")
    if a["out_dtype"] not in (0, 1):
        bad.add("args.out_dtype")
    out_elem = 4 if a["out_dtype"] == 1 else 2  # (a refused out_dtype: any size is wrong anyway)
    if a["q"] == 0 or a["q"] % 2:
        bad.add("args.q")
    # q_pe given: q's rows are the 512 content elements, q_pe's the 64 RoPE ones
    q_pe = a.get("q_pe", 0)
    row = 512 if q_pe else 576
    dims = [(b, a["q_stride_batch"]), (s_q, a["q_stride_token"]), (h, a["q_stride_head"])]
    for (count, stride), name in zip(dims, ("q_stride_batch", "q_stride_token", "q_stride_head")):
        if count > 1 and stride < row:
            bad.add(f"args.{name}")
    if not span_ok(a["q"], 2, row, dims):
        bad |= {"args.q", "args.q_stride_batch", "args.q_stride_token", "args.q_stride_head"}
    pe_names = ("q_pe_stride_batch", "q_pe_stride_token", "q_pe_stride_head")
    pe_dims = [(b, a.get(pe_names[0], 0)), (s_q, a.get(pe_names[1], 0)), (h, a.get(pe_names[2], 0))]
    if q_pe:
        if q_pe % 2:
            bad.add("args.q_pe")
        for (count, stride), name in zip(pe_dims, pe_names):
            if count > 1 and stride < 64:
                bad.add(f"args.{name}")
        if not span_ok(q_pe, 2, 64, pe_dims):
            bad |= {"args.q_pe", *(f"args.{n}" for n in pe_names)}
    if a["block_table"] == 0 or a["block_table"] % 4:
        bad.add("args.block_table")
    if b > 1 and a["block_table_stride"] < max_pages:
        bad.add("args.block_table_stride")
    if not span_ok(a["block_table"], 4, max_pages, [(b, a["block_table_stride"])]):
        bad |= {"args.block_table", "args.block_table_stride"}
    for name, align, count, elem in (
        ("cache_seqlens", 4, b, 4),
        ("out", 16, b * s_q * h * 512, out_elem),
        ("lse", 4, b * h * s_q, 4),
    ):
        pointer = a[name]
        if name == "lse" and pointer == 0:
            continue
        if pointer == 0 or pointer % align or not span_ok(pointer, elem, count, []):
            bad.add(f"args.{name}")
    if pointer_bad(v, "plan", 16):
        bad.add("plan")
    if pointer_bad(v, "workspace", 256):
        bad.add("workspace")
    if sizes and not span_ok(v["plan"], 1, sizes[0], []):
        bad.add("plan")
    if sizes and not span_ok(v["workspace"], 1, sizes[1], []):
        bad.add("workspace")
    if sizes and 0 < c["plan_bytes"] < sizes[0]:  # buffers sized for another config
        bad.add("plan")
    if sizes and 0 < c["workspace_bytes"] < sizes[1]:
        bad.add("workspace")

    # The outputs apart from the inputs and each other (the C check_apart).
    inputs = [
        extent(a["q"], 2, row, dims),
        extent(q_pe, 2, 64, pe_dims),
        extent(a["block_table"], 4, max_pages, [(b, a["block_table_stride"])]),
        extent(a["cache_seqlens"], 4, b, []),
    ]
    inputs.insert(0, LIVE_EXTENT)
    out = extent(a["out"], out_elem, b * s_q * h * 512, [])
    lse = extent(a["lse"], 4, b * h * s_q, [])
    if any(overlap(out, x) for x in [*inputs, lse]):
        bad.add("args.out")
    if any(overlap(lse, x) for x in inputs):
        bad.add("args.lse")
    # The workspace apart from everything else, the plan from the outputs (0.2.x).
    if sizes:
        plan = extent(v["plan"], 1, sizes[0], [])
        workspace = extent(v["workspace"], 1, sizes[1], [])
        if any(overlap(workspace, x) for x in [*inputs, out, lse, plan]):
            bad.add("workspace")
        if overlap(out, plan):
            bad.add("args.out")
        if overlap(lse, plan):
            bad.add("args.lse")
    return bad, VALIDATED


FRESH: set[int] = set()  # live handles made for one destroy example


def check_example(fn: str, values: dict[str, Any]) -> None:
    expected, accepted = violations(fn, values)
    result = invoke(fn, values)
    FUZZ_COUNTS[fn] = FUZZ_COUNTS.get(fn, 0) + 1
    outcome = re.match(r"\w+: argument '([^']+)'", result.message) if result.message else None
    key = f"refused:{outcome.group(1)}" if result.status == INVALID and outcome else "accepted"
    outcomes = FUZZ_OUTCOMES.setdefault(fn, {})
    outcomes[key] = outcomes.get(key, 0) + 1
    assert result.status in (SUCCESS, INVALID, VALIDATED), (result.status, result.message)
    if expected:
        assert result.status == INVALID, (fn, expected, result.status, result.message)
        named = re.match(rf"{fn}: argument '([^']+)'", result.message)
        assert named, result.message
        assert named.group(1) in expected, (result.message, expected)
        assert not result.wrote, "a refused call wrote an output"
    else:
        assert result.status == accepted, (fn, result.status, result.message)


# --------------------------------------------------------------------------- strategies


def often(valid: Any, other: st.SearchStrategy[Any], percent: int = 85) -> st.SearchStrategy[Any]:
    """``valid`` (a value or a strategy) ``percent``% of the time, else ``other``: most examples
    pass most checks, so that every check is reached. Shrinks toward ``valid``."""
    valid = valid if isinstance(valid, st.SearchStrategy) else st.just(valid)
    return st.integers(0, 99).flatmap(lambda i: valid if i < percent else other)


ALIGNED = st.builds(dev, st.integers(1, 64))
POINTER = often(
    ALIGNED,
    st.one_of(
        st.just(0),
        st.builds(
            lambda k, o: dev(k) + o, st.integers(1, 64), st.sampled_from([1, 2, 4, 8, 12, 128])
        ),
        st.sampled_from([TOP - 1, TOP - 16, TOP - 256, TOP - 4096, TOP - 2**20, 1, 8, 256]),
        st.integers(0, 2**64 - 1),
    ),
    90,
)
# Pointers that often overlap each other or the live cache: a few buffers 0 .. 16 KiB apart,
# and addresses in and around the cache (64-byte aligned: every alignment rule holds).
SHARED = often(
    POINTER,
    st.one_of(
        st.builds(lambda k, o: dev(k) + 64 * o, st.integers(1, 2), st.integers(0, 256)),
        st.builds(lambda o: CACHE_MEMORY + 64 * o, st.integers(-256, CACHE_BYTES // 64 + 256)),
    ),
    60,
)
INT64 = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([-(2**63), -1, 0, 1, 2, 2**31, 2**45, 2**53, 2**61, 2**62, INT64_MAX]),
)
INT32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), -1, 0, INT32_MAX]))
COUNT = often(st.integers(0, 5), INT64, 80)  # numbers of tokens
SIZE_T = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63, 2**64 - 1]))


def row_stride(width: int) -> st.SearchStrategy[int]:
    return often(
        st.integers(width, 4 * width),
        st.one_of(st.sampled_from([width - 1, 0, -1, -width, 1]), INT64),
        80,
    )


def struct_size(ctype: str, min_size: int) -> st.SearchStrategy[int | None]:
    size = _size(ctype)
    return often(
        None,
        st.one_of(
            st.sampled_from(
                [
                    0,
                    8,
                    min_size - 1,
                    min_size,
                    min_size + 1,
                    size - 1,
                    size + 1,
                    size + 8,
                    MAX_STRUCT,
                    MAX_STRUCT + 1,
                    2**63,
                    2**64 - 1,
                ]
            ),
            st.integers(0, MAX_STRUCT + 64),
            SIZE_T,
        ),
    )


TAIL = often(b"", st.binary(max_size=48), 70)
HANDLE = often(
    LIVE,
    st.one_of(
        st.sampled_from([0, DESTROYED, LOOKALIKE, 0xDEADBEEF, LIVE + 1, LIVE ^ (1 << 60)]),
        st.integers(0, 2**64 - 1).filter(lambda x: x != LIVE),
    ),
    90,
)


def struct_arg(ctype: str, min_size: int, fields: st.SearchStrategy[dict[str, Any]]) -> Any:
    built = st.builds(
        lambda f, s, t: Struct(ctype, f, s, t), fields, struct_size(ctype, min_size), TAIL
    )
    return often(built, st.just(0), 95)


def _maybe_valid(valid: Any, anything: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return often(valid, anything, 85)


DECODE_CONFIG_FIELDS = st.fixed_dictionaries(
    {
        "batch_size": _maybe_valid(st.integers(1, 4), st.one_of(st.integers(1, 70000), INT32)),
        "q_len": _maybe_valid(st.integers(1, 4), st.one_of(st.integers(0, 5), INT32)),
        "num_heads": _maybe_valid(st.integers(1, 128), st.one_of(st.integers(0, 130), INT32)),
        "max_pages": _maybe_valid(st.integers(1, 64), st.one_of(st.integers(0, 2**25), INT32)),
        "num_sm_parts": _maybe_valid(st.integers(0, 200), st.one_of(st.integers(0, 66000), INT32)),
        "q_precision": often(0, st.one_of(st.integers(-1, 2), INT32), 80),
    }
)
# The config the buffers were sized for, against the call's: the fields the sizes depend on
# (precision, heads, q_len, part count, batch), each changed or kept.
SIZED_FOR_CHANGES = {
    "q_precision": st.integers(0, 1),
    "num_heads": st.integers(1, 128),
    "q_len": st.integers(1, 4),
    "num_sm_parts": st.integers(1, 200),
    "batch_size": st.integers(1, 4),
}


@st.composite
def decode_config_fields(draw: Any) -> dict[str, Any]:
    """DECODE_CONFIG_FIELDS with config.plan_bytes and workspace_bytes (0.4): unset (0), the
    sizes of buffers made for a config that differs from the call's in some of the fields the
    sizes depend on (or not at all), or any size."""
    fields = draw(DECODE_CONFIG_FIELDS)
    mode = draw(st.sampled_from(["unset", "mixed", "mixed", "mixed", "any"]))
    if mode == "mixed":
        sized_for = dict(fields)
        for name, values in SIZED_FOR_CHANGES.items():
            if draw(st.integers(0, 2)) == 0:
                sized_for[name] = draw(values)
        made = Struct("snapmla_decode_config_t", sized_for)
        bad, _ = decode_config_violations(made)
        if not bad and sized_for["num_sm_parts"] > 0:
            plan_bytes, workspace_bytes = buffer_sizes(sized_for)
            fields["plan_bytes"] = draw(often(plan_bytes, st.just(0), 85))
            fields["workspace_bytes"] = draw(often(workspace_bytes, st.just(0), 85))
    elif mode == "any":
        fields["plan_bytes"] = draw(st.one_of(st.integers(0, 2**12), SIZE_T))
        fields["workspace_bytes"] = draw(st.one_of(st.integers(0, 2**24), SIZE_T))
    return fields


DECODE_CONFIG = struct_arg("snapmla_decode_config_t", 24, decode_config_fields())
DECODE_ARGS = struct_arg(
    "snapmla_decode_args_t",
    _size("snapmla_decode_args_t"),
    st.fixed_dictionaries(
        {
            "layer": _maybe_valid(st.integers(0, 1), INT32),
            "causal": INT32,
            "softmax_scale": _maybe_valid(st.floats(1e-3, 10.0), st.floats(width=32)),
            "kernel": _maybe_valid(st.integers(0, 2), st.one_of(st.integers(-1, 3), INT32)),
            "q": POINTER,
            "q_stride_batch": row_stride(576 * 128 * 4),
            "q_stride_token": row_stride(576 * 128),
            "q_stride_head": row_stride(576),
            "block_table": POINTER,
            "block_table_stride": row_stride(64),
            "cache_seqlens": POINTER,
            "out": POINTER,
            "lse": often(POINTER, st.just(0), 80),
            # q_nope and q_pe apart (0.2) in a third of the calls; the strides are read only then
            "q_pe": often(st.just(0), POINTER, 67),
            "q_pe_stride_batch": row_stride(64 * 128 * 4),
            "q_pe_stride_token": row_stride(64 * 128),
            "q_pe_stride_head": row_stride(64),
            # BF16 out mostly, fp32 (0.2) in a fifth of the calls, now and then a bad value
            "out_dtype": often(
                st.sampled_from([0, 0, 0, 0, 1]), st.one_of(st.integers(-1, 2), INT32)
            ),
        }
    ),
)
CACHE_CONFIG = struct_arg(
    "snapmla_cache_config_t",
    _size("snapmla_cache_config_t"),
    st.fixed_dictionaries(
        {
            "num_layers": _maybe_valid(NUM_LAYERS, st.one_of(st.integers(0, 9), INT32)),
            "num_pages": _maybe_valid(NUM_PAGES, st.one_of(st.integers(0, 9), INT32)),
            "page_size": _maybe_valid(st.sampled_from([0, 64]), INT32),
            "device": _maybe_valid(st.integers(-1, 63), st.one_of(st.integers(-2, 64), INT32)),
            "memory": often(st.one_of(st.just(CACHE_MEMORY), st.just(0)), POINTER),
            "memory_bytes": often(st.integers(CACHE_BYTES - 8, 2 * CACHE_BYTES), SIZE_T, 70),
        }
    ),
)
STREAM = often(0, st.integers(0, 2**64 - 1), 50)
OUT_SIZE = often(Out("size_t*"), st.just(0), 90)

STRATEGIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "snapmla_cache_bytes": st.fixed_dictionaries(
        {
            "num_layers": st.one_of(st.integers(-2, 100), INT32),
            "num_pages": st.one_of(st.integers(-2, 100), INT32),
            "bytes": OUT_SIZE,
        }
    ),
    "snapmla_cache_create": st.fixed_dictionaries(
        {
            "config": CACHE_CONFIG,
            "cache": often(Out("snapmla_cache_t*"), st.just(0), 90),
        }
    ),
    # Never LIVE (the other tests' cache): a fresh handle, NULL, or one that is not live.
    "snapmla_cache_destroy": st.fixed_dictionaries(
        {"cache": often("fresh", HANDLE.filter(lambda h: h != LIVE), 50)}
    ),
    "snapmla_cache_info": st.fixed_dictionaries(
        {
            "cache": HANDLE,
            "info": often(
                st.builds(
                    lambda s: Out("snapmla_cache_info_t*", MAX_STRUCT + 64, s),
                    often(st.integers(16, MAX_STRUCT), st.one_of(st.integers(0, 20), SIZE_T)),
                ),
                st.just(0),
                90,
            ),
        }
    ),
    "snapmla_copy_slots": st.fixed_dictionaries(
        {
            "cache": HANDLE,
            "layer": _maybe_valid(st.integers(0, 1), st.one_of(st.integers(-1, 2), INT32)),
            "src_slots": SHARED,
            "dst_slots": SHARED,
            "num_tokens": COUNT,
            "stream": st.just(0),
        }
    ),
    "snapmla_cache_layer_data": st.fixed_dictionaries(
        {
            "cache": HANDLE,
            "layer": _maybe_valid(st.integers(0, 1), st.one_of(st.integers(-1, 2), INT32)),
            "data": often(Out("void**"), st.just(0), 90),
        }
    ),
    "snapmla_append": st.fixed_dictionaries(
        {
            "cache": HANDLE,
            "layer": _maybe_valid(st.integers(0, 1), st.one_of(st.integers(-1, 2), INT32)),
            "c_kv": SHARED,
            "c_kv_stride": row_stride(512),
            "k_pe": SHARED,
            "k_pe_stride": row_stride(64),
            "slots": SHARED,
            "num_tokens": COUNT,
            "stream": STREAM,
        }
    ),
    "snapmla_fetch_dequant": st.fixed_dictionaries(
        {
            "cache": HANDLE,
            "layer": _maybe_valid(st.integers(0, 1), st.one_of(st.integers(-1, 2), INT32)),
            "slots": SHARED,
            "num_tokens": COUNT,
            "c_kv": SHARED,
            "c_kv_stride": row_stride(512),
            "k_pe": SHARED,
            "k_pe_stride": row_stride(64),
            "stream": STREAM,
        }
    ),
    "snapmla_quantize_q": st.fixed_dictionaries(
        {
            "q": SHARED,
            "num_tokens": COUNT,
            "num_heads": _maybe_valid(st.integers(1, 1024), st.one_of(st.integers(0, 1025), INT32)),
            "q_stride_token": row_stride(576),
            "q_stride_head": row_stride(576),
            "q_content": SHARED,
            "q_rope": SHARED,
            "q_scale": SHARED,
            "stream": STREAM,
        }
    ),
    "snapmla_quantize_q2": st.fixed_dictionaries(
        {
            "q": SHARED,
            "num_tokens": COUNT,
            "num_heads": _maybe_valid(st.integers(1, 1024), st.one_of(st.integers(0, 1025), INT32)),
            "q_stride_token": row_stride(576),
            "q_stride_head": row_stride(576),
            "q_content": SHARED,
            "q_rope": SHARED,
            "q_scale": SHARED,
            "q_lo": SHARED,
            "q_lo_scale": SHARED,
            "stream": STREAM,
        }
    ),
    "snapmla_decode_buffer_sizes": st.fixed_dictionaries(
        {
            "config": DECODE_CONFIG,
            "plan_bytes": OUT_SIZE,
            "workspace_bytes": OUT_SIZE,
        }
    ),
    "snapmla_decode_select_kernel": st.fixed_dictionaries(
        {
            "config": DECODE_CONFIG,
            "kernel": _maybe_valid(st.integers(0, 2), st.one_of(st.integers(-1, 3), INT32)),
            "selected": often(Out("int32_t*"), st.just(0), 90),
        }
    ),
    "snapmla_gather_dequant": st.fixed_dictionaries(
        {
            "cache": HANDLE,
            "layer": _maybe_valid(st.integers(0, 1), st.one_of(st.integers(-1, 2), INT32)),
            "block_table": SHARED,
            "block_table_stride": row_stride(8),
            "batch": _maybe_valid(st.integers(1, 4), INT32),
            "max_pages": _maybe_valid(st.integers(1, 8), INT32),
            "seqlens": SHARED,
            "out_rows": SHARED,
            "num_rows": COUNT,
            "c_kv": SHARED,
            "c_kv_stride": row_stride(512),
            "k_pe": SHARED,
            "k_pe_stride": row_stride(64),
            "stream": STREAM,
        }
    ),
    "snapmla_decode_plan": st.fixed_dictionaries(
        {"config": DECODE_CONFIG, "cache_seqlens": POINTER, "plan": POINTER, "stream": STREAM}
    ),
    "snapmla_decode": st.fixed_dictionaries(
        {
            "cache": HANDLE,
            "config": DECODE_CONFIG,
            "args": DECODE_ARGS,
            "plan": POINTER,
            "workspace": POINTER,
            "stream": STREAM,
        }
    ),
}


@pytest.mark.parametrize("fn", sorted(PARAMS))
def test_fuzz(fn: str) -> None:
    """Random arguments: never a crash, every refusal names an argument the model finds wrong,
    every accepted call is one the model accepts."""

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(values=STRATEGIES[fn])
    def run(values: dict[str, Any]) -> None:
        if values.get("cache") == "fresh":
            values = dict(values, cache=new_handle())
            FRESH.add(values["cache"])
        check_example(fn, values)

    run()


def test_fuzz_counts() -> None:
    # Runs after the fuzz tests in file order; reports what they ran (also in -k subsets).
    if os.environ.get("SNAPMLA_FUZZ_OUTCOMES"):
        for fn, outcomes in sorted(FUZZ_OUTCOMES.items()):
            print(f"\n{fn}: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    if FUZZ_COUNTS:
        print(
            "\nC API fuzz examples: "
            + ", ".join(f"{k.removeprefix('snapmla_')} {v}" for k, v in sorted(FUZZ_COUNTS.items()))
            + f"; total {sum(FUZZ_COUNTS.values())}"
        )


def test_per_layer_cache_addresses_each_layer_at_its_own_pointer() -> None:
    """config.layer_memory (0.2): the handle keeps a copy of the array; snapmla_cache_layer_data
    and the launches address layer l at layer_memory[l]; snapmla_cache_info says so. A 0.1
    caller's struct_size (no layer_memory field) still makes a contiguous cache."""
    layer_bytes = NUM_PAGES * PAGE_BYTES
    addresses = (dev(40), dev(30))  # layer 1 below layer 0: any order
    array = ffi.new("void*[]", [ffi.cast("void*", a) for a in addresses])
    config = ffi.new(
        "snapmla_cache_config_t*",
        {
            "struct_size": ffi.sizeof("snapmla_cache_config_t"),
            "num_layers": NUM_LAYERS,
            "num_pages": NUM_PAGES,
            "device": 0,
            "layer_memory": array,
        },
    )
    handle = ffi.new("snapmla_cache_t*")
    assert LIB.snapmla_cache_create(config, handle) == SUCCESS, last_error()
    try:
        array[0] = ffi.cast("void*", dev(50))  # copied at creation: later changes do not matter
        data = ffi.new("void**")
        for layer, address in enumerate(addresses):
            assert LIB.snapmla_cache_layer_data(handle[0], layer, data) == SUCCESS, last_error()
            assert int(ffi.cast("uintptr_t", data[0])) == address
        info = ffi.new("snapmla_cache_info_t*")
        info.struct_size = ffi.sizeof("snapmla_cache_info_t")
        assert LIB.snapmla_cache_info(handle[0], info) == SUCCESS, last_error()
        assert info.per_layer_memory == 1 and info.owns_memory == 0
        assert int(ffi.cast("uintptr_t", info.data)) == addresses[0]
        assert info.layer_bytes == layer_bytes and info.total_bytes == NUM_LAYERS * layer_bytes
    finally:
        assert LIB.snapmla_cache_destroy(handle[0]) == SUCCESS
    # The 0.1 layout: struct_size up to memory_bytes, the bytes after it not read.
    old = ffi.new(
        "snapmla_cache_config_t*",
        {
            "struct_size": ffi.offsetof("snapmla_cache_config_t", "layer_memory"),
            "num_layers": NUM_LAYERS,
            "num_pages": NUM_PAGES,
            "device": 0,
            "memory": ffi.cast("void*", CACHE_MEMORY),
            "memory_bytes": CACHE_BYTES,
            "layer_memory": ffi.cast("void* const*", 0x1234),  # past struct_size: ignored
        },
    )
    assert LIB.snapmla_cache_create(old, handle) == SUCCESS, last_error()
    data = ffi.new("void**")
    assert LIB.snapmla_cache_layer_data(handle[0], 1, data) == SUCCESS
    assert int(ffi.cast("uintptr_t", data[0])) == CACHE_MEMORY + layer_bytes
    assert LIB.snapmla_cache_destroy(handle[0]) == SUCCESS
