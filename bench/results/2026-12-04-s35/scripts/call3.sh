#!/bin/bash
# session 35 call 3: ncu on the N = 64 scaled kernel (owed since session 33), source counters
NCU_CASES="32x1x128x16384" bash bench/gpu_session.sh use:dist ncu
cp /tmp/snapmla-work/ncu-* $OUT/ 2>/dev/null; ls -la $OUT
