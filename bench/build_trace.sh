#!/usr/bin/env bash
# Development machine: build bench/seesaw_trace.cu into .carry/bin for a GPU call, twice: the
# timing binary (seesaw_trace) and the per-CTA clock64 timeline (seesaw_timeline, compiled with
# -DSNAPMLA_SEESAW_TRACE). On the GPU machine:
#   .carry/bin/seesaw_trace 32 128 16384      # batch heads seqlen [q_len [min part cost]]
#   .carry/bin/seesaw_timeline 32 128 16384
#   .carry/bin/seesaw_timeline_nostores 1 128 1024    # the timeline without the epilogue's stores
#   .carry/bin/seesaw_trace_slowrowmath 32 128 16384  # SNAPMLA_SEESAW_FAST_ROWMATH=0 (the IEEE form)
#   .carry/bin/seesaw_trace_narrowcombine 1 128 8192  # the one-warp-per-row combine everywhere
#                                                     # ("kernel + combine" is the line to compare)
#   .carry/bin/seesaw_trace_pvdeep2 128 16 16384      # SNAPMLA_SEESAW_PV_DEEP=2 (N = 16 too)
#   .carry/bin/seesaw_trace_pdl 1 128 1024            # SNAPMLA_PDL=1, session 11's form
#   .carry/bin/seesaw_trace_fusedq 1 128 1024         # the fused Q at every width ("decode call")
#   .carry/bin/seesaw_trace_nopvdirect 32 128 16384   # SNAPMLA_SEESAW_PV_DIRECT=0 (N = 64: the
#                                                     # promoted PV everywhere)
#   .carry/bin/seesaw_trace_pvdirect2 16 128 131072   # =2: PV into O^T at every N = 64 call
#   .carry/bin/seesaw_trace_nopdl 1 128 1024         # SNAPMLA_PDL=0 ("decode call")
#   .carry/bin/seesaw_trace_base 1 128 8192           # SNAPMLA_TRACE_BASE=<commit>: seesaw_trace
#                                                     # of that commit, for a same-call A/B
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p .carry/bin
# SNAPMLA_TRACE_BASE: its worktree first (a bad commit fails here, before any build starts),
# removed on any exit.
rm -f .carry/bin/seesaw_trace_base .carry/bin/BASE_COMMIT
base_tree=""
if [ -n "${SNAPMLA_TRACE_BASE:-}" ]; then
  git rev-parse --verify -q "$SNAPMLA_TRACE_BASE^{commit}" >/dev/null || {
    echo "build_trace.sh: SNAPMLA_TRACE_BASE=$SNAPMLA_TRACE_BASE is not a commit" >&2; exit 1; }
  base_tree=$(mktemp -d "${TMPDIR:-/tmp}/snapmla-base.XXXXXX")
  trap 'git worktree remove --force "$base_tree" 2>/dev/null; rm -rf "$base_tree"' EXIT
  git worktree add -q --detach "$base_tree" "$SNAPMLA_TRACE_BASE"
fi
src=(bench/seesaw_trace.cu cpp/decode/plan.cu cpp/decode/combine.cu cpp/decode/seesaw/launch.cu
     cpp/decode/seesaw/instantiations/n16.cu cpp/decode/seesaw/instantiations/n32.cu
     cpp/decode/seesaw/instantiations/n64.cu cpp/decode/seesaw/instantiations/n64_direct.cu
     cpp/decode/seesaw/instantiations/n64_scaled.cu
     cpp/decode/seesaw/instantiations/n64_roles.cu
     cpp/decode/seesaw/instantiations/n16_two_term.cu
     cpp/decode/seesaw/instantiations/n32_two_term.cu cpp/quantize/quantize_q.cu)
