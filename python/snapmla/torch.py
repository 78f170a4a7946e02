"""PyTorch custom ops over snapmla's C API: ``torch.library`` ops that ``torch.compile``
(``fullgraph=True``) traces and CUDA graphs capture, on memory PyTorch allocates.

Everything here takes and returns ``torch.Tensor`` and runs on PyTorch's current stream of the
tensors' device (inside ``torch.cuda.graph(...)``: the capture stream). Tensors are read by
their attributes (no DLPack, no stream handshake); each argument's dtype, shape, layout and
device are checked here, and the C library checks the rest (ranges, strides, alignment), so
a bad argument raises ``snapmla.SnapMLAError`` naming it and nothing is written.

    import torch, snapmla.torch as smt

    cache = smt.empty_cache(num_layers, num_pages, device="cuda")  # uint8 [L, P, 41216]
    plan, workspace = smt.decode_buffers(max_batch, num_heads=128, max_pages=max_pages,
                                         device="cuda")             # sized once, any batch <= max
    smt.append(cache, layer, c_kv, k_pe, slots)                      # torch.ops.snapmla.append
    smt.plan(plan, cache_seqlens, num_heads=128, max_pages=max_pages)  # once per step
    out, lse = smt.decode(cache, layer, q, block_table, cache_seqlens, plan, workspace,
                          softmax_scale=192 ** -0.5)

The ops (``torch.ops.snapmla.*``, schemas with exact ``mutates_args`` and fake
implementations): ``append`` (mutates ``cache``), ``fetch_dequant`` (``c_kv``, ``k_pe``),
``quantize_q`` (its three outputs), ``plan`` (``plan``), ``decode`` (``workspace``, ``out``,
``lse``). The functions of this module allocate missing outputs and call them.

The two-term query (``snapmla.DecodePlan``'s ``q_precision="fp8x2"``): pass
``q_precision="fp8x2"`` to ``decode_buffers``, ``plan`` and ``decode`` alike (the buffers are
sized for it, the plan records it; a plan of another precision gives NaN rows).

The cache tensor is the cache: the C handle over its memory is made on first use and kept,
keyed by (address, layers, pages, device, page stride); ``release(cache)`` drops it. An
engine that holds one tensor per layer passes each as a one-layer cache (``view(1, num_pages,
41216)``, layer 0). A plan and workspace sized for a batch serve every smaller batch (the
buffer sizes grow with the batch), so a graph captured at a padded batch stays valid.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

from . import _args, _lib
from ._errors import argument_error
from ._lib import CONTENT_DIM, HEAD_DIM, PAGE_BYTES, ROPE_DIM

__all__ = [
    "append",
    "decode",
    "decode_buffers",
    "empty_cache",
    "fetch_dequant",
    "plan",
    "quantize_q",
    "release",
]

Tensor = torch.Tensor
# decode's out dtypes: snapmla_out_dtype_t BF16 and FP32 (_args.OUT_DTYPES).
_OUT_DTYPES = (torch.bfloat16, torch.float32)

# --------------------------------------------------------------- eager calls, direct
# The public functions below call an op's implementation directly where torch's dispatcher
# would only pass the call on to it: the dispatcher's Python-kernel round trip costs more host
# time than the memo-hit call itself. Through
# torch.ops.snapmla.* wherever something may need to see the op: while torch.compile traces
# (Dynamo records the op), under any TorchDispatchMode (FakeTensorMode, functionalization,
# debug modes), while the profiler records (it names the op), for any tensor that is not a
# plain torch.Tensor (a subclass may dispatch), and for an integer argument that is not a
# plain int (the schema's conversion and refusal apply). Calls of torch.ops.snapmla.*
# themselves always dispatch.
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_profiling = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
# (a torch without one of them: every call dispatches)
_CAN_SKIP_DISPATCH = None not in (_is_compiling, _dispatch_modes, _profiling)


def _eager(*tensors: Any, ints: tuple[Any, ...] = ()) -> bool:
    """Whether an op on ``tensors`` and the integer arguments ``ints`` may run its
    implementation directly (above)."""
    if not _CAN_SKIP_DISPATCH or _is_compiling() or _dispatch_modes() or _profiling():
        return False
    for t in tensors:
        if type(t) is not Tensor:
            return False
    for i in ints:
        if type(i) is not int:
            return False
    return True


# ----------------------------------------------------------------------------- checks


def _describe(t: Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} {list(t.shape)} on {t.device}"


def _check(
    op: str,
    name: str,
    t: Any,
    dtypes: tuple[torch.dtype, ...],
    shape: tuple[int | None, ...],
    *,
    contiguous: bool = False,
    inner: bool = False,
    device: torch.device | None = None,
) -> None:
    """``t`` is a CUDA tensor of one of ``dtypes`` and ``shape`` (``None``: any size), on
    ``device`` if given; ``contiguous``: compact row-major; ``inner``: unit last stride."""
    # The common case in a few C-level comparisons (host overhead).
    if (
        isinstance(t, Tensor)
        and t.dtype in dtypes
        and t.is_cuda
        and (t.shape == shape if None not in shape else _shape_ok(t.shape, shape))
        and (device is None or t.device == device)
        and (not contiguous or t.is_contiguous())
        and (not inner or t.dim() == 0 or t.size(-1) <= 1 or t.stride(-1) == 1)
    ):
        return
    if not isinstance(t, Tensor):
        raise argument_error(op, name, "a torch.Tensor", type(t).__name__)
    want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
    dims = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
    if t.dtype not in dtypes or not _shape_ok(t.shape, shape):
        raise argument_error(op, name, f"{want} {dims}", _describe(t))
    if t.device.type != "cuda":
        raise argument_error(op, name, "a CUDA tensor", _describe(t))
    if device is not None and t.device != device:
        raise argument_error(op, name, f"a tensor on {device}", _describe(t))
    if contiguous and not t.is_contiguous():
        raise argument_error(op, name, "a contiguous tensor", f"strides {list(t.stride())}")
    raise argument_error(
        op, name, "unit stride in the last dimension", f"strides {list(t.stride())}"
    )


def _shape_ok(got: Any, want: tuple[int | None, ...]) -> bool:
    return len(got) == len(want) and all(w is None or w == g for w, g in zip(want, got))


def _span(t: Tensor) -> tuple[int, int]:
    """[first, last + 1) bytes ``t`` can touch (empty for an empty tensor)."""
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    if t.is_contiguous():
        return (start, start + t.nbytes)
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return (start, start + (last + 1) * t.element_size())


def _no_overlap(op: str, outputs: dict[str, Tensor], inputs: dict[str, Tensor]) -> None:
    """No output shares bytes with an input or with another output."""
    spans = {name: _span(t) for name, t in {**inputs, **outputs}.items()}
    for out_name in outputs:
        s0, e0 = spans[out_name]
        for other, (s1, e1) in spans.items():
            if other != out_name and s0 < e1 and s1 < e0:
                raise argument_error(
                    op, out_name, f"no bytes in common with '{other}'", "overlapping memory"
                )


# ------------------------------------------------------------------ device and stream

_get_device = getattr(torch._C, "_cuda_getDevice", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_device() -> int:
    return _get_device() if _get_device is not None else torch.cuda.current_device()


def _stream_of(index: int) -> Any:
    """PyTorch's current stream on device ``index``, as the C calls take it (``_lib.stream_t``
    keeps the cffi values by handle)."""
    if _raw_stream is not None:
        return _lib.stream_t(int(_raw_stream(index)))
    return _lib.stream_t(int(torch.cuda.current_stream(index).cuda_stream))


def _stream(device: torch.device) -> Any:
    """PyTorch's current stream on ``device``, as the C calls take it."""
    return _stream_of(device.index if device.index is not None else _current_device())


