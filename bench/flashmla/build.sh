#!/usr/bin/env bash
# Builds FlashMLA's sm90 decode kernels (BF16 dense, FP8 sparse at 64 and 128 heads, the
# schedule and the combine) from its public source, with our C shim (shim.cu), into one shared
# library for bench_decode.py on the GPU machine: .carry/flashmla/libflashmla_shim.so, with
# FlashMLA's commit in COMMIT beside it. Measurement only: FlashMLA's source and the build stay
# out of the repository. The CUDA runtime is linked statically: the library needs only the driver.
#
#   bash bench/flashmla/build.sh [--src PATH] [--cutlass DIR] [--out DIR] [-j N]
#
#   --src PATH     FlashMLA: a checkout holding csrc/ (used in place), or a git repository, bare
#                  or not, whose HEAD's csrc/ is archived (default $FLASHMLA_SRC, else
#                  /work/.mirror/deepseek-ai+FlashMLA/repo)
#   --cutlass DIR  CUTLASS's include folder, holding cute/ and cutlass/ (default $CUTLASS_INCLUDE,
#                  else the headers of the nvidia-cutlass wheel installed for $PYTHON (python3):
#                  cutlass_library/source/include)
#   --out DIR      where the library and COMMIT go (default .carry/flashmla)
#   -j N           parallel compiles (default: the CPU count)
#
# Needs nvcc ($NVCC, default /usr/local/cuda/bin/nvcc) and ninja. Objects stay in
# $FLASHMLA_BUILD (default /tmp/flashmla-build): a rerun compiles only what changed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
src=${FLASHMLA_SRC:-/work/.mirror/deepseek-ai+FlashMLA/repo}
cutlass=${CUTLASS_INCLUDE:-}
out=$repo/.carry/flashmla
jobs=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --src) src=$2; shift 2 ;;
    --cutlass) cutlass=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
die() { echo "build.sh: $*" >&2; exit 1; }
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || die "no nvcc at $NVCC (set NVCC)"
command -v ninja >/dev/null || die "needs ninja (apt-get install ninja-build, or pip install ninja)"
build=${FLASHMLA_BUILD:-/tmp/flashmla-build}
mkdir -p "$build" "$out"
start=$SECONDS

# ---- FlashMLA's source and commit
if [ -d "$src/csrc" ]; then
  csrc=$(cd "$src/csrc" && pwd)
  commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
  dirty=$(git -C "$src" status --porcelain -- csrc 2>/dev/null || true)
  [ "$commit" = unknown ] || [ -z "$dirty" ] || commit="$commit-dirty"
elif commit=$(git --git-dir="$src" rev-parse HEAD 2>/dev/null) ||
     commit=$(git -C "$src" rev-parse HEAD 2>/dev/null); then
  csrc=$build/src/csrc
  if [ "$(cat "$build/src/COMMIT" 2>/dev/null)" != "$commit" ]; then
    rm -rf "$build/src" && mkdir -p "$build/src"
    { git --git-dir="$src" archive HEAD csrc 2>/dev/null || git -C "$src" archive HEAD csrc; } |
      tar -x -C "$build/src"
    echo "$commit" > "$build/src/COMMIT"
  fi
else
  die "--src $src: neither a checkout with csrc/ nor a git repository"
fi
[ -f "$csrc/params.h" ] || die "$csrc: no params.h (not FlashMLA's csrc?)"

# ---- CUTLASS (FlashMLA's csrc/cutlass submodule is not needed: the wheel's headers stand in)
if [ -z "$cutlass" ]; then
  cutlass=$("${PYTHON:-python3}" - <<'EOF' 2>/dev/null || true
import importlib.util, os
spec = importlib.util.find_spec("cutlass_library")
if spec and spec.submodule_search_locations:
    print(os.path.join(list(spec.submodule_search_locations)[0], "source", "include"))
EOF
)
  [ -n "$cutlass" ] || die "no CUTLASS headers: pip install 'nvidia-cutlass==4.2.*' (headers in \
cutlass_library/source/include) and rerun with that Python (PYTHON=...), or pass --cutlass DIR"
fi
[ -f "$cutlass/cute/tensor.hpp" ] && [ -f "$cutlass/cutlass/cutlass.h" ] ||
  die "--cutlass $cutlass: no cute/tensor.hpp and cutlass/cutlass.h there"

# ---- the build: FlashMLA's nvcc flags for sm90 (its setup.py), less the verbose ptxas report
sources=(
  sm90/decode/dense/instantiations/bf16.cu
  sm90/decode/sparse_fp8/instantiations/v32_persistent_h128.cu
  sm90/decode/sparse_fp8/instantiations/v32_persistent_h64.cu
  smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu
  smxx/decode/combine/combine.cu
)
flags="-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16"
flags+=" -Wno-deprecated-declarations -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__"
flags+=" -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__"
flags+=" --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math -lineinfo"
flags+=" --ptxas-options=--register-usage-level=10,--warn-on-spills,--warn-on-local-memory-usage"
flags+=" -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC,-fvisibility=hidden"
flags+=" -I$csrc -I$csrc/kerutils/include -I$csrc/sm90 -I$cutlass"
cat > "$build/exports.map" <<'EOF'
{ global: fm_*; local: *; };
EOF
# static runtime and C++ library; only the shim's fm_* functions exported
ldflags="-shared -cudart static -gencode arch=compute_90a,code=sm_90a"
ldflags+=" -Xlinker --version-script=$build/exports.map"
ldflags+=" -Xlinker --exclude-libs,ALL -Xlinker --no-undefined"
ldflags+=" -Xcompiler -static-libstdc++,-static-libgcc -ldl -lpthread -lrt"
lib=$out/libflashmla_shim.so
{
  echo "nvcc = $NVCC"
  echo "flags = $flags"
  echo "ldflags = $ldflags"
  echo "rule cu"
  echo "  command = \$nvcc \$flags \$defines -MD -MF \$out.d -c \$in -o \$out"
  echo "  depfile = \$out.d"
  echo "  deps = gcc"
  echo "  description = nvcc \$in"
  echo "rule link"
  echo "  command = \$nvcc \$ldflags -o \$out \$in"
  echo "  description = link \$out"
  objs=""
  for s in "${sources[@]}"; do
    o=obj/${s//\//_}.o
    echo "build $o: cu $csrc/$s"
    objs+=" $o"
  done
  echo "build obj/shim.o: cu $here/shim.cu"
  echo "  defines = -DFM_FLASHMLA_COMMIT=\\\"$commit\\\""
  echo "build $lib: link$objs obj/shim.o"
} > "$build/build.ninja"
echo "FlashMLA $commit from $src; CUTLASS $cutlass; $jobs jobs (minutes a kernel file)"
ninja -C "$build" -j "$jobs"
echo "$commit" > "$out/COMMIT"

# ---- what it exports
syms=$(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}' | sort | tr '\n' ' ')
for f in fm_last_error fm_num_sm_parts fm_workspace_bytes fm_dense_metadata fm_dense_decode \
         fm_sparse_fp8_metadata fm_sparse_fp8_decode; do
  case " $syms" in *" $f "*) ;; *) die "$lib does not export $f (it exports: $syms)" ;; esac
done
echo "built $lib ($(du -h "$lib" | cut -f1)) in $((SECONDS - start)) s: $syms"
