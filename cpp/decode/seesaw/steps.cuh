// Steps of a block that the seesaw kernel (kernel.cuh) and the role-split kernel (roles.cuh)
// share: a stage's loads, V^T fragments with the edge masks, the PV's promotion and the
// epilogue's row stores.
#pragma once

#include "decode/seesaw/config.h"
#include "decode/seesaw/fragments.cuh"
#include "decode/segment.cuh"
#include "decode/sm90.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

// 2^x, flushing results below 2^-126 to zero (MUFU.EX2 as it is).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// The softmax evaluates e = 2^(z - m) <= 1 as 2^(z - m + 24) 2^-24: results down to 2^-150
// (below which fp32 holds nothing) stay above the flush threshold.
constexpr float kExpShift = 24.f;
constexpr float kExpUnshift = 5.9604644775390625e-08f;  // 2^-24


// SNAPMLA_SEESAW_KV_EVICT_FIRST (1, the default since session 19; 0 for plain loads): the KV
// pages' TMA loads with an L2 evict-first policy (a decode step reads each page once), so that
// the split partials the kernel writes (8x128x4096: 16.8 MB) stay in L2 for the combine. Same
// call on the H200 (bench/results/2026-12-02-s19/, graph replays of the whole call): 8x1x128x4096
// 34.0 -> 32.8 us, 64x1x128x4096 124.4 -> 122.9, 1x1x128x8192 20.9 -> 20.4, the rest level;
// every output bit the same (bench/dump_decode.py).
#ifndef SNAPMLA_SEESAW_KV_EVICT_FIRST
#define SNAPMLA_SEESAW_KV_EVICT_FIRST 1
#endif

// Content half `half` (chunks 2 half, 2 half + 1) of `page` into stage `st`, arriving on `bar`
// with its bytes; a page outside the layer loads nothing, sets `bad_page` and arrives.
__device__ __forceinline__ void load_content_half(SharedStorage::Stage& st, uint64_t* bar,
                                                  const TensorMaps& maps, int half, int32_t page,
                                                  int32_t num_pages, int32_t& bad_page) {
  if (!(page >= 0 && page < num_pages)) {
    bad_page = 1;
    return sm90::mbar_arrive(bar);
  }
  sm90::mbar_arrive_expect_tx(bar, kContentHalfTx);
  const uint64_t policy = SNAPMLA_SEESAW_KV_EVICT_FIRST != 0 ? sm90::l2_evict_first_policy() : 0;
#pragma unroll
  for (int c = 2 * half; c < 2 * half + 2; ++c) {
    if constexpr (SNAPMLA_SEESAW_KV_EVICT_FIRST != 0) {
      sm90::tma_load_3d_hint(st.content[c], &maps.k_content, bar, c * kChunkBytes, 0, page,
                             policy);
    } else {
      sm90::tma_load_3d(st.content[c], &maps.k_content, bar, c * kChunkBytes, 0, page);
    }
  }
}

// The RoPE tile and the scales of `page` into stage `st` (as load_content_half).
__device__ __forceinline__ void load_rope_scale(SharedStorage::Stage& st, uint64_t* bar,
                                                const TensorMaps& maps, int32_t page,
                                                int32_t num_pages, int32_t& bad_page) {
  if (!(page >= 0 && page < num_pages)) {
    bad_page = 1;
    return sm90::mbar_arrive(bar);
  }
  sm90::mbar_arrive_expect_tx(bar, kRopeScaleTx);
  if constexpr (SNAPMLA_SEESAW_KV_EVICT_FIRST != 0) {
    const uint64_t policy = sm90::l2_evict_first_policy();
    sm90::tma_load_3d_hint(st.rope, &maps.k_rope, bar, 0, 0, page, policy);
    sm90::tma_load_2d_hint(st.scale, &maps.k_scale, bar, 0, page, policy);
  } else {
    sm90::tma_load_3d(st.rope, &maps.k_rope, bar, 0, 0, page);
    sm90::tma_load_2d(st.scale, &maps.k_scale, bar, 0, page);
  }
}

// Bytes of a V^T register whose tokens tb + {0, 1, 8, 9} are below `valid` (0xff each).
__device__ __forceinline__ uint32_t valid_token_bytes(int tb, int valid) {
  return (tb < valid ? 0xffu : 0u) | (tb + 1 < valid ? 0xff00u : 0u) |
         (tb + 8 < valid ? 0xff0000u : 0u) | (tb + 9 < valid ? 0xff000000u : 0u);
}

// Zero the E4M3 NaN codes (0x7f, 0xff) of four packed bytes.
__device__ __forceinline__ uint32_t zero_nan_bytes(uint32_t w) {
  return w & ~__vcmpeq4(w & 0x7f7f7f7fu, 0x7f7f7f7fu);
}

