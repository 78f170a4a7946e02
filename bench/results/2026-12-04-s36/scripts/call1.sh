#!/bin/bash
# session 36 call 1: SNAPMLA_SEESAW_LAZY_RESCALE (sigma loads: 1 after the wait, 3 in halves): a hang check, A/B/A/B at N = 64, decode tests and workload layers on lazy1
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,32x2x128x16384,64x1x128xR32768,16x1x128x131072
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 100 bash bench/gpu_session.sh use:dist-lazy1 "$A" || { echo "first stage failed or hung"; cp -r /tmp/snapmla-work/. $OUT/first/; exit 1; }
mkdir -p $OUT/first; cp -r /tmp/snapmla-work/. $OUT/first/
bash bench/gpu_session.sh use:dist "$A" use:dist-lazy1 "$A" use:dist-lazy3 "$A" use:dist "$A" use:dist-lazy1 "$A" tests-decode accuracy-layers
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null; ls $OUT/work
