"""bench/flashmla/flashmla.py, the ctypes adapter over FlashMLA's kernels (bench/flashmla/shim.cu):
its FP8 quantizer writes FlashMLA's 656-byte token (E4M3 content, four fp32 scales, BF16 RoPE)
byte for byte as a numpy model of that layout does and round-trips within E4M3's precision; its
index builder makes the sparse decode dense attention (every token of a request in block-table
order, causal rows for q_len > 1, -1 past the end, topk a multiple of 64); without the library it
says why, cleanly. Where the library is built, its argument checks answer without a GPU; on a GPU,
both kernels match an fp32 reference."""

from __future__ import annotations

import ctypes
import math
import struct
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from _bench_module import bench_module

torch = pytest.importorskip("torch")

ADAPTER = Path(__file__).resolve().parents[1] / "bench" / "flashmla" / "flashmla.py"


@pytest.fixture(scope="module")
def fm() -> ModuleType:
    return bench_module("flashmla/flashmla")


def _bf16(rng: np.random.Generator, shape: tuple, std: float = 0.5) -> torch.Tensor:
    return torch.from_numpy(rng.normal(0.0, std, shape).astype(np.float32)).bfloat16()


def _pages(rng: np.random.Generator, pages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """BF16 content and RoPE pages with the scale's edge cases in page 0: a zero tile, a tile
    of tiny values (E4M3 subnormals), a tile whose amax / 448 is a power of two exactly, and a
    tile of large values."""
    ckv = _bf16(rng, (pages, 64, 512))
    kpe = _bf16(rng, (pages, 64, 64))
    ckv[0, 0, 0:128] = 0.0
    ckv[0, 1, 128:256] = _bf16(rng, (128,), 1e-5)
    ckv[0, 2, 256:384] = _bf16(rng, (128,), 0.2)
    ckv[0, 2, 300] = 448.0 * 2.0**-9  # the tile's amax: scale 2^-9, this value E4M3 448
    ckv[0, 3, 384:512] = _bf16(rng, (128,), 3000.0)
    return ckv, kpe


# ------------------------------------------------------------------------------ numpy model


def _model_token(content: np.ndarray, rope_bits: np.ndarray) -> bytes:
    """One 656-byte token from float32 content [512] and RoPE BF16 bit patterns [64] (uint16):
    per 128 values the scale 2^ceil(log2(amax / 448)) (1 for a zero tile), E4M3 of value / scale
    in 512 bytes, the four scales as little-endian fp32, then the RoPE bits little-endian."""
    codes = bytearray()
    scales = []
    for k in range(4):
        tile = content[128 * k : 128 * (k + 1)].astype(np.float32)
        x = float(np.float32(np.abs(tile).max()) / np.float32(448.0))
        if x == 0.0:
            scale = 1.0
        else:
            mantissa, exponent = math.frexp(x)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
            scale = math.ldexp(1.0, exponent - 1 if mantissa == 0.5 else exponent)
        scales.append(scale)
        q = (tile / np.float32(scale)).astype(ml_dtypes.float8_e4m3fn)
        codes += q.view(np.uint8).tobytes()
    return bytes(codes) + struct.pack("<4f", *scales) + rope_bits.astype("<u2").tobytes()


def _dequant(kv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[n, 656] uint8 tokens -> content [n, 512] fp32 (codes times scales), scales [n, 4] and
    RoPE [n, 64] as float32."""
    codes = kv[:, :512].copy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scales = kv[:, 512:528].copy().view("<f4")
    rope = kv[:, 528:656].copy().view(ml_dtypes.bfloat16).astype(np.float32)
    return codes * np.repeat(scales, 128, axis=1), scales, rope


def test_quantizer_writes_the_656_byte_token(fm: ModuleType, rng: np.random.Generator) -> None:
    ckv, kpe = _pages(rng, 3)
    kv = fm.quantize_fp8_cache(torch, ckv, kpe, chunk_pages=2)  # chunks: 2 pages, then 1
    assert kv.shape == (3, 64, 656) and kv.dtype == torch.uint8
    assert fm.FP8_TOKEN_BYTES == 656 and (fm.SCALES_OFFSET, fm.ROPE_OFFSET) == (512, 528)
    got = kv.reshape(-1, 656).numpy()
    content = ckv.float().reshape(-1, 512).numpy()
    rope_bits = kpe.reshape(-1, 64).view(torch.int16).numpy().view(np.uint16)
    for n in range(got.shape[0]):
        want = _model_token(content[n], rope_bits[n])
        assert got[n].tobytes() == want, f"token {n}"


def test_quantizer_round_trips(fm: ModuleType, rng: np.random.Generator) -> None:
    ckv, kpe = _pages(rng, 2)
    kv = fm.quantize_fp8_cache(torch, ckv, kpe).reshape(-1, 656).numpy()
    content, scales, rope = _dequant(kv)
    x = ckv.float().reshape(-1, 512).numpy()
    np.testing.assert_array_equal(rope, kpe.float().reshape(-1, 64).numpy())
    amax = np.abs(x).reshape(-1, 4, 128).max(axis=-1)
    assert np.all(np.log2(scales) == np.round(np.log2(scales)))  # powers of two
    nonzero = amax > 0
    assert np.all(scales[nonzero] * 448 >= amax[nonzero])
    assert np.all(scales[nonzero] * 448 < 2 * amax[nonzero])
    assert np.all(scales[~nonzero] == 1.0) and (~nonzero).sum() == 1
    # E4M3: 3 mantissa bits (relative half-step 2^-4), subnormal step 2^-9 times the scale
    step = np.maximum(np.abs(x) * 2.0**-4, np.repeat(scales, 128, axis=1) * 2.0**-10)
    assert np.all(np.abs(content - x) <= step)
    assert content[2, 300] == x[2, 300] == 448.0 * 2.0**-9


def _indices_loop(tables: np.ndarray, lens: list[int], q_len: int, causal: bool) -> np.ndarray:
    topk = max(64, -(-max(lens) // 64) * 64)
    out = np.full((tables.shape[0], len(lens), q_len, topk), -1, dtype=np.int64)
    for c in range(tables.shape[0]):
        for r, n in enumerate(lens):
            for t in range(q_len):
                sees = n - (q_len - 1 - t) if causal else n
                for j in range(sees):
                    out[c, r, t, j] = tables[c, r, j // 64] * 64 + j % 64
    return out


@pytest.mark.parametrize(("q_len", "causal"), [(1, False), (3, True), (2, False)])
def test_dense_indices(fm: ModuleType, rng: np.random.Generator, q_len: int, causal: bool) -> None:
    lens = [3, 64, 150, 65]  # one page, a full page, three pages, just past a page
    tables = rng.permutation(2 * 4 * 3).reshape(2, 4, 3).astype(np.int32)
    got = fm.dense_indices(torch, torch.from_numpy(tables), torch.tensor(lens), q_len, causal)
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert got.shape == (2, 4, q_len, 192) and got.shape[-1] % 64 == 0
    np.testing.assert_array_equal(got.numpy(), _indices_loop(tables, lens, q_len, causal))
    if not causal:  # every query token sees the whole request
        assert bool((got == got[:, :, :1]).all())


def test_dense_indices_refuse(fm: ModuleType) -> None:
    tables = torch.zeros(1, 2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="pages a request"):
        fm.dense_indices(torch, tables, torch.tensor([10, 129]), 1, False)
    with pytest.raises(ValueError, match="length >= 1"):
        fm.dense_indices(torch, tables, torch.tensor([10, 0]), 1, False)
    with pytest.raises(ValueError, match="shape"):
        fm.dense_indices(torch, tables, torch.tensor([10]), 1, False)


def test_unavailable_without_the_library(
    fm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "libflashmla_shim.so"
    monkeypatch.setenv(fm.LIB_ENV, str(missing))
    assert fm.library_path() == str(missing)
    assert fm.available() is False
    reason = fm.unavailable_reason()
    assert reason and str(missing) in reason and "build.sh" in reason
    for kernel in (fm.DenseBF16, fm.SparseFP8):
        with pytest.raises(fm.Unavailable, match="no FlashMLA shim"):
            kernel(0.1)
    missing.write_text("not a shared library\n")
    assert fm.available() is False
    assert "cannot load" in (fm.unavailable_reason() or "")
    monkeypatch.delenv(fm.LIB_ENV)
    assert fm.library_path().endswith(".carry/flashmla/libflashmla_shim.so")


def _built_library(fm: ModuleType) -> ctypes.CDLL:
    if not fm.available():
        pytest.skip(f"FlashMLA shim not built: {fm.unavailable_reason()}")
    return fm.load()


def test_shim_checks_arguments_without_a_gpu(fm: ModuleType) -> None:
    """Calls that fail their argument checks return 1 and a message naming the argument before
    any CUDA call (so they are safe with or without a GPU); the workspace size follows the
    documented layout."""
    lib = _built_library(fm)
    assert lib.fm_abi_version() == fm.ABI_VERSION
    commit = lib.fm_flashmla_commit().decode()
    assert commit == "unknown" or len(commit.split("-")[0]) == 40
    size = ctypes.c_int64()
    assert lib.fm_workspace_bytes(0, 1, 128, 66, ctypes.byref(size)) == 1
    assert "b must" in lib.fm_last_error().decode()
    assert lib.fm_workspace_bytes(2, 1, 128, 161, ctypes.byref(size)) == 1
    assert "num_sm_parts" in lib.fm_last_error().decode()
    b, s_q, h, parts = 3, 2, 64, 40

    def up(x: int) -> int:
        return -(-x // 256) * 256

    rows = (b + parts) * s_q * h
    want = up(parts * 32) + up((b + 1) * 4) + up(rows * 4) + up(rows * 512 * 4)
    assert lib.fm_workspace_bytes(b, s_q, h, parts, ctypes.byref(size)) == 0
    assert size.value == want
    # plausible (aligned, non-null) pointers that must never be dereferenced: every call below
    # fails an argument check first
    p = 1 << 20
    rc = lib.fm_sparse_fp8_decode(p, p, 4, p, 64, p, p, b, s_q, 16, 0.1, parts, p, None)
    assert rc == 1 and "h_q must be 64 or 128" in lib.fm_last_error().decode()
    rc = lib.fm_sparse_fp8_decode(p, p, 4, p, 100, p, p, b, s_q, 64, 0.1, parts, p, None)
    assert rc == 1 and "topk" in lib.fm_last_error().decode()
    rc = lib.fm_dense_decode(p + 8, p, 4, p, 4, p, p, p, b, s_q, h, 0.1, 1, parts, p, None)
    assert rc == 1 and "q must be" in lib.fm_last_error().decode()
    rc = lib.fm_dense_decode(p, p, 4, p, 4, p, p, p, b, s_q, h, float("nan"), 1, parts, p, None)
    assert rc == 1 and "softmax_scale" in lib.fm_last_error().decode()
    rc = lib.fm_dense_metadata(p, b, s_q, h, parts, p + 16, None)
    assert rc == 1 and "workspace" in lib.fm_last_error().decode()


# ------------------------------------------------------------------------------ bench_decode.py


@pytest.fixture(scope="module")
def bench_decode() -> ModuleType:
    return bench_module("bench_decode")


def test_bench_opens_flashmla_from_flash_mla_or_the_shim(
    bench_decode: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without flash_mla, the BF16 decode comes from the shim where it is built; the FP8 one
    only from the shim; without either, both are None and the environment says why; the
    options leave each out."""
    monkeypatch.setitem(sys.modules, "flash_mla", None)  # import flash_mla raises ImportError
    shim = bench_decode.flashmla_shim()
    assert shim.__file__ == str(ADAPTER)
    parse = bench_decode._parser().parse_args
    monkeypatch.setenv(shim.LIB_ENV, str(tmp_path / "absent.so"))
    env: dict = {}
    assert bench_decode.open_flashmla(parse([]), env) == (None, None)
    assert "flash_mla" in env["flashmla"] and "no FlashMLA shim" in env["flashmla"]
    assert env["flashmla_fp8"].startswith("unavailable: ") and "build.sh" in env["flashmla_fp8"]
    env = {}
    assert bench_decode.open_flashmla(parse(["--no-flashmla", "--no-flashmla-fp8"]), env) == (
        None,
        None,
    )
    assert env == {}
    monkeypatch.delenv(shim.LIB_ENV)
    if not shim.available():
        return  # the rest needs the built library (no GPU: constructing one loads it only)
    env = {}
    fm, fm8 = bench_decode.open_flashmla(parse([]), env)
    assert isinstance(fm, shim.DenseBF16) and isinstance(fm8, shim.SparseFP8)
    assert env["flashmla"] == env["flashmla_fp8"] == shim.version()
    fm, fm8 = bench_decode.open_flashmla(parse(["--no-flashmla-fp8"]), {})
    assert isinstance(fm, shim.DenseBF16) and fm8 is None


def test_bench_reports_flashmla_fp8(bench_decode: ModuleType) -> None:
    """The summary lists FlashMLA FP8's time, our speedup over it, its topk and its error, and
    the refused case's error, not the cases of other head counts; the Markdown table gets its
    two columns only where a case has its time."""
    case = {
        "name": "64x1x128x32768",
        "snapmla": {"median_us": 500.0},
        "flashinfer": {"median_us": 1100.0},
        "speedup_vs_flashinfer": 2.2,
        "flashmla_fp8": {"supported": True, "median_us": 600.0, "topk": 32768},
        "speedup_vs_flashmla_fp8": 1.2,
        "checks": {"flashmla_fp8_vs_fp32_ref": 0.021},
        "floor": {"floor_us": 452.0},
        "target_us": 514.0,
    }
    skipped = {**case, "name": "128x1x16x16384", "speedup_vs_flashmla_fp8": None}
    skipped["flashmla_fp8"] = {"supported": False, "skipped": "64 or 128 heads only"}
    refused = {**case, "name": "32x1x64x4096", "speedup_vs_flashmla_fp8": None}
    refused["flashmla_fp8"] = {"supported": False, "error": "RuntimeError: refused"}
    text = bench_decode.table([case, skipped, refused])
    assert "FlashMLA FP8 sparse decode as dense attention, same run:" in text
    line = next(x for x in text.splitlines() if x.startswith("64x1x128x32768 ") and "topk" in x)
    assert "600.0 us" in line and "ours 1.20x" in line and "topk 32768" in line
    assert "err%ref 2.10" in line
    assert "RuntimeError: refused" in text
    assert not any(x.startswith("128x1x16x16384 ") and "topk" in x for x in text.splitlines())
    doc = {"cases": [case, skipped], "device": {"name": "H100"}, "commit": "abcdef0"}
    head, _, first, second = bench_decode.markdown_table(doc).splitlines()[2:6]
    assert "| FlashMLA FP8 | vs FlashMLA FP8 |" in head
    assert "| 600.0 | 1.20x |" in first and "| - | - |" in second
    without = {k: v for k, v in case.items() if k != "flashmla_fp8"}
    assert "FlashMLA FP8" not in bench_decode.markdown_table({**doc, "cases": [without]})
    assert "FlashMLA FP8" not in bench_decode.table([without])


# ------------------------------------------------------------------------------ on a GPU


def _reference(
    q: torch.Tensor, content: torch.Tensor, rope: torch.Tensor, slots: torch.Tensor, causal: bool
) -> torch.Tensor:
    """fp32 attention of one request: q [s_q, h, 576], the cache's content [tokens, 512] and
    RoPE [tokens, 64], the request's token slots in order -> [s_q, h, 512]."""
    c, k = content[slots].float(), torch.cat([content[slots], rope[slots]], 1).float()
    z = torch.einsum("thd,sd->ths", q.float(), k) * 192**-0.5
    s_q, n = q.shape[0], len(slots)
    if causal:
        t = torch.arange(s_q, device=q.device)[:, None]
        z = z.masked_fill(
            (torch.arange(n, device=q.device)[None] > n - s_q + t)[:, None], -math.inf
        )
    return torch.einsum("ths,sd->thd", torch.softmax(z, -1), c)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a.float() - b.float()) / torch.linalg.vector_norm(b))


