#!/bin/bash
# session 39 call 2: bench/softmax_probe.cu with two new neighbours: a QK with A from registers (8) and a shared-memory load stream (9)
mkdir -p $OUT
timeout 90 .carry/bin/softmax_probe 2000 > $OUT/softmax-probe.log 2>&1; echo "rc $?" >> $OUT/softmax-probe.log
cat $OUT/softmax-probe.log
