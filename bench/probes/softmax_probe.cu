// What slows the N = 64 softmax beside the other warpgroup's work (session 38, issue 7).
//
// Session 38's timelines put one warpgroup's softmax of a block (QK done to P8 and statistics
// published) at ~2,200-2,290 cycles in the default seesaw kernel, where it runs beside the
// other warpgroup's PV, and at ~1,430 in a build where it overlapped little, every part of it
// 20-45% slower in the default. This probe runs the kernel's softmax code (steps.cuh's
// scaled_logits and exp_scaled, the row sums, the fast row math, P8 words and their stmatrix
// store, the statistics, the proxy fence and the warpgroup barrier) in warpgroup 0 of every
// CTA of a full grid, block after block on the same stage scales, while warpgroup 1 runs one
// kind of the other warpgroup's work until warpgroup 0 is done:
//
//   0 idle           nothing
//   1 ffma           the promotion's arithmetic alone: 128 FFMA a round into 128 registers
//   2 vt-frags       the V^T fragments alone: 8 ldmatrix.trans x4 and 32 byte permutes a round
//   3 wgmma-rs       the PV's 8 FP8 m64n64k32 with A in registers, one wait a round
//   4 pv-promoted    the kernel's PV of a block: 4 whole-N groups two deep, each promoted
//   5 softmax        a second softmax (both warpgroups at once)
//   6 qk-ss          a QK's 16 FP8 m64n64k32 with both operands in shared memory, one wait
//   7 ffma-paced     variant 1's 128 FFMA, then ~1,000 ns asleep (the kernel's promotions come
//                    in bursts: 2 x 128 a warp in a two-block period of ~3,200 ns)
//   8 qk-rs          variant 6's 16 wgmmas with A from registers (half of its shared-memory
//                    bytes; session 39: the kernel's QK so, SNAPMLA_SEESAW_BENCH_QK_RS, was 3-5%
//                    faster)
//   9 lds-stream     shared-memory loads alone: 32 rounds of 16 bytes a thread, 64 KB a pass
//                    (about a QK's operand bytes, no tensor work)
//  10 split-roles    warpgroup 0 runs a QK (16 SS wgmmas) and then the softmax of its S, block
//                    after block; warpgroup 1 the promoted PV of a block (variant 4), block after
//                    block: the two chains of a role split (one warpgroup QK and softmax, one PV
//                    and promotion), each one's cycles a block reported, co-running
//  11 split-ahead    variant 10 with warpgroup 0's next QK issued before its softmax (two S
//                    accumulators)
//
// Then three_role_kernel: 384 threads, warpgroup 0 as variant 11's warpgroup 0 and warpgroups 1
// and 2 each the promoted PV of a latent half, under a setmaxnreg split that fits the CTA.
//
// CTA 0's warpgroup 0 reports clock64 cycles per softmax block (the median of three launches),
// with the stage's token scales read from shared memory in both passes as the kernel does, and
// for variants 0 and 4-6 again with them held in registers (loaded once; the kernel could load
// them while it waits for its QK), and for 0, 4 and 6 with half or all of the exponentials by
// FMAs instead of MUFU.EX2 (exp2_poly: is it the MIO queue the softmax waits in?).
// Values are synthetic (only time counts); the softmax's data stay finite.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --expt-relaxed-constexpr \
//        -Icpp -Iinclude -Ibench bench/softmax_probe.cu -o softmax_probe && ./softmax_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "cuda_check.h"
#include "probe_pv.cuh"

using namespace snapmla;
using namespace snapmla::decode::seesaw;

#define CHECK(x) SNAPMLA_BENCH_CHECK(x, 1)

constexpr int kVariants = 12;
const char* const kNames[kVariants] = {"idle",        "ffma",    "vt-frags",     "wgmma-rs",
                                       "pv-promoted", "softmax", "qk-ss",        "ffma-paced",
                                       "qk-rs",       "lds-stream", "split-roles", "split-ahead"};

