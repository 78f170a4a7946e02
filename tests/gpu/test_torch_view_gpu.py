"""The direct read of CUDA torch tensors (``_dlpack.torch_fields``): where it applies
it gives exactly what PyTorch's DLPack capsule gives, and where the DLPack path would order
streams or refuse the tensor it steps aside."""

from __future__ import annotations

from typing import Any

import pytest
from _util import torch_module

from snapmla import SnapMLAError, _dlpack

pytestmark = pytest.mark.gpu

FIELDS = ("ptr", "shape", "strides", "dtype", "device_id", "itemsize")


def _through_dlpack(t: Any) -> _dlpack.TensorView | None:
    """The DLPack view, or None where this PyTorch's DLPack export refuses the dtype (FP8 on
    some versions; the direct read takes it)."""
    try:
        return _dlpack._read_capsule(_dlpack.export(t, None, "test", "t"), t, "test", "t")
    except SnapMLAError as exc:
        if t.dtype.itemsize == 1 and t.is_floating_point():
            print(f"DLPack refuses {t.dtype} here: {exc}")
            return None
        raise


def _comparable(fields: tuple) -> tuple:
    """The fields with the strides of size <= 1 dimensions left out (some PyTorch versions'
    DLPack export rewrites them; nothing reads them)."""
    ptr, shape, strides, *rest = fields
    kept = tuple(st for n, st in zip(shape, strides) if n > 1)
    return (ptr, shape, kept, *rest)


def _layouts(torch: Any) -> list[Any]:
    base = torch.arange(4 * 3 * 8 * 576, device="cuda", dtype=torch.float32)
    b = base.to(torch.bfloat16).view(4, 3, 8, 576)
    return [
        b,
        b[:, :1],  # a size-1 dimension with a large stride
        b[1:3, :, 2:5],  # an offset into the storage
        b.permute(0, 2, 1, 3),
        b[..., :64],  # unit inner stride, padded rows
        b[0, 0, 0, :0],  # empty
        b.new_empty(()),  # 0-d
        torch.zeros(5, 1, device="cuda", dtype=torch.int32).expand(5, 3),  # stride 0
        torch.zeros(7, 9, device="cuda", dtype=torch.int32).t(),
        torch.zeros(6, device="cuda", dtype=torch.int64)[::2],
        torch.zeros(3, 656, device="cuda", dtype=torch.uint8)[:, :644],
        torch.zeros(2, 8, 3, device="cuda", dtype=torch.float32).transpose(1, 2),
        torch.zeros(4, 576, device="cuda", dtype=torch.float8_e4m3fn),
    ]


def test_torch_view_is_what_dlpack_gives() -> None:
    torch = torch_module()
    current = torch.cuda.current_stream().cuda_stream
    for t in _layouts(torch):
        direct = _dlpack.torch_fields(t, current)
        assert direct is not None, (t.dtype, t.shape, t.stride())
        want = _through_dlpack(t)
        if want is None:
            continue
        got = _comparable(direct)
        assert got == _comparable(tuple(getattr(want, f) for f in FIELDS)), (t.shape, t.stride())
        assert (want.device_type, want.read_only) == (_dlpack.CUDA, False)


def test_torch_view_steps_aside_where_dlpack_would_act() -> None:
    torch = torch_module()
    t = torch.zeros(4, 8, device="cuda", dtype=torch.bfloat16)
    current = torch.cuda.current_stream().cuda_stream
    assert _dlpack.torch_fields(t, current) is not None
    assert _dlpack.torch_fields(t, None) is None  # no stream: DLPack, as before
    assert _dlpack.torch_fields(t, lambda device: current) is not None
    side = torch.cuda.Stream()
    # Another stream: __dlpack__(stream=...) makes it wait for the current one; DLPack does it.
    assert _dlpack.torch_fields(t, side.cuda_stream) is None
    with torch.cuda.stream(side):
        assert _dlpack.torch_fields(t, side.cuda_stream) is not None
    # What PyTorch's DLPack export refuses, or snapmla does not name itself: DLPack decides.
    refused = [
        t.clone().requires_grad_(),
        torch._neg_view(t),
        t.half(),
        t.cpu(),
        torch.nn.Parameter(t, requires_grad=False),
        torch.nested.nested_tensor([t[0], t[1, :4]]),
    ]
    for r in refused:
        assert _dlpack.torch_fields(r, current) is None, r
