#!/usr/bin/env bash
# Development machine: build the wheel of the current commit into .carry/dist for the GPU run
# (bench/gpu_session.sh), and record the commit it was built from.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -z "$(git status --porcelain -- cpp include CMakeLists.txt)" ] || { echo "commit the C++ first"; exit 1; }
rm -rf .carry/dist
# SNAPMLA_EXPERIMENTAL="SNAPMLA_SEESAW_PRODUCER=1": a wheel with a kernel variant under
# evaluation (CMakeLists.txt's SNAPMLA_EXPERIMENTAL_DEFINES), for tests of it on the GPU.
extra=()
[ -n "${SNAPMLA_EXPERIMENTAL:-}" ] && extra=(-C "cmake.define.SNAPMLA_EXPERIMENTAL_DEFINES=$SNAPMLA_EXPERIMENTAL")
python3 -m pip wheel . --no-deps -w .carry/dist -q "${extra[@]}"
commit=$(git rev-parse --short HEAD)
[ -n "${SNAPMLA_EXPERIMENTAL:-}" ] && commit="$commit+${SNAPMLA_EXPERIMENTAL//[^A-Za-z0-9=_]/_}"
echo "$commit" > .carry/COMMIT
echo "built $(ls .carry/dist) at $(cat .carry/COMMIT)"
