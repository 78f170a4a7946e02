// PV and its promotion, every block: O^T[latent half wg] = gamma O^T + V^T P8^T, the product in
// an fp32 temporary added by the CUDA cores.
#pragma once

#include "decode/sm90/context.cuh"
#include "decode/sm90/wgmma.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

// D[64 latent x N rows] (+)= V^T[64 x 32 tokens] (registers) P8^T (shared memory).
template <int N, bool kInit>
__device__ __forceinline__ void wgmma_pv(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc) {
  kInit ? sm90::wgmma_m64nNk32_e4m3_rs_init<N>(d, a, desc)
        : sm90::wgmma_m64nNk32_e4m3_rs<N>(d, a, desc, 1);
}

__device__ __forceinline__ void wgmma_wait_upto3(int n) {
  switch (n) {
    case 0:
      sm90::wgmma_wait<0>();
      break;
    case 1:
      sm90::wgmma_wait<1>();
      break;
    case 2:
      sm90::wgmma_wait<2>();
      break;
    default:
      sm90::wgmma_wait<3>();
      break;
  }
}

// 0xff in each byte of a V^T register whose token, tb + {0, 1, 8, 9}, is below `valid`.
__device__ __forceinline__ uint32_t valid_token_bytes(int tb, int valid) {
  return (tb < valid ? 0xffu : 0u) | (tb + 1 < valid ? 0xff00u : 0u) |
         (tb + 8 < valid ? 0xff0000u : 0u) | (tb + 9 < valid ? 0xff000000u : 0u);
}

__device__ __forceinline__ uint32_t zero_nan_bytes(uint32_t w) {
  return w & ~__vcmpeq4(w & 0x7f7f7f7fu, 0x7f7f7f7fu);
}

static_assert(32 * kChunkBytes == 4096, "vt_words_at: a k-step is 32 token rows of a chunk");

// The ldmatrix words of m-tile m's V^T fragments (both k-steps) in block i's stage.
template <class T>
__device__ __forceinline__ void vt_words(const Request& req, const ConsumerThread<T>& th, int i,
                                         int m, uint32_t (&r)[2][4]) {
  vt_words_at(sm90::smem_u32(req.ring.stage(i).content[2 * th.wg + m / 2]) + th.ldsm_off[m & 1],
              r);
}

// The fragments from their words. kEdge: tokens from `valid` up and NaN codes are zeroed, so
// that a NaN there cannot reach rows whose P8 is 0 (elsewhere a NaN in V reaches every row
// through its logit anyway).
template <bool kEdge, class T>
__device__ __forceinline__ void vt_from_words_masked(const Request& req,
                                                     const ConsumerThread<T>& th, int i,
                                                     const uint32_t (&r)[2][4],
                                                     uint32_t (&a)[2][4]) {
  const int valid = kEdge ? min(max(req.seqlen - req.tok0(i), 0), kBlockN) : 0;
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    vt_from_words(r[ks], a[ks]);
    if constexpr (kEdge) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t vmask = valid_token_bytes(32 * ks + 16 * (j / 2) + 2 * th.t, valid);
        a[ks][j] = zero_nan_bytes(a[ks][j] & vmask);
      }
    }
  }
}

template <bool kEdge, class T>
__device__ __forceinline__ void v_fragments(const Request& req, const ConsumerThread<T>& th, int i,
                                            int m, uint32_t (&a)[2][4]) {
  uint32_t r[2][4];
  vt_words(req, th, i, m, r);
  vt_from_words_masked<kEdge>(req, th, i, r, a);
}

// O^T = gamma O^T + T over O's 8-column tiles [col0, col0 + kCols), gamma read where it is used.
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

// The scaled promotion (kScaledPv): O^T *= gamma, then each m-tile += T after its wait.
template <int kNRegs>
__device__ __forceinline__ void scale_o(float (&o)[kMTiles][kNRegs], const float* gamma, int t) {
#pragma unroll
  for (int col = 0; col < kNRegs / 4; ++col) {
    const float2 g = *reinterpret_cast<const float2*>(&gamma[8 * col + 2 * t]);
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int c = 0; c < 4; ++c) o[m][4 * col + c] *= c & 1 ? g.y : g.x;
    }
  }
}
template <int kNRegs>
__device__ __forceinline__ void add_to_o(float (&o)[kNRegs], float (&tmp)[kNRegs]) {
  sm90::fence_regs(tmp);
#pragma unroll
  for (int e = 0; e < kNRegs; ++e) o[e] += tmp[e];
}

