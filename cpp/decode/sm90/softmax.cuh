// QK of a block and the contract's block step on it, by the block's owner warpgroup.
#pragma once

#include "decode/sm90/context.cuh"
#include "decode/sm90/wgmma.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

// 2^x, flushing results below 2^-126 to zero (MUFU.EX2 as it is).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// e = 2^(z - m) is computed as 2^24 e = 2^(z - m + 24): down to 2^-150 it stays above ex2's
// flush. The factor stays on: P8 = P' / sigma and l = sum(e) / sigma do not change when P', e
// and sigma share a power of two, so the block step carries 2^24 e, 2^24 P' and 2^24 sigma
// (the row statistics too) bit for bit as the unscaled values, and the lse takes 2^-24 sigma.
constexpr float kExpShift = 24.f;
constexpr float kExpUnshift = 5.9604644775390625e-08f;  // 2^-24
constexpr float kMinProbScaleShifted = kMinProbScale * 16777216.f;  // 2^24 kMinProbScale
constexpr float kInvFp8Max = 1.f / 448.f;

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// One commit group: the 16 FP8 steps over the content, then the 4 BF16 steps over the RoPE,
// into one accumulator.
__device__ __forceinline__ void issue_qk(const Ring& ring, int i, const sm90::SmemDesc& q_desc,
                                         const sm90::SmemDesc& qr_desc, float (&acc)[32]) {
  const SharedStorage::Stage& st = ring.stage(i);
  sm90::mbar_wait(ring.full(i), ring.phase(i));
  const sm90::SmemDesc k_desc =
      sm90::make_desc_base(st.content[0], sm90::Swizzle::k128B, kChunkBytes);
  const sm90::SmemDesc kr_desc = sm90::make_desc_base(st.rope, sm90::Swizzle::k128B, kChunkBytes);
  sm90::wgmma_fence();
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int k = 0; k < kQkChunkSteps; ++k) {
      const uint64_t da = q_desc.at(c * kTileBytes + 32 * k);
      const uint64_t db = k_desc.at(c * kTileBytes + 32 * k);
      if (c == 0 && k == 0) {
        sm90::wgmma_m64n64k32_e4m3_ss_init(acc, da, db);
      } else {
        sm90::wgmma_m64n64k32_e4m3_ss(acc, da, db, 1);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kRopeSteps; ++k) {
    sm90::wgmma_m64n64k16_bf16_ss(acc, qr_desc.at(32 * k), kr_desc.at(32 * k));
  }
  sm90::wgmma_commit();
}

// z[e] = u = logit(e) s_k (e = 4 nn + c: token 8 nn + 2 t + c % 2, row c / 2), -inf where the
// row does not see the token; each row's maximum into mx.
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

