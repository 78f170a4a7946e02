#!/bin/bash
# session 38 call 9: bench/softmax_probe.cu and bench/pv_rate.cu after their shared pieces moved to bench/probe_pv.cuh (the same measurements again)
mkdir -p $OUT
timeout 60 .carry/bin/softmax_probe 2000 > $OUT/softmax-probe.log 2>&1; echo "rc $?" >> $OUT/softmax-probe.log
timeout 60 .carry/bin/pv_rate > $OUT/pv-rate.log 2>&1; echo "rc $?" >> $OUT/pv-rate.log
cat $OUT/softmax-probe.log $OUT/pv-rate.log
