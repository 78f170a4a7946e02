// Combine: merge the partials of split requests by log-sum-exp. Three kernels: one warp per
// query row (lane l owns latent columns [16l, 16l + 16)) for large launches; the wide and the
// grouped kernels below (one CTA a row) for small ones.
#include <algorithm>

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

// The parts [first, last] holding request b's partials, or false where the decode kernel wrote
// the request's rows itself (a plan that does not match, no blocks, blocks the plan counted for
// another seqlen, or a single part). The request's words and seqlen are read with the header's,
// one round trip (the host checked the plan buffer's size for these parameters: in bounds
// whatever the words hold).
__device__ __forceinline__ bool split_parts(const DecodeParams& p, int b, int* first, int* last) {
  const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
  const int32_t first_word = p.plan[L.first_part + b], last_word = p.plan[L.last_part + b];
  const int32_t nb_word = p.plan[L.nblocks + b], seqlen = p.seqlens[b];
  if (!plan_matches(p)) return false;  // the decode kernel wrote NaN rows
  *first = clamp_part(p, first_word);
  *last = clamp_part(p, last_word);
  return checked_blocks(p, nb_word, seqlen) > 0 && *first != *last;
}

// The wait for the attention kernel's partials and request b's parts; false where the request
// is not split (nothing to merge). The plan's words are read before the wait, so that their L2
// round trip overlaps the attention kernel's end (the plan kernel completed before the call's
// first kernel began). A CTA whose rows are not split leaves without waiting, except CTA (0, 0),
// whose wait keeps the combine from completing before the attention kernel does (a kernel after
// the combine may read the rows the attention kernel wrote itself).
__device__ __forceinline__ bool wait_and_split_parts(const DecodeParams& p, int b, int* first,
                                                     int* last) {
  const bool split = split_parts(p, b, first, last);
  if (!split && (blockIdx.x | blockIdx.y) != 0) return false;
  griddep_wait();  // the attention kernel's partials
  return split;
}

// The workspace slot of a part's partial for a request whose first part is `first`.
__device__ __forceinline__ int64_t partial_slot(int part, int first) {
  return 2 * part + (part == first ? 1 : 0);
}

// Columns [4 c, 4 c + 4) of row fr's partial in `slot`, loaded: the FP16 record's four values
// and their group's exponent (segment.cuh); value() gives the fp32 values (the FP16 ones times
// 2^-e, exactly). Load first, decode later, so that a chunk's loads are all in flight at once.
struct Partial4 {
  uint2 h;
  uint32_t e2;  // the int8 exponents of columns 4 c, 4 c + 1 (low byte) and 4 c + 2, 4 c + 3
  __device__ __forceinline__ float4 value() const {
    // 2^-e for e in [-114, 126]
    const float s0 = pow2i(-static_cast<int>(static_cast<int8_t>(e2 & 0xffu)));
    const float s1 = pow2i(-static_cast<int>(static_cast<int8_t>(e2 >> 8)));
    const float2 a = unpack_f16x2(h.x), b = unpack_f16x2(h.y);
    return make_float4(a.x * s0, a.y * s0, b.x * s1, b.y * s1);
  }
};
__device__ __forceinline__ Partial4 load_partial4(const DecodeParams& p, int64_t slot, int fr,
                                                  int c) {
  const uint8_t* rec = partial_record(p, slot, fr);
  // (partial_group(4 c) is even, partial_group(4 c + 2) the next: one 2-byte load)
  return {reinterpret_cast<const uint2*>(rec)[c],
          *reinterpret_cast<const uint16_t*>(rec + kPartialExpByte + partial_group(4 * c))};
}

// Raises m to the largest partial LSE of row fr over parts first + g, first + g + stride, ...
// <= last; sets nan_seen where one is NaN (which fmaxf drops).
__device__ __forceinline__ void max_partial_lse(const DecodeParams& p, int first, int last, int g,
                                                int stride, int rows_pad, int fr, bool& nan_seen,
                                                float& m) {
  for (int part = first + g; part <= last; part += stride) {
    const float v = p.partial_lse[partial_slot(part, first) * rows_pad + fr];
    nan_seen |= (v != v);
    m = fmaxf(m, v);
  }
}