flags=(-gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -Iinclude)
# Every binary in parallel; a failed build stops the script (and leaves no stale binary).
builds=(
  "seesaw_trace:"
  "seesaw_timeline:-DSNAPMLA_SEESAW_TRACE"
  # experimental variants for an A/B (kernel.cuh's SNAPMLA_SEESAW_*; the producer and REFILL32
  # switches, settled in session 9, are built by hand when needed)
  # what the epilogue's stores cost (timing only: the results are wrong)
  "seesaw_timeline_nostores:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_TRACE_NO_EPILOGUE_STORES"
  # the defaults' alternatives (settled on the H200 in session 11; kept to re-check)
  "seesaw_trace_slowrowmath:-DSNAPMLA_SEESAW_FAST_ROWMATH=0"
  "seesaw_trace_narrowcombine:-DSNAPMLA_COMBINE_GROUPED=0 -DSNAPMLA_COMBINE_WIDE_MAX_ROWS=0"
  # the part's request range read after the plan header's check (the default reads it with the
  # header since session 19)
  "seesaw_trace_planahead0:-DSNAPMLA_SEESAW_PLAN_AHEAD=0"
  "seesaw_timeline_planahead0:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_PLAN_AHEAD=0"
  # the softmax against the block's own row maximum (SNAPMLA_SEESAW_LOCAL_MAX, experimental,
  # off; session 21: passes, time level)
  "seesaw_trace_localmax:-DSNAPMLA_SEESAW_LOCAL_MAX=1"
  # the whole QK in one fp32 accumulator (SNAPMLA_SEESAW_QK_ONE_ACC, experimental, off;
  # session 21: its accuracy, for the two-owner / four-PV-warpgroup schedule)
  "seesaw_trace_oneacc:-DSNAPMLA_SEESAW_QK_ONE_ACC=1"
  # the wide combine where the grouped one runs (the default before session 19)
  "seesaw_trace_widecombine:-DSNAPMLA_COMBINE_GROUPED=0"
  "seesaw_trace_pvdeep2:-DSNAPMLA_SEESAW_PV_DEEP=2"
  # the scaled PV (config.h's SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN, long chains since session 32)
  # at every N = 64 call, and nowhere
  "seesaw_trace_scaled0:-DSNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN=0"
  "seesaw_trace_noscaled:-DSNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN=-1"
  "seesaw_timeline_scaled0:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN=0"
  # staged switches (off by default)
  # SNAPMLA_PDL: its back-to-back launches overlap in the "kernel alone" loop; compare its
  # "kernel + combine" line only
  "seesaw_trace_pdl:-DSNAPMLA_PDL=1"
  "seesaw_trace_nopvdirect:-DSNAPMLA_SEESAW_PV_DIRECT=0"
  "seesaw_trace_pvdirect2:-DSNAPMLA_SEESAW_PV_DIRECT=2"
  "seesaw_timeline_nopvdirect:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_PV_DIRECT=0"
  # the fused Q (default where s_q x heads <= 32) nowhere, and at every width
  "seesaw_trace_nofusedq:-DSNAPMLA_SEESAW_FUSED_Q=0"
  "seesaw_trace_fusedq:-DSNAPMLA_SEESAW_FUSED_Q=2"
  "seesaw_timeline_fusedq:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_FUSED_Q=2"
  # PDL off (the default is 2: the attention kernel waits at its first read of the Q-quant
  # kernel's output)
  "seesaw_trace_nopdl:-DSNAPMLA_PDL=0"
  # the producer's empty-stage wait spinning (the default suspends: try_wait's time hint)
  "seesaw_trace_pspin:-DSNAPMLA_SEESAW_PRODUCER_SUSPEND=0"
  # N = 64's promoted PV in whole-N groups where every row sees the block whole
  "seesaw_trace_halfn:-DSNAPMLA_SEESAW_PV_WHOLE=0"
  "seesaw_timeline_halfn:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_PV_WHOLE=0"
  # the Q tile after all four first pages (the order before session 18; compare "decode call":
  # the kernel-alone lines have no Q-quant kernel to wait for)
  "seesaw_trace_pbq4:-DSNAPMLA_SEESAW_PAGES_BEFORE_Q=4"
  # the split partials in fp32 (the format before session 32; segment.cuh's SNAPMLA_PARTIAL_F16)
  "seesaw_trace_p32:-DSNAPMLA_PARTIAL_F16=0"
  "seesaw_timeline_p32:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_PARTIAL_F16=0"
  "seesaw_timeline_pbq4:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_PAGES_BEFORE_Q=4"
  # the KV pages' loads without the L2 evict-first policy (the default since session 19;
  # compare "kernel + combine")
  "seesaw_trace_kvef0:-DSNAPMLA_SEESAW_KV_EVICT_FIRST=0"
  # the tensor maps not prefetched at entry (the default prefetches them since session 19)
  "seesaw_trace_maps0:-DSNAPMLA_SEESAW_PREFETCH_MAPS=0"
  # the consumers' start after every first page's loads are issued (the default since session
  # 19: after the Q's)
  "seesaw_trace_early0:-DSNAPMLA_SEESAW_EARLY_START=0"
  "seesaw_timeline_early0:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_EARLY_START=0"
  # the combine's launch from the CTAs' end and its plan words after its wait (the defaults
  # before session 22: SNAPMLA_SEESAW_EARLY_TRIGGER=0, SNAPMLA_COMBINE_PLAN_FIRST=0)
  "seesaw_trace_trig0_cplan0:-DSNAPMLA_SEESAW_EARLY_TRIGGER=0 -DSNAPMLA_COMBINE_PLAN_FIRST=0"
  "seesaw_trace_roles:-DSNAPMLA_SEESAW_ROLES=1"
  "seesaw_timeline_roles:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_ROLES=1"
  "seesaw_trace_roles64:-DSNAPMLA_SEESAW_ROLES=1 -DSNAPMLA_SEESAW_ROLES_S_REGS=64"
  "seesaw_trace_roles_lmax:-DSNAPMLA_SEESAW_ROLES=1 -DSNAPMLA_SEESAW_ROLES_LOCAL_MAX=1"
  "seesaw_timeline_roles_lmax:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_ROLES=1 -DSNAPMLA_SEESAW_ROLES_LOCAL_MAX=1"
  "seesaw_trace_roles_halves:-DSNAPMLA_SEESAW_ROLES=1 -DSNAPMLA_SEESAW_ROLES_LOCAL_MAX=1 -DSNAPMLA_SEESAW_ROLES_PV_HALVES=1"
  "seesaw_trace_roles_ahead:-DSNAPMLA_SEESAW_ROLES=1 -DSNAPMLA_SEESAW_ROLES_LOCAL_MAX=1 -DSNAPMLA_SEESAW_ROLES_QK_AHEAD=1"
  # the role-split kernel on pairs of pages, one S warpgroup (SNAPMLA_SEESAW_ROLES_PAIR=2,
  # session 27)
  "seesaw_trace_pair2:-DSNAPMLA_SEESAW_ROLES=1 -DSNAPMLA_SEESAW_ROLES_PAIR=2"
  "seesaw_timeline_pair2:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_ROLES=1 -DSNAPMLA_SEESAW_ROLES_PAIR=2"
  # the two-term layout's first pages all under the Q tile (SNAPMLA_SEESAW_Q_FIRST=0, the
  # default before session 35); gpu_session.sh's two-term-decomp stage takes
  # DECOMP_VARIANTS="seesaw_trace seesaw_trace_noqfirst"
  "seesaw_trace_noqfirst:-DSNAPMLA_SEESAW_Q_FIRST=0"
  "seesaw_timeline_noqfirst:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_Q_FIRST=0"
  # the N = 64 skeleton (timing only: no softmax arithmetic, and no promotion; session 39)
  "seesaw_timeline_ns:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_BENCH_NO_SOFTMAX=1"
  "seesaw_timeline_ns2:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_BENCH_NO_SOFTMAX=1 -DSNAPMLA_SEESAW_BENCH_PV=2"
  "seesaw_timeline_pv2:-DSNAPMLA_SEESAW_TRACE -DSNAPMLA_SEESAW_BENCH_PV=2"
)
# SNAPMLA_TRACE_ONLY="name name ...": only these of the list (a call that needs a few).
if [ -n "${SNAPMLA_TRACE_ONLY:-}" ]; then
  kept=()
  for b in "${builds[@]}"; do
    case " $SNAPMLA_TRACE_ONLY " in *" ${b%%:*} "*) kept+=("$b") ;; esac
  done
  builds=("${kept[@]}")
