#!/bin/bash
# session 41 call 13: 8x1x16x4096 after 1x1x16x8192 and before it, and the same with the
# library's launch graphs off (SNAPMLA_DECODE_GRAPHS=0 at run time), wheel 4712b70
P="@--two-term@--two-term-rounds=3@--no-flashinfer"
AB="bench-cases:--cases=1x1x16x8192,8x1x16x4096$P"
BA="bench-cases:--cases=8x1x16x4096,1x1x16x8192$P"
export BENCH_CASES=x
summary() { for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f"; grep -E "auto .*cost" "$f" | cut -c1-110; done; }
bash bench/gpu_session.sh use:dist "$AB" "$BA" "$AB" > /dev/null 2>&1
echo "=== graphs on (default)"; summary
cp $OUT/logs.tgz $OUT/graphs-on-logs.tgz
SNAPMLA_DECODE_GRAPHS=0 bash bench/gpu_session.sh use:dist "$AB" "$BA" > /dev/null 2>&1
echo "=== SNAPMLA_DECODE_GRAPHS=0"; summary
