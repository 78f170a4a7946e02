// The reference decode kernel: the numerics contract executed block by block with mma.sync.
//
// One CTA = 64 query rows (s_q x heads, flattened) of one part of the split-KV schedule;
// 8 warps. Warp w owns row group rg = w % 4 (16 rows) and half = w / 4:
//   QK  rows 16rg..16rg+15 x tokens 32half..32half+31 of the block, FP8 content
//       (mma m16n8k32 e4m3) and BF16 RoPE (mma m16n8k16) accumulated into the same fp32
//       registers: the pre-scaled RoPE lives in the content's scale domain.
//   PV  rows 16rg.. x latent columns 256half..256half+255, all 64 tokens. V is the FP8
//       content tile widened to BF16 in shared memory (E4M3 -> BF16 is exact) and P8 is
//       widened likewise, so each product is the exact FP8 x FP8 product of the contract.
// The two warps of a row group exchange row maxima through shared memory; both then carry
// identical m and sigma, and each keeps its own partial l (the recursion is linear in l).
// kTwoTerm (args.q_precision FP8X2): a second FP8 content pass with the query's low row into its
// own accumulator, combined per logit as fmaf(rho, acc_lo, acc_hi), rho = s2 / s1 per row
// (snapmla.reference, q_terms=2); one K stage instead of two, to make room for the low row.
#include <algorithm>
#include <type_traits>

#include "common/launch.h"
#include "common/numerics.cuh"
#include "decode/decode.h"
#include "decode/segment.cuh"
#include "decode/softmax.cuh"

namespace snapmla {
namespace decode {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowGroups = 4;                   // 16 rows each
constexpr int kQStride = kContentDim + 16;      // bytes per FP8 row in smem (pad: no conflicts)
constexpr int kRopeStride = kRopeDim * 2 + 16;  // bytes per BF16 RoPE row
constexpr int kVStride = kContentDim * 2 + 16;  // bytes per BF16 V row
constexpr int kPStride = kBlockN * 2 + 16;      // bytes per BF16 P row
constexpr int kOTiles = kContentDim / 2 / 8;    // 32 n-tiles of 8 columns per warp
static_assert(kTileRows == kRowGroups * 16 && kWarps == 2 * kRowGroups, "warp layout");
static_assert(kBlockN == 64, "a block is one page");
static_assert((kQStride / 4) % 32 == 4 && (kRopeStride / 4) % 32 == 4 && (kVStride / 4) % 32 == 4 &&
                  (kPStride / 4) % 32 == 4,
              "row strides shift 8 consecutive rows across all 32 banks for ldmatrix");

struct KStage {
  alignas(16) uint8_t content[kBlockN * kQStride];  // [64 tokens][512 e4m3]
  alignas(16) uint8_t rope[kBlockN * kRopeStride];  // [64 tokens][64 bf16]
  alignas(16) float scale[kBlockN];
};

template <bool kTwoTerm>
struct SharedStorage {
  alignas(16) uint8_t q_content[kTileRows * kQStride];  // [64 rows][512 e4m3]
  alignas(16) uint8_t q_rope[kTileRows * kRopeStride];  // [64 rows][64 bf16]
  alignas(16) float q_scale[kTileRows];
  KStage k[kTwoTerm ? 1 : 2];                   // the KV block, double-buffered (one-term)
  alignas(16) uint8_t v[kBlockN * kVStride];    // [64 tokens][512 bf16]
  alignas(16) uint8_t p[kTileRows * kPStride];  // [64 rows][64 bf16] (P8 values)
  float red_max[2][kTileRows];
  float red_pmax[2][kTileRows];
  float red_l[2][kTileRows];
  // kTwoTerm: the query's low row [64 rows][512 e4m3] and rho = s2 / s1 per row.
  alignas(16) uint8_t q_lo[kTwoTerm ? kTileRows * kQStride : 16];
  float q_rho[kTwoTerm ? kTileRows : 1];
};

// ----------------------------------------------------------------------------- PTX wrappers
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// D += A (16 x K, row) * B (K x 8, col), fp32 accumulate, K = 32 bytes of T: 32 e4m3 or 16 bf16
// (the same fragments; each element type is its own instruction).
using E4M3 = __nv_fp8_e4m3;
using BF16 = __nv_bfloat16;
template <class T>
__device__ __forceinline__ void mma_m16n8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  static_assert(std::is_same_v<T, E4M3> || std::is_same_v<T, BF16>, "e4m3 or bf16");
  if constexpr (std::is_same_v<T, E4M3>) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// D0 += A * B[n 0..7], D1 += A * B[n 8..15]: B's two n8 fragments from one ldmatrix x4.
template <class T>
__device__ __forceinline__ void mma_m16n16(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4],
                                           const uint32_t (&bf)[4]) {
  mma_m16n8<T>(d0, a, bf[0], bf[1]);
  mma_m16n8<T>(d1, a, bf[2], bf[3]);
}
// Barrier among the 64 threads (two warps) of one row group; ids 1..4 (0 is __syncthreads).
__device__ __forceinline__ void row_group_sync(int rg) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + rg), "r"(64) : "memory");
}

