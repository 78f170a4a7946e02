#!/bin/bash
# session 38 call 8: SNAPMLA_SEESAW_QK_AFTER_PREADY=1 (dist-qa) against the default: one short case alone first, graph replays A/B/A/B over the 23 cases, timelines at 32x128x16384, the decode tests on it
mkdir -p $OUT
ALL=1x1x128x8192,32x1x128x16384,64x1x128x32768,16x1x128x131072,32x2x128x16384,64x1x64x32768,128x1x16x16384,64x1x16x65536,32x1x32x32768,1x1x128x1024,1x1x128x4096,8x1x128x1024,8x1x128x4096,64x1x128x1024,64x1x128x4096,1x1x16x8192,8x1x16x4096,64x1x16x4096,64x1x128xR32768,128x1x16xR32768,32x2x64x16384,64x2x16x16384,128x4x16x8192
export BENCH_CASES=x
timeout 60 bash bench/gpu_session.sh use:dist-qa "bench-cases:--cases=8x1x128x4096@--no-flashinfer" > $OUT/first.log 2>&1
rc=$?; echo "first rc $rc" >> $OUT/first.log; grep -E "^[0-9]+x|rc " $OUT/first.log
[ $rc -ne 0 ] && exit 1
A="bench-cases:--cases=$ALL@--no-flashinfer"
timeout 280 bash bench/gpu_session.sh use:dist "$A" use:dist-qa "$A" use:dist "$A" use:dist-qa "$A" > $OUT/bench.log 2>&1
echo "bench rc $?" >> $OUT/bench.log
for b in seesaw_timeline seesaw_timeline_qkap; do
  echo "### $b 32 128 16384" >> $OUT/timeline.log
  timeout 40 .carry/bin/$b 32 128 16384 >> $OUT/timeline.log 2>&1
  echo "rc $?" >> $OUT/timeline.log
done
grep -E "###|^kernel|rc " $OUT/timeline.log
python3 - <<'PY'
import re
txt=open('/'.join([__import__('os').environ['OUT'],'bench.log'])).read()
blocks=re.split(r'=== \S+ install snapmla from \.carry/(\S+)',txt)
order=[]
for k in range(1,len(blocks),2):
    d={m.group(1):float(m.group(2)) for m in re.finditer(r'^(\S+x\S+)\s+([\d.]+)\s',blocks[k+1],re.M)}
    order.append((blocks[k],d))
for c in order[0][1]:
    v=[d.get(c,0) for _,d in order]
    print(c, ' '.join('%.1f'%x for x in v), '%.3f'%((v[1]+v[3])/(v[0]+v[2])) if len(v)==4 else '')
PY
timeout 150 bash bench/gpu_session.sh use:dist-qa tests-decode > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log
grep -E "passed|failed|error|rc " $OUT/tests.log | tail -4
