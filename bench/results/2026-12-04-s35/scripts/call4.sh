#!/bin/bash
# session 35 call 4: the whole suite and the sanitizers on 7fae56b (Q_FIRST on), N = 64 timelines
bash bench/gpu_session.sh use:dist tests sanitize
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.xml $OUT/work/ 2>/dev/null
for c in "8 128 4096" "64 128 1024"; do
  f=$OUT/timeline-${c// /x}.log; timeout 60 .carry/bin/seesaw_timeline $c > $f 2>&1; head -12 $f
done
