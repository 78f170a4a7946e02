"""snapmla.torch without a GPU: the ops' schemas (exact mutations), their fake implementations
(checks that name the argument), torch.compile(fullgraph=True) of a decode step on fake CUDA
tensors, the host-side helpers. The GPU half is tests/gpu/test_torch_ops_gpu.py."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
smt = pytest.importorskip("snapmla.torch")
from torch._subclasses.fake_tensor import FakeTensorMode

import snapmla
from snapmla import _args, _lib

MUTATES = {
    "append": {"cache"},
    "fetch_dequant": {"c_kv", "k_pe"},
    "quantize_q": {"q_content", "q_rope", "q_scale"},
    "plan": {"plan"},
    "decode": {"workspace", "out", "lse"},
}


@pytest.mark.parametrize("name", sorted(MUTATES))
def test_schema_mutates_exactly_the_outputs(name: str) -> None:
    schema = getattr(torch.ops.snapmla, name).default._schema
    mutated = {
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write
    }
    assert mutated == MUTATES[name], schema
    assert not schema.returns, schema  # outputs are given: nothing aliases a new tensor


@pytest.mark.parametrize("name", ["plan", "decode"])
def test_schema_q_precision_is_a_trailing_int_defaulting_to_fp8(name: str) -> None:
    """plan's and decode's last argument is ``int q_precision=0`` (snapmla_q_precision_t FP8):
    calls without it keep their meaning."""
    last = getattr(torch.ops.snapmla, name).default._schema.arguments[-1]
    assert (last.name, str(last.type), last.default_value) == ("q_precision", "int", 0)
    assert not last.kwarg_only
    assert _args.Q_PRECISIONS == {"fp8": 0, "fp8x2": 1}


def _fake_step_inputs(b: int = 2, h: int = 16, s_q: int = 1, max_pages: int = 4) -> dict[str, Any]:
    cuda = "cuda"
    return {
        "cache": torch.empty(2, 8, snapmla.PAGE_BYTES, dtype=torch.uint8, device=cuda),
        "q": torch.empty(b, s_q, h, 576, dtype=torch.bfloat16, device=cuda),
        "bt": torch.empty(b, max_pages, dtype=torch.int32, device=cuda),
        "sl": torch.empty(b, dtype=torch.int32, device=cuda),
        "plan": torch.empty(4096, dtype=torch.uint8, device=cuda),
        "ws": torch.empty(1 << 20, dtype=torch.uint8, device=cuda),
        "c_kv": torch.empty(b, 512, dtype=torch.bfloat16, device=cuda),
        "k_pe": torch.empty(b, 64, dtype=torch.bfloat16, device=cuda),
        "slots": torch.empty(b, dtype=torch.int64, device=cuda),
    }


def _step(cache, q, bt, sl, plan, ws, c_kv, k_pe, slots):
    smt.append(cache, 0, c_kv, k_pe, slots)
    smt.plan(plan, sl, num_heads=q.shape[2], q_len=q.shape[1], max_pages=bt.shape[1])
    out, lse = smt.decode(cache, 0, q, bt, sl, plan, ws, softmax_scale=0.1)
    return out, lse


def _trace(step: Any) -> Any:
    """The one graph Dynamo traces of ``step`` (fullgraph) on fake CUDA step inputs, whose
    outputs have decode's shapes and dtypes."""
    graphs = []

    def record(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with FakeTensorMode():
        out, lse = torch.compile(step, fullgraph=True, backend=record)(**_fake_step_inputs())
        assert tuple(out.shape) == (2, 1, 16, 512) and out.dtype == torch.bfloat16
        assert tuple(lse.shape) == (2, 16, 1) and lse.dtype == torch.float32
    assert len(graphs) == 1
    return graphs[0]


def test_decode_step_compiles_fullgraph() -> None:
    """Dynamo traces a whole step (no graph break); the GPU test compiles it with Inductor,
    which also functionalizes the mutations, and checks it against eager."""
    code = _trace(_step).code
    order = [code.index(f"torch.ops.snapmla.{op}") for op in ("append", "plan", "decode")]
    assert order == sorted(order), code


def test_fake_decode_checks_name_the_argument() -> None:
    with FakeTensorMode():
        x = _fake_step_inputs()
        out = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(2, 16, 1, dtype=torch.float32, device="cuda")
        args = [
            x["cache"],
            0,
            x["q"],
            x["bt"],
            x["sl"],
            x["plan"],
            x["ws"],
            out,
            lse,
            0.1,
            True,
            0,
            0,
        ]
        torch.ops.snapmla.decode(*args)

        def cuda(*shape: int, dtype: Any, strides: Any = None) -> Any:
            if strides is None:
                return torch.empty(*shape, dtype=dtype, device="cuda")
            return torch.empty_strided(shape, strides, dtype=dtype, device="cuda")

        for index, bad, name in (
            (2, cuda(2, 1, 16, 576, dtype=torch.float32), "q"),
            (2, cuda(2, 1, 16, 576, dtype=torch.bfloat16, strides=(9216, 9216, 576, 2)), "q"),
            (3, cuda(1, 4, dtype=torch.int32), "block_table"),
            (4, cuda(2, dtype=torch.int64), "cache_seqlens"),
            (7, lse, "out"),
            (7, cuda(2, 1, 16, 512, dtype=torch.float16), "out"),
            (8, out, "lse"),
            (0, cuda(2, 8, 100, dtype=torch.uint8), "cache"),
            (6, cuda(1024, dtype=torch.uint8, strides=(2,)), "workspace"),
        ):
            wrong = list(args)
            wrong[index] = bad
            with pytest.raises(snapmla.SnapMLAError, match=f"argument '{name}'"):
                torch.ops.snapmla.decode(*wrong)


def test_fp32_out_through_the_op_and_the_function() -> None:
    """An fp32 out (the values the BF16 out rounds) passes the op's checks; decode
    allocates one for out_dtype=torch.float32 and refuses an out_dtype it cannot write, or one
    that is not the given out's dtype, naming the argument."""
    with FakeTensorMode():
        x = _fake_step_inputs()
        out = torch.empty(2, 1, 16, 512, dtype=torch.float32, device="cuda")
        lse = torch.empty(2, 16, 1, dtype=torch.float32, device="cuda")
        ops_args = (x["cache"], 0, x["q"], x["bt"], x["sl"], x["plan"], x["ws"])
        torch.ops.snapmla.decode(*ops_args, out, lse, 0.1, True, 0, 0)
        call = (x["cache"], 0, x["q"], x["bt"], x["sl"], x["plan"], x["ws"])
        got, _ = smt.decode(*call, softmax_scale=0.1, out_dtype=torch.float32)
        assert got.dtype == torch.float32 and tuple(got.shape) == (2, 1, 16, 512)
        got, _ = smt.decode(*call, softmax_scale=0.1, out=out)
        assert got is out
        with pytest.raises(snapmla.SnapMLAError, match="argument 'out_dtype'"):
            smt.decode(*call, softmax_scale=0.1, out_dtype=torch.float16)
        with pytest.raises(snapmla.SnapMLAError, match="argument 'out_dtype'"):
            smt.decode(*call, softmax_scale=0.1, out_dtype="float32")
        with pytest.raises(snapmla.SnapMLAError, match="argument 'out': expected bfloat16"):
            smt.decode(*call, softmax_scale=0.1, out=out, out_dtype=torch.bfloat16)


def test_fake_append_and_fetch_checks() -> None:
    with FakeTensorMode():
        x = _fake_step_inputs()
        smt.append(x["cache"], 0, x["c_kv"], x["k_pe"], x["slots"])
        with pytest.raises(snapmla.SnapMLAError, match="argument 'k_pe'"):
            smt.append(
                x["cache"],
                0,
                x["c_kv"],
                torch.empty(1, 64, dtype=torch.bfloat16, device="cuda"),
                x["slots"],
            )
        with pytest.raises(snapmla.SnapMLAError, match="argument 'slots'"):
            smt.append(
                x["cache"],
                0,
                x["c_kv"],
                x["k_pe"],
                torch.empty(2, dtype=torch.int32, device="cuda"),
            )
        c, k = smt.fetch_dequant(x["cache"], 0, x["slots"])
        assert tuple(c.shape) == (2, 512) and tuple(k.shape) == (2, 64)
        qc, _, qs = smt.quantize_q(x["q"])
        assert tuple(qc.shape) == (2, 1, 16, 512) and tuple(qs.shape) == (2, 1, 16)


def test_real_ops_refuse_cpu_tensors() -> None:
    cache = torch.empty(1, 1, snapmla.PAGE_BYTES, dtype=torch.uint8)
    c_kv = torch.zeros(1, 512, dtype=torch.bfloat16)
    k_pe = torch.zeros(1, 64, dtype=torch.bfloat16)
    slots = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(snapmla.SnapMLAError, match="argument 'cache': expected a CUDA tensor"):
        smt.append(cache, 0, c_kv, k_pe, slots)
    with pytest.raises(snapmla.SnapMLAError, match="argument 'kernel'"):
        smt.decode(cache, 0, c_kv, c_kv, c_kv, cache, cache, softmax_scale=1.0, kernel="fastest")
    with pytest.raises(snapmla.SnapMLAError, match="argument 'num_heads'"):
        smt.plan(cache, slots, num_heads=0, max_pages=1)


def test_no_overlap_names_both_tensors() -> None:
    base = torch.zeros(1024, dtype=torch.uint8)
    smt._no_overlap("op", {"out": base[:100]}, {"q": base[100:200]})
    with pytest.raises(snapmla.SnapMLAError, match="argument 'out'.*'q'"):
        smt._no_overlap("op", {"out": base[:101]}, {"q": base[100:200]})
    with pytest.raises(snapmla.SnapMLAError, match="argument 'a'.*'b'"):
        smt._no_overlap("op", {"a": base[:10], "b": base[5:20]}, {})
    strided = base.view(8, 128)[:, :4]  # 8 rows of 4 bytes, 128 apart: spans 900 bytes
    assert smt._span(strided) == (base.data_ptr(), base.data_ptr() + 7 * 128 + 4)
    assert smt._span(base[:0]) == (0, 0)


@pytest.mark.parametrize(
    ("heads", "q_len", "max_pages", "parts"),
    [(16, 1, 64, 132), (128, 1, 256, 66), (16, 4, 1024, 132)],
)
def test_plan_and_workspace_grow_with_the_batch(
    heads: int, q_len: int, max_pages: int, parts: int
) -> None:
    """decode_buffers sizes the buffers for the largest batch; that serves every smaller one
    only if neither size shrinks as the batch grows (num_sm_parts given: no GPU asked)."""
    lib = _lib.lib()
    ffi = _lib.ffi
    plan_b, ws_b = ffi.new("size_t*"), ffi.new("size_t*")
    last = (0, 0)
    for b in [*range(1, 130), 255, 256, 257, 1000, 4096, 65536]:
        _lib.check(
            lib.snapmla_decode_buffer_sizes(
                _args.decode_config(b, q_len, heads, max_pages, parts), plan_b, ws_b
            ),
            "sizes",
        )
        sizes = (int(plan_b[0]), int(ws_b[0]))
        assert sizes[0] >= last[0] and sizes[1] >= last[1], (b, sizes, last)
        last = sizes


def test_torch_ops_need_no_cupy() -> None:
    """`pip install snapmla` plus PyTorch is enough for snapmla.torch: importing it
    and tracing a step import no CuPy."""
    import subprocess
    import sys

    code = (
        "import sys, torch, snapmla.torch as smt\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "with FakeTensorMode():\n"
        "    q = torch.empty(1, 16, 576, dtype=torch.bfloat16, device='cuda')\n"
        "    smt.quantize_q(q)\n"
        "assert 'cupy' not in sys.modules, 'cupy imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_quantize_q_leading_dimensions_must_flatten() -> None:
    """q's leading dimensions are read as one token stride: a layout that does not flatten is
    refused (a size-1 dimension's stride is free), one that does is accepted."""
    with FakeTensorMode():

        def strided(shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
            return torch.empty_strided(shape, strides, dtype=torch.bfloat16, device="cuda")

        # x = [2, 5, 16, 576] compact; x[:, None, :3] does not flatten; x[:, 0:1] does.
        bad = strided((2, 1, 3, 16, 576), (46080, 46080, 9216, 576, 1))
        with pytest.raises(snapmla.SnapMLAError, match="flatten to one token stride"):
            smt.quantize_q(bad)
        good = strided((2, 1, 16, 576), (46080, 9216, 576, 1))
        qc, _, qs = smt.quantize_q(good)
        assert tuple(qc.shape) == (2, 1, 16, 512) and tuple(qs.shape) == (2, 1, 16)


def test_decode_op_memo_keys_on_every_tensor_and_scalar(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real decode op's call memo: an equal call skips the checks (``_decode_prepare``) and
    reuses its C arguments; a change of any tensor's address, shape, strides, dtype or device,
    or of any scalar, checks again. (CPU tensors with the checks and the C call stubbed: the
    GPU half runs the real op, tests/gpu/test_torch_ops_gpu.py.)"""
    prepared: list[tuple[Any, ...]] = []
    launched: list[Any] = []

    def prepare(op: str, tensors: Any, *scalars: Any) -> tuple[Any, ...]:
        prepared.append(scalars)
        return (object(), (1, 1, 16, 4, 0), None, None)

    class Lib:
        def snapmla_decode(self, handle: Any, config: Any, args: Any, *rest: Any) -> int:
            launched.append(args)
            return 0

    monkeypatch.setattr(smt, "_decode_memo", {})
    monkeypatch.setattr(smt, "_decode_prepare", prepare)
    monkeypatch.setattr(smt, "_handle", lambda cache: None)
    monkeypatch.setattr(_args, "decode_config", lambda *key: None)
    monkeypatch.setattr(smt, "_stream_of", lambda index: None)
    monkeypatch.setattr(smt, "_current_device", lambda: None)  # a CPU tensor's device index
    monkeypatch.setattr(_lib, "lib", lambda: Lib())
    base = torch.zeros(4096, dtype=torch.uint8)
    tensors = {
        "cache": base[:1024].view(1, 1, 1024),
        "q": torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16),
        "block_table": torch.zeros(1, 4, dtype=torch.int32),
        "cache_seqlens": torch.zeros(1, dtype=torch.int32),
        "plan": base[1024:2048],
        "workspace": base[2048:],
        "out": torch.zeros(1, 1, 16, 512, dtype=torch.bfloat16),
        "lse": torch.zeros(1, 16, 1, dtype=torch.float32),
    }
    scalars = {
        "softmax_scale": 0.5,
        "causal": True,
        "kernel": 0,
        "num_sm_parts": 0,
        "q_precision": 0,
    }

    def call(layer: int = 0, **changes: Any) -> None:
        t = {**tensors, **{k: v for k, v in changes.items() if k in tensors}}
        s = {**scalars, **{k: v for k, v in changes.items() if k in scalars}}
        smt._decode(
            t["cache"],
            layer,
            t["q"],
            t["block_table"],
            t["cache_seqlens"],
            t["plan"],
            t["workspace"],
            t["out"],
            t["lse"],
            s["softmax_scale"],
            s["causal"],
            s["kernel"],
            s["num_sm_parts"],
            s["q_precision"],
        )

    call()
    call()
    assert len(prepared) == 1 and len(launched) == 2 and launched[0] is launched[1]
    q = tensors["q"]
    changes = [
        {"layer": 1},
        {"softmax_scale": 0.25},
        {"causal": False},
        {"kernel": 1},
        {"num_sm_parts": 7},
        {"q_precision": 1},
        {"q": q.clone()},  # another address
        {"q": q.view(1, 16, 1, 576)},  # another shape
        {"q": torch.zeros(1, 1, 16, 1152, dtype=torch.bfloat16)[..., :576]},  # strides
        {"q": q.view(torch.float16)},  # dtype
        {"out": torch.zeros(1, 1, 16, 512, dtype=torch.float32)},  # an fp32 out
        {"plan": base[1024:2040]},  # a shorter plan buffer
    ]
    for i, change in enumerate(changes):
        layer = change.pop("layer", 0)
        call(layer, **change)
        assert len(prepared) == 2 + i, change
    call()  # the first call's key again: still kept
    assert len(prepared) == 1 + len(changes)


def test_eager_calls_skip_the_dispatcher_only_where_nothing_needs_the_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The public functions call the op's implementation directly only for plain tensors and
    ints, outside torch.compile's tracing, dispatch modes and the profiler; the rest goes
    through torch.ops.snapmla.* (which costs host time)."""
    plain = torch.zeros(4)
    assert smt._eager(plain, plain, ints=(0, 3))
    assert not smt._eager(plain, torch.nn.Parameter(plain))  # a subclass
    assert not smt._eager(plain, ints=(True,))  # a bool for an int
    assert not smt._eager(plain, ints=(torch.tensor(1),))
    with FakeTensorMode():
        assert not smt._eager(plain)  # a dispatch mode
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not smt._eager(plain)
    monkeypatch.setattr(smt, "_is_compiling", lambda: True)  # torch.compile tracing
    assert not smt._eager(plain)
    monkeypatch.undo()

    # The eager public call reaches the implementation directly, with the op's arguments.
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(smt, "_decode", lambda *args: seen.append(args))
    monkeypatch.setattr(smt, "_append", lambda *args: seen.append(args))
    cache = torch.empty(1, 1, snapmla.PAGE_BYTES, dtype=torch.uint8)
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16)
    out, lse = torch.zeros(1, 1, 16, 512), torch.zeros(1, 16, 1)
    got = smt.decode(
        cache, 2, q, cache, cache, cache, cache, softmax_scale=0.5, kernel="fast", out=out, lse=lse
    )
    assert got[0] is out and got[1] is lse
    assert len(seen) == 1 and seen[0][1] == 2 and seen[0][7] is out and seen[0][8] is lse
    assert seen[0][9:] == (0.5, True, _args.KERNELS["fast"], 0, 0)
    smt.decode(cache, 2, q, cache, cache, cache, cache, softmax_scale=0.5, q_precision="fp8x2",
               out=out, lse=lse)  # fmt: skip
    assert seen[-1][9:] == (0.5, True, _args.KERNELS["auto"], 0, _args.Q_PRECISIONS["fp8x2"])
    del seen[1:]
    smt.append(cache, 1, q, q, q)
    assert len(seen) == 2 and seen[1] == (cache, 1, q, q, q)

    # Not eager (a bool layer): through the dispatcher, whose schema refuses it.
    with pytest.raises(Exception) as refused:
        smt.append(cache, True, q, q, q)
    assert len(seen) == 2, refused.value


# ------------------------------------------------------------------- the two-term query


def _step_x2(cache, q, bt, sl, plan, ws, c_kv, k_pe, slots):
    smt.plan(plan, sl, num_heads=q.shape[2], q_len=q.shape[1], max_pages=bt.shape[1],
             q_precision="fp8x2")  # fmt: skip
    return smt.decode(cache, 0, q, bt, sl, plan, ws, softmax_scale=0.1, q_precision="fp8x2")


def test_fp8x2_step_compiles_fullgraph_with_the_precision_in_the_graph() -> None:
    graph = _trace(_step_x2)
    nodes = {
        n.target.__name__.split(".")[0]: n
        for n in graph.graph.nodes
        if n.op == "call_function" and "snapmla" in str(n.target)
    }
    assert set(nodes) == {"plan", "decode"}, graph.code
    for name, node in nodes.items():
        schema = getattr(torch.ops.snapmla, name).default._schema
        args = dict(zip((a.name for a in schema.arguments), node.args))
        args.update(node.kwargs)
        assert args["q_precision"] == _args.Q_PRECISIONS["fp8x2"], (name, graph.code)


def test_fake_ops_check_q_precision() -> None:
    with FakeTensorMode():
        x = _fake_step_inputs()
        out = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(2, 16, 1, dtype=torch.float32, device="cuda")
        args = (x["cache"], 0, x["q"], x["bt"], x["sl"], x["plan"], x["ws"], out, lse, 0.1, True,
                0, 0)  # fmt: skip
        torch.ops.snapmla.decode(*args, 1)
        torch.ops.snapmla.plan(x["plan"], x["sl"], 1, 16, 4, 0, 1)
        for bad in (2, -1):
            with pytest.raises(snapmla.SnapMLAError, match="argument 'q_precision'"):
                torch.ops.snapmla.decode(*args, bad)
            with pytest.raises(snapmla.SnapMLAError, match="argument 'q_precision'"):
                torch.ops.snapmla.plan(x["plan"], x["sl"], 1, 16, 4, 0, bad)


@pytest.mark.parametrize("bad", ["fp16", "FP8X2", 1, None])
def test_functions_refuse_a_q_precision_by_name(bad: Any) -> None:
    cache = torch.empty(1, 1, snapmla.PAGE_BYTES, dtype=torch.uint8)
    sl = torch.zeros(1, dtype=torch.int32)
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16)
    match = "argument 'q_precision': expected 'fp8' or 'fp8x2'"
    with pytest.raises(snapmla.SnapMLAError, match=match):
        smt.decode_buffers(1, num_heads=16, max_pages=1, q_precision=bad)
    with pytest.raises(snapmla.SnapMLAError, match=match):
        smt.plan(cache.view(-1), sl, num_heads=16, max_pages=1, q_precision=bad)
    with pytest.raises(snapmla.SnapMLAError, match=match):
        smt.decode(cache, 0, q, sl, sl, cache, cache, softmax_scale=0.1, q_precision=bad)


def _c_sizes(b: int, q_len: int, h: int, max_pages: int, parts: int, precision: int):
    ffi = _lib.ffi
    plan_b, ws_b = ffi.new("size_t*"), ffi.new("size_t*")
    config = _args.decode_config(b, q_len, h, max_pages, parts, precision)
    _lib.check(_lib.lib().snapmla_decode_buffer_sizes(config, plan_b, ws_b), "sizes")
    return int(plan_b[0]), int(ws_b[0])


@pytest.mark.parametrize(("b", "q_len", "heads"), [(4, 1, 16), (3, 2, 16), (2, 1, 128)])
def test_decode_buffers_are_sized_for_the_precision(b: int, q_len: int, heads: int) -> None:
    """decode_buffers allocates what the C library asks for the precision (num_sm_parts
    given: no GPU asked; fake CUDA tensors): the two-term query's workspace is larger."""
    kw = dict(num_heads=heads, q_len=q_len, max_pages=64, num_sm_parts=66, device="cuda")
    with FakeTensorMode():
        got = {
            p: tuple(t.shape[0] for t in smt.decode_buffers(b, **kw, q_precision=p))
            for p in ("fp8", "fp8x2")
        }
        assert got["fp8"] == tuple(t.shape[0] for t in smt.decode_buffers(b, **kw))
    want = {p: _c_sizes(b, q_len, heads, 64, 66, c) for p, c in _args.Q_PRECISIONS.items()}
    assert got == want
    assert want["fp8x2"][1] > want["fp8"][1], want


class _Recorder:
    """The library with its plan and decode calls recorded (and not run): the config each C
    call received."""

    def __init__(self) -> None:
        self.real = _lib.lib()
        self.calls: list[tuple[str, int, int, int]] = []

    def _record(self, name: str, config: Any) -> None:
        self.calls.append((name, config.q_precision, config.plan_bytes, config.workspace_bytes))

    def snapmla_decode_buffer_sizes(self, config: Any, *rest: Any) -> int:
        self._record("snapmla_decode_buffer_sizes", config)
        return self.real.snapmla_decode_buffer_sizes(config, *rest)

    def snapmla_decode_plan(self, config: Any, *rest: Any) -> int:
        self._record("snapmla_decode_plan", config)
        return 0

    def snapmla_decode(self, handle: Any, config: Any, *rest: Any) -> int:
        self._record("snapmla_decode", config)
        return 0


@pytest.mark.parametrize("precision", ["fp8", "fp8x2"])
def test_plan_and_decode_pass_the_precision_to_the_c_config(
    monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """The real plan and decode ops (CPU tensors, the CUDA checks and the launches stubbed):
    every C config they build carries the precision, the buffer sizes asked with it and the
    buffers' real sizes; a workspace sized for the one-term query is refused for the two-term
    one, naming 'workspace', before any launch."""
    code = _args.Q_PRECISIONS[precision]
    b, h, max_pages, parts = 3, 16, 4, 5
    plan_bytes, ws_bytes = _c_sizes(b, 1, h, max_pages, parts, code)
    fp8_ws_bytes = _c_sizes(b, 1, h, max_pages, parts, 0)[1]
    recorder = _Recorder()
    monkeypatch.setattr(_lib, "lib", lambda: recorder)
    monkeypatch.setattr(smt, "_sizes", {})
    monkeypatch.setattr(smt, "_decode_memo", {})
    monkeypatch.setattr(smt, "_check", lambda *args, **kw: None)  # (CPU tensors)
    monkeypatch.setattr(smt, "_handle", lambda cache: None)
    monkeypatch.setattr(smt, "_stream_of", lambda index: None)
    monkeypatch.setattr(smt, "_current_device", lambda: None)
    plan = torch.zeros(plan_bytes, dtype=torch.uint8)
    workspace = torch.zeros(ws_bytes, dtype=torch.uint8)
    cache = torch.zeros(1, 1, snapmla.PAGE_BYTES, dtype=torch.uint8)
    q = torch.zeros(b, 1, h, 576, dtype=torch.bfloat16)
    bt = torch.zeros(b, max_pages, dtype=torch.int32)
    sl = torch.zeros(b, dtype=torch.int32)
    kw = dict(num_heads=h, max_pages=max_pages, num_sm_parts=parts, q_precision=precision)
    smt.plan(plan, sl, **kw)
    smt.decode(cache, 0, q, bt, sl, plan, workspace, softmax_scale=0.1, num_sm_parts=parts,
               q_precision=precision)  # fmt: skip
    assert recorder.calls == [
        ("snapmla_decode_buffer_sizes", code, 0, 0),
        ("snapmla_decode_plan", code, plan_bytes, 0),
        ("snapmla_decode", code, plan_bytes, ws_bytes),
    ]
    if precision == "fp8x2":
        del recorder.calls[:]
        fp8_ws = torch.zeros(fp8_ws_bytes, dtype=torch.uint8)
        assert fp8_ws.shape[0] < ws_bytes
        with pytest.raises(snapmla.SnapMLAError, match="argument 'workspace': expected at least"):
            smt.decode(cache, 0, q, bt, sl, plan, fp8_ws, softmax_scale=0.1, num_sm_parts=parts,
                       q_precision=precision)  # fmt: skip
        assert all(name != "snapmla_decode" for name, *_ in recorder.calls)
