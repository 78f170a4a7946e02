#!/bin/bash
# session 36 call 7: ncu source counters on the timing-only builds SNAPMLA_SEESAW_BENCH_PV=4 (the promotion's adds after each wait, no O^T *= gamma) and 8 (O^T *= gamma under the first group, no adds), 32x1x128x16384
NCU_CASES="32x1x128x16384" bash bench/gpu_session.sh use:dist-bpv4 ncu
mkdir -p $OUT/bpv4; cp /tmp/snapmla-work/ncu-* $OUT/bpv4/ 2>/dev/null
NCU_CASES="32x1x128x16384" bash bench/gpu_session.sh use:dist-bpv8 ncu
mkdir -p $OUT/bpv8; cp /tmp/snapmla-work/ncu-* $OUT/bpv8/ 2>/dev/null; ls -la $OUT/bpv4 $OUT/bpv8
