// Combine: merge the partials of split requests by log-sum-exp. One warp per query row;
// lane l owns latent columns [16l, 16l + 16).
#include "common/launch.h"
#include "common/numerics.cuh"
#include "decode/decode.h"
#include "decode/segment.cuh"

namespace snapmla {
namespace decode {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int kColsPerLane = kContentDim / 32;
static_assert(kColsPerLane == 16, "four float4 per lane");

__global__ void __launch_bounds__(kThreads) combine_kernel(const DecodeParams p) {
  const int b = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int fr = blockIdx.y * kRowsPerBlock + threadIdx.x / 32;
  const int rows_total = p.q_len * p.num_heads;
  if (fr >= rows_total) return;
  const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
  if (!plan_matches(p)) return;  // the decode kernel wrote NaN rows
  const int first = clamp_part(p, p.plan[L.first_part + b]);
  const int last = clamp_part(p, p.plan[L.last_part + b]);
  if (p.plan[L.nblocks + b] <= 0 || first == last) return;  // written by the decode kernel
  const int rows_pad = p.row_tiles * kTileRows;
  auto slot_of = [first](int part) { return 2 * part + (part == first ? 1 : 0); };

  // Pass 1: the largest partial LSE; NaN anywhere poisons the row.
  float m = -INFINITY;
  bool has_nan = false;
  for (int part = first; part <= last; ++part) {
    const float v = p.partial_lse[int64_t{slot_of(part)} * rows_pad + fr];
    has_nan |= (v != v);
    m = fmaxf(m, v);
  }
  float acc[kColsPerLane] = {};
  float lse;
  if (has_nan) {
    lse = __int_as_float(0x7fffffff);
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) acc[c] = lse;
  } else if (m == -INFINITY) {  // no visible token in any segment
    lse = INFINITY;
  } else {
    // Pass 2: out = sum_s w_s O_s / sum_s w_s, w_s = exp(lse_s - m).
    float w_sum = 0.f;
    for (int part = first; part <= last; ++part) {
      const int64_t slot = slot_of(part);
      const float w = expf(p.partial_lse[slot * rows_pad + fr] - m);
      w_sum += w;
      const float4* src = reinterpret_cast<const float4*>(
          p.partial_o + (slot * rows_pad + fr) * kContentDim + lane * kColsPerLane);
#pragma unroll
      for (int v = 0; v < kColsPerLane / 4; ++v) {
        const float4 x = src[v];
        acc[4 * v] += w * x.x;
        acc[4 * v + 1] += w * x.y;
        acc[4 * v + 2] += w * x.z;
        acc[4 * v + 3] += w * x.w;
      }
    }
    const float inv = 1.f / w_sum;
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) acc[c] *= inv;
    lse = m + logf(w_sum);
  }
  uint32_t packed[kColsPerLane / 2];
#pragma unroll
  for (int c = 0; c < kColsPerLane / 2; ++c) packed[c] = pack_bf16x2(acc[2 * c], acc[2 * c + 1]);
  uint4* dst = reinterpret_cast<uint4*>(p.out + (int64_t{b} * rows_total + fr) * kContentDim +
                                        lane * kColsPerLane);
  dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  if (lane == 0 && p.lse != nullptr) {
    const int qt = fr / p.num_heads, head = fr % p.num_heads;
    p.lse[(int64_t{b} * p.num_heads + head) * p.q_len + qt] = lse;
  }
}

}  // namespace

cudaError_t launch_combine(const DecodeParams& p, cudaStream_t stream) {
  const int rows_total = p.q_len * p.num_heads;
  const dim3 grid(p.batch, (rows_total + kRowsPerBlock - 1) / kRowsPerBlock);
  combine_kernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace decode
}  // namespace snapmla
