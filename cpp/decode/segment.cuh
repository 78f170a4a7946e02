// Pieces of the decode kernels that do not depend on how the attention is computed: which
// blocks of a request a part owns, the rows of empty or invalid requests, and the epilogue that
// turns a row's (O, l, m, sigma) into out and lse, or into a split partial.
//
// Thread layout shared by both kernels: a warp owns 16 query rows (16 * row_group + g and
// + 8, g = lane / 4) and, in its accumulator, the columns col0 + 8 n + 2 (lane % 4) + {0, 1}
// for n = 0 .. 31: the mma.sync m16n8 / wgmma m64nN fragment layout.
#pragma once

#include <stddef.h>

#include "common/numerics.cuh"
#include "decode/decode.h"

namespace snapmla {
namespace decode {

constexpr int kColTiles = 32;  // 8-column tiles of O per thread row-pair (256 columns)

struct Segment {
  int blk_lo, blk_hi;  // blocks [blk_lo, blk_hi) of the request
  bool split;          // the request spans several parts: write a partial
  int slot;            // partial slot (when split)
};

enum class SegmentKind { kSkip, kEmptyWritten, kRun };

// Where row fr (flattened s_q x heads) of request b puts its lse in the final [b, h, s_q] array.
__device__ __forceinline__ int64_t lse_index(const DecodeParams& p, int b, int fr) {
  return (int64_t{b} * p.num_heads + fr % p.num_heads) * p.q_len + fr / p.num_heads;
}

// out's elements i and i + 1 (i even: 8-byte aligned in fp32): BF16, rounded to nearest even,
// or, where the caller asked for fp32 (p.out_f32), the values themselves, which that rounding
// would take. A uniform branch on a kernel parameter, in epilogues only.
__device__ __forceinline__ void store_out2(const DecodeParams& p, int64_t i, float lo, float hi) {
  if (p.out_f32 != nullptr) {
    *reinterpret_cast<float2*>(p.out_f32 + i) = make_float2(lo, hi);
  } else {
    *reinterpret_cast<uint32_t*>(p.out + i) = pack_bf16x2(lo, hi);
  }
}

// How a split request's part stores its partial O / l. A row's record keeps its 2 KB workspace
// slot: bytes [0, 1024) are the 512 values as FP16 (round to nearest even) times 2^e_G, and
// bytes [1024, 1088) the 64 exponents e_G as int8, one a group of 8 columns: G =
// partial_group(d), the columns one thread of the sm90 epilogue holds (d0 + 64 m and d0 + 64 m +
// 1, m < 4, d0 = 256 wg + 16 warp + 2 g), so that no exponent needs a value from another lane.
// e_G puts the group's largest |value| in [2^14, 2^15) (partial_exponent); its other values keep
// FP16's 11 bits down to 2^-28 of it (2^-11 relative, far under the contract's bounds), and a
// tiny, infinite or NaN value stays what it was. The combine multiplies 2^-e_G back (exact). Half
// the bytes of fp32 partials, which the epilogue writes and the combine reads (at 8x1x128x4096
// as many as the KV cache).
constexpr int kPartialExpByte = 2 * kContentDim;  // a record's first exponent byte

// Row fr's record in partial slot `slot`.
__device__ __forceinline__ uint8_t* partial_record(const DecodeParams& p, int64_t slot, int fr) {
  return reinterpret_cast<uint8_t*>(p.partial_o +
                                    (slot * p.row_tiles * kTileRows + fr) * kContentDim);
}
// The exponent group of latent column d (8 columns: d % 16 / 2 and d / 64 % 4 vary inside).
__device__ __forceinline__ int partial_group(int d) {
  return 32 * (d / 256) + 8 * (d % 64 / 16) + d % 16 / 2;
}
// e with amax 2^e in [2^14, 2^15) for amax = 2^E (1 + f), E >= -112; 126 below (zero, tiny, and
// fp32 subnormal groups); -114 for an infinite or NaN amax (2^-114 keeps them what they are).
__device__ __forceinline__ int partial_exponent(float amax) {
  const int biased = static_cast<int>((__float_as_uint(amax) >> 23) & 0xffu);  // E + 127
  return min(141 - biased, 126);
}
// 2^e for e in [-126, 127], exactly.
__device__ __forceinline__ float pow2i(int e) {
  return __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
}
// Two values as FP16 (round to nearest even), lo at the lower address.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// A record's columns d, d + 1: the values O a, O b times 1 / l, then times 2^e (in that order:
// inv_l 2^e may overflow where the group is all zero), as FP16.
__device__ __forceinline__ void store_partial_pair(uint8_t* rec, int d, float a, float b,
                                                   float inv_l, float scale) {
  *reinterpret_cast<uint32_t*>(rec + 2 * d) = pack_f16x2(a * inv_l * scale, b * inv_l * scale);
}
// A record's exponent of group `group`.
__device__ __forceinline__ void store_partial_exponent(uint8_t* rec, int group, int e) {
  rec[kPartialExpByte + group] = static_cast<uint8_t>(static_cast<int8_t>(e));
}
// And back.
__device__ __forceinline__ float2 unpack_f16x2(uint32_t v) {
  float lo, hi;
  asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
      : "=f"(lo), "=f"(hi)
      : "r"(v));
  return make_float2(lo, hi);
}

// Rows of a request with no blocks (empty: out 0, lse +inf; invalid seqlen, or one the plan
// was not built for: NaN), written by the part where the request starts.
__device__ inline void write_empty_request(const DecodeParams& p, int b, int tile, bool invalid) {
  const int rows_total = p.q_len * p.num_heads;
  const float fill_out = invalid ? __int_as_float(0x7fffffff) : 0.f;
  const float fill_lse = invalid ? __int_as_float(0x7fffffff) : INFINITY;
  for (int i = threadIdx.x; i < kTileRows * kContentDim; i += blockDim.x) {
    const int fr = tile * kTileRows + i / kContentDim;
    if (fr >= rows_total) break;
    const int64_t at = (int64_t{b} * rows_total + fr) * kContentDim + i % kContentDim;
    if (p.out_f32 != nullptr) {
      p.out_f32[at] = fill_out;
    } else {
      p.out[at] = float_to_bf16_bits(fill_out);
    }
  }
  if (p.lse == nullptr) return;
  for (int r = threadIdx.x; r < kTileRows; r += blockDim.x) {
    const int fr = tile * kTileRows + r;
    if (fr >= rows_total) break;
    p.lse[lse_index(p, b, fr)] = fill_lse;
  }
}

// The plan's header against the launch's own shape: a plan built for another config (the
// query's precision included) or another GPU's SM count, or never built, does not match, and the
// launch writes NaN rows instead of following it (its words would index requests and partial
// slots out of bounds, and the workspace is laid out for its shape).
__device__ __forceinline__ bool plan_matches(const DecodeParams& p) {
  static_assert(PlanShape::kWords == 8 && offsetof(PlanHeader, part_cost) == 32,
                "the header is two 16-byte words and the part cost");
  // Issued together (the plan is 16-byte aligned) and compared without branches: every CTA's
  // start waits on these loads.
  const int4 a = __ldg(reinterpret_cast<const int4*>(p.plan));
  const int4 b = __ldg(reinterpret_cast<const int4*>(p.plan) + 1);
  const int32_t part_cost = __ldg(p.plan + 8);
  const int q_terms = p.q_lo != nullptr ? 2 : 1;
  return (a.x == kPlanMagic) & (a.y == p.batch) & (a.z == p.num_parts) & (a.w == p.row_tiles) &
         (b.x == p.q_len) & (b.y == p.num_heads) & (b.z == p.max_pages) & (b.w == q_terms) &
         (part_cost > 0);
}

// Request b's blocks: the plan's word where it is what the seqlen the launch reads gives, else
// -1 (NaN rows). A plan reused after a seqlen crossed a page boundary would leave the newest
// tokens out (the blocks come from the plan, the seqlen only masks): its request is refused.
__device__ __forceinline__ int32_t checked_blocks(const DecodeParams& p, int32_t nb_word,
                                                  int32_t seqlen) {
  return nb_word == blocks_of(seqlen, p.max_pages) ? nb_word : -1;
}

// Every row of tile `tile` of requests part, part + num_parts, ...: NaN out and lse (a launch of
// (num_parts, row_tiles) CTAs covers each row once).
__device__ inline void write_nan_rows(const DecodeParams& p, int part, int tile) {
  for (int b = part; b < p.batch; b += p.num_parts) write_empty_request(p, b, tile, true);
}

// The requests part `part` touches, clamped into the batch.
struct RequestRange {
  int begin, end;  // inclusive
};
__device__ __forceinline__ RequestRange part_requests(const DecodeParams& p, const PlanLayout& L,
                                                      int part) {
  return {max(p.plan[L.part_begin + part], 0), min(p.plan[L.part_end + part], p.batch - 1)};
}

// A part index read from the plan, clamped into the launch (partial slots stay in bounds).
__device__ __forceinline__ int32_t clamp_part(const DecodeParams& p, int32_t part) {
  return min(max(part, 0), p.num_parts - 1);
}

// What part `part` does for request b: nothing, write its empty rows (done here), or run the
// blocks in `seg`.
__device__ inline SegmentKind plan_segment(const DecodeParams& p, const PlanLayout& L, int part,
                                           int b, int tile, Segment* seg) {
  // Every word first, one round trip (b < batch: in the plan's bounds).
  const int32_t nb_word = p.plan[L.nblocks + b], first_word = p.plan[L.first_part + b];
  const int32_t last_word = p.plan[L.last_part + b], prefix_word = p.plan[L.prefix + b];
  const int32_t T = reinterpret_cast<const PlanHeader*>(p.plan)->part_cost;
  const int32_t nb = checked_blocks(p, nb_word, p.seqlens[b]);
  const int32_t first_part = clamp_part(p, first_word);
  if (nb <= 0) {
    if (part != first_part) return SegmentKind::kSkip;
    write_empty_request(p, b, tile, nb < 0);
    return SegmentKind::kEmptyWritten;
  }
  const int32_t start = prefix_word + kFixedCost;
  seg->blk_lo = max(0, static_cast<int>(int64_t{part} * T - start));
  seg->blk_hi = min(nb, static_cast<int>(int64_t{part + 1} * T - start));
  seg->split = first_part != clamp_part(p, last_word);
  seg->slot = 2 * part + (part == first_part ? 1 : 0);
  return seg->blk_lo < seg->blk_hi ? SegmentKind::kRun : SegmentKind::kSkip;
}

// Visible tokens of flattened row `fr` (clamped into the request): j < limit.
__device__ __forceinline__ int visibility_limit(const DecodeParams& p, int fr, int seqlen) {
  const int rows_total = p.q_len * p.num_heads;
  const int qt = min(fr, rows_total - 1) / p.num_heads;
  return p.causal ? seqlen - p.q_len + 1 + qt : seqlen;
}

// What a row's (l, m, sigma) turn into: 1 / l, and lse = m ln2 + ln(sigma l) (m is in the log2
// domain). A bad page makes the row NaN; a row that saw no token is out 0 with lse +inf (or
// -inf in a split partial, so the combine gives it no weight).
struct RowResult {
  float inv_l, lse;
};
__device__ __forceinline__ RowResult row_result(float l, float m, float sig, bool bad_page,
                                                bool split) {
  if (bad_page) return {__int_as_float(0x7fffffff), __int_as_float(0x7fffffff)};
  const bool empty = !(l > 0.f) && l == l;
  if (empty) return {0.f, split ? -INFINITY : INFINITY};
  return {1.f / l, m * kLn2 + logf(sig * l)};
}

// Where row fr of request b puts its lse: the final [b, h, s_q] array or a split partial.
__device__ __forceinline__ void store_lse(const DecodeParams& p, int b, int fr, const Segment& seg,
                                          float lse) {
  if (seg.split) {
    p.partial_lse[int64_t{seg.slot} * p.row_tiles * kTileRows + fr] = lse;
  } else if (p.lse != nullptr) {
    p.lse[lse_index(p, b, fr)] = lse;
  }
}

// Epilogue of row I (0: fragment row g, 1: g + 8): out = O / l (or the partial O / l) and lse.
// o[n][2 I], o[n][2 I + 1] are the row's columns col0 + 8 n + 2 t4 and + 1.
template <int I>
__device__ __forceinline__ void write_row(const DecodeParams& p, int b, int fr, int col0, int t4,
                                          const float (&o)[kColTiles][4], float l, float m,
                                          float sig, bool bad_page, const Segment& seg,
                                          bool writes_lse) {
  const int rows_total = p.q_len * p.num_heads;
  if (fr >= rows_total) return;
  const RowResult res = row_result(l, m, sig, bad_page, seg.split);
  const float inv_l = res.inv_l;
  if (seg.split) {
    // Column col0 + 8 n + 2 t4 (+ 1) is in group partial_group(col0) + 8 (n % 8 / 2) + 4 (n % 2)
    // + t4: this thread holds all 8 values of each of its 8 groups (n % 8 fixed, n / 8 < 4).
    uint8_t* rec = partial_record(p, seg.slot, fr);
    float amax[8] = {};
#pragma unroll
    for (int n = 0; n < kColTiles; ++n) {
      amax[n % 8] = fmaxf(amax[n % 8], fmaxf(fabsf(o[n][2 * I]), fabsf(o[n][2 * I + 1])));
    }
    int e[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      e[j] = partial_exponent(amax[j] * inv_l);  // (max |O| / l: rounding is monotonic)
      store_partial_exponent(rec, partial_group(col0 + 8 * j + 2 * t4), e[j]);
    }
#pragma unroll
    for (int n = 0; n < kColTiles; ++n) {
      store_partial_pair(rec, col0 + 8 * n + 2 * t4, o[n][2 * I], o[n][2 * I + 1], inv_l,
                         pow2i(e[n % 8]));
    }
  } else {
    const int64_t at = (int64_t{b} * rows_total + fr) * kContentDim + col0;
#pragma unroll
    for (int n = 0; n < kColTiles; ++n) {
      store_out2(p, at + 8 * n + 2 * t4, o[n][2 * I] * inv_l, o[n][2 * I + 1] * inv_l);
    }
  }
  if (writes_lse) store_lse(p, b, fr, seg, res.lse);
}

}  // namespace decode
}  // namespace snapmla