// acc += w O_s over the lane's 16 columns of row fr in partial slot `slot`, w = exp(lse_s - m);
// returns w.
__device__ __forceinline__ float add_partial(const DecodeParams& p, int64_t slot, int rows_pad,
                                             int fr, int lane, float m,
                                             float (&acc)[kColsPerLane]) {
  const float w = expf(p.partial_lse[slot * rows_pad + fr] - m);
  Partial4 src[kColsPerLane / 4];
#pragma unroll
  for (int v = 0; v < kColsPerLane / 4; ++v) {
    src[v] = load_partial4(p, slot, fr, lane * (kColsPerLane / 4) + v);
  }
#pragma unroll
  for (int v = 0; v < kColsPerLane / 4; ++v) {
    const float4 x = src[v].value();
    acc[4 * v] += w * x.x;
    acc[4 * v + 1] += w * x.y;
    acc[4 * v + 2] += w * x.z;
    acc[4 * v + 3] += w * x.w;
  }
  return w;
}

// Row fr of request b: the lane's 16 columns as BF16 (two 16-byte stores), or as the fp32
// values that BF16 rounds where the caller asked for fp32 (p.out_f32; four 16-byte stores),
// and the lse.
__device__ __forceinline__ void store_row(const DecodeParams& p, int b, int rows_total, int fr,
                                          int lane, const float (&acc)[kColsPerLane], float lse) {
  const int64_t at = (int64_t{b} * rows_total + fr) * kContentDim + lane * kColsPerLane;
  if (p.out_f32 != nullptr) {
    float4* dst = reinterpret_cast<float4*>(p.out_f32 + at);
#pragma unroll
    for (int v = 0; v < kColsPerLane / 4; ++v) {
      dst[v] = make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]);
    }
  } else {
    uint32_t packed[kColsPerLane / 2];
#pragma unroll
    for (int c = 0; c < kColsPerLane / 2; ++c) packed[c] = pack_bf16x2(acc[2 * c], acc[2 * c + 1]);
    uint4* dst = reinterpret_cast<uint4*>(p.out + at);
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  }
  if (lane == 0 && p.lse != nullptr) p.lse[lse_index(p, b, fr)] = lse;
}

__global__ void __launch_bounds__(kThreads) combine_kernel(const DecodeParams p) {
  const int b = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int fr = blockIdx.y * kRowsPerBlock + threadIdx.x / 32;
  const int rows_total = p.q_len * p.num_heads;
  int first, last;  // no parts: a row past the step's, or written by the decode kernel
  if (fr >= rows_total || !wait_and_split_parts(p, b, &first, &last)) return;
  const int rows_pad = p.row_tiles * kTileRows;

  // Pass 1: the largest partial LSE; NaN anywhere poisons the row.
  float m = -INFINITY;
  bool has_nan = false;
  max_partial_lse(p, first, last, 0, 1, rows_pad, fr, has_nan, m);
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
      w_sum += add_partial(p, partial_slot(part, first), rows_pad, fr, lane, m, acc);
    }
    const float inv = 1.f / w_sum;
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) acc[c] *= inv;
    lse = m + logf(w_sum);
  }
  store_row(p, b, rows_total, fr, lane, acc, lse);
}