# _on_device's context where the device is current already (reusable: it holds nothing)
_NOTHING = contextlib.nullcontext()


def _on_device(index: int | None) -> Any:
    """A context making device ``index`` current for the body where it is not (the C library
    refuses a call whose cache lives on another device than the current one); nothing to enter
    where it is current already, or for ``None`` (the current device)."""
    if index is None or _current_device() == index:
        return _NOTHING
    return torch.cuda.device(index)


# ------------------------------------------------------------------------------ cache

_handles: dict[tuple[int, int, int, int, int], Any] = {}
_handles_lock = threading.Lock()


def empty_cache(
    num_layers: int, num_pages: int, device: Any = None, page_stride: int = PAGE_BYTES
) -> Tensor:
    """A cache's memory, allocated by PyTorch: uint8 ``[num_layers, num_pages, page_stride]``
    (the byte format of ``snapmla.h``; contents undefined until appended). ``device``: a CUDA
    device (``None``: the current one). ``page_stride``: 41216 (the pages packed), or a larger
    multiple of 128 (pages inside an engine's larger slots; on the GPU it is tested through
    ``KVCache``, not yet through these ops)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return torch.empty((num_layers, num_pages, page_stride), dtype=torch.uint8, device=device)


def _check_cache(op: str, cache: Any) -> None:
    """uint8 ``[layers, pages, page_stride]``, contiguous, with a page stride the C library
    takes."""
    _check(op, "cache", cache, (torch.uint8,), (None, None, None), contiguous=True)
    if not _args.page_stride_ok(cache.shape[2]):
        raise argument_error(
            op,
            "cache",
            f"uint8 [layers, pages, page_stride] with page_stride {_args.PAGE_STRIDES}",
            _describe(cache),
        )


def _handle(cache: Tensor) -> Any:
    """The C handle over ``cache``'s memory, made on first use and kept."""
    num_layers, num_pages = cache.shape[0], cache.shape[1]
    key = (cache.data_ptr(), num_layers, num_pages, cache.device.index, cache.shape[2])
    handle = _handles.get(key)
    if handle is not None:
        return handle
    with _handles_lock:
        handle = _handles.get(key)
        if handle is None:
            ffi = _lib.ffi
            config = _lib.new_struct(
                "snapmla_cache_config_t",
                num_layers=num_layers,
                num_pages=num_pages,
                page_stride=0 if cache.shape[2] == PAGE_BYTES else cache.shape[2],
                device=cache.device.index,
                memory=ffi.cast("void*", cache.data_ptr()),
                memory_bytes=cache.numel(),
            )
            out = ffi.new("snapmla_cache_t*")
            _lib.check(_lib.lib().snapmla_cache_create(config, out), "snapmla_cache_create")
            handle = _handles[key] = out[0]
    return handle


