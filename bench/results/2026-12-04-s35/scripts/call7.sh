#!/bin/bash
# session 35 call 7: Q_FIRST on (dist, the default) against off (dist-noqf): outputs bit for bit (bench/dump_decode.py)
bash bench/gpu_session.sh use:dist-noqf dump-save use:dist dump-compare
mkdir -p $OUT/work; cp /tmp/snapmla-work/dump*.log /tmp/snapmla-work/session.log $OUT/work/ 2>/dev/null
