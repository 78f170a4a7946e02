#!/bin/bash
# session 38 call 1: SNAPMLA_SEESAW_BENCH_HALF_O timing builds (half of O^T a warpgroup, 0-3 early PV m-tiles) against the default, graph replays; timelines at 32x128x16384
mkdir -p $OUT
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096,1x1x128x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 330 bash bench/gpu_session.sh use:dist "$A" use:dist-h1 "$A" use:dist-h3 "$A" use:dist-h4 "$A" use:dist-h2 "$A" use:dist "$A" use:dist-h3 "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null
for b in seesaw_timeline seesaw_timeline_halfo1 seesaw_timeline_halfo3; do
  echo "### $b 32 128 16384" >> $OUT/timeline.log
  timeout 40 .carry/bin/$b 32 128 16384 >> $OUT/timeline.log 2>&1
done
grep -E "^\[|rc " $OUT/bench.log
grep -E "###|cycles a block|period|per block" $OUT/timeline.log | head -30
