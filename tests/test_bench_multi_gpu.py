"""bench/bench_multi_gpu.py's host-only parts (its command line, the head shards, the head-by-head
comparison, the Markdown of a result), the GPU session's multi-gpu stage, and the C example's
--devices code compiled against the CUDA headers. No GPU or torch needed."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import ml_dtypes
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_bench_multi_gpu", BENCH / "bench_multi_gpu.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_command_line(bench: ModuleType) -> None:
    args = bench.parse_args([])
    assert args.mode == "both" and args.heads == 128 and args.q_len == 1
    assert args.timing_s == 0.3 and args.num_sm_parts == 0 and args.kernel == "auto"
    assert (args.tp_batch, args.tp_context) == bench.SHAPES["tp"]["full"]
    assert (args.dp_batch, args.dp_context) == bench.SHAPES["dp"]["full"]
    quick = bench.parse_args(["tp", "--quick"])
    assert quick.mode == "tp" and quick.timing_s == 0.05
    assert (quick.tp_batch, quick.tp_context) == bench.SHAPES["tp"]["quick"]
    given = bench.parse_args(["dp", "--batch", "3", "--context", "100", "--timing-s", "1"])
    assert (given.dp_batch, given.dp_context, given.tp_batch) == (3, 100, 3)
    assert given.timing_s == 1.0
    for bad in (["--heads", "0"], ["--heads", "129"], ["--q-len", "5"], ["--batch", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    with pytest.raises(SystemExit):
        bench.parse_args(["pp"])


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_heads_of_rank_partition_the_heads(bench: ModuleType, world: int) -> None:
    shards = [bench.heads_of_rank(128, world, r) for r in range(world)]
    assert [h for s in shards for h in s] == list(range(128))
    assert {len(s) for s in shards} == {128 // world}


def test_heads_of_rank_refuses_uneven_shards(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="do not divide"):
        bench.heads_of_rank(128, 3, 0)
    with pytest.raises(ValueError, match="outside"):
        bench.heads_of_rank(128, 2, 2)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def test_head_agreement(bench: ModuleType) -> None:
    rng = np.random.default_rng(0)
    want = _bf16_bits(rng.standard_normal((2, 1, 4, 512)))
    same = bench.head_agreement(want.copy(), want)
    assert same["heads"] == same["identical_heads"] == 4
    assert same["first_differing_heads"] == [] and same["max_abs_diff"] == 0.0
    assert same["rel_l2"] == 0.0 and same["nonfinite_mismatch"] == 0
    got = want.copy()
    got[1, 0, 2, 7] += 1  # one ulp of one element of head 2
    one = bench.head_agreement(got, want)
    assert one["identical_heads"] == 3 and one["first_differing_heads"] == [2]
    g = got[1, 0, 2, 7].view(ml_dtypes.bfloat16).astype(np.float64)
    w = want[1, 0, 2, 7].view(ml_dtypes.bfloat16).astype(np.float64)
    assert one["max_abs_diff"] == pytest.approx(abs(g - w))
    assert 0.0 < one["rel_l2"] < 1e-2
    np.testing.assert_array_equal(
        bench.bf16_to_float(want), want.view(ml_dtypes.bfloat16).astype(np.float32)
    )
    with pytest.raises(ValueError):
        bench.head_agreement(want[:, :, :2], want)


def _fake_result() -> dict:
    """A result as main() writes it, for 2 GPUs, both modes."""
    return {
        "schema": "snapmla.bench_multi_gpu/1",
        "commit": "0123456789abcdef",
        "date": "2026-12-10T10:00:00+00:00",
        "world_size": 2,
        "devices": [{"rank": r, "name": "NVIDIA H100 80GB HBM3", "sm_count": 132} for r in (0, 1)],
        "tp": {
            "settings": {
                "num_heads": 128,
                "heads_per_rank": 64,
                "batch": 16,
                "context": 4096,
                "q_len": 1,
            },
            "single_us": 100.0,
            "tp_max_us": 80.0,
            "per_rank_us": [79.0, 80.0],
            "speedup": 1.25,
            "shards_identical": True,
            "vs_all_heads": {"heads": 128, "identical_heads": 128},
        },
        "dp": {
            "settings": {"num_heads": 128, "batch": 16, "context": 4096, "q_len": 1},
            "single_tokens_per_s": 100000.0,
            "aggregate_tokens_per_s": 195000.0,
            "ratio": 1.95,
            "per_rank_us": [160.0, 164.5],
            "outputs_identical": False,
        },
    }


def test_markdown(bench: ModuleType) -> None:
    text = bench.markdown(_fake_result())
    lines = text.splitlines()
    assert lines[0].startswith("2 x NVIDIA H100 80GB HBM3, commit 0123456, 2026-12-10")
    assert "| 2 | 64 | 100.0 | 80.0 | 1.25x | yes | 128 / 128 |" in lines
    assert "| 2 | 100000 | 195000 | 1.95x | 160.0 .. 164.5 | NO |" in lines
    for table_head in [l for l in lines if l.startswith("| GPUs")]:
        rule = lines[lines.index(table_head) + 1]
        assert table_head.count("|") == rule.count("|")  # a well-formed Markdown table
    tp_only = _fake_result()
    del tp_only["dp"]
    tp_only["tp"]["shards_identical"] = None  # not comparable (other SM counts)
    text = bench.markdown(tp_only)
    assert "Data parallel" not in text and "| 1.25x | - | 128 / 128 |" in text


def test_markdown_from_the_command_line(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "multi-gpu.json"
    path.write_text(json.dumps(_fake_result()), encoding="utf-8")
    assert bench.main(["--markdown", str(path)]) == 0
    assert capsys.readouterr().out.strip() == bench.markdown(_fake_result())


def test_gpu_session_runs_the_multi_gpu_pieces() -> None:
    script = (BENCH / "gpu_session.sh").read_text(encoding="utf-8")
    stage = script[script.index("    multi-gpu)") :]
    stage = stage[: stage.index(";;")]
    assert "tests/gpu/test_multi_gpu.py" in stage and "bench/bench_multi_gpu.py" in stage
    assert "NCCL_NVLS_ENABLE=0" in stage and "--nproc-per-node" in stage
    assert "--devices" in stage and "'multi-gpu*.json'" in script


def test_c_example_devices_mode_compiles() -> None:
    """The --devices code is compiled only with a CUDA toolkit (SNAPMLA_EXAMPLE_WITH_CUDA)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    cuda = Path("/usr/local/cuda/include")
    if cc is None or not (cuda / "cuda_runtime.h").is_file():
        pytest.skip("needs a C compiler and the CUDA headers in /usr/local/cuda/include")
    for extra in ([], ["-DSNAPMLA_EXAMPLE_WITH_CUDA", f"-I{cuda}"]):
        result = subprocess.run(
            [cc, "-fsyntax-only", "-std=c99", "-Wall", "-Werror", f"-I{ROOT / 'include'}",
             *extra, str(ROOT / "examples" / "c" / "main.c")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
