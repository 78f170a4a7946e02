// Data movement: the TMA ring of KV pages, the Q tile, the producer warpgroup's loop.
#pragma once

#include "common/launch.h"
#include "decode/segment.cuh"
#include "decode/sm90/context.cuh"
#include "decode/sm90/fragments.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

// One part of a page into its stage: content half `half` (a warpgroup's refill), or, kRopeScale,
// the RoPE and the scales. A page outside the layer loads nothing, sets `bad_page` (its rows come
// out NaN) and still arrives. Evict-first: a page is read once; the split partials should stay in
// L2 for the combine.
template <bool kRopeScale>
__device__ __forceinline__ void load_page_part(SharedStorage::Stage& st, uint64_t* bar,
                                               const TensorMaps& maps, int half, int32_t page,
                                               int32_t num_pages, int32_t& bad_page) {
  if (!(page >= 0 && page < num_pages)) {
    bad_page = 1;
    return sm90::mbar_arrive(bar);
  }
  sm90::mbar_arrive_expect_tx(bar, kRopeScale ? kRopeScaleTx : kContentHalfTx);
  const uint64_t policy = sm90::l2_evict_first_policy();
  if constexpr (kRopeScale) {
    sm90::tma_load_3d_hint(st.rope, &maps.k_rope, bar, 0, 0, page, policy);
    sm90::tma_load_2d_hint(st.scale, &maps.k_scale, bar, 0, page, policy);
  } else {
#pragma unroll
    for (int c = 2 * half; c < 2 * half + 2; ++c) {
      sm90::tma_load_3d_hint(st.content[c], &maps.k_content, bar, c * kChunkBytes, 0, page, policy);
    }
  }
}

__device__ __forceinline__ void load_block(const Ring& ring, const TensorMaps& maps, int i,
                                           int32_t page, int32_t num_pages) {
  load_page_part<false>(ring.stage(i), ring.full(i), maps, 0, page, num_pages, ring.s.bad_page);
  load_page_part<false>(ring.stage(i), ring.full(i), maps, 1, page, num_pages, ring.s.bad_page);
  load_page_part<true>(ring.stage(i), ring.full(i), maps, 0, page, num_pages, ring.s.bad_page);
}

__device__ __forceinline__ void load_q_tile(SharedStorage& s, const TensorMaps& maps,
                                            int64_t row0) {
  sm90::mbar_arrive_expect_tx(&s.q_bar, kQTx);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    sm90::tma_load_2d(s.q_content[c], &maps.q_content, &s.q_bar, c * kChunkBytes,
                      static_cast<int32_t>(row0));
  }
  sm90::tma_load_2d(s.q_rope, &maps.q_rope, &s.q_bar, 0, static_cast<int32_t>(row0));
}

