#!/bin/bash
# session 41 call 5: SNAPMLA_SEESAW_PAGES_BEFORE_Q=2 / 3 under the Q-first default (pages 0..k-1
# before the Q-quant wait, the rest after the tile lands) against the default (=1), 592e59b
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
C128=1x1x128x1024,8x1x128x1024,8x1x128x4096,64x1x128x1024
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
H="bench-cases:--cases=$C128@--no-flashinfer"
export BENCH_CASES=x
bash bench/gpu_session.sh use:dist dump-save use:dist-pbq2 dump-compare use:dist-pbq3 dump-compare \
  use:dist "$A" "$B" "$H" use:dist-pbq2 "$A" "$B" "$H" use:dist-pbq3 "$A" "$B" "$H" \
  use:dist "$A" "$B" "$H" use:dist-pbq2 "$A" "$B" "$H" use:dist-pbq3 "$A" "$B" "$H"
echo "=== summary"
for f in $(ls -tr /tmp/snapmla-work/bench-cases*.log); do echo "# $f"; grep -E "^\S+ +[0-9.]+ +- " "$f" | awk '{print $1, $2}' | tr '\n' ' '; echo; grep -E "auto .*cost" "$f" | awk '{print $1, $3, $6, $8}'; done
tail -n 1 /tmp/snapmla-work/dump-compare*.log