def release(cache: Tensor) -> bool:
    """Destroy the C handle kept for ``cache`` (if any; the memory stays PyTorch's). Call it
    before freeing a cache whose address may later hold a cache of another shape... or never:
    a handle is a few dozen host bytes and is keyed by the shape too. Returns whether one was
    kept."""
    _check_cache("release", cache)
    key = (cache.data_ptr(), cache.shape[0], cache.shape[1], cache.device.index, cache.shape[2])
    with _handles_lock:
        handle = _handles.pop(key, None)
    if handle is None:
        return False
    _decode_memo.clear()  # it may hold the handle
    _lib.check(_lib.lib().snapmla_cache_destroy(handle), "snapmla_cache_destroy")
    return True


# -------------------------------------------------------------------------- the ops
# Each op: the real implementation (checks, then one C call on the current stream) and a fake
# one (the same checks of what a fake tensor has: dtypes, shapes; it returns nothing new).
# Registered with torch.library.Library rather than torch.library.custom_op: the latter's
# Python dispatch wrapper costs several times the host time of the whole call.
# The real implementation is registered for CUDA and CPU (where it refuses the tensors by
# name); the schemas state exactly which arguments each op writes. Enumerations are ints, as
# the C library takes them: decode's ``kernel`` (snapmla_decode_kernel_t) and plan's and
# decode's ``q_precision`` (snapmla_q_precision_t, 0 FP8 by default: schemas without it call
# the same op); the public functions take their names. An int is a constant to Dynamo, so a
# compiled graph holds the precision as it holds the kernel.

_LIBRARY = torch.library.Library("snapmla", "DEF")
SCHEMAS = {
    "append": "append(Tensor(a!) cache, SymInt layer, Tensor c_kv, Tensor k_pe, Tensor slots) -> ()",
    "fetch_dequant": "fetch_dequant(Tensor cache, SymInt layer, Tensor slots, Tensor(a!) c_kv, Tensor(b!) k_pe) -> ()",
    "quantize_q": "quantize_q(Tensor q, Tensor(a!) q_content, Tensor(b!) q_rope, Tensor(c!) q_scale) -> ()",
    "plan": "plan(Tensor(a!) plan, Tensor cache_seqlens, SymInt q_len, SymInt num_heads, SymInt max_pages, SymInt num_sm_parts, int q_precision=0) -> ()",
    "decode": "decode(Tensor cache, SymInt layer, Tensor q, Tensor block_table, Tensor cache_seqlens, Tensor plan, Tensor(a!) workspace, Tensor(b!) out, Tensor(c!) lse, float softmax_scale, bool causal, SymInt kernel, SymInt num_sm_parts, int q_precision=0) -> ()",
}
for _schema in SCHEMAS.values():
    _LIBRARY.define(_schema)


def _real(name: str) -> Any:
    def register(fn: Any) -> Any:
        for key in ("CUDA", "CPU"):
            _LIBRARY.impl(name, fn, key)
        return fn

    return register


def _register_fake(name: str, checks: Any) -> None:
    """The fake implementation of op ``name``: its checks (of dtypes and shapes, which a fake
    tensor has), nothing written, nothing returned."""
    op = f"snapmla.torch.{name}"

    def fake(*args: Any, **kwargs: Any) -> None:
        checks(op, *args, **kwargs)

    torch.library.register_fake(f"snapmla::{name}", fake, lib=_LIBRARY)


_CT = _lib.CTYPES


def _ptr(t: Tensor, ctype: str = "const void*") -> Any:
    return _lib.ffi.cast(_CT[ctype], t.data_ptr())


def _append_checks(
    op: str, cache: Tensor, layer: int, c_kv: Tensor, k_pe: Tensor, slots: Tensor
) -> None:
    _check_cache(op, cache)
    _check(
        op, "c_kv", c_kv, (torch.bfloat16,), (None, CONTENT_DIM), inner=True, device=cache.device
    )
    n = c_kv.shape[0]
    _check(op, "k_pe", k_pe, (torch.bfloat16,), (n, ROPE_DIM), inner=True, device=cache.device)
    _check(op, "slots", slots, (torch.int64,), (n,), contiguous=True, device=cache.device)


