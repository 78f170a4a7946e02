"""snapmla.torch on the GPU: the custom ops against the generic API on the same memory (bit for
bit), torch.library.opcheck on each op, torch.compile(fullgraph=True) of a decode step against
eager, CUDA graph capture and replay, a plan sized for a larger batch."""

from __future__ import annotations

import numpy as np
import pytest
from _util import (
    SM_SCALE,
    assert_rounds_to,
    device_inputs,
    make_case,
    make_plan,
    nan_torch,
    page_slots,
    poisoned_outputs,
    synchronize,
    to_torch,
)

import snapmla
from snapmla import reference as ref
from snapmla._args import KERNELS

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
smt = pytest.importorskip("snapmla.torch")


def _torch_case(rng: np.random.Generator, seqlens: list[int], num_heads: int, q_len: int = 1):
    """A case whose cache lives in a ``smt.empty_cache`` tensor holding the case's image."""
    case = make_case(rng, seqlens, num_heads=num_heads, q_len=q_len, num_layers=2)
    cache = smt.empty_cache(case.num_layers, case.num_pages, device="cuda")
    cache.view(-1).copy_(to_torch(case.image))
    q, bt, sl = device_inputs(case)
    return case, cache, q, bt, sl


def _generic(case, cache, q, bt, sl, layer: int, kernel: str = "auto"):
    """The generic (DLPack) API's decode on the same memory."""
    kv = snapmla.KVCache(case.num_layers, case.num_pages, buffer=cache.view(-1))
    plan = make_plan(case, sl)
    out, lse = poisoned_outputs(*case.q.shape[:3])
    snapmla.decode(
        kv, layer, q, bt, sl, plan, softmax_scale=SM_SCALE, out=out, lse=lse, kernel=kernel
    )
    synchronize()
    return out, lse


@pytest.mark.parametrize("kernel", ["auto", "reference"])
@pytest.mark.parametrize(
    ("seqlens", "heads", "q_len"),
    [([1, 63, 64, 65], 16, 1), ([700, 0, 130], 128, 1), ([200, 64], 16, 2)],
)
def test_decode_matches_the_generic_api_bit_for_bit(
    rng: np.random.Generator, seqlens: list[int], heads: int, q_len: int, kernel: str
) -> None:
    case, cache, q, bt, sl = _torch_case(rng, seqlens, heads, q_len)
    want_out, want_lse = _generic(case, cache, q, bt, sl, 1, kernel)
    plan, workspace = smt.decode_buffers(
        len(seqlens), num_heads=heads, q_len=q_len, max_pages=case.max_pages
    )
    smt.plan(plan, sl, num_heads=heads, q_len=q_len, max_pages=case.max_pages)
    out, lse = smt.decode(
        cache, 1, q, bt, sl, plan, workspace, softmax_scale=SM_SCALE, kernel=kernel
    )
    synchronize()
    assert torch.equal(out.view(torch.int16), want_out.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), want_lse.view(torch.int32))
    assert torch.isfinite(out[torch.from_numpy(np.asarray(seqlens) > 0)].float()).all()


