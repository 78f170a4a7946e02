#!/bin/bash
# session 34 call 1: SNAPMLA_SEESAW_FUSED_Q2 bit-identity, A/B/A/B, decode tests
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist dump-save use:dist-fq2 dump-compare "$A" "$B" use:dist "$A" "$B" \
  use:dist-fq2 "$A" "$B" use:dist "$A" "$B" use:dist-fq2 tests-decode
