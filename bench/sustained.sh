#!/usr/bin/env bash
# GPU machine: run a command while nvidia-smi samples the SM clock, power and throttle reasons
# every 50 ms, then print the sustained state (bench/smi_summary.py) and keep the samples.
#   bash bench/sustained.sh LABEL [OUT_DIR] -- command args...
# e.g. SNAPMLA_PROBE_DATA=randn bash bench/sustained.sh all-randn $OUT -- \
#        .carry/bin/power_probe all 124 62 3
# A run should last seconds (power_probe's `seconds`, seesaw_trace's SNAPMLA_TRACE_REPS=4000):
# the board takes ~0.1 s to reach its power limit. The command's output passes through; the
# samples stay in OUT_DIR/smi-LABEL.csv (default: the current directory). Two seconds of rest
# follow, so that back-to-back runs start from a similar state.
set -uo pipefail
label=$1; shift
out=.
if [ "${1:-}" != "--" ]; then out=$1; shift; fi
[ "${1:-}" = "--" ] && shift
here=$(cd "$(dirname "$0")" && pwd)
fields=timestamp,clocks.sm,power.draw.instant,power.limit,temperature.gpu
fields=$fields,clocks_throttle_reasons.active
nvidia-smi --query-gpu=$fields --format=csv,noheader >/dev/null 2>&1 ||
  fields=timestamp,clocks.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active
csv=$out/smi-$label.csv
nvidia-smi --query-gpu=$fields --format=csv,noheader -lms 50 >"$csv" &
smi=$!
timeout 60 "$@" 2>&1
rc=$?
kill $smi 2>/dev/null
wait $smi 2>/dev/null
python3 "$here/smi_summary.py" "$csv" "$label"
sleep 2
exit $rc
