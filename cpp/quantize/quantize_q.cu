#include "common/launch.h"
#include "common/row_quant.cuh"
#include "quantize/quantize_q.h"

namespace snapmla {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kBlocksPerSm = 8;

// One warp per (token, head) row. kSplit: the RoPE part from p.q_pe (q_nope | q_pe apart);
// kTwoTerm: also the low term into p.q_lo and p.q_lo_scale.
template <bool kAligned, bool kSplit, bool kTwoTerm = false>
__global__ void __launch_bounds__(kThreads) quantize_q_kernel(const QuantizeQParams p) {
  griddep_launch_dependents();  // SNAPMLA_PDL: the attention kernel may launch and wait
  const int lane = threadIdx.x % kWarpSize;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = first; r < rows; r += step) {
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
      const QuantizedRow q = quantize_loaded(x);
      store_row(q, p.q_content + r * kContentDim, p.q_rope + r * kRopeDim, p.q_scale + r, lane);
      store_low_term(quantize_low_term(x, q), p.q_lo + r * kContentDim, p.q_lo_scale + r, lane);
    } else {
      const QuantizedRow q = quantize_row<kAligned>(in, rope, lane);
      store_row(q, p.q_content + r * kContentDim, p.q_rope + r * kRopeDim, p.q_scale + r, lane);
    }
  }
}

// SNAPMLA_QQUANT_ROW_WARPS (1: one warp a row, as above; 2 or 4: experimental, bench/NOTES.md,
// session 34): kParts warps share a row, each quantizing a slice of it, so that a row's serial
// work (16 content quotients a lane, 32 with the low term) shrinks kParts-fold. The Q-quant
// kernel's blocks are short-lived but each holds an SM that an attention CTA (a whole SM)
// waits for under SNAPMLA_PDL; their lifetime is the two-term query's cost at 8x1x16x4096
// (session 33). Same codes and scales as the one-warp form: the row maximum is the same
// maximum (over the slices' maxima), every element is quantized alone, and a warp that falls
// back to the IEEE division gets the codes the fast quotient would have given where it holds
// (common/row_quant.cuh), so a fallback decided per warp, not per row, changes nothing.
#ifndef SNAPMLA_QQUANT_ROW_WARPS
#define SNAPMLA_QQUANT_ROW_WARPS 1
#endif
static_assert(SNAPMLA_QQUANT_ROW_WARPS == 1 || SNAPMLA_QQUANT_ROW_WARPS == 2 ||
                  SNAPMLA_QQUANT_ROW_WARPS == 4,
              "SNAPMLA_QQUANT_ROW_WARPS: 1, 2 or 4 warps a row");

// Warp w of a row's kParts: content elements [kSpan w + kElems lane, + kElems) and, on lanes
// below kRopeLanes, RoPE elements [kRopeDim / kParts w + 2 lane, + 2).
template <int kParts>
struct RowSlice {
  static constexpr int kElems = kContentDim / (kWarpSize * kParts);  // 8 or 4
  static constexpr int kWords = kElems / 2;                          // bf16 pairs
  static constexpr int kSpan = kWarpSize * kElems;
  static constexpr int kRopeLanes = kRopeDim / 2 / kParts;  // 16 or 8
  uint32_t c[kWords];  // content, element 2i in the low half of c[i]
  uint32_t r;          // RoPE (lanes below kRopeLanes)
};

template <int kParts>
__device__ __forceinline__ RowSlice<kParts> load_slice(const uint16_t* content,
                                                        const uint16_t* rope, int w, int lane) {
  using S = RowSlice<kParts>;
  S x;
  const uint16_t* c = content + S::kSpan * w + S::kElems * lane;
  if constexpr (S::kWords == 4) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(c));
    x.c[0] = u.x, x.c[1] = u.y, x.c[2] = u.z, x.c[3] = u.w;
  } else {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(c));
    x.c[0] = u.x, x.c[1] = u.y;
  }
  x.r = lane < S::kRopeLanes
            ? __ldg(reinterpret_cast<const unsigned int*>(rope + kRopeDim / kParts * w + 2 * lane))
            : 0u;
  return x;
}

// Packs a slice's kElems E4M3 codes: one word (4 codes) or two.
template <int kWords>
struct SliceCodes {
  uint32_t w[kWords / 2];
};

template <int kParts, bool kSplit, bool kTwoTerm>
__global__ void __launch_bounds__(kThreads) quantize_q_sliced_kernel(const QuantizeQParams p) {
  griddep_launch_dependents();  // SNAPMLA_PDL: the attention kernel may launch and wait
  using S = RowSlice<kParts>;
  constexpr int kGroups = kWarpsPerBlock / kParts;  // rows a block holds at once
  __shared__ float slice_max[2][kWarpsPerBlock];    // by iteration parity
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int w = warp % kParts, group = warp / kParts;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kGroups;
  int parity = 0;
  // Every warp of the block runs every iteration (the barrier); a group past the rows idles.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kGroups; base < rows; base += step) {
    const int64_t r = min(base + group, rows - 1);  // (an idle group loads a row it ignores)
    const bool live = base + group < rows;
    const int64_t token = r / p.num_heads;
    const int64_t head = r % p.num_heads;
    const uint16_t* in = p.q + (token / p.q_len) * p.stride_batch +
                         (token % p.q_len) * p.stride_token + head * p.stride_head;
    const uint16_t* rope = kSplit ? p.q_pe + (token / p.q_len) * p.pe_stride_batch +
                                        (token % p.q_len) * p.pe_stride_token +
                                        head * p.pe_stride_head
                                  : in + kContentDim;
    const S x = load_slice<kParts>(in, rope, w, lane);
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < S::kWords; ++i) {
      amax = nan_max(amax, nan_max(fabsf(lo_f(x.c[i])), fabsf(hi_f(x.c[i]))));
    }
    amax = warp_nan_max_nonneg(amax);
    const int slot = parity;
    parity ^= 1;
    if (lane == 0) slice_max[slot][warp] = amax;
    // (the next write to this parity's slots comes after the next iteration's barrier, which
    // every reader passes first)
    __syncthreads();
    if (!live) continue;