// z = 2^24 P' = 2^(z rf + bias) s_k, exactly 0 where invisible (a select: the scale may be NaN);
// the rows' sums of 2^24 e and maxima of 2^24 P' (thread-local).
template <int kElems, bool kFull>
__device__ __forceinline__ void exp_scaled(float (&z)[32], const float (&row_factor)[2],
                                           const float (&bias)[2], const float* scale, int t,
                                           float (&e_sum)[2], float (&p_max)[2]) {
#pragma unroll
  for (int nn = 0; nn < 8; ++nn) {
    const float2 k2 = *reinterpret_cast<const float2*>(&scale[8 * nn + 2 * t]);
    const float ks[2] = {k2.x, k2.y};
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

// Block i's P8 and statistics (m, sigma, l, gamma; eq. 12), after the other warpgroup's block
// i - 1. rf = s_q softmax_scale log2(e) > 0 is applied in the exponent: max(u rf) = max(u) rf.
// ahead() runs before the P8 stores and the wait for the warpgroup's own stores. Block i's
// buffers are free once block i - 1's statistics arrived (kPBuffers).
template <class T, class Ahead>
__device__ __forceinline__ void softmax_block(SharedStorage& s, const DecodeParams& p,
                                              const Request& req, const ConsumerThread<T>& th,
                                              int i, float (&z)[32], Ahead ahead) {
  constexpr int kRows = T::kRowsPerThread;
  constexpr int kElems = 2 * kRows;  // fragment elements per 8 tokens: c < kElems
  sm90::wgmma_wait<0>();
  sm90::fence_regs(z);
  const SharedStorage::Stage& st = req.ring.stage(i);
  const int tok0 = req.tok0(i);
  const bool full = !req.is_edge(i);
  float m_new[2], sig[2], l[2], gamma[2];
  if constexpr (T::kInterleaved) m_new[1] = sig[1] = l[1] = gamma[1] = 0.f;
  uint32_t w[2][4];  // P8 of rows row_of(0) and row_of(1), 16 tokens per word group
  float mx[2] = {-INFINITY, -INFINITY};
  float row_factor[2];
  float rho = 0.f;  // interleaved: s2 / s1 of the thread's query row
  if (th.softmax_warp) {
    // Per-row constants, re-read each block rather than held in registers across PV.
    row_factor[0] = s.q_scale[th.r0] * p.scale_log2;
    if constexpr (T::kInterleaved) {
      rho = s.q_scale[32 + th.r0];
    } else {
      row_factor[1] = s.q_scale[th.r0 + 8] * p.scale_log2;
    }
    auto logit = [&](int e) {
      return T::kInterleaved ? fmaf(rho, z[e + 2], z[e]) : z[e];
    };
    const int fr0 = req.tile * kRowsM + th.r0;
    if (full) {
      const int limit[2] = {0, 0};
      scaled_logits<kElems, true>(z, logit, st.scale, th.t, tok0, limit, mx);
    } else {
      int limit[2];
      limit[0] = visibility_limit(p, fr0, req.seqlen);
      if constexpr (!T::kInterleaved) limit[1] = visibility_limit(p, fr0 + 8, req.seqlen);
      scaled_logits<kElems, false>(z, logit, st.scale, th.t, tok0, limit, mx);
    }
#pragma unroll
    for (int ri = 0; ri < kRows; ++ri) mx[ri] = quad_max(mx[ri]) * row_factor[ri];
  }
  float m_prev[2] = {-INFINITY, -INFINITY}, sig_prev[2] = {1.f, 1.f}, l_prev[2] = {0.f, 0.f};
  if (i > 0) {
    sm90::named_barrier(kBarPready + ((i - 1) & 1), kThreads);
    if (th.softmax_warp) {
      const RowStats& ps = s.stats[(i - 1) % kPBuffers];
#pragma unroll
      for (int ri = 0; ri < kRows; ++ri) {
        m_prev[ri] = ps.m[th.row_of(ri)];
        sig_prev[ri] = ps.sig[th.row_of(ri)];
        l_prev[ri] = ps.l[th.row_of(ri)];
      }
    }
  }
  if (th.softmax_warp) {
    float m_use[2], inv_sig[2], e_sum[2] = {0.f, 0.f}, p_max[2] = {0.f, 0.f};
#pragma unroll
    for (int ri = 0; ri < kRows; ++ri) {
      m_new[ri] = fmaxf(m_prev[ri], mx[ri]);
      m_use[ri] = m_new[ri] == -INFINITY ? 0.f : m_new[ri];  // nothing visible yet: e = 0
    }
    const float bias[2] = {kExpShift - m_use[0], T::kInterleaved ? 0.f : kExpShift - m_use[1]};
    if (full) {
      exp_scaled<kElems, true>(z, row_factor, bias, st.scale, th.t, e_sum, p_max);
    } else {
      exp_scaled<kElems, false>(z, row_factor, bias, st.scale, th.t, e_sum, p_max);
    }
#pragma unroll
    for (int ri = 0; ri < kRows; ++ri) {
      e_sum[ri] = quad_sum(e_sum[ri]);
      p_max[ri] = quad_max(p_max[ri]);
      // MUFU reciprocal and ex2: within an ulp or two, inside the tensor-core tier's tolerance.
      sig[ri] = fmaxf(p_max[ri] * kInvFp8Max, kMinProbScaleShifted);
      inv_sig[ri] = rcp_approx_ftz(sig[ri]);
      gamma[ri] = ex2_ftz(m_prev[ri] - m_use[ri]) * (sig_prev[ri] * inv_sig[ri]);
      l[ri] = fmaf(l_prev[ri], gamma[ri], e_sum[ri] * inv_sig[ri]);
    }
    p8_words<kRows>(z, inv_sig, w);
  }
  ahead();
  if (th.softmax_warp) {
    store_p8<kRows>(sm90::smem_u32(s.p8[i % kPBuffers]) + th.stsm_off, w);
    if (th.t == 0) {
      RowStats& ps = s.stats[i % kPBuffers];
#pragma unroll
      for (int ri = 0; ri < kRows; ++ri) {
        ps.m[th.row_of(ri)] = m_new[ri];
        ps.sig[th.row_of(ri)] = sig[ri];
        ps.l[th.row_of(ri)] = l[ri];
        ps.gamma[th.row_of(ri)] = gamma[ri];
      }
    }
  }
  sm90::fence_proxy_async();  // P8 (generic stores) is read next by wgmma (async proxy)
  sm90::named_barrier_arrive(kBarPready + (i & 1), kThreads);
  sm90::named_barrier(kBarWg + th.wg, kWgThreads);  // own P8 and statistics; the scales read
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
