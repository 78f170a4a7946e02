// The bench programs' CUDA error check: print the call, file, line and error, then exit with
// `status`. Each program names its own CHECK(x) with its exit status.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define SNAPMLA_BENCH_CHECK(x, status)                                                        \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(status);                                                                      \
    }                                                                                         \
  } while (0)
