"""Host overhead of the Python API: microseconds of CPU per call.

Times N calls each of ``decode`` (outputs given), ``DecodePlan.update``, ``KVCache.append``,
``KVCache.fetch_dequant`` (outputs given) and ``quantize_q`` (outputs given), at each batch size
asked for, and reports the median and p90 of the per-call times (``time.perf_counter_ns``
around each call). Every call names its stream (``stream=`` an int handle) unless
``--default-stream`` is given.

Two modes:

- ``--fake`` (the default when no CUDA device is visible): no GPU. The tensors are DLPack
  producers that claim ``cuda:0`` with fake addresses (never dereferenced), and the C library
  runs in validation-only mode (``snapmla_set_validate_only(1)``): each C call checks its
  arguments and returns ``SNAPMLA_VALIDATED`` where it would first call CUDA. For this
  benchmark only, ``_lib.check`` is wrapped to take that status as success (the package's own
  behaviour is unchanged: a validated-only call is an error there). The path timed is the whole
  host path: Python checks, DLPack capsule parsing, cffi struct building, the C checks; only
  the CUDA launch itself is missing. The fake producer's ``__dlpack__`` is as cheap as
  ctypes allows (one ``PyCapsule_New`` around a prebuilt ``DLManagedTensorVersioned``); its
  cost per call is reported as ``producer_us`` so that it can be told apart.
- ``--real``: torch tensors on ``cuda:0``, real launches (needs torch and cupy, a Hopper GPU).
  ``torch.cuda.synchronize()`` is called every 64 calls, outside the timed calls (a call
  faster on the host than its GPU work would otherwise fill the launch queue, and the figure
  would be the GPU's), so the per-call time is the host's.

    python3 bench/bench_host_overhead.py                      # fake on CPU, batches 1 and 64
    python3 bench/bench_host_overhead.py --real --out bench/results/host-overhead-h200.json
    python3 bench/bench_host_overhead.py --profile decode     # cProfile of 2000 decode calls
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import datetime
import gc
import os
import platform
import pstats
import statistics
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_decode import git_commit, import_snapmla, write_json

OPS = ("decode", "plan_update", "append", "fetch_dequant", "quantize_q")
NUM_HEADS = 128
MAX_PAGES = 64
NUM_LAYERS = 2
NUM_PAGES = 256
SOFTMAX_SCALE = 192**-0.5
FAKE_STREAM = 0x5EED
FAKE_BASE = 0x7F0000000000  # 256-byte aligned fake device addresses, never dereferenced


# ------------------------------------------------------------------------------ fake mode

_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", ctypes.pythonapi))

# DLPack (code, bits) of the dtypes used here.
_DL = {
    "bfloat16": (4, 16),
    "int32": (0, 32),
    "int64": (0, 64),
    "float32": (2, 32),
    "float8_e4m3fn": (10, 8),
    "uint8": (1, 8),
}


class FakeCudaTensor:
    """A compact DLPack producer claiming ``cuda:0`` at a fake address. The managed tensor is
    built once; each ``__dlpack__`` wraps it in a new capsule without a destructor (the
    producer object owns it)."""

    def __init__(self, shape: tuple[int, ...], dtype: str, address: int) -> None:
        import_snapmla()
        from snapmla import _dlpack as dl

        self.shape = shape
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= max(size, 1)
        self._strides = (ctypes.c_int64 * max(len(shape), 1))(*reversed(strides))
        m = dl.DLManagedTensorVersioned()
        m.version.major, m.version.minor = 1, 0
        t = m.dl_tensor
        t.data = address
        t.device.device_type, t.device.device_id = 2, 0
        t.ndim = len(shape)
        t.dtype.code, t.dtype.bits = _DL[dtype]
        t.dtype.lanes = 1
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        self._managed = m
        self._address = ctypes.addressof(m)
        self.nbytes = step * max(1, _DL[dtype][1] // 8)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **kwargs: Any) -> Any:
        if max_version is None:
            raise TypeError("this fake producer exports DLPack 1.x capsules only")
        return _capsule_new(self._address, b"dltensor_versioned", None)


class _Addresses:
    def __init__(self) -> None:
        self.next = FAKE_BASE

    def take(self, nbytes: int) -> int:
        address = self.next
        self.next += (nbytes + 4095) // 4096 * 4096 + 4096
        return address


def _fake_setup(snapmla: Any) -> Callable[[str, tuple[int, ...]], Any]:
    """Validation-only library, ``_lib.check`` taking SNAPMLA_VALIDATED as success; returns a
    tensor factory."""
    from snapmla import _lib

    lib = _lib.lib()
    lib.snapmla_set_validate_only(1)
    real_check = _lib.check

    def check(status: int, what: str) -> None:  # benchmark only: VALIDATED = launched
        if status != 6:
            real_check(status, what)

    _lib.check = check
    addresses = _Addresses()

    def make(dtype: str, shape: tuple[int, ...]) -> Any:
        probe = FakeCudaTensor(shape, dtype, 0)
        return FakeCudaTensor(shape, dtype, addresses.take(probe.nbytes))

    return make


def _fake_plan(snapmla: Any, seqlens: Any, stream: int) -> Any:
    """A DecodePlan built by its constructor, with the two CuPy allocations replaced by fake
    addresses (construction is not timed)."""
    decode_module = sys.modules["snapmla.decode"]

    real_empty = decode_module.empty
    ptrs = iter((FAKE_BASE - 2**30, FAKE_BASE - 2**29))

    def empty(op: str, shape: Any, dtype: str, device: int, s: Any = None) -> tuple[Any, int]:
        return None, next(ptrs)

    decode_module.empty = empty
    try:
        return snapmla.DecodePlan(seqlens, num_heads=NUM_HEADS, max_pages=MAX_PAGES, stream=stream)
    finally:
        decode_module.empty = real_empty


# ------------------------------------------------------------------------------ cases


def build_calls(
    snapmla: Any, mode: str, batch: int, default_stream: bool
) -> tuple[dict[str, Callable[[], Any]], Callable[[], None], Any]:
    """The five calls at ``batch`` (each a no-argument closure), a synchronize function and
    what must stay alive."""
    if mode == "fake":
        make = _fake_setup(snapmla)
        stream = FAKE_STREAM
        sync: Callable[[], None] = lambda: None
        cache_buffer = make("uint8", (NUM_LAYERS * NUM_PAGES * snapmla.PAGE_BYTES,))
        cache = snapmla.KVCache(NUM_LAYERS, NUM_PAGES, buffer=cache_buffer)
    else:
        import torch

        dtypes = {
            "bfloat16": torch.bfloat16,
            "int32": torch.int32,
            "int64": torch.int64,
            "float32": torch.float32,
            "float8_e4m3fn": torch.float8_e4m3fn,
            "uint8": torch.uint8,
        }

        def make(dtype: str, shape: tuple[int, ...]) -> Any:
            return torch.zeros(shape, dtype=dtypes[dtype], device="cuda")

        stream = torch.cuda.current_stream().cuda_stream
        sync = torch.cuda.synchronize
        cache_buffer = make("uint8", (NUM_LAYERS * NUM_PAGES * snapmla.PAGE_BYTES,))
        cache = snapmla.KVCache(NUM_LAYERS, NUM_PAGES, buffer=cache_buffer)

    s = None if default_stream else stream
    q = make("bfloat16", (batch, 1, NUM_HEADS, 576))
    block_table = make("int32", (batch, MAX_PAGES))
    seqlens = make("int32", (batch,))
    if mode == "real":
        seqlens.fill_(100)
        block_table.copy_(torch.arange(MAX_PAGES, dtype=torch.int32).repeat(batch, 1))
        plan = snapmla.DecodePlan(seqlens, num_heads=NUM_HEADS, max_pages=MAX_PAGES, stream=s)
    else:
        plan = _fake_plan(snapmla, seqlens, stream)
    out = make("bfloat16", (batch, 1, NUM_HEADS, 512))
    lse = make("float32", (batch, NUM_HEADS, 1))
    c_kv = make("bfloat16", (batch, 512))
    k_pe = make("bfloat16", (batch, 64))
    slots = make("int64", (batch,))
    if mode == "real":
        slots.copy_(torch.arange(batch, dtype=torch.int64))
    c_out = make("bfloat16", (batch, 512))
    k_out = make("bfloat16", (batch, 64))
    q_tokens = make("bfloat16", (batch, NUM_HEADS, 576))
    q_outs = (
        make("float8_e4m3fn", (batch, NUM_HEADS, 512)),
        make("bfloat16", (batch, NUM_HEADS, 64)),
        make("float32", (batch, NUM_HEADS)),
    )
    decode = snapmla.decode
    quantize_q = snapmla.quantize_q

    calls = {
        "decode": lambda: decode(
            cache,
            0,
            q,
            block_table,
            seqlens,
            plan,
            softmax_scale=SOFTMAX_SCALE,
            out=out,
            lse=lse,
            stream=s,
        ),
        "plan_update": lambda: plan.update(seqlens, stream=s),
        "append": lambda: cache.append(0, c_kv, k_pe, slots, stream=s),
        "fetch_dequant": lambda: cache.fetch_dequant(0, slots, c_kv=c_out, k_pe=k_out, stream=s),
        "quantize_q": lambda: quantize_q(q_tokens, out=q_outs, stream=s),
    }
    keep = (cache, plan, cache_buffer, q, block_table, seqlens, out, lse)
    if mode == "real":
        # The same calls through snapmla.torch's custom ops (torch tensors, torch's current
        # stream, no DLPack): the serving engines' path.
        import snapmla.torch as smt

        t_cache = cache_buffer.view(NUM_LAYERS, NUM_PAGES, snapmla.PAGE_BYTES)
        t_plan, t_ws = smt.decode_buffers(batch, num_heads=NUM_HEADS, max_pages=MAX_PAGES)
        smt.plan(t_plan, seqlens, num_heads=NUM_HEADS, max_pages=MAX_PAGES)
        calls["torch_decode"] = lambda: smt.decode(
            t_cache,
            0,
            q,
            block_table,
            seqlens,
            t_plan,
            t_ws,
            softmax_scale=SOFTMAX_SCALE,
            out=out,
            lse=lse,
        )
        calls["torch_plan"] = lambda: smt.plan(
            t_plan, seqlens, num_heads=NUM_HEADS, max_pages=MAX_PAGES
        )
        calls["torch_append"] = lambda: smt.append(t_cache, 0, c_kv, k_pe, slots)
        calls["torch_fetch"] = lambda: smt.fetch_dequant(t_cache, 0, slots, c_kv=c_out, k_pe=k_out)
        calls["torch_quantize"] = lambda: smt.quantize_q(q_tokens, out=q_outs)
        keep = (*keep, t_cache, t_plan, t_ws)
    if mode == "fake":
        calls["producer"] = lambda: q.__dlpack__(max_version=(1, 0), stream=1)
    return calls, sync, keep


# ------------------------------------------------------------------------------ timing


def call_samples(
    call: Callable[[], Any], iters: int, warmup: int, sync: Callable[[], None]
) -> list[int]:
    """Host nanoseconds of each of ``iters`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    sync()
    gc.collect()
    clock = time.perf_counter_ns
    samples = []
    append = samples.append
    # The GPU drained every 64 calls, outside the timed calls (as bench/host_overhead_c.cu
    # does): a call faster on the host than its GPU work would otherwise fill the launch queue
    # and time the GPU.
    for i in range(iters):
        if i % 64 == 0:
            sync()
        t0 = clock()
        call()
        append(clock() - t0)
    sync()
    return samples


def summarize(samples: list[int], rounds: list[list[int]] | None = None) -> dict:
    """Median, p90, min and mean in microseconds; with ``rounds`` (the samples by round) also
    each round's median and the best of them."""
    us = sorted(x / 1000 for x in samples)
    r = {
        "median_us": round(statistics.median(us), 2),
        "p90_us": round(us[int(0.9 * (len(us) - 1))], 2),
        "min_us": round(us[0], 2),
        "mean_us": round(sum(us) / len(us), 2),
        "iters": len(us),
    }
    if rounds:
        medians = [round(statistics.median(x) / 1000, 2) for x in rounds]
        r["round_medians_us"] = medians
        r["best_round_median_us"] = min(medians)
    return r


def time_call(call: Callable[[], Any], iters: int, warmup: int, sync: Callable[[], None]) -> dict:
    return summarize(call_samples(call, iters, warmup, sync))


def profile(calls: dict[str, Callable[[], Any]], ops: list[str], iters: int, top: int) -> None:
    for op in ops:
        call = calls[op]
        for _ in range(50):
            call()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(iters):
            call()
        profiler.disable()
        print(f"\n=== cProfile: {iters} calls of {op} (tottime, top {top}) ===")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def _gpu_visible() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--fake",
        action="store_true",
        help="CPU: fake CUDA tensors, validation-only C library (default without a GPU)",
    )
    mode.add_argument("--real", action="store_true", help="GPU: torch tensors, real launches")
    p.add_argument("--batch", default="1,64", help="comma-separated batch sizes (default 1,64)")
    p.add_argument("--iters", type=int, default=2000, help="timed calls per op (default 2000)")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds over the ops, each op timed for iters / rounds calls a round (default 5)",
    )
    p.add_argument(
        "--ops", default=",".join(OPS), help="comma-separated subset of " + ", ".join(OPS)
    )
    p.add_argument(
        "--default-stream",
        action="store_true",
        help="pass stream=None (the inputs' framework's current stream)",
    )
    p.add_argument(
        "--profile",
        nargs="?",
        const="decode",
        metavar="OPS",
        help="cProfile the given ops (default decode) at the first batch size instead of timing",
    )
    p.add_argument(
        "--no-torch-ops",
        dest="torch_ops",
        action="store_false",
        help="real mode: leave out the snapmla.torch custom-op calls (torch_*)",
    )
    p.add_argument("--top", type=int, default=25, help="functions shown by --profile")
    p.add_argument("--out", help="write the figures as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    mode = "real" if args.real else "fake" if args.fake or not _gpu_visible() else "real"
    if mode == "fake" and args.default_stream:
        raise SystemExit("--default-stream needs --real (fake mode has no torch or CuPy stream)")
    snapmla = import_snapmla()
    batches = [int(b) for b in args.batch.split(",")]
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            raise SystemExit(f"unknown op {o!r}; known: {', '.join(OPS)}")
    if args.profile:
        calls, _, keep = build_calls(snapmla, mode, batches[0], args.default_stream)
        profile(calls, [o for o in args.profile.split(",") if o in calls], args.iters, args.top)
        del keep
        return 0

    results: dict[str, dict[str, Any]] = {}
    rounds = max(1, min(args.rounds, args.iters))
    print(
        f"snapmla host overhead, mode {mode}, {args.iters} calls per op in {rounds} rounds "
        "(every op once a round, so that the host's slow and fast spells fall on all of them), "
        "microseconds per call"
    )
    # Every batch's calls at once, each op timed for iters / rounds calls a round.
    setups = [(batch, *build_calls(snapmla, mode, batch, args.default_stream)) for batch in batches]
    samples: dict[tuple[str, int], list[list[int]]] = {}
    for k in range(rounds):
        per_round = args.iters // rounds + (1 if k < args.iters % rounds else 0)
        for batch, calls, sync, _keep in setups:
            extra = [
                c for c in calls if c == "producer" or (c.startswith("torch_") and args.torch_ops)
            ]
            for name in ops + extra:
                samples.setdefault((name, batch), []).append(
                    call_samples(calls[name], per_round, args.warmup if k == 0 else 8, sync)
                )
    print(f"{'op':<15}{'batch':>6}{'median':>10}{'p90':>10}{'min':>10}{'mean':>10}  round medians")
    for (name, batch), by_round in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        r = summarize([x for rs in by_round for x in rs], by_round)
        results.setdefault(name, {})[str(batch)] = r
        print(
            f"{name:<15}{batch:>6}{r['median_us']:>10.1f}{r['p90_us']:>10.1f}"
            f"{r['min_us']:>10.1f}{r['mean_us']:>10.1f}  "
            + " ".join(f"{m:.1f}" for m in r["round_medians_us"])
        )
    del setups
    if mode == "fake":
        print(
            "producer: the fake tensor's own __dlpack__ (not snapmla's cost; one per tensor "
            "argument is inside each op's figure)"
        )
    doc = {
        "benchmark": "host_overhead",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **git_commit(),
        "mode": mode,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "settings": {
            "iters": args.iters,
            "rounds": rounds,
            "warmup": args.warmup,
            "batches": batches,
            "num_heads": NUM_HEADS,
            "max_pages": MAX_PAGES,
            "stream": "default (None)" if args.default_stream else "explicit int",
        },
        "unit": "microseconds per call (host)",
        "results": results,
    }
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
