// The decode kernel's register <-> shared-memory bindings, apart from the kernel so that
// tests/cuda/seesaw_fragments.cu runs exactly this code on integer data.
// V^T, PV's A operand (FP8 m64 x k32): thread (g = lane / 4, t = lane % 4) of warp v holds a0 =
// (M-row 16 v + g, k 4t..4t+3), a1 = (M-row + 8, same k), a2, a3 = the same at k + 16. One
// ldmatrix.trans x4 over tokens 8i..8i+7 (i < 4) of a 16-byte latent unit gives r[i] = {token
// 8i+2t: latent 2g, 2g+1; token 8i+2t+1: latent 2g, 2g+1}; a0, a1 = the even, odd latent bytes
// of (r0, r1), a2, a3 of (r2, r3). With warp v's unit of m-tile m, warpgroup w at latent
// base = 256 w + 64 m + 16 v: M-row 16 v + g <-> latent base + 2 g, M-row 16 v + g + 8 <-> base
// + 2 g + 1, and k = 16 h + 4 t + j <-> token 16 h + 8 (j / 2) + 2 t + (j % 2) of the k-step.
// P8, PV's B operand ([rows][64 B], 64B swizzle, K-major), holds at byte 16 h + 4 t + j of a row
// the token k = 16 h + 4 t + j binds to, which is where QK's S accumulator has it: thread (g, t)'s
// word h of row g is (S[8h], S[8h+1], S[8h+4], S[8h+5]), tokens 16h + 2t, +1, +8, +9; one
// stmatrix x4 a row, no shuffles.
#pragma once

#include <stdint.h>

#include "common/numerics.cuh"
#include "decode/sm90/ptx.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

// 16-byte unit `unit` of row `row` in a [rows][128 B] tile with TMA's 128B swizzle.
__device__ __forceinline__ uint32_t sw128_offset(uint32_t row, uint32_t unit) {
  return row * 128u + ((unit ^ (row & 7u)) << 4);
}

// ldmatrix row address of `lane` in a content chunk, k-step 0, latent unit `unit`.
__device__ __forceinline__ uint32_t vt_lane_offset(uint32_t lane, uint32_t unit) {
  return sw128_offset(lane, unit);
}

// The fragment from the ldmatrix words r.
__device__ __forceinline__ void vt_from_words(const uint32_t (&r)[4], uint32_t (&a)[4]) {
  a[0] = __byte_perm(r[0], r[1], 0x6420);  // even latent: M-row g
  a[1] = __byte_perm(r[0], r[1], 0x7531);  // odd latent: M-row g + 8
  a[2] = __byte_perm(r[2], r[3], 0x6420);
  a[3] = __byte_perm(r[2], r[3], 0x7531);
}

// The ldmatrix words of a PV m-tile's two k-steps; `addr`: the chunk's shared address +
// vt_lane_offset(lane, unit), the second k-step 4096 bytes on.
__device__ __forceinline__ void vt_words_at(uint32_t addr, uint32_t (&r)[2][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) sm90::ldsm_t_x4(addr + 4096 * ks, r[ks]);
}

// stmatrix row address of `lane` in a 64B-swizzled P8 tile, rows row_base (a multiple of 8) +
// lane % 8. Rows r and r + 8 share the swizzle pattern: a store of rows + 8 is at + 8 rows.
__device__ __forceinline__ uint32_t p8_lane_offset_rows(uint32_t lane, uint32_t row_base) {
  const uint32_t row = row_base + (lane & 7);
  return row * 64 + (((lane >> 3) ^ ((row >> 1) & 3)) << 4);
}
__device__ __forceinline__ uint32_t p8_lane_offset(uint32_t lane, uint32_t warp) {
  return p8_lane_offset_rows(lane, 16 * warp);
}

// w[ri][h] = e4m3(z[8h + 2ri + {0, 1, 4, 5}] * inv[ri]); kRows = 1: the interleaved row alone.
template <int kRows = 2>
__device__ __forceinline__ void p8_words(const float (&z)[32], const float (&inv)[2],
                                         uint32_t (&w)[2][4]) {
#pragma unroll
  for (int h = 0; h < 4; ++h) {
#pragma unroll
    for (int ri = 0; ri < kRows; ++ri) {
      const float* zz = z + 8 * h + 2 * ri;
      w[ri][h] = to_e4m3x4(zz[0] * inv[ri], zz[1] * inv[ri], zz[4] * inv[ri], zz[5] * inv[ri]);
    }
  }
}

// `addr`: tile + p8_lane_offset(lane, warp) (kRows = 1: p8_lane_offset_rows(lane, 8 warp)).
template <int kRows = 2>
__device__ __forceinline__ void store_p8(uint32_t addr, const uint32_t (&w)[2][4]) {
  sm90::stsm_x4(addr, w[0][0], w[0][1], w[0][2], w[0][3]);
  if constexpr (kRows == 2) sm90::stsm_x4(addr + 8 * 64, w[1][0], w[1][1], w[1][2], w[1][3]);
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