@pytest.mark.parametrize("kernel", ["auto", "reference"])
def test_decode_fp32_out(rng: np.random.Generator, kernel: str) -> None:
    """An fp32 out through the op (args.out_dtype FP32): bit for bit the generic API's
    fp32 out on the same memory, the same lse as the op's BF16 call, and rounded to nearest
    even its BF16 out; opcheck passes with it."""
    seqlens, heads = [700, 0, 130, 64], 16
    case, cache, q, bt, sl = _torch_case(rng, seqlens, heads)
    kv = snapmla.KVCache(case.num_layers, case.num_pages, buffer=cache.view(-1))
    want, want_lse = poisoned_outputs(len(seqlens), 1, heads, "float32")
    snapmla.decode(
        kv,
        1,
        q,
        bt,
        sl,
        make_plan(case, sl),
        softmax_scale=SM_SCALE,
        out=want,
        lse=want_lse,
        kernel=kernel,
    )
    plan, workspace = smt.decode_buffers(len(seqlens), num_heads=heads, max_pages=case.max_pages)
    smt.plan(plan, sl, num_heads=heads, max_pages=case.max_pages)
    args = (cache, 1, q, bt, sl, plan, workspace)
    out16, lse16 = smt.decode(*args, softmax_scale=SM_SCALE, kernel=kernel)
    out32, lse32 = smt.decode(*args, softmax_scale=SM_SCALE, kernel=kernel, out_dtype=torch.float32)
    synchronize()
    assert out32.dtype == torch.float32
    assert torch.equal(out32.view(torch.int32), want.view(torch.int32))
    assert torch.equal(lse32.view(torch.int32), lse16.view(torch.int32))
    assert_rounds_to(out32, out16, f"snapmla.torch fp32 out ({kernel})")
    torch.library.opcheck(
        torch.ops.snapmla.decode.default,
        (*args, out32, lse32, SM_SCALE, True, 0 if kernel == "auto" else 1, 0),
    )


@pytest.mark.parametrize(
    ("seqlens", "heads", "q_len", "kernel"),
    [
        ([1, 63, 64, 65], 16, 1, "auto"),  # the fast kernel: 16 query rows a request
        ([700, 0, 130, 64], 32, 1, "auto"),  # 32 rows: the fast kernel's limit
        ([200, 64, 5, 129], 16, 2, "fast"),
        ([700, 0, 130], 128, 1, "reference"),  # past 32 rows: the reference kernel only
    ],
)
def test_fp8x2_decode_matches_the_generic_api_bit_for_bit(
    rng: np.random.Generator, seqlens: list[int], heads: int, q_len: int, kernel: str
) -> None:
    """q_precision="fp8x2" through decode_buffers, plan and decode: the buffers the generic
    DecodePlan(q_precision="fp8x2") sizes, and its decode's out and lse bit for bit; the
    one-term call on the same memory gives other values (the low rows are used)."""
    case, cache, q, bt, sl = _torch_case(rng, seqlens, heads, q_len)
    kv = snapmla.KVCache(case.num_layers, case.num_pages, buffer=cache.view(-1))
    generic = make_plan(case, sl, q_precision="fp8x2")
    want_out, want_lse = poisoned_outputs(len(seqlens), q_len, heads)
    snapmla.decode(
        kv, 1, q, bt, sl, generic, softmax_scale=SM_SCALE, out=want_out, lse=want_lse,
        kernel=kernel,
    )  # fmt: skip
    kw = dict(num_heads=heads, q_len=q_len, max_pages=case.max_pages)
    plan, workspace = smt.decode_buffers(len(seqlens), **kw, q_precision="fp8x2")
    assert (plan.shape[0], workspace.shape[0]) == (
        max(generic.plan_bytes, 1),
        max(generic.workspace_bytes, 1),
    )
    smt.plan(plan, sl, **kw, q_precision="fp8x2")
    args = (cache, 1, q, bt, sl, plan, workspace)
    out, lse = smt.decode(*args, softmax_scale=SM_SCALE, kernel=kernel, q_precision="fp8x2")
    synchronize()
    assert torch.equal(out.view(torch.int16), want_out.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), want_lse.view(torch.int32))
    assert torch.isfinite(out[torch.from_numpy(np.asarray(seqlens) > 0)].float()).all()
    one_plan, one_ws = smt.decode_buffers(len(seqlens), **kw)
    smt.plan(one_plan, sl, **kw)
    one, _ = smt.decode(
        cache, 1, q, bt, sl, one_plan, one_ws, softmax_scale=SM_SCALE, kernel=kernel
    )
    synchronize()
    seen = torch.from_numpy(np.asarray(seqlens) > 0)
    assert not torch.equal(one[seen], out[seen]), "the two-term query changed nothing"
    code = KERNELS[kernel]
    torch.library.opcheck(
        torch.ops.snapmla.plan.default, (plan, sl, q_len, heads, case.max_pages, 0, 1)
    )
    torch.library.opcheck(
        torch.ops.snapmla.decode.default, (*args, out, lse, SM_SCALE, True, code, 0, 1)
    )


