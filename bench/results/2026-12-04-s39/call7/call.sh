#!/bin/bash
# session 39 call 7: bench/softmax_probe.cu again after its helpers moved into functions (a check that it reproduces calls 5-6)
mkdir -p $OUT
timeout 120 stdbuf -oL .carry/bin/softmax_probe 2000 > $OUT/softmax-probe.log 2>&1; echo "rc $?" >> $OUT/softmax-probe.log
cat $OUT/softmax-probe.log