// words: m-tile 0's ldmatrix words, read ahead by the caller once the stage's loads were
// waited for, so that the first wgmma does not wait for them.
template <bool kEdge, class T>
__device__ __forceinline__ void pv_block(SharedStorage& s, const Request& req,
                                         const ConsumerThread<T>& th, int i,
                                         float (&o)[kMTiles][T::kNRegs],
                                         const uint32_t (&words)[2][4]) {
  constexpr int kN = T::kN, kNRegs = T::kNRegs;
  // m-tile m's fragments, both k-steps settled in registers before the wgmma fence that follows:
  // a fragment register written after it (the compiler sinks the second k-step's byte permutes
  // below the first wgmma) makes ptxas add a warpgroup.arrive before the wgmma that reads it.
  auto fragments = [&](int m, uint32_t (&a)[2][4]) {
    if (m == 0) {
      vt_from_words_masked<kEdge>(req, th, i, words, a);
    } else {
      v_fragments<kEdge>(req, th, i, m, a);
    }
    sm90::fence_regs(a[0]);
    sm90::fence_regs(a[1]);
  };
  const RowStats& ps = s.stats[i % kPBuffers];
  const sm90::SmemDesc p_desc =
      sm90::make_desc_base(s.p8[i % kPBuffers], sm90::Swizzle::k64B, kPRowBytes);
  if constexpr (T::kPvAllTiles) {
    // Every m-tile in flight, each with its own fragments and whole-N temporary.
    float tmp[kMTiles][kNRegs];
    uint32_t a[kMTiles][2][4];
#pragma unroll
    for (int q = 0; q < kMTiles; ++q) {
      fragments(q, a[q]);
      sm90::wgmma_fence();
      wgmma_pv<kN, true>(tmp[q], a[q][0], p_desc.at(0));
      wgmma_pv<kN, false>(tmp[q], a[q][1], p_desc.at(32));
      sm90::wgmma_commit();
    }
#pragma unroll
    for (int q = 0; q < kMTiles; ++q) {
      wgmma_wait_upto3(kMTiles - 1 - q);
      promote_cols(o[q], 0, tmp[q], ps.gamma, th.t);
    }
  } else if constexpr (T::kPvWholeTiles && !kEdge) {
    // Whole-N groups (an m-tile's two k-steps into one temporary), two in flight.
    float tmp[2][kNRegs];
    uint32_t a[2][2][4];
    auto promote = [&](int q) {
      if constexpr (T::kScaledPv) {
        add_to_o(o[q], tmp[q % 2]);
      } else {
        promote_cols(o[q], 0, tmp[q % 2], ps.gamma, th.t);
      }
    };
#pragma unroll
    for (int q = 0; q < kMTiles; ++q) {
      fragments(q, a[q % 2]);
      sm90::wgmma_fence();
      wgmma_pv<kN, true>(tmp[q % 2], a[q % 2][0], p_desc.at(0));
      wgmma_pv<kN, false>(tmp[q % 2], a[q % 2][1], p_desc.at(32));
      sm90::wgmma_commit();
      if (T::kScaledPv && q == 0) scale_o(o, ps.gamma, th.t);
      if (q > 0) {
        sm90::wgmma_wait<1>();
        promote(q - 1);
      }
    }
    sm90::wgmma_wait<0>();
    promote(kMTiles - 1);
  } else {
    // (m-tile, half of N) groups, two in flight: whole-N temporaries beside the edge blocks'
    // masks would spill at N = 64.
    constexpr int kHalfN = kN / 2;
    float tmp[2][kHalfN / 2];
    auto promote = [&](int q) {
      promote_cols(o[q / 2], (q % 2) * kHalfN / 8, tmp[q % 2], ps.gamma, th.t);
    };
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      uint32_t a[2][4];
      fragments(m, a);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q = 2 * m + h;
        const uint32_t rows = h * kHalfN * kPRowBytes;  // P8 rows of this half
        sm90::wgmma_fence();
        wgmma_pv<kHalfN, true>(tmp[q % 2], a[0], p_desc.at(rows));
        wgmma_pv<kHalfN, false>(tmp[q % 2], a[1], p_desc.at(rows + 32));
        sm90::wgmma_commit();
        if (q > 0) {
          sm90::wgmma_wait<1>();
          promote(q - 1);
        }
      }
    }
    sm90::wgmma_wait<0>();
    promote(2 * kMTiles - 1);
  }
}

template <class T>
__device__ __forceinline__ void pv(SharedStorage& s, const Request& req,
                                   const ConsumerThread<T>& th, int i,
                                   float (&o)[kMTiles][T::kNRegs], const uint32_t (&words)[2][4]) {
  if (req.is_edge(i)) {
    pv_block<true>(s, req, th, i, o, words);
  } else {
    pv_block<false>(s, req, th, i, o, words);
  }
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