// The edge masks of k-step ks's V^T A fragment (tokens from `valid` up cleared), and their
// application, which also zeroes NaN codes (a NaN there must not reach rows whose P8 is 0;
// elsewhere a NaN in V reaches every row through its logit anyway).
__device__ __forceinline__ void vt_kstep_masks(int ks, int t, int valid, uint32_t (&vmask)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) vmask[hh] = valid_token_bytes(32 * ks + 16 * hh + 2 * t, valid);
}
__device__ __forceinline__ void mask_vt_fragment(uint32_t (&a)[4], const uint32_t (&vmask)[2]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = zero_nan_bytes(a[j] & vmask[j / 2]);
}

// V^T A fragments (both k-steps) at `addr` (a content chunk's shared address plus the lane's
// ldmatrix offset). kEdge (a block some row does not see whole): masked (above).
template <bool kEdge>
__device__ __forceinline__ void vt_fragments_masked(uint32_t addr, int t, int valid,
                                                    uint32_t (&a)[2][4]) {
  uint32_t vmask[2][2];
  if constexpr (kEdge) {
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) vt_kstep_masks(ks, t, valid, vmask[ks]);
  }
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    vt_fragment(addr + 32 * kChunkBytes * ks, a[ks]);
    if constexpr (kEdge) mask_vt_fragment(a[ks], vmask[ks]);
  }
}

// The promotion: O^T m-tile `o` = gamma O^T + T over its 8-column tiles [col0, col0 + kCols)
// (query rows 8 col + 2 t, + 1), for a temporary T of 4 kCols registers; gamma read from the
// block's statistics where it is used.
template <int kNRegs, int kTmpRegs>
__device__ __forceinline__ void promote_cols(float (&o)[kNRegs], int col0, float (&tmp)[kTmpRegs],
                                             const float* gamma, int t) {
  constexpr int kCols = kTmpRegs / 4;
  sm90::fence_regs(tmp);
#pragma unroll
  for (int nn = 0; nn < kCols; ++nn) {
    const int col = col0 + nn;
    const float2 gm = *reinterpret_cast<const float2*>(&gamma[8 * col + 2 * t]);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      o[4 * col + c] = fmaf(o[4 * col + c], c & 1 ? gm.y : gm.x, tmp[4 * nn + c]);
    }
  }
}

// The epilogue's stores of a thread's O^T (latent d0 + 64 m, + 1 of query rows 8 nn + 2 t + c1),
// times the row's 1/l: into the split partial of seg.slot, or into out (BF16 or fp32). kDryRun
// (timing builds, SNAPMLA_SEESAW_TRACE_NO_EPILOGUE_STORES): computes, stores nothing.
template <bool kDryRun = false, int kMTiles, int kNRegs>
__device__ __forceinline__ void store_o_rows(const DecodeParams& p, const float (&o)[kMTiles][kNRegs],
                                             const float* inv_l_of, int b, int tile,
                                             int rows_total, int d0, int t, const Segment& seg) {
  // Row (nn, c1): query row 8 nn + 2 t + c1, its values o[m][4 nn + c1] and o[m][4 nn + 2 + c1]
  // (latent d0 + 64 m and + 1). One loop per destination (a uniform branch outside them).
  auto each_row = [&](auto&& store_row) {
#pragma unroll
    for (int nn = 0; nn < kNRegs / 4; ++nn) {
#pragma unroll
      for (int c1 = 0; c1 < 2; ++c1) {
        const int row = 8 * nn + 2 * t + c1, fr = tile * kRowsM + row;
        if (fr < rows_total) store_row(nn, c1, fr, inv_l_of[row]);
      }
    }
  };
  const bool to_partial = kDryRun ? inv_l_of[0] == 12345.f : seg.split;  // (dry: never)
  if (to_partial && SNAPMLA_PARTIAL_F16) {
    // (segment.cuh) The thread's 8 values of a row are its group partial_group(d0), all of it.
    const int64_t slot = seg.slot;
    const int group = partial_group(d0);
    each_row([&](int nn, int c1, int fr, float inv_l) {
      // (max |O| times 1/l > 0 is max |O / l| exactly: rounding is monotonic)
      float amax = 0.f;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        amax = fmaxf(amax, fmaxf(fabsf(o[m][4 * nn + c1]), fabsf(o[m][4 * nn + 2 + c1])));
      }
      const int e = partial_exponent(amax * inv_l);
      uint8_t* rec = partial_record(p, slot, fr);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        store_partial_pair(rec, d0 + 64 * m, o[m][4 * nn + c1], o[m][4 * nn + 2 + c1], inv_l,
                           pow2i(e));
      }
      store_partial_exponent(rec, group, e);
    });
  } else if (to_partial) {
    each_row([&](int nn, int c1, int fr, float inv_l) {
      float* dst = reinterpret_cast<float*>(partial_record(p, seg.slot, fr)) + d0;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        *reinterpret_cast<float2*>(dst + 64 * m) =
            make_float2(o[m][4 * nn + c1] * inv_l, o[m][4 * nn + 2 + c1] * inv_l);
      }
    });
  } else if (!kDryRun) {
    each_row([&](int nn, int c1, int fr, float inv_l) {
      const int64_t at = (int64_t{b} * rows_total + fr) * kContentDim + d0;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {  // BF16, or fp32 where asked (store_out2)
        store_out2(p, at + 64 * m, o[m][4 * nn + c1] * inv_l, o[m][4 * nn + 2 + c1] * inv_l);
      }
    });
  }
}


