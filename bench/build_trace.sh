#!/usr/bin/env bash
# Development machine: build bench/seesaw_trace.cu into .carry/bin for a GPU call, twice: the
# timing binary (seesaw_trace) and the per-CTA clock64 timeline (seesaw_timeline, compiled with
# -DSNAPMLA_SEESAW_TRACE). On the GPU machine:
#   .carry/bin/seesaw_trace 32 128 16384      # batch heads seqlen [q_len [min part cost]]
#   .carry/bin/seesaw_timeline 32 128 16384
#   .carry/bin/seesaw_trace_rowmath 32 128 16384      # with SNAPMLA_SEESAW_FAST_ROWMATH
#   .carry/bin/seesaw_trace_widecombine 1 128 8192    # with SNAPMLA_COMBINE_WIDE ("kernel +
#                                                     # combine" is the line to compare)
#   .carry/bin/seesaw_trace_prefetch 1 128 1024       # with SNAPMLA_SEESAW_PREFETCH_MAPS
#   .carry/bin/seesaw_trace_pvdeep 128 16 16384       # with SNAPMLA_SEESAW_PV_DEEP (N <= 32)
#   .carry/bin/seesaw_trace_pvdepth3 32 128 16384     # with SNAPMLA_SEESAW_PV_DEPTH=3
#   .carry/bin/seesaw_trace_pdl 1 128 1024            # with SNAPMLA_PDL ("kernel + combine")
#   .carry/bin/seesaw_trace_all 32 128 16384          # every staged kernel switch at once
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p .carry/bin
src=(bench/seesaw_trace.cu cpp/decode/plan.cu cpp/decode/combine.cu cpp/decode/seesaw/launch.cu
     cpp/decode/seesaw/instantiations/n16.cu cpp/decode/seesaw/instantiations/n32.cu
     cpp/decode/seesaw/instantiations/n64.cu cpp/decode/seesaw/instantiations/n16_two_term.cu
     cpp/decode/seesaw/instantiations/n32_two_term.cu)
flags=(-gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -Iinclude)
# Every binary in parallel; a failed build stops the script (and leaves no stale binary).
builds=(
  "seesaw_trace:"
  "seesaw_timeline:-DSNAPMLA_SEESAW_TRACE"
  # experimental variants for an A/B (kernel.cuh's SNAPMLA_SEESAW_*; the producer and REFILL32
  # switches, settled in session 9, are built by hand when needed)
  "seesaw_trace_rowmath:-DSNAPMLA_SEESAW_FAST_ROWMATH=1"
  "seesaw_trace_widecombine:-DSNAPMLA_COMBINE_WIDE=1"
  "seesaw_trace_prefetch:-DSNAPMLA_SEESAW_PREFETCH_MAPS=1"
  "seesaw_trace_pvdeep:-DSNAPMLA_SEESAW_PV_DEEP=1"
  "seesaw_trace_pvdepth3:-DSNAPMLA_SEESAW_PV_DEPTH=3"
  "seesaw_trace_pdl:-DSNAPMLA_PDL=1"
  # every staged kernel switch at once (their compound, at every shape); not SNAPMLA_PDL, whose
  # back-to-back launches would overlap in the "kernel alone" loop (seesaw_trace_pdl: compare
  # its "kernel + combine" line only)
  "seesaw_trace_all:-DSNAPMLA_SEESAW_FAST_ROWMATH=1 -DSNAPMLA_SEESAW_PV_DEEP=1 -DSNAPMLA_SEESAW_PV_DEPTH=3 -DSNAPMLA_SEESAW_PREFETCH_MAPS=1 -DSNAPMLA_COMBINE_WIDE=1"
)
pids=()
for b in "${builds[@]}"; do
  name=${b%%:*} def=${b#*:}
  rm -f ".carry/bin/$name"
  "$NVCC" "${flags[@]}" $def "${src[@]}" -o ".carry/bin/$name" &
  pids+=($!)
done
fail=0
for pid in "${pids[@]}"; do wait "$pid" || fail=1; done
[ "$fail" = 0 ] || { echo "build_trace.sh: a build failed" >&2; exit 1; }
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
