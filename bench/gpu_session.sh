#!/usr/bin/env bash
# One call on the lent GPU machine: install the carried wheels, then run the stages named on the
# command line, writing logs and JSON under $OUT (default /tmp/snapmla-out).
#
#   bash bench/gpu_session.sh [use:<name>] [tests] [tests-decode] [frag] [ctest] [sanitize] [sass]
#                             [demo] [bench] [bench-quick] [bench-fast] [accuracy] [diag] [ncu]
#                             [soak] [host-c] [host-py] [ab] [bench-two-term] [accuracy-f32out]
#                             [probe] [accuracy-layers] [bench-cases] [dump-save] [dump-compare]
#                             [qquant] [bench-cases:<options>] [pytest-files] [two-term-decomp]
#                             [use:<name>] [stage ...]
#
# Carried (ignored) folders it expects: .whl (cffi, pycparser, flashinfer, tvm-ffi wheels) and
# .carry/dist (the snapmla wheel and its COMMIT, from bench/prepare_carry.sh). `use:<name>`
# installs .carry/<name> instead (another wheel of bench/prepare_carry.sh <name>, for example an
# experimental build) for the stages after it, so that one call tests several builds; each
# stage's logs then carry the name (pytest-<name>.log ...).
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
}
# The default build, unless the first stage picks another (use:<name>).
case "${1:-}" in use:*) ;; *) use_build dist || exit 1 ;; esac

# What comes back (the device tool returns at most 8 files): the result files, at most 7 of them
# (every stage writes under $OUT; publish picks), and one archive of every log and result,
# refreshed after each stage so that a call cut short by the device-time budget still returns
# them.
# The names publish copies (globs relative to a folder). A call script's own files in $FINAL
# that match none of them (a summary of its own, say) are left alone.
PUBLISHED=(ab.log 'host-c*.log' 'host-overhead-real*.json' qgmma-probe.log two-term-decomp.log
           'decode*.json' 'dataflow*.json' 'accuracy*.json' ncu-per-block.txt diag.log
           'ncu-*.txt' 'ncu-sass-*.csv.gz')
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

# $OUT/<base>.json's name, or <base>-2, -3 ... where an earlier run of the call took it (a
# build's second run in an A/B/A keeps the first's files).
unused_name() {
  local name=$1 k=1
  while [ -e "$OUT/$name.json" ]; do k=$((k + 1)); name=$1-$k; done
  echo "$name"
}

# The two-term query's lines (SNAPMLA_TRACE_TWO_TERM=1) of bench/seesaw_trace.cu binaries:
# two_term_trace LOG "binary ..." "b h s" ...; each case and .carry/bin binary (one not built is
# skipped) appended to LOG under a "### <binary> two-term <case>" header.
two_term_trace() {
  local log=$1 variants=$2 c v
  shift 2
  for c in "$@"; do
    for v in $variants; do
      [ -x ".carry/bin/$v" ] || continue
      echo "### $v two-term $c" >>"$log"
      SNAPMLA_TRACE_TWO_TERM=1 timeout 60 ".carry/bin/$v" $c 2>&1 \
        | grep -E "^(kernel|batch|decode call|two-term)|error|CHECK|\.cu:" >>"$log" || status=1
    done
  done
}

