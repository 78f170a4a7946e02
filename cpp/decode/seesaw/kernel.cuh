// The seesaw decode kernel (definition). Tile constants, the shared-memory plan and the
// schedule's outline are in config.h; instantiations/ compiles one variant per PV width.
#pragma once

#include <cuda.h>

#include <type_traits>

#include "common/launch.h"
#include "common/row_quant.cuh"
#include "decode/seesaw/config.h"
#include "decode/seesaw/fragments.cuh"
#include "decode/seesaw/steps.cuh"
#include "decode/segment.cuh"
#include "decode/sm90.cuh"
#include "decode/wgmma_ops.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {

using namespace sm90;


// O^T[64 latent x N rows] (+)= V^T[64 x 32 tokens] (registers) P8^T (shared memory).
// kInit: D = product (D write-only), else D += product.
template <int N, bool kInit>
__device__ __forceinline__ void wgmma_pv(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (N == 64) {
    kInit ? wgmma_m64n64k32_e4m3_rs_init(d, a, desc) : wgmma_m64n64k32_e4m3_rs(d, a, desc, 1);
  } else if constexpr (N == 32) {
    kInit ? wgmma_m64n32k32_e4m3_rs_init(d, a, desc) : wgmma_m64n32k32_e4m3_rs(d, a, desc, 1);
  } else if constexpr (N == 16) {
    kInit ? wgmma_m64n16k32_e4m3_rs_init(d, a, desc) : wgmma_m64n16k32_e4m3_rs(d, a, desc, 1);
  } else {
    kInit ? wgmma_m64n8k32_e4m3_rs_init(d, a, desc) : wgmma_m64n8k32_e4m3_rs(d, a, desc, 1);
  }
}

// SNAPMLA_SEESAW_FAST_ROWMATH (on; 0 for the IEEE form): the softmax's per-row statistics
// with one MUFU reciprocal and MUFU exponent instead of three IEEE divisions, an IEEE
// reciprocal and exp2f, shortening the dependent chain from the row's max and sum to P8 and
// the statistics (each within an ulp or two; the tensor-core tier's tolerance). Same-run A/B on
// the H200 (2026-12-01, bench/results/2026-12-01-s11/): kernel alone 7-17% faster at every
// shape measured (128x16x16384: 406 -> 337 us; 32x128x16384: 262 -> 241 us).
#ifndef SNAPMLA_SEESAW_FAST_ROWMATH
#define SNAPMLA_SEESAW_FAST_ROWMATH 1
#endif
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kInvFp8Max = 1.f / 448.f;

// 16 bytes to shared memory at a 32-bit shared address.
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Timeline of CTA (0, 0) for bench/seesaw_trace.cu: warp 0 of each consumer warpgroup records
// clock64 at the events below for its first kTraceBlocks blocks (the CTA's fixed costs, entry,
// Q arrived, epilogue start and done, at block 0 of its first request). Compiled out unless
// SNAPMLA_SEESAW_TRACE. SNAPMLA_SEESAW_TRACE_NO_EPILOGUE_STORES (timing builds only, wrong
// results): the epilogue computes but stores nothing, to time what its stores cost.
enum TraceEvent { kTrQkIssue, kTrQkReady, kTrQkDone, kTrStats, kTrExp, kTrP8, kTrPfree, kTrPublished,
                  kTrWgSynced, kTrEarlyDone, kTrPfreeArrived, kTrRefill, kTrPvStart, kTrPvEnd,
                  kTrEntry, kTrQArrived, kTrEpilogueStart, kTrEpilogueDone,
                  // the prologue: the plan checked; the first request's segment read; the
                  // loader's first pages and Q issued; the loader's first page id read, its
                  // wait for the Q-quant kernel returned, the Q's TMA issued (the loader thread
                  // stamps the last four, in warpgroup 0's row)
                  kTrPlanChecked, kTrSegment, kTrLoadsIssued, kTrPageRead, kTrQWaited,
                  kTrQIssued,
                  // the stages of the first request (warpgroup 0's row): the producer's loads of
                  // block j issued (from block kStages on, its stage just released), and block
                  // j's stage full (every block; an idle producer warp watching the barrier)
                  kTrLoadIssue, kTrLoadDone, kTrEvents };
#if defined(SNAPMLA_SEESAW_TRACE_NO_EPILOGUE_STORES) && !defined(SNAPMLA_SEESAW_TRACE)
#error "SNAPMLA_SEESAW_TRACE_NO_EPILOGUE_STORES is for timing builds (SNAPMLA_SEESAW_TRACE) only"
#endif
constexpr int kTraceBlocks = 64;
#ifdef SNAPMLA_SEESAW_TRACE
#define SEESAW_TRACE(block, event)                                                             \
  do {                                                                                         \
    if (blockIdx.x == 0 && blockIdx.y == 0 && wtid == 0 && wg < 2 && (block) < kTraceBlocks)   \
      p.trace[(wg * kTraceBlocks + (block)) * kTrEvents + (event)] = clock64();                \
  } while (0)
// The loader thread's prologue events (first request of CTA (0, 0), warpgroup 0's row).
#define SEESAW_LOADER_TRACE(first, event)                                 \
  do {                                                                    \
    if (blockIdx.x == 0 && blockIdx.y == 0 && (first)) p.trace[(event)] = clock64(); \
  } while (0)
// The producer's refill events of block j (first request of CTA (0, 0), warpgroup 0's row).
#define SEESAW_REFILL_TRACE(first, j, event)                                                  \
  do {                                                                                        \
    if (blockIdx.x == 0 && blockIdx.y == 0 && (first) && (j) < kTraceBlocks)                  \
      p.trace[(j) * kTrEvents + (event)] = clock64();                                         \
  } while (0)
#else
#define SEESAW_REFILL_TRACE(first, j, event) \
  do {                                       \
  } while (0)
#define SEESAW_TRACE(block, event) \
  do {                             \
  } while (0)
#define SEESAW_LOADER_TRACE(first, event) \
  do {                                    \
  } while (0)
#endif
// Every CTA's entry and end in globaltimer nanoseconds, and its SM (word 3 c + k of
// p.cta_trace: k = 0 entry, 1 the consumers' end, 2 %smid), for the spread of CTA starts and
// ends across the grid that CTA 0's clock64 timeline cannot show. Trace builds only.
#ifdef SNAPMLA_SEESAW_TRACE
#define SEESAW_CTA_TRACE(k)                                                             \
  do {                                                                                  \
    if (threadIdx.x == 0) {                                                             \
      unsigned long long v;                                                             \
      if ((k) == 2) {                                                                   \
        unsigned int sm;                                                                \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                                 \
        v = sm;                                                                         \
      } else {                                                                          \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));                           \
      }                                                                                 \
      p.cta_trace[3 * (blockIdx.x + int64_t{gridDim.x} * blockIdx.y) + (k)] = v;        \
    }                                                                                   \
  } while (0)
#else
#define SEESAW_CTA_TRACE(k) \
  do {                      \
  } while (0)
#endif

// SNAPMLA_SEESAW_PV_DEEP: the PV of a block issues every m-tile's whole-N wgmmas (each into
// its own temporary, with its own V^T fragments) before it waits for the first, then promotes
// them in order, instead of half-N groups two deep: the tensor cores get the whole block's PV at
// once (N = 32: 64 + 32 more registers, within the consumers' 240; N = 16: the early PV's, free
// by then). 1 (the default): at N = 32; 2: at N = 16 too; 0: nowhere. Same-run A/B on the H200
// (2026-12-01): N = 32 10% faster (128x16x16384 q_len 2: 422 -> 380 us; 32x32x32768: 217 ->
// 199 us; the two-term query at 16 heads: 399 -> 355 us), N = 16 3% slower (406 -> 418 us).
#ifndef SNAPMLA_SEESAW_PV_DEEP
#define SNAPMLA_SEESAW_PV_DEEP 1
#endif
template <int kN>
constexpr bool kPvDeep = (SNAPMLA_SEESAW_PV_DEEP >= 1 && kN == 32) ||
                         (SNAPMLA_SEESAW_PV_DEEP >= 2 && kN == 16);
// kPvDirect (a template argument; N = 64 only; experimental, SNAPMLA_SEESAW_PV_DIRECT in
// config.h): a block's PV accumulates into O^T itself (O^T = gamma O^T by the CUDA cores first,
// then every m-tile's wgmmas with scale-d 1), instead of into fp32 temporaries promoted one
// half-N group at a time. Every m-tile is in flight at once (the V^T fragments of all four: 32
// registers, against 32 of temporaries and 8 of fragments otherwise). Session 13 (H200, same
// call): 32x128x16384 kernel 234.9 -> 201.4 us. The price: the FP8 tensor cores' accumulation
// (13 bits, products cut toward zero: bench/qgmma_probe.cu) applies to O^T across a CTA's
// blocks, not within one block, and on attention with sinks and spikes (a large O^T early,
// small products after) that loses the later blocks' low bits: config.h has the figures.

// SNAPMLA_SEESAW_PRODUCER_SUSPEND (on since session 14; 0 = spin): the producer's wait for an
// empty stage as try_wait with this suspend-time hint in ns, so that its thread sleeps until the
// stage empties instead of re-trying: ncu at 32x128x16384 counted ~3.2M tries a launch, 7% of
// all instructions executed, on the scheduler that also issues two consumer warps. Same-call
// A/B on the H200, kernel alone (bench/results/2026-12-02-s14/seesaw-ab-ab94e80.log): 0.5-1.0%
// faster at all six shapes (32x128x16384 235.0 -> 233.8 us, 32x32x32768 191.7 -> 189.8).
#ifndef SNAPMLA_SEESAW_PRODUCER_SUSPEND
#define SNAPMLA_SEESAW_PRODUCER_SUSPEND 10000000
#endif
// SNAPMLA_SEESAW_PV_WHOLE (default 1 since session 16; 0 for the half-N groups everywhere):
// N = 64's promoted PV in whole-N groups in the blocks every row sees whole. bench/pv_rate.cu
// (session 15): a block's PV alone 745 cycles against 957 for the half-N groups (one warpgroup;
// 1,235 against 1,497 with two). Kernel alone (session 16, same call): 32x128x16384 233.8 ->
// 227.8 us, 64x128x4096 128.1 -> 124.7, 128x16x16384 q_len 4 452.1 -> 439.3.
#ifndef SNAPMLA_SEESAW_PV_WHOLE
#define SNAPMLA_SEESAW_PV_WHOLE 1
#endif
// wgmma.wait_group with a count the unrolled loop makes constant.
__device__ __forceinline__ void wgmma_wait_upto3(int n) {
  switch (n) {
    case 0: wgmma_wait<0>(); break;
    case 1: wgmma_wait<1>(); break;
    case 2: wgmma_wait<2>(); break;
    default: wgmma_wait<3>(); break;
  }
}

