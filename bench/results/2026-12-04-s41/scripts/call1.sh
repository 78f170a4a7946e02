#!/bin/bash
# session 41 call 1: the two-term Q-quant's shared quotients (bf904be) against 785fd53:
# quantize and two-term decode tests, bit identity, the Q-quant alone, A/B/A/B of the two-term cost
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x QQUANT_ROWS=16,32,128,1024 PYTEST_FILES="tests/gpu/test_quantize.py tests/gpu/test_decode.py -k two_term or quantize"
bash bench/gpu_session.sh use:dist-base dump-save qquant use:dist pytest-files dump-compare qquant \
  use:dist-base "$A" "$B" use:dist "$A" "$B" use:dist-base "$A" use:dist "$A" "$B"
echo "=== summary"
for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f"; grep -E "auto .*cost" "$f"; done
cat /tmp/snapmla-work/time-qquant*.txt
