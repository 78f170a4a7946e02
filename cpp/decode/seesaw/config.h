// The seesaw decode kernel: every tile constant, the shared-memory plan and the named barriers.
//
// One CTA = 64 query rows (s_q x heads, flattened, heads fastest) of one part of the split-KV
// schedule; two consumer warpgroups, and at N = 32 and 64 a producer warpgroup (kernel.cuh,
// kProducerAt) that issues every load. Per 64-token block (one page):
//   QK       S[64 rows x 64 tokens] = Q K^T: 16 FP8 wgmma m64n64k32 over the content and 4 BF16
//            wgmma m64n64k16 over the pre-scaled RoPE, in two fp32 halves (content 0-255 and
//            256-511 + RoPE) that the CUDA cores add: FP8 wgmma does not accumulate in fp32.
//            Blocks alternate between the warpgroups: WG w owns blocks i = w, w + 2, ...
//   softmax  the owner runs the contract's block step on its S and publishes P8 (to shared
//            memory, the B operand of PV) and the row statistics m, sigma, l, gamma.
//   PV       transposed: O^T[512 latent x N rows] = V^T P^T. WG w owns latent half
//            [256 w, 256 w + 256) for every block: 4 m-tiles of 64 latent rows x 2 k-steps of
//            32 tokens. V^T is built straight into wgmma A registers from the TMA'd content
//            tile (ldmatrix.trans + one byte permute per register): no transpose pass, no V^T
//            buffer. The product goes in groups of (m-tile, half the rows), two in flight, each
//            into a zeroed fp32 temporary that the CUDA cores add into O = gamma O + T (the
//            rescale every online softmax pays anyway). Order: the owner's softmax of block i,
//            then its PV of block i - 1 (the other's) and of block i.
//   TMA      a ring of kStages pages, each refilled in three parts (the two content halves, then
//            the RoPE tile and the scales); full[stage] counts those three arrivals. With a
//            producer warpgroup its elected thread issues all three once both consumer
//            warpgroups have arrived on empty[stage] (after their PVs of the block). Without one
//            (N = 16) an elected thread of the warpgroup that last read each part refills it:
//            each warpgroup its content half after its PV, the owner the RoPE tile and the
//            scales after its softmax (past the softmax's proxy fence), or warp 3, which runs
//            no softmax at N = 16, during the softmax.
//   P8 and the row statistics live in kPBuffers buffers, handed over by named barriers.
//
// Fragment bindings (derived in fragments.cuh, tested bit-exact by tests/cuda/seesaw_fragments.cu):
//   V^T A fragment of warp v, m-tile m, k-step ks: M-row 16 v + g <-> latent d = base + 2 g,
//   M-row 16 v + g + 8 <-> d = base + 2 g + 1 (base = 256 w + 64 m + 16 v); logical
//   k = 16 h + 4 t + j <-> token 32 ks + 16 h + 8 (j / 2) + 2 t + (j % 2).
//   P8 in shared memory: row r, byte 16 h + 4 t + j <-> token 16 h + 8 (j / 2) + 2 t + (j % 2),
//   which is what the S accumulator gives thread (g, t): no shuffles.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/numerics.cuh"
#include "decode/decode.h"

