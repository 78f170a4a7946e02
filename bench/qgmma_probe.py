"""Read bench/qgmma_probe.cu's output: the FP8 wgmma's QK logits against exact dot products,
and against the emulation of bench/qgmma_precision.py, per chain length (issue 9's probe).

For each accumulation scheme (one accumulator over 16, 8, 4, 2 or 1 k = 32 steps, the chains
added in fp32) it prints the logits' error against exact float64 dot products of the same
E4M3 codes (relative RMS over all logits, and the largest error over the largest |S| of the
tile), and for each emulated accumulator width (``bits``) the share of logits the emulation
reproduces bit for bit. If one width reproduces every logit at every chain length, the
emulation is the hardware; if the error does not fall with the chain length, shorter chains
cannot help the two-term query (session 12 saw no gain from four accumulators).

Run: ``python3 bench/qgmma_probe.py OUT_DIR [--bits 12 13 14 15]`` (CPU, seconds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qgmma_precision import qgmma_step

ROWS = TOKENS = 64
DIM = 512
STEPS = DIM // 32
CHAINS = [STEPS >> s for s in range(5)]  # the probe's schemes, in its order


def codes_to_values(raw: bytes, n: int) -> np.ndarray:
    return np.frombuffer(raw, dtype=ml_dtypes.float8_e4m3fn).astype(np.float64).reshape(n, DIM)


def emulate(q: np.ndarray, k: np.ndarray, chain: int, bits: int) -> np.ndarray:
    """S [rows, tokens] as the emulated wgmma computes it with `chain` steps an accumulator,
    the chains added in fp32 in order."""
    a = np.broadcast_to(q[:, None, :], (ROWS, TOKENS, DIM)).reshape(ROWS, TOKENS, STEPS, 32)
    b = np.broadcast_to(k[None, :, :], (ROWS, TOKENS, DIM)).reshape(ROWS, TOKENS, STEPS, 32)
    total = None
    for first in range(0, STEPS, chain):
        d = np.zeros((ROWS, TOKENS))
        for step in range(first, first + chain):
            d = qgmma_step(d, a[:, :, step], b[:, :, step], bits)
        d32 = d.astype(np.float32)
        total = d32 if total is None else (total + d32).astype(np.float32)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--bits", type=int, nargs="+", default=[12, 13, 14, 15])
    args = parser.parse_args(argv)
    tiles = sorted(args.folder.glob("tile*_s.bin"), key=lambda p: int(p.stem[4:-2]))
    if not tiles:
        raise SystemExit(f"no tile*_s.bin in {args.folder}")
    header = f"{'tile':>4} {'data':>7} {'chain':>5} {'relRMS':>9} {'max/|S|max':>10}"
    header += "".join(f" {'emu' + str(b):>7}" for b in args.bits)
    print("FP8 wgmma QK logits against exact dot products; emuN: share of logits the")
    print("N-bit emulation reproduces exactly")
    print(header)
    summary: dict[int, list[float]] = {c: [] for c in CHAINS}
    for path in tiles:
        tile = int(path.stem[4:-2])
        stem = path.with_name(f"tile{tile}")
        q = codes_to_values(Path(f"{stem}_q8.bin").read_bytes(), ROWS)
        k = codes_to_values(Path(f"{stem}_k8.bin").read_bytes(), TOKENS)
        s_all = np.fromfile(path, dtype=np.float32).reshape(len(CHAINS), ROWS, TOKENS)
        exact = q @ k.T
        scale = np.sqrt(np.mean(exact**2))
        for i, chain in enumerate(CHAINS):
            got = s_all[i].astype(np.float64)
            if not np.isfinite(got).all():
                raise SystemExit(f"tile {tile} chain {chain}: unwritten or non-finite logits")
            err = got - exact
            rel = np.sqrt(np.mean(err**2)) / scale
            summary[chain].append(rel)
            line = f"{tile:>4} {('normal', 't3')[tile % 2]:>7} {chain:>5} {rel:>9.2e}"
            line += f" {np.abs(err).max() / np.abs(exact).max():>10.2e}"
            for bits in args.bits:
                same = np.mean(emulate(q, k, chain, bits) == s_all[i])
                line += f" {same:>7.1%}"
            print(line)
    print("mean relative RMS error by chain length:")
    for chain in CHAINS:
        print(f"  {chain:>2} steps an accumulator: {np.mean(summary[chain]):.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
