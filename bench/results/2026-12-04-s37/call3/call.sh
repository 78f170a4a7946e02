#!/bin/bash
# session 37 call 3: how long a warpgroup is held issuing wgmmas (bench/wgmma_issue_probe.cu)
mkdir -p $OUT
timeout 120 .carry/bin/wgmma_issue_probe 2>&1 | tee $OUT/wgmma-issue-probe.log