struct Smem {
  alignas(1024) uint8_t content[2][64 * 128];  // two content chunks, 128B swizzle (V^T source)
  alignas(1024) uint8_t p8[2][64 * 64];        // [rows][64 B], 64B swizzle, by block parity
  alignas(1024) uint8_t p8_other[64 * 64];     // warpgroup 1's (variant 5)
  float scale[64];
  float q_scale[64];
  float gamma[64];
  RowStats stats[2][2];  // [warpgroup][block parity]
  int done;
};

// One block's softmax of warpgroup wg, as the kernel's softmax_publish runs it for a block every
// row sees whole (N = 64, one term, fast row math), on S in sa (in place).
// 2^x by the FMA and integer pipes (no MUFU): x = i + f with i = round(x) (the 1.5 x 2^23 trick),
// f in [-0.5, 0.5], 2^f by its degree-5 Taylor polynomial (relative error ~2e-6), i into the
// exponent bits. For the probe's timing (x >= -126 here).
__device__ __forceinline__ float exp2_poly(float x) {
  x = fmaxf(x, -126.f);
  const float tr = x + 12582912.f;
  const float f = x - (tr - 12582912.f);
  const int i = __float_as_int(tr) - 0x4B400000;
  float p = 1.3333558e-3f;
  p = fmaf(p, f, 9.6181291e-3f);
  p = fmaf(p, f, 5.5504109e-2f);
  p = fmaf(p, f, 2.4022651e-1f);
  p = fmaf(p, f, 6.9314718e-1f);
  p = fmaf(p, f, 1.f);
  return __int_as_float(__float_as_int(p) + (i << 23));
}

// kPoly (with kScaleRegs): 0, every exponential by MUFU.EX2 (the kernel's); 1, the odd tokens'
// by exp2_poly; 2, all of them.
template <bool kScaleRegs = false, int kPoly = 0>
__device__ __forceinline__ void softmax_block(Smem& s, int wg, int it, float (&sa)[32],
                                              uint8_t* p8, int warp, int lane,
                                              const float2 (&k2)[8] = {}) {
  const int g = lane / 4, t = lane % 4, r0 = 16 * warp + g;
  constexpr float kScaleLog2 = 0.1041220f;  // 192^-0.5 log2(e)
  sm90::fence_regs(sa);
  float(&z)[32] = sa;
  float row_factor[2] = {s.q_scale[r0] * kScaleLog2, s.q_scale[r0 + 8] * kScaleLog2};
  float mx[2] = {-INFINITY, -INFINITY};
  const int limit[2] = {0, 0};
  if constexpr (kScaleRegs) {  // the stage's token scales from registers (loaded earlier)
#pragma unroll
    for (int nn = 0; nn < 8; ++nn) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        z[4 * nn + c] = sa[4 * nn + c] * (c & 1 ? k2[nn].y : k2[nn].x);
        mx[c / 2] = fmaxf(mx[c / 2], z[4 * nn + c]);
      }
    }
  } else {
    scaled_logits<4, true>(z, [&](int e) { return sa[e]; }, s.scale, t, 0, limit, mx);
  }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) mx[ri] = quad_max(mx[ri]) * row_factor[ri];
  const RowStats& prev = s.stats[wg][(it + 1) & 1];
  float m_prev[2], sig_prev[2], l_prev[2], m_use[2], m_new[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    m_prev[ri] = prev.m[r0 + 8 * ri];
    sig_prev[ri] = prev.sig[r0 + 8 * ri];
    l_prev[ri] = prev.l[r0 + 8 * ri];
    m_new[ri] = fmaxf(m_prev[ri], mx[ri]);
    m_use[ri] = m_new[ri] == -INFINITY ? 0.f : m_new[ri];
  }
  float e_sum[2] = {0.f, 0.f}, p_max[2] = {0.f, 0.f};
  const float bias[2] = {kExpShift - m_use[0], kExpShift - m_use[1]};
  if constexpr (kScaleRegs) {
#pragma unroll
    for (int nn = 0; nn < 8; ++nn) {
      const float ks[2] = {k2[nn].x * kExpUnshift, k2[nn].y * kExpUnshift};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int e = 4 * nn + c, ri = c / 2;
        const float arg = fmaf(z[e], row_factor[ri], bias[ri]);
        const float ex = kPoly == 2 || (kPoly == 1 && (c & 1)) ? exp2_poly(arg) : ex2_ftz(arg);
        e_sum[ri] += ex;
        z[e] = ex * ks[c & 1];
        p_max[ri] = fmaxf(p_max[ri], z[e]);
      }
    }
  } else {
    exp_scaled<4>(true, z, row_factor, bias, s.scale, t, e_sum, p_max);
  }
  float sig[2], inv_sig[2], gamma[2], l[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    e_sum[ri] = quad_sum(e_sum[ri] * kExpUnshift);
    p_max[ri] = quad_max(p_max[ri]);
    sig[ri] = fmaxf(p_max[ri] * (1.f / 448.f), kMinProbScale);
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(inv_sig[ri]) : "f"(sig[ri]));  // the kernel's
    gamma[ri] = ex2_ftz(m_prev[ri] - m_use[ri]) * (sig_prev[ri] * inv_sig[ri]);
    l[ri] = fmaf(l_prev[ri], gamma[ri], e_sum[ri] * inv_sig[ri]);
  }
  uint32_t w[2][4];
  p8_words<2>(z, inv_sig, w);
  store_p8<2>(sm90::smem_u32(p8) + p8_lane_offset(lane, warp), w);
  if (t == 0) {
    RowStats& cur = s.stats[wg][it & 1];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      cur.m[r0 + 8 * ri] = m_new[ri] - 1.f;  // (drifts down: the exponentials stay finite)
      cur.sig[r0 + 8 * ri] = sig[ri];
      cur.l[r0 + 8 * ri] = l[ri] * 1e-3f;
      cur.gamma[r0 + 8 * ri] = gamma[ri];
    }
  }
  sm90::fence_proxy_async();
  sm90::named_barrier(1 + wg, 128);
}