def test_fp8x2_refusals_and_a_plan_of_the_other_precision(rng: np.random.Generator) -> None:
    """fp8x2 past the fast kernel's rows with kernel "auto" is refused naming 'args.kernel'
    (the C library checks that range and names its field); a workspace sized for fp8 is refused
    for fp8x2 naming 'workspace'; a plan built for fp8 and decoded as fp8x2 (buffers large
    enough) gives NaN rows, as the library documents.
    Refused calls write nothing."""
    case, cache, q, bt, sl = _torch_case(rng, [100, 300], 128)
    kw = dict(num_heads=128, max_pages=case.max_pages)
    plan, workspace = smt.decode_buffers(2, **kw, q_precision="fp8x2")
    smt.plan(plan, sl, **kw, q_precision="fp8x2")
    out, lse = poisoned_outputs(2, 1, 128)
    args = (cache, 0, q, bt, sl, plan, workspace)
    with pytest.raises(snapmla.SnapMLAError, match="argument 'args.kernel'"):
        smt.decode(*args, softmax_scale=SM_SCALE, q_precision="fp8x2", out=out, lse=lse)
    _, fp8_ws = smt.decode_buffers(2, **kw)
    assert fp8_ws.shape[0] < workspace.shape[0]
    with pytest.raises(snapmla.SnapMLAError, match="argument 'workspace'"):
        smt.decode(cache, 0, q, bt, sl, plan, fp8_ws, softmax_scale=SM_SCALE,
                   kernel="reference", q_precision="fp8x2", out=out, lse=lse)  # fmt: skip
    synchronize()
    assert torch.isnan(out.float()).all() and torch.isnan(lse).all(), "a refused call wrote"
    smt.plan(plan, sl, **kw)  # an fp8 plan in the fp8x2 buffers
    smt.decode(*args, softmax_scale=SM_SCALE, kernel="reference", q_precision="fp8x2",
               out=out, lse=lse)  # fmt: skip
    synchronize()
    assert torch.isnan(out.float()).all() and torch.isnan(lse).all()


def test_append_fetch_quantize_match_the_generic_api(rng: np.random.Generator) -> None:
    case, cache, _, _, _ = _torch_case(rng, [100, 40], 16)
    n = 37
    c_kv = to_torch(ref_rows(rng, (n, ref.CONTENT_DIM)))
    k_pe = to_torch(ref_rows(rng, (n, ref.ROPE_DIM)))
    slots = torch.from_numpy(page_slots(case.block_table[0], n).astype(np.int64)).cuda()
    slots[3] = -1  # skipped
    twin = smt.empty_cache(case.num_layers, case.num_pages, device="cuda")
    twin.copy_(cache)
    smt.append(cache, 1, c_kv, k_pe, slots)
    kv = snapmla.KVCache(case.num_layers, case.num_pages, buffer=twin.view(-1))
    kv.append(1, c_kv, k_pe, slots)
    synchronize()
    assert torch.equal(cache, twin)
    got_c, got_k = smt.fetch_dequant(cache, 1, slots)
    want_c, want_k = nan_torch((n, ref.CONTENT_DIM)), nan_torch((n, ref.ROPE_DIM))
    kv.fetch_dequant(1, slots, c_kv=want_c, k_pe=want_k)
    synchronize()
    assert torch.equal(got_c.view(torch.int16), want_c.view(torch.int16))
    assert torch.equal(got_k.view(torch.int16), want_k.view(torch.int16))
    q = to_torch(ref_rows(rng, (3, 2, 16, ref.HEAD_DIM)))
    got = smt.quantize_q(q)
    want = snapmla.quantize_q(q, out=tuple(torch.empty_like(t) for t in got))
    synchronize()
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def ref_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    import ml_dtypes

    return (rng.standard_normal(shape) * 0.5).astype(ml_dtypes.bfloat16)


