// What the stages of the sm90 decode kernel share: a consumer thread's place in the CTA, and
// the request-part it runs.
#pragma once

#include "decode/segment.cuh"
#include "decode/sm90/fragments.cuh"
#include "decode/sm90/ptx.cuh"
#include "decode/sm90/traits.h"

namespace snapmla {
namespace decode {
namespace seesaw {

// A request's view of the stage ring: its block i sits in stage (it0 + i) % kStages, it0 the
// blocks the CTA consumed before it.
struct Ring {
  SharedStorage& s;
  uint32_t it0;
  __device__ __forceinline__ SharedStorage::Stage& stage(int i) const {
    return s.stage[(it0 + i) % kStages];
  }
  __device__ __forceinline__ uint64_t* full(int i) const {
    return &s.full_bar[(it0 + i) % kStages];
  }
  __device__ __forceinline__ uint32_t phase(int i) const { return ((it0 + i) / kStages) & 1u; }
};

// A consumer thread: warpgroup wg (its latent half in PV, its blocks in QK), warp, and its
// fragment coordinates g = lane / 4, t = lane % 4. Its S rows are query rows r0 and r0 + 8
// (interleaved: r0 alone). Warp and warpgroup come through a shuffle so the compiler knows them
// warp-uniform (branches on them then do not serialize the wgmma pipeline).
template <class T>
struct ConsumerThread {
  int tid, wtid, lane, wg, warp, g, t;
  int r0;
  bool softmax_warp;     // a warp whose S rows reach PV
  uint32_t ldsm_off[2];  // ldmatrix row address in a content chunk (m-tiles of even, odd index)
  uint32_t stsm_off;     // stmatrix row address in a P8 tile

  __device__ __forceinline__ ConsumerThread(int tid_, int wg_, int warp_)
      : tid(tid_), wtid(tid_ % kWgThreads), lane(tid_ % 32), wg(wg_), warp(warp_) {
    g = lane / 4;
    t = lane % 4;
    r0 = T::kRowsPerWarp * warp + g;
    softmax_warp = T::kRowsPerWarp * warp < T::kN;
    ldsm_off[0] = vt_lane_offset(lane, warp);
    ldsm_off[1] = vt_lane_offset(lane, warp + 4);
    stsm_off = p8_lane_offset_rows(lane, T::kRowsPerWarp * warp);
  }
  __device__ __forceinline__ int row_of(int ri) const { return r0 + 8 * ri; }
};

// The blocks [seg.blk_lo, seg.blk_hi) of request b, row tile `tile`, as one CTA runs them.
struct Request {
  int b, tile, seqlen, n;
  int min_limit;  // tokens every row of the tile sees: blocks below need no masking
  Segment seg;
  Ring ring;
  __device__ __forceinline__ int tok0(int i) const { return (seg.blk_lo + i) * kBlockN; }
  // A block some row does not see whole: masked (kEdge variants, chosen outside the wgmma
  // pipeline: branching inside it would stall it).
  __device__ __forceinline__ bool is_edge(int i) const { return tok0(i) + kBlockN > min_limit; }
};

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
