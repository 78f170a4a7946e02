#!/bin/bash
# session 35 call 2: SNAPMLA_SEESAW_Q_FIRST=1 (a hang check first), A/B/A/B at 16 heads, C32 once each, decode tests
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x
timeout 100 bash bench/gpu_session.sh use:dist-qf "$A" || { echo "first stage failed or hung"; exit 1; }
mkdir -p $OUT/first; cp -r /tmp/snapmla-work/. $OUT/first/
bash bench/gpu_session.sh use:dist "$A" "$B" use:dist-qf "$A" "$B" use:dist "$A" use:dist-qf tests-decode
cp -r /tmp/snapmla-work/. $OUT/work/