@_real("append")
def _append(cache: Tensor, layer: int, c_kv: Tensor, k_pe: Tensor, slots: Tensor) -> None:
    op = "snapmla.torch.append"
    _append_checks(op, cache, layer, c_kv, k_pe, slots)
    _no_overlap(op, {"cache": cache}, {"c_kv": c_kv, "k_pe": k_pe, "slots": slots})
    with _on_device(cache.device.index):
        _lib.check(
            _lib.lib().snapmla_append(
                _handle(cache),
                layer,
                _ptr(c_kv),
                c_kv.stride(0),
                _ptr(k_pe),
                k_pe.stride(0),
                _ptr(slots, "const int64_t*"),
                c_kv.shape[0],
                _stream(cache.device),
            ),
            "snapmla_append",
        )


def _fetch_checks(
    op: str, cache: Tensor, layer: int, slots: Tensor, c_kv: Tensor, k_pe: Tensor
) -> None:
    _check_cache(op, cache)
    _check(op, "slots", slots, (torch.int64,), (None,), contiguous=True, device=cache.device)
    n = slots.shape[0]
    _check(op, "c_kv", c_kv, (torch.bfloat16,), (n, CONTENT_DIM), inner=True, device=cache.device)
    _check(op, "k_pe", k_pe, (torch.bfloat16,), (n, ROPE_DIM), inner=True, device=cache.device)


@_real("fetch_dequant")
def _fetch_dequant(cache: Tensor, layer: int, slots: Tensor, c_kv: Tensor, k_pe: Tensor) -> None:
    op = "snapmla.torch.fetch_dequant"
    _fetch_checks(op, cache, layer, slots, c_kv, k_pe)
    _no_overlap(op, {"c_kv": c_kv, "k_pe": k_pe}, {"cache": cache, "slots": slots})
    with _on_device(cache.device.index):
        _lib.check(
            _lib.lib().snapmla_fetch_dequant(
                _handle(cache),
                layer,
                _ptr(slots, "const int64_t*"),
                slots.shape[0],
                _ptr(c_kv, "void*"),
                c_kv.stride(0),
                _ptr(k_pe, "void*"),
                k_pe.stride(0),
                _stream(cache.device),
            ),
            "snapmla_fetch_dequant",
        )


_FP8 = tuple(d for d in (getattr(torch, "float8_e4m3fn", None), torch.uint8) if d is not None)


def _quantize_checks(
    op: str, q: Tensor, q_content: Tensor, q_rope: Tensor, q_scale: Tensor
) -> tuple[int, int, int, int]:
    """(tokens, heads, token stride, head stride) of ``q`` ``[..., h, 576]``."""
    if not isinstance(q, Tensor) or q.dim() < 2:
        _check(op, "q", q, (torch.bfloat16,), (None, None, HEAD_DIM))
    lead = tuple(q.shape[:-2])
    _check(op, "q", q, (torch.bfloat16,), (*([None] * len(lead)), None, HEAD_DIM), inner=True)
    h = q.shape[-2]
    n = 1
    for size in lead:
        n *= size
    # The leading dimensions must flatten to one token stride T: T is the stride of the
    # innermost leading dimension of size > 1, and each leading dimension of size > 1 steps by
    # T times the sizes inside it (size-1 dimensions have no meaningful stride).
    sized = [i for i, size in enumerate(lead) if size > 1]
    token_stride = q.stride(sized[-1]) if sized else HEAD_DIM * h
    for i in sized:
        inner = 1
        for size in lead[i + 1 :]:
            inner *= size
        if q.stride(i) != token_stride * inner:
            raise argument_error(
                op,
                "q",
                "leading dimensions that flatten to one token stride",
                f"strides {list(q.stride())}",
            )
    _check(
        op, "q_content", q_content, _FP8, (*lead, h, CONTENT_DIM), contiguous=True, device=q.device
    )
    _check(
        op,
        "q_rope",
        q_rope,
        (torch.bfloat16,),
        (*lead, h, ROPE_DIM),
        contiguous=True,
        device=q.device,
    )
    _check(op, "q_scale", q_scale, (torch.float32,), (*lead, h), contiguous=True, device=q.device)
    return n, h, token_stride, q.stride(-2)


@_real("quantize_q")
def _quantize_q(q: Tensor, q_content: Tensor, q_rope: Tensor, q_scale: Tensor) -> None:
    op = "snapmla.torch.quantize_q"
    n, h, token_stride, head_stride = _quantize_checks(op, q, q_content, q_rope, q_scale)
    _no_overlap(op, {"q_content": q_content, "q_rope": q_rope, "q_scale": q_scale}, {"q": q})
    if n == 0:
        return
    with _on_device(q.device.index):
        _lib.check(
            _lib.lib().snapmla_quantize_q(
                _ptr(q),
                n,
                h,
                token_stride,
                head_stride,
                _ptr(q_content, "void*"),
                _ptr(q_rope, "void*"),
                _ptr(q_scale, "float*"),
                _stream(q.device),
            ),
            "snapmla_quantize_q",
        )


# ----------------------------------------------------------------- plan and decode