// The wide combine: one CTA per query row, its 8 warps taking every 8th part, then one warp
// adds the 8 partial sums. The one-warp-per-row kernel above walks a row's parts in series, a
// dependent L2 round trip each, which at batch 1 takes as long as the attention kernel itself;
// the wide one has 8x the CTAs, which costs where the grid is large already: it runs where
// batch x rows is at most kWideMaxRows.
constexpr int64_t kWideMaxRows = 512;
constexpr int kWideWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) combine_wide_kernel(const DecodeParams p) {
  // each warp's weighted sum, [warp][float4 v][lane]: a warp's float4 stores and loads are
  // consecutive (no bank conflicts)
  __shared__ float4 slice[kWideWarps][kColsPerLane / 4][32];
  __shared__ float slice_w[kWideWarps];                        // and its weight sum
  const int b = blockIdx.x, fr = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows_total = p.q_len * p.num_heads;
  int first, last;  // no parts: a row past the step's, or written by the decode kernel
  if (fr >= rows_total || !wait_and_split_parts(p, b, &first, &last)) return;
  const int rows_pad = p.row_tiles * kTileRows;

  // Pass 1, in every warp: the largest partial LSE, the lanes over the parts; NaN anywhere
  // poisons the row.
  bool nan_seen = false;
  float m = -INFINITY;
  max_partial_lse(p, first, last, lane, 32, rows_pad, fr, nan_seen, m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const bool has_nan = __any_sync(0xffffffffu, nan_seen);

  float acc[kColsPerLane] = {};
  float lse;
  if (has_nan || m == -INFINITY) {  // every warp agrees: warp 0 writes the row
    if (warp != 0) return;
    lse = has_nan ? __int_as_float(0x7fffffff) : INFINITY;  // NaN row, or no visible token
    if (has_nan) {
#pragma unroll
      for (int c = 0; c < kColsPerLane; ++c) acc[c] = lse;
    }
  } else {
    // Pass 2: warp w adds w_s O_s over parts first + w, first + w + 8, ...; w_s = exp(lse_s - m).
    float w_sum = 0.f;
#pragma unroll 2
    for (int part = first + warp; part <= last; part += kWideWarps) {
      w_sum += add_partial(p, partial_slot(part, first), rows_pad, fr, lane, m, acc);
    }
#pragma unroll
    for (int v = 0; v < kColsPerLane / 4; ++v) {
      slice[warp][v][lane] = make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]);
    }
    if (lane == 0) slice_w[warp] = w_sum;
    __syncthreads();
    if (warp != 0) return;
    w_sum = 0.f;
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) acc[c] = 0.f;
    for (int k = 0; k < kWideWarps; ++k) {  // in warp order: deterministic
      w_sum += slice_w[k];
#pragma unroll
      for (int v = 0; v < kColsPerLane / 4; ++v) {
        const float4 x = slice[k][v][lane];
        acc[4 * v] += x.x;
        acc[4 * v + 1] += x.y;
        acc[4 * v + 2] += x.z;
        acc[4 * v + 3] += x.w;
      }
    }
    const float inv = 1.f / w_sum;
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) acc[c] *= inv;
    lse = m + logf(w_sum);
  }
  store_row(p, b, rows_total, fr, lane, acc, lse);
}

// The grouped combine: one CTA a row, kGroups groups of 128 threads; thread c of a group owns
// latent columns [4c, 4c + 4) (a row's partial read by one 8-byte load a thread, coalesced);
// group g walks parts first + g, first + g + kGroups, ... in chunks of kChunk with every load of
// a chunk (its LSEs and its values) in flight at once, one L2 round trip a chunk, merging chunk
// by chunk online (the running maximum rescales what it has added); then the groups merge
// through shared memory, in group order. The launcher picks kGroups for about one chunk a group
// and uses it only where its CTAs fit one wave (beyond, the wide kernel is faster).
constexpr int kRowThreads = kContentDim / 4;  // 128: a float4 each
constexpr int kChunk = 8;

// A group's running merge: acc = sum_s exp(lse_s - m) O_s (its 4 columns),
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

// Parts first + g, first + g + stride, ... <= last of row fr, column group c, into r.
__device__ __forceinline__ void merge_parts(const DecodeParams& p, int first, int last, int g,
                                            int stride, int rows_pad, int fr, int c,
                                            RunningMerge& r) {
  for (int base = first + g; base <= last; base += kChunk * stride) {
    float lse[kChunk];
    Partial4 x[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {  // every load of the chunk first
      const int part = base + k * stride;
      if (part <= last) {
        const int64_t slot = partial_slot(part, first);
        lse[k] = p.partial_lse[slot * rows_pad + fr];
        x[k] = load_partial4(p, slot, fr, c);
      } else {
        lse[k] = -INFINITY;  // (x[k] is never read)
      }
    }
    float m_chunk = r.m;
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      r.nan_seen |= lse[k] != lse[k];
      m_chunk = fmaxf(m_chunk, lse[k]);  // (fmaxf drops a NaN: nan_seen keeps it)
    }
    if (m_chunk == -INFINITY) continue;  // nothing visible yet
    r.raise_to(m_chunk);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (base + k * stride <= last && lse[k] == lse[k]) r.add(lse[k], x[k].value());
    }
  }
}

