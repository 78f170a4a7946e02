#!/bin/bash
# session 39 call 5: bench/softmax_probe.cu variants 10 and 11 (a role split's two chains co-running: QK + softmax in warpgroup 0, the promoted PV in warpgroup 1)
mkdir -p $OUT
timeout 120 .carry/bin/softmax_probe 2000 > $OUT/softmax-probe.log 2>&1; echo "rc $?" >> $OUT/softmax-probe.log
cat $OUT/softmax-probe.log
