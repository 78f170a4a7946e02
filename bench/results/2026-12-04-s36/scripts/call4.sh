#!/bin/bash
# session 36 call 4: the scaled promotion's two halves (timing-only builds, wrong outputs): SNAPMLA_SEESAW_BENCH_PV=4 (no O^T *= gamma), 8 (no O^T += T), 2 (neither), against the default
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist "$A" use:dist-bpv4 "$A" use:dist-bpv8 "$A" use:dist-bpv2 "$A" use:dist "$A" use:dist-bpv4 "$A" use:dist-bpv8 "$A"
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null; ls $OUT/work
