// The fast decode kernel: the numerics contract on Hopper's FP8 tensor cores (wgmma).
//
// One CTA = 64 query rows of one part of the split-KV schedule, two warpgroups (WG0, WG1).
// Per 64-token block (one page), in order:
//   TMA      thread 0 keeps kStages pages in flight: content as four 128-byte-wide columns with
//            128-byte swizzle, the RoPE tile likewise, and the 64 scales (one mbarrier/stage).
//   QK       WG w computes S[64 rows x tokens 32w..32w+31]: 16 FP8 wgmma (k = 32) over the
//            content and 4 BF16 wgmma (k = 16) over the pre-scaled RoPE, one fp32 accumulator.
//   V^T      meanwhile WG w transposes its V half (latent columns 256w..256w+255) from the
//            content tile into a K-major, 64-byte-swizzled tile (SMEM -> RF -> SMEM), with the
//            tokens permuted so that P needs no register shuffle (below), tokens past the
//            context and NaN codes zeroed.
//   softmax  the contract's block step; the two WGs exchange row maxima through shared memory
//            and so hold identical m and sigma.
//   P        each thread's P8 values already sit in the wgmma A-fragment layout of its WG's
//            32-token k-step; WGs swap fragments through shared memory (same thread index).
//   PV       WG w: O[64 x 256w..] = g O + P8[64 x 64] V^T, FP8 wgmma m64n64k32 with A from
//            registers, into fp32 temporaries that the CUDA cores add to O.
//
// P permutation: the accumulator gives a thread tokens {8i + 2t, 8i + 2t + 1} (i = 0..3) of a
// row; an FP8 A fragment wants k = {4t .. 4t + 3} and {16 + 4t ..}. Rather than shuffling P,
// logical k = 16 h + 4 t + j of a k-step is bound to token 16 h + 8 (j / 2) + 2 t + (j % 2),
// and V^T is written in that token order.
#include <cudaTypedefs.h>

#include <algorithm>
#include <mutex>

#include "common/launch.h"
#include "common/numerics.cuh"
#include "decode/decode.h"
#include "decode/segment.cuh"
#include "decode/sm90.cuh"
#include "decode/softmax.cuh"
#include "decode/wgmma_ops.cuh"

