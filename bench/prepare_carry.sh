#!/usr/bin/env bash
# Development machine: build the wheel of the current commit for the GPU run (bench/gpu_session.sh)
# into .carry/<name> (default: dist), with the commit it was built from in .carry/<name>/COMMIT.
#
#   bash bench/prepare_carry.sh                      # .carry/dist: the default build
#   SNAPMLA_EXPERIMENTAL="NAME=1;OTHER=2" \
#     bash bench/prepare_carry.sh dist-exp           # a kernel variant under evaluation
#
# SNAPMLA_EXPERIMENTAL: CMakeLists.txt's SNAPMLA_EXPERIMENTAL_DEFINES. Each named wheel builds in
# its own folder (build/carry-<name>), so an experimental build never leaves its switches in the
# build folder of the editable install or of the default wheel. Several wheels travel in one call:
# gpu_session.sh's `use:<name>` stage installs another one between stages.
set -euo pipefail
cd "$(dirname "$0")/.."
# The wheel is built from the tree: everything in it must be the commit COMMIT names.
[ -z "$(git status --porcelain -- cpp include CMakeLists.txt python pyproject.toml cmake)" ] || {
  echo "prepare_carry.sh: commit cpp/, include/, python/ and the build files first"; exit 1; }
name=${1:-dist}
case "$name" in dist*) ;; *) echo "prepare_carry.sh: a name starting with dist, got '$name'" >&2; exit 1 ;; esac
out=.carry/$name
rm -rf "$out"
extra=(-C "build-dir=build/carry-$name")
[ -n "${SNAPMLA_EXPERIMENTAL:-}" ] && extra+=(-C "cmake.define.SNAPMLA_EXPERIMENTAL_DEFINES=$SNAPMLA_EXPERIMENTAL")
# The build folder keeps the cache of an earlier run: an empty SNAPMLA_EXPERIMENTAL must reset it.
[ -z "${SNAPMLA_EXPERIMENTAL:-}" ] && extra+=(-C "cmake.define.SNAPMLA_EXPERIMENTAL_DEFINES=")
python3 -m pip wheel . --no-deps -w "$out" -q "${extra[@]}"
commit=$(git rev-parse --short HEAD)
[ -n "${SNAPMLA_EXPERIMENTAL:-}" ] && commit="$commit+${SNAPMLA_EXPERIMENTAL//[^A-Za-z0-9=_]/_}"
echo "$commit" > "$out/COMMIT"
echo "built $(ls "$out"/*.whl) at $(cat "$out/COMMIT")"