// Tile row 16 j + 8 h + e holds query row 8 j + e's high (h = 0) or low (h = 1) content, RoPE in
// high rows only, zero where absent; 128B-swizzled as TMA writes it. q_scale[r] = s1,
// q_scale[32 + r] = rho = s2 / s1 (the reference's IEEE division).
template <class T>
__device__ __forceinline__ void load_q_interleaved(SharedStorage& s, const DecodeParams& p, int b,
                                                   int64_t row0, int rows_total, int tid) {
  static_assert(T::kInterleaved, "the interleaved Q tile");
  griddep_wait();                                // the Q-quant kernel's output
  constexpr int kRowUnits = kChunks * 8 + 8;     // 16-byte units a tile row: content, RoPE
  constexpr int kUnits = 2 * T::kN * kRowUnits;  // tile rows 0 .. 2 kN - 1
  static_assert(kUnits % kThreads == 0, "whole rounds");
  constexpr int kRounds = kUnits / kThreads;
  // Through L2, not __ldg: the Q-quant kernel writes these during this grid's life. A unit not
  // loaded reads zero bytes of a valid address.
#pragma unroll 2
  for (int round = 0; round < kRounds; ++round) {
    const int u = tid + round * kThreads;
    const int R = u / kRowUnits, k = u % kRowUnits;
    const int r = 8 * (R / 16) + R % 8;
    const bool low = (R / 8) % 2 != 0, rope = k >= kChunks * 8;
    const int unit = k % 8;
    const uint32_t dst = sm90::smem_u32(rope ? s.q_rope : s.q_content[min(k / 8, kChunks - 1)]) +
                         sw128_offset(R, unit);
    const bool valid = r < rows_total && !(rope && low) && (!low || p.q_lo != nullptr);
    const uint8_t* src = !valid ? p.q_content
                         : rope ? reinterpret_cast<const uint8_t*>(p.q_rope) +
                                      (row0 + r) * (kRopeDim * 2) + 16 * unit
                                : (low ? p.q_lo : p.q_content) + (row0 + r) * kContentDim + 16 * k;
    sm90::cp_async_cg16(dst, src, valid ? 16u : 0u);
  }
  sm90::cp_async_mbar_arrive_noinc(&s.q_bar);  // the producer waits for the tile
  if (tid < 32) {
    const int64_t qi = int64_t{b} * rows_total + tid;
    const bool in = tid < rows_total;
    s.q_scale[tid] = in ? p.q_scale[qi] : 0.f;
    const bool lo = p.q_lo_scale != nullptr;
    s.q_scale[32 + tid] = in && lo ? __fdiv_rn(p.q_lo_scale[qi], p.q_scale[qi]) : 0.f;
  }
  sm90::cp_async_wait_all();
  sm90::fence_proxy_async();  // read by wgmma (async proxy) past the start barrier
}

// The loader thread issues a request's first page and Q tile, arrives on kBarStart, then fills the
// ring as the consumers release stages; the other producer threads only keep barrier counts.
template <class T>
__device__ __forceinline__ void run_producer(SharedStorage& s, const DecodeParams& p,
                                             const TensorMaps& maps, RequestRange requests,
                                             int part, int tile, int tid) {
  const int rows_total = p.q_len * p.num_heads;
  const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
  uint32_t empty_parity = 0;  // the wait parity per stage (bit i: stage i)
  uint32_t it = 0;            // blocks this CTA consumed: the ring's stage and phase
  uint32_t q_phase = 0;
  for (int b = requests.begin; b <= requests.end; ++b) {
    Segment seg;
    if (plan_segment(p, L, part, b, tile, &seg) != SegmentKind::kRun) continue;
    const int n = seg.blk_hi - seg.blk_lo;
    const int64_t row0 = int64_t{b} * rows_total + tile * kRowsM;
    const int32_t* pages = p.block_table + int64_t{b} * p.block_table_stride + seg.blk_lo;
    const Ring ring{s, it};
    if constexpr (T::kInterleaved) {
      if (tid != kLoaderTid) sm90::named_barrier_arrive_unaligned(kBarStart, kCtaThreads);
    }
    if (tid == kLoaderTid) {
      // Page 0 does not wait for the Q-quant kernel; the later pages wait for an interleaved tile.
      const int first_pages = min(kStages, n);
      load_block(ring, maps, 0, pages[0], p.num_pages);
      griddep_wait();  // the Q-quant kernel's output, or the consumers' loads of it
      if constexpr (!T::kInterleaved) load_q_tile(s, maps, row0);
      sm90::named_barrier_arrive_unaligned(kBarStart, kCtaThreads);
      if constexpr (T::kInterleaved) {
        sm90::mbar_wait(&s.q_bar, q_phase);
        q_phase ^= 1;
      }
      for (int i = 1; i < first_pages; ++i) load_block(ring, maps, i, pages[i], p.num_pages);
      for (int j = kStages; j < n; ++j) {
        const uint32_t st = (it + j) % kStages;
        sm90::mbar_wait_suspend(&s.empty_bar[st], (empty_parity >> st) & 1u, kProducerSuspendNs);
        empty_parity ^= 1u << st;
        load_block(ring, maps, j, pages[j], p.num_pages);
      }
    } else if constexpr (!T::kInterleaved) {
      sm90::named_barrier_arrive_unaligned(kBarStart, kCtaThreads);
    }
    it += n;
    sm90::named_barrier_unaligned(kBarCta, kCtaThreads);  // the consumers' end of the request
  }
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
