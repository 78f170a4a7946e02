"""snapmla_decode's graph replay (cpp/common/repeated_launch.cu) on the GPU: replayed calls give
the bits direct launches give (in this process, where a call's first sight launches directly,
and against a process with SNAPMLA_DECODE_GRAPHS=0), a graph never writes a buffer its call did
not name, and snapmla_release_thread_resources leaves decoding working, on any thread.

Not provoked here: a failed capture or graph launch (their fallback and retry bookkeeping is
tested on the host by tests/test_launch_cache.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _util import SM_SCALE, device_inputs, make_cache, make_case, make_plan, nan_torch, to_numpy

import snapmla
from snapmla import _lib

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
# The table's size (cpp/common/launch_cache.h): a cycle of more distinct calls captures nothing.
CAPACITY = int(
    re.search(r"kCapacity = (\d+);", (ROOT / "cpp/common/launch_cache.h").read_text()).group(1)
)
HEADS = 16
LENS = [300, 517, 64, 700]


def _release() -> None:
    assert _lib.lib().snapmla_release_thread_resources() == 0


class Setup:
    """A 2-layer case with its device inputs and plan; decode() into given outputs."""

    def __init__(self, case: Any) -> None:
        self.case = case
        self.cache = make_cache(case)
        self.q, self.bt, self.sl = device_inputs(case, "torch")
        self.plan = make_plan(case, self.sl)

    def outputs(self) -> tuple[Any, Any]:
        b = len(LENS)
        return nan_torch((b, 1, HEADS, 512)), nan_torch((b, HEADS, 1), "float32")

    def decode(self, out: Any, lse: Any, layer: int) -> None:
        snapmla.decode(
            self.cache, layer, self.q, self.bt, self.sl, self.plan,
            softmax_scale=SM_SCALE, out=out, lse=lse,
        )  # fmt: skip


def _bits(out: Any, lse: Any) -> tuple[np.ndarray, np.ndarray]:
    return to_numpy(out).view(np.uint16).copy(), to_numpy(lse).view(np.uint32).copy()


@pytest.fixture
def setup(rng: np.random.Generator) -> Setup:
    _release()  # every test from an empty table
    return Setup(make_case(rng, LENS, num_heads=HEADS, num_layers=2))


def test_replays_match_direct_launches(setup: Setup, tmp_path: Path) -> None:
    """8 calls (4 output buffers x 2 layers) 6 times: the first round launches directly, the
    second captures, the rest replay; then a cycle of CAPACITY + 8 distinct calls twice (each
    evicted before its next use: direct launches). Every output equals the first round's, bit
    for bit, and a process with SNAPMLA_DECODE_GRAPHS=0 gives the same bits."""
    import torch

    first: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    buffers = [setup.outputs() for _ in range(4)]
    for rnd in range(6):
        for i, (out, lse) in enumerate(buffers):
            for layer in (0, 1):
                out.fill_(float("nan"))
                lse.fill_(float("nan"))
                setup.decode(out, lse, layer)
                got = _bits(out, lse)
                if layer not in first:
                    first[layer] = got
                for want, have in zip(first[layer], got, strict=True):
                    assert np.array_equal(want, have), f"round {rnd}, buffer {i}, layer {layer}"
    many = [setup.outputs() for _ in range(CAPACITY + 8)]
    for rnd in range(2):
        for i, (out, lse) in enumerate(many):
            setup.decode(out, lse, i % 2)
        torch.cuda.synchronize()
        for i, (out, lse) in enumerate(many):
            for want, have in zip(first[i % 2], _bits(out, lse), strict=True):
                assert np.array_equal(want, have), f"cycle round {rnd}, call {i}"
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
    # The same case decoded with graph replay off, in another process.
    case = setup.case
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, image=case.image, q=case.q.view(np.uint16), block_table=case.block_table,
             seqlens=case.seqlens, max_pages=case.max_pages, num_layers=case.num_layers,
             num_pages=case.num_pages)  # fmt: skip
    env = {**os.environ, "SNAPMLA_DECODE_GRAPHS": "0"}
    subprocess.run(
        [sys.executable, __file__, str(inputs), str(tmp_path / "off.npz")],
        check=True, env=env, timeout=300,
    )  # fmt: skip
    off = np.load(tmp_path / "off.npz")
    for layer in (0, 1):
        assert np.array_equal(off[f"out{layer}"], first[layer][0]), f"graphs off, layer {layer}"
        assert np.array_equal(off[f"lse{layer}"], first[layer][1]), f"graphs off, layer {layer}"


def test_graph_never_writes_an_unnamed_buffer(setup: Setup) -> None:
    """A call replayed into buffer A, then the same call into B (A alive, so B lies elsewhere):
    B gets the output and A is untouched; then A freed and C allocated (perhaps at A's address):
    C gets the output."""
    import torch

    a_out, a_lse = setup.outputs()
    for _ in range(4):
        setup.decode(a_out, a_lse, 0)
    want = _bits(a_out, a_lse)
    a_out.fill_(float("nan"))
    a_lse.fill_(float("nan"))
    b_out, b_lse = setup.outputs()
    assert b_out.data_ptr() != a_out.data_ptr()
    for _ in range(3):
        setup.decode(b_out, b_lse, 0)
        for w, have in zip(want, _bits(b_out, b_lse), strict=True):
            assert np.array_equal(w, have)
    assert torch.isnan(a_out.float()).all() and torch.isnan(a_lse).all(), "A was written"
    del a_out, a_lse
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    c_out, c_lse = setup.outputs()
    for _ in range(3):
        c_out.fill_(float("nan"))
        setup.decode(c_out, c_lse, 0)
        for w, have in zip(want, _bits(c_out, c_lse), strict=True):
            assert np.array_equal(w, have)


def test_release_then_decode_again(setup: Setup) -> None:
    out, lse = setup.outputs()
    setup.decode(out, lse, 1)
    want = _bits(out, lse)
    for _ in range(3):
        for _ in range(3):  # direct, captured, replayed (after a release: anew)
            out.fill_(float("nan"))
            setup.decode(out, lse, 1)
            for w, have in zip(want, _bits(out, lse), strict=True):
                assert np.array_equal(w, have)
        _release()
    _release()  # holding nothing


def test_threads_keep_their_own_graphs(setup: Setup) -> None:
    """Calls repeated on two threads at once (each its own table and outputs), each releasing
    its graphs at the end; a thread that never decoded releases too."""
    import torch

    out, lse = setup.outputs()
    setup.decode(out, lse, 0)
    want = _bits(out, lse)
    errors: list[str] = []

    def work(k: int) -> None:
        try:
            stream = torch.cuda.Stream()
            mine = setup.outputs()
            with torch.cuda.stream(stream):
                for n in range(5):
                    mine[0].fill_(float("nan"))
                    setup.decode(*mine, 0)
                    stream.synchronize()
                    for w, have in zip(want, _bits(*mine), strict=True):
                        if not np.array_equal(w, have):
                            errors.append(f"thread {k}, call {n}")
            _release()
        except Exception as exc:  # reported below, in the test's thread
            errors.append(f"thread {k}: {exc!r}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=_release))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _decode_graphs_off(inputs: str, outputs: str) -> None:
    """The child of test_replays_match_direct_launches: both layers decoded once."""
    from _util import BF16, to_torch

    d = np.load(inputs)
    cache = snapmla.KVCache(int(d["num_layers"]), int(d["num_pages"]), buffer=to_torch(d["image"]))
    q, bt, sl = to_torch(d["q"].view(BF16)), to_torch(d["block_table"]), to_torch(d["seqlens"])
    b, s_q, h, _ = d["q"].shape
    plan = snapmla.DecodePlan(sl, num_heads=h, q_len=s_q, max_pages=int(d["max_pages"]))
    result = {}
    for layer in (0, 1):
        out, lse = nan_torch((b, s_q, h, 512)), nan_torch((b, h, s_q), "float32")
        snapmla.decode(cache, layer, q, bt, sl, plan, softmax_scale=SM_SCALE, out=out, lse=lse)
        result[f"out{layer}"], result[f"lse{layer}"] = _bits(out, lse)
    np.savez(outputs, **result)


if __name__ == "__main__":
    _decode_graphs_off(sys.argv[1], sys.argv[2])
