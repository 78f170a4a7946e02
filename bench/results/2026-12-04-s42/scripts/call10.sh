#!/bin/bash
# session 42 call 10: are racecheck's hazards at 8x1x32x4096 the new plan's, or any plan's with
# parts of more than 4 blocks? the old wheel (4712b70) and the new (2e80c84) at several part counts
export PYTHONPATH=/tmp/site
rc() { timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 python3 .carry/race_parts.py "$@" 2>&1 | grep -E "SUMMARY|^parts" | tr '\n' ' '; echo; }
for w in dist-base dist; do
  bash bench/gpu_session.sh use:$w > /tmp/gs.log 2>&1
  for p in 0 132 88 66 44 22; do echo -n "$w parts $p: "; rc $p; done
done
bash bench/gpu_session.sh use:dist-base > /tmp/gs.log 2>&1
for c in 8x1x16x4096 8x2x16x4096 4x1x32x8192; do for p in 0 88 44; do echo -n "base $c parts $p: "; rc $p $c; done; done
