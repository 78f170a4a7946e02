// Device-side split-KV schedule: one CTA scans the sequence lengths and writes the plan.
#include "common/launch.h"
#include "common/numerics.cuh"
#include "decode/decode.h"

namespace snapmla {
namespace decode {
namespace {

constexpr int kPlanThreads = 1024;

// Index of the last element of prefix[0..n] that is <= value (prefix is non-decreasing and
// prefix[0] = 0 <= value).
__device__ int last_le(const int32_t* prefix, int n, int32_t value) {
  int lo = 0, hi = n;  // invariant: prefix[lo] <= value
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (prefix[mid] <= value)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(const int32_t* __restrict__ seqlens, int batch, int q_len, int num_heads,
                int max_pages, int num_parts, int min_part_cost, int32_t* __restrict__ plan) {
  const PlanLayout L = PlanLayout::make(batch, num_parts);
  int32_t* prefix = plan + L.prefix;
  int32_t* nblocks = plan + L.nblocks;
  __shared__ int32_t warp_sums[kPlanThreads / 32];
  __shared__ int32_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t max_len = int64_t{max_pages} * kBlockN;
  // Exclusive scan of costs, one 1024-wide chunk at a time.
  for (int base = 0; base < batch; base += kPlanThreads) {
    const int b = base + threadIdx.x;
    int32_t cost = 0;
    if (b < batch) {
      const int32_t len = seqlens[b];
      const int32_t nb = (len < 0 || len > max_len) ? -1 : (len + kBlockN - 1) / kBlockN;
      nblocks[b] = nb;
      cost = (nb > 0 ? nb : 0) + kFixedCost;
    }
    int32_t incl = cost;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      int32_t w = warp_sums[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t v = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += v;
      }
      warp_sums[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    const int32_t before = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + incl - cost;
    if (b < batch) prefix[b] = before;
    __syncthreads();
    if (threadIdx.x == kPlanThreads - 1) carry = before + cost;
    __syncthreads();
  }
  const int32_t total = carry;
  const int32_t T = max((total + num_parts - 1) / num_parts, min_part_cost);
  if (threadIdx.x == 0) {
    prefix[batch] = total;
    PlanHeader& h = *reinterpret_cast<PlanHeader*>(plan);
    h.magic = kPlanMagic;
    h.batch = batch;
    h.num_parts = num_parts;
    h.row_tiles = (q_len * num_heads + kTileRows - 1) / kTileRows;
    h.q_len = q_len;
    h.num_heads = num_heads;
    h.max_pages = max_pages;
    h.part_cost = T;
  }
  __syncthreads();

  for (int p = threadIdx.x; p < num_parts; p += kPlanThreads) {
    const int64_t c0 = int64_t{p} * T;
    if (c0 >= total) {  // nothing left for this part
      plan[L.part_begin + p] = batch;
      plan[L.part_end + p] = batch - 1;
    } else {
      const int32_t c1 = static_cast<int32_t>(min(c0 + T, int64_t{total}) - 1);
      plan[L.part_begin + p] = last_le(prefix, batch, static_cast<int32_t>(c0));
      plan[L.part_end + p] = last_le(prefix, batch, c1);
    }
  }
  for (int b = threadIdx.x; b < batch; b += kPlanThreads) {
    const int32_t nb = nblocks[b];
    const int32_t first_cost = nb > 0 ? prefix[b] + kFixedCost : prefix[b];
    const int32_t last_cost = nb > 0 ? prefix[b] + kFixedCost + nb - 1 : prefix[b];
    plan[L.first_part + b] = first_cost / T;
    plan[L.last_part + b] = last_cost / T;
  }
}

}  // namespace

int default_num_parts(int sm_count, int row_tiles) {
  const int parts = sm_count / row_tiles;
  return parts > 0 ? parts : 1;
}

WorkspaceLayout WorkspaceLayout::make(int batch, int q_len, int num_heads, int num_parts,
                                      bool two_term) {
  auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
  const int64_t rows = int64_t{batch} * q_len * num_heads;
  const int64_t row_tiles = (int64_t{q_len} * num_heads + kTileRows - 1) / kTileRows;
  const int64_t slots = int64_t{2} * num_parts;
  WorkspaceLayout w{};
  w.q_content = 0;
  w.q_rope = align(w.q_content + rows * kContentDim);
  w.q_scale = align(w.q_rope + rows * kRopeDim * 2);
  w.partial_o = align(w.q_scale + rows * 4);
  w.partial_lse = align(w.partial_o + slots * row_tiles * kTileRows * kContentDim * 4);
  w.q_lo = align(w.partial_lse + slots * row_tiles * kTileRows * 4);
  w.q_lo_scale = two_term ? align(w.q_lo + rows * kContentDim) : w.q_lo;
  w.total_bytes = two_term ? align(w.q_lo_scale + rows * 4) : w.q_lo;
  return w;
}

cudaError_t launch_plan(const int32_t* seqlens, int batch, int q_len, int num_heads, int max_pages,
                        int num_parts, int min_part_cost, int32_t* plan, cudaStream_t stream) {
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(seqlens, batch, q_len, num_heads, max_pages,
                                              num_parts, min_part_cost, plan);
  return cudaGetLastError();
}

}  // namespace decode
}  // namespace snapmla
