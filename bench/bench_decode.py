"""Decode latency: snapmla's FP8 MLA decode against FlashInfer's FA3 BF16 MLA path (and
FlashMLA's BF16 decode: ``flash_mla`` where importable, else FlashMLA's kernels through the shim
``bench/flashmla/build.sh`` builds; with the shim also FlashMLA's FP8 sparse decode used as dense
attention, at 64 and 128 heads).

Every case of the two tables in ``bench/ANCHORS.md`` (batch x q_len x heads x context, with
``R32768`` = lengths uniform in 1..32768 from a fixed seed) runs on the same random data
(``normal(0, 0.5)``, never zeros) in every kernel: the BF16 pages FlashInfer and FlashMLA read
are appended to snapmla's FP8 cache through ``KVCache.append`` (and quantized to FlashMLA's
656-byte FP8 token for its sparse decode); page size 64,
``softmax_scale = 192**-0.5``, causal for ``q_len > 1``, block tables in shuffled page order.

Timing: CUDA-graph replay (``torch.cuda.CUDAGraph`` capturing N calls), median over >= 20
replays after warm-up, each replay divided by N. Cases whose KV is smaller than a few L2 sizes
keep several copies of the KV (disjoint pages of the same cache) and the N calls of a graph
rotate through them, so that no call finds its KV in L2.

Run ``python3 bench/bench_decode.py --help``. The helpers here (timing, environment, JSON) are
also used by ``bench_dataflow.py``; torch, cupy and flashinfer are imported only when needed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fnmatch
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import zlib
from dataclasses import dataclass
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# ------------------------------------------------------------------------------ constants

PAGE_SIZE = 64
CONTENT_DIM = 512
ROPE_DIM = 64
HEAD_DIM = 576
PAGE_BYTES = 41216
SOFTMAX_SCALE = 192**-0.5
OUR_BYTES_PER_TOKEN = 644  # FP8 content 512 + BF16 RoPE 128 + fp32 scale 4
BF16_BYTES_PER_TOKEN = 1152  # BF16 c_kv 1024 + k_pe 128
FLASHMLA_FP8_BYTES_PER_TOKEN = 656  # FP8 content 512 + 4 fp32 scales 16 + BF16 RoPE 128
FLOP_PER_ROW_TOKEN = 2 * (HEAD_DIM + CONTENT_DIM)  # QK over 576 + PV over 512

# The machine's ceilings (bench/ANCHORS.md).
HBM_TBPS = 4.2  # HBM read ceiling quoted as the target's reference
FLOOR_HBM_TBPS = 4.3  # bandwidth the anchors' FP8 memory floors are computed with
FP8_TFLOPS = 1351.0
BF16_TFLOPS = 765.0
TILE_ROWS = 64  # query rows per tile: s_q * h is padded to a multiple of this

L2_BYTES = 60 * 2**20
ROTATE_BYTES = 192 * 2**20  # our KV bytes one graph cycles through (> 3x L2) when cases are small
MAX_COPIES = 256
MAX_CALLS_PER_GRAPH = 512
GRAPH_TARGET_S = 2e-3  # aim for replays of at least this long
MIN_REPS = 20
MAX_REPS = 1000
R_SEED = 32768  # base seed of the R (random length) cases


# ------------------------------------------------------------------------------ the cases


@dataclass(frozen=True)
class Anchor:
    """What bench/ANCHORS.md says about a case (microseconds; None where it says nothing)."""

    flashmla_us: float | None
    flashinfer_us: float | None
    target_us: float | None
    target_note: str
    floor_us: float | None = None  # the anchors' FP8 floor, where they list one
    table: str = ""


# Table 1 ("What the field offers today") with its floors and targets.
_T1 = "field"
# Table 2 ("Short contexts, MTP and mixed lengths").
_T2 = "short/mtp/mixed"
_NO_SLOWER = "no slower than FlashMLA"

ANCHORS: dict[str, Anchor] = {
    "1x1x128x8192": Anchor(30.0, 27.2, 24.0, "faster than both BF16 kernels", 2.0, _T1),
    "32x1x128x16384": Anchor(233.6, 262.0, 130.0, "1.8x FlashMLA", 113.0, _T1),
    "64x1x128x32768": Anchor(925.8, 1113.0, 514.0, "1.8x FlashMLA", 452.0, _T1),
    "16x1x128x131072": Anchor(884.5, 1079.1, 491.0, "1.8x FlashMLA", 452.0, _T1),
    "32x2x128x16384": Anchor(437.0, None, 243.0, "1.8x FlashMLA", 226.0, _T1),
    "64x1x64x32768": Anchor(603.7, 645.5, 360.0, "1.68x; memory-bound", 314.0, _T1),
    "128x1x16x16384": Anchor(590.7, 589.2, 355.0, "1.66x; memory-bound", 314.0, _T1),
    "64x1x16x65536": Anchor(1129.9, 1199.9, 680.0, "1.66x; memory-bound", 628.0, _T1),
    "32x1x32x32768": Anchor(314.8, 293.2, 185.0, "1.70x", 157.0, _T1),
    "1x1x128x1024": Anchor(18.1, 17.7, 18.1, _NO_SLOWER, table=_T2),
    "1x1x128x4096": Anchor(24.6, 23.1, 24.6, _NO_SLOWER, table=_T2),
    "8x1x128x1024": Anchor(23.8, 24.7, 23.8, _NO_SLOWER, table=_T2),
    "8x1x128x4096": Anchor(36.4, 34.2, 36.4, _NO_SLOWER, table=_T2),
    "64x1x128x1024": Anchor(42.1, 46.5, 42.1, _NO_SLOWER, table=_T2),
    "64x1x128x4096": Anchor(124.6, 139.0, 80.0, "<= 80 us", table=_T2),
    "1x1x16x8192": Anchor(29.7, 27.1, 29.7, _NO_SLOWER, table=_T2),
    "8x1x16x4096": Anchor(28.6, 28.3, 28.6, _NO_SLOWER, table=_T2),
    "64x1x16x4096": Anchor(96.3, 91.3, 65.0, "<= 65 us", table=_T2),
    "64x1x128xR32768": Anchor(512.7, 735.9, 285.0, "1.8x FlashMLA", table=_T2),
    "128x1x16xR32768": Anchor(572.4, 779.1, 345.0, "1.66x FlashMLA", table=_T2),
    "32x2x64x16384": Anchor(249.8, None, 139.0, "1.8x FlashMLA", table=_T2),
    "64x2x16x16384": Anchor(324.6, None, 195.0, "1.66x FlashMLA", table=_T2),
    "128x4x16x8192": Anchor(323.3, None, 180.0, "1.8x FlashMLA", table=_T2),
}
DEFAULT_CASES = list(ANCHORS)


@dataclass(frozen=True)
class Case:
    """One benchmark shape: ``BxQxHxS`` or ``BxQxHxRS`` (lengths uniform in 1..S)."""

    name: str
    batch: int
    q_len: int
    heads: int
    context: int
    random_lengths: bool

    @staticmethod
    def parse(name: str) -> Case:
        parts = name.strip().split("x")
        if len(parts) != 4:
            raise ValueError(f"case {name!r}: expected BATCHxQ_LENxHEADSx(CONTEXT|RCONTEXT)")
        ctx = parts[3]
        random_lengths = ctx[:1] in ("R", "r")
        try:
            b, s_q, h = (int(p) for p in parts[:3])
            s = int(ctx[1:] if random_lengths else ctx)
        except ValueError:
            raise ValueError(f"case {name!r}: sizes must be integers") from None
        if not (b >= 1 and 1 <= s_q <= 4 and 1 <= h <= 128 and s >= s_q):
            raise ValueError(
                f"case {name!r}: need batch >= 1, q_len 1..4, heads 1..128, context >= q_len"
            )
        canon = f"{b}x{s_q}x{h}x{'R' if random_lengths else ''}{s}"
        return Case(canon, b, s_q, h, s, random_lengths)

    def seqlens(self, seed: int) -> list[int]:
        """Context length per request (including the q_len new tokens)."""
        if not self.random_lengths:
            return [self.context] * self.batch
        import numpy as np

        rng = np.random.default_rng(seed + R_SEED + self.batch)
        lengths = rng.integers(max(1, self.q_len), self.context + 1, size=self.batch)
        return [int(x) for x in lengths]


def select_cases(spec: str | None) -> list[Case]:
    """Cases named by ``spec`` (comma-separated names or fnmatch patterns over the anchors'
    cases; a name that is not an anchor case but parses as BxQxHxS is run as given)."""
    if not spec:
        return [Case.parse(n) for n in DEFAULT_CASES]
    chosen: list[str] = []
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        if any(ch in token for ch in "*?["):
            hits = [n for n in DEFAULT_CASES if fnmatch.fnmatchcase(n, token)]
            if not hits:
                raise ValueError(f"--cases: pattern {token!r} matches no case")
            chosen += hits
        else:
            chosen.append(Case.parse(token).name)
    seen: set[str] = set()
    return [Case.parse(n) for n in chosen if not (n in seen or seen.add(n))]


def rows_padded(s_q: int, h: int) -> int:
    return -(-s_q * h // TILE_ROWS) * TILE_ROWS


def figures(case: Case, seqlens: list[int]) -> dict[str, Any]:
    """FLOPs, KV bytes and the FP8 floor of a case (the anchors' conventions)."""
    tokens = sum(seqlens)
    flops = FLOP_PER_ROW_TOKEN * case.q_len * case.heads * tokens
    rows = rows_padded(case.q_len, case.heads)
    mem_us = tokens * OUR_BYTES_PER_TOKEN / (FLOOR_HBM_TBPS * 1e12) * 1e6
    fp8_part = 2 * rows * tokens * (2 * CONTENT_DIM) / (FP8_TFLOPS * 1e12)
    bf16_part = 2 * rows * tokens * ROPE_DIM / (BF16_TFLOPS * 1e12)
    compute_us = (fp8_part + bf16_part) * 1e6
    return {
        "kv_tokens": tokens,
        "flops": flops,
        "kv_bytes": {
            "snapmla": tokens * OUR_BYTES_PER_TOKEN,
            "flashinfer": tokens * BF16_BYTES_PER_TOKEN,
            "flashmla_fp8": tokens * FLASHMLA_FP8_BYTES_PER_TOKEN,
        },
        "intensity_flop_per_byte": {
            "snapmla": flops / (tokens * OUR_BYTES_PER_TOKEN),
            "flashinfer": flops / (tokens * BF16_BYTES_PER_TOKEN),
        },
        "floor": {
            "memory_us": mem_us,
            "compute_us": compute_us,
            "floor_us": max(mem_us, compute_us),
        },
    }


# ------------------------------------------------------------------------------ environment


def git_commit() -> dict[str, Any]:
    """The commit measured: $SNAPMLA_COMMIT, else git's HEAD of the repository (with a dirty
    flag), else unknown."""
    env = os.environ.get("SNAPMLA_COMMIT")
    if env:
        return {"commit": env, "commit_source": "SNAPMLA_COMMIT", "dirty": None}
    try:
        head = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return {"commit": head, "commit_source": "git", "dirty": bool(status)}
    except (OSError, subprocess.SubprocessError):  # no git, not a repository
        return {"commit": "unknown", "commit_source": None, "dirty": None}


def _nvidia_smi(
    fields: str = "driver_version,clocks.max.sm,clocks.max.memory,power.limit,pstate",
) -> dict[str, str]:
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            .stdout.strip()
            .splitlines()[0]
        )
        return dict(zip(fields.split(","), (v.strip() for v in out.split(","))))
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}


