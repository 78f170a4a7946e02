#!/usr/bin/env bash
# One call on the GPU machine: install the carried wheels, then run the stages named on the
# command line in order, writing logs and results under $OUT (default /tmp/snapmla-out).
#
#   bash bench/gpu_session.sh [use:<name>] stage [stage ...]
#
# Stages:
#   use:<name>            install .carry/<name> (a wheel of bench/prepare_carry.sh <name>) for
#                         the stages after it; their logs carry -<name>. Without a first use:,
#                         .carry/dist is installed.
#   tests                 the whole pytest suite, GPU tests included
#   tests-decode          tests/gpu/test_decode.py (every kernel)
#   pytest-files          PYTEST_FILES: test files or node ids
#   frag                  the seesaw fragment-mapping unit test (tests/gpu/test_seesaw_fragments.py)
#   ctest                 the C example (examples/c) against the installed CMake package
#   multi-gpu             every visible GPU: tests/gpu/test_multi_gpu.py, the C example's
#                         --devices, bench_multi_gpu.py tp and dp --quick with one rank a GPU
#   sanitize              compute-sanitizer memcheck, racecheck, synccheck on tests/gpu/smoke.py
#                         (racecheck's records through bench/racecheck_triage.py)
#   sass                  SASS and resource usage of the library; tensor-core and spill counts
#   demo                  python3 -m snapmla.demo
#   bench, bench-quick    bench_decode.py (all cases) and bench_dataflow.py; bench-quick times
#                         0.05 s a kernel and case
#   bench-cases[:opts]    bench_decode.py --quick --cases "$BENCH_CASES", more options after the
#                         colon with '@' between them (bench-cases:--timing-s=3@--no-flashinfer)
#   bench-two-term        bench_decode.py --two-term at the s_q x h <= 32 cases and two others
#   accuracy[-f32out]     python3 -m snapmla.accuracy (-f32out: the kernels write fp32 output)
#   soak                  tests/gpu/soak.py: a serving loop against the reference kernel
#   host-c                the C API's host time per call (.carry/bin/host_overhead_c)
#   host-py               the Python API's host time per call (bench_host_overhead.py --real)
#   ncu                   Nsight Compute on the seesaw kernel, one launch per case
#   qgmma                 the FP8 wgmma's accumulation per chain length (.carry/bin/qgmma_probe)
#   power-floor           the power-limited floor (.carry/bin/power_probe) at the 128-head shares
#   dsmem                 one exchange between a cluster's two CTAs (.carry/bin/dsmem_probe)
#   dump-save, dump-compare  decode outputs of this build saved, or compared bit for bit with
#                         those saved earlier in the call (an A/B of two builds: use:<name>)
#
# Carried (ignored) folders it expects: .whl (cffi, pycparser, flashinfer, tvm-ffi wheels:
# bench/fetch_wheels.sh) and .carry/dist (the snapmla wheel and its COMMIT:
# bench/prepare_carry.sh); .carry/bin for host-c, qgmma and power-floor (bench/build_bins.sh).
set -uo pipefail
FINAL=${OUT:-/tmp/snapmla-out}  # what comes back: a few results and one log archive
OUT=/tmp/snapmla-work
rm -rf "$OUT"  # a machine still warm from the previous call keeps its files
mkdir -p "$OUT" "$FINAL"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
log() { echo "=== $(date +%T) $*" | tee -a "$OUT/session.log"; }

# The wheels: the carried dependencies once, then snapmla from .carry/<name> (re-run by `use:`).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv \
  | tee "$OUT/gpu.txt"
TAG=""  # log-name suffix of the build in use ("" for .carry/dist)
use_build() {
  local name=$1 dir=.carry/$1
  [ -f "$dir/COMMIT" ] || { echo "no $dir/COMMIT (bench/prepare_carry.sh $name)"; return 1; }
  export SNAPMLA_COMMIT=$(cat "$dir/COMMIT")
  log "install snapmla from $dir (commit $SNAPMLA_COMMIT)"
  rm -rf /tmp/site/snapmla /tmp/site/snapmla-*.dist-info
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$dir"/snapmla-*.whl >>"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; return 1; }
  python3 -c "import snapmla; print('snapmla', snapmla.version(), snapmla.__file__)" || return 1
  TAG=""; [ "$name" = dist ] || TAG="-$name"
  # the softmax source the wheel was built from (older carried wheels lack it: the tree's)
  SOFTMAX_SRC=cpp/decode/sm90/softmax.cuh
  if [ -f "$dir/softmax.cuh" ]; then SOFTMAX_SRC=$dir/softmax.cuh; fi
}
case "${1:-}" in use:*) ;; *) use_build dist || exit 1 ;; esac

