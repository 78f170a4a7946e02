#include "append/append.h"
#include "common/row_quant.cuh"
#include "common/warp_per_item.cuh"

namespace snapmla {
namespace {

// One warp per token: quantize (per-token scale, E4M3 content, pre-scaled RoPE) and scatter
// the three parts into the token's slot of the paged layer.
// kStrided: pages page_stride bytes apart (a caller's larger slots), else kPageBytes.
template <bool kAligned, bool kStrided>
__global__ void __launch_bounds__(kItemThreads) append_kernel(const AppendParams p) {
  const int lane = threadIdx.x % kWarpSize;
  for_each_warp_item<kItemThreads>(p.num_tokens, [&](int64_t i) {
    // The row's loads do not wait for its slot: both are in flight together.
    const int64_t slot = __ldg(p.slots + i);
    const QuantizedRow q =
        quantize_row<kAligned>(p.c_kv + i * p.c_kv_stride, p.k_pe + i * p.k_pe_stride, lane);
    if (slot < 0 || slot >= p.capacity) return;
    uint8_t* page = p.layer_base + (slot / kPageSize) * (kStrided ? p.page_stride : kPageBytes);
    const int row = static_cast<int>(slot % kPageSize);
    store_row(q, page + kPageContentOffset + row * kContentDim,
              reinterpret_cast<uint16_t*>(page + kPageRopeOffset) + row * kRopeDim,
              reinterpret_cast<float*>(page + kPageScaleOffset) + row, lane);
  });
}

}  // namespace

cudaError_t launch_append(const AppendParams& p, cudaStream_t stream) {
  return launch_token_kernel(p, [&](auto aligned, auto strided, int blocks) {
    append_kernel<decltype(aligned)::value, decltype(strided)::value>
        <<<blocks, kItemThreads, 0, stream>>>(p);
  });
}

}  // namespace snapmla