status=0
for stage in "$@"; do
  case "$stage" in
    use:*)
      use_build "${stage#use:}" || { status=1; break; }
      ;;
    tests)
      log "pytest (all tests, GPU included)"
      timeout 420 python3 -m pytest -q -rfEs -p no:cacheprovider tests --junitxml="$OUT/junit$TAG.xml" --tb=line \
        2>&1 | tee "$OUT/pytest$TAG.log" | tail -40 || status=1
      ;;
    tests-decode)
      log "pytest tests/gpu/test_decode.py (every kernel)"
      timeout 400 python3 -m pytest -q -rfEs -p no:cacheprovider tests/gpu/test_decode.py --tb=line \
        2>&1 | tee "$OUT/pytest-decode$TAG.log" | tail -40 || status=1
      ;;
    accuracy-layers)  # the contract's point 3 on the workload layers (128 and 16 heads)
      log "pytest tests/gpu/test_accuracy_layers_gpu.py"
      timeout 300 python3 -m pytest -q -s -rfEs -p no:cacheprovider \
        tests/gpu/test_accuracy_layers_gpu.py --tb=short 2>&1 \
        | tee "$OUT/pytest-accuracy-layers$TAG.log" | tail -20 || status=1
      ;;
    bench-cases|bench-cases:*)  # BENCH_CASES (bench_decode.py --cases), short timing, next to
      # FlashInfer; after the colon more bench_decode.py options, '@' between them (e.g.
      # bench-cases:--page-stride=41984 or bench-cases:--two-term@--two-term-rounds=3; a
      # --cases=... there replaces BENCH_CASES)
      extra=${stage#bench-cases}; extra=${extra#:}; extra=${extra//@/ }
      log "decode benchmark, cases ${BENCH_CASES:-} ${extra}"
      name=$(unused_name "decode-cases$TAG")
      timeout 300 python3 bench/bench_decode.py --quick --cases "${BENCH_CASES:?BENCH_CASES}" \
        $extra --out "$OUT/$name.json" 2>&1 | tee "$OUT/bench-cases${name#decode-cases}.log" | tail -30 \
        || status=1
      ;;
    pytest-files)  # PYTEST_FILES: test files or node ids, e.g. the one a change touched
      log "pytest ${PYTEST_FILES:-}"
      timeout 400 python3 -m pytest -q -rfEs -p no:cacheprovider ${PYTEST_FILES:?PYTEST_FILES} \
        --tb=short 2>&1 | tee "$OUT/pytest-files$TAG.log" | tail -20 || status=1
      ;;
    frag)
      log "seesaw fragment mapping (tests/cuda/seesaw_fragments.cu)"
      timeout 120 python3 -m pytest -q -s -rfE -p no:cacheprovider tests/gpu/test_seesaw_fragments.py \
        --tb=short 2>&1 | tee "$OUT/frag$TAG.log" | tail -12 || status=1
      ;;
    soak)
      log "soak: a serving loop of graph replays against the reference kernel"
      timeout 300 python3 tests/gpu/soak.py 2>&1 | tee "$OUT/soak$TAG.log" | tail -8 || status=1
      ;;
    ab)  # kernel-alone A/B of the variants bench/build_trace.sh builds, then three timelines
      log "A/B of the seesaw variants (.carry/bin, built by bench/build_trace.sh)"
      # Each variant at the shapes it is for (N = 16/32: 16 heads, or 32 rows; short contexts).
      all="32x128x16384 128x16x16384 128x16x16384x2 64x16x4096x2 32x32x32768 1x128x8192
        1x128x1024 8x128x4096 1x16x8192 128x16x16384x4"
      n16="128x16x16384 1x16x8192 64x16x4096"
      short="1x128x8192 1x128x1024 8x128x4096 1x16x8192 128x16x16384"
      n64="32x128x16384 1x128x8192 8x128x4096 128x16x16384x4"
      # seesaw_trace_base: another commit's (build_trace.sh's SNAPMLA_TRACE_BASE), when built.
      # AB_VARIANTS="name:case,case name:case ..." (cases as below, "all", "n64" ...) replaces
      # the list, and AB_TIMELINES="name:b h s[:b h s] ..." the timelines: a call's own A/B.
      variants=("seesaw_trace:$all" "seesaw_trace_base:$all"
        "seesaw_trace_fusedq:$all" "seesaw_trace_nofusedq:$all"
        "seesaw_trace_pvdeep2:$n16" "seesaw_trace_halfn:$n64"
        "seesaw_trace_narrowcombine:$short"
        "seesaw_trace_pdl:$short" "seesaw_trace_nopvdirect:$n64" "seesaw_trace_pvdirect2:$n64")
      if [ -n "${AB_VARIANTS:-}" ]; then
        variants=()
        for vc in $AB_VARIANTS; do
          cs=${vc#*:}; cs=${cs//,/ }
          cs=${cs//all/$all}; cs=${cs//n16/$n16}; cs=${cs//short/$short}; cs=${cs//n64/$n64}
          variants+=("${vc%%:*}:$cs")
        done
      fi
      for vc in "${variants[@]}"; do
        v=${vc%%:*}
        [ -x ".carry/bin/$v" ] || continue
        for c in ${vc#*:}; do
          echo "### $v ${c//x/ }" >>"$OUT/ab.log"
          timeout 60 ".carry/bin/$v" ${c//x/ } 2>&1 \
            | grep -E "^(kernel|batch|decode call)|error|CHECK|\.cu:" >>"$OUT/ab.log" || status=1
        done
        publish  # what ran comes back even if the call is cut short
      done
      # the two-term query (issue 9) against the one-term lines above, where s_q x h <= 32
      tt=()
      for c in ${AB_TWO_TERM_CASES:-128x16x16384 1x16x8192 64x16x4096x2 32x32x32768}; do
        tt+=("${c//x/ }")
      done
      two_term_trace "$OUT/ab.log" "seesaw_trace seesaw_trace_base" "${tt[@]}"
      timelines=()
      for c in "32 128 16384" "1 128 1024" "1 128 8192" "128 16 16384"; do
        for v in seesaw_timeline seesaw_timeline_nostores seesaw_timeline_fusedq \
          seesaw_timeline_nopvdirect; do
          timelines+=("$v:$c")
        done
      done
      if [ -n "${AB_TIMELINES:-}" ]; then
        timelines=()
        for vc in $AB_TIMELINES; do  # name:b h s[:b h s], spaces within a shape as '_'
          rest=${vc#*:}
          IFS=':' read -ra shapes <<<"$rest"
          for c in "${shapes[@]}"; do timelines+=("${vc%%:*}:${c//_/ }"); done
        done
      fi
      for vc in "${timelines[@]}"; do
        v=${vc%%:*} c=${vc#*:}
        [ -x ".carry/bin/$v" ] || continue
        echo "### $v $c" >>"$OUT/ab.log"
        # every recorded event (a block line without events is left out)
        timeout 60 ".carry/bin/$v" $c 2>&1 | grep -v ': *$' >>"$OUT/ab.log" || status=1
      done
      grep -A3 "^###" "$OUT/ab.log" | grep -E "^###|^kernel" | head -100
      ;;
    host-py)  # issue 10: the Python API's host time per call (generic and snapmla.torch), real
      log "host time of the Python calls (bench/bench_host_overhead.py --real)"
      timeout 300 python3 bench/bench_host_overhead.py --real --batch 1,64 --iters 1000 \
        --out "$OUT/host-overhead-real$TAG.json" 2>&1 | tee "$OUT/host-py$TAG.log" | tail -30 \
        || status=1
      timeout 120 python3 bench/bench_host_overhead.py --real --profile decode --iters 1000 2>&1 \
        | tee "$OUT/host-profile-decode-real$TAG.txt" | tail -30 || status=1
      ;;
    host-c)  # needs .carry/bin/host_overhead_c (built by bench/build_trace.sh)
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
    probe)  # the FP8 wgmma's accumulation in QK and PV per chain length (bench/qgmma_probe.cu)
      log "FP8 wgmma probe (.carry/bin/qgmma_probe, built by bench/build_trace.sh)"
      mkdir -p "$OUT/qgmma-probe"
      timeout 120 .carry/bin/qgmma_probe "$OUT/qgmma-probe" 4 2>&1 \
        | tee -a "$OUT/qgmma-probe.log" \
        && timeout 300 python3 bench/qgmma_probe.py "$OUT/qgmma-probe" 2>&1 \
        | tee -a "$OUT/qgmma-probe.log" || status=1
      ;;
    ctest)
      log "C example against the installed CMake package"
      cmake -S examples/c -B /tmp/build-c -G Ninja \
        -DCMAKE_PREFIX_PATH="$(python3 -m snapmla --cmake-dir)" >"$OUT/ctest$TAG.log" 2>&1 &&
        cmake --build /tmp/build-c >>"$OUT/ctest$TAG.log" 2>&1 &&
        /tmp/build-c/snapmla_c_example --gpu 2>&1 | tee -a "$OUT/ctest$TAG.log" || status=1
      ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        log "compute-sanitizer $tool"
        timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 --target-processes all \
          python3 tests/gpu/smoke.py >"$OUT/sanitize-$tool$TAG.log" 2>&1
        rc=$?
        echo "$tool exit $rc" | tee -a "$OUT/session.log"
        [ "$rc" = 0 ] || status=1
        tail -5 "$OUT/sanitize-$tool$TAG.log"
      done
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
    bench | bench-quick)
      quick=""; [ "$stage" = bench-quick ] && quick="--quick"
      log "decode benchmark $quick"
      timeout 420 python3 bench/bench_decode.py $quick --out "$OUT/decode$TAG.json" 2>&1 \
        | tee "$OUT/bench-decode$TAG.log" | tail -45 || status=1
      log "data-movement benchmark"
      timeout 240 python3 bench/bench_dataflow.py $quick --out "$OUT/dataflow$TAG.json" 2>&1 \
        | tee "$OUT/bench-dataflow$TAG.log" | tail -15 || status=1
      python3 bench/roofline.py "$OUT/decode$TAG.json" "$OUT/roofline$TAG.png" >/dev/null 2>&1 || true
      ;;
    two-term-decomp)  # issue 9: where the two-term cost goes (seesaw_trace with
      # SNAPMLA_TRACE_TWO_TERM=1: alternating one / two-term decode calls and attention-alone
      # launches, and the mixed calls), for each .carry/bin binary in DECOMP_VARIANTS (default
      # seesaw_trace) at DECOMP_CASES ("b h s" separated by commas)
      log "two-term decomposition (.carry/bin: ${DECOMP_VARIANTS:-seesaw_trace})"
      for v in ${DECOMP_VARIANTS:-seesaw_trace}; do
        [ -x ".carry/bin/$v" ] || { echo "no .carry/bin/$v (bench/build_trace.sh)"; status=1; }
      done
      IFS=, read -r -a decomp_cases \
        <<<"${DECOMP_CASES:-8 16 4096,4 16 16384,16 16 4096,8 32 4096,1 16 8192,64 16 4096}"
      two_term_trace "$OUT/two-term-decomp.log" "${DECOMP_VARIANTS:-seesaw_trace}" \
        "${decomp_cases[@]}"
      grep -E "^###|alternating" "$OUT/two-term-decomp.log" | tail -24
      ;;
    qquant)  # issue 9: the Q-quant kernel alone, one and two terms (bench/time_qquant.py;
      # QQUANT_ROWS: its --rows)
      log "Q-quant kernel alone, one and two terms"
      timeout 120 python3 bench/time_qquant.py --rows "${QQUANT_ROWS:-1024,2048,4096}" 2>&1 \
        | tee "$OUT/time-qquant$TAG.txt" | tail -5 || status=1
      ;;
    bench-two-term)  # issue 9: the two-term query's time cost and error, same run as fp8
      # (TWO_TERM_QUICK="" times the full-length runs, default --quick; TWO_TERM_EXTRA: more
      # flags, e.g. --two-term-grid)
      log "decode benchmark with the two-term query (fp8x2), s_q * h <= 32 cases and two others"
      name=$(unused_name "decode-two-term$TAG")
      timeout 300 python3 bench/bench_decode.py --two-term --no-flashinfer ${TWO_TERM_QUICK---quick} ${TWO_TERM_EXTRA:-} \
        --cases "${TWO_TERM_CASES:-*x1x16x*,*x2x16x*,32x1x32x32768,1x1x128x8192,32x1x128x16384}" \
        --out "$OUT/$name.json" 2>&1 | tee "$OUT/bench-two-term${name#decode-two-term}.log" \
        | tail -30 || status=1
      ;;
    bench-fast)
      log "decode benchmark, the wgmma kernel (opt-in)"
      timeout 240 python3 bench/bench_decode.py --kernel fast --out "$OUT/decode-fast$TAG.json" 2>&1 \
        | tee "$OUT/bench-decode-fast$TAG.log" | tail -28
      python3 bench/roofline.py "$OUT/decode-fast$TAG.json" "$OUT/roofline$TAG.png" >/dev/null 2>&1 || true
      ;;
    diag)
      log "diagnostic: every kernel on logits that any accumulator holds exactly"
      timeout 300 python3 -m pytest -q -s -rfE -p no:cacheprovider tests/gpu/test_decode.py \
        -k exact_logits --tb=short >"$OUT/diag.log" 2>&1 || status=1
      tail -12 "$OUT/diag.log"
      ;;
    ncu)  # the wgmma kernel under Nsight Compute, one launch per case (publish picks the texts);
      # NCU_CASES (default: one case of each N), NCU_SOURCE_CASE: the one with source counters
      per_block=()
      for c in ${NCU_CASES:-32x1x128x16384 128x1x16x16384 64x2x16x16384}; do  # N = 64, 16, 32
        log "ncu fast kernel $c"
        src=(); [ "$c" = "${NCU_SOURCE_CASE:-32x1x128x16384}" ] && src=(--section SourceCounters --export "$OUT/ncu-$c")
        timeout 240 ncu --clock-control none --target-processes all -k regex:seesaw_decode \
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
      # issue 7's figure: instructions per warp per tile-block, per shape class
      python3 bench/ncu_per_block.py "${per_block[@]}" | tee "$OUT/ncu-per-block.txt" || status=1
      ;;
    dump-save | dump-compare)  # bench/dump_decode.py: this build's outputs, saved or compared
      # bit for bit with those saved earlier in the call (an A/B of two builds: use:<name>)
      log "decode outputs, ${stage#dump-} (bench/dump_decode.py)"
      timeout 300 python3 bench/dump_decode.py "--${stage#dump-}" /tmp/snapmla-dump.npz 2>&1 \
        | tee "$OUT/dump-${stage#dump-}$TAG.log" | tail -5 || status=1
      ;;
    demo)
      log "demo (the README's main job)"
      timeout 240 python3 -m snapmla.demo 2>&1 | tee "$OUT/demo$TAG.log" || status=1
      ;;
    accuracy | accuracy-f32out)  # accuracy-f32out: the kernel runs write fp32 out (issue 9)
      extra=(); sfx=$TAG
      [ "$stage" = accuracy-f32out ] && { extra=(--out-dtype float32); sfx="-f32out$TAG"; }
      log "accuracy study ${extra[*]}"
      timeout 420 python3 -m snapmla.accuracy "${extra[@]}" --out "$OUT/accuracy$sfx.json" \
        --figure "$OUT/accuracy$sfx.png" 2>&1 | tee "$OUT/accuracy$sfx.log" | tail -30 || status=1
      ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
  publish
done
log "done (status $status)"
publish && ls -la "$FINAL"
exit $status
