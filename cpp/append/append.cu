#include "append/append.h"
#include "common/launch.h"
#include "common/row_quant.cuh"

namespace snapmla {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kBlocksPerSm = 8;  // 64 resident warps: enough 16-byte loads in flight for HBM

// One warp per token: quantize (per-token scale, E4M3 content, pre-scaled RoPE) and scatter
// the three parts into the token's slot of the paged layer.
// kStrided: pages page_stride bytes apart (a caller's larger slots), else kPageBytes.
template <bool kAligned, bool kStrided>
__global__ void __launch_bounds__(kThreads) append_kernel(const AppendParams p) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t i = first; i < p.num_tokens; i += step) {
    // The row's loads do not wait for its slot: both are in flight together.
    const int64_t slot = __ldg(p.slots + i);  // warp-uniform
    const QuantizedRow q =
        quantize_row<kAligned>(p.c_kv + i * p.c_kv_stride, p.k_pe + i * p.k_pe_stride, lane);
    if (slot < 0 || slot >= p.capacity) continue;
    uint8_t* page = p.layer_base + (slot / kPageSize) * (kStrided ? p.page_stride : kPageBytes);
    const int row = static_cast<int>(slot % kPageSize);
    store_row(q, page + kPageContentOffset + row * kContentDim,
              reinterpret_cast<uint16_t*>(page + kPageRopeOffset) + row * kRopeDim,
              reinterpret_cast<float*>(page + kPageScaleOffset) + row, lane);
  }
}

}  // namespace

cudaError_t launch_append(const AppendParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  int blocks = 0;
  const cudaError_t err = warp_per_item_blocks(p.num_tokens, kWarpsPerBlock, kBlocksPerSm, &blocks);
  if (err != cudaSuccess) return err;
  const bool aligned = bf16_rows_vectorizable(p.c_kv, p.c_kv_stride, p.k_pe, p.k_pe_stride);
  const bool strided = p.page_stride != kPageBytes;
  if (aligned) {
    strided ? append_kernel<true, true><<<blocks, kThreads, 0, stream>>>(p)
            : append_kernel<true, false><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    strided ? append_kernel<false, true><<<blocks, kThreads, 0, stream>>>(p)
            : append_kernel<false, false><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace snapmla
