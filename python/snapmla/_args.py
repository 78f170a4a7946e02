"""The argument layer both front-ends share: ``snapmla.decode`` / ``snapmla.KVCache`` (DLPack
tensors) and ``snapmla.torch`` (torch tensors) check their scalar arguments here and pack the
C structs of a decode step here.

A bound is checked in Python only where the C library cannot see the value (not an integer,
or past what its ``int32_t`` takes), or where refusing it here names the caller's argument
before anything is allocated; each such bound is stated once, below. The C library checks
everything else, and ``_lib.check`` turns its refusal into a ``SnapMLAError`` naming the
argument.
"""

from __future__ import annotations

import operator
import struct
from typing import Any

from . import _lib
from ._errors import argument_error
from ._lib import MAX_HEADS, MAX_Q_LEN, PAGE_BYTES, PAGE_SIZE

__all__ = [
    "INT32_MAX",
    "KERNELS",
    "MAX_BATCH",
    "MAX_DEVICE",
    "MAX_PAGES",
    "MAX_SM_PARTS",
    "OUT_DTYPES",
    "PAGE_STRIDES",
    "PLANE_ALIGNMENT",
    "Q_PRECISIONS",
    "check_batch",
    "check_config",
    "check_int",
    "decode_config",
    "kernel_code",
    "pack_decode_args",
    "page_stride_ok",
    "q_precision_code",
]

INT32_MAX = 2**31 - 1
# The C library's bounds: pages of a layer (its token slots, pages * 64, fit int32), requests
# of a decode step, split-KV parts, device ordinals, and page strides (TMA: below 2^40).
MAX_PAGES = INT32_MAX // PAGE_SIZE
MAX_BATCH = 65536
MAX_SM_PARTS = 65535
MAX_DEVICE = 63
MAX_PAGE_STRIDE = 2**40
# A page's planes are 128-byte aligned: page strides and each layer's own memory are too.
PLANE_ALIGNMENT = 128
# The page strides the C library takes (page_stride_ok), as messages state them.
PAGE_STRIDES = f"{PAGE_BYTES} (packed) or a larger multiple of {PLANE_ALIGNMENT} below 2^40"

# decode(kernel=...) names -> snapmla_decode_kernel_t.
KERNELS = {"auto": 0, "reference": 1, "fast": 2}
# decode(out_dtype=...) names -> snapmla_out_dtype_t.
OUT_DTYPES = {"bfloat16": 0, "float32": 1}
# DecodePlan(q_precision=...) and quantize_q(precision=...) names -> snapmla_q_precision_t:
# "fp8", the contract's one FP8 row per query; "fp8x2", the two-term query (a second FP8 row
# on the first's rounding residual at scale s1 / 16; snapmla.reference.quantize_q2).
Q_PRECISIONS = {"fp8": 0, "fp8x2": 1}


def check_int(value: Any, op: str, argument: str, low: int, high: int | None = None) -> int:
    """``value`` as an ``int`` in ``[low, high]`` (``high=None``: no upper bound), else refuse."""
    if type(value) is int:  # the common case; bool is a subclass, never this type
        if low <= value and (high is None or value <= high):
            return value
        number = value
    else:
        if isinstance(value, bool):
            raise argument_error(op, argument, _int_expected(low, high), repr(value))
        try:
            number = operator.index(value)
        except TypeError:
            raise argument_error(
                op, argument, _int_expected(low, high), f"{type(value).__name__} {value!r}"
            ) from None
        if low <= number and (high is None or number <= high):
            return number
    raise argument_error(op, argument, _int_expected(low, high), str(number))


def _int_expected(low: int, high: int | None) -> str:
    return f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"


def check_config(
    op: str, num_heads: Any, q_len: Any, max_pages: Any, num_sm_parts: Any
) -> tuple[int, int, int, int]:
    """The decode config's integers, named as the caller named them, before a plan is sized or
    allocated (the C library also checks them, naming the config's fields)."""
    return (
        check_int(num_heads, op, "num_heads", 1, MAX_HEADS),
        check_int(q_len, op, "q_len", 1, MAX_Q_LEN),
        check_int(max_pages, op, "max_pages", 1, MAX_PAGES),
        check_int(num_sm_parts, op, "num_sm_parts", 0, MAX_SM_PARTS),
    )


def check_batch(op: str, argument: str, batch: int) -> None:
    """A step's request count, the length of ``argument`` (a ``cache_seqlens`` tensor)."""
    if not 1 <= batch <= MAX_BATCH:
        raise argument_error(op, argument, f"shape [b] with b in 1..{MAX_BATCH}", f"[{batch}]")


def kernel_code(op: str, kernel: Any) -> int:
    """The ``snapmla_decode_kernel_t`` of a kernel name."""
    code = KERNELS.get(kernel) if type(kernel) is str else None
    if code is None:
        raise argument_error(
            op, "kernel", "one of " + ", ".join(repr(k) for k in KERNELS), repr(kernel)
        )
    return code


