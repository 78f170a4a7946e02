#!/bin/bash
# session 42 call 4: 8x1x16x4096's two modes against the plans' split parallelism (num_sm_parts):
# do attention CTAs that wait for the Q-quant kernel's SMs make the one-term call's slow mode?
bash bench/gpu_session.sh > /tmp/gs.log 2>&1; echo "gpu_session rc $?"
export PYTHONPATH=/tmp/site
timeout 300 python3 bench/placement_probe.py --case 8x1x16x4096 --repeat 4 --profile \
  --recreate "parts:0,parts:116,parts:112,parts:124,parts:132,parts:0" 2>&1 | tee $OUT/probe-parts.txt
