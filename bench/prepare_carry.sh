#!/usr/bin/env bash
# Development machine: build the wheel of the current commit into .carry/dist for the GPU run
# (bench/gpu_session.sh), and record the commit it was built from.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -z "$(git status --porcelain -- cpp include CMakeLists.txt)" ] || { echo "commit the C++ first"; exit 1; }
rm -rf .carry/dist
python3 -m pip wheel . --no-deps -w .carry/dist -q
git rev-parse --short HEAD > .carry/COMMIT
echo "built $(ls .carry/dist) at $(cat .carry/COMMIT)"
