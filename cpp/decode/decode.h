// Decode: split-KV schedule (plan), the attention kernels and the combine.
//
// The schedule flattens the batch into a cost line: request b costs kFixedCost units (loading
// its queries, writing its rows) plus one unit per 64-token block. Part p of num_parts owns
// the cost range [p * T, (p + 1) * T), T = ceil(total / num_parts). A request whose blocks
// fall into several parts is split: each part writes a partial (O / l, lse) into the
// workspace and the combine merges them by log-sum-exp. Partial slot of (part p, request b):
// 2 * p + (p == first_part[b] ? 1 : 0): at most one request starts a split in a part (its
// last), and at most one continues one (its first), so slots never collide. Where every request
// fits in k parts of at most 9/8 T and batch x k parts fit, the plan pads the line instead
// (plan.cu, the aligned line): request b starts at b k T_k, so it has k parts of its own. The
// kernels read the line only through prefix[], T, first_part[] and last_part[], padded or not.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>


namespace snapmla {
namespace decode {

constexpr int kBlockN = 64;                 // tokens per KV block (= one page)
constexpr int kTileRows = 64;               // query rows (s_q x heads, flattened) per CTA
// Schedule cost of a request beyond its blocks: a segment's own fixed costs (its Q tile, its
// epilogue) are about two to three blocks' worth.
constexpr int kFixedCost = 2;
// With the default split count, a part covers at least this much cost (a request's blocks go
// two a part where the batch leaves SMs idle): one block a part doubles the partials the
// combine reads, three leave SMs idle at batch 1.
constexpr int kMinPartCost = kFixedCost;
constexpr int32_t kPlanMagic = 0x4d4c4131;  // "1ALM"

// A request's blocks as the plan records them: ceil(seqlen / 64), or -1 for a seqlen outside
// [0, max_pages * 64] (its rows are NaN). The kernels compare the plan's word with the seqlen
// they read: a plan built for other lengths gives its request NaN rows (segment.cuh).
__host__ __device__ constexpr int32_t blocks_of(int32_t seqlen, int32_t max_pages) {
  return seqlen < 0 || int64_t{seqlen} > int64_t{max_pages} * kBlockN
             ? -1
             : (seqlen + kBlockN - 1) / kBlockN;
}

// The plan's first words: what it was built for. The plan's layout and the workspace's
// (WorkspaceLayout) follow from these alone, so a launch whose own shape gives other words must
// not follow the plan nor write the workspace as laid out.
struct PlanShape {
  static constexpr int kWords = 8;
  int32_t magic;  // kPlanMagic
  int32_t batch;
  int32_t num_parts;
  int32_t row_tiles;
  int32_t q_len;
  int32_t num_heads;
  int32_t max_pages;
  int32_t q_terms;  // 1, or 2 for the two-term query (its low rows in the workspace)

  __host__ __device__ static PlanShape make(int batch, int num_parts, int q_len, int num_heads,
                                            int max_pages, bool two_term) {
    return {kPlanMagic, batch,     num_parts, (q_len * num_heads + kTileRows - 1) / kTileRows,
            q_len,      num_heads, max_pages, two_term ? 2 : 1};
  }
};

// The header: the shape, then the schedule's part cost T.
struct PlanHeader {
  PlanShape shape;
  int32_t part_cost;  // T: part p owns the cost range [p T, (p + 1) T)
};
static_assert(sizeof(PlanShape) == PlanShape::kWords * sizeof(int32_t), "int32 words");

// Plan: int32 words in device memory, the header then the arrays below.
struct PlanLayout {
  static constexpr int kHeaderWords = sizeof(PlanHeader) / sizeof(int32_t);
  int64_t prefix;      // [batch + 1] exclusive prefix of request costs
  int64_t nblocks;     // [batch] blocks per request; -1: invalid seqlen
  int64_t first_part;  // [batch]
  int64_t last_part;   // [batch]
  int64_t part_begin;  // [num_parts] first request touching the part
  int64_t part_end;    // [num_parts] last request touching the part (inclusive)
  int64_t total_words;

