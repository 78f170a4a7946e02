#include "common/warp_per_item.cuh"
#include "copy_slots/copy_slots.h"

namespace snapmla {
namespace {

constexpr int kRopeBytes = kRopeDim * 2;  // 128: 8 lanes of 16 bytes

// One warp per token: its 512 content bytes (16 a lane), 128 RoPE bytes (lanes 0-7) and
// 4-byte scale (lane 0), from the source slot's rows to the destination slot's. Every row
// offset is a multiple of 16 (content 512, RoPE 128) and the planes are 128-byte aligned.
__global__ void __launch_bounds__(kItemThreads) copy_slots_kernel(const CopySlotsParams p) {
  const int lane = threadIdx.x % kWarpSize;
  for_each_warp_item<kItemThreads>(p.num_tokens, [&](int64_t i) {
    const int64_t src = __ldg(p.src_slots + i);
    const int64_t dst = __ldg(p.dst_slots + i);
    if (src < 0 || src >= p.capacity || dst < 0 || dst >= p.capacity) return;
    const uint8_t* s_page = p.layer_base + (src / kPageSize) * p.page_stride;
    uint8_t* d_page = p.layer_base + (dst / kPageSize) * p.page_stride;
    const int s_row = static_cast<int>(src % kPageSize), d_row = static_cast<int>(dst % kPageSize);
    const uint4 c = __ldg(
        reinterpret_cast<const uint4*>(s_page + kPageContentOffset + s_row * kContentDim) + lane);
    uint4 r{};
    if (lane < kRopeBytes / 16) {
      r = __ldg(reinterpret_cast<const uint4*>(s_page + kPageRopeOffset + s_row * kRopeBytes) +
                lane);
    }
    float scale = 0.f;
    if (lane == 0) scale = __ldg(reinterpret_cast<const float*>(s_page + kPageScaleOffset) + s_row);
    reinterpret_cast<uint4*>(d_page + kPageContentOffset + d_row * kContentDim)[lane] = c;
    if (lane < kRopeBytes / 16) {
      reinterpret_cast<uint4*>(d_page + kPageRopeOffset + d_row * kRopeBytes)[lane] = r;
    }
    if (lane == 0) reinterpret_cast<float*>(d_page + kPageScaleOffset)[d_row] = scale;
  });
}

}  // namespace

cudaError_t launch_copy_slots(const CopySlotsParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  int blocks = 0;
  const cudaError_t err = warp_per_item_blocks(p.num_tokens, kItemWarps, kItemBlocksPerSm, &blocks);
  if (err != cudaSuccess) return err;
  copy_slots_kernel<<<blocks, kItemThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace snapmla
