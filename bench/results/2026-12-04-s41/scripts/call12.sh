#!/bin/bash
# session 41 call 12: the workspace with the low rows next to the high ones (dist-qlo) against
# 4712b70's layout (dist, low rows after the partials): C16 (8x1x16x4096 after 1x1x16x8192) and
# 8x1x16x4096 alone, A/B/A/B; quantize and two-term decode tests on dist-qlo
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
S1="bench-cases:--cases=8x1x16x4096@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x PYTEST_FILES="tests/gpu/test_decode.py -k two_term"
bash bench/gpu_session.sh use:dist "$A" use:dist-qlo "$A" use:dist "$A" use:dist-qlo "$A" "$S1" \
  pytest-files
echo "=== summary"
for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f"; grep -E "auto .*cost" "$f" | cut -c1-110; done
tail -n 2 /tmp/snapmla-work/pytest-files*.log
