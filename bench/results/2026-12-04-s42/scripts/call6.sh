#!/bin/bash
# session 42 call 6: the refined plan rule (short parts only, up to two more blocks): plan and
# decode tests; the issue's s_q x h <= 32 cases with --two-term; A/B/A against 4712b70 where the
# rule fires or was tried
export PYTEST_FILES="tests/gpu/test_plan_gpu.py tests/gpu/test_decode.py"
bash bench/gpu_session.sh use:dist pytest-files > /tmp/gs.log 2>&1
echo "tests rc $?"; grep -E "passed|failed|error" /tmp/gs.log | tail -5
export PYTHONPATH=/tmp/site
ALL=1x1x16x8192,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384,128x1x16xR32768,64x1x16x65536,32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,8x1x16x4096
AB=8x1x16x4096,8x1x32x4096,4x1x16x16384,16x1x16x4096
run_bench() {
  echo "=== bench $1 ($(cat .carry/$2/COMMIT)) $3"
  timeout 300 python3 bench/bench_decode.py --no-flashinfer --two-term --cases $3 \
    --out $OUT/decode-$1.json 2>&1 | grep -E "^[0-9]+x|cost" | cut -c1-150
}
run_bench issue-set dist $ALL
bash bench/gpu_session.sh use:dist-base > /dev/null 2>&1; run_bench base dist-base $AB
bash bench/gpu_session.sh use:dist > /dev/null 2>&1; run_bench new dist $AB
