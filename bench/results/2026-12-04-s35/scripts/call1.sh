#!/bin/bash
# session 35 call 1: SNAPMLA_SEESAW_Q_FIRST=1 under the sanitizers, the two-term decomposition of both builds, CTA timelines
DECOMP_VARIANTS="seesaw_trace seesaw_trace_qfirst" bash bench/gpu_session.sh use:dist-qf sanitize two-term-decomp
for v in seesaw_timeline seesaw_timeline_qfirst; do
  echo "== $v 1 16 8192 one-term"; timeout 60 .carry/bin/$v 1 16 8192 > $OUT/timeline-$v-1x16x8192.log 2>&1; tail -30 $OUT/timeline-$v-1x16x8192.log
done
cp -r /tmp/snapmla-work/. $OUT/work/ 2>/dev/null || true
