#!/bin/bash
# session 41 call 3: where 8x1x16x4096's two-term cost goes after the shared quotients:
# seesaw_trace (4712b70) against seesaw_trace_base (785fd53), alternating one / two-term calls,
# the attention kernel alone and the mixed calls; CTA (0,0)'s timeline one / two terms; the
# sanitizers on the default wheel
export DECOMP_VARIANTS="seesaw_trace seesaw_trace_base" DECOMP_CASES="8 16 4096,16 16 4096,1 16 8192,8 32 4096"
bash bench/gpu_session.sh use:dist two-term-decomp sanitize
for c in "8 16 4096"; do
  for tt in 0 1 0 1; do
    echo "### seesaw_timeline $c two_term=$tt"
    SNAPMLA_TRACE_TWO_TERM=$tt timeout 60 .carry/bin/seesaw_timeline $c 2>&1 | grep -vE "^wg[01] blk *([4-9]|1[0-9]|2[0-9]):"
  done
done > $OUT/timeline-two-term.log 2>&1
grep -E "###|one launch|blk *0:" $OUT/timeline-two-term.log | cut -c1-400
echo "=== decomposition"
grep -E "^###|alternating|mixed|Q-quant alone" /tmp/snapmla-work/two-term-decomp.log