// The Q tile of rows [row0, row0 + 64) (content chunks and RoPE) onto q_bar, with its bytes.
__device__ __forceinline__ void load_q_tile(SharedStorage& s, const TensorMaps& maps,
                                            int64_t row0) {
  sm90::mbar_arrive_expect_tx(&s.q_bar, kQTx);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    sm90::tma_load_2d(s.q_content[c], &maps.q_content, &s.q_bar, c * kChunkBytes,
                      static_cast<int32_t>(row0));
  }
  sm90::tma_load_2d(s.q_rope, &maps.q_rope, &s.q_bar, 0, static_cast<int32_t>(row0));
}

// A row's maximum and sum over the four threads (t = lane % 4) that hold it in an S fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The softmax's first pass over a thread's S fragment (kElems = 2 x its rows: elements c <
// kElems of each 8-token group nn): u = logit(e) s_k in z[e] (e = 4 nn + c; tokens 8 nn + 2 t
// + c % 2, row c / 2), -inf where the row does not see the token (kFull: every token visible),
// and each row's maximum into mx. `scale` is the stage's 64 token scales.
template <int kElems, bool kFull, typename Logit>
__device__ __forceinline__ void scaled_logits(float (&z)[32], Logit logit, const float* scale,
                                              int t, int tok0, const int (&limit)[2],
                                              float (&mx)[2]) {
#pragma unroll
  for (int nn = 0; nn < 8; ++nn) {
    const float2 k2 = *reinterpret_cast<const float2*>(&scale[8 * nn + 2 * t]);
#pragma unroll
    for (int c = 0; c < kElems; ++c) {
      const int e = 4 * nn + c;
      const float u = logit(e) * (c & 1 ? k2.y : k2.x);
      if constexpr (kFull) {
        z[e] = u;
      } else {
        z[e] = tok0 + 8 * nn + 2 * t + (c & 1) < limit[c / 2] ? u : -INFINITY;
      }
      mx[c / 2] = fmaxf(mx[c / 2], z[e]);
    }
  }
}

// Its second pass: e = 2^(z rf + bias) (bias carries the 2^24 shift and the row's maximum),
// P' = e s_k 2^-24 in z (exactly 0 where the token is invisible: a select, its scale may be
// NaN), the rows' sums of e and maxima of P' into e_sum and p_max (thread-local).
template <int kElems, bool kFull>
__device__ __forceinline__ void exp_scaled(float (&z)[32], const float (&row_factor)[2],
                                           const float (&bias)[2], const float* scale, int t,
                                           float (&e_sum)[2], float (&p_max)[2]) {
#pragma unroll
  for (int nn = 0; nn < 8; ++nn) {
    const float2 k2 = *reinterpret_cast<const float2*>(&scale[8 * nn + 2 * t]);
    const float ks[2] = {k2.x * kExpUnshift, k2.y * kExpUnshift};
#pragma unroll
    for (int c = 0; c < kElems; ++c) {
      const int e = 4 * nn + c, ri = c / 2;
      const float ex = ex2_ftz(fmaf(z[e], row_factor[ri], bias[ri]));
      e_sum[ri] += ex;
      float pp = ex * ks[c & 1];
      if constexpr (!kFull) pp = z[e] == -INFINITY ? 0.f : pp;
      z[e] = pp;
      p_max[ri] = fmaxf(p_max[ri], pp);
    }
  }
}
// The same for a block chosen at run time: `full` (every row sees the whole block) picks the
// variant without the select.
template <int kElems>
__device__ __forceinline__ void exp_scaled(bool full, float (&z)[32], const float (&row_factor)[2],
                                           const float (&bias)[2], const float* scale, int t,
                                           float (&e_sum)[2], float (&p_max)[2]) {
  if (full) {
    exp_scaled<kElems, true>(z, row_factor, bias, scale, t, e_sum, p_max);
  } else {
    exp_scaled<kElems, false>(z, row_factor, bias, scale, t, e_sum, p_max);
  }
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
