#!/bin/bash
# session 36 call 9: how long a refill takes in the steady state (the timeline with the producer's load_issue and the stage's load_done), 32x128x16384 and 64x128x4096
mkdir -p $OUT
for c in "32 128 16384" "64 128 4096"; do
  echo "### seesaw_timeline $c" | tee -a $OUT/timeline.log
  timeout 60 .carry/bin/seesaw_timeline $c 2>&1 | tee -a $OUT/timeline.log | head -60
done
