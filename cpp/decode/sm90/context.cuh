// What the decode kernel's stages share: a consumer thread's coordinates, the request part.
#pragma once

#include "decode/segment.cuh"
#include "decode/sm90/fragments.cuh"
#include "decode/sm90/ptx.cuh"
#include "decode/sm90/traits.h"

namespace snapmla {
namespace decode {
namespace seesaw {

// Block i of a request is in stage (it0 + i) % kStages, it0 the blocks the CTA consumed before.
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

// S rows r0 and r0 + 8 (interleaved: r0). wg and warp come through a shuffle so the compiler
// knows them warp-uniform: branches on them then do not serialize the wgmma pipeline.
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

struct Request {
  int b, tile, seqlen, n;
  int min_limit;  // tokens every row of the tile sees: blocks below need no masking
  Segment seg;
  Ring ring;
  __device__ __forceinline__ int tok0(int i) const { return (seg.blk_lo + i) * kBlockN; }
  // Masked (kEdge), chosen outside the wgmma pipeline: a branch inside it would stall it.
  __device__ __forceinline__ bool is_edge(int i) const { return tok0(i) + kBlockN > min_limit; }
};

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
