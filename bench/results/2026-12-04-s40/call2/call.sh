#!/bin/bash
# session 40 call 2: the SM clock, power and throttle reasons while the N = 64 kernel runs
# (seesaw_trace with SNAPMLA_TRACE_REPS launches a figure, seconds of load; nvidia-smi sampled
# every 50 ms), from HBM and with the pages in L2
mkdir -p $OUT
f=timestamp,clocks.sm,power.draw.instant,power.limit,temperature.gpu,clocks_throttle_reasons.active
nvidia-smi --query-gpu=$f --format=csv,noheader || f=timestamp,clocks.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active
sample() {  # $1 label, rest: command
  local label=$1; shift
  nvidia-smi --query-gpu=$f --format=csv,noheader -lms 50 > $OUT/smi-$label.csv &
  local smi=$!
  "$@" | grep -E "^kernel"
  kill $smi; wait $smi 2>/dev/null
  python3 - "$OUT/smi-$label.csv" "$label" <<'PY'
import sys, statistics
rows = [l.split(", ") for l in open(sys.argv[1]) if l.strip()]
busy = [r for r in rows if r[2].split()[0].replace(".", "").isdigit() and float(r[2].split()[0]) > 300]
clk = [int(r[1].split()[0]) for r in busy]; pw = [float(r[2].split()[0]) for r in busy]
reasons = {}
for r in busy: reasons[r[5].strip()] = reasons.get(r[5].strip(), 0) + 1
if busy:
    print(f"{sys.argv[2]}: {len(busy)} of {len(rows)} samples over 300 W; SM clock median {statistics.median(clk)} MHz (min {min(clk)}, max {max(clk)}); power median {statistics.median(pw):.0f} W (max {max(pw):.0f}, limit {busy[0][3]}); throttle reasons {reasons}")
else:
    print(f"{sys.argv[2]}: no busy samples of {len(rows)}; power max {max(float(r[2].split()[0]) for r in rows if r[2].split()[0].replace('.', '').isdigit())}")
PY
}
export SNAPMLA_TRACE_REPS=4000
sample n64-128h-hbm .carry/bin/seesaw_trace 32 128 16384
sample n64-64h-pool env SNAPMLA_TRACE_POOL_TABLE=1 .carry/bin/seesaw_trace 66 64 32768
sample n64-64h-hbm .carry/bin/seesaw_trace 66 64 32768
sample n16-hbm .carry/bin/seesaw_trace 128 16 16384
