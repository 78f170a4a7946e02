// Merging a split request's partials by log-sum-exp: the pieces the combine kernels (combine.cu)
// and the seesaw kernel's own merge (SNAPMLA_SEESAW_MERGE, seesaw/kernel.cuh) share.
//
// A partial row is (O_s / l_s, lse_s) over one part's segment; the merged row is
// sum_s w_s O_s / sum_s w_s with w_s = exp(lse_s - max lse), and lse = max + log(sum_s w_s).
// NaN in any partial's lse poisons the row (out and lse NaN); a row no part saw a token of is
// out 0, lse +inf.
#pragma once

#include "common/numerics.cuh"
#include "decode/decode.h"
#include "decode/segment.cuh"

namespace snapmla {
namespace decode {

// The workspace slot of a part's partial for a request whose first part is `first`.
__device__ __forceinline__ int64_t partial_slot(int part, int first) {
  return 2 * part + (part == first ? 1 : 0);
}

// The parts [first, last] holding request b's partials, or false where the decode kernel wrote
// the request's rows itself (a plan that does not match, no blocks, or a single part).
// The request's words are read with the header's, one round trip (the host checked the plan
// buffer's size for these parameters: in bounds whatever the words hold).
__device__ __forceinline__ bool split_parts(const DecodeParams& p, int b, int* first, int* last) {
  const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
  const int32_t first_word = p.plan[L.first_part + b], last_word = p.plan[L.last_part + b];
  const int32_t nb_word = p.plan[L.nblocks + b];
  if (!plan_matches(p)) return false;  // the decode kernel wrote NaN rows
  *first = clamp_part(p, first_word);
  *last = clamp_part(p, last_word);
  return nb_word > 0 && *first != *last;
}

// One merge's running state over a float4 of a row's columns: acc = sum_s exp(lse_s - m) O_s,
// w = sum_s exp(lse_s - m).
struct RunningMerge {
  float m = -INFINITY, w = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  bool nan_seen = false;
  // Rescale to the maximum m_new >= m (a no-op while both are -inf: nothing added yet).
  __device__ __forceinline__ void raise_to(float m_new) {
    if (m_new == m) return;
    const float f = expf(m - m_new);  // m = -inf: 0 (acc and w are 0 then anyway)
    w *= f;
    acc.x *= f;
    acc.y *= f;
    acc.z *= f;
    acc.w *= f;
    m = m_new;
  }
  __device__ __forceinline__ void add(float lse, float4 x) {  // lse <= m, not NaN
    const float f = expf(lse - m);
    w += f;
    acc.x += f * x.x;
    acc.y += f * x.y;
    acc.z += f * x.z;
    acc.w += f * x.w;
  }
};

constexpr int kMergeChunk = 8;  // partials whose loads are in flight at once

// Parts first + g, first + g + stride, ... <= last of row fr, float4 column c, into r: in chunks
// of kMergeChunk with every load of a chunk (its LSEs and its float4s) in flight at once, one
// L2 round trip a chunk, merged chunk by chunk online. kL2: loads that bypass L1 (ld.global.cg),
// for a kernel that reads partials other CTAs of its own grid wrote.
template <bool kL2 = false>
__device__ __forceinline__ void merge_parts(const DecodeParams& p, int first, int last, int g,
                                            int stride, int rows_pad, int fr, int c,
                                            RunningMerge& r) {
  for (int base = first + g; base <= last; base += kMergeChunk * stride) {
    float lse[kMergeChunk];
    float4 x[kMergeChunk];
#pragma unroll
    for (int k = 0; k < kMergeChunk; ++k) {  // every load of the chunk first
      const int part = base + k * stride;
      if (part <= last) {
        const int64_t slot = partial_slot(part, first);
        const float* lse_at = p.partial_lse + slot * rows_pad + fr;
        const float4* x_at =
            reinterpret_cast<const float4*>(p.partial_o + (slot * rows_pad + fr) * kContentDim) + c;
        lse[k] = kL2 ? __ldcg(lse_at) : *lse_at;
        x[k] = kL2 ? __ldcg(x_at) : *x_at;
      } else {
        lse[k] = -INFINITY;
        x[k] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    float m_chunk = r.m;
#pragma unroll
    for (int k = 0; k < kMergeChunk; ++k) {
      r.nan_seen |= lse[k] != lse[k];
      m_chunk = fmaxf(m_chunk, lse[k]);  // (fmaxf drops a NaN: nan_seen keeps it)
    }
    if (m_chunk == -INFINITY) continue;  // nothing visible yet
    r.raise_to(m_chunk);
#pragma unroll
    for (int k = 0; k < kMergeChunk; ++k) {
      if (base + k * stride <= last && lse[k] == lse[k]) r.add(lse[k], x[k]);
    }
  }
}

// The merged row's float4 column c of request b's row fr into out (BF16, or the fp32 values the
// BF16 store would round where the caller asked for fp32), and the row's lse from column 0.
__device__ __forceinline__ void store_merged(const DecodeParams& p, int b, int fr, int c,
                                             const RunningMerge& r) {
  float4 out;
  float lse;
  if (r.nan_seen) {
    lse = __int_as_float(0x7fffffff);
    out = make_float4(lse, lse, lse, lse);
  } else if (r.m == -INFINITY) {  // no visible token in any segment
    lse = INFINITY;
    out = make_float4(0.f, 0.f, 0.f, 0.f);
  } else {
    const float inv = 1.f / r.w;
    out = make_float4(r.acc.x * inv, r.acc.y * inv, r.acc.z * inv, r.acc.w * inv);
    lse = r.m + logf(r.w);
  }
  const int rows_total = p.q_len * p.num_heads;
  const int64_t at = (int64_t{b} * rows_total + fr) * kContentDim + 4 * c;
  if (p.out_f32 != nullptr) {
    *reinterpret_cast<float4*>(p.out_f32 + at) = out;
  } else {
    *reinterpret_cast<uint2*>(p.out + at) =
        make_uint2(pack_bf16x2(out.x, out.y), pack_bf16x2(out.z, out.w));
  }
  if (c == 0 && p.lse != nullptr) p.lse[lse_index(p, b, fr)] = lse;
}

}  // namespace decode
}  // namespace snapmla
