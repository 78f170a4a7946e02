#!/bin/bash
# session 38 call 3: SNAPMLA_SEESAW_BENCH_HALF_O with deeper PV groups (d3: three whole-N groups in flight; d1: every m-tile, kPvDeep) against the default, graph replays
mkdir -p $OUT
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096,1x1x128x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 300 bash bench/gpu_session.sh use:dist "$A" use:dist-h1d3 "$A" use:dist-h3d3 "$A" use:dist-h1d1 "$A" use:dist "$A" use:dist-h1d3 "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
grep -E "^\[|rc |use:|install" $OUT/bench.log | grep -v "^\[gpu" | head -60