// kN: query rows the PV computes (16, 32 or 64); QK always computes 64 (one wgmma M tile) and
// the rows past kN are discarded.
#ifndef SNAPMLA_SEESAW_LOCAL_MAX
#define SNAPMLA_SEESAW_LOCAL_MAX 0
#endif
#ifndef SNAPMLA_SEESAW_REFILL32
#define SNAPMLA_SEESAW_REFILL32 0
#endif
#ifndef SNAPMLA_SEESAW_QK_ONE_ACC
#define SNAPMLA_SEESAW_QK_ONE_ACC 0
#endif
#ifndef SNAPMLA_SEESAW_EARLY32
#define SNAPMLA_SEESAW_EARLY32 0
#endif
constexpr int kEarlyTiles32 = SNAPMLA_SEESAW_EARLY32;

// SNAPMLA_SEESAW_PAGES_BEFORE_Q (1, the default since session 18; 4 = kStages for every first
// page before the Q): where a Q-quant kernel ran first (SNAPMLA_PDL=2's late wait), how many of
// a request's first pages the loader issues before it waits for that kernel and loads the Q
// tile. The pages before the Q overlap the Q-quant kernel; the Q behind all four first pages
// arrived with the last of them (timeline at 8x128x4096: Q at ~10,700 cycles after entry, the
// first QK just after; with 1: ~8,800). Same-call A/B/A on the H200 (graph replays, whole call,
// bench/results/2026-12-02-s18/decode-cases-*3737563*.json): 8x1x128x4096 34.9 -> 34.2 us,
// 64x1x128x1024 46.6 -> 45.8, 8x1x128x1024 20.9 -> 20.4, long contexts and 16 / 32 heads level.
#ifndef SNAPMLA_SEESAW_PAGES_BEFORE_Q
#define SNAPMLA_SEESAW_PAGES_BEFORE_Q 1
#endif
constexpr int kPagesBeforeQ = SNAPMLA_SEESAW_PAGES_BEFORE_Q;
// SNAPMLA_SEESAW_Q_FIRST (1, the default since session 35; bench/NOTES.md, sessions 34-35): in
// the two-term layout's kernels (PV widths 16 and 32, consumers loading the Q tile by cp.async),
// the loader issues the first pages after page 0 only once the Q tile has landed (each consumer
// thread's cp.async arrival on q_bar), so that the tile is not fetched under those pages' loads
// (session 34's timeline: the two-term tile's extra 8 KB a CTA arrived ~500 cycles later).
// Session 35 (compute-sanitizer memcheck, racecheck, synccheck clean; the whole GPU suite;
// outputs bit-identical to SNAPMLA_SEESAW_Q_FIRST=0 by bench/dump_decode.py; graph replays
// A/B/A, bench/results/2026-12-04-s35/call2): one term 8x1x16x4096 17.0 -> 16.4 us,
// 4x1x16x16384 22.2 -> 21.3, 16x1x16x4096 22.2 -> 21.9, 64x1x16x4096 52.8 -> 52.1,
// 32x1x32x32768 175.6 -> 172.9, 1x1x32x8192 14.2 -> 13.9, 1x1x16x8192 level (12.9); two terms
// 8x1x16x4096 17.6 -> 17.2, 16x1x16x4096 22.9 -> 22.3; long contexts within the runs' noise.
#ifndef SNAPMLA_SEESAW_Q_FIRST
#define SNAPMLA_SEESAW_Q_FIRST 1
#endif
// SNAPMLA_SEESAW_KV_EVICT_FIRST: steps.cuh.
// SNAPMLA_SEESAW_PREFETCH_MAPS (1, the default since session 19): the loader thread prefetches
// the five tensor maps at entry (prefetch.tensormap), under the plan reads, so that the first
// TMA of each does not wait for its descriptor. Timeline at 8x128x4096 (kernel alone, CTA (0,
// 0)): the first page's loads and the Q wait 1,620 -> 1,000 cycles, the first QK issued at
// 8,050 -> 7,570 cycles from entry (bench/results/2026-12-02-s19/seesaw-ab-prologue-89ba72d.log).
#ifndef SNAPMLA_SEESAW_PREFETCH_MAPS
#define SNAPMLA_SEESAW_PREFETCH_MAPS 1
#endif
// SNAPMLA_SEESAW_EARLY_START (1, the default since session 19; with the producer warpgroup):
// the loader arrives on the consumers' start barrier as soon as the Q's loads are issued,
// before the rest of the first pages' (the consumers waited for every first page's TMA issue:
// at 8x128x4096 ~2,200 cycles after the Q's). A page's bad_page write reaches the consumers
// through its full barrier, as the refills' do. Timeline at 8x128x4096 (kernel alone, CTA (0,
// 0)): the first QK issued 7,991 -> 7,352 cycles from entry; kernel + combine back to back 35.4
// -> 33.7 us (bench/results/2026-12-02-s19/seesaw-ab-combine-early-443a8fa.log).
#ifndef SNAPMLA_SEESAW_EARLY_START
#define SNAPMLA_SEESAW_EARLY_START 1
#endif
// SNAPMLA_SEESAW_PLAN_AHEAD (1, the default since session 19; with the producer warpgroup, N =
// 32 and 64): the part's request range is read at entry with the plan's header, not after the
// header's check (the host checked the plan buffer's size for these parameters, so the words
// are in bounds whatever they hold), and a request's plan words in one round trip
// (segment.cuh); two fewer dependent reads before the first TMA (the timeline's entry ->
// segment: 2,683 cycles at 8x128x4096). With the combine's
// groups sized by num_parts / batch, same-call A/B/A on the H200 (graph replays,
// bench/results/2026-12-02-s19/decode-cases-*e81e2c3*.json, *7faa78d-call6*): 8x1x128x4096
// 31.3 / 31.4 -> 30.6 us, 64x1x128x1024 41.6 / 41.5 -> 41.4, three other short cases level.
#ifndef SNAPMLA_SEESAW_PLAN_AHEAD
#define SNAPMLA_SEESAW_PLAN_AHEAD 1
#endif
// SNAPMLA_SEESAW_EARLY_TRIGGER (1, the default since session 22): the combine's launch from the
// start of each CTA's last epilogue (at its use, below, with the figures).
#ifndef SNAPMLA_SEESAW_EARLY_TRIGGER
#define SNAPMLA_SEESAW_EARLY_TRIGGER 1
#endif

// The producer warpgroup: a third warpgroup issues every load (its elected thread waits on
// per-stage "empty" barriers that each consumer warpgroup arrives on after its PV of a block),
// so no consumer warp stops to issue TMA; setmaxnreg gives the producer 24 registers and the
// consumers 240. On at N = 32 and 64, where it measured 5-14% faster in one A/B call
// (bench/results/2026-12-01/seesaw-ab-producer-c2675c6.log), and in the two-term kernel at
// N = 16 (session 20: 128x16x16384 kernel alone 366.2 -> 323.8 us; the two-term query's cost
// in the whole call 1.14x -> 1.00x, bench/results/2026-12-02-s20/); off in the one-term kernel
// at N = 16, where warp 3 refills during the softmax and the producer measured 2% slower (warp
// 3 refilling in the two-term one measured 1.08x). SNAPMLA_SEESAW_PRODUCER=0 or 1 forces it
// off or on everywhere (experiments; bench/NOTES.md).
#ifndef SNAPMLA_SEESAW_PRODUCER
#define SNAPMLA_SEESAW_PRODUCER -1
#endif
template <int kN, bool kTwoTerm = false>
constexpr bool kProducerAt =
    SNAPMLA_SEESAW_PRODUCER < 0 ? kN >= 32 || kTwoTerm : SNAPMLA_SEESAW_PRODUCER != 0;
template <int kN, bool kTwoTerm = false>
constexpr int kCtaThreadsAt = kThreads + (kProducerAt<kN, kTwoTerm> ? kWgThreads : 0);
constexpr int kBarConsumers = kBarWg + 2;               // the two consumer warpgroups
constexpr int kBarCta = kBarWg + 3;                     // all three, at a request's end
constexpr int kBarStart = kBarWg + 4;  // all three at a request's start (the producer arrives)
// setmaxnreg's split of the CTA's registers between the producer and the consumers. The launch
// gives each of the 384 threads kLaunchRegs (__launch_bounds__(384, 1): 65,536 / 384 rounded
// down to 8), and the consumers' setmaxnreg.inc takes only what the producer's .dec returned to
// the CTA's pool: producer x 128 + consumers x 256 may not pass kLaunchRegs x 384, or the
// consumers wait forever (32 / 240 hung every launch on the H200, session 15).
constexpr int kLaunchRegs = 65536 / (kThreads + kWgThreads) / 8 * 8;
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(kProducerRegs * kWgThreads + kConsumerRegs * kThreads <=
                  kLaunchRegs * (kThreads + kWgThreads),
              "the consumers' registers come from the producer's");

