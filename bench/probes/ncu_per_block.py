"""Instructions per warp and SM cycles per 64-token tile-block of the seesaw kernel, from
Nsight Compute.

The steady-state instruction count per warp and block, per shape class, is what a change to
the kernel's main loop moves. `bench/gpu_session.sh ncu` profiles one launch per case with the
metric ``smsp__inst_executed.sum`` (warp instructions executed, the whole grid); this divides it
by the case's tile-blocks (requests x row tiles x 64-token blocks) and by the 8 consumer warps
that share each tile-block's work. The producer warpgroup's instructions (N = 32 and 64), the
idle CTAs' and the epilogue's are in the total, so the figure is an upper bound on the loop's
own count, close to it at long contexts.

The cycles are the kernel's elapsed SM cycles times the SMs, over the tile-blocks: what a
tile-block costs an SM on average, next to its tensor work (1,152 cycles: the content QK and
the PV at 8,192 FP8 FLOP a cycle, the RoPE QK at 4,096 in BF16), the least any kernel needs
at 64 query rows a tile (fewer rows do less).

    python3 bench/probes/ncu_per_block.py 32x1x128x16384=ncu-32x1x128x16384.txt [CASE=FILE ...]
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/

from bench_decode import CONTENT_DIM, ROPE_DIM, Case

CONSUMER_WARPS = 8  # two consumer warpgroups per CTA
TILE_ROWS = 64
BLOCK_TOKENS = 64
METRIC = "smsp__inst_executed.sum"
# A 64-row x 64-token tile-block's tensor work in SM cycles: content QK and PV at 8,192 FP8
# FLOP a cycle, the RoPE QK at 4,096 BF16 FLOP a cycle.
TENSOR_CYCLES = (
    2 * TILE_ROWS * BLOCK_TOKENS * 2 * CONTENT_DIM / 8192
    + 2 * TILE_ROWS * BLOCK_TOKENS * ROPE_DIM / 4096
)


def pv_width(case: Case) -> int:
    """The PV width N of the kernel instantiation the library launches for the case."""
    rows = case.q_len * case.heads
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def tile_blocks(case: Case, seed: int = 0) -> int:
    """64-row x 64-token tile-blocks of one decode of the case."""
    row_tiles = math.ceil(case.q_len * case.heads / TILE_ROWS)
    return sum(row_tiles * math.ceil(s / BLOCK_TOKENS) for s in case.seqlens(seed))


def report_value(text: str, name: str) -> float:
    """The first value of a metric or section row (`name`, units, value) in an ncu text report."""
    for line in text.splitlines():
        if line.strip().startswith(name):
            m = re.search(r"([0-9][0-9,]*(?:\.[0-9]+)?)\s*$", line.strip())
            if m:
                return float(m.group(1).replace(",", ""))
    raise ValueError(f"no {name} value in the report")


def executed_instructions(text: str) -> float:
    """The value of smsp__inst_executed.sum in an ncu text report (the first kernel's)."""
    return report_value(text, METRIC)


def per_block(case: Case, text: str) -> dict[str, float]:
    inst = executed_instructions(text)
    blocks = tile_blocks(case)
    sm_cycles = report_value(text, "Elapsed Cycles") * report_value(text, "# SMs")
    return {
        "n": pv_width(case),
        "inst_executed": inst,
        "tile_blocks": blocks,
        "per_warp_per_tile_block": inst / (blocks * CONSUMER_WARPS),
        "sm_cycles_per_tile_block": sm_cycles / blocks,
        "over_tensor_work": sm_cycles / blocks / TENSOR_CYCLES,
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print(
        f"{'case':<17} {'N':>3} {'inst executed':>15} {'tile-blocks':>12} {'per warp/block':>15}"
        f" {'SM cycles/block':>16} {f'/ {TENSOR_CYCLES:,.0f} tensor':>15}"
    )
    status = 0
    for arg in argv:
        name, _, path = arg.partition("=")
        case = Case.parse(name)
        try:
            r = per_block(case, Path(path).read_text())
        except (OSError, ValueError) as exc:
            print(f"{case.name:<17} {exc}")
            status = 1
            continue
        print(
            f"{case.name:<17} {r['n']:>3} {r['inst_executed']:>15,.0f} {r['tile_blocks']:>12,} "
            f"{r['per_warp_per_tile_block']:>15.0f} {r['sm_cycles_per_tile_block']:>16,.0f}"
            f" {r['over_tensor_work']:>14.2f}x"
        )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
