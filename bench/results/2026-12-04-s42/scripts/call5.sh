#!/bin/bash
# session 42 call 5: the plan's room for the Q-quant kernel (0ca62d8): plan and decode tests;
# bench A/B/A (new, 4712b70, new) on the cases it changes and some it does not, --two-term;
# placement_probe at 8x1x32x4096 and 16x1x16x4096 with fewer parts (is one unit enough?)
export PYTEST_FILES="tests/gpu/test_plan_gpu.py tests/gpu/test_decode.py"
bash bench/gpu_session.sh use:dist pytest-files > /tmp/gs.log 2>&1
echo "tests rc $?"; grep -E "passed|failed|error" /tmp/gs.log | tail -5
export PYTHONPATH=/tmp/site
C=8x1x16x4096,1x1x16x8192,4x1x16x16384,2x1x16x32768,16x1x16x4096,8x1x32x4096,1x1x32x8192,64x1x16x4096
run_bench() {
  echo "=== bench $1 ($(cat .carry/$2/COMMIT))"
  timeout 200 python3 bench/bench_decode.py --no-flashinfer --two-term --cases $C \
    --out $OUT/decode-$1.json 2>&1 | grep -E "^[0-9]+x|cost" | cut -c1-150
}
run_bench new dist
bash bench/gpu_session.sh use:dist-base > /dev/null 2>&1; run_bench base dist-base
bash bench/gpu_session.sh use:dist > /dev/null 2>&1; run_bench new2 dist
for c in 8x1x32x4096 16x1x16x4096; do
  timeout 100 python3 bench/placement_probe.py --case $c --repeat 3 \
    --recreate "parts:0,parts:100,parts:88,parts:0" 2>&1 | grep -v Warn | tee -a $OUT/probe-parts2.txt
done