namespace snapmla {
namespace decode {
namespace {

using namespace sm90;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kWgThreads = 128;
constexpr int kStages = 3;                          // pages in flight per CTA
constexpr int kChunkBytes = 128;                    // one swizzle row of FP8 content
constexpr int kChunks = kContentDim / kChunkBytes;  // 4 column chunks of content
constexpr int kTileBytes = kBlockN * kChunkBytes;   // 8 KiB: 64 rows x 128 bytes
constexpr int kVtRowBytes = kBlockN;                // V^T row: 64 tokens (FP8), 64B swizzle
constexpr int kVtCols = kContentDim / 2;            // latent columns per warpgroup
constexpr uint32_t kStageTxBytes = kChunks * kTileBytes + kTileBytes + kBlockN * 4;
constexpr uint32_t kQTxBytes = kChunks * kTileBytes + kTileBytes;
static_assert(kTileRows == 64 && kBlockN == 64, "one wgmma M tile of rows, one page of tokens");
static_assert(kRopeDim * 2 == kChunkBytes, "a RoPE row is one 128-byte swizzle row");

// Barrier ids (0 is __syncthreads): cross-warpgroup exchanges, then one per warpgroup.
constexpr int kBarBoth = 1;
constexpr int kBarWg0 = 2;

struct alignas(1024) FastSmem {
  uint8_t q_content[kChunks][kTileBytes];  // [64 rows][128 B] x 4, 128B swizzle (TMA)
  uint8_t q_rope[kTileBytes];              // [64 rows][64 bf16], 128B swizzle
  struct alignas(1024) Stage {
    uint8_t content[kChunks][kTileBytes];  // [64 tokens][128 B] x 4, 128B swizzle
    uint8_t rope[kTileBytes];              // [64 tokens][64 bf16], 128B swizzle
    float scale[kBlockN];
  } stage[kStages];
  alignas(1024) uint8_t vt[2][kVtCols * kVtRowBytes];  // per WG: [256 d][64 tok], 64B swizzle
  uint32_t p_frag[2][kWgThreads][4];                   // P8 A fragments, per WG and thread
  float q_scale[kTileRows];
  float red_max[2][kTileRows];
  float red_pmax[2][kTileRows];
  float red_l[2][kTileRows];
  uint64_t full_bar[kStages];
  uint64_t q_bar;
};

struct FastMaps {
  CUtensorMap k_content;  // uint8  {512, 64, pages}: box {128, 64, 1}, 128B swizzle
  CUtensorMap k_rope;     // uint16 {64, 64, pages}:  box {64, 64, 1}, 128B swizzle
  CUtensorMap k_scale;    // fp32   {64, pages}:      box {64, 1}
  CUtensorMap q_content;  // uint8  {512, rows}:      box {128, 64}, 128B swizzle
  CUtensorMap q_rope;     // uint16 {64, rows}:       box {64, 64}, 128B swizzle
};

// Byte offset of (row, byte) in a [rows][128 B] tile with 128-byte swizzle (as TMA wrote it).
__device__ __forceinline__ int sw128(int row, int byte) {
  return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
}
// Byte offset of (row, byte) in a [rows][64 B] tile with 64-byte swizzle.
__device__ __forceinline__ int sw64(int row, int byte) {
  return row * 64 + ((((byte >> 4) ^ (row >> 1)) & 3) << 4) + (byte & 15);
}

// Zero the E4M3 NaN codes (0x7f, 0xff) of four packed bytes.
__device__ __forceinline__ uint32_t zero_nan_bytes(uint32_t w) {
  return w & ~__vcmpeq4(w & 0x7f7f7f7fu, 0x7f7f7f7fu);
}

// V^T of warpgroup wg: vt[d][k] (d < 256 local columns, k the logical k of the two k-steps)
// from the block's content tile. Output word q (bytes 4q .. 4q + 3 of a row) of k-step
// ks = q / 8 holds tokens base + {0, 1, 8, 9}, base = 32 ks + 16 ((q / 4) % 2) + 2 (q % 4).
__device__ __forceinline__ void transpose_v(uint8_t* vt, const FastSmem::Stage& st, int wg, int tid,
                                            int valid_tokens) {
  constexpr int kJobs = (kVtCols / 4) * 16;  // (4-column group, word) pairs
#pragma unroll 1
  for (int job = tid; job < kJobs; job += kWgThreads) {
    const int q = job % 16, d0 = (job / 16) * 4;
    const int base = 32 * (q / 8) + 16 * ((q / 4) % 2) + 2 * (q % 4);
    const int d = kVtCols * wg + d0;  // latent column in the content tile
    const uint8_t* chunk = st.content[d / kChunkBytes];
    const int tok[4] = {base, base + 1, base + 8, base + 9};
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = *reinterpret_cast<const uint32_t*>(chunk + sw128(tok[i], d % kChunkBytes));
      w[i] = tok[i] < valid_tokens ? zero_nan_bytes(v) : 0u;
    }
    // 4x4 byte transpose: out[j] = byte j of w[0..3].
    const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), lo23 = __byte_perm(w[2], w[3], 0x5140);
    const uint32_t hi01 = __byte_perm(w[0], w[1], 0x7362), hi23 = __byte_perm(w[2], w[3], 0x7362);
    const uint32_t out[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                             __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<uint32_t*>(vt + sw64(d0 + j, 4 * q)) = out[j];
    }
  }
}

__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
  return to_e4m3x4(a, b, c, d);  // exact: the values already are E4M3 values
}

