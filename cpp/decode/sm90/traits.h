// The sm90 decode kernel ("the seesaw", docs/design.md): tile constants, the shared-memory plan,
// the named barriers, the variants. The fragment bindings are stated in fragments.cuh.
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
// Block i reuses block i - kPBuffers's P8 and statistics buffers. The other warpgroup runs its
// PV of block j before its softmax of block j + 3, and the owner of block j + 4 waits for that
// softmax's statistics before it writes either buffer: four buffers need no other wait.
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
  kBarPready = 1,     // + (i & 1): the owner of block i published P8 and the statistics
  kBarWg = 3,         // + wg: one warpgroup, its own P8 and statistics written
  kBarConsumers = 5,  // the two consumer warpgroups
  kBarCta = 6,        // all three, at a request's end
  kBarStart = 7,      // all three at a request's start (the producer arrives)
};
static_assert(kBarStart < 16, "16 named barriers per CTA");
static_assert(kPBuffers == 4,
              "the softmax's wait for the previous block's statistics frees the buffers; the "
              "epilogue's 1/l goes to buffers (n + wg) % kPBuffers, apart from the last "
              "block's (n - 1) % kPBuffers");

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
  alignas(1024) uint8_t p8[kPBuffers][kRowsM * kPRowBytes];
  RowStats stats[kPBuffers];  // p8 and stats: block i % kPBuffers
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

// The consumers' setmaxnreg.inc takes only what the producer's .dec returned to the CTA's pool
// (kLaunchRegs a thread at launch); asking for more waits forever.
constexpr int kLaunchRegs = 65536 / kCtaThreads / 8 * 8;
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(kProducerRegs * kWgThreads + kConsumerRegs * kThreads <= kLaunchRegs * kCtaThreads,
              "the consumers' registers come from the producer's");
// try_wait's time hint for the producer's empty-stage wait: suspended, it does not spin on the
// scheduler that also issues the consumer warps.
constexpr uint32_t kProducerSuspendNs = 10000000;

// kN: query rows reaching PV (QK computes all 64). kInterleaved: tile rows 16 j + g, 16 j + 8 + g
// hold query row 8 j + g's high and low terms (zero for a one-term query): thread (g, t) of warp w
// has both logits of row 8 w + g. N = 64: rows g, g + 8 of the warp's 16. kScaledPv: O^T *= gamma
// once a block under the first m-tile's wgmmas, then O^T += T: no gamma load after a wait.
template <int kN_, bool kScaledPv_ = false>
struct KernelTraits {
  static constexpr int kN = kN_;
  static constexpr bool kScaledPv = kScaledPv_;
  static constexpr bool kInterleaved = kN <= 32;
  static constexpr int kRowsPerWarp = kInterleaved ? 8 : 16;  // query rows of a warp's S
  static constexpr int kRowsPerThread = kInterleaved ? 1 : 2;
  static constexpr int kNRegs = kN / 2;  // O^T accumulator registers per m-tile and thread
  static constexpr int kNTiles = kN / 8;
  static constexpr bool kPvAllTiles = kN == 32;
  static constexpr bool kPvWholeTiles = kN == 64;
  static_assert(kN == 16 || kN == 32 || kN == 64, "PV width: a wgmma N of 16, 32 or 64");
  static_assert(!kScaledPv || kN == 64, "the scaled PV: N = 64");
};

constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + slack to align it to 1024
static_assert(kSmemBytes <= 227 * 1024, "fits one Hopper SM's shared memory");

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