_sizes: dict[tuple[int, ...], tuple[int, int]] = {}


def _buffer_sizes(device: torch.device, *config_key: int) -> tuple[int, int]:
    """(plan bytes, workspace bytes) of a config (``_args.decode_config``'s first six
    arguments: b, q_len, heads, max_pages, num_sm_parts, q_precision) on ``device`` (the SM
    count matters when num_sm_parts is 0), asked of the library once per config and device."""
    key = (device.index, *config_key)
    sizes = _sizes.get(key)
    if sizes is None:
        ffi = _lib.ffi
        plan_bytes, workspace_bytes = ffi.new("size_t*"), ffi.new("size_t*")
        with _on_device(device.index):
            _lib.check(
                _lib.lib().snapmla_decode_buffer_sizes(
                    _args.decode_config(*config_key), plan_bytes, workspace_bytes
                ),
                "snapmla_decode_buffer_sizes",
            )
        sizes = _sizes[key] = (int(plan_bytes[0]), int(workspace_bytes[0]))
    return sizes


def decode_buffers(
    batch_size: int,
    *,
    num_heads: int,
    max_pages: int,
    q_len: int = 1,
    num_sm_parts: int = 0,
    device: Any = None,
    q_precision: str = "fp8",
) -> tuple[Tensor, Tensor]:
    """The plan and workspace of decode steps of up to ``batch_size`` requests, allocated by
    PyTorch (uint8, 1-D): they serve every batch size up to ``batch_size`` with the same
    ``num_heads``, ``max_pages``, ``q_len``, ``num_sm_parts`` and ``q_precision``.
    ``q_precision``: ``"fp8"`` or ``"fp8x2"`` (the two-term query, ``snapmla.DecodePlan``'s
    ``q_precision``; its workspace is larger); ``plan`` and ``decode`` take the same."""
    op = "snapmla.torch.decode_buffers"
    precision = _args.q_precision_code(op, "q_precision", q_precision)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        raise argument_error(op, "device", "a CUDA device", str(device))
    batch_size = _args.check_int(batch_size, op, "batch_size", 1, _args.MAX_BATCH)
    num_heads, q_len, max_pages, num_sm_parts = _args.check_config(
        op, num_heads, q_len, max_pages, num_sm_parts
    )
    plan_bytes, workspace_bytes = _buffer_sizes(
        device, batch_size, q_len, num_heads, max_pages, num_sm_parts, precision
    )
    plan_t = torch.empty(max(plan_bytes, 1), dtype=torch.uint8, device=device)
    workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=device)
    return plan_t, workspace


def _check_buffer(op: str, name: str, t: Any, nbytes: int, device: torch.device) -> None:
    _check(op, name, t, (torch.uint8,), (None,), contiguous=True, device=device)
    if t.shape[0] < nbytes:
        raise argument_error(
            op,
            name,
            f"at least {nbytes} bytes for this config (decode_buffers)",
            f"{t.shape[0]} bytes",
        )


def _check_q_precision(op: str, code: int) -> None:
    """An op's ``q_precision``: a snapmla_q_precision_t (the functions pass their names')."""
    if code not in _Q_CODES:
        expected = " or ".join(f"{c} ({name!r})" for name, c in _args.Q_PRECISIONS.items())
        raise argument_error(op, "q_precision", expected, repr(code))


_Q_CODES = frozenset(_args.Q_PRECISIONS.values())


def _plan_checks(op: str, plan: Tensor, cache_seqlens: Tensor, *ints: int) -> None:
    """The plan op's tensors and precision. ``ints``: the op's q_len, num_heads, max_pages,
    num_sm_parts and q_precision in its schema's order (the fake implementation receives them
    all; trailing ones may be absent at their defaults). Only the precision is checked here: the
    others are the public ``plan``'s and the C library's to check."""
    q_precision = ints[4] if len(ints) > 4 else 0
    _check_q_precision(op, q_precision)
    _check(op, "cache_seqlens", cache_seqlens, (torch.int32,), (None,), contiguous=True)
    _args.check_batch(op, "cache_seqlens", cache_seqlens.shape[0])
    _check(op, "plan", plan, (torch.uint8,), (None,), contiguous=True, device=cache_seqlens.device)


@_real("plan")
def _plan(
    plan: Tensor,
    cache_seqlens: Tensor,
    q_len: int,
    num_heads: int,
    max_pages: int,
    num_sm_parts: int,
    q_precision: int = 0,
) -> None:
    op = "snapmla.torch.plan"
    _plan_checks(op, plan, cache_seqlens, q_len, num_heads, max_pages, num_sm_parts, q_precision)
    key = (cache_seqlens.shape[0], q_len, num_heads, max_pages, num_sm_parts, q_precision)
    _no_overlap(op, {"plan": plan}, {"cache_seqlens": cache_seqlens})
    device = cache_seqlens.device
    with _on_device(device.index):
        # The sizes first: they also check the config's ranges, naming the field.
        _check_buffer(op, "plan", plan, _buffer_sizes(device, *key)[0], device)
        _lib.check(
            _lib.lib().snapmla_decode_plan(
                _args.decode_config(*key, plan.shape[0]),  # (the plan's real size)
                _ptr(cache_seqlens, "const int32_t*"),
                _ptr(plan, "void*"),
                _stream(device),
            ),
            "snapmla_decode_plan",
        )