// kTwoTerm (config.q_precision FP8X2, s_q x heads <= 32; opt-in through kernel FAST, not yet
// validated on the GPU: bench/NOTES.md): the two-term query q ~ s1 q_hi + s2 q_lo. The QK tile's
// rows interleave by eights, tile row 16 j + g = the high row of query row 8 j + g and tile row
// 16 j + 8 + g its low row (zero RoPE), so that one 64-row QK computes both and thread (g, t)
// of warp w holds, register for register, the high and the low logits of query row 8 w + g:
// z = fmaf(rho, lo, hi) (rho = s2 / s1) in place, then the softmax runs on one row per thread
// (8 query rows a warp, so every warp below kN / 8 runs it). P8, the statistics, PV and the
// epilogue index query rows as in the one-term kernel.
// kScaledPv (a template argument; N = 64 one-term only; chosen by launch.cu at long chains,
// SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN in config.h): the whole-N PV groups' promotion in two
// steps, O^T *= gamma once a block, under the first m-tile's wgmmas (gamma read from shared
// memory there, live only there), then O^T += T for each m-tile's temporary T after its wait.
// The default's promotion (O^T = fmaf(O^T, gamma, T)) reads gamma after each wait: ncu at
// 32x1x128x16384 (session 31) had the PV's issue stalled on those loads' short scoreboard
// (32-45% of its samples). In the SASS, ptxas fuses the two steps back into one FFMA per
// element after each wait (gamma held in registers from the first group on), so the outputs are
// bit-identical to the unscaled kernel's (bench/dump_decode.py against a build without this
// kernel, session 36); what changed is where gamma is loaded. Graph replays on the H200, same
// call (session 32): 32x1x128x16384 221.3 / 222.2 -> 217.1 us, 64x1x128x4096 114.9 / 115.8 ->
// 112.5, 16x1x128x131072 834.7 / 828.7 -> 812.8, 64x1x64x32768 428.4 / 426.3 -> 422.1, but
// 1x1x128x8192 18.0 / 17.9 -> 18.4 and 1x1x128x1024 12.6 / 12.6 -> 13.0 (one or two blocks a
// part: the first block's softmax ~700 cycles later in that build's timeline, ~100 earlier in
// the next build's: code placement is the suspect). It spills 96 B against the default's 32
// (the main loop's allocation: the P8 store, its own O^T += T, the edge masks).
// SNAPMLA_SEESAW_BENCH_PV (timing builds only, wrong outputs; bench/NOTES.md, session 36): what
// the N = 64 PV's parts cost in the kernel, in the blocks every row sees whole. 1: the PV's
// wgmmas with both operands in shared memory (the content tile read as if it were V^T: no
// ldmatrix, no byte permutes, the shared-memory rate), 2: the promotion dropped (each T only
// waited for), 3: both; in the scaled kernel 4: its O^T *= gamma dropped, 8: its O^T += T,
// 16 (with 1: 17): two blocks' PV in one sweep with one promotion per m-tile (pv_pair_sweep).
#ifndef SNAPMLA_SEESAW_BENCH_PV
#define SNAPMLA_SEESAW_BENCH_PV 0
#endif
constexpr bool kBenchSsPv = (SNAPMLA_SEESAW_BENCH_PV & 1) != 0;
constexpr bool kBenchNoPromote = (SNAPMLA_SEESAW_BENCH_PV & 2) != 0;
constexpr bool kBenchNoScale = (SNAPMLA_SEESAW_BENCH_PV & 4) != 0;  // 4: O^T += T only
constexpr bool kBenchNoAdd = (SNAPMLA_SEESAW_BENCH_PV & 8) != 0;    // 8: O^T *= gamma only
constexpr bool kBenchPairSweep = (SNAPMLA_SEESAW_BENCH_PV & 16) != 0;  // 16: pair sweeps
// SNAPMLA_SEESAW_BENCH_NO_SOFTMAX (timing builds only, wrong outputs; session 39): the N = 64
// softmax's arithmetic dropped (no logits, maxima, exponentials, sums or row math; P8 the QK's
// S converted as it is, the statistics constants), its waits, barriers and stores kept: with
// SNAPMLA_SEESAW_BENCH_PV=2 or 3, the kernel's skeleton (ring, QK, PV wgmmas, handoffs) alone.
#ifndef SNAPMLA_SEESAW_BENCH_NO_SOFTMAX
#define SNAPMLA_SEESAW_BENCH_NO_SOFTMAX 0
#endif

