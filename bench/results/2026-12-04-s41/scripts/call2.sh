#!/bin/bash
# session 41 call 2: SNAPMLA_SEESAW_FUSED_Q2=1 / =2 (the two-term calls' own fused-Q kernel)
# against the default (e6b6414): bit identity, A/B/A/B of the two-term cost, then the tests
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x PYTEST_FILES="tests/gpu/test_quantize.py tests/gpu/test_decode.py"
bash bench/gpu_session.sh use:dist dump-save use:dist-fq1 dump-compare use:dist-fq2 dump-compare \
  use:dist "$A" "$B" use:dist-fq1 "$A" "$B" use:dist-fq2 "$A" "$B" \
  use:dist "$A" "$B" use:dist-fq1 "$A" "$B" use:dist-fq2 "$A" "$B" \
  use:dist pytest-files use:dist-fq1 tests-decode
echo "=== summary"
for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f"; grep -E "^\S+ +[0-9.]+ +- " "$f" | awk '{print $1, $2}' | tr '\n' ' '; echo; grep -E "auto .*cost" "$f"; done
tail -n 3 /tmp/snapmla-work/dump-compare*.log /tmp/snapmla-work/pytest*.log