def _decode_checks(op: str, *args: Any) -> tuple[int, int, int, int]:
    """(b, s_q, h, max_pages) of a decode call; ``args``: the op's, the tensors and the
    precision checked (the other scalars are the C library's to check)."""
    cache, _layer, q, block_table, cache_seqlens, plan, workspace, out, lse = args[:9]
    if len(args) > 13:
        _check_q_precision(op, args[13])
    _check_cache(op, cache)
    d = cache.device
    _check(op, "q", q, (torch.bfloat16,), (None, None, None, HEAD_DIM), inner=True, device=d)
    b, s_q, h = q.shape[0], q.shape[1], q.shape[2]
    _check(op, "block_table", block_table, (torch.int32,), (b, None), inner=True, device=d)
    _check(op, "cache_seqlens", cache_seqlens, (torch.int32,), (b,), contiguous=True, device=d)
    _check(op, "plan", plan, (torch.uint8,), (None,), contiguous=True, device=d)
    _check(op, "workspace", workspace, (torch.uint8,), (None,), contiguous=True, device=d)
    # out: BF16, or fp32: the values the BF16 output rounds (snapmla.decode's out)
    _check(op, "out", out, _OUT_DTYPES, (b, s_q, h, CONTENT_DIM), contiguous=True, device=d)
    _check(op, "lse", lse, (torch.float32,), (b, h, s_q), contiguous=True, device=d)
    return b, s_q, h, block_table.shape[1]


# snapmla.torch.decode's call memo (_decode): what a checked call passes to the C library.
# Cleared when full, and by release() (it holds cache handles).
_decode_memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_DECODE_MEMO_SIZE = 1024


@_real("decode")
def _decode(cache: Tensor, layer: int, q: Tensor, block_table: Tensor, cache_seqlens: Tensor,
            plan: Tensor, workspace: Tensor, out: Tensor, lse: Tensor, softmax_scale: float,
            causal: bool, kernel: int, num_sm_parts: int,
            q_precision: int = 0) -> None:  # fmt: skip
    """The decode op's implementation (the arguments in ``SCHEMAS["decode"]``'s order)."""
    # The call memo (host time): every check (_decode_prepare) is a function of
    # these tensors' addresses, shapes, strides, dtypes and devices and of the scalars, so a
    # call equal to an earlier checked one in all of them reuses its packed C arguments, config,
    # cache handle and buffer pointers. The stream and the current device are read at every
    # call. The tensors' fields are written out flat: building the key is most of a memo hit's
    # time. The six tensors the checks want contiguous are keyed by is_contiguous() in place of
    # their strides: with the shape, that is all the checks read of their layout (a contiguous
    # tensor's extent follows from its shape), and it is the cheaper query.
    scalars = (layer, softmax_scale, causal, kernel, num_sm_parts, q_precision)
    memo_key = (
        scalars,
        cache.data_ptr(), cache.shape, cache.is_contiguous(), cache.dtype, cache.get_device(),
        q.data_ptr(), q.shape, q.stride(), q.dtype, q.get_device(),
        block_table.data_ptr(), block_table.shape, block_table.stride(), block_table.dtype,
        block_table.get_device(),
        cache_seqlens.data_ptr(), cache_seqlens.shape, cache_seqlens.is_contiguous(),
        cache_seqlens.dtype, cache_seqlens.get_device(),
        plan.data_ptr(), plan.shape, plan.is_contiguous(), plan.dtype, plan.get_device(),
        workspace.data_ptr(), workspace.shape, workspace.is_contiguous(), workspace.dtype,
        workspace.get_device(),
        out.data_ptr(), out.shape, out.is_contiguous(), out.dtype, out.get_device(),
        lse.data_ptr(), lse.shape, lse.is_contiguous(), lse.dtype, lse.get_device(),
    )  # fmt: skip
    hit = _decode_memo.get(memo_key)
    prepared = hit
    if prepared is None:
        args, key, plan_ptr, workspace_ptr = _decode_prepare(
            "snapmla.torch.decode",
            (cache, q, block_table, cache_seqlens, plan, workspace, out, lse),
            *scalars,
        )
        index = cache.device.index
        prepared = (args, _args.decode_config(*key), _handle(cache), plan_ptr, workspace_ptr, index)
    args, config, handle, plan_ptr, workspace_ptr, index = prepared
    if _current_device() == index:  # (the common case, without a context: host time)
        status = _lib.lib().snapmla_decode(
            handle, config, args, plan_ptr, workspace_ptr, _stream_of(index)
        )
    else:
        with _on_device(index):
            status = _lib.lib().snapmla_decode(
                handle, config, args, plan_ptr, workspace_ptr, _stream_of(index)
            )
    if status:
        _lib.check(status, "snapmla_decode")
    if hit is None:  # kept once the C library accepted it too
        if len(_decode_memo) >= _DECODE_MEMO_SIZE:
            _decode_memo.clear()
        _decode_memo[memo_key] = prepared  # read-only from here on (the C call only reads it)


