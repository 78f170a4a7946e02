"""Read qgmma_probe.cu's output: what the FP8 wgmma's accumulation does to QK logits and to PV,
against exact products and against the emulation of qgmma_precision.py, per chain length.

For each product (``qk``: 512 channels; ``pv``: 16384 tokens) and accumulation scheme (one
accumulator over ``chain`` k = 32 steps, the chains added in fp32) it prints the error against
exact float64 products of the same E4M3 codes: relative RMS over the 64 x 64 outputs, the mean
signed error over the RMS (a bias that grows with the chain shows truncation, not rounding),
the largest error over the largest |D|, and the error's component along the exact result
(``shrink``: negative where magnitudes shrink, as truncation toward zero does even where the
mean is zero); then, for each emulated accumulator width (``bits``) and way of cutting the
aligned products (``f``: toward -inf, ``z``: toward zero), the share of outputs the emulation
reproduces bit for bit. If one reproduces every output at every chain length, the emulation is
the hardware.

Run: ``PYTHONPATH=python python3 bench/probes/qgmma_probe.py OUT_DIR [--bits 13 14]`` (CPU; the
pv emulation takes a few seconds a tile and width).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qgmma_precision import _exponent, _truncate, qgmma_step

ROWS = 64


def values(path: Path, kdim: int) -> np.ndarray:
    raw = np.fromfile(path, dtype=ml_dtypes.float8_e4m3fn)
    return raw.astype(np.float64).reshape(ROWS, kdim)


def qgmma_step_zero(d: np.ndarray, a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``qgmma_step`` with the aligned products cut toward zero instead of toward -inf (the
    other reading of "only the top bits are kept")."""
    p = a * b
    e = np.maximum(_exponent(p).max(axis=-1), _exponent(d))
    grid = np.exp2(np.maximum(e, -1000) - bits)[..., None]
    return _truncate(_truncate(d, bits) + (np.trunc(p / grid) * grid).sum(axis=-1), bits)


STEPS = {"f": qgmma_step, "z": qgmma_step_zero}  # products toward -inf, toward zero


def emulate(a: np.ndarray, b: np.ndarray, chain: int, bits: int, cut: str = "f") -> np.ndarray:
    """D [64, 64] = A B^T as the emulated wgmma computes it with `chain` k = 32 steps an
    accumulator, the chains added in fp32 in order; `cut`: "f" (the aligned products toward
    -inf, qgmma_precision's reading) or "z" (toward zero, what the H200 does)."""
    step_fn = STEPS[cut]
    kdim = a.shape[1]
    total = None
    d = np.zeros((ROWS, ROWS))
    for step in range(kdim // 32):
        if step % chain == 0:
            d = np.zeros((ROWS, ROWS))
        cols = slice(32 * step, 32 * step + 32)
        d = step_fn(d, a[:, None, cols], b[None, :, cols], bits)
        if (step + 1) % chain == 0:
            d32 = d.astype(np.float32)
            total = d32 if total is None else (total + d32).astype(np.float32)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--bits", type=int, nargs="+", default=[13, 14])
    parser.add_argument("--no-emulation", action="store_true", help="skip the emulation columns")
    args = parser.parse_args(argv)
    manifest = args.folder / "manifest.txt"
    if not manifest.exists():
        raise SystemExit(f"no {manifest} (run qgmma_probe first)")
    bits = [] if args.no_emulation else args.bits
    print("FP8 wgmma products against exact float64 ones; emuN: share of outputs the N-bit")
    print("emulation (qgmma_precision.py) reproduces exactly")
    head = f"{'mode':>4} {'tile':>4} {'data':>6} {'chain':>5} {'relRMS':>9} {'bias':>9}"
    emus = [(n, cut) for n in bits for cut in "fz"]
    head += f" {'max/max':>9} {'shrink':>9}"
    print(head + "".join(f" {'emu' + str(n) + cut:>7}" for n, cut in emus))
    summary: dict[tuple[str, int], list[tuple[float, float]]] = {}
    cached: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for line in manifest.read_text().split("\n"):
        if not line.strip():
            continue
        mode, tile, kdim, chain, data = line.split()
        tile, kdim, chain = int(tile), int(kdim), int(chain)
        stem = args.folder / f"{mode}{tile}"
        if (mode, tile) not in cached:
            a = values(Path(f"{stem}_a8.bin"), kdim)
            b = values(Path(f"{stem}_b8.bin"), kdim)
            cached.clear()
            cached[(mode, tile)] = (a, b, a @ b.T)
        a, b, exact = cached[(mode, tile)]
        got32 = np.fromfile(f"{stem}_d{chain}.bin", dtype=np.float32).reshape(ROWS, ROWS)
        if not np.isfinite(got32).all():
            raise SystemExit(f"{mode} tile {tile} chain {chain}: unwritten or non-finite outputs")
        err = got32.astype(np.float64) - exact
        rms = np.sqrt(np.mean(exact**2))
        rel, bias = np.sqrt(np.mean(err**2)) / rms, np.mean(err) / rms
        summary.setdefault((mode, chain), []).append((rel, bias))
        out = f"{mode:>4} {tile:>4} {data:>6} {chain:>5} {rel:>9.2e} {bias:>+9.1e}"
        out += f" {np.abs(err).max() / np.abs(exact).max():>9.2e}"
        # the error's component along the exact result: < 0 where magnitudes shrink
        out += f" {np.sum(err * exact) / np.sum(exact**2):>+9.1e}"
        for n, cut in emus:
            out += f" {np.mean(emulate(a, b, chain, n, cut) == got32):>7.1%}"
        print(out, flush=True)
    print("mean over tiles, by product and chain length (relative RMS error, bias):")
    for (mode, chain), rows in summary.items():
        rel = np.mean([r for r, _ in rows])
        bias = np.mean([b for _, b in rows])
        print(f"  {mode} {chain:>4} steps an accumulator: {rel:.3e}  {bias:+.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
