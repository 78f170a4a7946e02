"""Roofline plot of a bench_decode.py JSON: TFLOPS against FLOP per KV byte, ours and the BF16
libraries' (FlashInfer's, and FlashMLA's where the run had it).

x = arithmetic intensity (the case's FLOPs, ``2 * b * s_q * h * S * (576 + 512)``, per KV byte
read: 644 per token for snapmla's FP8 cache, 1152 for the BF16 cache); y = achieved
TFLOPS. Ceilings from bench/ANCHORS.md: HBM 4.2 TB/s, FP8 1351 TFLOPS, BF16 765 TFLOPS.

    python3 bench/roofline.py results.json [--out roofline.png]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HBM_TBPS = 4.2
FP8_TFLOPS = 1351.0
BF16_TFLOPS = 765.0


def points(doc: dict[str, Any], who: str, bytes_key: str) -> list[tuple[str, float, float]]:
    """(case, FLOP per KV byte, TFLOPS) of one kernel's measured cases."""
    out = []
    for case in doc.get("cases", []):
        timing = case.get(who) or {}
        us = timing.get("median_us")
        flops = case.get("flops")
        kv = (case.get("kv_bytes") or {}).get(bytes_key)
        if us and flops and kv:
            out.append((case["name"], flops / kv, flops / (us * 1e-6) / 1e12))
    return out


def draw(doc: dict[str, Any], path: str, annotate: bool = True) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    consts = doc.get("constants") or {}
    hbm = float(consts.get("hbm_tbps", HBM_TBPS))
    fp8 = float(consts.get("fp8_tflops", FP8_TFLOPS))
    bf16 = float(consts.get("bf16_tflops", BF16_TFLOPS))
    kernel = (doc.get("settings") or {}).get("kernel", "?")
    # (points, label, marker style, label offset), ours first
    series = [
        (
            points(doc, "snapmla", "snapmla"),
            f"snapmla FP8 ({kernel})",
            {"marker": "o", "color": "tab:red"},
            (4, 3),
        ),
        (
            points(doc, "flashinfer", "flashinfer"),
            "FlashInfer FA3 BF16",
            {"marker": "s", "facecolors": "none", "edgecolors": "tab:blue"},
            (4, -8),
        ),
        (
            points(doc, "flashmla", "flashinfer"),
            "FlashMLA BF16",
            {"marker": "^", "facecolors": "none", "edgecolors": "tab:green"},
            (4, -8),
        ),
    ]
    measured = [p for pts, *_ in series for p in pts]
    xs = [p[1] for p in measured] or [100.0, 1000.0]
    x_lo = min(min(xs) / 2, bf16 / hbm / 4)
    x_hi = max(max(xs) * 2, fp8 / hbm * 4)

    fig, ax = plt.subplots(figsize=(10, 6.5), dpi=120)
    grid = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]
    for name, roof, color, style in (
        ("FP8", fp8, "tab:red", "-"),
        ("BF16", bf16, "tab:blue", "--"),
    ):
        ax.plot(
            grid,
            [min(hbm * x, roof) for x in grid],
            color=color,
            lw=1.5,
            ls=style,
            label=f"{name} roof: {hbm:g} TB/s, {roof:g} TFLOPS",
        )
    for pts, label, style, offset in series:
        if not pts:
            continue
        ax.scatter([p[1] for p in pts], [p[2] for p in pts], zorder=3, label=label, **style)
        if annotate:
            color = style.get("color") or style["edgecolors"]
            for name, x, y in pts:
                ax.annotate(
                    name,
                    (x, y),
                    textcoords="offset points",
                    xytext=offset,
                    fontsize=6,
                    color=color,
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ys = [p[2] for p in measured] or [10.0]
    ax.set_ylim(max(min(ys) / 3, 1e-3), fp8 * 2)
    ax.set_xlabel("arithmetic intensity (FLOP per KV byte read)")
    ax.set_ylabel("TFLOPS")
    device = (doc.get("device") or {}).get("name", "?")
    commit = str(doc.get("commit", "?"))[:12]
    ax.set_title(
        f"MLA decode roofline - {device}, commit {commit}, {doc.get('date', '')}", fontsize=10
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="a bench_decode.py results JSON")
    p.add_argument("--out", help="PNG path (default: the JSON's path with .png)")
    p.add_argument("--no-labels", action="store_true", help="do not label points with cases")
    args = p.parse_args(argv)
    with open(args.json) as f:
        doc = json.load(f)
    out = args.out or os.path.splitext(args.json)[0] + ".png"
    draw(doc, out, annotate=not args.no_labels)
    n_ours = len(points(doc, "snapmla", "snapmla"))
    n_fi = len(points(doc, "flashinfer", "flashinfer"))
    n_fm = len(points(doc, "flashmla", "flashinfer"))
    print(f"roofline: {out} ({n_ours} snapmla, {n_fi} FlashInfer, {n_fm} FlashMLA points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