def _decode_prepare(
    op: str,
    tensors: tuple[Tensor, ...],
    layer: int,
    softmax_scale: float,
    causal: bool,
    kernel: int,
    num_sm_parts: int,
    q_precision: int,
) -> tuple[Any, tuple[int, ...], Any, Any]:
    """Every check of a decode op call, then its packed C arguments, config key (``decode_config``'s
    arguments) and buffer pointers."""
    cache, q, block_table, cache_seqlens, plan, workspace, out, lse = tensors
    _check_q_precision(op, q_precision)
    b, s_q, h, max_pages = _decode_checks(
        op, cache, layer, q, block_table, cache_seqlens, plan, workspace, out, lse
    )
    _no_overlap(
        op,
        {"out": out, "lse": lse, "workspace": workspace},
        {
            "cache": cache,
            "q": q,
            "block_table": block_table,
            "cache_seqlens": cache_seqlens,
            "plan": plan,
        },
    )
    key = (b, s_q, h, max_pages, num_sm_parts, q_precision)
    device = cache.device
    plan_bytes, workspace_bytes = _buffer_sizes(device, *key)  # (on the device itself)
    _check_buffer(op, "plan", plan, plan_bytes, device)
    _check_buffer(op, "workspace", workspace, workspace_bytes, device)
    args = _args.pack_decode_args(  # q holds q_nope | q_pe: no q_pe
        layer,
        bool(causal),
        float(softmax_scale),
        kernel,
        q.data_ptr(),
        (q.stride(0), q.stride(1), q.stride(2)),
        block_table.data_ptr(),
        block_table.stride(0),
        cache_seqlens.data_ptr(),
        out.data_ptr(),
        lse.data_ptr(),
        out_dtype=_args.OUT_DTYPES["float32" if out.dtype == torch.float32 else "bfloat16"],
    )
    # the config with the buffers' real sizes, which the library checks too
    return args, (*key, plan.shape[0], workspace.shape[0]), _ptr(plan), _ptr(workspace, "void*")


for _name, _checks in (
    ("append", _append_checks),
    ("fetch_dequant", _fetch_checks),
    ("quantize_q", _quantize_checks),
    ("plan", _plan_checks),
    ("decode", _decode_checks),
):
    _register_fake(_name, _checks)


# ------------------------------------------------------------- the public functions


def append(cache: Tensor, layer: int, c_kv: Tensor, k_pe: Tensor, slots: Tensor) -> None:
    """Quantize ``n`` tokens into ``layer`` of ``cache`` (``snapmla.KVCache.append``'s
    contract): ``c_kv`` BF16 ``[n, 512]``, ``k_pe`` BF16 ``[n, 64]`` (unit inner stride),
    ``slots`` int64 ``[n]`` (negative: skipped)."""
    if _eager(cache, c_kv, k_pe, slots, ints=(layer,)):
        _append(cache, layer, c_kv, k_pe, slots)
    else:
        torch.ops.snapmla.append(cache, layer, c_kv, k_pe, slots)


