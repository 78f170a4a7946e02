#!/bin/bash
# session 41 call 11: the two-term cost with both calls on the same workspace
# (cost_same_workspace, bench_decode.py at 34e0a3b) next to the separate plans'
# alternating cost: C16 (where 8x1x16x4096 follows 1x1x16x8192), 8x1x16x4096 alone, C32
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
S1="bench-cases:--cases=8x1x16x4096@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist "$A" "$S1" "$B" "$A"
echo "=== summary"
for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f"; grep -E "auto .*cost" "$f" | cut -c1-110; done