def test_opcheck_every_op(rng: np.random.Generator) -> None:
    case, cache, q, bt, sl = _torch_case(rng, [300, 65], 16)
    plan, workspace = smt.decode_buffers(2, num_heads=16, max_pages=case.max_pages)
    out, lse = poisoned_outputs(2, 1, 16)
    n = 5
    c_kv, k_pe = to_torch(ref_rows(rng, (n, 512))), to_torch(ref_rows(rng, (n, 64)))
    slots = torch.arange(n, dtype=torch.int64, device="cuda")
    ops = torch.ops.snapmla
    torch.library.opcheck(ops.plan.default, (plan, sl, 1, 16, case.max_pages, 0))
    torch.library.opcheck(
        ops.decode.default,
        (cache, 0, q, bt, sl, plan, workspace, out, lse, SM_SCALE, True, 0, 0),
    )
    torch.library.opcheck(ops.append.default, (cache, 1, c_kv, k_pe, slots))
    torch.library.opcheck(
        ops.fetch_dequant.default,
        (cache, 1, slots, torch.empty_like(c_kv), torch.empty_like(k_pe)),
    )
    qq = to_torch(ref_rows(rng, (4, 16, 576)))
    outs = smt.quantize_q(qq)
    # q_content as raw bytes: opcheck's schema test multiplies tensors, which float8 lacks.
    raw = (
        torch.empty(outs[0].shape, dtype=torch.uint8, device="cuda"),
        *map(torch.empty_like, outs[1:]),
    )
    torch.library.opcheck(ops.quantize_q.default, (qq, *raw))


def _step(cache, layers, q, bt, sl, plan, workspace, c_kv, k_pe, slots, max_pages, precision):
    """A decode step of ``layers`` layers: append the new tokens, plan, decode each layer."""
    outs = []
    smt.plan(plan, sl, num_heads=q.shape[3], q_len=q.shape[2], max_pages=max_pages,
             q_precision=precision)  # fmt: skip
    for layer in range(layers):
        smt.append(cache, layer, c_kv[layer], k_pe[layer], slots)
        out, _ = smt.decode(cache, layer, q[layer], bt, sl, plan, workspace,
                            softmax_scale=SM_SCALE, q_precision=precision)  # fmt: skip
        outs.append(out)
    return torch.stack(outs)


@pytest.mark.parametrize("precision", ["fp8", "fp8x2"])
def test_compile_fullgraph_and_cuda_graph_match_eager(
    rng: np.random.Generator, precision: str
) -> None:
    layers, b, h = 4, 3, 16
    case = make_case(rng, [130, 64, 1], num_heads=h, num_layers=layers)
    cache = smt.empty_cache(layers, case.num_pages, device="cuda")
    image = to_torch(case.image)
    _, bt, sl = device_inputs(case)
    # Each request's newest token is appended again in the step (its slot: seqlen - 1).
    slots = torch.from_numpy(
        np.array(
            [page_slots(case.block_table[r], int(n))[-1] for r, n in enumerate(case.seqlens)],
            np.int64,
        )
    ).cuda()
    c_kv = to_torch(ref_rows(rng, (layers, b, 512)))
    k_pe = to_torch(ref_rows(rng, (layers, b, 64)))
    q = to_torch(ref_rows(rng, (layers, b, 1, h, 576)))
    plan, workspace = smt.decode_buffers(
        8, num_heads=h, max_pages=case.max_pages, q_precision=precision
    )  # a padded batch
    args = (cache, layers, q, bt, sl, plan, workspace, c_kv, k_pe, slots, case.max_pages,
            precision)  # fmt: skip

    cache.view(-1).copy_(image)
    eager = _step(*args)
    compiled_fn = torch.compile(_step, fullgraph=True)
    cache.view(-1).copy_(image)
    compiled = compiled_fn(*args)
    synchronize()
    assert torch.equal(eager.view(torch.int16), compiled.view(torch.int16))
    assert torch.isfinite(eager.float()).all()

    # CUDA graph: capture the eager step (no stream= anywhere), replay on restored memory.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cache.view(-1).copy_(image)
        _step(*args)  # warm-up: handles and sizes are made outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _step(*args)
    cache.view(-1).copy_(image)
    graph.replay()
    synchronize()
    assert torch.equal(eager.view(torch.int16), captured.view(torch.int16))


