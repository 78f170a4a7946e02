#!/bin/bash
# session 41 call 6: CTA (0,0)'s timeline of the decode call as it runs (the Q-quant kernel, then
# the attention kernel under PDL; SNAPMLA_TRACE_WITH_QQUANT=1), one / two terms alternating, at
# 8 16 4096 and 16 16 4096 (7053e46)
for c in "8 16 4096" "16 16 4096"; do
  for tt in 0 1 0 1 0 1; do
    echo "### seesaw_timeline $c two_term=$tt with Q-quant"
    SNAPMLA_TRACE_WITH_QQUANT=1 SNAPMLA_TRACE_TWO_TERM=$tt timeout 60 .carry/bin/seesaw_timeline $c 2>&1 \
      | grep -vE "^wg[01] blk *([4-9]|1[0-9]|2[0-9]):"
  done
done > $OUT/timeline-with-qquant.log 2>&1
grep -E "###|one launch|CTA end|CTA entry|blk *0:" $OUT/timeline-with-qquant.log | cut -c1-420
