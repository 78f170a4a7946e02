#!/bin/bash
# session 42 call 8 (2e80c84): compute-sanitizer memcheck and racecheck on one decode of each
# form at the shapes whose default plans now leave the Q-quant kernel's SMs free
bash bench/gpu_session.sh > /tmp/gs.log 2>&1
export PYTHONPATH=/tmp/site
PYTHONPATH=/tmp/site timeout 60 python3 .carry/sanity_plans.py
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 --target-processes all \
    python3 .carry/sanity_plans.py > /tmp/san-$tool.log 2>&1
  echo "$tool exit $?"; tail -2 /tmp/san-$tool.log
done
