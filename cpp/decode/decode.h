// Decode: split-KV schedule (plan), the attention kernel and the combine.
//
// The schedule flattens the batch into a cost line: request b costs kFixedCost units (loading
// its queries, writing its rows) plus one unit per 64-token block. Part p of num_parts owns
// the cost range [p * T, (p + 1) * T), T = ceil(total / num_parts). A request whose blocks
// fall into several parts is split: each part writes a partial (O / l, lse) into the
// workspace and the combine merges them by log-sum-exp. Partial slot of (part p, request b):
// 2 * p + (p == first_part[b] ? 1 : 0): at most one request starts a split in a part (its
// last), and at most one continues one (its first), so slots never collide. Where every request
// fits in k parts of at most 9/8 T and batch x k parts fit, the plan pads the line instead
// (SNAPMLA_PLAN_ALIGN, plan.cu): request b starts at b k T_k, so it has k parts of its own. The
// kernels read the line only through prefix[], T, first_part[] and last_part[], padded or not.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "quantize/quantize_q.h"

namespace snapmla {
namespace decode {

constexpr int kBlockN = 64;                 // tokens per KV block (= one page)
constexpr int kTileRows = 64;               // query rows (s_q x heads, flattened) per CTA
// Schedule cost of a request beyond its blocks. SNAPMLA_FIXED_COST (experimental builds) sets
// another: a segment's own fixed costs (its Q tile ~3,400 cycles, its epilogue ~5,300) are about
// 2.7 blocks' worth at N = 64 (bench/NOTES.md, session 16).
#ifndef SNAPMLA_FIXED_COST
#define SNAPMLA_FIXED_COST 2
#endif
constexpr int kFixedCost = SNAPMLA_FIXED_COST;
// With the default split count, a part covers at least this much cost. A part's cost counts
// kFixedCost only where a request starts in it: at 2 (= kFixedCost) a request's blocks go two a
// part, at 1 one, at 3 three (one in the request's first part). Session 12's A/B in CUDA-graph
// replays of the whole decode call, next to FlashInfer in each run (bench/results/
// 2026-12-01-s12/decode-auto-af88375*.json), 3 -> 2: 1x128x1024 18.5 -> 16.6 us, 1x128x4096
// 20.8 -> 19.0, 1x16x8192 17.8 -> 17.5, the other 20 cases within 1% (1x128x8192 +1.0%);
// 1 (one block a part) gave 16.0 at 1x128x1024 but 21.1 at 1x128x4096 and 19.8 at 1x16x8192
// (the combine reads twice the partials). (Session 11's part-cost A/B, kernel + combine launched back to back,
// had chosen 3 over 4 and more, read then as one block a part.) SNAPMLA_MIN_PART_COST
// (experimental builds) sets another value.
#ifndef SNAPMLA_MIN_PART_COST
#define SNAPMLA_MIN_PART_COST kFixedCost
#endif
constexpr int kMinPartCost = SNAPMLA_MIN_PART_COST;
constexpr int32_t kPlanMagic = 0x4d4c4131;  // "1ALM"

// The plan's first words: what it was built for, and the schedule's part cost T.
struct PlanHeader {
  int32_t magic;  // kPlanMagic
  int32_t batch;
  int32_t num_parts;
  int32_t row_tiles;
  int32_t q_len;
  int32_t num_heads;
  int32_t max_pages;
  int32_t part_cost;  // T: part p owns the cost range [p T, (p + 1) T)
};

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

// SNAPMLA_SEESAW_FUSED_Q: the one-term seesaw kernel quantizes its own Q tile from the BF16
// query (DecodeParams::q_in, set by the launcher where seesaw_fuses_q says so and the rows are
// 16-byte-readable), so a decode call is two launches instead of three: each consumer warp runs
// the Q-quant kernel's own row code (common/row_quant.cuh: bit-identical by construction) on
// every eighth tile row and stores the row 128B-swizzled where the TMA would have put it. Every
// CTA of a request redoes its tile (up to 74 KB of BF16 from L2) while the producer fills the
// ring. 1 (the default): where s_q x heads <= 32 (PV widths N = 16 and 32), except at N = 32
// under SNAPMLA_SEESAW_SPREAD32 and at N = 16 under SNAPMLA_SEESAW_SPREAD16 (below), so that
// with both spread layouts on, as by default since session 23, no kernel fuses; 2: at every
// width;
// 0: nowhere. Same-run A/B on the H200 (2026-12-01, bench/results/2026-12-01-s12/, the whole
// decode call): N = 16 and 32 faster at every case measured (1x1x16x8192 24.7 -> 18.1 us,
// 64x2x16x4096 76.5 -> 73.9, 128x1x16x16384 367 -> 361, 32x1x32x32768 204 -> 202), N = 64
// slower where a request has several tiles (8x1x128x4096 45.2 -> 51.6 us, 32x1x128x16384
// 257 -> 282: each of a request's CTAs quantizes 64 rows) and 3-7% faster at batch 1.
#ifndef SNAPMLA_SEESAW_FUSED_Q
#define SNAPMLA_SEESAW_FUSED_Q 1
#endif
// SNAPMLA_SEESAW_SPREAD32 (1, the default since session 17; 0: the one-term layout): the
// one-term query at PV width 32 runs the two-term kernel's row layout with zero low rows
// (launch_seesaw_decode): tile row 16 j + e holds query row 8 j + e, so all four warps of a
// warpgroup run the softmax, one row a thread, where the one-term layout gives two rows a
// thread to warps 0 and 1 only. The logits are the same wgmma rows (fmaf(0, 0, hi) = hi), and
// so is everything after them: the outputs are bit-identical (bench/dump_decode.py). The
// two-term kernel reads the Q-quant kernel's output (no fused Q at N = 32 under it). Same-call
// A/B/A on the H200 (bench/results/2026-12-02-s17/spread32-aba-d1bc545.txt, whole call):
// 32x1x32x32768 196.9 -> 190.2 us, 64x2x16x16384 198.7 -> 192.4, 128x2x16x8192 193.5 ->
// 187.3; 8x1x32x4096 22.5 -> 23.0 (the Q-quant launch the fused Q saved).
#ifndef SNAPMLA_SEESAW_SPREAD32
#define SNAPMLA_SEESAW_SPREAD32 1
#endif
// SNAPMLA_SEESAW_SPREAD16 (1, the default since session 23; 0: the one-term N = 16 kernel):
// the same at PV width 16: the one-term query where s_q x heads <= 16 runs the two-term N = 16
// kernel with zero low rows (its producer warpgroup, one row a thread) on the Q-quant kernel's
// output, instead of the one-term N = 16 kernel with the fused Q (which no width uses then).
// Seen first in session 23's alternating trace pairs, where the two-term call was the faster
// one at N = 16 (8x16x4096 18.9 -> 17.6 us back to back). Graph replays of the whole call on
// the H200, A/B/A/B in one call (bench/results/2026-12-03-s23/decode-cases-*s16*): 1x1x16x8192
// 14.1 -> 12.3 us, 8x1x16x4096 19.2 -> 17.1, 64x1x16x4096 54.8 -> 53.0, 128x1x16xR32768 342.8
// -> 331.9, 128x1x16x16384 331.7 -> 328.2; slower at the longest, 64x1x16x65536 655-662 ->
// 672 (1.5-2.7%; the default's own run-to-run spread there is 655-673).
#ifndef SNAPMLA_SEESAW_SPREAD16
#define SNAPMLA_SEESAW_SPREAD16 1
#endif
// The seesaw kernel's PV width for s_q x heads query rows a request (launch_seesaw_decode).
constexpr int seesaw_pv_width(int64_t rows) { return rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }
// Whether the one-term seesaw kernel of PV width n (16, 32 or 64) quantizes its own Q tile.
constexpr bool seesaw_fuses_q(int n) {
  return !(SNAPMLA_SEESAW_SPREAD32 && n == 32) && !(SNAPMLA_SEESAW_SPREAD16 && n == 16) &&
         (SNAPMLA_SEESAW_FUSED_Q >= 2 || (SNAPMLA_SEESAW_FUSED_Q >= 1 && n <= 32));
}

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
#ifdef SNAPMLA_SEESAW_TRACE
  unsigned long long* trace;  // bench/seesaw_trace.cu: clock64 per (warpgroup, block, event)
  // and per CTA (x + num_parts y): globaltimer (ns) at entry and at the consumers' end, %smid
  unsigned long long* cta_trace;
#endif
  int64_t page_stride;  // bytes from a page to the next (kPageBytes: packed)
  // The two-term query (workspace): the low row and its scale; the reference kernel at every
  // shape, the seesaw kernel where q_len x heads <= 32. nullptr: the contract's one FP8 row.
  const uint8_t* q_lo;     // e4m3 [b, s_q, h, 512]
  const float* q_lo_scale;  // fp32 [b, s_q, h]
  // The BF16 query as the Q-quant kernel would take it. q_in.q non-null (the launcher, where
  // seesaw_fuses_q): the seesaw kernel quantizes its own tile, and q_content, q_rope and q_scale
  // above (and q_in's outputs) are not read.
  QuantizeQParams q_in;
};

int default_num_parts(int sm_count, int row_tiles);

// min_part_cost: the least cost a part covers (1: split as finely as num_parts allows).
// free_parts: the parts whose CTAs start on SMs free at the attention kernel's launch
// (SNAPMLA_PLAN_QQ_ROOM in plan.cu; num_parts: all of them).
cudaError_t launch_plan(const int32_t* seqlens, int batch, int q_len, int num_heads, int max_pages,
                        int num_parts, int free_parts, int min_part_cost, int32_t* plan,
                        cudaStream_t stream);
cudaError_t launch_reference_decode(const DecodeParams& params, cudaStream_t stream);
// The tensor-core kernels (sm90/): FP8 wgmma QK and transposed PV, two warpgroups.
enum class Kernel : int32_t;
cudaError_t launch_sm90_decode(Kernel kernel, const DecodeParams& params, cudaStream_t stream);
cudaError_t launch_combine(const DecodeParams& params, cudaStream_t stream);

}  // namespace decode
}  // namespace snapmla
