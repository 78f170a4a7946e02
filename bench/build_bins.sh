#!/usr/bin/env bash
# The CUDA programs the GPU machine runs besides the wheel, built here into .carry/bin:
# host_overhead_c (against a built libsnapmla.so in $SNAPMLA_LIBDIR, default /tmp/b) and the
# probes power_probe, qgmma_probe and dsmem_probe. gpu_session.sh's host-c, power-floor, qgmma
# and dsmem stages run them.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p .carry/bin
flags=(-gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -Iinclude)
"$NVCC" "${flags[@]}" bench/probes/power_probe.cu -o .carry/bin/power_probe &
"$NVCC" "${flags[@]}" bench/probes/qgmma_probe.cu -o .carry/bin/qgmma_probe &
"$NVCC" "${flags[@]}" bench/probes/dsmem_probe.cu -o .carry/bin/dsmem_probe &
LIBDIR=${SNAPMLA_LIBDIR:-/tmp/b}
if [ -f "$LIBDIR/libsnapmla.so" ]; then
  "$NVCC" -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Iinclude bench/host_overhead_c.cu \
    -L"$LIBDIR" -lsnapmla -Xlinker -rpath,/tmp/site/snapmla/lib -o .carry/bin/host_overhead_c
else
  echo "no $LIBDIR/libsnapmla.so: host_overhead_c not built (set SNAPMLA_LIBDIR)"
fi
wait
git rev-parse --short HEAD > .carry/bin/COMMIT
echo "built .carry/bin at $(cat .carry/bin/COMMIT)"
