#!/bin/bash
# session 41 call 8: the two-term cost by the bench with eager launches (--no-graph, KV still
# rotated) against its graph replays, alternating, at three 16-head cases (wheel 4712b70)
C=8x1x16x4096,16x1x16x4096,1x1x16x8192,4x1x16x16384
G="bench-cases:--cases=$C@--two-term@--two-term-rounds=3@--no-flashinfer"
E="$G@--no-graph"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist "$G" "$E" "$G" "$E"
echo "=== summary"
for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f $(grep -c 'no-graph' /tmp/snapmla-work/session.log)"; grep -E "^\S+ +[0-9.]+\*? +- " "$f" | awk '{print $1, $2}' | tr '\n' ' '; echo; grep -E "auto .*cost" "$f"; done
grep "decode benchmark" /tmp/snapmla-work/session.log
