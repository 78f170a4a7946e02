#!/bin/bash
# session 40 call 5: bench/power_probe.cu with the contract's least CUDA-core work added ("all"),
# sustained, at the nine missed cases' shares; "both" beside it in the same call
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
nvidia-smi --query-gpu=name,serial,pci.bus_id,power.limit,clocks.max.sm --format=csv
echo "### 32x1x128x16384, 32x2x64x16384 (130, 139 us): 124 tile-blocks, 62 pages"
sample a1 $P both 124 62 3 256
sample a2 $P all 124 62 3 256
sample a3 $P both 124 62 3 256
sample a4 $P all 124 62 3 256
echo "### 64x1x128x32768, 16x1x128x131072 (514, 491): 496, 248"
sample b $P all 496 248 3 256
echo "### 32x2x128x16384 (243): 248, 62"
sample c $P all 248 62 3 256
echo "### 64x1x128xR32768 (285): ~248, ~124"
sample d $P all 248 124 3 256
echo "### 64x1x128x4096 (80): 62, 31"
sample e $P all 62 31 3 256
echo "### 64x1x64x32768 (360): 248, 248"
sample f $P all 248 248 3 256
echo "### 128x4x16x8192 (180): 124, 124"
sample g $P all 124 124 3 256
