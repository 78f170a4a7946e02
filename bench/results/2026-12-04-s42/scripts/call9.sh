#!/bin/bash
# session 42 call 9: racecheck's hazards on sanity_plans.py, new (2e80c84) and 4712b70
export PYTHONPATH=/tmp/site
for w in dist dist-base; do
  bash bench/gpu_session.sh use:$w > /tmp/gs.log 2>&1
  timeout 100 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 40 \
    --error-exitcode 9 python3 .carry/sanity_plans.py > $OUT/racecheck-$w.log 2>&1
  echo "$w racecheck exit $?"
  grep -E "^[0-9]|SUMMARY" $OUT/racecheck-$w.log
  grep -E "Error: Potential|Write Thread|Read Thread|at .* in " $OUT/racecheck-$w.log | sed 's/0x[0-9a-f]*//g' | sort | uniq -c | sort -rn | head -12
done