def test_refusals_name_the_argument(rng: np.random.Generator) -> None:
    case, cache, q, bt, sl = _torch_case(rng, [100], 16)
    plan, workspace = smt.decode_buffers(1, num_heads=16, max_pages=case.max_pages)
    smt.plan(plan, sl, num_heads=16, max_pages=case.max_pages)
    out, lse = poisoned_outputs(1, 1, 16)
    with pytest.raises(snapmla.SnapMLAError, match="'q'"):
        smt.decode(
            cache, 0, q.float(), bt, sl, plan, workspace, softmax_scale=SM_SCALE, out=out, lse=lse
        )
    with pytest.raises(snapmla.SnapMLAError, match="layer'"):
        smt.decode(cache, 7, q, bt, sl, plan, workspace, softmax_scale=SM_SCALE, out=out, lse=lse)
    with pytest.raises(snapmla.SnapMLAError, match="'workspace'"):
        smt.decode(
            cache, 0, q, bt, sl, plan, workspace[:16], softmax_scale=SM_SCALE, out=out, lse=lse
        )
    with pytest.raises(snapmla.SnapMLAError, match="'out'"):
        smt.decode(
            cache, 0, q, bt, sl, plan, workspace, softmax_scale=SM_SCALE, out=q[..., :512], lse=lse
        )
    synchronize()
    assert torch.isnan(out.float()).all(), "a refused call wrote its output"


def test_decode_memo_hit_refuses_what_the_checks_refuse(rng: np.random.Generator) -> None:
    """A call that differs from an earlier accepted one (in the op's call memo) only by a
    tensor's layout or dtype at the same address and shape is still refused, and writes
    nothing: the memo keys the contiguous-required tensors by is_contiguous(), not strides."""
    case, cache, q, bt, sl = _torch_case(rng, [100], 16)
    plan, workspace = smt.decode_buffers(1, num_heads=16, max_pages=case.max_pages)
    smt.plan(plan, sl, num_heads=16, max_pages=case.max_pages)
    out, lse = poisoned_outputs(1, 1, 16)

    def call(**changed):
        a = {
            "cache": cache,
            "q": q,
            "block_table": bt,
            "cache_seqlens": sl,
            "plan": plan,
            "workspace": workspace,
            "out": out,
            "lse": lse,
        }
        a.update(changed)
        return smt.decode(
            a["cache"], 0, a["q"], a["block_table"], a["cache_seqlens"], a["plan"],
            a["workspace"], softmax_scale=SM_SCALE, out=a["out"], lse=a["lse"],
        )  # fmt: skip

    for _ in range(2):  # accepted, then a memo hit
        call()
    synchronize()
    want = out.clone()
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    # same address and shape, not contiguous
    for name, base, strides in (("out", out, (8192, 8192, 1, 16)), ("lse", lse, (16, 0, 1))):
        bad = base.as_strided(base.shape, strides)
        assert bad.data_ptr() == base.data_ptr() and not bad.is_contiguous()
        with pytest.raises(snapmla.SnapMLAError, match=f"'{name}'"):
            call(**{name: bad})
    # same address and shape, another dtype of the same width
    for name, bad in (
        ("out", out.view(torch.float16)),
        ("lse", lse.view(torch.int32)),
        ("cache_seqlens", sl.view(torch.float32)),
        ("block_table", bt.view(torch.float32)),
        ("plan", plan.view(torch.int8)),
        ("workspace", workspace.view(torch.int8)),
    ):
        with pytest.raises(snapmla.SnapMLAError, match=f"'{name}'"):
            call(**{name: bad})
    synchronize()
    assert torch.isnan(out.float()).all() and torch.isnan(lse).all(), "a refused call wrote"
    call()  # the accepted call again: the same bits
    synchronize()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
