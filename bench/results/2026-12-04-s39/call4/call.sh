#!/bin/bash
# session 39 call 4: timelines of the N = 64 skeleton builds (no softmax arithmetic: ns; and no promotion: ns2; no promotion alone: pv2) against the default, 32x128x16384 and 64x64x32768
mkdir -p $OUT
for shape in "32 128 16384" "64 64 32768"; do
  for b in seesaw_timeline seesaw_timeline_ns seesaw_timeline_ns2 seesaw_timeline_pv2; do
    echo "### $b $shape" >> $OUT/timeline.log
    timeout 40 .carry/bin/$b $shape >> $OUT/timeline.log 2>&1
  done
done
python3 bench/timeline_stats.py $OUT/timeline.log
grep -E "^###|^kernel " $OUT/timeline.log
