// The sm90 decode kernel ("the seesaw"): tile constants, the shared-memory plan, the named
// barriers and the traits of each variant.
//
// One CTA = 64 query rows (s_q x heads, flattened) of one part of the split-KV plan: a producer
// warpgroup that issues every TMA load into a ring of kStages pages, and two consumer warpgroups
// that alternate blocks for QK and the softmax (WG w owns blocks w, w + 2, ...) and split every
// block's transposed PV, O^T = V^T P8^T, by latent halves. docs/design.md explains the schedule.
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
#include "decode/dispatch.h"

namespace snapmla {
namespace decode {
namespace seesaw {

constexpr int kThreads = 256;  // two consumer warpgroups
constexpr int kWgThreads = 128;
constexpr int kCtaThreads = kThreads + kWgThreads;  // and the producer warpgroup
constexpr int kProducerWg = 2;
constexpr int kLoaderTid = kThreads;                // the producer's thread that issues every load
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
// kPBuffers blocks behind (with 2 that wait sits on the critical path).
constexpr int kPBuffers = 4;
constexpr int kQkChunkSteps = kChunkBytes / 32;      // k32 FP8 steps per content chunk
constexpr int kRopeSteps = kRopeDim / 16;            // k16 BF16 steps over the RoPE
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
  kBarConsumers = kBarWg + 2,      // the two consumer warpgroups
  kBarCta = kBarWg + 3,            // all three, at a request's end
  kBarStart = kBarWg + 4,          // all three at a request's start (the producer arrives)
};
static_assert(kBarStart < 16, "16 named barriers per CTA");
static_assert(kPBuffers % 2 == 0, "a buffer's blocks have one owner");
static_assert(kPBuffers >= 4,
              "the epilogue's 1/l goes to buffers (n + wg) % kPBuffers, apart "
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
  RowStats stats[kPBuffers];  // block i % kPBuffers
  float q_scale[kRowsM];
  int32_t bad_page;  // a page of this request's segment is outside the layer
  uint64_t full_bar[kStages];
  uint64_t q_bar;
  uint64_t empty_bar[kStages];  // both consumer warpgroups done with a stage
};

struct TensorMaps {
  CUtensorMap k_content;  // uint8  {512, 64, pages}: box {128, 64, 1}, 128B swizzle
  CUtensorMap k_rope;     // uint16 {64, 64, pages}:  box {64, 64, 1}, 128B swizzle
  CUtensorMap k_scale;    // fp32   {64, pages}:      box {64, 1}
  CUtensorMap q_content;  // uint8  {512, rows}:      box {128, 64}, 128B swizzle
  CUtensorMap q_rope;     // uint16 {64, rows}:       box {64, 64}, 128B swizzle
};

// setmaxnreg's split of the CTA's registers: the launch gives each of the 384 threads
// kLaunchRegs (__launch_bounds__(384, 1)), and the consumers' setmaxnreg.inc takes only what the
// producer's .dec returned to the CTA's pool, or they wait forever.
constexpr int kLaunchRegs = 65536 / kCtaThreads / 8 * 8;
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(kProducerRegs * kWgThreads + kConsumerRegs * kThreads <= kLaunchRegs * kCtaThreads,
              "the consumers' registers come from the producer's");
// The producer's wait for an empty stage suspends its thread up to this long between tries
// (try_wait's time hint) instead of spinning on the scheduler that also issues consumer warps.
constexpr uint32_t kProducerSuspendNs = 10000000;

// A kernel variant. kN: the query rows of a CTA that reach PV (16, 32 or 64; QK always computes
// the 64 rows of one wgmma M tile).
//   kInterleaved (N = 16, 32): one query row a thread. Tile row 16 j + g holds the high row of
//     query row 8 j + g and tile row 16 j + 8 + g its low row (the two-term query; zero for the
//     one-term query, zero RoPE), so one 64-row QK computes both and thread (g, t) of warp w holds
//     the high and the low logits of query row 8 w + g: z = fmaf(rho, lo, hi) (rho = s2 / s1).
//     Every warp below kN / 8 runs the softmax. The consumers load this tile themselves.
//   N = 64: two query rows a thread (rows g and g + 8 of its warp's 16), the one-term query only,
//     the Q tile by TMA.
//   kScaledPv (N = 64): the promotion O^T = gamma O^T + T in two steps, O^T *= gamma once a block
//     under the first m-tile's wgmmas, then O^T += T an m-tile, so that no gamma load follows a
//     wgmma wait; it pays on long chains of blocks (dispatch.h, kScaledPvMinChain).
template <int kN_, bool kScaledPv_ = false>
struct KernelTraits {
  static constexpr int kN = kN_;
  static constexpr bool kScaledPv = kScaledPv_;
  static constexpr bool kInterleaved = kN <= 32;
  static constexpr int kRowsPerWarp = kInterleaved ? 8 : 16;  // query rows of a warp's S
  static constexpr int kRowsPerThread = kInterleaved ? 1 : 2;
  static constexpr int kNRegs = kN / 2;  // O^T accumulator registers per m-tile and thread
  static constexpr int kNTiles = kN / 8;
  // The PV of a block: every m-tile's wgmmas in flight at once, each into its own whole-N
  // temporary (N = 32); or two groups in flight, whole-N m-tiles where every row sees the block
  // (N = 64), else half-N groups.
  static constexpr bool kPvAllTiles = kN == 32;
  static constexpr bool kPvWholeTiles = kN == 64;
  static_assert(kN == 16 || kN == 32 || kN == 64, "PV width: a wgmma N of 16, 32 or 64");
  static_assert(!kScaledPv || kN == 64, "the scaled PV: N = 64");
};

// Shared memory a CTA asks for: the plan plus slack to align it to 1024 bytes.
constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "fits one Hopper SM's shared memory");

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
