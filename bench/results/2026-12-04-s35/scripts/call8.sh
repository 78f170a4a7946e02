#!/bin/bash
# session 35 call 8: SNAPMLA_SEESAW_Q_FIRST_SPLIT=1 (dist-qfs) against the default (dist), A/B/A/B, then its decode tests
C=8x1x16x4096,16x1x16x4096,4x1x16x16384,1x1x16x8192,2x1x16x32768,1x1x32x8192,8x1x32x4096,64x1x16x4096
A="bench-cases:--cases=$C@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x
timeout 100 bash bench/gpu_session.sh use:dist-qfs "$A" || { echo "first stage failed or hung"; exit 1; }
bash bench/gpu_session.sh use:dist "$A" use:dist-qfs "$A" use:dist "$A" use:dist-qfs "$A" tests-decode
mkdir -p $OUT/w; cp /tmp/snapmla-work/decode-cases*.json /tmp/snapmla-work/pytest-decode*.log $OUT/w/ 2>/dev/null
