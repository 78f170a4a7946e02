// The frame of the warp-per-item kernels (append, fetch-dequant, copy-slots, Q-quant): one warp
// takes one item (a token or a query row) at a time, the grid strides over the items.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "common/launch.h"
#include "common/numerics.cuh"

namespace snapmla {

// The cache kernels' blocks: 256 threads, at most 8 resident an SM (64 warps: enough 16-byte
// loads in flight to keep HBM busy).
constexpr int kItemThreads = 256;
constexpr int kItemWarps = kItemThreads / kWarpSize;
constexpr int kItemBlocksPerSm = 8;

#ifdef __CUDACC__
// body(i) for each item i < n of this warp: warp w of the grid takes w, w + W, ... (W the
// grid's warps). i is warp-uniform.
template <int kThreads, class Body>
__device__ __forceinline__ void for_each_warp_item(int64_t n, const Body& body) {
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  for (int64_t i = first; i < n; i += step) body(i);
}
#endif

// launch(aligned, strided, blocks) over `items` items with the cache kernels' blocks, aligned
// and strided as std::bool_constant (the kernel's template arguments); nothing for no items.
template <class Launch>
cudaError_t launch_by_layout(int64_t items, bool aligned, bool strided, const Launch& launch) {
  if (items == 0) return cudaSuccess;
  int blocks = 0;
  const cudaError_t err = warp_per_item_blocks(items, kItemWarps, kItemBlocksPerSm, &blocks);
  if (err != cudaSuccess) return err;
  using Yes = std::true_type;
  using No = std::false_type;
  if (aligned) {
    strided ? launch(Yes{}, Yes{}, blocks) : launch(Yes{}, No{}, blocks);
  } else {
    strided ? launch(No{}, Yes{}, blocks) : launch(No{}, No{}, blocks);
  }
  return cudaGetLastError();
}

}  // namespace snapmla