# What comes back (the device tool returns at most 8 files): at most 7 result files, and one
# archive of every log and result, refreshed after each stage so that a call cut short by the
# device-time budget still returns them. A file of the caller's own in $FINAL that matches none
# of these names is left alone.
PUBLISHED=('decode*.json' 'dataflow*.json' 'multi-gpu*.json' 'accuracy*.json' 'host-overhead-real*.json'
           'host-c*.log' 'sanitize*.log' 'soak*.log' 'power-floor*.log' qgmma.log dsmem.log
           ncu-per-block.txt 'ncu-*.txt' 'ncu-sass-*.csv.gz')
publish() {
  local f g n=0
  # this call's earlier copies first: a result that sorts later must not leave one behind
  for g in "${PUBLISHED[@]}"; do rm -f "$FINAL"/$g; done
  for f in $(for g in "${PUBLISHED[@]}"; do ls "$OUT"/$g 2>/dev/null; done | sort); do
    [ "$n" -lt 7 ] || break
    cp "$f" "$FINAL/" && n=$((n + 1))
  done
  # written aside and moved: a call killed mid-tar keeps the previous archive
  tar -czf "$FINAL/.logs.tgz.tmp" -C "$OUT" --exclude='sass*.txt' --exclude='*.ncu-rep' \
    --exclude='src.csv' . && mv "$FINAL/.logs.tgz.tmp" "$FINAL/logs.tgz"
}

# $OUT/<base>.json's name, or <base>-2, -3 ... where an earlier run of the call took it.
unused_name() {
  local name=$1 k=1
  while [ -e "$OUT/$name.json" ]; do k=$((k + 1)); name=$1-$k; done
  echo "$name"
}

# pytest_stage LOG TIMEOUT ARGS...: pytest on the GPU machine, its output in $OUT/LOG.
pytest_stage() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m pytest -q -rfEs -p no:cacheprovider "$@" 2>&1 \
    | tee "$OUT/$name" | tail -40 || status=1
}

