#!/bin/bash
# session 41 call 10: 8x1x16x4096's two-term cost by the set of cases it runs with (the same
# board and wheel, 4712b70): alone, in call 8's four-case set, in the seven-case C16 set
S1="bench-cases:--cases=8x1x16x4096@--two-term@--two-term-rounds=3@--no-flashinfer"
S4="bench-cases:--cases=8x1x16x4096,16x1x16x4096,1x1x16x8192,4x1x16x16384@--two-term@--two-term-rounds=3@--no-flashinfer"
S7="bench-cases:--cases=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist "$S1" "$S4" "$S7" "$S1" "$S4" "$S7"
echo "=== summary"
for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f"; grep -E "auto .*cost" "$f" | awk '{print $1, $3, $6, $8}'; done