@pytest.mark.gpu
@pytest.mark.parametrize(("s_q", "h"), [(1, 128), (2, 64)])
def test_kernels_match_fp32_reference(fm: ModuleType, s_q: int, h: int) -> None:
    """Both kernels on copy 1 of two block-table copies (shuffled pages), lengths across page
    boundaries, causal for s_q = 2: BF16 dense against fp32 on the BF16 pages, FP8 sparse
    against fp32 on the dequantized cache (its exact inputs)."""
    _built_library(fm)
    g = torch.Generator().manual_seed(s_q * 1000 + h)
    lens, b, copies = [2, 100, 333], 3, 2
    per = [-(-n // 64) for n in lens]
    width, pages = max(per), sum(per)
    perm = torch.randperm(copies * pages, generator=g).int()
    tables = torch.zeros(copies, b, width, dtype=torch.int32)
    for c in range(copies):
        off = c * pages
        for r in range(b):
            tables[c, r, : per[r]] = perm[off : off + per[r]]
            off += per[r]
    ckv = (torch.randn(copies * pages, 64, 512, generator=g) * 0.5).bfloat16().cuda()
    kpe = (torch.randn(copies * pages, 64, 64, generator=g) * 0.5).bfloat16().cuda()
    q = (torch.randn(b, s_q, h, 576, generator=g) * 0.5).bfloat16().cuda()
    tables, lens_t = tables.cuda(), torch.tensor(lens, dtype=torch.int32).cuda()
    case = SimpleNamespace(batch=b, q_len=s_q, heads=h)
    dense = fm.DenseBF16(192**-0.5).prepare(torch, case, ckv, kpe, tables, lens_t, q)
    sparse_kernel = fm.SparseFP8(192**-0.5)
    sparse = sparse_kernel.prepare(torch, case, ckv, kpe, tables, lens_t, q)
    out_dense = dense(1).clone()
    out_sparse = sparse(1).clone()
    torch.cuda.synchronize()
    content_q, _, rope_q = _dequant(
        fm.quantize_fp8_cache(torch, ckv, kpe).reshape(-1, 656).cpu().numpy()
    )
    content_q = torch.from_numpy(content_q).cuda()
    rope_q = torch.from_numpy(rope_q).cuda()
    content, rope = ckv.reshape(-1, 512), kpe.reshape(-1, 64)
    for r, n in enumerate(lens):
        j = torch.arange(n, device="cuda")
        slots = tables[1, r, j // 64].long() * 64 + j % 64
        want = _reference(q[r], content, rope, slots, s_q > 1)
        assert _rel(out_dense[r], want) < 1e-2, f"dense, request {r}"
        want_q = _reference(q[r], content_q, rope_q, slots, s_q > 1)
        assert _rel(out_sparse[r], want_q) < 1e-2, f"sparse, request {r}"
        assert _rel(out_sparse[r], want) < 6e-2, f"sparse vs BF16 data, request {r}"
    assert sparse_kernel.info["topk"] == 384