status=0
for stage in "$@"; do
  case "$stage" in
    use:*)
      use_build "${stage#use:}" || { status=1; break; }
      ;;
    tests)
      log "pytest (all tests, GPU included)"
      pytest_stage "pytest$TAG.log" 420 tests --junitxml="$OUT/junit$TAG.xml" --tb=line
      ;;
    tests-decode)
      log "pytest tests/gpu/test_decode.py (every kernel)"
      pytest_stage "pytest-decode$TAG.log" 400 tests/gpu/test_decode.py --tb=line
      ;;
    pytest-files)
      log "pytest ${PYTEST_FILES:-}"
      pytest_stage "pytest-files$TAG.log" 400 ${PYTEST_FILES:?PYTEST_FILES} --tb=short
      ;;
    frag)
      log "seesaw fragment mapping (tests/gpu/test_seesaw_fragments.py)"
      pytest_stage "frag$TAG.log" 120 -s tests/gpu/test_seesaw_fragments.py --tb=short
      ;;
    ctest)
      log "C example against the installed CMake package"
      cmake -S examples/c -B /tmp/build-c -G Ninja \
        -DCMAKE_PREFIX_PATH="$(python3 -m snapmla --cmake-dir)" >"$OUT/ctest$TAG.log" 2>&1 &&
        cmake --build /tmp/build-c >>"$OUT/ctest$TAG.log" 2>&1 &&
        /tmp/build-c/snapmla_c_example --gpu 2>&1 | tee -a "$OUT/ctest$TAG.log" || status=1
      ;;
    multi-gpu)  # NCCL without NVLink multicast (NVLS): the launch needs no fabric manager setup
      ngpu=$(nvidia-smi -L | wc -l)
      log "multi-GPU tests on $ngpu GPUs (tests/gpu/test_multi_gpu.py)"
      pytest_stage "multi-gpu-tests$TAG.log" 400 tests/gpu/test_multi_gpu.py --tb=short
      log "C example --devices"
      cmake -S examples/c -B /tmp/build-c -G Ninja \
        -DCMAKE_PREFIX_PATH="$(python3 -m snapmla --cmake-dir)" >"$OUT/multi-gpu-c$TAG.log" 2>&1 &&
        cmake --build /tmp/build-c >>"$OUT/multi-gpu-c$TAG.log" 2>&1 &&
        /tmp/build-c/snapmla_c_example --devices 2>&1 | tee -a "$OUT/multi-gpu-c$TAG.log" || status=1
      log "bench_multi_gpu.py tp and dp --quick, $ngpu ranks (torchrun)"
      NCCL_NVLS_ENABLE=0 timeout 400 python3 -m torch.distributed.run --standalone \
        --nproc-per-node "$ngpu" bench/bench_multi_gpu.py both --quick \
        --out "$OUT/multi-gpu$TAG.json" 2>&1 | tee "$OUT/bench-multi-gpu$TAG.log" | tail -30 \
        || status=1
      ;;
    sanitize)  # the three tools' output one after the other in sanitize.log
      rm -f "$OUT/sanitize$TAG.log"
      for tool in memcheck racecheck synccheck; do
        log "compute-sanitizer $tool"
        timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 --target-processes all \
          python3 tests/gpu/smoke.py >"$OUT/sanitize-tool.log" 2>&1
        rc=$?
        { echo "### compute-sanitizer --tool $tool: exit $rc"; cat "$OUT/sanitize-tool.log"; } \
          >>"$OUT/sanitize$TAG.log"
        echo "$tool exit $rc" | tee -a "$OUT/session.log"
        if [ "$tool" = racecheck ] && [ "$rc" = 9 ]; then
          # racecheck does not model the row statistics' bar.arrive handoff: those records
          # pass, any other fails (bench/racecheck_triage.py says why)
          python3 bench/racecheck_triage.py --source "$SOFTMAX_SRC" "$OUT/sanitize-tool.log" \
            | tee -a "$OUT/sanitize$TAG.log" "$OUT/session.log"
          rc=${PIPESTATUS[0]}
        fi
        [ "$rc" = 0 ] || status=1
        tail -5 "$OUT/sanitize-tool.log"
      done
      rm -f "$OUT/sanitize-tool.log"
      ;;
    sass)
      log "SASS and resource usage"
      lib=$(python3 -c "import snapmla._lib as l; print(l.library_path())")
      cuobjdump --dump-sass "$lib" >"$OUT/sass$TAG.txt" 2>&1
      cuobjdump --dump-resource-usage "$lib" >"$OUT/resource-usage$TAG.txt" 2>&1
      # per kernel: tensor-core instructions and local-memory traffic (spills)
      awk '/Function :/ {f = $3} /QGMMA|HGMMA|HMMA|LDL|STL/ {
             for (i = 1; i <= NF; i++) if ($i ~ /^(QGMMA|HGMMA|HMMA|LDL|STL)/) {
               split($i, op, "."); c[f " " op[1]]++ } }
           END { for (k in c) print k, c[k] }' "$OUT/sass$TAG.txt" | sort | tee "$OUT/sass-summary$TAG.txt"
      ;;
    demo)
      log "demo (the README's main job)"
      timeout 240 python3 -m snapmla.demo 2>&1 | tee "$OUT/demo$TAG.log" || status=1
      ;;
    bench | bench-quick)
      quick=""; [ "$stage" = bench-quick ] && quick="--quick"
      log "decode benchmark $quick"
      timeout 420 python3 bench/bench_decode.py $quick --out "$OUT/decode$TAG.json" 2>&1 \
        | tee "$OUT/bench-decode$TAG.log" | tail -45 || status=1
      log "data-movement benchmark"
      timeout 240 python3 bench/bench_dataflow.py $quick --out "$OUT/dataflow$TAG.json" 2>&1 \
        | tee "$OUT/bench-dataflow$TAG.log" | tail -15 || status=1
      python3 bench/roofline.py "$OUT/decode$TAG.json" --out "$OUT/roofline$TAG.png" >/dev/null 2>&1 || true
      ;;
    bench-cases | bench-cases:*)
      extra=${stage#bench-cases}; extra=${extra#:}; extra=${extra//@/ }
      log "decode benchmark, cases ${BENCH_CASES:-} ${extra}"
      name=$(unused_name "decode-cases$TAG")
      timeout 300 python3 bench/bench_decode.py --quick --cases "${BENCH_CASES:?BENCH_CASES}" \
        $extra --out "$OUT/$name.json" 2>&1 | tee "$OUT/bench-cases${name#decode-cases}.log" | tail -30 \
        || status=1
      ;;
    bench-two-term)  # TWO_TERM_CASES replaces the cases
      log "decode benchmark with the two-term query (fp8x2) next to the one-term query"
      name=$(unused_name "decode-two-term$TAG")
      timeout 300 python3 bench/bench_decode.py --two-term --no-flashinfer --quick \
        --cases "${TWO_TERM_CASES:-*x1x16x*,*x2x16x*,32x1x32x32768,1x1x128x8192,32x1x128x16384}" \
        --out "$OUT/$name.json" 2>&1 | tee "$OUT/bench-two-term${name#decode-two-term}.log" \
        | tail -30 || status=1
      ;;
    accuracy | accuracy-f32out)
      extra=(); sfx=$TAG
      [ "$stage" = accuracy-f32out ] && { extra=(--out-dtype float32); sfx="-f32out$TAG"; }
      log "accuracy study ${extra[*]}"
      timeout 420 python3 -m snapmla.accuracy "${extra[@]}" --out "$OUT/accuracy$sfx.json" \
        --figure "$OUT/accuracy$sfx.png" 2>&1 | tee "$OUT/accuracy$sfx.log" | tail -30 || status=1
      ;;
    soak)
      log "soak: a serving loop of graph replays against the reference kernel"
      timeout 300 python3 tests/gpu/soak.py 2>&1 | tee "$OUT/soak$TAG.log" | tail -8 || status=1
      ;;
    host-c)  # .carry/bin/host_overhead_c: bench/build_bins.sh builds it
      log "host time of the C API's calls (bench/host_overhead_c.cu)"
      # built against a CMake build (soname libsnapmla.so.0); the wheel's file is libsnapmla.so
      mkdir -p /tmp/host-c-lib && ln -sf /tmp/site/snapmla/lib/libsnapmla.so /tmp/host-c-lib/libsnapmla.so.0
      for h in ${HOST_C_HEADS:-128}; do  # e.g. HOST_C_HEADS="128 16"
        for b in 1 64; do
          LD_LIBRARY_PATH=/tmp/host-c-lib timeout 120 .carry/bin/host_overhead_c $b $h 2000 2>&1 \
            | tee -a "$OUT/host-c$TAG.log" || status=1
        done
      done
      ;;
    host-py)
      log "host time of the Python calls (bench/bench_host_overhead.py --real)"
      timeout 300 python3 bench/bench_host_overhead.py --real --batch 1,64 --iters 1000 \
        --out "$OUT/host-overhead-real$TAG.json" 2>&1 | tee "$OUT/host-py$TAG.log" | tail -30 \
        || status=1
      timeout 120 python3 bench/bench_host_overhead.py --real --profile decode --iters 1000 2>&1 \
        | tee "$OUT/host-profile-decode-real$TAG.txt" | tail -30 || status=1
      ;;
    ncu)  # NCU_CASES (default: one case of each N); NCU_SOURCE_CASE: the one with source counters
      per_block=()
      for c in ${NCU_CASES:-32x1x128x16384 128x1x16x16384 64x2x16x16384}; do  # N = 64, 16, 32
        log "ncu seesaw kernel $c"
        src=(); [ "$c" = "${NCU_SOURCE_CASE:-32x1x128x16384}" ] && src=(--section SourceCounters --export "$OUT/ncu-$c")
        timeout 240 ncu --clock-control none --target-processes all -k regex:^decode_kernel \
          --launch-skip 2 --launch-count 1 --section SpeedOfLight --section LaunchStats \
          --section Occupancy --section WarpStateStats --section SchedulerStats \
          --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
          --section InstructionStats --metrics smsp__inst_executed.sum "${src[@]}" \
          python3 bench/bench_decode.py --cases "$c" --kernel fast --no-flashinfer --no-graph \
          --no-ref --timing-s 0.001 >"$OUT/ncu-$c.txt" 2>&1 || status=1
        if [ -f "$OUT/ncu-$c.ncu-rep" ]; then  # an exported report prints nothing: read it back
          ncu --import "$OUT/ncu-$c.ncu-rep" --page details --print-details all \
            >>"$OUT/ncu-$c.txt" 2>&1
          ncu --import "$OUT/ncu-$c.ncu-rep" --page source --csv --print-source sass \
            >"$OUT/src.csv" 2>&1 && gzip -c "$OUT/src.csv" >"$OUT/ncu-sass-$c.csv.gz"
        fi
        grep -E "Duration|Throughput|Registers|Achieved Occupancy|Issue Slots Busy|No Eligible" \
          "$OUT/ncu-$c.txt" | head -20
        per_block+=("$c=$OUT/ncu-$c.txt")
        publish
      done
      python3 bench/probes/ncu_per_block.py "${per_block[@]}" | tee "$OUT/ncu-per-block.txt" || status=1
      ;;
    qgmma)  # .carry/bin/qgmma_probe: see bench/probes/qgmma_probe.cu
      log "FP8 wgmma accumulation (bench/probes/qgmma_probe.cu)"
      mkdir -p "$OUT/qgmma-probe"
      timeout 120 .carry/bin/qgmma_probe "$OUT/qgmma-probe" 4 2>&1 | tee -a "$OUT/qgmma.log" \
        && timeout 300 python3 bench/probes/qgmma_probe.py "$OUT/qgmma-probe" 2>&1 \
        | tee -a "$OUT/qgmma.log" || status=1
      ;;
    dsmem)  # .carry/bin/dsmem_probe: see bench/probes/dsmem_probe.cu
      log "cluster exchange latency (bench/probes/dsmem_probe.cu)"
      timeout 120 .carry/bin/dsmem_probe 20000 2>&1 | tee "$OUT/dsmem.log" || status=1
      ;;
    power-floor)  # .carry/bin/power_probe: see bench/probes/power_probe.cu
      # per SM: tile-blocks and pages of the 128-head cases' shares, the cache's kind of data
      log "power-limited floor (bench/probes/power_probe.cu, 3 s a run)"
      p=.carry/bin/power_probe
      if [ -x "$p" ]; then
        {
          echo "### 32x1x128x16384, 32x2x64x16384 (targets 130, 139 us): 124 tile-blocks, 62 pages"
          for mode in both all tensor; do
            SNAPMLA_PROBE_DATA=randn bash bench/sustained.sh "$mode" "$OUT" -- $p $mode 124 62 3
          done
          echo "### 64x1x128x32768, 16x1x128x131072 (514, 491): 496 tile-blocks, 248 pages"
          SNAPMLA_PROBE_DATA=randn bash bench/sustained.sh all-long "$OUT" -- $p all 496 248 3
          echo "### 32x2x128x16384 (243): 248 tile-blocks, 62 pages"
          SNAPMLA_PROBE_DATA=randn bash bench/sustained.sh all-mtp "$OUT" -- $p all 248 62 3
        } 2>&1 | tee "$OUT/power-floor$TAG.log" || status=1
      else
        echo "no $p (bench/probes/power_probe.cu)"; status=1
      fi
      ;;
    dump-save | dump-compare)
      log "decode outputs, ${stage#dump-} (bench/probes/dump_decode.py)"
      timeout 300 python3 bench/probes/dump_decode.py "--${stage#dump-}" /tmp/snapmla-dump.npz 2>&1 \
        | tee "$OUT/dump-${stage#dump-}$TAG.log" | tail -5 || status=1
      ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
  publish
done
log "done (status $status)"
publish && ls -la "$FINAL"
exit $status
