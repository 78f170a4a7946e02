#!/bin/bash
# session 36 call 6: the bound of a two-page P block (timing only, wrong outputs): SNAPMLA_SEESAW_BENCH_PV=17 (SS operands, blocks i - 1 and i in one sweep, one promotion per m-tile) against =1 (SS operands, a promotion per block) and the default
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 100 bash bench/gpu_session.sh use:dist-bpv17 "$A" || { echo "first stage failed or hung"; mkdir -p $OUT/first; cp -r /tmp/snapmla-work/. $OUT/first/; exit 1; }
mkdir -p $OUT/first; cp /tmp/snapmla-work/*.json $OUT/first/
bash bench/gpu_session.sh use:dist "$A" use:dist-bpv1 "$A" use:dist-bpv17 "$A" use:dist "$A" use:dist-bpv1 "$A" use:dist-bpv17 "$A"
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null; ls $OUT/work
