#!/bin/bash
# session 38 call 2: CTA (0,0) timelines at 32x128x16384, default against SNAPMLA_SEESAW_BENCH_HALF_O=1 and =3
mkdir -p $OUT
for b in seesaw_timeline seesaw_timeline_halfo1 seesaw_timeline_halfo3; do
  echo "### $b 32 128 16384" >> $OUT/timeline.log
  timeout 40 .carry/bin/$b 32 128 16384 >> $OUT/timeline.log 2>&1
  echo "rc $?" >> $OUT/timeline.log
done
grep -E "###|^kernel|rc " $OUT/timeline.log
