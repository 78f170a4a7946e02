// The probe kernels' scaffolding: aligned shared memory, a thread's warp-uniform position, and
// the host's SM count and result buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../cuda_check.h"
#include "decode/sm90/ptx.cuh"

namespace snapmla {
namespace bench_probe {

// A probe kernel's dynamic shared memory as T, aligned to 1024 bytes (the swizzle atoms).
template <typename T>
__device__ __forceinline__ T& aligned_smem(uint8_t* raw) {
  return *reinterpret_cast<T*>(raw + ((1024u - (sm90::smem_u32(raw) & 1023u)) & 1023u));
}

// A thread of a 256-thread probe CTA: its warpgroup and warp made warp-uniform by a shuffle
// (branches on them then do not serialize the wgmmas), lane and quad position t.
struct ProbeThread {
  int tid, wg, warp, lane, t;
  __device__ __forceinline__ static ProbeThread here() {
    const int tid = threadIdx.x;
    return {tid, __shfl_sync(0xffffffffu, tid / 128, 0),
            __shfl_sync(0xffffffffu, (tid % 128) / 32, 0), tid % 32, tid % 4};
  }
};

// Host side: the device's SM count (one CTA each), a sink for the kernels' results and
// n_cycles clock counts.
struct ProbeHost {
  int sms = 0;
  float* sink = nullptr;
  long long* cycles = nullptr;
  static ProbeHost make(int n_cycles) {
    ProbeHost h;
    SNAPMLA_BENCH_CHECK(cudaDeviceGetAttribute(&h.sms, cudaDevAttrMultiProcessorCount, 0), 1);
    SNAPMLA_BENCH_CHECK(cudaMalloc(&h.sink, 256 * sizeof(float)), 1);
    SNAPMLA_BENCH_CHECK(cudaMalloc(&h.cycles, n_cycles * sizeof(long long)), 1);
    return h;
  }
};

}  // namespace bench_probe
}  // namespace snapmla
