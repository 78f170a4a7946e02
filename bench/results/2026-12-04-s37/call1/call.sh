#!/bin/bash
# session 37 call 1: the phase-locked pairs (SNAPMLA_SEESAW_PHASE=1; QK_LATE=2 warpgroup 1 issues its next QK after its exponentials, =0 both before the softmax): the decode tests and the workload layers on PHASE=1, then graph replays A/B/C/A/B/C against the default
mkdir -p $OUT
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096,1x1x128x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 280 bash bench/gpu_session.sh use:dist-ph1 tests-decode accuracy-layers
echo "first stage rc $?"
mkdir -p $OUT/first; cp /tmp/snapmla-work/*.log $OUT/first/ 2>/dev/null
timeout 280 bash bench/gpu_session.sh use:dist "$A" use:dist-ph1 "$A" use:dist-ph1e "$A" use:dist "$A" use:dist-ph1 "$A" use:dist-ph1e "$A"
echo "bench rc $?"
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null; ls $OUT/work
