#!/bin/bash
# session 34 call 3: the Q-quant kernel under ncu, one and two terms (launches 5 and 6: the third pair)
OUT=/tmp/snapmla-out; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .carry/dist/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
for cc in all none; do
timeout 200 ncu --clock-control none --cache-control $cc -k regex:quantize_q --launch-skip 4 --launch-count 2 \
  --section SpeedOfLight --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section InstructionStats --section SourceCounters --metrics smsp__inst_executed.sum,smsp__cycles_active.avg,sm__cycles_elapsed.max \
  python3 .carry/qq_ncu.py > $OUT/ncu-qq-$cc.txt 2>&1
done
grep -E "quantize_q_kernel|Duration|Stall|Warp Cycles Per Issued|Executed Instructions|Issued Ipc|No Instr|inst_executed|cycles" $OUT/ncu-qq-all.txt | head -60
