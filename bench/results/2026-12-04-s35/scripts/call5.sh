#!/bin/bash
# session 35 call 5: the README table at 7fae56b (Q_FIRST on): the quick bench twice with FlashInfer, the two-term cost
TWO_TERM_EXTRA="--two-term-rounds=3" bash bench/gpu_session.sh use:dist bench-quick bench-quick bench-two-term
mkdir -p $OUT/work; cp /tmp/snapmla-work/*.log /tmp/snapmla-work/*.json $OUT/work/ 2>/dev/null; ls $OUT/work
