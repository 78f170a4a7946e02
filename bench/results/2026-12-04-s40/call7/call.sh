#!/bin/bash
# session 40 call 7: bench/sustained.sh on the committed power_probe (randn data, the
# 32x1x128x16384 share), then the whole decode call of that case next to FlashInfer, graph
# replays for 0.05 s (--quick, the README's table) and for 3 s a kernel (sustained)
mkdir -p $OUT
SNAPMLA_PROBE_DATA=randn bash bench/sustained.sh probe-all-randn $OUT -- .carry/bin/power_probe all 124 62 3
export BENCH_CASES=32x1x128x16384
bash bench/sustained.sh bench-quick $OUT -- timeout 200 bash bench/gpu_session.sh use:dist bench-cases > $OUT/bench-quick.log 2>&1
grep -E "^\[|ours|FlashInfer|gpu_after" $OUT/bench-quick.log | grep -v "^\[gpu" | tail -8
python3 bench/smi_summary.py $OUT/smi-bench-quick.csv bench-quick
bash bench/sustained.sh bench-3s $OUT -- timeout 200 bash bench/gpu_session.sh use:dist "bench-cases:--timing-s=3" > $OUT/bench-3s.log 2>&1
grep -E "^\[|ours|FlashInfer" $OUT/bench-3s.log | grep -v "^\[gpu" | tail -8
python3 bench/smi_summary.py $OUT/smi-bench-3s.csv bench-3s
python3 - $OUT <<'PY'
import json, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/decode-cases*.json")):
    d = json.load(open(f))
    for c in d["cases"]:
        print(f, c["name"], "ours", c.get("snapmla", {}).get("median_us"), "flashinfer", c.get("flashinfer", {}).get("median_us"),
              "gpu_after", c.get("snapmla", {}).get("gpu_after"), c.get("flashinfer", {}).get("gpu_after"))
PY
