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

// The aligned cost line: a batch whose requests each fit in k parts of cost T_k = ceil(max cost
// / k), with batch x k parts at most num_parts and T_k at most 9/8 of the balanced part cost T,
// gets k parts of its own per request (the cost line padded to request b at b k T_k) instead of
// parts cut at multiples of T across requests. A part then runs one segment of one request, and
// each request is split in k partials (none at k = 1), where the plain line gives a request's
// blocks to k or k + 1 parts, each part's segment paying a request's fixed costs (its Q tile,
// its epilogue) again. For example 64 x 128 heads x 4k (cost 66 a request, T = 64 over 66
// parts): one part per request, no combine.
// The aligned cost line's stride k T_k per request (and T = T_k), or 0 to keep the plain line.
__device__ int32_t aligned_stride(int batch, int num_parts, int min_part_cost, int32_t max_cost,
                                  int32_t* T) {
  if (max_cost <= 0) return 0;
  const int32_t k0 = (max_cost + *T - 1) / *T;  // T_k0 <= T
  for (int32_t k = k0; k >= 1 && k >= k0 - 1; --k) {
    const int32_t t_k = max((max_cost + k - 1) / k, min_part_cost);
    const int64_t parts = int64_t{batch} * k, line = parts * t_k;
    if (parts <= num_parts && int64_t{t_k} * 8 <= int64_t{*T} * 9 && line < INT32_MAX) {
      *T = t_k;
      return k * t_k;
    }
  }
  return 0;
}

// Room for the Q-quant kernel: it holds G SMs when the attention kernel launches (its
// programmatic launch, common/launch.h), so the attention CTAs dispatched last (the highest
// parts, where a request is one row tile) start only after it ends, behind the others by its
// remaining time and their own prologue; a part that ends last then ends the call. Where the
// parts are short (at most kQqRoomShortPart cost units, 64-token blocks, each) and giving each
// up to kQqRoomExtra more units leaves the last G parts empty, the plan does so (free_parts =
// num_parts - G; the empty parts' CTAs exit at once). On longer parts the late start is a
// smaller share than the extra blocks cost.
constexpr int32_t kQqRoomShortPart = 4;
constexpr int32_t kQqRoomExtra = 2;

// The parts the cost line may use: free_parts where the parts are short and that costs each
// at most kQqRoomExtra units more, else num_parts.
__device__ int usable_parts(int32_t total, int num_parts, int free_parts, int min_part_cost) {
  if (free_parts <= 0 || free_parts >= num_parts) return num_parts;
  const int32_t t_all = max((total + num_parts - 1) / num_parts, min_part_cost);
  const int32_t t_free = max((total + free_parts - 1) / free_parts, min_part_cost);
  return t_all <= kQqRoomShortPart && t_free <= t_all + kQqRoomExtra ? free_parts : num_parts;
}

__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(const int32_t* __restrict__ seqlens, const PlanShape shape, int free_parts,
                int min_part_cost, int32_t* __restrict__ plan) {
  const int batch = shape.batch, num_parts = shape.num_parts, max_pages = shape.max_pages;
  const PlanLayout L = PlanLayout::make(batch, num_parts);
  int32_t* prefix = plan + L.prefix;
  int32_t* nblocks = plan + L.nblocks;
  __shared__ int32_t warp_sums[kPlanThreads / 32];
  __shared__ int32_t carry;
  __shared__ int32_t max_cost;  // of any request
  if (threadIdx.x == 0) carry = max_cost = 0;
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Exclusive scan of costs, one 1024-wide chunk at a time.
  for (int base = 0; base < batch; base += kPlanThreads) {
    const int b = base + threadIdx.x;
    int32_t cost = 0;
    if (b < batch) {
      const int32_t nb = blocks_of(seqlens[b], max_pages);
      nblocks[b] = nb;
      cost = (nb > 0 ? nb : 0) + kFixedCost;
      atomicMax(&max_cost, cost);
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
  int32_t total = carry;
  const int usable = usable_parts(total, num_parts, free_parts, min_part_cost);
  int32_t T = max((total + usable - 1) / usable, min_part_cost);
  const int32_t stride = aligned_stride(batch, usable, min_part_cost, max_cost, &T);
  if (stride > 0) {  // request b at cost b * stride: k whole parts of its own
    for (int b = threadIdx.x; b < batch; b += kPlanThreads) prefix[b] = b * stride;
    total = batch * stride;
  }
  if (threadIdx.x == 0) {
    prefix[batch] = total;
    PlanHeader& h = *reinterpret_cast<PlanHeader*>(plan);
    h.shape = shape;
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

cudaError_t launch_plan(const int32_t* seqlens, const PlanShape& shape, int free_parts,
                        int min_part_cost, int32_t* plan, cudaStream_t stream) {
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(seqlens, shape, free_parts, min_part_cost, plan);
  return cudaGetLastError();
}

}  // namespace decode
}  // namespace snapmla
