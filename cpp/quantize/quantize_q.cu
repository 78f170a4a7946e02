#include "common/row_quant.cuh"
#include "common/warp_per_item.cuh"
#include "quantize/quantize_q.h"

namespace snapmla {
namespace {

constexpr int kThreads = kQuantizeQWarps * kWarpSize;

// Whether the rows may be written: no plan to check, or its header's first words are the ones
// the output pointers were laid out for (two 16-byte loads of the plan, 16-byte aligned).
__device__ __forceinline__ bool plan_shape_matches(const QuantizeQParams& p) {
  if (p.plan == nullptr) return true;
  const int4 a = __ldg(reinterpret_cast<const int4*>(p.plan));
  const int4 b = __ldg(reinterpret_cast<const int4*>(p.plan) + 1);
  const int32_t* w = p.plan_shape;
  return a.x == w[0] && a.y == w[1] && a.z == w[2] && a.w == w[3] && b.x == w[4] &&
         b.y == w[5] && b.z == w[6] && b.w == w[7];
}

// One warp per (token, head) row. kSplit: the RoPE part from p.q_pe (q_nope | q_pe apart);
// kTwoTerm: also the low term into p.q_lo and p.q_lo_scale.
template <bool kAligned, bool kSplit, bool kTwoTerm = false>
__global__ void __launch_bounds__(kThreads) quantize_q_kernel(const QuantizeQParams p) {
  griddep_launch_dependents();  // the attention kernel may launch now and wait for this grid
  // A decode call's workspace laid out for another config than its plan's (another precision,
  // batch, query shape or part count): nothing is written, so nothing lands past the workspace.
  // The header's loads are in flight with the first row's; the stores wait for the compare.
  const bool writes = plan_shape_matches(p);
  const int lane = threadIdx.x % kWarpSize;
  for_each_warp_item<kThreads>(p.num_tokens * p.num_heads, [&](int64_t r) {
    const int64_t token = r / p.num_heads;
    const int64_t head = r % p.num_heads;
    const uint16_t* in = p.q + (token / p.q_len) * p.stride_batch +
                         (token % p.q_len) * p.stride_token + head * p.stride_head;
    const uint16_t* rope = kSplit ? p.q_pe + (token / p.q_len) * p.pe_stride_batch +
                                        (token % p.q_len) * p.pe_stride_token +
                                        head * p.pe_stride_head
                                  : in + kContentDim;
    if constexpr (kTwoTerm) {
      const RowInputs x = load_row<kAligned>(in, rope, lane);
      const QuantizedRow2 q = quantize_loaded_two_term(x);
      if (!writes) return;
      store_row(q.hi, p.q_content + r * kContentDim, p.q_rope + r * kRopeDim, p.q_scale + r, lane);
      store_low_term(q.lo, p.q_lo + r * kContentDim, p.q_lo_scale + r, lane);
    } else {
      const QuantizedRow q = quantize_row<kAligned>(in, rope, lane);
      if (!writes) return;
      store_row(q, p.q_content + r * kContentDim, p.q_rope + r * kRopeDim, p.q_scale + r, lane);
    }
  });
}

}  // namespace

cudaError_t launch_quantize_q(const QuantizeQParams& p, cudaStream_t stream) {
  const int64_t rows = p.num_tokens * p.num_heads;
  if (rows == 0) return cudaSuccess;
  int blocks = 0;
  const cudaError_t err =
      warp_per_item_blocks(rows, kQuantizeQWarps, kQuantizeQBlocksPerSm, &blocks);
  if (err != cudaSuccess) return err;
  const bool split = p.q_pe != nullptr;
  const bool aligned = quantize_q_vectorizable(p);
  auto launch = [&](auto kernel) { kernel<<<blocks, kThreads, 0, stream>>>(p); };
  if (p.q_lo != nullptr) {
    if (aligned) {
      split ? launch(quantize_q_kernel<true, true, true>)
            : launch(quantize_q_kernel<true, false, true>);
    } else {
      split ? launch(quantize_q_kernel<false, true, true>)
            : launch(quantize_q_kernel<false, false, true>);
    }
  } else if (aligned) {
    split ? launch(quantize_q_kernel<true, true>) : launch(quantize_q_kernel<true, false>);
  } else {
    split ? launch(quantize_q_kernel<false, true>) : launch(quantize_q_kernel<false, false>);
  }
  return cudaGetLastError();
}

}  // namespace snapmla
