#!/bin/bash
# session 39 call 3: the N = 64 kernel's skeleton: SNAPMLA_SEESAW_BENCH_NO_SOFTMAX (ns), with SNAPMLA_SEESAW_BENCH_PV=2 (ns2: no promotion) and =3 (ns3: and the PV's operands in shared memory), and BENCH_PV=2 alone (pv2), against the default, graph replays
mkdir -p $OUT
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096,1x1x128x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 20 bash bench/gpu_session.sh use:dist-ns3 "bench-cases:--cases=8x1x128x4096@--no-flashinfer" > $OUT/first.log 2>&1; echo "first rc $?" >> $OUT/first.log
grep -E "^\[|rc " $OUT/first.log
timeout 330 bash bench/gpu_session.sh use:dist "$A" use:dist-ns "$A" use:dist-ns2 "$A" use:dist-ns3 "$A" use:dist-pv2 "$A" use:dist "$A" use:dist-ns2 "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
grep -E "^\[|rc |install" $OUT/bench.log | grep -v "^\[gpu" | head -70
