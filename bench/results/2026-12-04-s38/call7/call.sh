#!/bin/bash
# session 38 call 7: SNAPMLA_SEESAW_SCALE_REGS=1 (dist-sr1) against the default (dist): outputs bit for bit (dump), graph replays A/B/A/B over the 23 cases, the decode tests on it
mkdir -p $OUT
ALL=1x1x128x8192,32x1x128x16384,64x1x128x32768,16x1x128x131072,32x2x128x16384,64x1x64x32768,128x1x16x16384,64x1x16x65536,32x1x32x32768,1x1x128x1024,1x1x128x4096,8x1x128x1024,8x1x128x4096,64x1x128x1024,64x1x128x4096,1x1x16x8192,8x1x16x4096,64x1x16x4096,64x1x128xR32768,128x1x16xR32768,32x2x64x16384,64x2x16x16384,128x4x16x8192
export BENCH_CASES=x
timeout 200 bash bench/gpu_session.sh use:dist dump-save use:dist-sr1 dump-compare > $OUT/dump.log 2>&1
echo "dump rc $?" >> $OUT/dump.log
grep -E "identical|differ|mismatch|rc |Error|error" $OUT/dump.log | tail -6
A="bench-cases:--cases=$ALL@--no-flashinfer"
timeout 280 bash bench/gpu_session.sh use:dist "$A" use:dist-sr1 "$A" use:dist "$A" use:dist-sr1 "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
grep -E "^\[|rc |install" $OUT/bench.log | grep -v "^\[gpu" | sed 's/, FlashInfer - us//'
timeout 150 bash bench/gpu_session.sh use:dist-sr1 tests-decode > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log
grep -E "passed|failed|error|rc " $OUT/tests.log | tail -4
