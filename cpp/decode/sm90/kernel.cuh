// The sm90 decode kernel's schedule; the stages are in producer, softmax, pv and epilogue.cuh.
#pragma once

#include <cuda.h>

#include "common/launch.h"
#include "decode/sm90/epilogue.cuh"
#include "decode/sm90/producer.cuh"
#include "decode/sm90/pv.cuh"
#include "decode/sm90/softmax.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

template <class T>
__device__ __forceinline__ void release(SharedStorage& s, const Request& req,
                                        const ConsumerThread<T>& th, int i) {
  if (th.wtid == 0 && i + kStages < req.n)
    sm90::mbar_arrive(&s.empty_bar[(req.ring.it0 + i) % kStages]);
}

template <class T>
__device__ __forceinline__ void run_consumers(SharedStorage& s, const DecodeParams& p,
                                              RequestRange requests, int part, int tile,
                                              const ConsumerThread<T>& th) {
  const int rows_total = p.q_len * p.num_heads;
  const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
  uint32_t it = 0;  // blocks this CTA consumed: the ring's stage and phase
  uint32_t q_phase = 0;
  for (int b = requests.begin; b <= requests.end; ++b) {
    Segment seg;
    if (plan_segment(p, L, part, b, tile, &seg) != SegmentKind::kRun) continue;
    const int seqlen = p.seqlens[b];
    const Request req{
        b,   tile,       seqlen, seg.blk_hi - seg.blk_lo, p.causal ? seqlen - p.q_len + 1 : seqlen,
        seg, Ring{s, it}};
    const int n = req.n;
    const int64_t row0 = int64_t{b} * rows_total + tile * kRowsM;

    if constexpr (T::kInterleaved) {
      load_q_interleaved<T>(s, p, b, row0, rows_total, th.tid);
    } else if (th.tid < kRowsM) {
      griddep_wait();  // the Q-quant kernel's output
      const int fr = tile * kRowsM + th.tid;
      s.q_scale[th.tid] = fr < rows_total ? p.q_scale[int64_t{b} * rows_total + fr] : 0.f;
    }
    sm90::named_barrier_unaligned(kBarStart, kCtaThreads);
    if constexpr (!T::kInterleaved) sm90::mbar_wait(&s.q_bar, q_phase);
    q_phase ^= 1;

    float o[kMTiles][T::kNRegs];  // O^T of latent half wg
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int e = 0; e < T::kNRegs; ++e) o[m][e] = 0.f;
    }
    const sm90::SmemDesc q_desc =
        sm90::make_desc_base(s.q_content[0], sm90::Swizzle::k128B, kChunkBytes);
    const sm90::SmemDesc qr_desc =
        sm90::make_desc_base(s.q_rope, sm90::Swizzle::k128B, kChunkBytes);
    float z[32];          // S of the block in hand
    uint32_t words[2][4];  // the next PV's first V^T fragments, read ahead
    // The other warpgroup's block j: its QK waited for the stage; this warpgroup waits too.
    auto words_of_other = [&](int j) {
      sm90::mbar_wait(req.ring.full(j), req.ring.phase(j));
      vt_words(req, th, j, 0, words);
    };

    // Warpgroup w owns blocks w, w + 2, ... and runs every block's PV. A QK left in flight
    // across iterations makes ptxas serialize the wgmmas.
    for (int i = th.wg; i < n; i += 2) {
      issue_qk(req.ring, i, q_desc, qr_desc, z);
      softmax_block(s, p, req, th, i, z, [&] {
        if (i > 0) {
          words_of_other(i - 1);
        } else {
          vt_words(req, th, i, 0, words);  // its own stage: issue_qk waited for it
        }
      });
      if (i > 0) {  // the other warpgroup's block i - 1 (published before block i's softmax)
        pv(s, req, th, i - 1, o, words);
        vt_words(req, th, i, 0, words);  // here, not inside that PV: there they make ptxas spill
        release(s, req, th, i - 1);
      }
      pv(s, req, th, i, o, words);
      release(s, req, th, i);
    }
    if (n > 0 && ((n - 1) & 1) != th.wg) {  // the last block is the other warpgroup's
      sm90::named_barrier(kBarPready + ((n - 1) & 1), kThreads);
      words_of_other(n - 1);
      pv(s, req, th, n - 1, o, words);
    }
    sm90::named_barrier_unaligned(kBarConsumers, kThreads);  // every PV done, the last statistics

    // The combine still waits for this grid: its launch may overlap the last epilogue.
    if (b == requests.end) griddep_launch_dependents();
    epilogue(s, p, req, th, o);
    it += n;
    // Every consumer has read bad_page: reset it before the producer, past kBarCta, may set it.
    sm90::named_barrier_unaligned(kBarConsumers, kThreads);
    if (th.tid == 0) s.bad_page = 0;
    sm90::named_barrier_unaligned(kBarCta, kCtaThreads);
  }
}

// Part blockIdx.x of the plan, row tile blockIdx.y. Launched while the Q-quant kernel runs (PDL):
// every read of that kernel's output waits for it first.
template <class T>
__global__ void __launch_bounds__(kCtaThreads, 1)
    decode_kernel(const DecodeParams p, const __grid_constant__ TensorMaps maps) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // 1024-byte alignment (128B swizzle atoms) by pointer arithmetic, keeping the address space.
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(
      smem_raw + ((1024u - (sm90::smem_u32(smem_raw) & 1023u)) & 1023u));
  const int part = blockIdx.x, tile = blockIdx.y;
  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / kWgThreads, 0);
  const int warp = __shfl_sync(0xffffffffu, tid % kWgThreads / 32, 0);

  if (tid == kLoaderTid) {  // the descriptors' first use does not wait for them
    sm90::prefetch_tensormap(&maps.k_content);
    sm90::prefetch_tensormap(&maps.k_rope);
    sm90::prefetch_tensormap(&maps.k_scale);
    sm90::prefetch_tensormap(&maps.q_content);
    sm90::prefetch_tensormap(&maps.q_rope);
  }
  // The host sized the plan buffer for these parameters: these reads stay in bounds.
  const RequestRange requests = part_requests(p, PlanLayout::make(p.batch, p.num_parts), part);
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) sm90::mbar_init(&s.full_bar[i], kFullArrivals);
    for (int i = 0; i < kStages; ++i) sm90::mbar_init(&s.empty_bar[i], 2);
    s.bad_page = 0;
    sm90::mbar_init(&s.q_bar, T::kInterleaved ? kThreads : 1);  // cp.async of each consumer
    sm90::mbar_fence_init();
  }
  __syncthreads();
  if (!plan_matches(p)) return write_nan_rows(p, part, tile);

  // Per-thread constants come after setmaxnreg: live across it, they would spill.
  if (wg == kProducerWg) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    run_producer<T>(s, p, maps, requests, part, tile, tid);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    run_consumers<T>(s, p, requests, part, tile, ConsumerThread<T>(tid, wg, warp));
  }
  griddep_launch_dependents();
}

template <class T>
cudaError_t run(const DecodeParams& p, const TensorMaps& maps, cudaStream_t stream) {
  const cudaError_t err = cudaFuncSetAttribute(
      decode_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int{kSmemBytes});
  if (err != cudaSuccess) return err;
  return launch_dependent(decode_kernel<T>, dim3(p.num_parts, p.row_tiles), dim3(kCtaThreads),
                          kSmemBytes, stream, p, maps);
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
