"""The GPU's state while a command held it busy, from nvidia-smi samples (bench/sustained.sh).

    python3 bench/smi_summary.py samples.csv [label]

The samples are `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw[.instant],power.limit,
temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 50` lines. Of the
samples over 300 W (the GPU at work), the second half (the sustained state: the board reaches
its power limit within ~0.1 s of dense work) gives the SM clock's median and minimum, the
power's median and maximum, and how often each throttle-reason mask was active (0x4: the
software power cap).
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter

BUSY_W = 300.0


def _number(field: str) -> float | None:
    try:
        return float(field.split()[0])
    except (ValueError, IndexError):
        return None


def summarize(lines: list[str]) -> dict | None:
    """The sustained state of the busy samples among `lines`, or None if none was busy."""
    rows = [line.split(", ") for line in lines if line.strip()]
    busy = [r for r in rows if len(r) >= 6 and (_number(r[2]) or 0.0) > BUSY_W]
    if not busy:
        return None
    late = busy[len(busy) // 2 :]
    clocks = [_number(r[1]) for r in late]
    power = [_number(r[2]) for r in late]
    return {
        "busy": len(busy),
        "samples": len(rows),
        "clock_median": statistics.median(clocks),
        "clock_min": min(clocks),
        "power_median": statistics.median(power),
        "power_max": max(power),
        "reasons": dict(Counter(r[5].strip() for r in late)),
    }


def line(label: str, summary: dict | None, samples: int = 0) -> str:
    if summary is None:
        return f"  {label}: no sample over {BUSY_W:.0f} W of {samples}"
    return (
        f"  {label}: second half of {summary['busy']} busy samples: SM clock median "
        f"{summary['clock_median']:.0f} MHz (min {summary['clock_min']:.0f}), power median "
        f"{summary['power_median']:.0f} W (max {summary['power_max']:.0f}), throttle reasons "
        f"{summary['reasons']}"
    )


def main() -> None:
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    print(line(label, summarize(lines), len(lines)))


if __name__ == "__main__":
    main()
