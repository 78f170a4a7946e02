"""bench/: ANCHORS.md and the numbers the scripts hold are the same (the cases, FlashMLA's and
FlashInfer's times, the targets, the FP8 floors as bench_decode.py computes them, the machine's
ceilings); the scripts' pure parts (report tables, ncu and timeline parsers, nvidia-smi
summaries) do what they say; docs/performance.md's decode table is the committed results file;
the GPU session script names only stages and files that exist. No GPU, torch or FlashInfer
needed: bench_decode.py imports those lazily."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from _bench_module import bench_module

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
ANCHORS_MD = BENCH / "ANCHORS.md"


def _module(path: str) -> ModuleType:
    """bench/<path>.py as a module (e.g. "bench_decode", "probes/ncu_per_block")."""
    return bench_module(path)


@pytest.fixture(scope="module")
def bench_decode() -> ModuleType:
    return _module("bench_decode")


def _table(heading: str) -> list[list[str]]:
    """Body rows (cells stripped) of the first table after the heading that starts so."""
    lines = ANCHORS_MD.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows and not line.startswith("|"):
            break
    assert rows, heading
    return rows[1:]  # without the header row


def _us(cell: str) -> float | None:
    """The first number of a cell ("233.6 (625 TFLOPS)", "<= 130 us", "~2 us; ..."), or None."""
    m = re.search(r"\d+(?:\.\d+)?", cell)
    return float(m.group()) if m else None


def test_every_anchor_case_is_in_the_tables(bench_decode: ModuleType) -> None:
    t1 = [r[0] for r in _table("## What the field offers today")]
    t2 = [r[0] for r in _table("### Short contexts, MTP and mixed lengths")]
    assert list(bench_decode.ANCHORS) == t1 + t2


def test_field_table(bench_decode: ModuleType) -> None:
    for case, flashmla, flashinfer, _fp8 in _table("## What the field offers today"):
        anchor = bench_decode.ANCHORS[case]
        assert (anchor.flashmla_us, anchor.flashinfer_us) == (_us(flashmla), _us(flashinfer))
        assert anchor.table == "field"


def test_short_mtp_mixed_table(bench_decode: ModuleType) -> None:
    for case, flashmla, flashinfer, target in _table("### Short contexts, MTP and mixed"):
        anchor = bench_decode.ANCHORS[case]
        assert (anchor.flashmla_us, anchor.flashinfer_us) == (_us(flashmla), _us(flashinfer))
        # "no slower than FlashMLA" is FlashMLA's time as the target.
        expected = _us(flashmla) if target == "no slower than FlashMLA" else _us(target)
        assert anchor.target_us == expected, case
        assert anchor.floor_us is None


def test_floors_and_targets(bench_decode: ModuleType) -> None:
    for case, floor, target in _table("## Floors for our FP8 kernel"):
        anchor = bench_decode.ANCHORS[case]
        assert (anchor.floor_us, anchor.target_us) == (_us(floor), _us(target)), case
        parts = re.search(r"\((\d+) / (\d+)\)", floor)  # "(memory / compute)"
        if parts is None:
            assert "latency-bound" in floor
            continue
        c = bench_decode.Case.parse(case)
        f = bench_decode.figures(c, c.seqlens(0))["floor"]
        assert round(f["memory_us"]) == pytest.approx(int(parts.group(1)), abs=1), case
        assert round(f["compute_us"]) == pytest.approx(int(parts.group(2)), abs=1), case


def test_ceilings(bench_decode: ModuleType) -> None:
    text = ANCHORS_MD.read_text(encoding="utf-8")
    ceilings = text[text.index("## The machine's ceilings") :]
    assert f"BF16 {bench_decode.BF16_TFLOPS:g} TFLOPS" in ceilings
    assert f"FP8 E4M3 (`torch._scaled_mm`) {bench_decode.FP8_TFLOPS:g} TFLOPS" in ceilings
    assert f"{bench_decode.HBM_TBPS}-{bench_decode.FLOOR_HBM_TBPS} TB/s" in ceilings
    roofline = _module("roofline")
    assert (roofline.HBM_TBPS, roofline.FP8_TFLOPS, roofline.BF16_TFLOPS) == (
        bench_decode.HBM_TBPS,
        bench_decode.FP8_TFLOPS,
        bench_decode.BF16_TFLOPS,
    )


def test_page_stride_option(bench_decode: ModuleType) -> None:
    """--page-stride reaches KVCache's page_stride: 0 (packed) unless given."""
    parser = bench_decode._parser()
    assert parser.parse_args([]).page_stride == 0
    assert parser.parse_args(["--page-stride", "41984"]).page_stride == 41984
    assert "page_stride=args.page_stride" in Path(bench_decode.__file__).read_text(encoding="utf-8")