template <int kN, bool kTwoTerm, bool kPvDirect, bool kScaledPv>
__global__ void __launch_bounds__(kCtaThreadsAt<kN, kTwoTerm>, 1)
    seesaw_decode_kernel(const DecodeParams p, const __grid_constant__ TensorMaps maps) {
  static_assert(kN == 16 || kN == 32 || kN == 64, "PV width: a wgmma N of 16, 32 or 64");
  static_assert(!kPvDirect || (kN == 64 && !kTwoTerm), "PV into O^T: N = 64, one-term only");
  static_assert(!kScaledPv || (kN == 64 && !kTwoTerm && !kPvDirect),
                "the scaled PV: N = 64's promoted PV, one-term only");
  static_assert(!kTwoTerm || kN <= 32, "the two-term query: 8 query rows a warp, 32 a tile");
  // Query rows of a warp's S accumulator and of a thread's (rows g and g + 8 of the fragment:
  // two query rows, or one query row's high and low logits).
  constexpr int kRowsPerWarp = kTwoTerm ? 8 : 16;
  constexpr int kRowsPerThread = kTwoTerm ? 1 : 2;
  // The two-term kernel at N = 32 also runs the one-term query (q_lo null: zero low rows) under
  // SNAPMLA_SEESAW_SPREAD32, and at N = 16 under SNAPMLA_SEESAW_SPREAD16 (decode.h,
  // launch_seesaw_decode).
  constexpr bool kSpread = kTwoTerm && ((kN == 32 && SNAPMLA_SEESAW_SPREAD32 != 0) ||
                                        (kN == 16 && SNAPMLA_SEESAW_SPREAD16 != 0));
  constexpr bool kProducer = kProducerAt<kN, kTwoTerm>;
  constexpr int kCtaThreads = kCtaThreadsAt<kN, kTwoTerm>;
  constexpr int kLoaderTid = kProducer ? kThreads : 0;  // the thread that issues the loads
  constexpr bool kEarlyStart = SNAPMLA_SEESAW_EARLY_START != 0;
  constexpr bool kQFirst = SNAPMLA_SEESAW_Q_FIRST != 0 && kTwoTerm && kProducer && kEarlyStart;
  constexpr int kNRegs = kN / 2;  // O^T accumulator registers per m-tile and thread
  constexpr int kPTiles = kPBuffers;  // the Pfree barriers count P8 tiles
  static_assert(kPTiles >= 2 && kPTiles % 2 == 0, "a P tile's blocks have one owner");
  constexpr int kNTiles = kN / 8;
  // PV m-tiles of the other warpgroup's block issued before the softmax (registers: whole-N
  // temporaries and their A fragments live across it); 0: every PV after the softmax.
  // None in the two-term kernels: 1 or 2 m-tiles at its N = 16 (SNAPMLA_SEESAW_TWO_TERM_EARLY,
  // session 17) gained at most 1-2% at long contexts and lost as much at short ones.
  constexpr int kEarlyMTiles = kTwoTerm    ? 0
                               : kN == 16  ? kMTiles
                               : kN == 32  ? kEarlyTiles32
                                           : 0;
  // With the whole early PV, a warp that runs no softmax (16 warp >= kN) issues the refills
  // while the softmax runs, off the path of the warpgroup's next wgmma: the content half of
  // block i - 1 (just read by the early PV) and, one iteration late, the content half and the
  // RoPE and scales of the own block i - 2. Otherwise warp 0 refills after each PV.
  // SNAPMLA_SEESAW_REFILL32 (experimental, off; bench/NOTES.md): at N = 32 too, warp 3 refills
  // the own block i - 2 during the softmax; block i - 1's content half (read by the PV after
  // the softmax) it refills after that PV.
  constexpr bool kRefillInSoftmax =
      !kProducer && !kTwoTerm &&  // two-term: every warp below kN / 8 runs the softmax
      (kEarlyMTiles == kMTiles || (kN == 32 && SNAPMLA_SEESAW_REFILL32 != 0));
  constexpr int kRefillWarp = kRefillInSoftmax ? 3 : 0;
  static_assert(!kRefillInSoftmax || kRowsPerWarp * kRefillWarp >= kN,
                "the refill warp runs no softmax");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // 1024-byte alignment (128B swizzle atoms) by pointer arithmetic, keeping the address space.
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(
      smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u));

  const int part = blockIdx.x, tile = blockIdx.y;
  // Warpgroup and warp indices through a shuffle: the compiler then knows them warp-uniform,
  // and branches on them do not serialize the wgmma pipeline (ptxas C7518).
  const int tid = threadIdx.x, wtid = tid % kWgThreads, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, tid / kWgThreads, 0);
  const int warp = __shfl_sync(0xffffffffu, wtid / 32, 0);
  SEESAW_TRACE(0, kTrEntry);  // (bench builds; under SNAPMLA_PDL it stamps before the wait)
  SEESAW_CTA_TRACE(0);
  SEESAW_CTA_TRACE(2);
  // SNAPMLA_PDL: the combine may launch (it waits for this grid); under 2 at the CTA's end.
  if constexpr (SNAPMLA_PDL < 2) griddep_launch_dependents();
  // SNAPMLA_PDL=2 (common/launch.h): where a Q-quant kernel ran before this one (the fused Q's
  // launch has none), wait only before reading its output (q_wait below), not at entry.
  const bool late_q_wait =
      SNAPMLA_PDL >= 2 && (kTwoTerm || !(seesaw_fuses_q(kN) && p.q_in.q != nullptr));
  auto q_wait = [&] {
    if (late_q_wait) griddep_wait();  // (a no-op after the first)
  };

  if constexpr (SNAPMLA_SEESAW_PREFETCH_MAPS != 0) {
    if (tid == kLoaderTid) {
      prefetch_tensormap(&maps.k_content);
      prefetch_tensormap(&maps.k_rope);
      prefetch_tensormap(&maps.k_scale);
      prefetch_tensormap(&maps.q_content);
      prefetch_tensormap(&maps.q_rope);
    }
  }
  // SNAPMLA_SEESAW_PLAN_AHEAD: the part's request range in flight with the header's words.
  // (With the producer only: at N = 16 ptxas then serialized the wgmmas, C7520.)
  constexpr bool kPlanAhead = SNAPMLA_SEESAW_PLAN_AHEAD != 0 && kProducer;
  RequestRange requests_ahead{};
  if constexpr (kPlanAhead) {
    requests_ahead = part_requests(p, PlanLayout::make(p.batch, p.num_parts), part);
  }
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(&s.full_bar[i], kFullArrivals);
    if constexpr (kProducer) {
      for (int i = 0; i < kStages; ++i) mbar_init(&s.empty_bar[i], 2);
      s.bad_page = 0;  // with a producer, the consumers reset it after each request's epilogue
    }
    mbar_init(&s.q_bar, kQFirst ? kThreads : 1);  // (kQFirst: every consumer's cp.async)
    mbar_fence_init();
  }
  if (!late_q_wait) griddep_wait();  // SNAPMLA_PDL: the Q-quant kernel's workspace and before
  __syncthreads();
  if (!plan_matches(p)) return write_nan_rows(p, part, tile);
  SEESAW_TRACE(0, kTrPlanChecked);
  // With a producer, the barriers at a request's edges are reached at different instructions
  // and after divergent branches (the producer's elected thread, the epilogue's per-row
  // stores): bar.sync (aligned) is undefined there (synccheck: divergent threads; racecheck: a
  // bad_page race), so they are barrier.sync / barrier.arrive, which count threads:
  //   kBarStart      the producer arrives after its first loads (SNAPMLA_SEESAW_EARLY_START:
  //                  the loader after the Q's), the consumers sync (q_scale);
  //   kBarConsumers  the consumers only: every PV done; after the epilogue, before the
  //                  bad_page reset (consumer thread 0);
  //   kBarCta        all three at the request's end: the ring, Q and P8 are free again.
  // The request loop, one copy per role (the producer's runs under setmaxnreg's 24 registers,
  // the consumers' under 240; without a producer only the consumers' exists). Each role
  // computes its per-thread constants after setmaxnreg: live across it, they would spill.
  auto run_requests = [&](auto producer_tag) {
    constexpr bool kIsProducer = decltype(producer_tag)::value;
    const int g = lane / 4, t = lane % 4;
    const int rows_total = p.q_len * p.num_heads;
    // The query rows of this thread's S rows: r0 = 16 warp + g and r0 + 8 (two-term: 8 warp + g).
    const int r0 = kRowsPerWarp * warp + g;
    auto row_of = [&](int ri) { return r0 + 8 * ri; };
    const bool softmax_warp = kRowsPerWarp * warp < kN;  // a warp whose S rows reach PV
    // ldmatrix row address within a content chunk for m-tiles of even and odd index (16-byte
    // latent unit warp, or warp + 4, of the chunk); stmatrix row address within a P8 tile.
    const uint32_t ldsm_off[2] = {vt_lane_offset(lane, warp), vt_lane_offset(lane, warp + 4)};
    const uint32_t stsm_off = p8_lane_offset_rows(lane, kRowsPerWarp * warp);
    auto p_tile = [&](int i) -> uint8_t* { return s.p8[i % kPBuffers]; };  // P8 of block i
    const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
    const RequestRange requests = kPlanAhead ? requests_ahead : part_requests(p, L, part);
    uint32_t empty_parity = 0;  // the producer's wait parity per stage (bit i: stage i)
    uint32_t it = 0;  // blocks this CTA consumed: the ring's stage and phase
    uint32_t q_phase = 0;
    // The fused Q (decode.h, seesaw_fuses_q): the launcher set q_in (one-term, 16-byte-readable
    // rows only). Not compiled into the widths that never fuse.
    constexpr bool kFusedQ = !kTwoTerm && seesaw_fuses_q(kN);
    const bool fused_q = kFusedQ && p.q_in.q != nullptr;
    // The Q tile of request b, by the consumer threads: consumer warp cw = 4 wg + warp quantizes
    // tile rows cw + 8 j, j < kN / 8 (every row a softmax reads), with the Q-quant kernel's row
    // code; a row past the request is zero with scale 0 (the TMA path gave it the next rows of
    // the workspace, with scale 0). Rows from kN up are never read (no softmax runs there, and
    // a QK row is independent of the others): not written.
    auto quantize_q_tile = [&](int b) {
      const QuantizeQParams& qi = p.q_in;
      const int cw = 4 * wg + warp;
      auto load = [&](int j) {  // tile row cw + 8 j's inputs (zero past the request)
        RowInputs in{};
        const int fr = tile * kRowsM + cw + 8 * j;
        if (j < kN / 8 && fr < rows_total) {
          const int qt = fr / p.num_heads, head = fr % p.num_heads;
          const uint16_t* content =
              qi.q + int64_t{b} * qi.stride_batch + qt * qi.stride_token + head * qi.stride_head;
          const uint16_t* rope = qi.q_pe == nullptr
                                     ? content + kContentDim
                                     : qi.q_pe + int64_t{b} * qi.pe_stride_batch +
                                           qt * qi.pe_stride_token + head * qi.pe_stride_head;
          // Through L2: under SNAPMLA_PDL the kernel that wrote q may still be running when
          // this one starts (it is the call's first kernel now), outside __ldg's rule.
          in = load_row<true, true>(content, rope, lane);
        }
        return in;
      };
      auto store = [&](int r, const QuantizedRow& q) {  // where the TMA puts row r
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // content bytes [256 h + 8 lane, + 8)
          const int byte = 256 * h + 8 * lane, c = byte / kChunkBytes;
          *reinterpret_cast<uint2*>(s.q_content[c] + sw128_offset(r, (byte % kChunkBytes) / 16) +
                                    byte % 16) = q.content[h];
        }
        // RoPE bytes [4 lane, + 4): in 16-byte chunk lane / 4
        *reinterpret_cast<uint32_t*>(s.q_rope + sw128_offset(r, lane / 4) + 4 * (lane % 4)) =
            q.rope;
        if (lane == 0) s.q_scale[r] = q.scale;
      };
      // One row at a time, the next rows' loads in flight: two at N = 32 and 64 (registers are
      // free here, O and S are not live yet), one at N = 16 (with two, ptxas serialized the
      // kernel's wgmmas, C7520). (All 8 rows a warp quantizes in flight at N = 64, where only
      // SNAPMLA_SEESAW_FUSED_Q=2 fuses: the kernel 9-19 us slower, session 14.)
      constexpr int kAhead = kN == 16 ? 1 : 2;
      static_assert(kAhead >= 1 && kAhead <= kN / 8, "rows a warp quantizes, in flight");
      RowInputs ahead[kAhead];
#pragma unroll
      for (int a = 0; a < kAhead; ++a) ahead[a] = load(a);
#pragma unroll 1
      for (int j = 0; j < kN / 8; ++j) {
        const RowInputs cur = ahead[0];
#pragma unroll
        for (int a = 0; a + 1 < kAhead; ++a) ahead[a] = ahead[a + 1];
        ahead[kAhead - 1] = load(j + kAhead);
        const bool live = tile * kRowsM + cw + 8 * j < rows_total;  // warp-uniform
        store(cw + 8 * j, live ? quantize_loaded(cur) : QuantizedRow{});
      }
      fence_proxy_async();  // read by wgmma (async proxy) past the start barrier
    };

    for (int b = requests.begin; b <= requests.end; ++b) {
      Segment seg;
      if (plan_segment(p, L, part, b, tile, &seg) != SegmentKind::kRun) continue;
      if (b == requests.begin) SEESAW_TRACE(0, kTrSegment);
      const int seqlen = p.seqlens[b];
      const int n = seg.blk_hi - seg.blk_lo;
      const int64_t row0 = int64_t{b} * rows_total + tile * kRowsM;
      const int32_t* pages = p.block_table + int64_t{b} * p.block_table_stride + seg.blk_lo;
      // Tokens every row of the tile sees: blocks below this need no masking or V sanitizing.
      const int min_limit = p.causal ? seqlen - p.q_len + 1 : seqlen;
      const uint32_t it0 = it;
      auto stage_of = [&](int i) -> SharedStorage::Stage& { return s.stage[(it0 + i) % kStages]; };
      auto full_of = [&](int i) { return &s.full_bar[(it0 + i) % kStages]; };
      auto phase_of = [&](int i) { return ((it0 + i) / kStages) & 1u; };
      auto page_ok = [&](int32_t page) { return page >= 0 && page < p.num_pages; };
      // V^T A fragments (both k-steps) of the 64 latent of block i's content chunk `chunk` that
      // start at its 16-byte unit 4 `half`: warp v takes units v (+ 4), M-rows 16 v .. 16 v + 15.
      // Past-context tokens and NaN codes are zeroed in blocks some row does not see whole (a NaN
      // there must not reach rows whose P8 is 0); elsewhere a NaN in V reaches every row through
      // its logit anyway. The consumers' m-tile m of their half is chunk 2 wg + m / 2, half m % 2
      // (v_fragments); the SS PV's producer rewrites every chunk with the same fragments.
      auto vt_chunk_fragments = [&](int i, int chunk, int half, auto edge_tag,
                                    uint32_t (&a)[2][4]) {
        const uint32_t addr = smem_u32(stage_of(i).content[chunk]) + ldsm_off[half];
        constexpr bool kEdge = decltype(edge_tag)::value;
        const int valid = kEdge ? min(max(seqlen - (seg.blk_lo + i) * kBlockN, 0), kBlockN) : 0;
        vt_fragments_masked<kEdge>(addr, t, valid, a);
      };
      // A block some row does not see whole (kEdge variants: branching inside would stall the
      // wgmma pipeline, so callers pick the variant).
      auto is_edge = [&](int i) { return (seg.blk_lo + i + 1) * kBlockN > min_limit; };

      // ---- loads. A page outside the layer loads nothing (the phase still turns); its rows
      // come out NaN.
      // The caller reads the page id (page_of below for the refills).
      auto load_content_half = [&](int i, int half, int32_t page) {
        seesaw::load_content_half(stage_of(i), full_of(i), maps, half, page, p.num_pages, s.bad_page);
      };
      auto load_rope_scale = [&](int i, int32_t page) {
        seesaw::load_rope_scale(stage_of(i), full_of(i), maps, page, p.num_pages, s.bad_page);
      };
      // With a producer only its copy of the request loop compiles the loader: the consumers'
      // copy never runs it (as 74a7c2c's q_scale store; 400-600 instructions less, session 29).
      constexpr bool kLoaderHere = !kProducer || kIsProducer;
      if constexpr (kQFirst && kIsProducer) {  // the producer's other threads, before the
        // loader's block (its warp reconverges after it, past the loader's wait for the Q)
        if (tid != kLoaderTid) named_barrier_arrive_unaligned(kBarStart, kCtaThreads);
      }
      if (kLoaderHere && tid == kLoaderTid) {
        if constexpr (!kProducer) s.bad_page = 0;  // the loads below and the refills set it
        auto load_q = [&] {
          if (!kTwoTerm && !fused_q) {  // the two-term or fused query's tile: the consumers below
            q_wait();
            SEESAW_LOADER_TRACE(b == requests.begin, kTrQWaited);
            load_q_tile(s, maps, row0);
            SEESAW_LOADER_TRACE(b == requests.begin, kTrQIssued);
          } else if constexpr (kPagesBeforeQ < kStages) {
            q_wait();  // the later pages wait for the Q-quant kernel as the consumers' Q does
          }
          if constexpr (kIsProducer && kEarlyStart) {  // the consumers may start (see kBarStart)
            named_barrier_arrive_unaligned(kBarStart, kCtaThreads);
          }
          if constexpr (kQFirst && kIsProducer) {  // the later pages after the Q tile
            mbar_wait(&s.q_bar, q_phase);
            q_phase ^= 1;
          }
        };
        // The Q's place among the first pages: pages issued before it do not wait for the
        // Q-quant kernel, pages after it arrive after it (without a Q-quant kernel: first).
        const int first_pages = min(kStages, n);
        const int q_at = late_q_wait ? min(kPagesBeforeQ, first_pages) : 0;
        for (int i = 0; i < first_pages; ++i) {
          if (i == q_at) load_q();
          const int32_t page = pages[i];
          if (i == 0 && page_ok(page)) SEESAW_LOADER_TRACE(b == requests.begin, kTrPageRead);
          load_content_half(i, 0, page);
          load_content_half(i, 1, page);
          load_rope_scale(i, page);
        }
        if (q_at == first_pages) load_q();
        SEESAW_LOADER_TRACE(b == requests.begin, kTrLoadsIssued);
      }
      if constexpr (kTwoTerm) {
        // The Q tile by the consumers' own loads (one-thread TMA of 8-row boxes made ptxas
        // serialize every wgmma, C7520, and spill more): tile row R = 16 j + 8 h + e holds
        // query row 8 j + e, its high (h = 0) or low (h = 1) content row, RoPE in high rows
        // only, zero past the request; 128B-swizzled as TMA writes it. One tile a request.
        if (tid < kThreads) {
          q_wait();
          if (b == requests.begin) SEESAW_TRACE(0, kTrQWaited);  // (trace builds)
          constexpr int kRowUnits = kChunks * 8 + 8;  // 16-byte units a tile row: content, RoPE
          constexpr int kUnits = 2 * kN * kRowUnits;  // tile rows 0 .. 2 kN - 1
          static_assert(kUnits % kThreads == 0, "whole rounds");
          const int64_t q0 = row0;  // tile 0: the request's first query row
          constexpr int kRounds = kUnits / kThreads;
          // Unit u of the tile: its shared address, its source (an always-readable address
          // where the row is not loaded) and whether it is loaded (else zero).
          auto unit_of = [&](int u, uint32_t& dst, const uint8_t*& src) -> bool {
            const int R = u / kRowUnits, k = u % kRowUnits;
            const int r = 8 * (R / 16) + R % 8;
            const bool low = (R / 8) % 2 != 0, rope = k >= kChunks * 8;
            const int unit = k % 8;
            dst = smem_u32(rope ? s.q_rope : s.q_content[min(k / 8, kChunks - 1)]) +
                  sw128_offset(R, unit);
            // (kSpread: the one-term query when q_lo is null: zero low rows)
            const bool valid = r < rows_total && !(rope && low) &&
                               (!kSpread || !low || p.q_lo != nullptr);
            src = !valid ? p.q_content
                  : rope ? reinterpret_cast<const uint8_t*>(p.q_rope) +
                               (q0 + r) * (kRopeDim * 2) + 16 * unit
                         : (low ? p.q_lo : p.q_content) + (q0 + r) * kContentDim + 16 * k;
            return valid;
          };
          // Every copy in flight at once (through L2, not the read-only path: under SNAPMLA_PDL
          // the Q-quant kernel writes these during this grid's life, before griddep_wait,
          // outside __ldg's rule); waited for below, after the scales' loads. (Loads into
          // registers in batches, 5 round trips at N = 32, cost 3-13% of the whole call:
          // bench/results/2026-12-02-s18/.)
#pragma unroll 2
          for (int round = 0; round < kRounds; ++round) {
            uint32_t dst;
            const uint8_t* src;
            const bool valid = unit_of(tid + round * kThreads, dst, src);
            cp_async_cg16(dst, src, valid ? 16u : 0u);
          }
          if constexpr (kQFirst) cp_async_mbar_arrive_noinc(&s.q_bar);  // the loader waits
        }
        // q_scale[r] = s1, q_scale[32 + r] = rho = s2 / s1 (the reference's IEEE division)
        if (tid < 32) {
          const int64_t qi = int64_t{b} * rows_total + tid;
          const bool in = tid < rows_total;
          s.q_scale[tid] = in ? p.q_scale[qi] : 0.f;
          const bool lo = !kSpread || p.q_lo_scale != nullptr;
          s.q_scale[32 + tid] = in && lo ? __fdiv_rn(p.q_lo_scale[qi], p.q_scale[qi]) : 0.f;
        }
        if (tid < kThreads) {
          cp_async_wait_all();
          fence_proxy_async();  // read by wgmma (async proxy) past the start barrier
        }
      } else if (fused_q) {
        if constexpr (kFusedQ && !kIsProducer) {  // (not in the producer's 24 registers)
          if (tid < kThreads) quantize_q_tile(b);
        }
      } else if (!kIsProducer && tid < kRowsM) {
        // (Not compiled into the producer's copy, whose threads are past kRowsM: there it
        // made ptxas hold the shared base in an ordinary register across the role split and
        // build every QK descriptor of the consumers there, ~8 instructions a wgmma and 480
        // R2UR in all; session 28, bench/NOTES.md.)
        q_wait();
        const int fr = tile * kRowsM + tid;
        s.q_scale[tid] = fr < rows_total ? p.q_scale[int64_t{b} * rows_total + fr] : 0.f;
      }
      if constexpr (kIsProducer) {  // ---- block j goes into the stage block j - kStages left
        // The first loads issued (their bad_page writes): the consumers' start barrier, one way
        // (under SNAPMLA_SEESAW_EARLY_START the loader arrived once the Q's loads were issued).
        if (!kQFirst && !(kEarlyStart && tid == kLoaderTid)) {
          named_barrier_arrive_unaligned(kBarStart, kCtaThreads);
        }
        auto wait_empty = [&](uint32_t st) {
          if constexpr (SNAPMLA_SEESAW_PRODUCER_SUSPEND > 0) {
            mbar_wait_suspend(&s.empty_bar[st], (empty_parity >> st) & 1u,
                              SNAPMLA_SEESAW_PRODUCER_SUSPEND);
          } else {
            mbar_wait(&s.empty_bar[st], (empty_parity >> st) & 1u);
          }
          empty_parity ^= 1u << st;
        };
        if (wtid == 0) {
          for (int j = kStages; j < n; ++j) {
            wait_empty((it0 + j) % kStages);
            const int32_t page = pages[j];
            load_content_half(j, 0, page);
            load_content_half(j, 1, page);
            load_rope_scale(j, page);
            SEESAW_REFILL_TRACE(b == requests.begin, j, kTrLoadIssue);
          }
        }
#ifdef SNAPMLA_SEESAW_TRACE
        // (trace builds) warp 1 of the producer, idle otherwise, stamps when each stage of the
        // first request fills, every block in order (a parity names the current or the previous
        // phase, so block j may only be asked for once block j - kStages has been seen); a
        // bounded wait (a missed phase gives a wrong stamp, never a hang).
        if (wtid == 32 && blockIdx.x == 0 && blockIdx.y == 0 && b == requests.begin) {
          for (int j = 0; j < n && j < kTraceBlocks; ++j) {
            bool done = false;
            for (int spin = 0; spin < (1 << 22) && !done; ++spin) {
              done = mbar_try_wait(full_of(j), phase_of(j));
            }
            SEESAW_REFILL_TRACE(true, j, kTrLoadDone);
          }
        }
#endif
        it += n;
        named_barrier_unaligned(kBarCta, kCtaThreads);  // the consumers' end of the request
        continue;
      }
      // q_scale written; with a producer, also its first loads' bad_page
      if constexpr (kProducer) {
        named_barrier_unaligned(kBarStart, kCtaThreads);
      } else {
        __syncthreads();
      }
      if (!kTwoTerm && !fused_q) mbar_wait(&s.q_bar, q_phase);  // else stored above
      if (b == requests.begin) SEESAW_TRACE(0, kTrQArrived);
      q_phase ^= 1;

      float o[kMTiles][kNRegs];  // O^T of latent half wg
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int e = 0; e < kNRegs; ++e) o[m][e] = 0.f;
      }

      // ---- QK of block i (the owner; asynchronous): two fp32 halves
      const SmemDesc q_desc = make_desc_base(s.q_content[0], Swizzle::k128B, kChunkBytes);
      const SmemDesc qr_desc = make_desc_base(s.q_rope, Swizzle::k128B, kChunkBytes);
      // SNAPMLA_SEESAW_QK_ONE_ACC (experimental, off; session 21): the whole QK, 16 FP8 and 4
      // BF16 steps, in one fp32 accumulator (sa), for a schedule whose owners cannot hold two
      // (bench/NOTES.md, session 21); here to measure what the longer FP8 chain costs in
      // accuracy. sb is then never written or read.
      constexpr bool kOneAcc = SNAPMLA_SEESAW_QK_ONE_ACC != 0;
      float sa[32], sb[32];
      // Content chunks 0-1 into sa, chunks 2-3 and the RoPE into sb: one commit group.
      auto issue_qk = [&](int i) {
        SharedStorage::Stage& st = stage_of(i);
        SEESAW_TRACE(i, kTrQkIssue);
        mbar_wait(full_of(i), phase_of(i));
        SEESAW_TRACE(i, kTrQkReady);
        // Descriptors once per block; each wgmma moves its start by an immediate.
        const SmemDesc k_desc = make_desc_base(st.content[0], Swizzle::k128B, kChunkBytes);
        const SmemDesc kr_desc = make_desc_base(st.rope, Swizzle::k128B, kChunkBytes);
        wgmma_fence();
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
#pragma unroll
          for (int k = 0; k < kQkChunkSteps; ++k) {
            const uint64_t da = q_desc.at(c * kTileBytes + 32 * k);
            const uint64_t db = k_desc.at(c * kTileBytes + 32 * k);
            float (&acc)[32] = kOneAcc || c < 2 ? sa : sb;
            if (c % (kOneAcc ? kChunks : 2) == 0 && k == 0) {
              wgmma_m64n64k32_e4m3_ss_init(acc, da, db);
            } else {
              wgmma_m64n64k32_e4m3_ss(acc, da, db, 1);
            }
          }
        }
