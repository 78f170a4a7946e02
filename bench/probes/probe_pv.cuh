// Pieces the probes that run the N = 64 kernel's PV on resident shared memory share
// (bench/pv_rate.cu, bench/softmax_probe.cu): synthetic operands, the V^T fragments of an m-tile
// and the kernel's promoted PV of one block; and the probe kernels' common scaffolding (aligned
// shared memory, ProbeThread, ProbeHost), which bench/power_probe.cu uses too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"
#include "decode/seesaw/fragments.cuh"
#include "decode/seesaw/steps.cuh"
#include "decode/wgmma_ops.cuh"

namespace snapmla {
namespace bench_probe {

// A probe kernel's dynamic shared memory as T, aligned to 1024 bytes (the swizzle atoms).
template <typename T>
__device__ __forceinline__ T& aligned_smem(uint8_t* raw) {
  return *reinterpret_cast<T*>(raw + ((1024u - (sm90::smem_u32(raw) & 1023u)) & 1023u));
}

// A thread of a 256-thread probe CTA: its warpgroup and warp made warp-uniform by a shuffle
// (branches on them then do not serialize the wgmmas), lane and quad position t.
struct ProbeThread {
  int tid, wg, warp, lane, t;
  __device__ __forceinline__ static ProbeThread here() {
    const int tid = threadIdx.x;
    return {tid, __shfl_sync(0xffffffffu, tid / 128, 0),
            __shfl_sync(0xffffffffu, (tid % 128) / 32, 0), tid % 32, tid % 4};
  }
};

// O^T of a warpgroup's latent half (4 m-tiles of 32 registers), zeroed.
__device__ __forceinline__ void zero_o(float (&o)[4][32]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int e = 0; e < 32; ++e) o[m][e] = 0.f;
  }
}

// Finite E4M3 codes (no NaN) in n bytes (`shift` varies the pattern), thread tid of `threads`.
__device__ __forceinline__ void fill_e4m3(void* p, int n, unsigned shift, int tid, int threads) {
  for (int i = tid; i < n; i += threads) {
    static_cast<uint8_t*>(p)[i] = uint8_t((i * 2654435761u >> shift) & 0xbf);
  }
}
// Small P8 codes (below 1.0) in n bytes.
__device__ __forceinline__ void fill_small_p8(void* p, int n, int tid, int threads) {
  for (int i = tid; i < n; i += threads) static_cast<uint8_t*>(p)[i] = uint8_t((i * 40503u >> 7) & 0x3f);
}

// V^T A fragments of m-tile m (both k-steps) of a warpgroup's two content chunks
// ([64 tokens][128 B] each, 128B swizzle, `chunk_addr[c]` their shared addresses), as the
// kernel's PV builds them; ldsm_off = {vt_lane_offset(lane, warp), vt_lane_offset(lane, warp + 4)}.
__device__ __forceinline__ void vt_mtile(const uint32_t (&chunk_addr)[2],
                                         const uint32_t (&ldsm_off)[2], int m,
                                         uint32_t (&a)[2][4]) {
  const uint32_t chunk = chunk_addr[m / 2] + ldsm_off[m & 1];
  decode::seesaw::vt_fragment(chunk, a[0]);
  decode::seesaw::vt_fragment(chunk + 32 * 128, a[1]);
}

// The kernel's promoted PV of one block for one warpgroup: 4 whole-N groups (an m-tile's two
// m64n64k32 with A in registers) two in flight, each promoted as O^T m-tile = gamma O^T + T.
__device__ __forceinline__ void pv_block_promoted(float (&o)[4][32], const uint32_t (&chunk_addr)[2],
                                                  const uint32_t (&ldsm_off)[2],
                                                  const sm90::SmemDesc& p8_desc,
                                                  const float* gamma, int t) {
  float tmp[2][32];
  uint32_t a[2][2][4];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    vt_mtile(chunk_addr, ldsm_off, m, a[m % 2]);
    sm90::wgmma_fence();
    sm90::wgmma_m64n64k32_e4m3_rs_init(tmp[m % 2], a[m % 2][0], p8_desc.at(0));
    sm90::wgmma_m64n64k32_e4m3_rs(tmp[m % 2], a[m % 2][1], p8_desc.at(32), 1);
    sm90::wgmma_commit();
    if (m > 0) {
      sm90::wgmma_wait<1>();
      decode::seesaw::promote_cols(o[m - 1], 0, tmp[(m - 1) % 2], gamma, t);
    }
  }
  sm90::wgmma_wait<0>();
  decode::seesaw::promote_cols(o[3], 0, tmp[1], gamma, t);
}

// The same block as 8 half-N groups (an m-tile's two m64n32k32 over half of the query rows), two
// in flight, each promoted: the seesaw kernel's form before whole-N groups (16 temporary registers
// a group instead of 32).
__device__ __forceinline__ void pv_block_promoted_halfn(float (&o)[4][32],
                                                        const uint32_t (&chunk_addr)[2],
                                                        const uint32_t (&ldsm_off)[2],
                                                        const sm90::SmemDesc& p8_desc,
                                                        const float* gamma, int t) {
  float tmp[2][16];
  auto promote = [&](int q) {
    decode::seesaw::promote_cols(o[q / 2], 4 * (q % 2), tmp[q % 2], gamma, t);
  };
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    uint32_t a[2][4];
    vt_mtile(chunk_addr, ldsm_off, m, a);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = 2 * m + h;
      const uint32_t rows = h * 32 * 64;
      sm90::wgmma_fence();
      sm90::wgmma_m64n32k32_e4m3_rs_init(tmp[q % 2], a[0], p8_desc.at(rows));
      sm90::wgmma_m64n32k32_e4m3_rs(tmp[q % 2], a[1], p8_desc.at(rows + 32), 1);
      sm90::wgmma_commit();
      if (q > 0) {
        sm90::wgmma_wait<1>();
        promote(q - 1);
      }
    }
  }
  sm90::wgmma_wait<0>();
  promote(7);
}

// Host side: the device's SM count (one CTA each), a sink for the kernels' results and
// n_cycles clock counts.
struct ProbeHost {
  int sms = 0;
  float* sink = nullptr;
  long long* cycles = nullptr;
  static ProbeHost make(int n_cycles) {
    ProbeHost h;
    SNAPMLA_BENCH_CHECK(cudaDeviceGetAttribute(&h.sms, cudaDevAttrMultiProcessorCount, 0), 1);
    SNAPMLA_BENCH_CHECK(cudaMalloc(&h.sink, 256 * sizeof(float)), 1);
    SNAPMLA_BENCH_CHECK(cudaMalloc(&h.cycles, n_cycles * sizeof(long long)), 1);
    return h;
  }
};

}  // namespace bench_probe
}  // namespace snapmla
