#!/bin/bash
# session 35 call 9: SNAPMLA_SEESAW_PV_STREAM=1 (dist-pvs): a hang check, its decode tests, then A/B/A/B against dist at N = 64
C=32x1x128x16384,64x1x128x4096,8x1x128x4096,32x2x64x16384
A="bench-cases:--cases=$C@--no-flashinfer"
export BENCH_CASES=x
timeout 60 bash bench/gpu_session.sh use:dist-pvs "$A" || { echo "first stage failed or hung"; exit 1; }
bash bench/gpu_session.sh use:dist-pvs tests-decode use:dist "$A" use:dist-pvs "$A" use:dist "$A" use:dist-pvs "$A"
mkdir -p $OUT/w; cp /tmp/snapmla-work/decode-cases*.json /tmp/snapmla-work/pytest-decode*.log /tmp/snapmla-work/session.log $OUT/w/ 2>/dev/null
