#include <algorithm>

#include "common/warp_per_item.cuh"
#include "fetch_dequant/fetch_dequant.h"

namespace snapmla {
namespace {

constexpr int kContentPerLane = kContentDim / kWarpSize;  // 16 E4M3 = one 16-byte load
constexpr int kRopeLanes = kRopeDim / 8;                  // 8 bf16 = one 16-byte load
constexpr uint32_t kBf16NaNx2 = 0x7fc07fc0u;
static_assert(kContentPerLane == 16, "one 16-byte load of content per lane");

template <bool kAligned>
__device__ __forceinline__ void store_words(uint16_t* out, const uint32_t* w, int n_words) {
  if constexpr (kAligned) {
    for (int i = 0; i < n_words; i += 4) {
      *reinterpret_cast<uint4*>(out + 2 * i) = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
    }
  } else {
    for (int i = 0; i < n_words; ++i) {
      out[2 * i] = static_cast<uint16_t>(w[i] & 0xffffu);
      out[2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
    }
  }
}

// One token, by one warp: lane l dequantizes content [16l, 16l + 16) and, for l < 8, RoPE
// [8l, 8l + 8) of row `row` of `page`, multiplying by the token's scale in fp32 and rounding
// to bf16, into its output rows c_out (512) and k_out (64). page == nullptr: rows of `fill`.
template <bool kAligned>
__device__ __forceinline__ void dequant_token(const uint8_t* page, int row, uint32_t fill,
                                              uint16_t* c_out, uint16_t* k_out, int lane) {
  uint32_t content[kContentPerLane / 2];
  uint32_t rope[4];
  if (page != nullptr) {
    const float s = __ldg(reinterpret_cast<const float*>(page + kPageScaleOffset) + row);
    const uint4 c =
        __ldg(reinterpret_cast<const uint4*>(page + kPageContentOffset + row * kContentDim) + lane);
    const uint32_t cw[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = e4m3x2_to_float2(static_cast<uint16_t>(cw[k] & 0xffffu));
      const float2 b = e4m3x2_to_float2(static_cast<uint16_t>(cw[k] >> 16));
      content[2 * k] = pack_bf16x2(a.x * s, a.y * s);
      content[2 * k + 1] = pack_bf16x2(b.x * s, b.y * s);
    }
    if (lane < kRopeLanes) {
      const uint4 r =
          __ldg(reinterpret_cast<const uint4*>(page + kPageRopeOffset + row * kRopeDim * 2) + lane);
      const uint32_t rw[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        rope[k] =
            pack_bf16x2(__uint_as_float(rw[k] << 16) * s, __uint_as_float(rw[k] & 0xffff0000u) * s);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < kContentPerLane / 2; ++k) content[k] = fill;
#pragma unroll
    for (int k = 0; k < 4; ++k) rope[k] = fill;
  }
  store_words<kAligned>(c_out + lane * kContentPerLane, content, kContentPerLane / 2);
  if (lane < kRopeLanes) store_words<kAligned>(k_out + lane * 8, rope, 4);
}

// One warp per slot: a negative slot (padding) gives zeros, a slot past the layer NaN.
// kStrided: pages page_stride bytes apart (a caller's larger slots), else kPageBytes.
template <bool kAligned, bool kStrided>
__global__ void __launch_bounds__(kItemThreads) fetch_dequant_kernel(const FetchDequantParams p) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kItemThreads + threadIdx.x) / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kItemWarps;
  for (int64_t i = first; i < p.num_tokens; i += step) {
    const int64_t slot = __ldg(p.slots + i);  // warp-uniform
    const bool in = slot >= 0 && slot < p.capacity;
    const uint8_t* page =
        in ? p.layer_base + (slot / kPageSize) * (kStrided ? p.page_stride : kPageBytes) : nullptr;
    const uint32_t fill = slot < 0 ? 0u : kBf16NaNx2;  // padding -> 0; out of range -> NaN
    dequant_token<kAligned>(page, in ? static_cast<int>(slot % kPageSize) : 0, fill,
                            p.c_kv + i * p.c_kv_stride, p.k_pe + i * p.k_pe_stride, lane);
  }
}

// Requests along y (strided), their tokens along x: one warp per token.
template <bool kAligned>
__global__ void __launch_bounds__(kItemThreads) gather_dequant_kernel(const GatherDequantParams p) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kItemThreads + threadIdx.x) / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kItemWarps;
  const int64_t most = int64_t{p.max_pages} * kPageSize;
  for (int r = blockIdx.y; r < p.batch; r += gridDim.y) {
    const int64_t len = min(max(int64_t{__ldg(p.seqlens + r)}, int64_t{0}), most);
    const int64_t row0 = __ldg(p.out_rows + r);
    for (int64_t i = first; i < len; i += step) {
      const int64_t out = row0 + i;
      if (out < 0 || out >= p.num_rows) continue;
      const int32_t page = __ldg(p.block_table + r * p.block_table_stride + i / kPageSize);
      const bool valid = page >= 0 && page < p.num_pages;
      dequant_token<kAligned>(valid ? p.layer_base + int64_t{page} * p.page_stride : nullptr,
                              static_cast<int>(i % kPageSize), kBf16NaNx2,
                              p.c_kv + out * p.c_kv_stride, p.k_pe + out * p.k_pe_stride, lane);
    }
  }
}

}  // namespace

cudaError_t launch_fetch_dequant(const FetchDequantParams& p, cudaStream_t stream) {
  return launch_token_kernel(p, [&](auto aligned, auto strided, int blocks) {
    fetch_dequant_kernel<decltype(aligned)::value, decltype(strided)::value>
        <<<blocks, kItemThreads, 0, stream>>>(p);
  });
}

cudaError_t launch_gather_dequant(const GatherDequantParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  int sms = 0;
  cudaError_t err = current_device_sm_count(&sms);
  if (err != cudaSuccess) return err;
  const int requests = std::min(p.batch, 65535);
  const int along = std::max(1, sms * kItemBlocksPerSm / requests);  // blocks per request
  const dim3 grid(along, requests);
  if (bf16_rows_vectorizable(p.c_kv, p.c_kv_stride, p.k_pe, p.k_pe_stride)) {
    gather_dequant_kernel<true><<<grid, kItemThreads, 0, stream>>>(p);
  } else {
    gather_dequant_kernel<false><<<grid, kItemThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace snapmla