# The GPU's state right after a timed loop: at the long cases the board reaches its power limit
# within the timing and lowers the SM clock; the clock and throttle reasons here say so.
_STATE_FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def gpu_state() -> dict[str, str]:
    """nvidia-smi's SM and memory clocks, power, temperature and active throttle reasons now
    ({} without nvidia-smi)."""
    return _nvidia_smi(_STATE_FIELDS)


def environment(torch: Any) -> dict[str, Any]:
    """Device, driver, CUDA and package versions."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": int(props.total_memory),
            "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        },
    }
    try:
        import cupy

        rt = cupy.cuda.runtime
        info["cupy"] = cupy.__version__
        info["cuda_driver_version"] = int(rt.driverGetVersion())
        info["cuda_runtime_version_cupy"] = int(rt.runtimeGetVersion())
    except Exception as exc:  # noqa: BLE001 (a broken CuPy install raises anything)
        info["cupy"] = f"unavailable: {exc}"
    smi = _nvidia_smi()
    if smi:
        info["nvidia_smi"] = smi
        info["driver"] = smi.get("driver_version")
    try:
        import snapmla
        from snapmla import _lib

        info["snapmla"] = {
            "package": snapmla.__version__,
            "module": os.path.dirname(snapmla.__file__),
            "library": _lib.library_path(),
            "library_version": ".".join(str(v) for v in snapmla.version()),
        }
    except Exception as exc:  # noqa: BLE001 (recorded, the run goes on)
        info["snapmla"] = f"unavailable: {exc}"
    return info


def open_gpu(tool: str) -> tuple[Any, Any, dict[str, Any]] | None:
    """torch, snapmla and the environment record; None (said on stderr) without a CUDA device."""
    import torch

    snapmla = import_snapmla()
    if not torch.cuda.is_available():
        print(f"{tool}: no CUDA device", file=sys.stderr)
        return None
    torch.cuda.init()
    return torch, snapmla, environment(torch)


def import_snapmla() -> Any:
    """``import snapmla``, falling back to the source tree's python/ folder."""
    try:
        import snapmla
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import snapmla
    return snapmla


def write_json(path: str | None, doc: dict[str, Any]) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 600 else text[:600] + " ..."


# ------------------------------------------------------------------------------ timing


