#!/bin/bash
# session 38 call 10: bench/softmax_probe.cu with half or all of the softmax's exponentials by FMAs (exp2_poly) beside a QK, the promoted PV, or nothing
mkdir -p $OUT
timeout 60 .carry/bin/softmax_probe 2000 > $OUT/softmax-probe.log 2>&1; echo "rc $?" >> $OUT/softmax-probe.log
cat $OUT/softmax-probe.log
