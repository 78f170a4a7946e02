#!/bin/bash
# session 36 call 8: is the scaled N = 64 kernel bit-identical to the unscaled one (ptxas fuses its two promotion steps into one FFMA)? bench/dump_decode.py saved with SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN=-1 (no scaled kernel), compared with the default
bash bench/gpu_session.sh use:dist-noscaled dump-save use:dist dump-compare
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log $OUT/work/ 2>/dev/null; ls $OUT/work