fi
pids=()
for b in "${builds[@]}"; do
  name=${b%%:*} def=${b#*:}
  rm -f ".carry/bin/$name"
  "$NVCC" "${flags[@]}" $def "${src[@]}" -o ".carry/bin/$name" &
  pids+=($!)
done
# Issue 9's probe of the FP8 wgmma's QK accumulation (gpu_session.sh's probe stage).
if [ -z "${SNAPMLA_TRACE_ONLY:-}" ] || [[ " $SNAPMLA_TRACE_ONLY " == *" qgmma_probe "* ]]; then
  rm -f .carry/bin/qgmma_probe
  "$NVCC" "${flags[@]}" bench/qgmma_probe.cu -o .carry/bin/qgmma_probe &
  pids+=($!)
fi
# Issue 7's PV forms measured alone (bench/pv_rate.cu; run .carry/bin/pv_rate on the GPU).
if [ -z "${SNAPMLA_TRACE_ONLY:-}" ] || [[ " $SNAPMLA_TRACE_ONLY " == *" pv_rate "* ]]; then
  rm -f .carry/bin/pv_rate
  "$NVCC" "${flags[@]}" bench/pv_rate.cu -o .carry/bin/pv_rate &
  pids+=($!)
fi
# SNAPMLA_TRACE_BASE: the timing binary of another commit (its own sources and source list),
# built in the worktree above, as seesaw_trace_base.
if [ -n "$base_tree" ]; then
  (
    cd "$base_tree"
    base_src=$(sed -n '/^src=(/,/)$/p' bench/build_trace.sh)
    [ -n "$base_src" ] || { echo "build_trace.sh: no src=( list at the base" >&2; exit 1; }
    eval "$base_src"
    "$NVCC" "${flags[@]}" "${src[@]}" -o "$OLDPWD/.carry/bin/seesaw_trace_base"
  ) &
  pids+=($!)
fi
fail=0
for pid in "${pids[@]}"; do wait "$pid" || fail=1; done
[ "$fail" = 0 ] || { echo "build_trace.sh: a build failed" >&2; exit 1; }
[ -z "$base_tree" ] || git rev-parse --short "$SNAPMLA_TRACE_BASE" > .carry/bin/BASE_COMMIT
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
