#!/bin/bash
# session 39 call 1: SNAPMLA_SEESAW_BENCH_QK_RS timing builds (the N = 64 QK's Q from registers: 1 content, 2 RoPE, 3 both) against the default, graph replays; timelines at 32x128x16384
mkdir -p $OUT
C64=32x1x128x16384,64x1x128x4096,64x1x64x32768,16x1x128x131072,128x4x16x8192,8x1x128x4096,1x1x128x8192
A="bench-cases:--cases=$C64@--no-flashinfer"
export BENCH_CASES=x
timeout 330 bash bench/gpu_session.sh use:dist "$A" use:dist-qkrs1 "$A" use:dist-qkrs3 "$A" use:dist-qkrs2 "$A" use:dist "$A" use:dist-qkrs3 "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
for b in seesaw_timeline seesaw_timeline_qkrs1 seesaw_timeline_qkrs3; do
  echo "### $b 32 128 16384" >> $OUT/timeline.log
  timeout 40 .carry/bin/$b 32 128 16384 >> $OUT/timeline.log 2>&1
done
grep -E "^\[|rc |install" $OUT/bench.log | grep -v "^\[gpu" | head -60
python3 bench/timeline_stats.py $OUT/timeline.log
grep -E "^###|^kernel " $OUT/timeline.log