namespace snapmla {
namespace decode {
namespace seesaw {

constexpr int kThreads = 256;  // two consumer warpgroups
constexpr int kWgThreads = 128;
constexpr int kRowsM = 64;                          // QK's M: query rows per CTA
constexpr int kStages = 4;                          // pages in flight
constexpr int kChunkBytes = 128;                    // one 128-byte swizzle row of FP8 content
constexpr int kChunks = kContentDim / kChunkBytes;  // 4 content chunks per token
constexpr int kTileBytes = kBlockN * kChunkBytes;   // 8 KiB: 64 rows x 128 bytes
constexpr int kHalfDim = kContentDim / 2;           // latent columns per warpgroup (PV)
constexpr int kMTiles = kHalfDim / 64;              // PV m-tiles of 64 latent rows per warpgroup
constexpr int kPRowBytes = kBlockN;                 // P8 row: 64 tokens, 64-byte swizzle
// P8 tiles and row statistics in flight: the owner of block i reuses the buffer of block
// i - kPBuffers, so it waits for the other warpgroup's PV of that block only when that PV is
// kPBuffers blocks behind (with 2 the wait sat on the critical path: bench/NOTES.md).
constexpr int kPBuffers = 4;
constexpr int kQkChunkSteps = kChunkBytes / 32;     // k32 FP8 steps per content chunk
constexpr int kRopeSteps = kRopeDim / 16;           // k16 BF16 steps over the RoPE
constexpr uint32_t kContentHalfTx = 2 * kTileBytes;  // one warpgroup's refill
constexpr uint32_t kRopeScaleTx = kTileBytes + kBlockN * 4;
constexpr uint32_t kStageTx = 2 * kContentHalfTx + kRopeScaleTx;
constexpr uint32_t kQTx = kChunks * kTileBytes + kTileBytes;
constexpr uint32_t kFullArrivals = 3;  // content half x 2, RoPE + scales

static_assert(kTileRows == kRowsM && kBlockN == 64, "one wgmma M tile of rows, one page");
static_assert(kRopeDim * 2 == kChunkBytes, "a RoPE row is one 128-byte swizzle row");
static_assert(kStages >= 2, "QK of block i + 2 needs the ring to hold two blocks ahead");

// Named barrier ids (0 is __syncthreads).
enum Barrier : int {
  kBarPready = 1,  // + (i & 1): the owner of block i published P8 and the statistics
  kBarPfree = 3,   // + (i % kPBuffers): the other warpgroup finished its PV of block i
  kBarWg = kBarPfree + kPBuffers,  // + wg: one warpgroup, its own P8 and statistics written
};
static_assert(kBarWg + 2 <= 16, "16 named barriers per CTA");
static_assert(kPBuffers % 2 == 0, "a buffer's blocks have one owner");
static_assert(kPBuffers >= 4, "the epilogue's 1/l goes to buffers (n + wg) % kPBuffers, apart "
                              "from the last block's (n - 1) % kPBuffers");

// Row statistics of one block, published by its owner (log2-domain m).
struct RowStats {
  float m[kRowsM];
  float sig[kRowsM];
  float l[kRowsM];
  float gamma[kRowsM];
};

struct alignas(1024) SharedStorage {
  uint8_t q_content[kChunks][kTileBytes];  // [64 rows][128 B] x 4, 128B swizzle (TMA)
  uint8_t q_rope[kTileBytes];              // [64 rows][64 bf16], 128B swizzle
  struct alignas(1024) Stage {
    uint8_t content[kChunks][kTileBytes];  // [64 tokens][128 B] x 4, 128B swizzle
    uint8_t rope[kTileBytes];              // [64 tokens][64 bf16], 128B swizzle
    float scale[kBlockN];
  } stage[kStages];
  // block i % kPBuffers: [rows][64 B]
  alignas(1024) uint8_t p8[kPBuffers][kRowsM * kPRowBytes];
  RowStats stats[kPBuffers];                                // block i % kPBuffers
  float q_scale[kRowsM];
  int32_t bad_page;  // a page of this request's segment is outside the layer
  uint64_t full_bar[kStages];
  uint64_t q_bar;
  uint64_t empty_bar[kStages];  // with a producer: both consumer warpgroups done with a stage
  int32_t refill_page[2 * kStages];  // roles.cuh: the page block i + kStages loads, at i % 8
};

struct TensorMaps {
  CUtensorMap k_content;  // uint8  {512, 64, pages}: box {128, 64, 1}, 128B swizzle
  CUtensorMap k_rope;     // uint16 {64, 64, pages}:  box {64, 64, 1}, 128B swizzle
  CUtensorMap k_scale;    // fp32   {64, pages}:      box {64, 1}
  CUtensorMap q_content;  // uint8  {512, rows}:      box {128, 64}, 128B swizzle
  CUtensorMap q_rope;     // uint16 {64, rows}:       box {64, 64}, 128B swizzle
};

// Shared memory a CTA asks for: the plan plus slack to align it to 1024 bytes.
constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "fits one Hopper SM's shared memory");

// SNAPMLA_SEESAW_PV_DIRECT (experimental, off): N = 64's PV into O^T itself (kernel.cuh,
// kPvDirect; instantiations/n64_direct.cu, compiled only under this switch). 1: where no CTA's
// chain of blocks can pass 256 (launch.cu); 2: at every N = 64 call. 10-13% faster at N = 64 on
// the H200, but the FP8 tensor cores' accumulation (13 bits, cut toward zero) then spans a
// CTA's whole chain: on the workload layers at 128 heads its error against exact attention is
// 1.10x the model's at the default split and 8.6x with one CTA a context (64-256 blocks), far
// past the contract's 1.15x (bench/NOTES.md, session 13).
#ifndef SNAPMLA_SEESAW_PV_DIRECT
#define SNAPMLA_SEESAW_PV_DIRECT 0
#endif

// SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN (8, the default since session 32): N = 64 calls whose
// parts run about this many blocks or more (launch.cu's estimate from the launch's shape) take
// the kernel whose PV scales O^T by the block's gamma once, under the first m-tile's wgmmas,
// and then adds each m-tile's product (kScaledPv, kernel.cuh; instantiations/n64_scaled.cu).
// Its promotion reads no gamma after a wgmma wait (ncu, session 31: the promoted PV's issue
// stalled there), so long chains run ~2% faster; calls of one or two blocks a part ran ~0.4
// us slower (the first block's softmax, bench/NOTES.md, session 32), hence the bound. Graph
// replays, A/B/A/B in one call: 8x1x128x4096 (8 blocks a part) 29.1 / 29.1 us with the bound at
// 16, 28.8 / 28.8 at 8. 0: every N = 64 call; -1: none (the instantiation is not built).
#ifndef SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN
#define SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN 8
#endif

// Launches the kernel of PV width kN (instantiations/n<kN>.cu; kTwoTerm: n<kN>_two_term.cu;
// kPvDirect, N = 64 only, experimental: n64_direct.cu; kScaledPv, N = 64 one-term only:
// n64_scaled.cu; kernel.cuh says what each changes).
template <int kN, bool kTwoTerm = false, bool kPvDirect = false, bool kScaledPv = false>
cudaError_t run(const DecodeParams& p, const TensorMaps& maps, cudaStream_t stream);

// SNAPMLA_SEESAW_ROLES (experimental, off): the N = 64 one-term query on the role-split kernel
// (roles.cuh: two S warpgroups for QK and softmax, two PV warpgroups for O^T;
// instantiations/n64_roles.cu, compiled only under the switch).
#ifndef SNAPMLA_SEESAW_ROLES
#define SNAPMLA_SEESAW_ROLES 0
#endif
namespace roles {
cudaError_t run(const DecodeParams& p, const TensorMaps& maps, cudaStream_t stream);
}  // namespace roles

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