// Whether warpgroup 0 is done, the same answer in every warp of the calling warpgroup (its
// wgmmas must be issued by all four warps or none): an OR over its 128 threads on barrier bar.
__device__ __forceinline__ bool wg0_done(const Smem& s, int bar) {
  const uint32_t mine = *reinterpret_cast<const volatile int*>(&s.done) != 0;
  uint32_t any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, 128, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(mine), "r"(bar));
  return any != 0;
}

// The sum of a warpgroup's O^T (keeps its work).
__device__ __forceinline__ float sum_o(const float (&o)[4][32]) {
  float acc = 0.f;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int e = 0; e < 32; ++e) acc += o[m][e];
  }
  return acc;
}

// Synthetic operands, scales and statistics (only time counts; the softmax's data stay finite).
__device__ __forceinline__ void probe_init(Smem& s, int tid, int threads) {
  bench_probe::fill_e4m3(s.content, int(sizeof(s.content)), 13, tid, threads);
  bench_probe::fill_small_p8(s.p8, int(sizeof(s.p8)), tid, threads);
  if (tid < 64) {
    s.scale[tid] = 0.01f + 0.001f * (tid % 7);
    s.q_scale[tid] = 0.02f + 0.001f * (tid % 5);
    s.gamma[tid] = 0.999f;
    for (int w = 0; w < 2; ++w) {
      for (int b = 0; b < 2; ++b) {
        s.stats[w][b].m[tid] = 0.f;
        s.stats[w][b].sig[tid] = 1.f;
        s.stats[w][b].l[tid] = 1.f;
        s.stats[w][b].gamma[tid] = 1.f;
      }
    }
  }
  if (tid == 0) s.done = 0;
  sm90::fence_proxy_async();
}

// A QK of one block into acc (16 FP8 m64n64k32, both operands in shared memory), committed.
__device__ __forceinline__ void qk_block(Smem& s, float (&acc)[32]) {
  const sm90::SmemDesc k_desc = sm90::make_desc_base(s.content[0], sm90::Swizzle::k128B, 128);
  sm90::wgmma_fence();
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const uint64_t d = k_desc.at((k / 4 % 2) * 64 * 128 + 32 * (k % 4));
    if (k == 0) {
      sm90::wgmma_m64n64k32_e4m3_ss_init(acc, d, d);
    } else {
      sm90::wgmma_m64n64k32_e4m3_ss(acc, d, d, 1);
    }
  }
  sm90::wgmma_commit();
}

