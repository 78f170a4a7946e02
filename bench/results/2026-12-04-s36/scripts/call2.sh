#!/bin/bash
# session 36 call 2: where the N = 64 PV's time goes (timing-only builds SNAPMLA_SEESAW_BENCH_PV=1 SS operands, 2 no promotion, 3 both: wrong outputs), and the role-split kernels (roles, pairs of pages) against today's default
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,8x1x128x4096,128x4x16x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist "$A" use:dist-bpv1 "$A" use:dist-bpv2 "$A" use:dist-bpv3 "$A" use:dist-roles "$A" use:dist-pair2 "$A" use:dist "$A" use:dist-bpv1 "$A"
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null; ls $OUT/work
