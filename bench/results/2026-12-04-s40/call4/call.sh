#!/bin/bash
# session 40 call 4: bench/power_probe.cu at every 128-head compute-bound case's share (and the
# 32x2x64 one), sustained; the key case again, and with zero data (the least switching)
mkdir -p $OUT
f=timestamp,clocks.sm,power.draw.instant,power.limit,temperature.gpu,clocks_throttle_reasons.active
nvidia-smi --query-gpu=$f --format=csv,noheader > /dev/null 2>&1 || f=timestamp,clocks.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active
summary() {  # $1 csv, $2 label
  python3 - "$1" "$2" <<'PY'
import sys, statistics
rows = [l.split(", ") for l in open(sys.argv[1]) if l.strip()]
def num(x):
    try: return float(x.split()[0])
    except ValueError: return None
busy = [r for r in rows if num(r[2]) is not None and num(r[2]) > 300]
if not busy:
    print(f"  {sys.argv[2]}: no sample over 300 W of {len(rows)}"); sys.exit()
late = busy[len(busy) // 2:]
clk = [num(r[1]) for r in late]; pw = [num(r[2]) for r in late]
reasons = {}
for r in late: reasons[r[5].strip()] = reasons.get(r[5].strip(), 0) + 1
print(f"  {sys.argv[2]}: second half of {len(busy)} busy samples: SM clock median {statistics.median(clk):.0f} MHz "
      f"(min {min(clk):.0f}), power median {statistics.median(pw):.0f} W (max {max(pw):.0f}), throttle reasons {reasons}")
PY
}
sample() {  # $1 label, rest: command
  local label=$1; shift
  nvidia-smi --query-gpu=$f --format=csv,noheader -lms 50 > $OUT/smi-$label.csv &
  local smi=$!
  timeout 40 "$@" 2>&1
  kill $smi; wait $smi 2>/dev/null
  summary $OUT/smi-$label.csv $label
  rm -f $OUT/smi-$label.csv
  sleep 2
}
P=.carry/bin/power_probe
echo "### 32x1x128x16384 and 32x2x64x16384 (targets 130, 139 us): 124 tile-blocks, 62 pages"
sample a $P both 124 62 3 256
SNAPMLA_PROBE_ZERO=1 sample az $P both 124 62 3 256
SNAPMLA_PROBE_ZERO=1 sample tz $P tensor 124 62 3 256
echo "### 64x1x128x32768 and 16x1x128x131072 (514, 491 us): 496 and 248"
sample b $P both 496 248 3 256
echo "### 32x2x128x16384 (243 us): 248 and 62"
sample c $P both 248 62 3 256
echo "### 64x1x128xR32768 (285 us; mean length ~16k): ~248 and ~124"
sample d $P both 248 124 3 256
echo "### 64x1x128x4096 (80 us): 62 and 31"
sample e $P both 62 31 3 256
echo "### 32x1x128x16384 again"
sample a2 $P both 124 62 3 256
