#!/bin/bash
# session 35 call 6: SNAPMLA_QQUANT_SPARE_SMS=4 (dist-sp4) against the default (dist), A/B/A/B, then its tests
C1=1x1x16x8192,8x1x16x4096,4x1x16x16384,2x1x16x32768,1x1x32x8192
C2=1x1x128x8192,1x1x128x1024,1x1x128x4096
A="bench-cases:--cases=$C1@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C2@--no-flashinfer"
export BENCH_CASES=x PYTEST_FILES="tests/gpu/test_quantize.py tests/gpu/test_decode.py"
timeout 100 bash bench/gpu_session.sh use:dist-sp4 "$A" || { echo "first stage failed or hung"; exit 1; }
bash bench/gpu_session.sh use:dist "$A" "$B" use:dist-sp4 "$A" "$B" use:dist "$A" "$B" use:dist-sp4 "$A" "$B" pytest-files
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null