#pragma unroll
        for (int k = 0; k < kRopeSteps; ++k) {
          if constexpr (kOneAcc) {
            wgmma_m64n64k16_bf16_ss(sa, qr_desc.at(32 * k), kr_desc.at(32 * k), 1);
          } else {
            wgmma_m64n64k16_bf16_ss(sb, qr_desc.at(32 * k), kr_desc.at(32 * k), 1);
          }
        }
        wgmma_commit();
      };

      // ---- softmax of block i (the owner): the contract's block step on S, P8 and the row
      // statistics published for both warpgroups' PV.
      auto softmax_publish = [&](int i) {
        // With the early PV, the group committed after QK(i) is still in flight; QK(i) is not.
        wgmma_wait<(kEarlyMTiles > 0 ? 1 : 0)>();
        fence_regs(sa);
        if constexpr (!kOneAcc) fence_regs(sb);
        SEESAW_TRACE(i, kTrQkDone);
        const SharedStorage::Stage& st = stage_of(i);
        const int tok0 = (seg.blk_lo + i) * kBlockN;
        const bool full = tok0 + kBlockN <= min_limit;
        float m_new[2], sig[2], l[2], gamma[2];
        if constexpr (kTwoTerm) m_new[1] = sig[1] = l[1] = gamma[1] = 0.f;  // one row a thread
        uint32_t w[2][4];  // P8 of rows row_of(0) and row_of(1), 16 tokens per word group
        // u = S s_k in place: u[4 n + c] is row row_of(c / 2), token 8 n + 2 t + c % 2 (two-term:
        // c < 2 only, the logit fmaf(rho, S[4 n + c + 2], S[4 n + c])). The row
        // factor s_q softmax_scale log2(e) > 0 is applied inside the exponent (z = u rf), so the
        // row maximum of z is max(u) rf, exactly.
        float (&z)[32] = sa;
        constexpr int kElems = 2 * kRowsPerThread;  // fragment elements per 8 tokens: c < kElems
        float mx[2] = {-INFINITY, -INFINITY};
        float row_factor[2];
        float rho = 0.f;  // kTwoTerm: s2 / s1 of the thread's query row
        constexpr bool kBenchNoSoftmax = kN == 64 && SNAPMLA_SEESAW_BENCH_NO_SOFTMAX != 0;
        if (softmax_warp && !kBenchNoSoftmax) {
          // Per-row constants, re-read each block rather than held in registers across PV.
          row_factor[0] = s.q_scale[r0] * p.scale_log2;
          if constexpr (kTwoTerm) {
            rho = s.q_scale[32 + r0];
          } else {
            row_factor[1] = s.q_scale[r0 + 8] * p.scale_log2;
          }
          // u = S s_k and the row maxima; in a block some row does not see whole, invisible
          // tokens are -inf.
          auto scaled_logits = [&](auto full_tag) {
            constexpr bool kFull = decltype(full_tag)::value;
            int limit[2];
            if constexpr (!kFull) {
              limit[0] = visibility_limit(p, tile * kRowsM + r0, seqlen);
              if constexpr (!kTwoTerm) {
                limit[1] = visibility_limit(p, tile * kRowsM + r0 + 8, seqlen);
              }
            }
            auto s_of = [&](int x) {
              if constexpr (kOneAcc) return sa[x];
              else return sa[x] + sb[x];
            };
            seesaw::scaled_logits<kElems, kFull>(
                z, [&](int e) { return kTwoTerm ? fmaf(rho, s_of(e + 2), s_of(e)) : s_of(e); },
                st.scale, t, tok0, limit, mx);
          };
          if (full) {
            scaled_logits(std::true_type{});
          } else {
            scaled_logits(std::false_type{});
          }
#pragma unroll
          for (int ri = 0; ri < kRowsPerThread; ++ri) {
            mx[ri] = quad_max(mx[ri]) * row_factor[ri];
          }
        }
        // e = exp(z - m), P' = e s_k (V's scale fused into P); invisible tokens give exactly 0 (a
        // select: their scale may be NaN). The exponential runs 2^24 high (exp2_shifted), so that
        // the flush-to-zero unit keeps every result fp32 can hold; s_k 2^-24 and the sum's 2^-24
        // scale it back exactly. m is bias's: the running maximum, or under kLocalMax the block's.
        float e_sum[2] = {0.f, 0.f}, p_max[2] = {0.f, 0.f};
        auto p_prime = [&](const float (&bias)[2]) {
          exp_scaled<kElems>(full, z, row_factor, bias, st.scale, t, e_sum, p_max);
          SEESAW_TRACE(i, kTrExp);
          e_sum[0] *= kExpUnshift;
          e_sum[1] *= kExpUnshift;
        };
        auto row_sums = [&](int ri) {  // the row's e_sum and max P' over its four threads
          e_sum[ri] = quad_sum(e_sum[ri]);
          p_max[ri] = quad_max(p_max[ri]);
        };
        // SNAPMLA_SEESAW_LOCAL_MAX (experimental, off; session 21 on the H200: 89 decode tests,
        // the three sanitizers and the workload layers pass, kernel time level): the
        // exponentials against the block's own row maximum mx, before the previous block's
        // statistics are read; then P' and its sum scale by c = exp(mx - m_new) <= 1 (zero where
        // the block shows the row nothing) and P8 = e4m3(P' (c / sigma)): the model's P8 up to
        // fp32 rounding, sigma's floor included. Groundwork for a schedule whose softmaxes do not
        // wait for each other (bench/NOTES.md, session 20).
        constexpr bool kLocalMax = SNAPMLA_SEESAW_LOCAL_MAX != 0;
        if constexpr (kLocalMax) {
          if (softmax_warp) {
            const float bias[2] = {kExpShift - (mx[0] == -INFINITY ? 0.f : mx[0]),
                                   kTwoTerm ? 0.f : kExpShift - (mx[1] == -INFINITY ? 0.f : mx[1])};
            p_prime(bias);
#pragma unroll
            for (int ri = 0; ri < kRowsPerThread; ++ri) row_sums(ri);
          }
        }
        // The previous block's statistics (its owner is the other warpgroup).
        float m_prev[2] = {-INFINITY, -INFINITY}, sig_prev[2] = {1.f, 1.f}, l_prev[2] = {0.f, 0.f};
        if (i > 0) {
          if constexpr (kEarlyMTiles == 0) named_barrier(kBarPready + ((i - 1) & 1), kThreads);
          SEESAW_TRACE(i, kTrStats);
          if (softmax_warp) {
            const RowStats& ps = s.stats[(i - 1) % kPBuffers];
#pragma unroll
            for (int ri = 0; ri < kRowsPerThread; ++ri) {
              m_prev[ri] = ps.m[row_of(ri)];
              sig_prev[ri] = ps.sig[row_of(ri)];
              l_prev[ri] = ps.l[row_of(ri)];
            }
          }
        }
        if constexpr (kBenchNoSoftmax) {  // (timing only) P8 = e4m3(S), constant statistics
          const float one[2] = {1.f, 1.f};
          if (softmax_warp) p8_words<kRowsPerThread>(sa, one, w);
#pragma unroll
          for (int ri = 0; ri < 2; ++ri) {
            m_new[ri] = 0.f;
            sig[ri] = l[ri] = gamma[ri] = 1.f;
          }
        }
        if (softmax_warp && !kBenchNoSoftmax) {
          float m_use[2], inv_sig[2];
          [[maybe_unused]] float c_loc[2] = {1.f, 1.f};  // kLocalMax's c per row
#pragma unroll
          for (int ri = 0; ri < kRowsPerThread; ++ri) {
            m_new[ri] = fmaxf(m_prev[ri], mx[ri]);
            m_use[ri] = m_new[ri] == -INFINITY ? 0.f : m_new[ri];  // nothing visible yet: e = 0
          }
          if constexpr (!kLocalMax) {
            const float bias[2] = {kExpShift - m_use[0], kTwoTerm ? 0.f : kExpShift - m_use[1]};
            p_prime(bias);
          }
#pragma unroll
          for (int ri = 0; ri < kRowsPerThread; ++ri) {
            if constexpr (kLocalMax) {
              c_loc[ri] = mx[ri] == -INFINITY ? 0.f : ex2_ftz(mx[ri] - m_use[ri]);
              e_sum[ri] *= c_loc[ri];
              p_max[ri] *= c_loc[ri];
            } else {
              row_sums(ri);
            }
            // sigma_k, g_k = exp(m_{k-1} - m_k) sigma_{k-1} / sigma_k, l_k (paper eq. 12)
#if SNAPMLA_SEESAW_FAST_ROWMATH
            sig[ri] = fmaxf(p_max[ri] * kInvFp8Max, kMinProbScale);
            inv_sig[ri] = rcp_approx_ftz(sig[ri]);
            gamma[ri] = ex2_ftz(m_prev[ri] - m_use[ri]) * (sig_prev[ri] * inv_sig[ri]);
            l[ri] = fmaf(l_prev[ri], gamma[ri], e_sum[ri] * inv_sig[ri]);
#else
            sig[ri] = fmaxf(__fdiv_rn(p_max[ri], kFp8Max), kMinProbScale);
            gamma[ri] = exp2f(m_prev[ri] - m_use[ri]) * __fdiv_rn(sig_prev[ri], sig[ri]);
            l[ri] = l_prev[ri] * gamma[ri] + __fdiv_rn(e_sum[ri], sig[ri]);
#endif
          }
#if !SNAPMLA_SEESAW_FAST_ROWMATH
          // P8 = e4m3(P' / sigma), by the reciprocal (the tensor-core tier's tolerance covers
          // the rare last-ulp flip).
          inv_sig[0] = __frcp_rn(sig[0]);
          if constexpr (!kTwoTerm) inv_sig[1] = __frcp_rn(sig[1]);
#endif
          if constexpr (kLocalMax) {
            inv_sig[0] *= c_loc[0];
            inv_sig[1] *= c_loc[1];
          }
          p8_words<kRowsPerThread>(z, inv_sig, w);
        }
        SEESAW_TRACE(i, kTrP8);
        // PV(i - kPTiles) by the other warpgroup read this P tile
        if (i >= kPTiles) named_barrier(kBarPfree + i % kPTiles, kThreads);
        SEESAW_TRACE(i, kTrPfree);
        if (softmax_warp) {
          store_p8<kRowsPerThread>(smem_u32(p_tile(i)) + stsm_off, w);
          if (t == 0) {
            RowStats& ps = s.stats[i % kPBuffers];
#pragma unroll
            for (int ri = 0; ri < kRowsPerThread; ++ri) {
              ps.m[row_of(ri)] = m_new[ri];
              ps.sig[row_of(ri)] = sig[ri];
              ps.l[row_of(ri)] = l[ri];
              ps.gamma[row_of(ri)] = gamma[ri];
            }
          }
        }
        fence_proxy_async();  // P8 (generic stores) is read next by wgmma (async proxy)
        named_barrier_arrive(kBarPready + (i & 1), kThreads);
        SEESAW_TRACE(i, kTrPublished);
        named_barrier(kBarWg + wg, kWgThreads);  // own P8 and statistics; the scales are read
        SEESAW_TRACE(i, kTrWgSynced);
      };

      // ---- PV of block i on latent half wg: O = gamma O + P8 V (fp32 promotion every block)
      // V^T A fragments of m-tile m (both k-steps) of this warpgroup's half of block i's stage.
      auto v_fragments = [&](int i, int m, auto edge_tag, uint32_t (&a)[2][4]) {
        vt_chunk_fragments(i, 2 * wg + m / 2, m & 1, edge_tag, a);
      };

      // ---- the early PV (kEarlyMTiles > 0): m-tiles [0, kEarlyMTiles) of the other warpgroup's
      // block i - 1, issued right after QK(i) into whole-N temporaries and left in flight under
      // the softmax of block i; promoted after it. The A fragments stay untouched until then.
      float early[kEarlyMTiles > 0 ? kEarlyMTiles : 1][kNRegs];
      uint32_t early_a[kEarlyMTiles > 0 ? kEarlyMTiles : 1][2][4];
      auto pv_issue_early = [&](int i, auto edge_tag) {
        mbar_wait(full_of(i), phase_of(i));
        const SmemDesc p_desc = make_desc_base(s.p8[i % kPBuffers], Swizzle::k64B, kPRowBytes);
#pragma unroll
        for (int m = 0; m < kEarlyMTiles; ++m) v_fragments(i, m, edge_tag, early_a[m]);
        wgmma_fence();
#pragma unroll
        for (int m = 0; m < kEarlyMTiles; ++m) {
          wgmma_pv<kN, true>(early[m], early_a[m][0], p_desc.at(0));
          wgmma_pv<kN, false>(early[m], early_a[m][1], p_desc.at(32));
        }
      };
      // The promotion: O^T m-tile m = gamma O^T + T over the 8-column tiles [col0, col0 + kCols)
      // of O^T (query rows 8 col + 2 t, + 1), for a temporary T of 4 kCols registers; gamma read
      // from the block's statistics where it is used.
      auto promote_cols = [&](int m, int col0, auto& tmp, const RowStats& ps) {
        seesaw::promote_cols(o[m], col0, tmp, ps.gamma, t);
      };
      auto pv_promote_early = [&](int i) {
        const RowStats& ps = s.stats[i % kPBuffers];
#pragma unroll
        for (int m = 0; m < kEarlyMTiles; ++m) promote_cols(m, 0, early[m], ps);
      };

      // ---- PV of m-tiles [kM0, kMTiles) of block i (all of them for the own block)
      // O^T m-tiles [kM0, kMTiles) *= the block's gamma (the scaled PV, once a block).
      auto scale_o_tiles = [&](const RowStats& ps, auto m0_tag) {
        constexpr int kM0 = decltype(m0_tag)::value;
#pragma unroll
        for (int col = 0; col < kNTiles; ++col) {
          const float2 g = *reinterpret_cast<const float2*>(&ps.gamma[8 * col + 2 * t]);
#pragma unroll
          for (int m = kM0; m < kMTiles; ++m) {
#pragma unroll
            for (int c = 0; c < 4; ++c) o[m][4 * col + c] *= c & 1 ? g.y : g.x;
          }
        }
      };
      // O^T m-tile m += T, a whole-N temporary just waited for (the scaled PV's promotion).
      auto add_to_o = [&](int m, float (&tq)[kNRegs]) {
        sm90::fence_regs(tq);
#pragma unroll
        for (int e = 0; e < kNRegs; ++e) o[m][e] += tq[e];
      };
      // (SNAPMLA_SEESAW_BENCH_PV's timing builds) m-tile m's two k-steps of block i as SS wgmmas,
      // the content tile read as if it were V^T (wrong values, the shared-memory rate), into acc
      // (zeroed first under kInit).
      auto ss_pv_bench = [&](float (&acc)[32], int i, int m, const SmemDesc& p_desc,
                             auto init_tag) {
        const SmemDesc a_desc =
            make_desc_base(stage_of(i).content[2 * wg + m / 2], Swizzle::k128B, kChunkBytes);
        if constexpr (decltype(init_tag)::value) {
          wgmma_m64n64k32_e4m3_ss_init(acc, a_desc.at(64 * (m & 1)), p_desc.at(0));
        } else {
          wgmma_m64n64k32_e4m3_ss(acc, a_desc.at(64 * (m & 1)), p_desc.at(0), 1);
        }
        wgmma_m64n64k32_e4m3_ss(acc, a_desc.at(64 * (m & 1) + 32), p_desc.at(32), 1);
      };
      auto pv_block = [&](int i, auto edge_tag, auto m0_tag) {
        constexpr int kM0 = decltype(m0_tag)::value;
        mbar_wait(full_of(i), phase_of(i));
        SEESAW_TRACE(i, kTrPvStart);
        const RowStats& ps = s.stats[i % kPBuffers];
        if constexpr (kPvDirect) {  // into O^T itself, every m-tile in flight
          constexpr int kTiles = kMTiles - kM0;
          const SmemDesc p_desc = make_desc_base(s.p8[i % kPBuffers], Swizzle::k64B, kPRowBytes);
#pragma unroll
          for (int m = kM0; m < kMTiles; ++m) {
#pragma unroll
            for (int col = 0; col < kNTiles; ++col) {
              const float2 gm = *reinterpret_cast<const float2*>(&ps.gamma[8 * col + 2 * t]);
#pragma unroll
              for (int c = 0; c < 4; ++c) o[m][4 * col + c] *= c & 1 ? gm.y : gm.x;
            }
          }
          uint32_t a[kTiles][2][4];
#pragma unroll
          for (int q = 0; q < kTiles; ++q) {
            v_fragments(i, kM0 + q, edge_tag, a[q]);
            wgmma_fence();
            wgmma_pv<kN, false>(o[kM0 + q], a[q][0], p_desc.at(0));
            wgmma_pv<kN, false>(o[kM0 + q], a[q][1], p_desc.at(32));
            wgmma_commit();
          }
          wgmma_wait<0>();
#pragma unroll
          for (int m = kM0; m < kMTiles; ++m) fence_regs(o[m]);
          SEESAW_TRACE(i, kTrPvEnd);
          return;
        }
        if constexpr (kPvDeep<kN>) {
          // Every m-tile in flight: its V^T fragments and its whole-N temporary each its own.
          constexpr int kTiles = kMTiles - kM0;
          const SmemDesc p_desc = make_desc_base(s.p8[i % kPBuffers], Swizzle::k64B, kPRowBytes);
          float tmp[kTiles][kNRegs];
          uint32_t a[kTiles][2][4];
#pragma unroll
          for (int q = 0; q < kTiles; ++q) {
            v_fragments(i, kM0 + q, edge_tag, a[q]);
            wgmma_fence();
            wgmma_pv<kN, true>(tmp[q], a[q][0], p_desc.at(0));
            wgmma_pv<kN, false>(tmp[q], a[q][1], p_desc.at(32));
            wgmma_commit();
          }
#pragma unroll
          for (int q = 0; q < kTiles; ++q) {
            wgmma_wait_upto3(kTiles - 1 - q);
            promote_cols(kM0 + q, 0, tmp[q], ps);
          }
          SEESAW_TRACE(i, kTrPvEnd);
          return;
        }
        // The block's product in groups of (m-tile, half of the N query rows), each into a zeroed
        // fp32 temporary, two in flight: the tensor cores run group q + 1 while the CUDA cores add
        // group q into O = gamma O + T. (Whole m-tiles two deep would need 64 more registers.)
        constexpr int kHalfN = kN / 2;
        const SmemDesc p_desc = make_desc_base(s.p8[i % kPBuffers], Swizzle::k64B, kPRowBytes);
        // O^T = gamma O^T + T for group q's half-N temporary T (m-tile kM0 + q / 2, half q % 2).
        auto promote_half = [&](int q, float (&tmp_q)[kHalfN / 2]) {
          promote_cols(kM0 + q / 2, (q % 2) * kHalfN / 8, tmp_q, ps);
        };
        if constexpr (SNAPMLA_SEESAW_PV_WHOLE != 0 && kN == 64 && !decltype(edge_tag)::value) {
          // Whole-N groups (an m-tile's two m64n64k32 into one temporary), two in flight: 4
          // waits and promotion rounds a block instead of 8. Blocks that some row does not see
          // whole keep the half-N groups below: their masks beside whole-N temporaries spilled
          // 1 KB (session 15), without them ptxas spills what the default does.
          float tmpw[2][kNRegs];
          [[maybe_unused]] uint32_t aw[2][2][4];  // V^T fragments of the groups in flight (unused
                                                  // by SNAPMLA_SEESAW_BENCH_PV=1's SS operands)
          // kScaledPv: O^T *= gamma once a block, under the first group's wgmmas (gamma read
          // once, live only there), then each group's promotion is O^T += T: no gamma loads
          // after the waits (kScaledPv above). Otherwise O^T = gamma O^T + T a group.
          auto promote_whole = [&](int q) {
            if constexpr (kBenchNoPromote || (kScaledPv && kBenchNoAdd)) {  // (timing: T dropped)
              sm90::fence_regs(tmpw[q % 2]);
            } else if constexpr (kScaledPv) {
              add_to_o(kM0 + q, tmpw[q % 2]);
            } else {
              promote_cols(kM0 + q, 0, tmpw[q % 2], ps);
            }
          };
#pragma unroll
          for (int q = 0; q < kMTiles - kM0; ++q) {
            if constexpr (kBenchSsPv) {  // (timing only)
              float(&acc)[32] = *reinterpret_cast<float(*)[32]>(&tmpw[q % 2][0]);  // (N = 64)
              wgmma_fence();
              ss_pv_bench(acc, i, kM0 + q, p_desc, std::true_type{});
            } else {
              v_fragments(i, kM0 + q, edge_tag, aw[q % 2]);
              wgmma_fence();
              wgmma_pv<kN, true>(tmpw[q % 2], aw[q % 2][0], p_desc.at(0));
              wgmma_pv<kN, false>(tmpw[q % 2], aw[q % 2][1], p_desc.at(32));
            }
            wgmma_commit();
            if (kScaledPv && !kBenchNoPromote && !kBenchNoScale && q == 0) {
              scale_o_tiles(ps, m0_tag);
            }
            if (q > 0) {
              wgmma_wait<1>();
              promote_whole(q - 1);
            }
          }
          wgmma_wait<0>();
          promote_whole(kMTiles - kM0 - 1);
          SEESAW_TRACE(i, kTrPvEnd);
          return;
        }
        float tmp[2][kHalfN / 2];
        auto promote = [&](int q) { promote_half(q, tmp[q % 2]); };
#pragma unroll
        for (int m = kM0; m < kMTiles; ++m) {
          uint32_t a[2][4];
          v_fragments(i, m, edge_tag, a);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int q = 2 * (m - kM0) + h;
            const uint32_t rows = h * kHalfN * kPRowBytes;  // P8 rows of this half
            wgmma_fence();
            wgmma_pv<kHalfN, true>(tmp[q % 2], a[0], p_desc.at(rows));
            wgmma_pv<kHalfN, false>(tmp[q % 2], a[1], p_desc.at(rows + 32));
            wgmma_commit();
            if (q > 0) {
              wgmma_wait<1>();
              promote(q - 1);
            }
          }
        }
        wgmma_wait<0>();
        promote(2 * (kMTiles - kM0) - 1);
        SEESAW_TRACE(i, kTrPvEnd);
      };
      using AllTiles = std::integral_constant<int, 0>;
      using LateTiles = std::integral_constant<int, kEarlyMTiles>;
      auto pv = [&](int i) {  // the own block: every m-tile
        if (is_edge(i)) {
          pv_block(i, std::true_type{}, AllTiles{});
        } else {
          pv_block(i, std::false_type{}, AllTiles{});
        }
      };
      auto pv_late = [&](int i) {  // the other's block, past the early m-tiles
        if constexpr (kEarlyMTiles < kMTiles) {
          if (is_edge(i)) {
            pv_block(i, std::true_type{}, LateTiles{});
          } else {
            pv_block(i, std::false_type{}, LateTiles{});
          }
        }
      };
      // Page ids of the refills, 32 at a time: lane j of the refill warp of each warpgroup holds
      // pages[page_base + j]. A global load per refill would stall the warp that the whole
      // warpgroup's next wgmma waits for (by its latency, or at the softmax's proxy fence, which
      // waits for loads in flight); this way one load in 32 blocks is waited for.
      int32_t page_lane = -1;
      int page_base = -1;
      auto page_of = [&](int blk) -> int32_t {  // every lane of the refill warp; blk rising
        const int base = blk & ~31;
        if (base != page_base) {
          page_base = base;
          page_lane = base + lane < n ? pages[base + lane] : -1;
        }
        return __shfl_sync(0xffffffffu, page_lane, blk & 31);
      };
      // SNAPMLA_SEESAW_PRODUCER: this warpgroup is done with block i's stage (after its PV).
      auto release = [&](int i) {
        if constexpr (kProducer) {
          if (wtid == 0 && i + kStages < n) mbar_arrive(&s.empty_bar[(it0 + i) % kStages]);
        }
      };
      auto refill_content = [&](int i) {  // this warpgroup's half of block i's stage is free
        if (warp == kRefillWarp && i + kStages < n) {
          const int32_t page = page_of(i + kStages);
          if (lane == 0) load_content_half(i + kStages, wg, page);
        }
      };
      auto refill_rope_scale = [&](int i) {  // the owner's QK and softmax of block i ran
        if (warp == kRefillWarp && i + kStages < n) {
          const int32_t page = page_of(i + kStages);
          if (lane == 0) load_rope_scale(i + kStages, page);
        }
      };


      // The rest of a promoted-PV iteration after the softmax: the other's block i - 1, the own
      // block i, the refills.
      // kBenchPairSweep (timing only, with kBenchSsPv): blocks i - 1 and i in one sweep, each
      // m-tile's four k-steps (two a block) into one temporary and one promotion, as a P block
      // of two pages would allow; the gamma between the two blocks is ignored (wrong outputs).
      auto pv_pair_sweep = [&](int j, int i) {
        if constexpr (kBenchPairSweep && kScaledPv) {  // (N = 64's O^T and stages only)
          mbar_wait(full_of(j), phase_of(j));
          mbar_wait(full_of(i), phase_of(i));
          const SmemDesc pj = make_desc_base(s.p8[j % kPBuffers], Swizzle::k64B, kPRowBytes);
          const SmemDesc pi = make_desc_base(s.p8[i % kPBuffers], Swizzle::k64B, kPRowBytes);
          const RowStats& ps = s.stats[i % kPBuffers];
          float tmp2[2][kNRegs];
#pragma unroll
          for (int q = 0; q < kMTiles; ++q) {
            wgmma_fence();
            ss_pv_bench(tmp2[q % 2], j, q, pj, std::true_type{});
            ss_pv_bench(tmp2[q % 2], i, q, pi, std::false_type{});
            wgmma_commit();
            if (q == 0) scale_o_tiles(ps, std::integral_constant<int, 0>{});
            if (q > 0) {
              wgmma_wait<1>();
              add_to_o(q - 1, tmp2[(q - 1) % 2]);
            }
          }
          wgmma_wait<0>();
          add_to_o(kMTiles - 1, tmp2[(kMTiles - 1) % 2]);
        }
      };
      auto pv_seesaw_rest = [&](int i) {
        if constexpr (kEarlyMTiles > 0) wgmma_wait<0>();
        SEESAW_TRACE(i, kTrEarlyDone);
        if constexpr (kBenchPairSweep && kScaledPv && kProducer) {
          if (i > 0 && !is_edge(i - 1) && !is_edge(i)) {
            pv_pair_sweep(i - 1, i);
            if (i - 1 + kPTiles < n) named_barrier_arrive(kBarPfree + (i - 1) % kPTiles, kThreads);
            release(i - 1);
            release(i);
            return;
          }
        }
        if (i > 0) {  // the other warpgroup's block i - 1 (published before block i's softmax)
          if constexpr (kEarlyMTiles > 0) pv_promote_early(i - 1);
          pv_late(i - 1);
          if (i - 1 + kPTiles < n) named_barrier_arrive(kBarPfree + (i - 1) % kPTiles, kThreads);
          SEESAW_TRACE(i, kTrPfreeArrived);
          if constexpr (kProducer) {
            release(i - 1);
          } else if constexpr (!kRefillInSoftmax || kEarlyMTiles < kMTiles) {
            refill_content(i - 1);
          }
        }
        if constexpr (!kRefillInSoftmax && !kProducer) refill_rope_scale(i);
        SEESAW_TRACE(i, kTrRefill);
        pv(i);
        if constexpr (kProducer) {
          release(i);
        } else if constexpr (!kRefillInSoftmax) {
          refill_content(i);
        }
      };

      // ---- the seesaw: WG w owns blocks w, w + 2, ...; each runs PV of every block in order.
      // While one warpgroup waits for its QK and runs the softmax, the other's PV and QK keep
      // the tensor cores busy. (A QK left in flight across iterations makes ptxas serialize.)
      for (int i = wg; i < n; i += 2) {
        issue_qk(i);
        if constexpr (kEarlyMTiles > 0) {
          if (i > 0) {  // block i - 1's P8 and statistics, for the early PV and the softmax
            named_barrier(kBarPready + ((i - 1) & 1), kThreads);
            if (is_edge(i - 1)) {
              pv_issue_early(i - 1, std::true_type{});
            } else {
              pv_issue_early(i - 1, std::false_type{});
            }
          }
          wgmma_commit();  // empty without a previous block: the softmax waits for all but one
        }
        if constexpr (kRefillInSoftmax) {
          // QK(i) and the early PV of block i - 1, if any, are done (the latter only a little
          // after the former), so the refill warp may reuse what they read; QK(i) done also
          // means every warp of this warpgroup issued it, past its reads of the own block i - 2
          // (last iteration's PV). Blocks rising (page_of).
          wgmma_wait<0>();
          if (warp == kRefillWarp) {
            if (i >= 2) {  // the own block i - 2: its PV and softmax ran an iteration ago
              refill_content(i - 2);
              refill_rope_scale(i - 2);
            }
            if (kEarlyMTiles == kMTiles && i > 0) refill_content(i - 1);
          }
        }
        softmax_publish(i);
        pv_seesaw_rest(i);
      }
      if (n > 0 && ((n - 1) & 1) != wg) {  // the last block is the other warpgroup's
        named_barrier(kBarPready + ((n - 1) & 1), kThreads);
        pv(n - 1);
      }
      // Every PV done; the last block's statistics visible.
      if constexpr (kProducer) {
        named_barrier_unaligned(kBarConsumers, kThreads);
      } else {
        __syncthreads();
      }

      // SNAPMLA_SEESAW_EARLY_TRIGGER (1, the default since session 22; 0: from the CTA's end):
      // under SNAPMLA_PDL=2 the combine may launch from the start of the CTA's last epilogue
      // (its stores then overlap the combine's launch). The combine still waits for this grid.
      // With SNAPMLA_COMBINE_PLAN_FIRST, same-call A/B/A on the H200 (graph replays of the whole
      // call, bench/results/2026-12-03-s22/decode-cases-*ed9c37a*.json): 1x1x128x1024 13.5 ->
      // 12.8 us, 1x1x128x8192 19.2 -> 18.4, 8x1x128x4096 30.7 -> 30.0, 64x1x128x1024 42.0 ->
      // 41.2, 1x1x16x8192 14.4 -> 14.1; the long cases within their run-to-run spread.
      if constexpr (SNAPMLA_PDL >= 2 && SNAPMLA_SEESAW_EARLY_TRIGGER != 0) {
        if (b == requests.end) griddep_launch_dependents();
      }
      // ---- epilogue: thread holds latent d = 256 wg + 64 m + 16 warp + 2 g (+1) of query rows
      // 8 nn + 2 t + (c & 1).
      if (b == requests.begin) SEESAW_TRACE(0, kTrEpilogueStart);
      // A row's 1/l and lse, once per row and warpgroup: thread wtid of each warpgroup computes
      // row wtid's into a statistics buffer no block uses any more (every PV is done; n >= 1, so
      // (n + wg) % kPBuffers is neither warpgroup's (n - 1) % kPBuffers), and its warpgroup reads
      // them there. Computed by each of a row's 32 threads, the IEEE reciprocal and logf took
      // ~11,000 cycles a request-part at N = 64 (session 11's timeline, bench/NOTES.md).
