#!/bin/bash
# session 36 call 5: SNAPMLA_SEESAW_PROMOTE_FORM 1 (O^T *= gamma spread over the groups, before each wait; += T after) and 2 (the default's order, not fused) against the default
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist "$A" use:dist-pf1 "$A" use:dist-pf2 "$A" use:dist "$A" use:dist-pf1 "$A" use:dist-pf2 "$A"
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null; ls $OUT/work