def fetch_dequant(
    cache: Tensor,
    layer: int,
    slots: Tensor,
    *,
    c_kv: Tensor | None = None,
    k_pe: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Gather ``slots`` (int64 ``[n]``) of ``layer`` and dequantize them to BF16; returns
    ``(c_kv [n, 512], k_pe [n, 64])``, the given outputs or new tensors."""
    op = "snapmla.torch.fetch_dequant"
    _check_cache(op, cache)
    _check(op, "slots", slots, (torch.int64,), (None,), contiguous=True, device=cache.device)
    n, device = slots.shape[0], cache.device
    if c_kv is None:
        c_kv = torch.empty((n, CONTENT_DIM), dtype=torch.bfloat16, device=device)
    if k_pe is None:
        k_pe = torch.empty((n, ROPE_DIM), dtype=torch.bfloat16, device=device)
    if _eager(cache, slots, c_kv, k_pe, ints=(layer,)):
        _fetch_dequant(cache, layer, slots, c_kv, k_pe)
    else:
        torch.ops.snapmla.fetch_dequant(cache, layer, slots, c_kv, k_pe)
    return c_kv, k_pe


def quantize_q(
    q: Tensor, *, out: tuple[Tensor, Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Quantize query rows (``snapmla.quantize_q``'s contract): ``q`` BF16 ``[..., h, 576]``;
    returns ``(q_content float8_e4m3fn [..., h, 512], q_rope bf16 [..., h, 64], q_scale fp32
    [..., h])``, the given outputs or new tensors."""
    if out is None:
        _check(
            "snapmla.torch.quantize_q",
            "q",
            q,
            (torch.bfloat16,),
            (*([None] * max(q.dim() - 1, 1) if isinstance(q, Tensor) else [None]), HEAD_DIM),
        )
        lead = tuple(q.shape[:-1])
        fp8 = getattr(torch, "float8_e4m3fn", torch.uint8)
        out = (
            torch.empty((*lead, CONTENT_DIM), dtype=fp8, device=q.device),
            torch.empty((*lead, ROPE_DIM), dtype=torch.bfloat16, device=q.device),
            torch.empty(lead, dtype=torch.float32, device=q.device),
        )
    if _eager(q, *out):
        _quantize_q(q, *out)
    else:
        torch.ops.snapmla.quantize_q(q, *out)
    return out


def plan(
    plan: Tensor,
    cache_seqlens: Tensor,
    *,
    num_heads: int,
    max_pages: int,
    q_len: int = 1,
    num_sm_parts: int = 0,
    q_precision: str = "fp8",
) -> None:
    """Build the step's split-KV schedule into ``plan`` (from ``decode_buffers``) from
    ``cache_seqlens`` (int32 ``[b]``: context lengths including the new tokens); one small
    launch, no host synchronization. ``q_precision``: the buffers' (``decode_buffers``); the
    plan records it, and ``decode`` must pass it too."""
    op = "snapmla.torch.plan"
    num_heads, q_len, max_pages, num_sm_parts = _args.check_config(
        op, num_heads, q_len, max_pages, num_sm_parts
    )
    precision = _args.q_precision_code(op, "q_precision", q_precision)
    if _eager(plan, cache_seqlens):
        _plan(plan, cache_seqlens, q_len, num_heads, max_pages, num_sm_parts, precision)
    else:
        torch.ops.snapmla.plan(
            plan, cache_seqlens, q_len, num_heads, max_pages, num_sm_parts, precision
        )


def decode(
    cache: Tensor,
    layer: int,
    q: Tensor,
    block_table: Tensor,
    cache_seqlens: Tensor,
    plan: Tensor,
    workspace: Tensor,
    *,
    softmax_scale: float,
    causal: bool = True,
    kernel: str = "auto",
    num_sm_parts: int = 0,
    out: Tensor | None = None,
    lse: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    q_precision: str = "fp8",
) -> tuple[Tensor, Tensor]:
    """FP8 MLA decode of one layer (``snapmla.decode``'s contract) with a plan built by
    ``plan`` for the same ``cache_seqlens``: ``q`` BF16 ``[b, s_q, h, 576]``, ``block_table``
    int32 ``[b, max_pages]``; returns ``(out bf16 [b, s_q, h, 512], lse fp32 [b, h, s_q])``,
    the given outputs or new tensors. ``kernel``: ``"auto"``, ``"fast"`` or ``"reference"``.
    ``out`` may also be fp32: the values the BF16 output rounds, unrounded
    (``snapmla.decode``'s ``out``). ``out_dtype``: ``torch.bfloat16`` or ``torch.float32``, the
    dtype of an ``out`` allocated here; with ``out`` given, ``None`` (the default: bfloat16)
    or ``out``'s dtype. ``q_precision``: ``"fp8"`` or ``"fp8x2"``, that of the plan and
    workspace (``decode_buffers``, ``plan``); ``"fp8x2"`` runs where ``select_kernel`` of
    ``snapmla.decode`` allows it (``"auto"`` and ``"fast"`` up to ``s_q * h = 32`` query
    rows, ``"reference"`` everywhere), else the library refuses it naming ``kernel``."""
    op = "snapmla.torch.decode"
    code = _args.kernel_code(op, kernel)
    precision = _args.q_precision_code(op, "q_precision", q_precision)
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise argument_error(
            op, "out_dtype", "torch.bfloat16, torch.float32 or None", repr(out_dtype)
        )
    if out is not None and out_dtype is not None:
        _check(op, "out", out, (out_dtype,), (None, None, None, CONTENT_DIM))
    if out is None or lse is None:
        _check(op, "q", q, (torch.bfloat16,), (None, None, None, HEAD_DIM))
        b, s_q, h = q.shape[0], q.shape[1], q.shape[2]
        if out is None:
            dtype = torch.bfloat16 if out_dtype is None else out_dtype
            out = torch.empty((b, s_q, h, CONTENT_DIM), dtype=dtype, device=q.device)
        if lse is None:
            lse = torch.empty((b, h, s_q), dtype=torch.float32, device=q.device)
    tensors = (cache, q, block_table, cache_seqlens, plan, workspace, out, lse)
    run = _decode if _eager(*tensors, ints=(layer, num_sm_parts)) else torch.ops.snapmla.decode
    run(
        cache,
        layer,
        q,
        block_table,
        cache_seqlens,
        plan,
        workspace,
        out,
        lse,
        float(softmax_scale),
        bool(causal),
        code,
        num_sm_parts,
        precision,
    )
    return out, lse