def test_two_term_summary_lines(bench_decode: ModuleType) -> None:
    """--two-term results print under the table: kernel, time, cost and both errors."""
    assert bench_decode._parser().parse_args(["--two-term"]).two_term
    # the benchmark's kernel choice is the library's (snapmla.decode.runnable_kernels)
    assert "runnable_kernels(config)" in Path(bench_decode.__file__).read_text(encoding="utf-8")
    case = {
        "name": "8x1x16x4096",
        "snapmla": {"median_us": 20.0, "tflops": 1.0, "tbps": 1.0},
        "flashinfer": {},
        "checks": {"ours_vs_fp32_ref": 0.01},
        "floor": {"floor_us": 5.0},
        "snapmla_fp8x2": {
            "kernel": "fast",
            "median_us": 20.5,
            "cost_vs_fp8": 1.025,
            "cost_alternating": 1.02,
            "cost_interleaved": 1.011,
            "vs_fp32_ref": 0.004,
            "fp8_vs_fp32_ref": 0.01,
        },
    }
    failed = {**case, "name": "64x1x128x4096"}
    failed["snapmla_fp8x2"] = {"kernel": "reference", "error": "SnapMLAError: boom"}
    text = bench_decode.table([case, failed])
    assert "two-term query (q_precision fp8x2), same run:" in text
    line = next(x for x in text.splitlines() if x.startswith("8x1x16x4096 ") and "fast" in x)
    assert "20.5 us" in line and "cost 1.025x" in line and "0.400" in line and "1.000" in line
    assert "interleaved 1.011x" in line and "alternating 1.020x" in line
    assert "reference" in text and "SnapMLAError: boom" in text


def test_ncu_instructions_per_warp_per_tile_block(tmp_path: Path) -> None:
    """bench/probes/ncu_per_block.py: smsp__inst_executed.sum over tile-blocks x 8 warps; the
    elapsed cycles times the SMs over tile-blocks, and that over the tensor work."""
    ncu = _module("probes/ncu_per_block")
    report = tmp_path / "ncu.txt"
    report.write_text(
        "  void decode_kernel<KernelTraits<64, true>>(...) (66, 2, 1)x(384, 1, 1)\n"
        "    Elapsed Cycles                cycle      384,000\n"
        "    # SMs                                         SM             128\n"
        "    smsp__inst_executed.sum                inst    10,158,080\n"
    )
    case = ncu.Case.parse("32x1x128x16384")
    r = ncu.per_block(case, report.read_text())
    assert r["n"] == 64 and r["tile_blocks"] == 32 * 2 * 256
    assert r["per_warp_per_tile_block"] == pytest.approx(10_158_080 / (32 * 2 * 256 * 8))
    assert ncu.TENSOR_CYCLES == 1152
    assert r["sm_cycles_per_tile_block"] == pytest.approx(384_000 * 128 / (32 * 2 * 256))
    assert r["over_tensor_work"] == pytest.approx(3000 / 1152)
    assert ncu.pv_width(ncu.Case.parse("128x1x16x16384")) == 16
    assert ncu.pv_width(ncu.Case.parse("64x2x16x16384")) == 32
    assert ncu.main([f"32x1x128x16384={report}"]) == 0
    with pytest.raises(ValueError, match="smsp__inst_executed.sum"):
        ncu.executed_instructions("no metric here\n")


