#!/bin/bash
# session 42 call 3: 8x1x16x4096's two modes, per kernel (torch.profiler on one replay of each graph)
bash bench/gpu_session.sh > /tmp/gs.log 2>&1; echo "gpu_session rc $?"
export PYTHONPATH=/tmp/site
timeout 300 python3 bench/placement_probe.py --case 8x1x16x4096 --repeat 5 --profile \
  --recreate "none,plans,tables,cache,plans+tables" 2>&1 | tee $OUT/probe-profile.txt
