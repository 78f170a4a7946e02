#!/bin/bash
# session 38 call 6: bench/softmax_probe.cu (the N = 64 softmax beside each kind of the other warpgroup's work)
mkdir -p $OUT
timeout 120 .carry/bin/softmax_probe 2000 > $OUT/softmax-probe.log 2>&1
echo "rc $?" >> $OUT/softmax-probe.log
cat $OUT/softmax-probe.log