// reps blocks of QK and softmax by warpgroup 0, the next block's QK issued before each softmax
// (two accumulators; nothing in flight at the loop's head). Returns its S values' sum.
__device__ __forceinline__ float qk_softmax_ahead(Smem& s, int reps, float (&sa)[32], int warp,
                                                  int lane) {
  float sb[32];
  qk_block(s, sa);
  sm90::wgmma_wait<0>();
#pragma unroll 1
  for (int it = 0; it < reps; it += 2) {
    qk_block(s, sb);
    softmax_block(s, 0, it, sa, s.p8[0], warp, lane);
    sm90::wgmma_wait<0>();
    qk_block(s, sa);
    softmax_block(s, 0, it + 1, sb, s.p8[1], warp, lane);
    sm90::wgmma_wait<0>();
  }
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < 32; ++e) acc += sb[e];
  return acc;
}

template <int kVariant, bool kScaleRegs = false, int kPoly = 0>
__global__ void __launch_bounds__(256, 1) softmax_probe_kernel(int reps, float* sink,
                                                               long long* cycles) {
  extern __shared__ __align__(1024) uint8_t raw[];
  Smem& s = bench_probe::aligned_smem<Smem>(raw);
  const bench_probe::ProbeThread th = bench_probe::ProbeThread::here();
  const int tid = th.tid, wg = th.wg, warp = th.warp, lane = th.lane, t = th.t;
  probe_init(s, tid, 256);
  __syncthreads();

  float acc = 0.f;
  if (wg == 0) {
    float sa[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) sa[e] = 0.5f * float((tid * 32 + e) % 13) - 3.f;
    float2 k2[8];  // (kScaleRegs) this thread's token scales, loaded once
#pragma unroll
    for (int nn = 0; nn < 8; ++nn) k2[nn] = *reinterpret_cast<const float2*>(&s.scale[8 * nn + 2 * t]);
    const long long t0 = clock64();
    if constexpr (kVariant == 10) {
#pragma unroll 1
      for (int it = 0; it < reps; ++it) {
        qk_block(s, sa);
        sm90::wgmma_wait<0>();
        softmax_block(s, 0, it, sa, s.p8[it & 1], warp, lane);
      }
    } else if constexpr (kVariant == 11) {
      acc += qk_softmax_ahead(s, reps, sa, warp, lane);
    }
#pragma unroll 1
    for (int it = 0; it < (kVariant >= 10 ? 0 : reps); ++it) {
      if constexpr (kScaleRegs) {
#pragma unroll
        for (int nn = 0; nn < 8; ++nn) {
          asm volatile("" : "+f"(k2[nn].x), "+f"(k2[nn].y));  // (as if reloaded each block)
        }
      }
      softmax_block<kScaleRegs, kPoly>(s, 0, it, sa, s.p8[it & 1], warp, lane, k2);
    }
    const long long t1 = clock64();
    if (blockIdx.x == 0 && tid == 0) *cycles = t1 - t0;
    if (tid == 0) atomicExch(&s.done, 1);
#pragma unroll
    for (int e = 0; e < 32; ++e) acc += sa[e];
  } else if constexpr (kVariant != 0) {
    auto done = [&] { return wg0_done(s, 3); };
    const uint32_t ldsm_off[2] = {vt_lane_offset(lane, warp), vt_lane_offset(lane, warp + 4)};
    const uint32_t chunk_addr[2] = {sm90::smem_u32(s.content[0]), sm90::smem_u32(s.content[1])};
    auto frags = [&](int m, uint32_t (&a)[2][4]) {
      bench_probe::vt_mtile(chunk_addr, ldsm_off, m, a);
    };
    const sm90::SmemDesc p8_desc = sm90::make_desc_base(s.p8[0], sm90::Swizzle::k64B, 64);
    float o[4][32];
    bench_probe::zero_o(o);
    int it = 0;
    const long long t0 = clock64();
#pragma unroll 1
    while (!done()) {
      if constexpr (kVariant == 1 || kVariant == 7) {  // 128 FFMA: O = gamma O + T
        float tmp[32];
#pragma unroll
        for (int e = 0; e < 32; ++e) tmp[e] = 1e-3f * float(e);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          sm90::fence_regs(tmp);
#pragma unroll
          for (int col = 0; col < 8; ++col) {
            const float2 gm = *reinterpret_cast<const float2*>(&s.gamma[8 * col + 2 * t]);
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              o[m][4 * col + c] = fmaf(o[m][4 * col + c], c & 1 ? gm.y : gm.x, tmp[4 * col + c]);
            }
          }
        }
        if constexpr (kVariant == 7) __nanosleep(1000);
      } else if constexpr (kVariant == 2) {  // the fragments of 4 m-tiles
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          uint32_t a[2][4];
          frags(m, a);
          asm volatile("" ::"r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]),
                       "r"(a[1][1]), "r"(a[1][2]), "r"(a[1][3]));
        }
      } else if constexpr (kVariant == 3) {  // the 8 wgmmas, fragments loaded once
        uint32_t a[2][4];
        frags(it & 3, a);
        sm90::wgmma_fence();
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          sm90::wgmma_m64n64k32_e4m3_rs(o[m], a[0], p8_desc.at(0), 1);
          sm90::wgmma_m64n64k32_e4m3_rs(o[m], a[1], p8_desc.at(32), 1);
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
#pragma unroll
        for (int m = 0; m < 4; ++m) sm90::fence_regs(o[m]);
      } else if constexpr (kVariant == 4 || kVariant >= 10) {  // the promoted PV of a block
        bench_probe::pv_block_promoted(o, chunk_addr, ldsm_off, p8_desc, s.gamma, t);
      } else if constexpr (kVariant == 6) {  // a QK: 16 SS wgmmas over the two chunks
        const sm90::SmemDesc k_desc =
            sm90::make_desc_base(s.content[0], sm90::Swizzle::k128B, 128);
        sm90::wgmma_fence();
#pragma unroll
        for (int k = 0; k < 16; ++k) {
          const uint64_t d = k_desc.at((k / 4 % 2) * 64 * 128 + 32 * (k % 4));
          sm90::wgmma_m64n64k32_e4m3_ss(o[0], d, d, 1);
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        sm90::fence_regs(o[0]);
      } else if constexpr (kVariant == 8) {  // variant 6 with A from registers
        const sm90::SmemDesc k_desc =
            sm90::make_desc_base(s.content[0], sm90::Swizzle::k128B, 128);
        uint32_t a[2][4];
        frags(it & 3, a);
        sm90::wgmma_fence();
#pragma unroll
        for (int k = 0; k < 16; ++k) {
          const uint64_t d = k_desc.at((k / 4 % 2) * 64 * 128 + 32 * (k % 4));
          sm90::wgmma_m64n64k32_e4m3_rs(o[0], a[k & 1], d, 1);
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        sm90::fence_regs(o[0]);
      } else if constexpr (kVariant == 9) {  // 64 KB of shared-memory loads a pass
        const uint4* src = reinterpret_cast<const uint4*>(&s.content[0][0]);
        uint4 x = make_uint4(0, 0, 0, 0);
#pragma unroll 4
        for (int k = 0; k < 32; ++k) {
          const uint4 v = src[(k * 128 + (tid - 128)) % (int(sizeof(s.content)) / 16)];
          x.x ^= v.x;
          x.y += v.y;
          x.z ^= v.z;
          x.w += v.w;
        }
        acc += float(x.x ^ x.y ^ x.z ^ x.w) * 1e-30f;
      } else if constexpr (kVariant == 5) {  // a second softmax
        float sb[32];
#pragma unroll
        for (int e = 0; e < 32; ++e) sb[e] = 0.25f * float((tid * 32 + e) % 11) - 2.f;
        softmax_block(s, 1, it, sb, s.p8_other, warp, lane);
#pragma unroll
        for (int e = 0; e < 32; ++e) acc += sb[e];
      }
      ++it;
    }
    const long long t1 = clock64();
    if (blockIdx.x == 0 && tid == 128) cycles[1] = it > 0 ? (t1 - t0) / it : 0;
    acc += sum_o(o);
  }
  if (acc == 12345.678f) sink[tid] = acc;  // keeps the work
}

