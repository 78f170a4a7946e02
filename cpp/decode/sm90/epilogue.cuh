// The epilogue: each row's 1/l and lse, and O^T / l into out or a split partial.
#pragma once

#include "decode/sm90/context.cuh"
#include "decode/sm90/softmax.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

template <int kMTiles, int kNRegs>
__device__ __forceinline__ void store_o_rows(const DecodeParams& p,
                                             const float (&o)[kMTiles][kNRegs],
                                             const float* inv_l_of, int b, int tile, int rows_total,
                                             int d0, int t, const Segment& seg) {
  // Query row 8 nn + 2 t + c1: o[m][4 nn + c1], o[m][4 nn + 2 + c1] are latent d0 + 64 m, + 1.
  auto each_row = [&](auto&& store_row) {
#pragma unroll
    for (int nn = 0; nn < kNRegs / 4; ++nn) {
#pragma unroll
      for (int c1 = 0; c1 < 2; ++c1) {
        const int row = 8 * nn + 2 * t + c1, fr = tile * kRowsM + row;
        if (fr < rows_total) store_row(nn, c1, fr, inv_l_of[row]);
      }
    }
  };
  if (seg.split) {
    // The thread's 8 values of a row are the whole group partial_group(d0).
    const int64_t slot = seg.slot;
    const int group = partial_group(d0);
    each_row([&](int nn, int c1, int fr, float inv_l) {
      // max |O| times 1/l > 0 is max |O / l| exactly: rounding is monotonic.
      float amax = 0.f;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        amax = fmaxf(amax, fmaxf(fabsf(o[m][4 * nn + c1]), fabsf(o[m][4 * nn + 2 + c1])));
      }
      const int e = partial_exponent(amax * inv_l);
      uint8_t* rec = partial_record(p, slot, fr);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        store_partial_pair(rec, d0 + 64 * m, o[m][4 * nn + c1], o[m][4 * nn + 2 + c1], inv_l,
                           pow2i(e));
      }
      store_partial_exponent(rec, group, e);
    });
  } else {
    each_row([&](int nn, int c1, int fr, float inv_l) {
      const int64_t at = (int64_t{b} * rows_total + fr) * kContentDim + d0;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {  // BF16, or fp32 where asked (store_out2)
        store_out2(p, at + 64 * m, o[m][4 * nn + c1] * inv_l, o[m][4 * nn + 2 + c1] * inv_l);
      }
    });
  }
}

// 1/l goes to buffer (n + wg) % kPBuffers, which no block uses any more: n >= 1, so it is not
// the last block's (n - 1) % kPBuffers.
template <class T>
__device__ __forceinline__ void epilogue(SharedStorage& s, const DecodeParams& p,
                                         const Request& req, const ConsumerThread<T>& th,
                                         const float (&o)[kMTiles][T::kNRegs]) {
  const int rows_total = p.q_len * p.num_heads;
  const RowStats& fin = s.stats[(req.n - 1) % kPBuffers];
  RowStats& res_of = s.stats[(req.n + th.wg) % kPBuffers];
  const int fr = req.tile * kRowsM + th.wtid;
  if (th.wtid < T::kN && fr < rows_total) {
    const float sig = fin.sig[th.wtid] * kExpUnshift;  // the statistics carry 2^24 sigma
    const RowResult res =
        row_result(fin.l[th.wtid], fin.m[th.wtid], sig, s.bad_page != 0, req.seg.split);
    res_of.l[th.wtid] = res.inv_l;
    if (th.wg == 0) store_lse(p, req.b, fr, req.seg, res.lse);
  }
  sm90::named_barrier_unaligned(kBarWg + th.wg, kWgThreads);
  store_o_rows(p, o, res_of.l, req.b, req.tile, rows_total,
               kHalfDim * th.wg + 16 * th.warp + 2 * th.g, th.t, req.seg);
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
