"""Query quantization: ``quantize_q`` (FP8 content, pre-scaled BF16 RoPE, one scale per row;
optionally the two-term query's low FP8 row and its scale)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

from . import _lib
from ._args import q_precision_code
from ._dlpack import TensorView
from ._errors import argument_error
from ._lib import CONTENT_DIM, HEAD_DIM, ROPE_DIM
from ._lib import CTYPES as _CT
from ._tensor import BF16, FP8, FP32, Checker, Stream, empty, on_device, remember

__all__ = ["quantize_q"]

MAX_QUANTIZE_HEADS = 1024
# Why the outputs' alignments (4: the element size, no note).
_ALIGN_NOTES = {8: "the kernel's 8-byte stores", 16: "the kernel's 16-byte stores"}
# quantize_q's call memo (outputs given): (device, two-term, the C arguments but the stream;
# None when there are no rows), by the precision and the tensors' keys (Checker.read); cleared
# when full.
_call_memo: dict[Any, Any] = {}
_CALL_MEMO_SIZE = 1024
_OUT_NAMES = ("out[0]", "out[1]", "out[2]", "out[3]", "out[4]")
_is_none = functools.partial(operator.is_, None)


def _is_sequence(out: Any) -> bool:
    """Whether ``out`` is taken as a sequence of outputs (a ``str`` or ``bytes`` is not)."""
    return isinstance(out, Sequence) and not isinstance(out, (str, bytes))


def _token_stride(op: str, v: TensorView, default: int) -> int:
    """The one stride (elements) of the flattened leading dimensions of ``v`` (all but the
    last two), refusing leading dimensions that do not flatten to a single stride."""
    lead = [(size, stride) for size, stride in zip(v.shape[:-2], v.strides[:-2]) if size != 1]
    if not lead or v.numel == 0:  # nothing is addressed through the token stride
        return default
    for (_, outer), (size, inner) in zip(lead, lead[1:]):
        if outer != inner * size:
            raise argument_error(
                op,
                "q",
                "leading dimensions that flatten to one token stride",
                f"shape {list(v.shape)} with strides (elements) {list(v.strides)}",
            )
    stride = lead[-1][1]
    if stride < HEAD_DIM:
        raise argument_error(op, "q", f"a token stride >= {HEAD_DIM} elements", str(stride))
    return stride


def _check_precision(precision: Any) -> int:
    """The number of outputs of ``precision`` (refused if unknown)."""
    return 5 if q_precision_code("quantize_q", "precision", precision) else 3


def _validate_quantize_args(
    q: Any,
    out: Sequence[Any] | None,
    stream: Stream,
    precision: str = "fp8",
    checker: Checker | None = None,
) -> tuple[TensorView, int, int, int, int, list[TensorView | None], int]:
    """Checks of ``quantize_q``; returns ``(q, n, h, token_stride, head_stride, outputs,
    device)`` with ``None`` for outputs still to allocate. The call memo may give a
    ``checker`` that has ``read()`` some of the tensors already."""
    op = "quantize_q"
    count = _check_precision(precision)
    if checker is None:
        checker = Checker(op, stream)
    v = checker.tensor(q, "q", dtypes=BF16, shape=("...", "h", HEAD_DIM), layout="inner")
    lead, h = v.shape[:-2], v.shape[-2]
    if not 1 <= h <= MAX_QUANTIZE_HEADS:
        raise argument_error(
            op, "q", f"1 to {MAX_QUANTIZE_HEADS} heads (shape[-2])", f"shape {list(v.shape)}"
        )
    n = 1
    for size in lead:
        n *= size
    head_stride = checker.stride(v, "q", -2, HEAD_DIM, "head")
    token_stride = _token_stride(op, v, h * head_stride)
    names = "(q_content, q_rope, q_scale" + (", q_lo, q_lo_scale)" if count == 5 else ")")
    if out is None:
        out = (None,) * count
    elif not _is_sequence(out) or len(out) != count:
        got = type(out).__name__
        if _is_sequence(out):
            got = f"a sequence of {len(out)}"
        raise argument_error(op, "out", f"None or a sequence {names}", got)
    # (argument, dtypes, shape, alignment: what the kernel's stores need)
    specs = (
        ("out[0]", FP8, (*lead, h, CONTENT_DIM), 8),
        ("out[1]", BF16, (*lead, h, ROPE_DIM), 16),
        ("out[2]", FP32, (*lead, h), 4),
        ("out[3]", FP8, (*lead, h, CONTENT_DIM), 8),
        ("out[4]", FP32, (*lead, h), 4),
    )[:count]
    outputs: list[TensorView | None] = []
    for obj, (name, dtypes, shape, align) in zip(out, specs):
        outputs.append(
            None
            if obj is None
            else checker.tensor(
                obj,
                name,
                dtypes=dtypes,
                shape=shape,
                writable=True,
                align=align,
                align_note=_ALIGN_NOTES.get(align, ""),
            )
        )
    device = checker.devices(None)
    for i, (name, _, _, _) in enumerate(specs):
        if outputs[i] is not None:
            others = [("q", v)] + [(specs[j][0], outputs[j]) for j in range(i + 1, count)]
            checker.no_overlap(name, outputs[i], others)
    return v, n, h, token_stride, head_stride, outputs, device


def quantize_q(
    q: Any, *, out: Sequence[Any] | None = None, stream: Any = None, precision: str = "fp8"
) -> tuple[Any, ...]:
    """Quantize query rows as the numerics contract says: one scale per (token, head).

    Args:
        q: BF16 ``[..., h, 576]`` (``q_nope | q_pe``), a CUDA tensor; ``h`` in 1..1024. The
            last dimension must be contiguous; the head stride and the leading dimensions'
            strides may be anything (>= 576 elements) as long as the leading dimensions
            flatten to one token stride.
        out: ``None``, or ``(q_content, q_rope, q_scale)`` outputs (any entry ``None`` to
            allocate that one): FP8 E4M3 ``[..., h, 512]`` (float8_e4m3fn, or uint8 raw
            bytes; 8-byte aligned), BF16 ``[..., h, 64]`` (16-byte aligned), fp32
            ``[..., h]``; contiguous, on ``q``'s device, not overlapping ``q`` or each other.
        stream: CUDA stream: an int handle, or an object with ``.ptr`` (CuPy) or
            ``.cuda_stream`` (PyTorch). ``None``: torch's current stream if ``q`` or an
            output is a torch tensor (so that CUDA graph capture works without ``stream=``),
            else CuPy's current stream. The producers' ``__dlpack__(stream=...)`` is given it.
        precision: ``"fp8"`` (the contract) or ``"fp8x2"``: also the two-term query's low
            row, ``q_lo`` FP8 ``[..., h, 512]`` (8-byte aligned), and its scale ``q_lo_scale``
            fp32 ``[..., h]`` (``out`` then has five entries), so that ``q_nope ~ q_scale *
            q_content + q_lo_scale * q_lo`` to about 2^-8 relative; the first three outputs
            are the same bits as with ``"fp8"`` (``snapmla.reference.quantize_q2``, the C
            header's ``snapmla_quantize_q2``). ``decode`` quantizes both terms itself for a
            plan made with ``q_precision="fp8x2"``; opt-in.

    Returns:
        ``(q_content, q_rope, q_scale)`` (``"fp8x2"``: ``+ (q_lo, q_lo_scale)``): the given
        outputs, or new CuPy arrays of dtypes ``ml_dtypes.float8_e4m3fn``,
        ``ml_dtypes.bfloat16`` and ``float32`` (``uint8`` / ``uint16`` holding the bits where
        CuPy refuses the ml_dtypes types), allocated under the call's stream.

    Raises:
        SnapMLAError: An argument is refused (nothing is written) or the library failed.
    """
    op = "quantize_q"
    # (a list or tuple without the Sequence ABC's isinstance, a tenth of a microsecond)
    plain = type(out) is list or type(out) is tuple
    outputs = tuple(out) if plain or _is_sequence(out) else ()
    s = Stream(stream, op, (q, *outputs))
    checker = Checker(op, s)
    # The call memo (host time), as decode's: with every output given, a call whose
    # precision and tensors (each by Checker.read's key: address, device, dtype, shape,
    # strides, flags) equal an earlier call's passed every check then and takes the same C
    # arguments. The precision is checked first, as without the memo; each tensor is still
    # read (with the stream handshake).
    count = _check_precision(precision)
    memo_key = hit = None
    # (`is not None` each, not `None in`: arrays compare element-wise)
    if len(outputs) == count and not any(map(_is_none, outputs)):
        keys = checker.read_keys((("q", q), *zip(_OUT_NAMES, outputs)))
        memo_key = None if keys is None else (precision, keys)
        hit = None if memo_key is None else _call_memo.get(memo_key)
    if hit is None:
        v, n, h, token_stride, head_stride, views, device = _validate_quantize_args(
            q, out, s, precision, checker
        )
        lead = v.shape[:-2]
        given = (None,) * len(views) if out is None else tuple(out)
        results: list[Any] = []
        ptrs: list[int] = []
        with on_device(op, device):
            content, row = (*lead, h, CONTENT_DIM), (*lead, h)
            shapes = (content, (*lead, h, ROPE_DIM), row, content, row)
            dtypes = ("float8_e4m3fn", "bfloat16", "float32", "float8_e4m3fn", "float32")
            for obj, view, shape, dtype in zip(given, views, shapes, dtypes):
                if view is None:
                    obj, ptr = empty(op, shape, dtype, device, s)
                else:
                    ptr = view.ptr
                results.append(obj)
                ptrs.append(ptr)
        outputs = tuple(results)
        args = None
        if n > 0:
            ffi = _lib.ffi
            args = (
                ffi.cast(_CT["const void*"], v.ptr),
                n,
                h,
                token_stride,
                head_stride,
                ffi.cast(_CT["void*"], ptrs[0]),
                ffi.cast(_CT["void*"], ptrs[1]),
                ffi.cast(_CT["float*"], ptrs[2]),
            )
            if len(views) == 5:  # the two-term query's low row and its scale
                args += (ffi.cast(_CT["void*"], ptrs[3]), ffi.cast(_CT["float*"], ptrs[4]))
        hit = (device, len(views) == 5, args)
        if memo_key is not None:
            remember(_call_memo, memo_key, hit, _CALL_MEMO_SIZE)
    device, two_term, args = hit
    if args is not None:  # n > 0
        with on_device(op, device):
            if two_term:
                status = _lib.lib().snapmla_quantize_q2(*args, s.c(device))
            else:
                status = _lib.lib().snapmla_quantize_q(*args, s.c(device))
            if status:  # (_lib.check's own test, without the call on success)
                _lib.check(status, "snapmla_quantize_q2" if two_term else "snapmla_quantize_q")
    return outputs
