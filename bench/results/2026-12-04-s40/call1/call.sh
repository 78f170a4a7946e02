#!/bin/bash
# session 40 call 1: the chains per tile-block with the pages in L2 (SNAPMLA_TRACE_POOL_TABLE=1)
# at N = 16, 32, 64 (and 64 at 128 heads, MTP at 16 heads), against the same shapes from HBM
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
run() { echo "### $*"; timeout 60 "$@" 2>&1 | grep -E "^batch|^pool|^kernel|^decode call"; }
for shape in "66 128 32768" "66 64 32768" "66 32 32768" "66 16 32768" "66 16 32768 4" "66 16 32768 2"; do
  SNAPMLA_TRACE_POOL_TABLE=1 run .carry/bin/seesaw_trace $shape
done
for shape in "66 64 32768" "66 32 32768" "66 16 32768 2"; do
  run .carry/bin/seesaw_trace $shape
done
for shape in "66 64 32768" "66 32 32768"; do
  echo "### pool timeline $shape" >> $OUT/timeline.log
  SNAPMLA_TRACE_POOL_TABLE=1 timeout 60 .carry/bin/seesaw_timeline $shape >> $OUT/timeline.log 2>&1
done
python3 bench/timeline_stats.py $OUT/timeline.log
