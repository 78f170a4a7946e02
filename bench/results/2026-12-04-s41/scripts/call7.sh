#!/bin/bash
# session 41 call 7: the two-term decomposition with 400 launches a figure (SNAPMLA_TRACE_REPS;
# the default 50 moved the one-term call by 0.8 us between binaries in call 3), three runs a case
for c in "8 16 4096" "16 16 4096" "1 16 8192"; do
  for k in 1 2 3; do
    echo "### seesaw_trace two-term $c run $k"
    SNAPMLA_TRACE_REPS=400 SNAPMLA_TRACE_TWO_TERM=1 timeout 120 .carry/bin/seesaw_trace $c 2>&1 \
      | grep -E "^(kernel|decode call|two-term)|error"
  done
done 2>&1 | tee $OUT/two-term-decomp-reps400.log
