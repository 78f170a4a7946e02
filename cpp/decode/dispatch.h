// The one rule that decides which attention kernel a decode call runs. Argument checks, the
// plan, the launch and the C query (snapmla_decode_select_kernel) all ask it.
#pragma once

#include <stdint.h>

#include "decode/decode.h"

namespace snapmla {
namespace decode {

// The caller's choice (snapmla_decode_kernel_t).
enum class KernelOption : int32_t { kAuto = 0, kReference = 1, kFast = 2 };

// The attention kernels. The sm90 variants are the tensor-core tier (sm90/kernel.cuh); the
// number is the PV width N, the query rows of a request a CTA carries through PV.
enum class Kernel : int32_t {
  kRefused,       // the option cannot run the config: FP8X2 past kTwoTermMaxRows without REFERENCE
  kReference,     // mma.sync, fp32 accumulation (reference_kernel.cu)
  kSm90N16,       // <= 16 rows a request, one query row a thread (both query forms)
  kSm90N32,       // <= 32 rows a request, likewise
  kSm90N64,       // one-term query, up to 64 rows a CTA, two rows a thread
  kSm90N64Scaled  // kSm90N64 with the PV promotion split in two (long chains of blocks)
};

// The two-term query's rows interleave with the high rows in one 64-row QK tile: a request's
// q_len x heads must fit in half of it.
constexpr int kTwoTermMaxRows = 32;
// Parts running about this many 64-token blocks or more take kSm90N64Scaled: its promotion
// reads no gamma after a wgmma wait, which pays from here on; shorter chains keep kSm90N64.
constexpr int64_t kScaledPvMinChain = 8;

struct KernelQuery {
  KernelOption option;
  int64_t rows_per_request;  // q_len x num_heads
  bool two_term;             // config.q_precision FP8X2
  int64_t chain_blocks;      // about how many blocks a part runs (0 where unknown)
};

// About how many blocks a part of the plan runs, from the launch's shape alone (no host
// synchronization): the balanced part cost of plan.cu as if every request had max_pages blocks.
constexpr int64_t typical_chain(int64_t batch, int64_t max_pages, int64_t num_parts) {
  const int64_t per_part = (batch * (max_pages + kFixedCost) + num_parts - 1) / num_parts;
  const int64_t cost = per_part > kMinPartCost ? per_part : kMinPartCost;
  return cost < max_pages ? cost : max_pages;
}

// The most query rows a request may have on a kernel: the PV width at N = 16 and 32 (one row
// tile a request); the others take any count, in row tiles of 64.
constexpr int64_t max_rows(Kernel k) {
  return k == Kernel::kSm90N16 ? 16 : k == Kernel::kSm90N32 ? 32 : INT64_MAX;
}

constexpr Kernel select_kernel(const KernelQuery& q) {
  if (q.option == KernelOption::kReference) return Kernel::kReference;
  if (q.two_term && q.rows_per_request > kTwoTermMaxRows) return Kernel::kRefused;
  if (q.rows_per_request <= max_rows(Kernel::kSm90N16)) return Kernel::kSm90N16;
  if (q.rows_per_request <= max_rows(Kernel::kSm90N32)) return Kernel::kSm90N32;
  return q.chain_blocks >= kScaledPvMinChain ? Kernel::kSm90N64Scaled : Kernel::kSm90N64;
}

constexpr bool is_sm90(Kernel k) { return k != Kernel::kRefused && k != Kernel::kReference; }

}  // namespace decode
}  // namespace snapmla