__global__ void __launch_bounds__(kThreads, 1)
    fast_decode_kernel(const DecodeParams p, const __grid_constant__ FastMaps maps) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  FastSmem& s = *reinterpret_cast<FastSmem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~uintptr_t{1023});

  const int part = blockIdx.x, tile = blockIdx.y;
  const int tid = threadIdx.x, wg = tid / kWgThreads, wtid = tid % kWgThreads;
  const int warp = wtid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int row_local[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int rows_total = p.q_len * p.num_heads;
  auto both_sync = [] { named_barrier(kBarBoth, kThreads); };

  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(&s.full_bar[i], 1);
    mbar_init(&s.q_bar, 1);
    mbar_fence_init();
  }
  __syncthreads();

  const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
  const int req_begin = p.plan[L.part_begin + part];
  const int req_end = p.plan[L.part_end + part];
  uint32_t it = 0;  // blocks consumed by this CTA so far: stage and phase of the ring
  uint32_t q_phase = 0;

  // Issue the loads of block `blk` of request b into ring slot `slot` (thread 0 only). A page
  // outside the layer loads nothing; the consumers see `bad_page` and the phase still turns.
  auto issue_block = [&](uint32_t slot, int b, int blk) {
    uint64_t* bar = &s.full_bar[slot % kStages];
    FastSmem::Stage& st = s.stage[slot % kStages];
    const int32_t page = p.block_table[int64_t{b} * p.block_table_stride + blk];
    if (page < 0 || page >= p.num_pages) {
      mbar_arrive(bar);
      return;
    }
    mbar_arrive_expect_tx(bar, kStageTxBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      tma_load_3d(st.content[c], &maps.k_content, bar, c * kChunkBytes, 0, page);
    }
    tma_load_3d(st.rope, &maps.k_rope, bar, 0, 0, page);
    tma_load_2d(st.scale, &maps.k_scale, bar, 0, page);
  };

  for (int b = req_begin; b <= req_end; ++b) {
    Segment seg;
    if (plan_segment(p, L, part, b, tile, &seg) != SegmentKind::kRun) continue;
    const int seqlen = p.seqlens[b];
    const int n_blocks = seg.blk_hi - seg.blk_lo;
    const int64_t row0 = int64_t{b} * rows_total + tile * kTileRows;

    if (tid == 0) {
      mbar_arrive_expect_tx(&s.q_bar, kQTxBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        tma_load_2d(s.q_content[c], &maps.q_content, &s.q_bar, c * kChunkBytes,
                    static_cast<int32_t>(row0));
      }
      tma_load_2d(s.q_rope, &maps.q_rope, &s.q_bar, 0, static_cast<int32_t>(row0));
      for (int i = 0; i < min(kStages, n_blocks); ++i) issue_block(it + i, b, seg.blk_lo + i);
    }
    if (tid < kTileRows) {
      const int fr = tile * kTileRows + tid;
      s.q_scale[tid] = fr < rows_total ? p.q_scale[int64_t{b} * rows_total + fr] : 0.f;
    }
    const int limit[2] = {visibility_limit(p, tile * kTileRows + row_local[0], seqlen),
                          visibility_limit(p, tile * kTileRows + row_local[1], seqlen)};
    RowState st;
    float o[kColTiles * 4];
#pragma unroll
    for (int i = 0; i < kColTiles * 4; ++i) o[i] = 0.f;
    bool bad_page = false;
    __syncthreads();  // q_scale
    mbar_wait(&s.q_bar, q_phase);
    q_phase ^= 1;

    for (int i = 0; i < n_blocks; ++i, ++it) {
      const int blk = seg.blk_lo + i;
      const int tok0 = blk * kBlockN;
      const FastSmem::Stage& stg = s.stage[it % kStages];
      {
        const int32_t page = p.block_table[int64_t{b} * p.block_table_stride + blk];
        bad_page |= page < 0 || page >= p.num_pages;
      }
      mbar_wait(&s.full_bar[it % kStages], (it / kStages) & 1);

      // ---- S = Q K^T for tokens 32wg.. (async), while V^T is built. FP8 wgmma accumulates
      // with reduced precision, so each 128-byte k-chunk (4 QGMMA) gets its own fp32 partial
      // and the partials are summed on the CUDA cores: chunks 0 and 1 run during the V
      // transpose, chunks 2 and 3 (with the RoPE HGMMA) after it.
      float part[2][16], sacc[16];
      auto issue_chunks = [&](int c0, bool rope) {
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int c = c0 + j, off = 32 * k;
            wgmma_m64n32k32_e4m3_ss(part[j],
                                    make_desc(s.q_content[c] + off, Swizzle::k128B, kChunkBytes),
                                    make_desc(stg.content[c] + 32 * wg * kChunkBytes + off,
                                              Swizzle::k128B, kChunkBytes),
                                    k != 0);
          }
        }
        if (rope) {
#pragma unroll
          for (int k = 0; k < kRopeDim / 16; ++k) {
            wgmma_m64n32k16_bf16_ss(
                part[1], make_desc(s.q_rope + 32 * k, Swizzle::k128B, kChunkBytes),
                make_desc(stg.rope + 32 * wg * kChunkBytes + 32 * k, Swizzle::k128B, kChunkBytes),
                1);
          }
        }
        wgmma_commit();
      };
      issue_chunks(0, false);
      transpose_v(s.vt[wg], stg, wg, wtid, seqlen - tok0);
      fence_proxy_async();  // V^T (generic writes) is read next by wgmma (async proxy)
      wgmma_wait<0>();
      fence_regs(part[0]);
      fence_regs(part[1]);
