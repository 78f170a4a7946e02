#!/bin/bash
# session 40 call 3: bench/power_probe.cu, a decode's unavoidable work alone (FP8 tensor work as
# SS m64n256k32 wgmmas, the KV bytes once from HBM) under sustained load, with nvidia-smi
# sampled every 50 ms; then the decode kernel at the same shapes, sustained (seesaw_trace)
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
late = busy[len(busy) // 2:]  # the second half: the sustained state
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
  timeout 40 "$@" 2>&1 | grep -v -E "^(combine alone|decode call|batch)"
  kill $smi; wait $smi 2>/dev/null
  summary $OUT/smi-$label.csv $label
  sleep 2  # let the board cool a little between runs
}
P=.carry/bin/power_probe
echo "### 32x1x128x16384's share: 124 tile-blocks and 62 pages an SM (target 130 us)"
sample t256 $P tensor 124 62 3 256
sample t64 $P tensor 124 62 3 64
sample h62 $P hbm 124 62 3
sample b256 $P both 124 62 3 256
sample b64 $P both 124 62 3 64
echo "### 64x1x64x32768's share: 248 and 248 (target 360 us)"
sample b256-64h $P both 248 248 3 256
sample h248 $P hbm 248 248 3
echo "### 128x4x16x8192's share: 124 and 124 (target 180 us)"
sample b256-mtp $P both 124 124 3 256
echo "### the decode kernel alone, sustained (SNAPMLA_TRACE_REPS=4000)"
export SNAPMLA_TRACE_REPS=4000
sample k128 .carry/bin/seesaw_trace 32 128 16384
sample kmtp .carry/bin/seesaw_trace 128 16 8192 4