def test_gpu_state_reads_nvidia_smi(
    bench_decode: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The state recorded after each timed loop: nvidia-smi's fields by name; {} without it.
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        '#!/bin/sh\ncase "$1" in --query-gpu=clocks.sm,*) '
        "echo '1755 MHz, 3201 MHz, 612.34 W, 61, 0x0000000000000004' ;; esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    state = bench_decode.gpu_state()
    assert state == {
        "clocks.sm": "1755 MHz",
        "clocks.mem": "3201 MHz",
        "power.draw": "612.34 W",
        "temperature.gpu": "61",
        "clocks_throttle_reasons.active": "0x0000000000000004",
    }
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert bench_decode.gpu_state() == {}


def test_smi_summary_sustained_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/smi_summary.py: the second half of the busy samples (> 300 W) of an nvidia-smi log."""
    smi = _module("smi_summary")
    idle = "2026/12/04 17:34:56.344, 360 MHz, 79.48 W, 700.00 W, 36, 0x0000000000000001"
    busy = [
        f"2026/12/04 17:34:5{i}.000, {1980 - 100 * i} MHz, {650 + 10 * i}.00 W, 700.00 W, 40, "
        + ("0x0000000000000004" if i > 1 else "0x0000000000000000")
        for i in range(6)
    ]
    s = smi.summarize([idle, *busy, "garbage line", idle])
    assert s["busy"] == 6 and s["samples"] == 9
    assert s["clock_median"] == 1580 and s["clock_min"] == 1480  # samples 3, 4, 5
    assert s["power_median"] == 690 and s["power_max"] == 700
    assert s["reasons"] == {"0x0000000000000004": 3}
    assert smi.summarize([idle]) is None
    log = tmp_path / "smi.csv"
    log.write_text("\n".join([idle, *busy]) + "\n")
    monkeypatch.setattr(sys, "argv", ["smi_summary.py", str(log), "probe"])
    smi.main()
    out = capsys.readouterr().out
    assert "probe: second half of 6 busy samples: SM clock median 1580 MHz (min 1480)" in out
    assert "power median 690 W (max 700)" in out


def test_flashmla_summary_lines(bench_decode: ModuleType) -> None:
    """Where a run had FlashMLA, the report lists its time, our speedup over it, its time over
    its anchor and its error; a case it refused names the error; without it, no such block."""
    case = {
        "name": "32x1x128x16384",
        "snapmla": {"median_us": 200.0},
        "flashinfer": {"median_us": 250.0},
        "flashmla": {"supported": True, "median_us": 240.0},
        "speedup_vs_flashmla": 1.2,
        "flashmla_vs_anchor": 240.0 / 233.6,
        "checks": {"flashmla_vs_fp32_ref": 0.0019},
        "floor": {"floor_us": 113.0},
    }
    refused = {**case, "name": "32x2x128x16384", "speedup_vs_flashmla": None}
    refused["flashmla"] = {"supported": False, "error": "RuntimeError: boom"}
    text = bench_decode.table([case, refused])
    assert "FlashMLA BF16, same run:" in text
    line = next(x for x in text.splitlines() if x.startswith("32x1x128x16384 ") and "FM/anc" in x)
    assert "240.0 us" in line and "ours 1.20x" in line and "FM/anc 1.03" in line
    assert "err%ref 0.19" in line
    assert "RuntimeError: boom" in text
    without = {k: v for k, v in case.items() if k != "flashmla"}
    assert "FlashMLA" not in bench_decode.table([without])
    args = bench_decode._parser().parse_args(["--no-flashmla"])
    assert args.no_flashmla and not bench_decode._parser().parse_args([]).no_flashmla


def _decode_results() -> dict:
    return json.loads((BENCH / "results" / "decode-h200.json").read_text(encoding="utf-8"))


def test_markdown_table_is_the_results_file(bench_decode: ModuleType) -> None:
    """--markdown renders every case of the JSON with its own figures."""
    doc = _decode_results()
    text = bench_decode.markdown_table(doc)
    caption, _, head, rule, *rows = text.splitlines()
    assert doc["device"]["name"] in caption and doc["commit"][:7] in caption
    assert head.startswith("| case | snapmla | FlashInfer BF16 | speedup |")
    assert rule.count("|") == head.count("|")
    assert len(rows) == len(doc["cases"])
    for row, case in zip(rows, doc["cases"]):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == case["name"]
        assert float(cells[1]) == round(case["snapmla"]["median_us"], 1)
        assert float(cells[2]) == round(case["flashinfer"]["median_us"], 1)
        assert cells[3] == f"{case['speedup_vs_flashinfer']:.2f}x"
        assert float(cells[-1]) == case["target_us"]


def test_performance_doc_quotes_the_results_file(bench_decode: ModuleType) -> None:
    """docs/performance.md's decode table is `bench_decode.py --markdown` of the committed
    bench/results/decode-h200.json, caption included (regenerate both together)."""
    doc = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert bench_decode.markdown_table(_decode_results()) in doc


def _stages(script: str) -> set[str]:
    """The stage names of gpu_session.sh's case statement (`  name | other)` lines)."""
    names: set[str] = set()
    for m in re.finditer(r"^    ([a-z][\w|* :-]*)\)", script, re.MULTILINE):
        names.update(x.strip() for x in m.group(1).split("|"))
    return names


def test_gpu_session_stages_and_paths() -> None:
    """gpu_session.sh keeps the stages other scripts and the docs run, and every repository
    path it names exists."""
    script = (BENCH / "gpu_session.sh").read_text(encoding="utf-8")
    stages = _stages(script)
    required = {"use:*", "tests", "sanitize", "bench", "bench-quick", "bench-cases"}
    required |= {"bench-cases:*", "accuracy", "demo", "host-c", "soak", "frag", "ctest"}
    required |= {"power-floor", "host-py", "accuracy-f32out"}
    assert required <= stages, required - stages
    paths = set(re.findall(r"\b((?:bench|tests|examples)/[\w./-]*\w)", script))
    assert "tests/gpu/smoke.py" in paths and "bench/bench_decode.py" in paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


def test_readmes_name_every_file() -> None:
    """bench/README.md names every file of bench/ and bench/probes/; bench/results/README.md
    lists exactly the result files."""
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    for folder in (BENCH, BENCH / "probes"):
        for f in sorted(folder.iterdir()):
            if f.is_file() and f.name != "README.md" and not f.name.startswith("."):
                assert f"`{f.name}`" in readme, f
    results = BENCH / "results"
    index = (results / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.-]+)` \|", index, re.MULTILINE))
    present = {f.name for f in results.iterdir() if f.name != "README.md"}
    assert listed == present


def test_flashmla_call(bench_decode: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashMLA's decode gets FlashMLA's arguments: q, the [pages, 64, 1, 576] cache of content
    and RoPE, the block table of copy i % copies, the lengths, dv 512, the metadata made from
    (lengths, s_q x h, 1 KV head), the softmax scale and causality."""
    calls: list[tuple] = []

    def get_mla_metadata(*args: object) -> tuple:
        calls.append(("meta", *args))
        return "META", "SPLITS"

    def flash_mla_with_kvcache(*args: object, **kwargs: object) -> tuple:
        calls.append(("run", args, kwargs))
        return "OUT", "LSE"

    fake = ModuleType("flash_mla")
    fake.__dict__.update(
        get_mla_metadata=get_mla_metadata, flash_mla_with_kvcache=flash_mla_with_kvcache
    )
    monkeypatch.setitem(sys.modules, "flash_mla", fake)

    class Tables:
        shape = (3, 7)

        def __getitem__(self, i: int) -> str:
            return f"table{i}"

    class Cat:
        def unsqueeze(self, dim: int) -> tuple:
            return ("kv", dim)

    def cat(parts: list, dim: int) -> Cat:
        calls.append(("cat", tuple(parts), dim))
        return Cat()

    torch = ModuleType("torch")
    torch.__dict__["cat"] = cat
    case = bench_decode.Case.parse("4x2x16x4096")
    call = bench_decode.FlashMLABF16().prepare(torch, case, "ckv", "kpe", Tables(), "lens", "q")
    assert call(4) == "OUT"
    assert calls[0] == ("cat", ("ckv", "kpe"), -1)
    assert calls[1] == ("meta", "lens", 32, 1)
    _, args, kwargs = calls[2]
    assert args == ("q", ("kv", 2), "table1", "lens", 512, "META", "SPLITS")
    assert kwargs == {"softmax_scale": 192**-0.5, "causal": True}
