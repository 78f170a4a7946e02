#!/bin/bash
# session 42 call 7 (2e80c84): the README's row for 8x1x16x4096 next to FlashInfer (--quick, as
# the README's table), then the whole GPU suite
bash bench/gpu_session.sh > /tmp/gs.log 2>&1
PYTHONPATH=/tmp/site timeout 120 python3 bench/bench_decode.py --quick --cases 8x1x16x4096,8x1x32x4096 \
  --out $OUT/readme-rows.json 2>&1 | grep -E "^[0-9]+x|FlashInfer" | cut -c1-150
OUT=$OUT bash bench/gpu_session.sh tests > /tmp/gs2.log 2>&1
echo "suite rc $?"; grep -E "passed|failed|error|FAILED|ERROR" /tmp/gs2.log | tail -12
