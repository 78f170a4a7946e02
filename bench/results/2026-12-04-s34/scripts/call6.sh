#!/bin/bash
# session 34 call 6: where the two-term attention kernel's +0.6 us goes: CTA (0,0)'s timeline, one then two terms
for c in "1 16 8192" "8 16 4096"; do
  for tt in 0 1 0 1; do
    echo "### seesaw_timeline $c two_term=$tt"
    SNAPMLA_TRACE_TWO_TERM=$tt timeout 60 .carry/bin/seesaw_timeline $c 2>&1 | grep -vE "^wg[01] blk *([4-9]|1[0-9]|2[0-9]):"
  done
done | tee $OUT/timeline-two-term.log | grep -E "###|one launch|CTA|blk *[0-1]:" | head -80
