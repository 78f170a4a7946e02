#!/bin/bash
# session 38 call 4: SNAPMLA_SEESAW_BENCH_VT_REWRITE timing builds (1: the producer's in-place rewrite of each stage after the owner's QK, every PV waiting for it; 2: the barriers alone) against the default, graph replays; first one short case alone (a new synchronization)
mkdir -p $OUT
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096,1x1x128x8192
export BENCH_CASES=x
timeout 60 bash bench/gpu_session.sh use:dist-vt1 "bench-cases:--cases=8x1x128x4096@--no-flashinfer" > $OUT/first.log 2>&1
rc=$?; echo "first rc $rc" >> $OUT/first.log; grep -E "^\[|rc " $OUT/first.log
[ $rc -ne 0 ] && exit 1
A="bench-cases:--cases=$C64@--no-flashinfer"
timeout 240 bash bench/gpu_session.sh use:dist "$A" use:dist-vt1 "$A" use:dist-vt2 "$A" use:dist "$A" use:dist-vt1 "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
grep -E "^\[|rc |install" $OUT/bench.log | grep -v "^\[gpu"
