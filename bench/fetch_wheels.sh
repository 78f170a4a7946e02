#!/usr/bin/env bash
# Development machine, once per fresh machine: the wheels the GPU machine lacks, into .whl/ (ignored;
# bench/gpu_session.sh installs them there). cffi and pycparser for snapmla itself; FlashInfer and
# what it needs for the side-by-side benchmark (bench/ANCHORS.md). The GPU machine runs CPython 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."
dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$@"
}
dl cffi pycparser
dl flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2 click einops tabulate
ls .whl
