// One 64-token block of the contract's online softmax with FP8 probabilities (paper eqs. 12,
// 13), for a thread's two query rows and its 32-token half of the block, shared by the decode
// kernels. The two halves of the block live in two partner threads (two warps, or two
// warpgroups); `sync` is a barrier over both, and red_* are their exchange buffers.
#pragma once

#include "common/numerics.cuh"
#include "decode/decode.h"

namespace snapmla {
namespace decode {

// Online state of a thread's two rows. m is in the log2 domain (z * log2 e). Both partners hold
// identical m and sigma; each keeps the partial l of its own tokens (the recursion is linear).
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float sig[2] = {1.f, 1.f};
  float l_part[2] = {0.f, 0.f};
};

// v[i] reduced with `op` over the quad (the four t4 threads sharing a row), stored by t4 == 0
// into red[half] at row_local[i] for the partner, then `sync`.
template <class Op, class Sync>
__device__ __forceinline__ void quad_reduce_to_partner(float (&v)[2], Op op,
                                                       float (*red)[kTileRows],
                                                       const int (&row_local)[2], int half, int t4,
                                                       Sync sync) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    v[i] = op(v[i], __shfl_xor_sync(0xffffffffu, v[i], 1));
    v[i] = op(v[i], __shfl_xor_sync(0xffffffffu, v[i], 2));
    if (t4 == 0) red[half][row_local[i]] = v[i];
  }
  sync();
}

// s[n][c]: QK accumulators of tokens half * 32 + 8 n + 2 t4 + (c & 1), rows row_local[c / 2].
// On return s holds P8 (exact E4M3 values as floats) and gamma[i] the factor g_k by which the
// caller rescales O of row i; st advanced to this block.
template <class Sync>
__device__ __forceinline__ void softmax_block(float (&s)[4][4], const float* k_scale,
                                              const float* q_scale, const int (&row_local)[2],
                                              const int (&limit)[2], int tok0, int half, int t4,
                                              float scale_log2, float (*red_max)[kTileRows],
                                              float (*red_pmax)[kTileRows], RowState& st,
                                              float (&gamma)[2], Sync sync) {
  // ---- logits (log2 domain) and the block's row maxima
  float ks[4][2];
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int tok = 32 * half + 8 * n + 2 * t4 + (c & 1);
      const int i = c / 2;
      ks[n][c & 1] = k_scale[tok];
      const bool visible = tok0 + tok < limit[i];
      // z * log2(e) = S * s_q * s_k * softmax_scale * log2(e); invisible tokens are -inf
      const float z =
          visible ? s[n][c] * q_scale[row_local[i]] * ks[n][c & 1] * scale_log2 : -INFINITY;
      s[n][c] = z;
      row_max[i] = fmaxf(row_max[i], z);
    }
  }
  const auto max = [](float x, float y) { return fmaxf(x, y); };
  quad_reduce_to_partner(row_max, max, red_max, row_local, half, t4, sync);
  float m_new[2], m_use[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m_new[i] = fmaxf(st.m[i], fmaxf(red_max[0][row_local[i]], red_max[1][row_local[i]]));
    m_use[i] = m_new[i] == -INFINITY ? 0.f : m_new[i];  // nothing visible yet: every e is 0
  }

  // ---- e = exp(z - m), P' = e * s_k (V's scale fused into P), and the P' block maxima
  float e_sum[2] = {0.f, 0.f}, p_max[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = c / 2;
      const bool visible = s[n][c] != -INFINITY;
      const float e = visible ? exp2f(s[n][c] - m_use[i]) : 0.f;
      e_sum[i] += e;
      const float pp = visible ? e * ks[n][c & 1] : 0.f;  // a select: never 0 * NaN
      s[n][c] = pp;
      p_max[i] = fmaxf(p_max[i], pp);
    }
  }
  quad_reduce_to_partner(p_max, max, red_pmax, row_local, half, t4, sync);

  // ---- sigma_k, g_k = exp(m_{k-1} - m_k) sigma_{k-1} / sigma_k, l (eq. 12), P8 = e4m3(P'/sig)
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float pm = fmaxf(red_pmax[0][row_local[i]], red_pmax[1][row_local[i]]);
    float sig_new = __fdiv_rn(pm, kFp8Max);
    if (sig_new < kMinProbScale) sig_new = kMinProbScale;
    gamma[i] = exp2f(st.m[i] - m_use[i]) * __fdiv_rn(st.sig[i], sig_new);
    st.l_part[i] = st.l_part[i] * gamma[i] + __fdiv_rn(e_sum[i], sig_new);
    st.m[i] = m_new[i];
    st.sig[i] = sig_new;
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      s[n][c] = static_cast<float>(__nv_fp8_e4m3(__fdiv_rn(s[n][c], st.sig[c / 2])));
    }
  }
}

// l of a thread's rows over the quad and both partners (after the last block).
template <class Sync>
__device__ __forceinline__ void reduce_l(RowState& st, const int (&row_local)[2], int half, int t4,
                                         float (*red_l)[kTileRows], float (&l)[2], Sync sync) {
  const auto sum = [](float x, float y) { return x + y; };
  quad_reduce_to_partner(st.l_part, sum, red_l, row_local, half, t4, sync);
#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = red_l[0][row_local[i]] + red_l[1][row_local[i]];
}

}  // namespace decode
}  // namespace snapmla
