#!/bin/bash
# session 42 call 2: 8x1x16x4096's two-term cost, interleaved (ms replays in turn) next to the
# long timings, across runs in one process; then which rebuilt part moves it (--recreate)
bash bench/gpu_session.sh > /tmp/gs.log 2>&1; echo "gpu_session rc $?"
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 100 > $OUT/smi.csv &
SMI=$!
timeout 200 python3 bench/placement_probe.py --case 8x1x16x4096 --repeat 3 \
  --states "fresh,case:1x1x16x8192,fresh" 2>&1 | tee $OUT/probe-states.txt
timeout 200 python3 bench/placement_probe.py --case 8x1x16x4096 --repeat 4 \
  --recreate "none,plans,io,tables,cache,none" 2>&1 | tee $OUT/probe-recreate.txt
kill $SMI
python3 - <<'PY'
import csv, statistics, os
rows = list(csv.reader(open(os.environ["OUT"] + "/smi.csv")))[1:]
sm = [int(r[1].split()[0]) for r in rows if len(r) > 3]
mem = [int(r[2].split()[0]) for r in rows if len(r) > 3]
pw = [float(r[3].split()[0]) for r in rows if len(r) > 3]
print("smi samples", len(sm), "sm MHz min/med/max", min(sm), statistics.median(sm), max(sm),
      "mem", min(mem), max(mem), "power W max", max(pw))
PY
