#!/bin/bash
# session 39 call 6: bench/softmax_probe.cu with three_role_kernel (one QK-and-softmax warpgroup, two promoted-PV warpgroups, setmaxnreg 104/200 or 120/192), then pv_rate for reference
mkdir -p $OUT
timeout 120 stdbuf -oL .carry/bin/softmax_probe 2000 > $OUT/softmax-probe.log 2>&1; echo "rc $?" >> $OUT/softmax-probe.log
timeout 60 stdbuf -oL .carry/bin/pv_rate > $OUT/pv-rate.log 2>&1; echo "rc $?" >> $OUT/pv-rate.log
grep -E "split|three|rc" $OUT/softmax-probe.log
cat $OUT/pv-rate.log | tail -15