#pragma unroll
    for (int k = 0; k < kParts; ++k) amax = nan_max(amax, slice_max[slot][kParts * group + k]);
    const float s1 = row_scale(amax);
    using Codes = SliceCodes<S::kWords>;
    struct Hi {
      Codes c;
      uint32_t rope;
    };
    const Hi hi = quantize_by_row_divider<Hi>(s1, [&](const auto& div, bool& ok) {
      Hi h;
#pragma unroll
      for (int i = 0; i < S::kWords / 2; ++i) {
        h.c.w[i] = to_e4m3x4(div(lo_f(x.c[2 * i]), ok), div(hi_f(x.c[2 * i]), ok),
                             div(lo_f(x.c[2 * i + 1]), ok), div(hi_f(x.c[2 * i + 1]), ok));
      }
      h.rope = lane < S::kRopeLanes
                   ? pack_bf16x2(div.checked(lo_f(x.r), ok), div.checked(hi_f(x.r), ok))
                   : 0u;
      return h;
    });
    uint8_t* out = p.q_content + r * kContentDim + S::kSpan * w + S::kElems * lane;
    if constexpr (S::kWords == 4) {
      *reinterpret_cast<uint2*>(out) = make_uint2(hi.c.w[0], hi.c.w[1]);
    } else {
      *reinterpret_cast<uint32_t*>(out) = hi.c.w[0];
    }
    if (lane < S::kRopeLanes) {
      reinterpret_cast<uint32_t*>(p.q_rope + r * kRopeDim + kRopeDim / kParts * w)[lane] =
          hi.rope;
    }
    if (w == 0 && lane == 0) p.q_scale[r] = s1;
    if constexpr (kTwoTerm) {  // quantize_low_term's element rule on the slice
      const Codes lo = quantize_by_row_divider<Codes>(s1, [&](const auto& div, bool& ok) {
        Codes l;
#pragma unroll
        for (int i = 0; i < S::kWords / 2; ++i) {
          const float2 h0 = e4m3x2_to_float2(static_cast<uint16_t>(hi.c.w[i]));
          const float2 h1 = e4m3x2_to_float2(static_cast<uint16_t>(hi.c.w[i] >> 16));
          l.w[i] = to_e4m3x4(16.f * (div(lo_f(x.c[2 * i]), ok) - h0.x),
                             16.f * (div(hi_f(x.c[2 * i]), ok) - h0.y),
                             16.f * (div(lo_f(x.c[2 * i + 1]), ok) - h1.x),
                             16.f * (div(hi_f(x.c[2 * i + 1]), ok) - h1.y));
        }
        return l;
      });
      uint8_t* lo_out = p.q_lo + r * kContentDim + S::kSpan * w + S::kElems * lane;
      if constexpr (S::kWords == 4) {
        *reinterpret_cast<uint2*>(lo_out) = make_uint2(lo.w[0], lo.w[1]);
      } else {
        *reinterpret_cast<uint32_t*>(lo_out) = lo.w[0];
      }
      if (w == 0 && lane == 0) p.q_lo_scale[r] = s1 * 0.0625f;  // exact, as quantize_low_term
    }
  }
}

}  // namespace

cudaError_t launch_quantize_q(const QuantizeQParams& p, cudaStream_t stream) {
  const int64_t rows = p.num_tokens * p.num_heads;
  if (rows == 0) return cudaSuccess;
  int blocks = 0;
  const cudaError_t err = warp_per_item_blocks(rows, kWarpsPerBlock, kBlocksPerSm, &blocks);
  if (err != cudaSuccess) return err;
  const bool split = p.q_pe != nullptr;
  const bool aligned = quantize_q_vectorizable(p);
  // One instantiation per (aligned, split, two-term); the one-term ones are the validated
  // kernels of before the two-term query, unchanged.
  auto launch = [&](auto kernel) { kernel<<<blocks, kThreads, 0, stream>>>(p); };
#if SNAPMLA_QQUANT_ROW_WARPS > 1
  if (aligned) {  // (16-byte-readable rows; the rest as before)
    constexpr int kParts = SNAPMLA_QQUANT_ROW_WARPS;
    const cudaError_t e =
        warp_per_item_blocks(rows * kParts, kWarpsPerBlock, kBlocksPerSm, &blocks);
    if (e != cudaSuccess) return e;
    if (p.q_lo != nullptr) {
      split ? launch(quantize_q_sliced_kernel<kParts, true, true>)
            : launch(quantize_q_sliced_kernel<kParts, false, true>);
    } else {
      split ? launch(quantize_q_sliced_kernel<kParts, true, false>)
            : launch(quantize_q_sliced_kernel<kParts, false, false>);
    }
    return cudaGetLastError();
  }
#endif
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
