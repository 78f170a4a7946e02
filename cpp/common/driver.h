// Driver API functions through the runtime's entry point: the library links only the CUDA
// runtime, not libcuda.
#pragma once

#include <cuda_runtime.h>

namespace snapmla {

// The driver's function `name` (its CUDA 12.0 form), or nullptr where the driver lacks it.
inline void* driver_function(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // the failed query's error is not the caller's
    return nullptr;
  }
  return p;
}

}  // namespace snapmla
