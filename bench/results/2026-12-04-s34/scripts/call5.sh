#!/bin/bash
# session 34 call 5: the two-term decomposition (seesaw_trace's alternating and mixed calls), default and SHARE_SM
for c in "8 16 4096" "4 16 16384" "16 16 4096" "8 32 4096" "1 16 8192" "64 16 4096"; do
  for v in seesaw_trace seesaw_trace_share; do
    echo "### $v two-term $c"
    SNAPMLA_TRACE_TWO_TERM=1 timeout 60 .carry/bin/$v $c 2>&1 | grep -E "^(kernel|decode call|two-term)|error"
  done
done | tee $OUT/two-term-decomp.log