// Three roles in one CTA (session 39): warpgroup 0 runs the QK and softmax of every block (the
// next QK under the softmax), warpgroups 1 and 2 each the promoted PV of every block on a latent
// half, under setmaxnreg's split kSRegs / kPvRegs (the launch gives 384 threads 168 registers
// each, so kSRegs + 2 kPvRegs <= 504): the role split that would keep each warpgroup's chain to
// one of the two (bench/NOTES.md, session 39), at a register budget that fits the CTA. kHalfN:
// the PV in half-N groups (16 temporaries a group) instead of whole-N ones (32). Each warpgroup's
// cycles a block into cycles[wg] (CTA 0).
template <int kSRegs, int kPvRegs, bool kHalfN>
__global__ void __launch_bounds__(384, 1) three_role_kernel(int reps, float* sink,
                                                            long long* cycles) {
  static_assert(kSRegs + 2 * kPvRegs <= 3 * 168, "setmaxnreg's split of the launch's registers");
  extern __shared__ __align__(1024) uint8_t raw[];
  Smem& s = bench_probe::aligned_smem<Smem>(raw);
  const bench_probe::ProbeThread th = bench_probe::ProbeThread::here();
  const int tid = th.tid, wg = th.wg, warp = th.warp, lane = th.lane, t = th.t;
  probe_init(s, tid, 384);
  __syncthreads();
  float acc = 0.f;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kSRegs) : "memory");
    float sa[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) sa[e] = 0.5f * float((tid * 32 + e) % 13) - 3.f;
    const long long t0 = clock64();
    acc += qk_softmax_ahead(s, reps, sa, warp, lane);
    const long long t1 = clock64();
    if (blockIdx.x == 0 && tid == 0) cycles[0] = (t1 - t0) / reps;
    if (tid == 0) atomicExch(&s.done, 1);
