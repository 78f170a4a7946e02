#!/usr/bin/env bash
# Development machine: build a wheel for the GPU run (bench/gpu_session.sh) into .carry/<name>
# (default: dist), with the commit it was built from in .carry/<name>/COMMIT.
#
#   bash bench/prepare_carry.sh                      # .carry/dist: the current commit
#   bash bench/prepare_carry.sh dist-base <commit>   # another commit's wheel, for an A/B
#
# Several wheels travel in one call: gpu_session.sh's `use:<name>` stage installs another one
# between stages. Each named wheel builds in its own folder (build/carry-<name>).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-dist}
case "$name" in dist*) ;; *) echo "prepare_carry.sh: a name starting with dist, got '$name'" >&2; exit 1 ;; esac
out=$PWD/.carry/$name
rm -rf "$out"
src=$PWD
if [ -n "${2:-}" ]; then
  src=$(mktemp -d "${TMPDIR:-/tmp}/snapmla-carry.XXXXXX")
  trap 'git worktree remove --force "$src" 2>/dev/null; rm -rf "$src"' EXIT
  git worktree add -q --detach "$src" "$2"
else
  # The wheel is built from the tree: everything in it must be the commit COMMIT names.
  [ -z "$(git status --porcelain -- cpp include CMakeLists.txt python pyproject.toml cmake)" ] || {
    echo "prepare_carry.sh: commit cpp/, include/, python/ and the build files first"; exit 1; }
fi
(cd "$src" && python3 -m pip wheel . --no-deps -w "$out" -q -C "build-dir=$PWD/build/carry-$name")
git -C "$src" rev-parse --short HEAD > "$out/COMMIT"
# The racecheck triage recognises the statistics handoff in this build's softmax, not the tree's.
cp "$src/cpp/decode/sm90/softmax.cuh" "$out/softmax.cuh"
echo "built $(ls "$out"/*.whl) at $(cat "$out/COMMIT")"