#pragma unroll
      for (int e = 0; e < 16; ++e) sacc[e] = part[0][e] + part[1][e];
      issue_chunks(2, true);
      wgmma_wait<0>();
      fence_regs(part[0]);
      fence_regs(part[1]);
#pragma unroll
      for (int e = 0; e < 16; ++e) sacc[e] += part[0][e] + part[1][e];

      // ---- the contract's softmax step; sacc becomes P8
      float (&sfrag)[4][4] = *reinterpret_cast<float (*)[4][4]>(sacc);
      float gamma[2];
      softmax_block(sfrag, stg.scale, s.q_scale, row_local, limit, tok0, wg, t4, p.scale_log2,
                    s.red_max, s.red_pmax, st, gamma, both_sync);
      uint32_t frag[4];
      frag[0] = pack_e4m3x4(sacc[0], sacc[1], sacc[4], sacc[5]);
      frag[1] = pack_e4m3x4(sacc[2], sacc[3], sacc[6], sacc[7]);
      frag[2] = pack_e4m3x4(sacc[8], sacc[9], sacc[12], sacc[13]);
      frag[3] = pack_e4m3x4(sacc[10], sacc[11], sacc[14], sacc[15]);
      *reinterpret_cast<uint4*>(s.p_frag[wg][wtid]) =
          make_uint4(frag[0], frag[1], frag[2], frag[3]);
      both_sync();  // fragments swapped; stage and V^T fully consumed / written
      if (tid == 0 && i + kStages < n_blocks) issue_block(it + kStages, b, blk + kStages);
      const uint4 other = *reinterpret_cast<const uint4*>(s.p_frag[wg ^ 1][wtid]);
      const uint32_t other_frag[4] = {other.x, other.y, other.z, other.w};

      // ---- O = g O + P8 V^T over the block's two k-steps (tokens 0..31, then 32..63). The
      // block's product lands in a zeroed fp32 temporary, a quarter of the columns at a time, and
      // is added to O on the CUDA cores: O never sits in a reduced-precision accumulation.
      uint32_t frag0[4], frag1[4];  // k-step 0 holds WG0's tokens, k-step 1 WG1's
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        frag0[k] = wg == 0 ? frag[k] : other_frag[k];
        frag1[k] = wg == 0 ? other_frag[k] : frag[k];
      }
      constexpr int kPvParts = 4;                     // column quarters of 64
      constexpr int kPvTiles = kColTiles / kPvParts;  // 8-column tiles per quarter