def capture_graph(torch: Any, call: Callable[[int], None], n: int) -> Any:
    """A CUDA graph of ``call(0) .. call(n - 1)`` on torch's current stream."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for i in range(n):
            call(i)
    return g


def time_calls(
    torch: Any,
    call: Callable[[int], None],
    *,
    variants: int = 1,
    target_s: float = 0.3,
    min_reps: int = MIN_REPS,
    max_reps: int = MAX_REPS,
    graph_target_s: float = GRAPH_TARGET_S,
    max_calls: int = MAX_CALLS_PER_GRAPH,
    use_graph: bool = True,
    warmup: int = 3,
) -> dict[str, Any]:
    """Time ``call(i)`` (which enqueues call ``i`` on torch's current stream).

    Captures N calls into a CUDA graph (N so that one replay lasts >= ``graph_target_s`` and,
    with ``variants`` > 1, covers every variant ``i % variants``), replays it once, then
    ``reps`` times between CUDA events (reps so that the timing lasts about ``target_s``,
    at least ``min_reps``). Each replay's time is divided by N. If capture fails, falls back to
    eager launches between events (``method`` says which; eager includes launch overhead).
    """
    for i in range(max(warmup, min(variants, 8))):
        call(i)
    torch.cuda.synchronize()

    def replay_times(run: Callable[[], None], reps: int) -> list[float]:
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        for e0, e1 in events:
            e0.record()
            run()
            e1.record()
        torch.cuda.synchronize()
        return [e0.elapsed_time(e1) * 1e-3 for e0, e1 in events]  # seconds

    method = "cuda-graph" if use_graph else "eager-events"
    error = None

    def eager(n: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(n):
                call(i)

        return run

    def prepare(n: int) -> tuple[Callable[[], None], Any]:
        """A callable issuing n calls: a captured graph's replay, or eager launches."""
        nonlocal method, error
        if method == "cuda-graph":
            try:
                g = capture_graph(torch, call, n)
                g.replay()
                torch.cuda.synchronize()
                return g.replay, g
            except Exception as exc:  # noqa: BLE001 (capture refused: fall back to eager)
                method, error = "eager-events", short_error(exc)
                torch.cuda.synchronize()
        return eager(n), None

    k = max(1, min(variants, 16))
    run, graph = prepare(k)
    t_est = statistics.median(replay_times(run, 3)) / k
    n = max(1, min(max_calls, math.ceil(graph_target_s / max(t_est, 1e-7))))
    if variants > 1:
        n = max(n, min(variants, max_calls))
    if n != k:
        del run, graph
        run, graph = prepare(n)
    reps = max(min_reps, min(max_reps, math.ceil(target_s / max(n * t_est, 1e-7))))
    per_call = sorted(t / n for t in replay_times(run, reps))
    del run, graph
    q = statistics.quantiles(per_call, n=10) if len(per_call) >= 2 else per_call * 9
    return {
        "median_us": statistics.median(per_call) * 1e6,
        "min_us": per_call[0] * 1e6,
        "max_us": per_call[-1] * 1e6,
        "p10_us": q[0] * 1e6,
        "p90_us": q[-1] * 1e6,
        "reps": reps,
        "calls_per_replay": n,
        "method": method,
        "capture_error": error,
    }


def interleaved_times(
    torch: Any,
    calls: list[Callable[[int], None]],
    *,
    per_call_s: float,
    variants: int = 1,
    pairs: int = 100,
    graph_target_s: float = GRAPH_TARGET_S,
    max_calls: int = MAX_CALLS_PER_GRAPH,
    keep_graphs: list[Any] | None = None,
) -> list[list[float]] | None:
    """Per-call times (s) of several calls replayed in turn, for ratios free of clock drift.

    Each call is captured into its own graph of N calls (N: a replay of about
    ``graph_target_s`` at ``per_call_s`` a call, a multiple of ``variants`` where that fits
    ``max_calls``, so that every variant weighs the same), then ``pairs`` rounds replay every
    graph once between events, the order rotated each round. A replay lasts milliseconds, so
    the calls of one round see the same clock, where two long timings one after the other may
    not (the power cap lowers it over tens of milliseconds at the long cases).
    Returns ``times[k][j]``, call k's time in round j; None if capture fails.
    ``keep_graphs``: a list the graphs are appended to (for a caller that replays them again).
    """
    n = max(1, min(max_calls, math.ceil(graph_target_s / max(per_call_s, 1e-7))))
    if variants > 1:
        n = max(variants, -(-n // variants) * variants)
        n = n if n <= max_calls else max(variants, max_calls // variants * variants)
    for call in calls:
        for i in range(min(variants, 8)):
            call(i)
    torch.cuda.synchronize()
    graphs = []
    try:
        for call in calls:
            graphs.append(capture_graph(torch, call, n))
            graphs[-1].replay()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 (capture refused: no interleaved figure)
        torch.cuda.synchronize()
        return None
    k = len(graphs)
    events = [
        [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(pairs)
        ]
        for _ in range(k)
    ]
    for j in range(pairs):
        for m in range(k):
            idx = (m + j) % k
            e0, e1 = events[idx][j]
            e0.record()
            graphs[idx].replay()
            e1.record()
    torch.cuda.synchronize()
    if keep_graphs is not None:
        keep_graphs.extend(graphs)
    return [[e0.elapsed_time(e1) * 1e-3 / n for e0, e1 in events[idx]] for idx in range(k)]


# ------------------------------------------------------------------------------ one case


def _rel_l2(torch: Any, a: Any, b: Any) -> float:
    a = a.float()
    b = b.float()
    den = float(torch.linalg.vector_norm(b))
    num = float(torch.linalg.vector_norm(a - b))
    return num / den if den else (0.0 if num == 0 else math.inf)


def _reference(
    torch: Any, q: Any, ckv: Any, kpe: Any, pages: Any, seqlen: int, causal: bool
) -> Any:
    """fp32 attention of one request on the BF16 cache: q [s_q, h, 576] -> [s_q, h, 512]."""
    s_q = q.shape[0]
    c = ckv[pages].reshape(-1, CONTENT_DIM)[:seqlen].float()
    k = torch.cat([c, kpe[pages].reshape(-1, ROPE_DIM)[:seqlen].float()], dim=1)
    z = torch.einsum("thd,sd->ths", q.float(), k) * SOFTMAX_SCALE
    if causal and s_q > 1:
        t = torch.arange(s_q, device=q.device)[:, None]
        j = torch.arange(seqlen, device=q.device)[None, :]
        z = z.masked_fill((j > seqlen - s_q + t)[:, None, :], -math.inf)
    p = torch.softmax(z, dim=-1)
    return torch.einsum("ths,sd->thd", p, c)


class FlashInferBF16:
    """FlashInfer's FA3 BF16 MLA wrapper, one workspace for the whole run."""

    def __init__(self, torch: Any) -> None:
        import flashinfer
        import flashinfer.mla

        self.version = getattr(flashinfer, "__version__", "?")
        self.workspace = torch.empty(128 * 2**20, dtype=torch.int8, device="cuda")
        self.wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(self.workspace, backend="fa3")
        self.compiled = False

    def plan(self, torch: Any, case: Case, seqlens_t: Any, kv_indptr: Any, kv_indices: Any) -> None:
        qo_indptr = torch.arange(case.batch + 1, dtype=torch.int32, device="cuda") * case.q_len
        self.wrapper.plan(
            qo_indptr,
            kv_indptr,
            kv_indices,
            seqlens_t,
            case.heads,
            CONTENT_DIM,
            ROPE_DIM,
            PAGE_SIZE,
            case.q_len > 1,  # causal
            SOFTMAX_SCALE,
            torch.bfloat16,
            torch.bfloat16,
        )


class FlashMLABF16:
    """FlashMLA's BF16 dense decode (``flash_mla``, built from its sources: it is not on the
    package registry). Its cache holds a token's 512 content and 64 RoPE values in one row of
    576, so each case builds that cache from the same BF16 pages."""

    def __init__(self) -> None:
        import flash_mla

        self.module = flash_mla
        self.version = getattr(flash_mla, "__version__", "?")

    def prepare(
        self,
        torch: Any,
        case: Case,
        ckv: Any,
        kpe: Any,
        block_tables: Any,
        seqlens_t: Any,
        q: Any,
    ) -> Callable[[int], Any]:
        """``call(i)``: the decode on block table copy ``i % copies``, returning the output. The
        call holds the [pages, 64, 1, 576] cache it reads."""
        kv = torch.cat([ckv, kpe], dim=-1).unsqueeze(2)
        # Metadata from the lengths; FlashMLA versions that schedule on the first call ignore
        # these arguments and fill the returned object then (the first call is eager here).
        meta, splits = self.module.get_mla_metadata(seqlens_t, case.q_len * case.heads, 1)
        copies = block_tables.shape[0]

        def call(i: int) -> Any:
            out, _ = self.module.flash_mla_with_kvcache(
                q,
                kv,
                block_tables[i % copies],
                seqlens_t,
                CONTENT_DIM,
                meta,
                splits,
                softmax_scale=SOFTMAX_SCALE,
                causal=case.q_len > 1,
            )
            return out

        return call


def flashmla_shim() -> Any:
    """``bench/flashmla/flashmla.py``: FlashMLA's kernels through the shim that
    ``bench/flashmla/build.sh`` builds into .carry/flashmla (loaded by path, once)."""
    name = "snapmla_bench_flashmla"
    if name not in sys.modules:
        import importlib.util

        path = os.path.join(HERE, "flashmla", "flashmla.py")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def open_flashmla(args: argparse.Namespace, env: dict[str, Any]) -> tuple[Any, Any]:
    """FlashMLA's BF16 decode (``flash_mla`` where importable, else the shim) and its FP8
    sparse decode (the shim), each None where left out or unavailable; ``env`` records their
    versions or why not."""
    fm = fm8 = None
    if not args.no_flashmla:
        try:
            fm = FlashMLABF16()
        except Exception as exc:  # noqa: BLE001 (not built on this machine)
            try:
                fm = flashmla_shim().DenseBF16(SOFTMAX_SCALE)
            except Exception as exc2:  # noqa: BLE001 (no shim library either)
                why = f"flash_mla: {short_error(exc)}; shim: {short_error(exc2)}"
                env["flashmla"] = f"unavailable: {why}"
                print(f"bench_decode: FlashMLA unavailable: {why}", file=sys.stderr)
        if fm is not None:
            env["flashmla"] = fm.version
    if not args.no_flashmla_fp8:
        try:
            fm8 = flashmla_shim().SparseFP8(SOFTMAX_SCALE)
            env["flashmla_fp8"] = fm8.version
        except Exception as exc:  # noqa: BLE001 (no shim library)
            env["flashmla_fp8"] = f"unavailable: {short_error(exc)}"
            print(f"bench_decode: FlashMLA FP8 unavailable: {short_error(exc)}", file=sys.stderr)
    return fm, fm8


def run_case(
    torch: Any,
    snapmla: Any,
    case: Case,
    args: argparse.Namespace,
    fi: FlashInferBF16 | None,
    fi_error: str | None,
    fm: Any = None,
    fm8: Any = None,
) -> dict[str, Any]:
    """Build the data of one case, check every kernel's output, time them."""
    import numpy as np

    seed = args.seed + zlib.crc32(case.name.encode())
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed & 0x7FFFFFFF)
    seqlens = case.seqlens(args.seed)
    pages_per_req = [-(-s // PAGE_SIZE) for s in seqlens]
    pages = sum(pages_per_req)  # pages of one copy of the KV
    max_pages = max(pages_per_req)
    copies = max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / (pages * PAGE_BYTES))))
    total_pages = pages * copies
    causal = case.q_len > 1
    anchor = ANCHORS.get(case.name)
    fig = figures(case, seqlens)
    result: dict[str, Any] = {
        "name": case.name,
        "batch": case.batch,
        "q_len": case.q_len,
        "heads": case.heads,
        "context": f"R{case.context}" if case.random_lengths else case.context,
        "seqlens": {
            "sum": sum(seqlens),
            "min": min(seqlens),
            "max": max(seqlens),
            "mean": sum(seqlens) / len(seqlens),
            "seed": args.seed + R_SEED + case.batch if case.random_lengths else None,
        },
        "causal": causal,
        "kv_copies": copies,
        "max_pages": max_pages,
        **fig,
        "anchor": None
        if anchor is None
        else {
            "table": anchor.table,
            "flashmla_bf16_us": anchor.flashmla_us,
            "flashinfer_bf16_us": anchor.flashinfer_us,
            "target_us": anchor.target_us,
            "target_note": anchor.target_note,
            "fp8_floor_us": anchor.floor_us,
        },
        "target_us": None if anchor is None else anchor.target_us,
        "snapmla": None,
        "flashinfer": None,
        "speedup_vs_flashinfer": None,
        "flashmla": None,
        "speedup_vs_flashmla": None,
        "flashmla_fp8": None,
        "speedup_vs_flashmla_fp8": None,
        "pass": None,
        "error": {},
    }
    dev = "cuda"
    h = case.heads

    def stream() -> int:
        return torch.cuda.current_stream().cuda_stream

    # ---- data: the BF16 pages (FlashInfer's cache), appended into our FP8 cache.
    ckv = torch.empty(total_pages, PAGE_SIZE, CONTENT_DIM, dtype=torch.bfloat16, device=dev)
    kpe = torch.empty(total_pages, PAGE_SIZE, ROPE_DIM, dtype=torch.bfloat16, device=dev)
    # --page-stride: each page in a larger slot (an engine's layout, e.g. vLLM's 64 x 656 bytes)
    cache = snapmla.KVCache(num_layers=1, num_pages=total_pages, page_stride=args.page_stride)
    plan = None
    try:
        chunk = 4096  # pages per append
        slots = torch.arange(total_pages * PAGE_SIZE, dtype=torch.int64, device=dev)
        for p0 in range(0, total_pages, chunk):
            p1 = min(total_pages, p0 + chunk)
            ckv[p0:p1].normal_(0.0, 0.5)
            kpe[p0:p1].normal_(0.0, 0.5)
            cache.append(
                0,
                ckv[p0:p1].view(-1, CONTENT_DIM),
                kpe[p0:p1].view(-1, ROPE_DIM),
                slots[p0 * PAGE_SIZE : p1 * PAGE_SIZE],
                stream=stream(),
            )
        del slots
        # Shuffled page order: request r owns perm[off_r : off_r + pages_r] of each copy.
        perm = rng.permutation(pages).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(pages_per_req)]).astype(np.int32)
        bt_rel = np.zeros((case.batch, max_pages), dtype=np.int32)
        for r in range(case.batch):
            bt_rel[r, : pages_per_req[r]] = perm[offsets[r] : offsets[r + 1]]
        bt_rel_t = torch.from_numpy(bt_rel).to(dev)
        block_tables = torch.stack([bt_rel_t + c * pages for c in range(copies)]).contiguous()
        seqlens_t = torch.tensor(seqlens, dtype=torch.int32, device=dev)
        q = torch.empty(case.batch, case.q_len, h, HEAD_DIM, dtype=torch.bfloat16, device=dev)
        q.normal_(0.0, 0.5)
        out = torch.empty(case.batch, case.q_len, h, CONTENT_DIM, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(case.batch, h, case.q_len, dtype=torch.float32, device=dev)
        torch.cuda.synchronize()

        # ---- our plan, once per case.
        def new_plan(**options: Any) -> Any:
            return snapmla.DecodePlan(
                seqlens_t,
                num_heads=h,
                q_len=case.q_len,
                max_pages=max_pages,
                num_sm_parts=args.num_sm_parts,
                stream=stream(),
                **options,
            )

        t0 = time.perf_counter()
        plan = new_plan()
        torch.cuda.synchronize()
        plan_create_ms = (time.perf_counter() - t0) * 1e3

        def ours(i: int, with_plan: Any = plan, kernel: str = args.kernel) -> None:
            snapmla.decode(
                cache,
                0,
                q,
                block_tables[i % copies],
                seqlens_t,
                with_plan,
                softmax_scale=SOFTMAX_SCALE,
                causal=causal,
                out=out,
                lse=lse,
                kernel=kernel,
                stream=stream(),
            )

        # ---- FlashInfer BF16: same pages, same shuffled order (its kv_indices are `perm`).
        fi_ok = False
        fi_out = None
        if fi is not None:
            try:
                kv_indptr = torch.from_numpy(offsets).to(dev)
                kv_indices = torch.from_numpy(perm).to(dev)
                t0 = time.perf_counter()
                fi.plan(torch, case, seqlens_t, kv_indptr, kv_indices)
                torch.cuda.synchronize()
                first_plan_s = time.perf_counter() - t0
                plan_times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    fi.plan(torch, case, seqlens_t, kv_indptr, kv_indices)
                    torch.cuda.synchronize()
                    plan_times.append(time.perf_counter() - t0)
                qf = q.view(case.batch * case.q_len, h, HEAD_DIM)
                q_nope = qf[..., :CONTENT_DIM].contiguous()
                q_pe = qf[..., CONTENT_DIM:].contiguous()
                fi_out = torch.empty(
                    case.batch * case.q_len, h, CONTENT_DIM, dtype=torch.bfloat16, device=dev
                )
                ckv_copies = [ckv[c * pages : (c + 1) * pages] for c in range(copies)]
                kpe_copies = [kpe[c * pages : (c + 1) * pages] for c in range(copies)]

                def theirs(i: int) -> None:
                    c = i % copies
                    fi.wrapper.run(q_nope, q_pe, ckv_copies[c], kpe_copies[c], out=fi_out)

                theirs(0)
                torch.cuda.synchronize()
                fi_ok = True
                result["flashinfer"] = {
                    "supported": True,
                    "plan_host_ms": statistics.median(plan_times) * 1e3,
                    "first_plan_s": first_plan_s,
                }
            except Exception as exc:  # noqa: BLE001 (e.g. a shape FlashInfer refuses)
                torch.cuda.synchronize()
                result["flashinfer"] = {"supported": False, "error": short_error(exc)}
        elif fi_error is not None:
            result["flashinfer"] = {"supported": False, "error": fi_error}

        # ---- FlashMLA BF16 (where importable): the same pages and block tables.
        fm_call, fm_out = None, None
        if fm is not None:
            try:
                fm_call = fm.prepare(torch, case, ckv, kpe, block_tables, seqlens_t, q)
                fm_out = fm_call(0)
                torch.cuda.synchronize()
                result["flashmla"] = {"supported": True, **getattr(fm, "info", {})}
            except Exception as exc:  # noqa: BLE001 (e.g. a shape FlashMLA refuses)
                torch.cuda.synchronize()
                fm_call = fm_out = None
                result["flashmla"] = {"supported": False, "error": short_error(exc)}

        # ---- FlashMLA's FP8 sparse decode (the shim, 64 and 128 heads): its 656-byte cache made
        # from the same pages, indices naming each request's tokens in block-table order.
        fm8_call, fm8_out = None, None
        if fm8 is not None and h not in fm8.heads:
            result["flashmla_fp8"] = {"supported": False, "skipped": "64 or 128 heads only"}
        elif fm8 is not None:
            try:
                fm8_call = fm8.prepare(torch, case, ckv, kpe, block_tables, seqlens_t, q)
                fm8_out = fm8_call(0)
                torch.cuda.synchronize()
                result["flashmla_fp8"] = {"supported": True, **fm8.info}
            except Exception as exc:  # noqa: BLE001 (recorded in the results)
                torch.cuda.synchronize()
                fm8_call = fm8_out = None
                result["flashmla_fp8"] = {"supported": False, "error": short_error(exc)}

        # ---- sanity: outputs of both on copy 0, and an fp32 reference for a few requests.
        checks: dict[str, Any] = {}
        try:
            ours(0)
            torch.cuda.synchronize()
            ours_ok = True
            checks["ours_nan"] = bool(torch.isnan(out).any())
        except Exception as exc:  # noqa: BLE001 (recorded in the results)
            torch.cuda.synchronize()
            ours_ok = False
            result["error"]["snapmla"] = short_error(exc)
        if ours_ok and fi_ok:
            checks["ours_vs_flashinfer"] = _rel_l2(torch, out.view_as(fi_out), fi_out)
        sample, fp32_ref = [], None  # the reference's requests and outputs (two_term reuses)
        if not args.no_ref:
            sample = sorted({0, int(np.argmax(seqlens))})
            refs, mine, theirs_ = [], [], []
            for r in sample:
                pg = bt_rel_t[r, : pages_per_req[r]].long()
                refs.append(_reference(torch, q[r], ckv, kpe, pg, seqlens[r], causal))
                mine.append(out[r])
                if fi_ok:
                    theirs_.append(fi_out[r * case.q_len : (r + 1) * case.q_len])
            fp32_ref = torch.stack(refs)
            checks["ref_requests"] = sample
            if ours_ok:
                checks["ours_vs_fp32_ref"] = _rel_l2(torch, torch.stack(mine), fp32_ref)
            if fi_ok:
                checks["flashinfer_vs_fp32_ref"] = _rel_l2(torch, torch.stack(theirs_), fp32_ref)
            if fm_out is not None:
                fm_rows = torch.stack([fm_out[r] for r in sample])
                checks["flashmla_vs_fp32_ref"] = _rel_l2(torch, fm_rows, fp32_ref)
            if fm8_out is not None:
                fm8_rows = torch.stack([fm8_out[r] for r in sample])
                checks["flashmla_fp8_vs_fp32_ref"] = _rel_l2(torch, fm8_rows, fp32_ref)
            del refs
        result["checks"] = checks

        def two_term() -> dict[str, Any]:
            """The two-term query (q_precision "fp8x2") on the same data, timed like the one-term
            call: its kernel, time, cost against this run's one-term time (also interleaved and
            in alternating rounds), and its error against the fp32 reference next to the
            one-term error."""
            from snapmla.decode import DecodeConfig, runnable_kernels  # the library's rule

            config = DecodeConfig(case.batch, case.q_len, h, 1, q_precision="fp8x2")
            kernel = "auto" if "auto" in runnable_kernels(config) else "reference"
            doc: dict[str, Any] = {"kernel": kernel}
            plan2 = None
            try:
                plan2 = new_plan(q_precision="fp8x2")

                def run(i: int) -> None:
                    ours(i, plan2, kernel)

                run(0)
                torch.cuda.synchronize()
                doc["nan"] = bool(torch.isnan(out).any())
                if fp32_ref is not None:
                    mine = torch.stack([out[r] for r in sample])
                    doc["vs_fp32_ref"] = _rel_l2(torch, mine, fp32_ref)
                    doc["fp8_vs_fp32_ref"] = checks.get("ours_vs_fp32_ref")
                t2 = time_calls(
                    torch, run, variants=copies, target_s=args.timing_s, use_graph=not args.no_graph
                )
                doc.update(median_us=t2["median_us"], timing=t2)
                one = (result["snapmla"] or {}).get("median_us")
                if one:
                    doc["cost_vs_fp8"] = t2["median_us"] / one
                if args.two_term_pairs > 1 and ours_ok and not args.no_graph:
                    times = interleaved_times(
                        torch,
                        [ours, run],
                        per_call_s=t2["median_us"] * 1e-6,
                        variants=copies,
                        pairs=args.two_term_pairs,
                    )
                    if times is not None:
                        ratios = sorted(b / a for a, b in zip(*times))
                        q = statistics.quantiles(ratios, n=10)
                        doc["cost_interleaved"] = statistics.median(ratios)
                        doc["interleaved"] = {
                            "pairs": len(ratios),
                            "ratio_p10": q[0],
                            "ratio_p90": q[-1],
                            "fp8_us": statistics.median(times[0]) * 1e6,
                            "fp8x2_us": statistics.median(times[1]) * 1e6,
                        }
                if args.two_term_rounds > 0 and ours_ok:
                    # Alternating rounds (one-term, then two-term, each a shorter timing): a long
                    # case's clock drifts with the power cap between the two timings above, and
                    # alternating takes most of the drift out of the ratio.
                    ratios = []
                    for _ in range(args.two_term_rounds):
                        kw = {"variants": copies, "target_s": target_s / 2}
                        a = time_calls(torch, ours, use_graph=not args.no_graph, **kw)
                        b = time_calls(torch, run, use_graph=not args.no_graph, **kw)
                        ratios.append(b["median_us"] / a["median_us"])
                    doc["cost_alternating"] = statistics.median(ratios)
                    doc["alternating_ratios"] = ratios
            except Exception as exc:  # noqa: BLE001 (recorded in the results)
                torch.cuda.synchronize()
                doc["error"] = short_error(exc)
            finally:
                if plan2 is not None:
                    plan2.close()
            return doc

        # ---- timing.
        target_s = args.timing_s
        try:
            if not ours_ok:
                raise RuntimeError("not timed: the first call failed")
            t = time_calls(
                torch, ours, variants=copies, target_s=target_s, use_graph=not args.no_graph
            )
            t["gpu_after"] = gpu_state()
            t["plan_create_ms"] = plan_create_ms
            # Device time of re-planning (graph-safe), and the host cost of one update call.
            tu = time_calls(
                torch,
                lambda i: plan.update(seqlens_t, stream=stream()),
                target_s=0.02,
                use_graph=not args.no_graph,
            )
            t["plan_update_us"] = tu["median_us"]
            hosts = []
            for _ in range(20):
                t0 = time.perf_counter()
                plan.update(seqlens_t, stream=stream())
                hosts.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            t["plan_update_host_us"] = statistics.median(hosts) * 1e6
            t["tflops"] = fig["flops"] / (t["median_us"] * 1e-6) / 1e12
            t["tbps"] = fig["kv_bytes"]["snapmla"] / (t["median_us"] * 1e-6) / 1e12
            t["kernel"] = args.kernel
            result["snapmla"] = t
        except Exception as exc:  # noqa: BLE001 (recorded in the results)
            torch.cuda.synchronize()
            result["error"].setdefault("snapmla", short_error(exc))
        if args.two_term:
            result["snapmla_fp8x2"] = two_term()

        def time_theirs(name: str, call: Callable[[int], Any], kv: str = "flashinfer") -> None:
            """Times another library's call into result[name] (its TB/s: the KV bytes
            fig["kv_bytes"][kv], BF16 unless said)."""
            try:
                t = time_calls(
                    torch, call, variants=copies, target_s=target_s, use_graph=not args.no_graph
                )
                t["gpu_after"] = gpu_state()
                t["tflops"] = fig["flops"] / (t["median_us"] * 1e-6) / 1e12
                t["tbps"] = fig["kv_bytes"][kv] / (t["median_us"] * 1e-6) / 1e12
                result[name].update(t)
            except Exception as exc:  # noqa: BLE001 (recorded in the results)
                torch.cuda.synchronize()
                result["error"][name] = short_error(exc)

        if fi_ok:
            time_theirs("flashinfer", theirs)
        if fm_call is not None:
            time_theirs("flashmla", fm_call)
        if fm8_call is not None:
            time_theirs("flashmla_fp8", fm8_call, "flashmla_fp8")
        ours_t = (result["snapmla"] or {}).get("median_us")
        fi_t = (result["flashinfer"] or {}).get("median_us")
        fm_t = (result["flashmla"] or {}).get("median_us")
        fm8_t = (result["flashmla_fp8"] or {}).get("median_us")
        if ours_t and fi_t:
            result["speedup_vs_flashinfer"] = fi_t / ours_t
        if ours_t and fm_t:
            result["speedup_vs_flashmla"] = fm_t / ours_t
        if ours_t and fm8_t:
            result["speedup_vs_flashmla_fp8"] = fm8_t / ours_t
        if fm_t and anchor is not None and anchor.flashmla_us:
            result["flashmla_vs_anchor"] = fm_t / anchor.flashmla_us
        if ours_t and anchor is not None and anchor.target_us is not None:
            result["pass"] = ours_t <= anchor.target_us
        if fi_t and anchor is not None and anchor.flashinfer_us:
            result["flashinfer_vs_anchor"] = fi_t / anchor.flashinfer_us
    finally:
        torch.cuda.synchronize()
        cache.close()
        ckv = kpe = plan = fm_call = fm_out = fm8_call = fm8_out = None
        _free_memory(torch)
    return result


def _free_memory(torch: Any) -> None:
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    with contextlib.suppress(Exception):
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()


# ------------------------------------------------------------------------------ report


def _fmt(v: Any, spec: str = ".1f", none: str = "-") -> str:
    if v is None:
        return none
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def _us(timing: dict[str, Any]) -> str:
    """Median time; '*' marks eager timing (graph capture refused: launch overhead included)."""
    text = _fmt(timing.get("median_us"))
    return text + "*" if timing.get("method") == "eager-events" else text


def _flashmla_lines(cases: list[dict[str, Any]], key: str, title: str) -> list[str]:
    """The summary's block of a FlashMLA kernel (result key "flashmla" or "flashmla_fp8"): per
    case it ran or refused, its time, our speedup over it, its time over the anchor (BF16) or
    its topk (FP8), its error against the fp32 reference and its refusal. Cases of head counts
    it does not run ("skipped") are left out; no block where no case has it."""
    lines = []
    for c in cases:
        f = c.get(key) or {}
        if f.get("supported") is None or "skipped" in f:
            continue
        err = (c.get("checks") or {}).get(f"{key}_vs_fp32_ref")
        extra = (
            f"FM/anc {_fmt(c.get('flashmla_vs_anchor'), '.2f')}"
            if key == "flashmla"
            else f"topk {_fmt(f.get('topk'), 'd')}"
        )
        lines.append(
            f"{c['name']:<17} {_us(f):>8} us  ours {_fmt(c.get(f'speedup_vs_{key}'), '.2f')}x"
            f"  {extra}  err%ref {_fmt(None if err is None else 100 * err, '.2f')}"
            + (f"  {f['error'][:100]}" if "error" in f else "")
        )
    return ["", title, *lines] if lines else []


def table(cases: list[dict[str, Any]]) -> str:
    head = (
        f"{'case':<17} {'ours us':>8} {'FI us':>8} {'xFI':>5} {'TFLOPS':>6} {'TB/s':>5} "
        f"{'FI TB/s':>7} {'floor':>6} {'target':>6} {'pass':>4} {'err%FI':>6} "
        f"{'err%ref':>7} {'FI/anc':>6}"
    )
    lines = [head, "-" * len(head)]
    for c in cases:
        o = c.get("snapmla") or {}
        f = c.get("flashinfer") or {}
        chk = c.get("checks") or {}
        ok = c.get("pass")
        err_fi = chk.get("ours_vs_flashinfer")
        err_ref = chk.get("ours_vs_fp32_ref")
        lines.append(
            f"{c['name']:<17} {_us(o):>8} {_us(f):>8} "
            f"{_fmt(c.get('speedup_vs_flashinfer'), '.2f'):>5} {_fmt(o.get('tflops'), '.0f'):>6} "
            f"{_fmt(o.get('tbps'), '.2f'):>5} {_fmt(f.get('tbps'), '.2f'):>7} "
            f"{_fmt(c['floor']['floor_us']):>6} {_fmt(c.get('target_us')):>6} "
            f"{'-' if ok is None else ('yes' if ok else 'NO'):>4} "
            f"{_fmt(None if err_fi is None else 100 * err_fi, '.2f'):>6} "
            f"{_fmt(None if err_ref is None else 100 * err_ref, '.2f'):>7} "
            f"{_fmt(c.get('flashinfer_vs_anchor'), '.2f'):>6}"
        )
        for who, msg in (c.get("error") or {}).items():
            lines.append(f"    {who}: {msg[:150]}")
    eager = any(
        (c.get(k) or {}).get("method") == "eager-events"
        for c in cases
        for k in ("snapmla", "flashinfer", "flashmla", "flashmla_fp8")
    )
    if eager:
        lines.append("* eager launches timed between events (graph capture failed)")
    lines += _flashmla_lines(cases, "flashmla", "FlashMLA BF16, same run:")
    lines += _flashmla_lines(
        cases, "flashmla_fp8", "FlashMLA FP8 sparse decode as dense attention, same run:"
    )
    two = [c for c in cases if c.get("snapmla_fp8x2")]
    if two:
        lines.append("")
        lines.append("two-term query (q_precision fp8x2), same run:")
        for c in two:
            t = c["snapmla_fp8x2"]
            err, err1 = t.get("vs_fp32_ref"), t.get("fp8_vs_fp32_ref")
            lines.append(
                f"{c['name']:<17} {t['kernel']:<9} {_fmt(t.get('median_us')):>8} us "
                f"cost {_fmt(t.get('cost_vs_fp8'), '.3f')}x "
                f"(interleaved {_fmt(t.get('cost_interleaved'), '.3f')}x, "
                f"alternating {_fmt(t.get('cost_alternating'), '.3f')}x)  err%ref "
                f"{_fmt(None if err is None else 100 * err, '.3f')} "
                f"(fp8 {_fmt(None if err1 is None else 100 * err1, '.3f')})"
                + (f"  {t['error'][:100]}" if "error" in t else "")
            )
    return "\n".join(lines)


def markdown_table(doc: dict[str, Any]) -> str:
    """A results JSON as the Markdown table the docs quote: a caption naming the GPU, commit,
    date and timing, then per case our time, FlashInfer's (and FlashMLA's BF16 and FP8 sparse
    decode, where the run had them), the speedups, the FP8 floor and the target, in
    microseconds."""
    cases = doc["cases"]
    with_fm = any((c.get("flashmla") or {}).get("median_us") for c in cases)
    with_fm8 = any((c.get("flashmla_fp8") or {}).get("median_us") for c in cases)
    s = doc.get("settings") or {}
    caption = (
        f"{(doc.get('device') or {}).get('name', '?')}, commit {str(doc.get('commit'))[:7]}, "
        f"{str(doc.get('date', '?'))[:10]}, {_fmt(s.get('timing_s_per_kernel'), 'g')} s of "
        "CUDA-graph replays a kernel and case; times in us"
    )
    head = ["case", "snapmla", "FlashInfer BF16", "speedup"]
    if with_fm:
        head += ["FlashMLA BF16", "vs FlashMLA"]
    if with_fm8:
        head += ["FlashMLA FP8", "vs FlashMLA FP8"]
    head += ["FP8 floor", "target"]
    lines = [caption, "", "| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for c in cases:
        o, f, m, m8 = (
            c.get(k) or {} for k in ("snapmla", "flashinfer", "flashmla", "flashmla_fp8")
        )
        x = c.get("speedup_vs_flashinfer")
        row = [c["name"], _fmt(o.get("median_us")), _fmt(f.get("median_us"))]
        row.append("-" if x is None else f"{x:.2f}x")
        if with_fm:
            xm = c.get("speedup_vs_flashmla")
            row += [_fmt(m.get("median_us")), "-" if xm is None else f"{xm:.2f}x"]
        if with_fm8:
            xm8 = c.get("speedup_vs_flashmla_fp8")
            row += [_fmt(m8.get("median_us")), "-" if xm8 is None else f"{xm8:.2f}x"]
        row += [_fmt((c.get("floor") or {}).get("floor_us")), _fmt(c.get("target_us"), "g")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Cases (ANCHORS.md): " + ", ".join(DEFAULT_CASES),
    )
    p.add_argument(
        "--cases",
        help="comma-separated case names or fnmatch patterns "
        "(e.g. '64x1x128x32768,*x16x*'); a BxQxHxS or BxQxHxRS name outside the "
        "anchors runs as given. Default: every anchor case",
    )
    p.add_argument(
        "--kernel",
        default="auto",
        choices=("auto", "reference", "fast"),
        help="snapmla decode kernel (default auto)",
    )
    p.add_argument("--no-flashinfer", action="store_true", help="leave FlashInfer out")
    p.add_argument(
        "--no-flashmla",
        action="store_true",
        help="leave FlashMLA's BF16 decode out (timed where flash_mla is importable or the shim "
        "of bench/flashmla/build.sh is built)",
    )
    p.add_argument(
        "--no-flashmla-fp8",
        action="store_true",
        help="leave FlashMLA's FP8 sparse decode out (timed at 64 and 128 heads where the shim "
        "is built)",
    )
    p.add_argument("--out", help="write the JSON results here")
    p.add_argument(
        "--quick",
        action="store_true",
        help="shorter timing (about 0.05 s per kernel and case, still >= 20 replays)",
    )
    p.add_argument(
        "--timing-s",
        type=float,
        default=None,
        help="seconds of replays per kernel and case (default 0.3, --quick 0.05)",
    )
    p.add_argument("--seed", type=int, default=0, help="base random seed (default 0)")
    p.add_argument(
        "--no-graph",
        action="store_true",
        help="time eager launches between CUDA events instead of graph replays",
    )
    p.add_argument("--no-ref", action="store_true", help="skip the fp32 reference check")
    p.add_argument(
        "--two-term",
        action="store_true",
        help="also time the two-term query (q_precision fp8x2) in the same run: AUTO "
        "(the fast kernel) where the library runs it there, else the reference kernel",
    )
    p.add_argument(
        "--two-term-rounds",
        type=int,
        default=3,
        help="with --two-term: rounds of one-term then two-term timing whose median ratio is "
        "cost_alternating (0: none)",
    )
    p.add_argument(
        "--two-term-pairs",
        type=int,
        default=100,
        help="with --two-term: rounds of one graph replay of each call in turn (milliseconds "
        "each) whose median ratio is cost_interleaved, free of the clock's drift between long "
        "timings (0 or 1: none; needs graphs)",
    )
    p.add_argument(
        "--page-stride",
        type=int,
        default=0,
        help="bytes from one page of snapmla's cache to the next (KVCache's page_stride: 0 = "
        "packed, 41216; e.g. 41984 for vLLM's 64 x 656-byte slots)",
    )
    p.add_argument(
        "--num-sm-parts",
        type=int,
        default=0,
        help="the plans' split-KV parallelism (DecodePlan's num_sm_parts; 0 = the library's "
        "default from the SM count)",
    )
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument(
        "--markdown",
        metavar="JSON",
        help="print the results JSON's table in Markdown (as docs/performance.md has it) and exit",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.markdown:
        with open(args.markdown, encoding="utf-8") as f:
            print(markdown_table(json.load(f)))
        return 0
    if args.timing_s is None:
        args.timing_s = 0.05 if args.quick else 0.3
    cases = select_cases(args.cases)
    if args.list:
        for c in cases:
            a = ANCHORS.get(c.name)
            print(f"{c.name:<17} target {_fmt(a.target_us if a else None)} us")
        return 0

    gpu = open_gpu("bench_decode")
    if gpu is None:
        return 2
    torch, snapmla, env = gpu
    fi = None
    fi_error = None
    if not args.no_flashinfer:
        try:
            fi = FlashInferBF16(torch)
            env["flashinfer"] = fi.version
        except Exception as exc:  # noqa: BLE001 (not installed, or no fa3 build)
            fi_error = short_error(exc)
            env["flashinfer"] = f"unavailable: {fi_error}"
            print(f"bench_decode: FlashInfer unavailable: {fi_error}", file=sys.stderr)
    fm, fm8 = open_flashmla(args, env)
    fm_source = None if fm is None else "flash_mla" if isinstance(fm, FlashMLABF16) else "shim"
    doc: dict[str, Any] = {
        "schema": "snapmla.bench_decode/1",
        **git_commit(),
        **env,
        "settings": {
            "kernel": args.kernel,
            "quick": args.quick,
            "timing_s_per_kernel": args.timing_s,
            "min_reps": MIN_REPS,
            "graph": not args.no_graph,
            "graph_target_s": GRAPH_TARGET_S,
            "rotate_bytes": ROTATE_BYTES,
            "page_size": PAGE_SIZE,
            "softmax_scale": SOFTMAX_SCALE,
            "data": "normal(0, 0.5), BF16; appended to the FP8 cache with KVCache.append",
            "seed": args.seed,
            "flashinfer": not args.no_flashinfer,
            "flashmla": fm is not None,
            "flashmla_source": fm_source,
            "flashmla_fp8": fm8 is not None,
            "two_term": args.two_term,
            "page_stride": args.page_stride,
            "num_sm_parts": args.num_sm_parts,
        },
        "constants": {
            "bytes_per_token": {
                "snapmla": OUR_BYTES_PER_TOKEN,
                "flashinfer": BF16_BYTES_PER_TOKEN,
                "flashmla_fp8": FLASHMLA_FP8_BYTES_PER_TOKEN,
            },
            "flop_per_row_token": FLOP_PER_ROW_TOKEN,
            "hbm_tbps": HBM_TBPS,
            "floor_hbm_tbps": FLOOR_HBM_TBPS,
            "fp8_tflops": FP8_TFLOPS,
            "bf16_tflops": BF16_TFLOPS,
            "tile_rows": TILE_ROWS,
        },
        "cases": [],
    }
    start = time.perf_counter()
    for i, case in enumerate(cases):
        t0 = time.perf_counter()
        try:
            res = run_case(torch, snapmla, case, args, fi, fi_error, fm, fm8)
        except Exception as exc:  # noqa: BLE001 (one case's failure is recorded)
            traceback.print_exc()
            res = {
                "name": case.name,
                "error": {"case": short_error(exc)},
                "floor": figures(case, case.seqlens(args.seed))["floor"],
                "target_us": ANCHORS[case.name].target_us if case.name in ANCHORS else None,
            }
            _free_memory(torch)
        _free_memory(torch)
        res["wall_s"] = time.perf_counter() - t0
        doc["cases"].append(res)
        o = (res.get("snapmla") or {}).get("median_us")
        f = (res.get("flashinfer") or {}).get("median_us")
        print(
            f"[{i + 1}/{len(cases)}] {case.name}: ours {_fmt(o)} us, FlashInfer {_fmt(f)} us "
            f"({res['wall_s']:.1f} s)",
            flush=True,
        )
        write_json(args.out, doc)  # partial results survive a crash
    measured = [c for c in doc["cases"] if c.get("pass") is not None]
    doc["summary"] = {
        "cases": len(doc["cases"]),
        "with_target": len(measured),
        "passed": sum(1 for c in measured if c["pass"]),
        "failed": [c["name"] for c in measured if not c["pass"]],
        "errors": [
            c["name"]
            for c in doc["cases"]
            if set(c.get("error") or {}) - {"flashinfer", "flashmla", "flashmla_fp8"}
        ],
        "flashinfer_unsupported": [
            c["name"] for c in doc["cases"] if (c.get("flashinfer") or {}).get("supported") is False
        ],
        "wall_s": time.perf_counter() - start,
    }
    write_json(args.out, doc)
    print()
    print(
        f"snapmla decode ({args.kernel}) vs FlashInfer FA3 BF16 on {env['device']['name']}, "
        f"commit {doc['commit'][:12]}"
    )
    print(table(doc["cases"]))
    s = doc["summary"]
    print(
        f"\n{s['passed']}/{s['with_target']} cases meet their target; "
        f"errors in: {', '.join(s['errors']) or 'none'}; {s['wall_s']:.0f} s"
    )
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