template <int kGroups>
__global__ void __launch_bounds__(kRowThreads* kGroups)
    combine_grouped_kernel(const DecodeParams p) {
  // groups 1 .. kGroups - 1's merges, for group 0 to add in group order (deterministic)
  constexpr int kOthers = kGroups > 1 ? kGroups - 1 : 1;
  __shared__ float4 g_acc[kOthers][kRowThreads];
  __shared__ float g_m[kOthers], g_w[kOthers];
  __shared__ int g_nan[kOthers];
  const int b = blockIdx.x, fr = blockIdx.y;
  const int c = threadIdx.x % kRowThreads, g = threadIdx.x / kRowThreads;
  const int rows_total = p.q_len * p.num_heads;
  int first, last;  // no parts: a row past the step's, or written by the decode kernel
  if (fr >= rows_total || !wait_and_split_parts(p, b, &first, &last)) return;
  const int rows_pad = p.row_tiles * kTileRows;

  RunningMerge r;
  merge_parts(p, first, last, g, kGroups, rows_pad, fr, c, r);
  if constexpr (kGroups > 1) {
    if (g > 0) {
      g_acc[g - 1][c] = r.acc;
      if (c == 0) {
        g_m[g - 1] = r.m;
        g_w[g - 1] = r.w;
      }
    }
    // a group's NaN anywhere poisons the row (any thread of it saw it: all read the same LSEs)
    if (g > 0 && c == 0) g_nan[g - 1] = r.nan_seen ? 1 : 0;
    __syncthreads();
    if (g > 0) return;
#pragma unroll 1
    for (int k = 0; k < kGroups - 1; ++k) {
      r.nan_seen |= g_nan[k] != 0;
      const float mk = g_m[k];
      if (mk == -INFINITY) continue;
      if (mk > r.m) r.raise_to(mk);
      const float f = expf(mk - r.m);
      const float4 a = g_acc[k][c];
      r.w += f * g_w[k];
      r.acc.x += f * a.x;
      r.acc.y += f * a.y;
      r.acc.z += f * a.z;
      r.acc.w += f * a.w;
    }
  }
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
  const int64_t at = (int64_t{b} * rows_total + fr) * kContentDim + 4 * c;
  if (p.out_f32 != nullptr) {  // the fp32 values the BF16 store below rounds
    *reinterpret_cast<float4*>(p.out_f32 + at) = out;
  } else {
    *reinterpret_cast<uint2*>(p.out + at) =
        make_uint2(pack_bf16x2(out.x, out.y), pack_bf16x2(out.z, out.w));
  }
  if (c == 0 && p.lse != nullptr) p.lse[lse_index(p, b, fr)] = lse;
}

}  // namespace

cudaError_t launch_combine(const DecodeParams& p, cudaStream_t stream) {
  const int rows_total = p.q_len * p.num_heads;
  const int64_t rows = int64_t{p.batch} * rows_total;
  if (rows_total <= 65535) {  // (the grid's y)
    // Parts a request gets from the plan when lengths are equal (the aligned plan's k parts a
    // request with batch x k <= num_parts; the host knows no lengths, and a request with more
    // takes more chunks), at most one per two blocks.
    const int parts = std::max(1, std::min(p.num_parts / p.batch, (p.max_pages + 1) / 2));
    int groups = 1;
    while (groups < 8 && groups * kChunk < parts) groups *= 2;
    // The grouped CTAs in one wave: 1024 threads an SM at their 64 registers, and the plan's
    // num_parts x row_tiles CTAs are about the SMs (no device query on the decode path).
    const int64_t sms = int64_t{p.num_parts} * p.row_tiles;
    if (rows * groups * kRowThreads <= sms * 1024) {
      auto launch = [&](auto kernel) {
        return launch_dependent(kernel, dim3(p.batch, rows_total), dim3(groups * kRowThreads), 0,
                                stream, p);
      };
      switch (groups) {
        case 1: return launch(combine_grouped_kernel<1>);
        case 2: return launch(combine_grouped_kernel<2>);
        case 4: return launch(combine_grouped_kernel<4>);
        default: return launch(combine_grouped_kernel<8>);
      }
    }
    if (rows <= kWideMaxRows) {
      return launch_dependent(combine_wide_kernel, dim3(p.batch, rows_total), dim3(kThreads), 0,
                              stream, p);
    }
  }
  const dim3 grid(p.batch, (rows_total + kRowsPerBlock - 1) / kRowsPerBlock);
  return launch_dependent(combine_kernel, grid, dim3(kThreads), 0, stream, p);
}

}  // namespace decode
}  // namespace snapmla