__device__ __forceinline__ float nan_to_zero(float x) { return x != x ? 0.f : x; }

// ------------------------------------------------------------------------------ loading
// Rows tile * kTileRows + r of request row0's [rows x kCols] query matrix `src` into shared
// memory rows kStride bytes apart, 16 bytes a cp.async; padding rows (past `rows`) are zero.
template <int kCols, int kStride, class T>
__device__ __forceinline__ void load_q_rows(uint8_t* dst, const T* src, int64_t row0, int rows,
                                            int tile) {
  constexpr int kChunks = kCols * static_cast<int>(sizeof(T)) / 16;  // a row's
  for (int c = threadIdx.x; c < kTileRows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = c % kChunks;
    const int fr = tile * kTileRows + r;
    uint8_t* d = dst + r * kStride + col * 16;
    if (fr < rows) {
      cp_async16(d, reinterpret_cast<const uint8_t*>(src + (row0 + fr) * kCols) + col * 16);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Queries of request b for this CTA's 64 rows; padding rows are zero with scale 0 (and, for
// the two-term query, rho 0).
template <bool kTwoTerm>
__device__ void load_q_tile(SharedStorage<kTwoTerm>& s, const DecodeParams& p, int b, int tile) {
  const int rows = p.q_len * p.num_heads;
  const int64_t row0 = int64_t{b} * rows;
  load_q_rows<kContentDim, kQStride>(s.q_content, p.q_content, row0, rows, tile);
  load_q_rows<kRopeDim, kRopeStride>(s.q_rope, p.q_rope, row0, rows, tile);
  for (int r = threadIdx.x; r < kTileRows; r += kThreads) {
    const int fr = tile * kTileRows + r;
    s.q_scale[r] = fr < rows ? p.q_scale[row0 + fr] : 0.f;
  }
  if constexpr (kTwoTerm) {
    load_q_rows<kContentDim, kQStride>(s.q_lo, p.q_lo, row0, rows, tile);
    for (int r = threadIdx.x; r < kTileRows; r += kThreads) {  // fp32 IEEE division
      const int fr = tile * kTileRows + r;
      s.q_rho[r] = fr < rows ? __fdiv_rn(p.q_lo_scale[row0 + fr], p.q_scale[row0 + fr]) : 0.f;
    }
  }
}

// One page into a stage. Returns false (and loads nothing) if the page index is out of range.
// kStrided: pages page_stride bytes apart (a caller's larger slots), else kPageBytes.
template <bool kStrided>
__device__ bool load_k_block(KStage& st, const DecodeParams& p, int b, int blk) {
  const int32_t page = p.block_table[int64_t{b} * p.block_table_stride + blk];
  if (page < 0 || page >= p.num_pages) return false;
  const uint8_t* base = p.layer_base + int64_t{page} * (kStrided ? p.page_stride : kPageBytes);
  for (int c = threadIdx.x; c < kBlockN * (kContentDim / 16); c += kThreads) {
    const int r = c / (kContentDim / 16), col = c % (kContentDim / 16);
    cp_async16(st.content + r * kQStride + col * 16,
               base + kPageContentOffset + r * kContentDim + col * 16);
  }
  for (int c = threadIdx.x; c < kBlockN * (kRopeDim * 2 / 16); c += kThreads) {
    const int r = c / (kRopeDim * 2 / 16), col = c % (kRopeDim * 2 / 16);
    cp_async16(st.rope + r * kRopeStride + col * 16,
               base + kPageRopeOffset + r * kRopeDim * 2 + col * 16);
  }
  if (threadIdx.x < kBlockN * 4 / 16) {
    cp_async16(reinterpret_cast<uint8_t*>(st.scale) + threadIdx.x * 16,
               base + kPageScaleOffset + threadIdx.x * 16);
  }
  return true;
}

// V tile: FP8 content -> BF16 (exact). Tokens past the context become 0, and so do NaN
// codes: a row that must not see a token multiplies its V by P = 0, and 0 * NaN would leak
// the NaN into it. Rows that do see a NaN token still turn NaN, through its logit (the
// content enters QK unsanitized, and append gives such a token a NaN scale).
__device__ void widen_v(uint8_t* v, const KStage& st, int valid_tokens) {
  for (int c = threadIdx.x; c < kBlockN * (kContentDim / 16); c += kThreads) {
    const int r = c / (kContentDim / 16), col = c % (kContentDim / 16);
    uint4 in = *reinterpret_cast<const uint4*>(st.content + r * kQStride + col * 16);
    if (r >= valid_tokens) in = make_uint4(0, 0, 0, 0);
    const uint32_t w[4] = {in.x, in.y, in.z, in.w};
    uint32_t o[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = e4m3x2_to_float2(static_cast<uint16_t>(w[k] & 0xffffu));
      const float2 bb = e4m3x2_to_float2(static_cast<uint16_t>(w[k] >> 16));
      o[2 * k] = pack_bf16x2(nan_to_zero(a.x), nan_to_zero(a.y));
      o[2 * k + 1] = pack_bf16x2(nan_to_zero(bb.x), nan_to_zero(bb.y));
    }
    uint4* dst = reinterpret_cast<uint4*>(v + r * kVStride + col * 32);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

// ------------------------------------------------------------------------------ the kernel
template <bool kStrided, bool kTwoTerm = false>
__global__ void __launch_bounds__(kThreads, 1) reference_decode_kernel(const DecodeParams p) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  SharedStorage<kTwoTerm>& s = *reinterpret_cast<SharedStorage<kTwoTerm>*>(smem_raw);

  const int part = blockIdx.x, tile = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp % kRowGroups, half = warp / kRowGroups;
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates
  const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
  if (!plan_matches(p)) return write_nan_rows(p, part, tile);
  const RequestRange requests = part_requests(p, L, part);
  // This thread's two rows (fragment rows g and g + 8 of its row group).
  const int row_local[2] = {rg * 16 + g, rg * 16 + g + 8};
  auto pair_sync = [rg] { row_group_sync(rg); };

  for (int b = requests.begin; b <= requests.end; ++b) {
    Segment seg;
    if (plan_segment(p, L, part, b, tile, &seg) != SegmentKind::kRun) continue;
    const int seqlen = p.seqlens[b];
    const int limit[2] = {visibility_limit(p, tile * kTileRows + row_local[0], seqlen),
                          visibility_limit(p, tile * kTileRows + row_local[1], seqlen)};
    RowState st;
    float o[kOTiles][4];
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    bool bad_page = false;

    load_q_tile(s, p, b, tile);
    bad_page |= !load_k_block<kStrided>(s.k[0], p, b, seg.blk_lo);
    cp_async_commit();

    for (int blk = seg.blk_lo; blk < seg.blk_hi; ++blk) {
      const int stage = kTwoTerm ? 0 : (blk - seg.blk_lo) & 1;
      if (!kTwoTerm && blk + 1 < seg.blk_hi) {
        bad_page |= !load_k_block<kStrided>(s.k[stage ^ 1], p, b, blk + 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // block `blk` landed; the previous PV is done with s.v and s.p
      const KStage& ks = s.k[stage];
      const int tok0 = blk * kBlockN;
      widen_v(s.v, ks, seqlen - tok0);

      // ---- S = Q K^T for rows 16rg.. x tokens 32half.. (4 n-tiles of 8 tokens)
      float acc[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
      float acc_lo[kTwoTerm ? 4 : 1][4];  // the low row's content products (kTwoTerm)
#pragma unroll
      for (int n = 0; n < (kTwoTerm ? 4 : 1); ++n) {
        acc_lo[n][0] = acc_lo[n][1] = acc_lo[n][2] = acc_lo[n][3] = 0.f;
      }
      {
        const int a_row = rg * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        const int a_col = 16 * (lane / 16);
        const int b_col = 16 * ((lane / 8) % 2);
        // B: tokens 32 half + 16 np .. + 15 of a stage tile (rows `stride` bytes apart), bytes
        // kk .. kk + 31, as one ldmatrix x4
        const auto load_b = [&](uint32_t (&bf)[4], const uint8_t* tile, int stride, int np,
                                int kk) {
          const int b_row = 32 * half + 16 * np + 8 * (lane / 16) + (lane % 8);
          ldmatrix_x4(bf, tile + b_row * stride + kk + b_col);
        };
#pragma unroll 4
        for (int kk = 0; kk < kContentDim; kk += 32) {  // FP8 content, k = 32 bytes
          uint32_t a[4], a_lo[4];
          ldmatrix_x4(a, s.q_content + a_row * kQStride + kk + a_col);
          if constexpr (kTwoTerm) ldmatrix_x4(a_lo, s.q_lo + a_row * kQStride + kk + a_col);
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            uint32_t bf[4];
            load_b(bf, ks.content, kQStride, np, kk);
            mma_m16n16<E4M3>(acc[2 * np], acc[2 * np + 1], a, bf);
            if constexpr (kTwoTerm) mma_m16n16<E4M3>(acc_lo[2 * np], acc_lo[2 * np + 1], a_lo, bf);
          }
        }
#pragma unroll
        for (int kk = 0; kk < kRopeDim * 2; kk += 32) {  // BF16 RoPE, k = 16 values
          uint32_t a[4];
          ldmatrix_x4(a, s.q_rope + a_row * kRopeStride + kk + a_col);
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            uint32_t bf[4];
            load_b(bf, ks.rope, kRopeStride, np, kk);
            mma_m16n16<BF16>(acc[2 * np], acc[2 * np + 1], a, bf);
          }
        }
      }
      if constexpr (kTwoTerm) {  // z's content part at scale s1: acc_hi + rho * acc_lo
        const float rho[2] = {s.q_rho[row_local[0]], s.q_rho[row_local[1]]};
#pragma unroll
        for (int n = 0; n < 4; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[n][i] = fmaf(rho[i / 2], acc_lo[n][i], acc[n][i]);
        }
      }

      // ---- the contract's softmax step; acc becomes P8
      float gamma[2];
      softmax_block(acc, ks.scale, s.q_scale, row_local, limit, tok0, half, t4, p.scale_log2,
                    s.red_max, s.red_pmax, st, gamma, pair_sync);
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        o[n][0] *= gamma[0], o[n][1] *= gamma[0];
        o[n][2] *= gamma[1], o[n][3] *= gamma[1];
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int tok = 32 * half + 8 * n + 2 * t4;
          *reinterpret_cast<uint32_t*>(s.p + row_local[i] * kPStride + tok * 2) =
              pack_bf16x2(acc[n][2 * i], acc[n][2 * i + 1]);
        }
      }
      __syncthreads();  // s.p (both halves) and s.v are complete
      if constexpr (kTwoTerm) {  // every read of the one K stage is done: load the next block
        if (blk + 1 < seg.blk_hi) {  // during this block's PV
          bad_page |= !load_k_block<kStrided>(s.k[0], p, b, blk + 1);
          cp_async_commit();
        }
      }

      // ---- O += P8 V for rows 16rg.. x columns 256half..
#pragma unroll
      for (int kk = 0; kk < kBlockN; kk += 16) {
        uint32_t a[4];
        const int a_row = rg * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        ldmatrix_x4(a, s.p + a_row * kPStride + (kk + 8 * (lane / 16)) * 2);
        const int v_row = kk + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
        for (int np = 0; np < kOTiles / 2; ++np) {
          const int col = 256 * half + 16 * np + 8 * (lane / 16);
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, s.v + v_row * kVStride + col * 2);
          mma_m16n16<BF16>(o[2 * np], o[2 * np + 1], a, bf);
        }
      }
    }

    // ---- epilogue: l across the quad and the row group, then out (or a partial)
    float l[2];
    reduce_l(st, row_local, half, t4, s.red_l, l, pair_sync);
    write_row<0>(p, b, tile * kTileRows + row_local[0], 256 * half, t4, o, l[0], st.m[0], st.sig[0],
                 bad_page, seg, half == 0 && t4 == 0);
    write_row<1>(p, b, tile * kTileRows + row_local[1], 256 * half, t4, o, l[1], st.m[1], st.sig[1],
                 bad_page, seg, half == 0 && t4 == 0);
    __syncthreads();  // smem is reused by the next request of this part
  }
}

}  // namespace

template <bool kStrided, bool kTwoTerm>
cudaError_t launch_reference(const DecodeParams& p, cudaStream_t stream) {
  const int smem = static_cast<int>(sizeof(SharedStorage<kTwoTerm>));
  cudaError_t err = cudaFuncSetAttribute(reference_decode_kernel<kStrided, kTwoTerm>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.num_parts, p.row_tiles);
  reference_decode_kernel<kStrided, kTwoTerm><<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_reference_decode(const DecodeParams& p, cudaStream_t stream) {
  const bool strided = p.page_stride != kPageBytes;
  if (p.q_lo != nullptr) {
    return strided ? launch_reference<true, true>(p, stream)
                   : launch_reference<false, true>(p, stream);
  }
  return strided ? launch_reference<true, false>(p, stream)
                 : launch_reference<false, false>(p, stream);
}

}  // namespace decode
}  // namespace snapmla