#pragma unroll
    for (int e = 0; e < 32; ++e) acc += sa[e];
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kPvRegs) : "memory");
    auto done = [&] { return wg0_done(s, 2 + wg); };
    const uint32_t ldsm_off[2] = {vt_lane_offset(lane, warp), vt_lane_offset(lane, warp + 4)};
    const uint32_t chunk_addr[2] = {sm90::smem_u32(s.content[0]), sm90::smem_u32(s.content[1])};
    const sm90::SmemDesc p8_desc = sm90::make_desc_base(s.p8[0], sm90::Swizzle::k64B, 64);
    float o[4][32];
    bench_probe::zero_o(o);
    int it = 0;
    const long long t0 = clock64();
#pragma unroll 1
    while (!done()) {
      if constexpr (kHalfN) {
        bench_probe::pv_block_promoted_halfn(o, chunk_addr, ldsm_off, p8_desc, s.gamma, t);
      } else {
        bench_probe::pv_block_promoted(o, chunk_addr, ldsm_off, p8_desc, s.gamma, t);
      }
      ++it;
    }
    const long long t1 = clock64();
    if (blockIdx.x == 0 && tid % 128 == 0) cycles[wg] = it > 0 ? (t1 - t0) / it : 0;
    acc += sum_o(o);
  }
  if (acc == 12345.678f) sink[tid] = acc;  // keeps the work
}

template <int kSRegs, int kPvRegs, bool kHalfN>
void run_three(int reps, int sms, float* sink, long long* d_cycles) {
  const size_t smem = sizeof(Smem) + 1024;
  auto kernel = three_role_kernel<kSRegs, kPvRegs, kHalfN>;
  cudaFuncAttributes attr{};
  CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (attr.numRegs != 168) {  // setmaxnreg.inc would wait forever for registers never freed
    std::printf("three roles (%d / %d): the kernel launches with %d registers, not 168; skipped\n",
                kSRegs, kPvRegs, attr.numRegs);
    return;
  }
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  long long c[3][3];
  for (int k = 0; k < 3; ++k) {
    kernel<<<sms, 384, smem>>>(reps, sink, d_cycles);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    long long all[3];
    CHECK(cudaMemcpy(all, d_cycles, sizeof(all), cudaMemcpyDeviceToHost));
    for (int w = 0; w < 3; ++w) c[w][k] = all[w];
  }
  for (int w = 0; w < 3; ++w) std::sort(c[w], c[w] + 3);
  std::printf("three roles (%d / %d / %d registers, %s-N PV groups): QK and softmax %6.0f cycles a "
              "block; PV warpgroups %6.0f / %6.0f cycles a half-latent block (medians of 3)\n",
              kSRegs, kPvRegs, kPvRegs, kHalfN ? "half" : "whole", double(c[0][1]),
              double(c[1][1]), double(c[2][1]));
}