def q_precision_code(op: str, argument: str, precision: Any) -> int:
    """The ``snapmla_q_precision_t`` of a query precision name."""
    code = Q_PRECISIONS.get(precision) if type(precision) is str else None
    if code is None:
        raise argument_error(
            op, argument, " or ".join(repr(k) for k in Q_PRECISIONS), repr(precision)
        )
    return code


def page_stride_ok(stride: int) -> bool:
    """A page stride the C library takes (``PAGE_STRIDES``)."""
    return stride == PAGE_BYTES or (
        PAGE_BYTES < stride < MAX_PAGE_STRIDE and stride % PLANE_ALIGNMENT == 0
    )


# ------------------------------------------------------------------------- C structs

_configs: dict[tuple[int, ...], Any] = {}
_CONFIGS_SIZE = 4096
# snapmla_decode_config_t's fields, in decode_config's argument order.
_CONFIG_FIELDS = (
    "batch_size",
    "q_len",
    "num_heads",
    "max_pages",
    "num_sm_parts",
    "q_precision",
    "plan_bytes",
    "workspace_bytes",
)
_ZEROS = (0,) * len(_CONFIG_FIELDS)


def decode_config(*fields: int) -> Any:
    """A ``snapmla_decode_config_t*`` of ``fields`` in ``_CONFIG_FIELDS`` order (batch_size,
    q_len, num_heads, max_pages, num_sm_parts, then q_precision, plan_bytes and
    workspace_bytes, 0 where left out), built once per config and kept: read-only (the C calls
    only read it). ``q_precision``: snapmla_q_precision_t. ``plan_bytes``, ``workspace_bytes``:
    the sizes of the buffers the calls with this config pass (0: unchecked), which the library
    compares with what the config needs (``snapmla_decode_buffer_sizes`` ignores them)."""
    key = fields + _ZEROS[len(fields) :]
    config = _configs.get(key)
    if config is None:
        config = _lib.new_struct("snapmla_decode_config_t", **dict(zip(_CONFIG_FIELDS, key)))
        if len(_configs) >= _CONFIGS_SIZE:
            _configs.clear()
        _configs[key] = config
    return config


# snapmla_decode_args_t written in one pack_into: native byte order, no padding between the
# fields (the offsets are checked against cffi's layout of the struct at import).
_ARGS_FIELDS = (
    ("struct_size", "Q"),
    ("layer", "i"),
    ("causal", "i"),
    ("softmax_scale", "f"),
    ("kernel", "i"),
    ("q", "Q"),
    ("q_stride_batch", "q"),
    ("q_stride_token", "q"),
    ("q_stride_head", "q"),
    ("block_table", "Q"),
    ("block_table_stride", "q"),
    ("cache_seqlens", "Q"),
    ("out", "Q"),
    ("lse", "Q"),
    ("q_pe", "Q"),
    ("q_pe_stride_batch", "q"),
    ("q_pe_stride_token", "q"),
    ("q_pe_stride_head", "q"),
    ("out_dtype", "i"),
)
_ARGS_PACKED = "=" + "".join(code for _, code in _ARGS_FIELDS)
_ARGS_T = _lib.ffi.typeof("snapmla_decode_args_t*")
_ARGS_SIZE = _lib.ffi.sizeof("snapmla_decode_args_t")
# The struct's tail padding (to its 8-byte alignment) as pad bytes.
_ARGS = struct.Struct(_ARGS_PACKED + f"{_ARGS_SIZE - struct.calcsize(_ARGS_PACKED)}x")
_U64 = 2**64 - 1  # pointers wrap as ffi.cast wraps them


def _check_args_layout() -> None:
    offset = 0
    for name, code in _ARGS_FIELDS:
        if _lib.ffi.offsetof("snapmla_decode_args_t", name) != offset:
            raise ImportError(f"snapmla: unexpected layout of snapmla_decode_args_t.{name}")
        offset += struct.calcsize("=" + code)
    if not 0 <= _ARGS_SIZE - offset < 8:
        raise ImportError("snapmla: unexpected size of snapmla_decode_args_t")


_check_args_layout()


def pack_decode_args(
    layer: int,
    causal: bool,
    softmax_scale: float,
    kernel: int,
    q_ptr: int,
    q_strides: tuple[int, int, int],
    block_table_ptr: int,
    block_table_stride: int,
    seqlens_ptr: int,
    out_ptr: int,
    lse_ptr: int,
    q_pe_ptr: int = 0,
    q_pe_strides: tuple[int, int, int] = (0, 0, 0),
    out_dtype: int = 0,
) -> Any:
    """A ``snapmla_decode_args_t*`` of checked values; pointers wrap to 64 bits as
    ``ffi.cast`` wraps them. ``out_dtype``: snapmla_out_dtype_t."""
    ffi = _lib.ffi
    args = ffi.new(_ARGS_T)
    _ARGS.pack_into(
        ffi.buffer(args),
        0,
        _ARGS_SIZE,
        layer,
        int(causal),
        softmax_scale,
        kernel,
        q_ptr & _U64,
        *q_strides,
        block_table_ptr & _U64,
        block_table_stride,
        seqlens_ptr & _U64,
        out_ptr & _U64,
        lse_ptr & _U64,
        q_pe_ptr & _U64,
        *q_pe_strides,
        out_dtype,
    )
    return args
