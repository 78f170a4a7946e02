// The decode kernel's register <-> shared-memory bindings, apart from the kernel so that a unit
// test (tests/cuda/seesaw_fragments.cu) runs exactly this code on integer data.
//
// V^T as the A operand of PV. An FP8 wgmma A fragment (m64 x k32) gives thread (g = lane / 4,
// t = lane % 4) of warp v: a0 = (M-row 16 v + g, k 4t..4t+3), a1 = (M-row + 8, same k),
// a2 = (M-row, k 16+4t..), a3 = (M-row + 8, k 16+4t..). One ldmatrix.trans x4 over tokens
// 0-7, 8-15, 16-23, 24-31 of the k-step and one 16-byte latent unit gives r[i] = {token 8i+2t:
// latent 2g, 2g+1; token 8i+2t+1: latent 2g, 2g+1}. Byte permutes gather even and odd latent:
//   a0 = even(r0, r1), a1 = odd(r0, r1), a2 = even(r2, r3), a3 = odd(r2, r3),
// so M-row g is latent 2g and M-row g + 8 is latent 2g + 1 of the unit, and logical k = 4t + j
// (and 16 + 4t + j) is token 8 (j / 2) + 2t + (j % 2) (and 16 + that).
//
// P8 as the B operand of PV: [rows][64 bytes], 64B swizzle, K-major; byte 16 h + 4 t + j of a
// row holds the token logical k = 16 h + 4 t + j binds to. The S accumulator of QK (m64n64)
// gives thread (g, t) rows g, g + 8 and tokens 8 n + 2 t + {0, 1}: for row g, word h is
// (S[8h], S[8h+1], S[8h+4], S[8h+5]) of its fragment (tokens 16h + 2t, +1, +8, +9); one
// stmatrix x4 stores a row's four words.
#pragma once

#include <stdint.h>

#include "common/numerics.cuh"
#include "decode/sm90/ptx.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

// Byte offset of 16-byte unit `unit` (0..7) of row `row` in a [rows][128 B] tile with the 128B
// swizzle (TMA's SWIZZLE_128B: the unit index XORed with the row's low three bits).
__device__ __forceinline__ uint32_t sw128_offset(uint32_t row, uint32_t unit) {
  return row * 128u + ((unit ^ (row & 7u)) << 4);
}

// ldmatrix row address of `lane` (relative to a [64 tokens][128 B] 128B-swizzled content
// chunk) for k-step 0 and the 16-byte latent unit `unit` (0..7) of the chunk.
__device__ __forceinline__ uint32_t vt_lane_offset(uint32_t lane, uint32_t unit) {
  return sw128_offset(lane, unit);
}

// V^T A fragment (m64 x k32) from a content chunk: `addr` is the chunk's shared address plus
// vt_lane_offset(lane, unit) plus 4096 * k-step (32 tokens of 128 bytes).
__device__ __forceinline__ void vt_fragment(uint32_t addr, uint32_t (&a)[4]) {
  uint32_t r[4];
  sm90::ldsm_t_x4(addr, r);
  a[0] = __byte_perm(r[0], r[1], 0x6420);  // even latent: M-row g
  a[1] = __byte_perm(r[0], r[1], 0x7531);  // odd latent: M-row g + 8
  a[2] = __byte_perm(r[2], r[3], 0x6420);
  a[3] = __byte_perm(r[2], r[3], 0x7531);
}

// stmatrix row address of `lane` in a [64 rows][64 B] P8 tile with 64B swizzle, for the 8 rows
// from `row_base` (a multiple of 8): row row_base + lane % 8, 16-byte chunk lane / 8. Rows r and
// r + 8 share the swizzle pattern, so a second store of rows + 8 is at + 8 rows.
__device__ __forceinline__ uint32_t p8_lane_offset_rows(uint32_t lane, uint32_t row_base) {
  const uint32_t row = row_base + (lane & 7);
  return row * 64 + (((lane >> 3) ^ ((row >> 1) & 3)) << 4);
}
// The rows of warp `warp` of the S accumulator: 16 warp + lane % 8 (and + 8, the second store).
__device__ __forceinline__ uint32_t p8_lane_offset(uint32_t lane, uint32_t warp) {
  return p8_lane_offset_rows(lane, 16 * warp);
}

// P8 words of a thread's S rows (kRows = 2: rows g and g + 8; 1: row g alone, the two-term
// query's): w[ri][h] = e4m3(z[8h + 2ri + {0, 1, 4, 5}] * inv[ri]).
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

// Store them: `addr` = tile address + p8_lane_offset(lane, warp) (kRows = 1:
// p8_lane_offset_rows(lane, 8 warp)).
template <int kRows = 2>
__device__ __forceinline__ void store_p8(uint32_t addr, const uint32_t (&w)[2][4]) {
  sm90::stsm_x4(addr, w[0][0], w[0][1], w[0][2], w[0][3]);
  if constexpr (kRows == 2) sm90::stsm_x4(addr + 8 * 64, w[1][0], w[1][1], w[1][2], w[1][3]);
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
