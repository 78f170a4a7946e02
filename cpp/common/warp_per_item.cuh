// The warp-per-item kernels' frame: one warp an item (a token or a query row), grid-strided.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "common/launch.h"
#include "common/numerics.cuh"

namespace snapmla {

// At most 8 blocks of 256 resident an SM: 64 warps keep enough 16-byte loads in flight for HBM.
constexpr int kItemThreads = 256;
constexpr int kItemWarps = kItemThreads / kWarpSize;
constexpr int kItemBlocksPerSm = 8;

#ifdef __CUDACC__
// body(i) for this warp's items; i is warp-uniform.
template <int kThreads, class Body>
__device__ __forceinline__ void for_each_warp_item(int64_t n, const Body& body) {
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  for (int64_t i = first; i < n; i += step) body(i);
}
#endif

// launch(aligned, strided, blocks): aligned (16-byte BF16 row accesses) and strided (pages not
// packed) as std::bool_constant template arguments.
template <class Params, class Launch>
cudaError_t launch_token_kernel(const Params& p, const Launch& launch) {
  if (p.num_tokens == 0) return cudaSuccess;
  int blocks = 0;
  const cudaError_t err = warp_per_item_blocks(p.num_tokens, kItemWarps, kItemBlocksPerSm, &blocks);
  if (err != cudaSuccess) return err;
  using Yes = std::true_type;
  using No = std::false_type;
  const bool strided = p.page_stride != kPageBytes;
  if (bf16_rows_vectorizable(p.c_kv, p.c_kv_stride, p.k_pe, p.k_pe_stride)) {
    strided ? launch(Yes{}, Yes{}, blocks) : launch(Yes{}, No{}, blocks);
  } else {
    strided ? launch(No{}, Yes{}, blocks) : launch(No{}, No{}, blocks);
  }
  return cudaGetLastError();
}

}  // namespace snapmla
