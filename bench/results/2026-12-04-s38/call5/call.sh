#!/bin/bash
# session 38 call 5: SNAPMLA_SEESAW_PV_FIRST (the other's PV before the own QK) against the default: one short case alone first (a new order of barriers), graph replays A/B/A/B, timelines at 32x128x16384, the decode tests on it
mkdir -p $OUT
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096,1x1x128x8192
export BENCH_CASES=x
timeout 60 bash bench/gpu_session.sh use:dist-pf "bench-cases:--cases=8x1x128x4096@--no-flashinfer" > $OUT/first.log 2>&1
rc=$?; echo "first rc $rc" >> $OUT/first.log; grep -E "^\[|rc " $OUT/first.log
[ $rc -ne 0 ] && exit 1
A="bench-cases:--cases=$C64@--no-flashinfer"
timeout 200 bash bench/gpu_session.sh use:dist "$A" use:dist-pf "$A" use:dist "$A" use:dist-pf "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
grep -E "^\[|rc |install" $OUT/bench.log | grep -v "^\[gpu"
for b in seesaw_timeline seesaw_timeline_pvfirst; do
  echo "### $b 32 128 16384" >> $OUT/timeline.log
  timeout 40 .carry/bin/$b 32 128 16384 >> $OUT/timeline.log 2>&1
  echo "rc $?" >> $OUT/timeline.log
done
grep -E "###|^kernel|rc " $OUT/timeline.log
timeout 200 bash bench/gpu_session.sh use:dist-pf tests-decode > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log
grep -E "passed|failed|error|rc " $OUT/tests.log | tail -5
