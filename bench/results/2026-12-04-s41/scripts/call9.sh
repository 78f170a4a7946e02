#!/bin/bash
# session 41 call 9: the whole two-term bench set (C16, C32) twice on one board (wheel 4712b70)
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist "$A" "$B" "$A" "$B"
echo "=== summary"
nvidia-smi --query-gpu=name,serial,pci.bus_id,clocks.max.sm,power.limit --format=csv
for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f"; grep -E "auto .*cost" "$f" | awk '{print $1, $3, $6, $8}'; done
