#!/bin/bash
# session 36 call 3: SNAPMLA_SEESAW_PV_HALF_DEPTH (half-N PV groups, 3 or 2 in flight) against the default, A/B/A/B at N = 64; decode tests and workload layers on depth 3
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,8x1x128x4096,128x4x16x8192,32x2x128x16384,64x1x128xR32768
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 100 bash bench/gpu_session.sh use:dist-hd3 "$A" || { echo "first stage failed or hung"; mkdir -p $OUT/first; cp -r /tmp/snapmla-work/. $OUT/first/; exit 1; }
mkdir -p $OUT/first; cp /tmp/snapmla-work/*.json $OUT/first/
bash bench/gpu_session.sh use:dist "$A" use:dist-hd3 "$A" use:dist-hd2 "$A" use:dist "$A" use:dist-hd3 "$A" tests-decode accuracy-layers
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null; ls $OUT/work