  __host__ __device__ static PlanLayout make(int batch, int num_parts) {
    PlanLayout l{};
    l.prefix = kHeaderWords;
    l.nblocks = l.prefix + batch + 1;
    l.first_part = l.nblocks + batch;
    l.last_part = l.first_part + batch;
    l.part_begin = l.last_part + batch;
    l.part_end = l.part_begin + num_parts;
    l.total_words = l.part_end + num_parts;
    return l;
  }
};

// Workspace: byte offsets, each 256-byte aligned.
struct WorkspaceLayout {
  int64_t q_content;    // e4m3 [b, s_q, h, 512]
  int64_t q_rope;       // bf16 [b, s_q, h, 64]
  int64_t q_scale;      // fp32 [b, s_q, h]
  int64_t partial_o;    // [2 * num_parts, row_tiles * 64] records of 2 KB (segment.cuh)
  int64_t partial_lse;  // fp32 [2 * num_parts, row_tiles * 64]
  int64_t q_lo;         // e4m3 [b, s_q, h, 512]: the two-term query's low row (two_term only)
  int64_t q_lo_scale;   // fp32 [b, s_q, h] (two_term only)
  int64_t total_bytes;

  // two_term: room for the two-term query's low row and scale (config.q_precision FP8X2).
  static WorkspaceLayout make(int batch, int q_len, int num_heads, int num_parts,
                              bool two_term = false);
};

struct DecodeParams {
  // queries, quantized (workspace)
  const uint8_t* q_content;  // e4m3 [b, s_q, h, 512]
  const uint16_t* q_rope;    // bf16 [b, s_q, h, 64]
  const float* q_scale;      // fp32 [b, s_q, h]
  // cache
  const uint8_t* layer_base;   // first page of the layer
  int32_t num_pages;           // pages per layer
  const int32_t* block_table;  // [b, max_pages], row stride block_table_stride
  int64_t block_table_stride;
  const int32_t* seqlens;  // [b]
  const int32_t* plan;     // PlanLayout words
  // shape
  int32_t batch;
  int32_t q_len;
  int32_t num_heads;
  int32_t max_pages;
  int32_t num_parts;
  int32_t row_tiles;  // ceil(q_len * num_heads / 64)
  int32_t causal;
  float scale_log2;  // softmax_scale * log2(e)
  // outputs; exactly one of out and out_f32 is set (args.out_dtype), and each store of out
  // writes there the fp32 value it would round to BF16 (store_out2, the combine's stores)
  uint16_t* out;       // bf16 [b, s_q, h, 512]
  float* out_f32;      // fp32 [b, s_q, h, 512]
  float* lse;          // fp32 [b, h, s_q]; may be null
  float* partial_o;    // workspace
  float* partial_lse;  // workspace
  int64_t page_stride;  // bytes from a page to the next (kPageBytes: packed)
  // The two-term query (workspace): the low row and its scale; the reference kernel at every
  // shape, the sm90 kernels where q_len x heads <= 32. nullptr: the contract's one FP8 row.
  const uint8_t* q_lo;      // e4m3 [b, s_q, h, 512]
  const float* q_lo_scale;  // fp32 [b, s_q, h]
};

int default_num_parts(int sm_count, int row_tiles);

// min_part_cost: the least cost a part covers (1: split as finely as num_parts allows).
// free_parts: the parts whose CTAs start on SMs free at the attention kernel's launch
// (plan.cu, room for the Q-quant kernel; num_parts: all of them).
cudaError_t launch_plan(const int32_t* seqlens, const PlanShape& shape, int free_parts,
                        int min_part_cost, int32_t* plan, cudaStream_t stream);
cudaError_t launch_reference_decode(const DecodeParams& params, cudaStream_t stream);
// The tensor-core kernels (sm90/): FP8 wgmma QK and transposed PV, two warpgroups.
enum class Kernel : int32_t;
cudaError_t launch_sm90_decode(Kernel kernel, const DecodeParams& params, cudaStream_t stream);
cudaError_t launch_combine(const DecodeParams& params, cudaStream_t stream);

}  // namespace decode
}  // namespace snapmla
