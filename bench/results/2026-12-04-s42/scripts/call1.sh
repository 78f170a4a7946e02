#!/bin/bash
# session 42 call 1: the row_quant mend (f47fe5b) against 4712b70's outputs, its quantize and
# decode tests; then bench/placement_probe.py on 8x1x16x4096 (which memory state moves its cost)
export PYTEST_FILES="tests/gpu/test_quantize.py tests/gpu/test_decode.py"
bash bench/gpu_session.sh use:dist-base dump-save use:dist dump-compare pytest-files > /tmp/gs.log 2>&1
echo "gpu_session rc $?"; grep -E "^===|passed|failed|error|identical|differ" /tmp/gs.log | tail -15
export PYTHONPATH=/tmp/site
timeout 400 python3 bench/placement_probe.py --case 8x1x16x4096 --repeat 2 \
  --states "fresh,case:1x1x16x8192,fresh,cupy:2,cupy:64,cupy:256,torch:64,torch:512,cupy:200+torch:300" \
  2>&1 | tee $OUT/probe.txt
