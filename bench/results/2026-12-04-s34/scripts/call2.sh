#!/bin/bash
# session 34 call 2: SNAPMLA_QQUANT_ROW_WARPS=2/4: quantize tests, bit identity, Q-quant alone, A/B
C16=1x1x16x8192,8x1x16x4096,4x1x16x16384,16x1x16x4096,2x1x16x32768,64x1x16x4096,128x1x16x16384
C32=32x1x32x32768,64x2x16x16384,8x1x32x4096,1x1x32x8192,128x1x16xR32768,64x1x16x65536
C128=1x1x128x1024,1x1x128x4096,1x1x128x8192,2x1x128x4096,8x1x128x1024,8x1x128x4096,64x1x128x1024
A="bench-cases:--cases=$C16@--two-term@--two-term-rounds=3@--no-flashinfer"
B="bench-cases:--cases=$C32@--two-term@--two-term-rounds=3@--no-flashinfer"
H="bench-cases:--cases=$C128@--no-flashinfer"
export BENCH_CASES=x QQUANT_ROWS=16,128,1024,4096 PYTEST_FILES=tests/gpu/test_quantize.py
bash bench/gpu_session.sh use:dist dump-save qquant use:dist-rw4 pytest-files dump-compare qquant \
  use:dist-rw2 pytest-files dump-compare qquant \
  use:dist "$A" "$B" "$H" use:dist-rw4 "$A" "$B" "$H" use:dist-rw2 "$A" "$B" "$H" \
  use:dist "$A" "$B" "$H" use:dist-rw4 "$A" "$B" "$H"