template <int kVariant, bool kScaleRegs = false, int kPoly = 0>
void run(int reps, int sms, float* sink, long long* d_cycles) {
  const size_t smem = sizeof(Smem) + 1024;
  CHECK(cudaFuncSetAttribute(softmax_probe_kernel<kVariant, kScaleRegs, kPoly>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  long long c[3], other[3];
  for (int k = 0; k < 3; ++k) {
    softmax_probe_kernel<kVariant, kScaleRegs, kPoly><<<sms, 256, smem>>>(reps, sink, d_cycles);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    long long both[2];
    CHECK(cudaMemcpy(both, d_cycles, sizeof(both), cudaMemcpyDeviceToHost));
    c[k] = both[0];
    other[k] = both[1];
  }
  std::sort(c, c + 3);
  std::sort(other, other + 3);
  if (kVariant >= 10) {  // both chains of the role split
    std::printf("%-12s warpgroup 0 (QK and softmax) %6.0f cycles a block; warpgroup 1 (promoted "
                "PV of a block) %6.0f cycles a block, co-running (medians of 3)\n",
                kNames[kVariant], double(c[1]) / reps, double(other[1]));
    return;
  }
  const char* const exps[3] = {"", ", half the exp2 by FMAs", ", every exp2 by FMAs"};
  std::printf("%-12s %s %6.0f cycles per softmax block (warpgroup 0, CTA 0; runs %.0f / %.0f / "
              "%.0f)%s\n",
              kNames[kVariant], kScaleRegs ? "scales in registers" : "scales from smem    ",
              double(c[1]) / reps, double(c[0]) / reps, double(c[1]) / reps, double(c[2]) / reps,
              exps[kPoly]);
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 2000;
  const bench_probe::ProbeHost h = bench_probe::ProbeHost::make(3);
  const int sms = h.sms;
  float* sink = h.sink;
  long long* d_cycles = h.cycles;
  std::printf("the N = 64 softmax of one block (64 rows x 64 tokens, warpgroup 0), %d blocks, "
              "%d CTAs, beside warpgroup 1's work\n", reps, sms);
  run<0>(reps, sms, sink, d_cycles);
  run<1>(reps, sms, sink, d_cycles);
  run<2>(reps, sms, sink, d_cycles);
  run<3>(reps, sms, sink, d_cycles);
  run<4>(reps, sms, sink, d_cycles);
  run<5>(reps, sms, sink, d_cycles);
  run<6>(reps, sms, sink, d_cycles);
  run<7>(reps, sms, sink, d_cycles);
  run<10>(reps, sms, sink, d_cycles);
  run<11>(reps, sms, sink, d_cycles);
  run_three<104, 200, true>(reps, sms, sink, d_cycles);   // ptxas: 8 B spilled
  run_three<104, 200, false>(reps, sms, sink, d_cycles);  // 188 B (the PV warpgroups')
  run_three<120, 192, true>(reps, sms, sink, d_cycles);   // 128 B
  run<8>(reps, sms, sink, d_cycles);
  run<9>(reps, sms, sink, d_cycles);
  run<8, true>(reps, sms, sink, d_cycles);
  run<9, true>(reps, sms, sink, d_cycles);
  run<0, true>(reps, sms, sink, d_cycles);
  run<4, true>(reps, sms, sink, d_cycles);
  run<5, true>(reps, sms, sink, d_cycles);
  run<6, true>(reps, sms, sink, d_cycles);
  run<0, true, 1>(reps, sms, sink, d_cycles);
  run<4, true, 1>(reps, sms, sink, d_cycles);
  run<6, true, 1>(reps, sms, sink, d_cycles);
  run<0, true, 2>(reps, sms, sink, d_cycles);
  run<4, true, 2>(reps, sms, sink, d_cycles);
  run<6, true, 2>(reps, sms, sink, d_cycles);
  return 0;
}
