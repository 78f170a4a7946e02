#!/bin/bash
# session 34 call 4: SNAPMLA_SEESAW_SHARE_SM: quantize tests, bit identity, A/B/A/B, decode tests
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x QQUANT_ROWS=16,128,1024,4096 PYTEST_FILES=tests/gpu/test_quantize.py
bash bench/gpu_session.sh use:dist dump-save use:dist-share pytest-files dump-compare qquant \
  use:dist "$A" "$B" use:dist-share "$A" "$B" use:dist "$A" "$B" use:dist-share "$A" "$B" tests-decode