#pragma unroll
      for (int h = 0; h < kPvParts; ++h) {
        float pv[kPvTiles * 4];
        const uint8_t* vt = s.vt[wg] + h * (kVtCols / kPvParts) * kVtRowBytes;
        wgmma_fence();
        wgmma_m64n64k32_e4m3_rs(pv, frag0, make_desc(vt, Swizzle::k64B, kVtRowBytes), 0);
        wgmma_m64n64k32_e4m3_rs(pv, frag1, make_desc(vt + 32, Swizzle::k64B, kVtRowBytes), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(pv);
#pragma unroll
        for (int n = 0; n < kPvTiles; ++n) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            float& acc = o[4 * (h * kPvTiles + n) + c];
            acc = fmaf(acc, gamma[c / 2], pv[4 * n + c]);
          }
        }
      }
      named_barrier(kBarWg0 + wg, kWgThreads);  // V^T and p_frag free for the next block
    }

    // ---- epilogue
    float l[2];
    reduce_l(st, row_local, wg, t4, s.red_l, l, both_sync);
    const float (&ofrag)[kColTiles][4] = *reinterpret_cast<const float (*)[kColTiles][4]>(o);
    write_row<0>(p, b, tile * kTileRows + row_local[0], kVtCols * wg, t4, ofrag, l[0], st.m[0],
                 st.sig[0], bad_page, seg, wg == 0 && t4 == 0);
    write_row<1>(p, b, tile * kTileRows + row_local[1], kVtCols * wg, t4, ofrag, l[1], st.m[1],
                 st.sig[1], bad_page, seg, wg == 0 && t4 == 0);
    __syncthreads();  // q tiles, exchange buffers and the ring are reused by the next request
  }
}

// ------------------------------------------------------------------------- tensor maps
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
  });
  return fn;
}

cudaError_t encode(CUtensorMap* map, CUtensorMapDataType type, int rank, const void* base,
                   const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                   CUtensorMapSwizzle swizzle) {
  auto fn = encode_fn();
  if (fn == nullptr) return cudaErrorNotSupported;
  const uint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = fn(map, type, rank, const_cast<void*>(base), dims, strides_bytes, box,
                        elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

size_t fast_decode_smem_bytes() { return sizeof(FastSmem) + 1024; }

cudaError_t launch_fast_decode(const DecodeParams& p, cudaStream_t stream) {
  FastMaps maps;
  const uint64_t pages = static_cast<uint64_t>(p.num_pages);
  const uint64_t rows = static_cast<uint64_t>(p.batch) * p.q_len * p.num_heads;
  cudaError_t err;
  {
    const uint64_t dims[3] = {kContentDim, kBlockN, pages};
    const uint64_t strides[2] = {kContentDim, kPageBytes};
    const uint32_t box[3] = {kChunkBytes, kBlockN, 1};
    err = encode(&maps.k_content, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3,
                 p.layer_base + kPageContentOffset, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
  }
  {
    const uint64_t dims[3] = {kRopeDim, kBlockN, pages};
    const uint64_t strides[2] = {kRopeDim * 2, kPageBytes};
    const uint32_t box[3] = {kRopeDim, kBlockN, 1};
    err = encode(&maps.k_rope, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, p.layer_base + kPageRopeOffset,
                 dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
  }
  {
    const uint64_t dims[2] = {kBlockN, pages};
    const uint64_t strides[1] = {kPageBytes};
    const uint32_t box[2] = {kBlockN, 1};
    err = encode(&maps.k_scale, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, p.layer_base + kPageScaleOffset,
                 dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
    if (err != cudaSuccess) return err;
  }
  {
    const uint64_t dims[2] = {kContentDim, rows};
    const uint64_t strides[1] = {kContentDim};
    const uint32_t box[2] = {kChunkBytes, kTileRows};
    err = encode(&maps.q_content, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, p.q_content, dims, strides, box,
                 CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
  }
  {
    const uint64_t dims[2] = {kRopeDim, rows};
    const uint64_t strides[1] = {kRopeDim * 2};
    const uint32_t box[2] = {kRopeDim, kTileRows};
    err = encode(&maps.q_rope, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, p.q_rope, dims, strides, box,
                 CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
  }
  const int smem = static_cast<int>(fast_decode_smem_bytes());
  err = cudaFuncSetAttribute(fast_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  fast_decode_kernel<<<dim3(p.num_parts, p.row_tiles), kThreads, smem, stream>>>(p, maps);
  return cudaGetLastError();
}

}  // namespace decode
}  // namespace snapmla
