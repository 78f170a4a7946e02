#!/bin/bash
# session 37 call 2: the phase-locked pairs with the next QK at the sweep's start (SNAPMLA_SEESAW_PHASE=1, 40c5e61): decode tests and workload layers, graph replays A/B/A/B against the default, the timeline of both at 32x128x16384
mkdir -p $OUT
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096,1x1x128x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 300 bash bench/gpu_session.sh use:dist-ph tests-decode accuracy-layers > $OUT/first.log 2>&1
echo "first stage rc $?" >> $OUT/first.log
mkdir -p $OUT/first; cp /tmp/snapmla-work/*.log $OUT/first/ 2>/dev/null
timeout 150 bash bench/gpu_session.sh use:dist "$A" use:dist-ph "$A" use:dist "$A" use:dist-ph "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null
for b in seesaw_timeline seesaw_timeline_phase; do
  echo "### $b 32 128 16384" >> $OUT/timeline.log
  timeout 60 .carry/bin/$b 32 128 16384 >> $OUT/timeline.log 2>&1
done
grep -E "passed|failed|error|rc " $OUT/first.log | tail -8
grep -E "^\[|rc " $OUT/bench.log
head -c 5000 $OUT/timeline.log
