#!/usr/bin/env bash
# Development machine: build bench/seesaw_trace.cu into .carry/bin for a GPU call, twice: the
# timing binary (seesaw_trace) and the per-CTA clock64 timeline (seesaw_timeline, compiled with
# -DSNAPMLA_SEESAW_TRACE). On the GPU machine:
#   .carry/bin/seesaw_trace 32 128 16384      # batch heads seqlen [q_len [min part cost]]
#   .carry/bin/seesaw_timeline 32 128 16384
#   .carry/bin/seesaw_trace_refill32 128 16 16384 2   # N = 32 with SNAPMLA_SEESAW_REFILL32
#   .carry/bin/seesaw_trace_producer 128 16 16384     # the producer warpgroup at every N
#   .carry/bin/seesaw_trace_noproducer 32 128 16384   # at none (the default: N = 32 and 64)
#   .carry/bin/seesaw_trace_rowmath 32 128 16384      # with SNAPMLA_SEESAW_FAST_ROWMATH
#   .carry/bin/seesaw_trace_widecombine 1 128 8192    # with SNAPMLA_COMBINE_WIDE ("kernel +
#                                                     # combine" is the line to compare)
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p .carry/bin
src=(bench/seesaw_trace.cu cpp/decode/plan.cu cpp/decode/combine.cu cpp/decode/seesaw/launch.cu
     cpp/decode/seesaw/instantiations/n16.cu cpp/decode/seesaw/instantiations/n32.cu
     cpp/decode/seesaw/instantiations/n64.cu)
flags=(-gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -Iinclude)
"$NVCC" "${flags[@]}" "${src[@]}" -o .carry/bin/seesaw_trace &
"$NVCC" "${flags[@]}" -DSNAPMLA_SEESAW_TRACE "${src[@]}" -o .carry/bin/seesaw_timeline &
# Experimental variants for an A/B in the same call (kernel.cuh's SNAPMLA_SEESAW_* switches).
"$NVCC" "${flags[@]}" -DSNAPMLA_SEESAW_REFILL32=1 "${src[@]}" -o .carry/bin/seesaw_trace_refill32 &
"$NVCC" "${flags[@]}" -DSNAPMLA_SEESAW_PRODUCER=1 "${src[@]}" -o .carry/bin/seesaw_trace_producer &
"$NVCC" "${flags[@]}" -DSNAPMLA_SEESAW_PRODUCER=0 "${src[@]}" -o .carry/bin/seesaw_trace_noproducer &
"$NVCC" "${flags[@]}" -DSNAPMLA_SEESAW_FAST_ROWMATH=1 "${src[@]}" -o .carry/bin/seesaw_trace_rowmath &
"$NVCC" "${flags[@]}" -DSNAPMLA_COMBINE_WIDE=1 "${src[@]}" -o .carry/bin/seesaw_trace_widecombine &
wait -n && wait -n && wait -n && wait -n && wait -n && wait -n && wait -n
# The C API's host-time harness, against a library built here (any build of this commit's ABI);
# on the GPU machine it loads the installed wheel's library (rpath /tmp/site/snapmla/lib).
LIBDIR=${SNAPMLA_LIBDIR:-/tmp/b}
if [ -f "$LIBDIR/libsnapmla.so" ]; then
  "$NVCC" -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Iinclude bench/host_overhead_c.cu \
    -L"$LIBDIR" -lsnapmla -Xlinker -rpath,/tmp/site/snapmla/lib -o .carry/bin/host_overhead_c
else
  echo "no $LIBDIR/libsnapmla.so: host_overhead_c not built (set SNAPMLA_LIBDIR)"
fi
git rev-parse --short HEAD > .carry/bin/COMMIT
echo "built .carry/bin/seesaw_trace and seesaw_timeline at $(cat .carry/bin/COMMIT)"