#ifdef SNAPMLA_SEESAW_TRACE_NO_EPILOGUE_STORES
      constexpr bool kDryEpilogue = true;
#else
      constexpr bool kDryEpilogue = false;
#endif
      {
        const RowStats& fin = s.stats[(n - 1) % kPBuffers];
        RowStats& res_of = s.stats[(n + wg) % kPBuffers];
        const int fr = tile * kRowsM + wtid;
        if (wtid < kN && fr < rows_total) {
          const RowResult res = row_result(fin.l[wtid], fin.m[wtid], fin.sig[wtid],
                                           s.bad_page != 0, seg.split);
          res_of.l[wtid] = res.inv_l;
          if (wg == 0 && !kDryEpilogue) store_lse(p, b, fr, seg, res.lse);
        }
        named_barrier_unaligned(kBarWg + wg, kWgThreads);
      }
      const float* inv_l_of = s.stats[(n + wg) % kPBuffers].l;
      store_o_rows<kDryEpilogue>(p, o, inv_l_of, b, tile, rows_total,
                                 kHalfDim * wg + 16 * warp + 2 * g, t, seg);
      if (b == requests.begin) SEESAW_TRACE(0, kTrEpilogueDone);
      it += n;
      // Q, the ring, P8 and the statistics are reused by the next request.
      if constexpr (kProducer) {
        // Every consumer read bad_page: reset it for the next request before the producer
        // (past kBarCta) may set it again; racecheck sees this order (it did not see the one
        // through kBarCta alone, with the producer resetting it at the next request's start).
        named_barrier_unaligned(kBarConsumers, kThreads);
        if (tid == 0) s.bad_page = 0;
        named_barrier_unaligned(kBarCta, kCtaThreads);
      } else {
        __syncthreads();
      }
    }
  };
  if constexpr (kProducer) {
    if (wg == 2) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
      run_requests(std::true_type{});
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
      run_requests(std::false_type{});
    }
  } else {
    run_requests(std::false_type{});
  }
  SEESAW_CTA_TRACE(1);  // thread 0: a consumer, past its last epilogue
  if constexpr (SNAPMLA_PDL >= 2) griddep_launch_dependents();
}

template <int kN, bool kTwoTerm, bool kPvDirect, bool kScaledPv>
cudaError_t run(const DecodeParams& p, const TensorMaps& maps, cudaStream_t stream) {
  const cudaError_t err =
      cudaFuncSetAttribute(seesaw_decode_kernel<kN, kTwoTerm, kPvDirect, kScaledPv>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, int{kSmemBytes});
  if (err != cudaSuccess) return err;
  return launch_dependent(seesaw_decode_kernel<kN, kTwoTerm, kPvDirect, kScaledPv>,
                          dim3(p.num_parts, p.row_tiles), dim3(kCtaThreadsAt<kN, kTwoTerm>),
                          kSmemBytes, stream, p, maps);
}

}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
