// The role-split N = 64 kernel (experimental, SNAPMLA_SEESAW_ROLES; bench/NOTES.md, session 24).
//
// Why: in the two-warpgroup kernel (kernel.cuh) each consumer warpgroup runs one serial chain a
// pair of blocks (QK ~860 cycles, softmax ~1,950, the other's PV ~1,690, its own PV ~1,090 at
// 32x128x16384), one warp an SMSP each, the tensor pipe a third busy. Four warpgroups that each
// own a quarter of O^T (session 21) spilled: the register file cannot give every warpgroup both
// a share of O^T and a softmax. Here the two jobs go to different warpgroups, so that no thread
// holds both:
//   S warpgroups 0, 1    own blocks w, w + 2, ...: the QK into one fp32 accumulator (32
//                        registers; `SNAPMLA_SEESAW_QK_ONE_ACC` measured it no less accurate),
//                        the softmax, P8 and the row statistics published; no O^T.
//   PV warpgroups 2, 3   own latent half w - 2 of O^T (128 registers) and run the PV of every
//                        block into it (whole-N fp32 temporaries, promoted O = gamma O + T),
//                        then the epilogue.
// Four warps an SMSP instead of three (two consumers and a producer), and each warpgroup's
// chain is its own part of the old one: the S side ~QK + softmax a block per warpgroup pair,
// the PV side ~one promoted PV a block per warpgroup.
//
// Registers: 512 threads, 128 each at launch; setmaxnreg moves kSRegs / kPvRegs (72 / 184, their
// sum 256 = 65,536 / 256; ptxas spills nothing in either loop). Loads: no producer warpgroup.
// The first pages and the Q by thread 0 at a request's start; then each content half of block
// i + kStages by its PV warpgroup after its PV of block i, and the RoPE tile and the scales of
// block i + 2 by the S warpgroup that owns it once its QK of block i is done (every warp of it
// is then past its softmax of block i - 2). The page ids go through a ring in shared memory
// (refill_page), written by the owner. Handoffs (named barriers; the Pready and Pfree ids cycle
// with the P buffers, so an instance is complete before its id is reused: the owner of block
// i + kPBuffers waits for the PVs of block i first):
//   Pready(i % 4)  384: the owner of block i arrives (P8, statistics, refill page written); both
//                  PV warpgroups sync.
//   Stats(i % 2)   256: the owner arrives; the other S warpgroup syncs before its softmax of
//                  block i + 1 (for the last block, after its loop).
//   Pfree(i % 4)   384: both PV warpgroups arrive after their PV of block i; the owner of block
//                  i + kPBuffers syncs before it writes P8 and statistics there.
// Measured on the H200 (session 24, bench/NOTES.md): correct (116 decode tests), kernel alone
// 3.5% faster than the seesaw kernel at 32x128x16384 and 6.5% at 128x16x16384 q_len 4, 4-7%
// slower at short contexts; PV-bound (a PV warpgroup's four m-tiles run in series). racecheck
// reports its statistics' reads against later writes; with the owner syncing on Stats(i % 2)
// where it arrives, racecheck is clean (session 26), so the reports are its reading of the
// arrive, which orders those reads by PTX's rules. The content refill issued once the last
// m-tile's fragments were read (before its wgmma and promotion) measured level or slower
// (session 26: 216.1 against 215.9 us at 32x128x16384, 419.6 against 405.7 at 128x16x16384 q_len
// 4) and was removed. Off: AUTO keeps kernel.cuh.
// Numerics: those of kernel.cuh's N = 64 kernel with SNAPMLA_SEESAW_QK_ONE_ACC (the same
// softmax, P8 and promotion code; the QK's 16 FP8 and 4 BF16 steps in one accumulator).
#pragma once

#include "decode/seesaw/kernel.cuh"
#include "decode/seesaw/steps.cuh"

#ifndef SNAPMLA_SEESAW_ROLES_PAIR
#define SNAPMLA_SEESAW_ROLES_PAIR 0  // 2: pairs of pages (below)
#endif
// setmaxnreg's split: an S thread's and a PV thread's registers (multiples of 8). Two S
// warpgroups: their sum 256. Pairs (one S warpgroup, 384 threads, 168 registers each at
// launch): 120 / 192 (ptxas: 88 B spilled, loop invariants).
#ifndef SNAPMLA_SEESAW_ROLES_S_REGS
#define SNAPMLA_SEESAW_ROLES_S_REGS (SNAPMLA_SEESAW_ROLES_PAIR == 2 ? 120 : 72)
#endif

namespace snapmla {
namespace decode {
namespace seesaw {
namespace roles {

// SNAPMLA_SEESAW_ROLES_PAIR = 2 (below): one S warpgroup.
static_assert(SNAPMLA_SEESAW_ROLES_PAIR == 0 || SNAPMLA_SEESAW_ROLES_PAIR == 2,
              "SNAPMLA_SEESAW_ROLES_PAIR: 0 or 2");
constexpr bool kSolo = SNAPMLA_SEESAW_ROLES_PAIR == 2;
constexpr int kSWgs = kSolo ? 1 : 2;  // S warpgroups 0 .. kSWgs - 1, then the two PV warpgroups
constexpr int kCtaThreads = (kSWgs + 2) * kWgThreads;
constexpr int kSRegs = SNAPMLA_SEESAW_ROLES_S_REGS;
constexpr int kPvRegs = kSolo ? 192 : 256 - kSRegs;
// (what the launch gives: 65,536 / kCtaThreads, rounded down to a multiple of 8, a thread)
constexpr int kLaunchRegs = 65536 / kCtaThreads / 8 * 8;
static_assert(kSRegs % 8 == 0 && kSRegs >= 24 && kPvRegs <= 256, "setmaxnreg's bounds");
static_assert(kSRegs * kSWgs + kPvRegs * 2 <= kLaunchRegs * (kSWgs + 2), "the register pool");

enum Barrier : int {
  kBarPready = 1,                      // + i % kPBuffers, 384 threads
  kBarPfree = kBarPready + kPBuffers,  // + i % kPBuffers, 384 threads
  kBarStats = kBarPfree + kPBuffers,   // + i % 2, 256 threads
  kBarPvWg = kBarStats + 2,            // + half: one PV warpgroup, 128 threads
  kBarAll = kBarPvWg + 2,              // all 512: a request's first loads issued and q_scale
                                       // written; a request done (barrier.sync, counted)
};
static_assert(kBarAll + 1 <= 16, "16 named barriers per CTA");
// Pready: the owner arrives, both PV warpgroups sync. Stats: the owner arrives, the other S
// warpgroup syncs (before its softmax of block i + 1; after its loop for the last block), so
// an instance completes before the owner arrives on its id again (at block i + 2, after it
// read the statistics of block i + 1). (One barrier for both handoffs tied the PVs of block
// i to the other S warpgroup's softmax of block i + 1: session 24's timeline.)
// SNAPMLA_SEESAW_ROLES_PAIR = 2 (experimental, off; session 27): the kernel on pairs of pages.
// One S warpgroup runs the QK of both pages of pair j (pages 2 j and 2 j + 1, two accumulators)
// and one softmax over their 128 tokens, so both pages' P8 share the rows' maximum and P scale;
// each PV m-tile then runs its four k-steps into one temporary with one promotion (two fragment
// slots, each reloaded once the wgmma that read it completed: wait<1>). 384 threads: the S
// warpgroup (120 registers) and the two PV warpgroups (192). Pready and Pfree count all threads
// and go by the pair's parity; P buffers and statistics by page (2 j, 2 j + 1 mod 4; the
// statistics at the even one), so the epilogue's 1/l goes to the odd buffers 1 and 3. A pair
// whose second page is past the segment (n odd) runs that page with every token invisible: P8
// 0 and zero V^T fragments (its stage is not waited for, whatever it holds).
// Measured on the H200 (bench/NOTES.md, session 27): kernel alone 6-7% faster than the
// default at 32x128x16384 (206.8-208.4 against 221.4-223.6 us) and 128x16x16384 q_len 4, 11-17%
// slower at 1x128x8192 and 8x128x4096; its 128-token P blocks are not the contract's 64-token
// ones, so the exact-logit agreement with the model fails at h 64 s_q 4 (2.0e-3 against 1e-3;
// promoting once a page instead changed nothing). The S warpgroup sets the period (~610
// instructions a warp per 64 tokens, ~190 of them the QK's descriptor moves). (=1, both S
// warpgroups on every pair with an exchange of their statistics, 4fa69b6, ran level with the
// role-split kernel and was removed.)
constexpr bool kPair = SNAPMLA_SEESAW_ROLES_PAIR != 0;
constexpr int kPreadyThreads = kPair ? kCtaThreads : 3 * kWgThreads;
constexpr int kPfreeThreads = kPair ? kCtaThreads : 3 * kWgThreads;
constexpr int kStatsThreads = 2 * kWgThreads;
constexpr int kRefillSlots = 2 * kStages;  // SharedStorage::refill_page
static_assert(kStages == kPBuffers, "a block's refill goes with its P buffer's handoffs");
// SNAPMLA_SEESAW_ROLES_LOCAL_MAX: the softmax's exponentials against the block's own row
// maximum, before the previous block's statistics are read (kernel.cuh's
// SNAPMLA_SEESAW_LOCAL_MAX, which passed the decode tests, the sanitizers and the workload
// layers in session 21): the two S warpgroups' softmaxes then overlap up to the statistics.
#ifndef SNAPMLA_SEESAW_ROLES_LOCAL_MAX
#define SNAPMLA_SEESAW_ROLES_LOCAL_MAX 0
#endif
constexpr bool kLocalMax = SNAPMLA_SEESAW_ROLES_LOCAL_MAX != 0;
#ifndef SNAPMLA_SEESAW_ROLES_QK_AHEAD
#define SNAPMLA_SEESAW_ROLES_QK_AHEAD 0
#endif
constexpr bool kQkAhead = SNAPMLA_SEESAW_ROLES_QK_AHEAD != 0;
#ifndef SNAPMLA_SEESAW_ROLES_PV_HALVES
#define SNAPMLA_SEESAW_ROLES_PV_HALVES 0
#endif
constexpr bool kPvHalves = SNAPMLA_SEESAW_ROLES_PV_HALVES != 0;

// Timeline (trace builds): the S warpgroups stamp SEESAW_TRACE's events in rows 0 and 1; PV
// warpgroup 2 + h stamps pv_start (its waits for P8 and the stage done), pv_end and
// pfree_arrived in row h.
#ifdef SNAPMLA_SEESAW_TRACE
#define ROLES_PV_TRACE(block, event)                                                      \
  do {                                                                                    \
    if (blockIdx.x == 0 && blockIdx.y == 0 && wtid == 0 && (block) < kTraceBlocks)        \
      p.trace[((wg - kSWgs) * kTraceBlocks + (block)) * kTrEvents + (event)] = clock64(); \
  } while (0)
#else
#define ROLES_PV_TRACE(block, event) \
  do {                               \
  } while (0)
#endif

__global__ void __launch_bounds__(kCtaThreads, 1)
    roles_decode_kernel(const DecodeParams p, const __grid_constant__ TensorMaps maps) {
  constexpr int kN = 64;
  constexpr int kNRegs = kN / 2;
  constexpr int kNTiles = kN / 8;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(
      smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u));

  const int part = blockIdx.x, tile = blockIdx.y;
  const int tid = threadIdx.x, wtid = tid % kWgThreads, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, tid / kWgThreads, 0);
  const int warp = __shfl_sync(0xffffffffu, wtid / 32, 0);
  SEESAW_TRACE(0, kTrEntry);
  constexpr bool late_q_wait = SNAPMLA_PDL >= 2;
  auto q_wait = [&] {
    if (late_q_wait) griddep_wait();
  };
  if constexpr (SNAPMLA_SEESAW_PREFETCH_MAPS != 0) {
    if (tid == 0) {
      prefetch_tensormap(&maps.k_content);
      prefetch_tensormap(&maps.k_rope);
      prefetch_tensormap(&maps.k_scale);
      prefetch_tensormap(&maps.q_content);
      prefetch_tensormap(&maps.q_rope);
    }
  }
  const RequestRange requests_ahead =
      part_requests(p, PlanLayout::make(p.batch, p.num_parts), part);
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(&s.full_bar[i], kFullArrivals);
    mbar_init(&s.q_bar, 1);
    s.bad_page = 0;
    mbar_fence_init();
  }
  if (!late_q_wait) griddep_wait();
  __syncthreads();
  if (!plan_matches(p)) return write_nan_rows(p, part, tile);

  // One copy of the request loop per role (its constants computed under its own registers).
  auto run_requests = [&](auto pv_tag) {
    constexpr bool kPv = decltype(pv_tag)::value;
    const int g = lane / 4, t = lane % 4;
    const int rows_total = p.q_len * p.num_heads;
    const int r0 = 16 * warp + g;  // S rows of this thread: r0 and r0 + 8
    const int half = wg - kSWgs;   // PV warpgroups: the latent half
    const PlanLayout L = PlanLayout::make(p.batch, p.num_parts);
    const RequestRange requests = requests_ahead;
    uint32_t it = 0;  // blocks this CTA consumed: the ring's stage and phase
    uint32_t q_phase = 0;
    for (int b = requests.begin; b <= requests.end; ++b) {
      Segment seg;
      if (plan_segment(p, L, part, b, tile, &seg) != SegmentKind::kRun) continue;
      const int seqlen = p.seqlens[b];
      const int n = seg.blk_hi - seg.blk_lo;
      const int64_t row0 = int64_t{b} * rows_total + tile * kRowsM;
      const int32_t* pages = p.block_table + int64_t{b} * p.block_table_stride + seg.blk_lo;
      const int min_limit = p.causal ? seqlen - p.q_len + 1 : seqlen;
      const uint32_t it0 = it;
      auto stage_of = [&](int i) -> SharedStorage::Stage& { return s.stage[(it0 + i) % kStages]; };
      auto full_of = [&](int i) { return &s.full_bar[(it0 + i) % kStages]; };
      auto phase_of = [&](int i) { return ((it0 + i) / kStages) & 1u; };
      auto is_edge = [&](int i) { return (seg.blk_lo + i + 1) * kBlockN > min_limit; };

      // ---- loads (steps.cuh; a page outside the layer loads nothing, its rows come out NaN)
      auto load_content_half = [&](int i, int h, int32_t page) {
        seesaw::load_content_half(stage_of(i), full_of(i), maps, h, page, p.num_pages, s.bad_page);
      };
      auto load_rope_scale = [&](int i, int32_t page) {
        seesaw::load_rope_scale(stage_of(i), full_of(i), maps, page, p.num_pages, s.bad_page);
      };
      // Page ids of the refills, 32 at a time in the lanes of the refilling warp.
      int32_t page_lane = -1;
      int page_base = -1;
      auto page_of = [&](int blk) -> int32_t {
        const int base = blk & ~31;
        if (base != page_base) {
          page_base = base;
          page_lane = base + lane < n ? pages[base + lane] : -1;
        }
        return __shfl_sync(0xffffffffu, page_lane, blk & 31);
      };
      if (!kPv && tid == 0) {  // the first pages and the Q (the Q after kPagesBeforeQ pages)
        auto load_q = [&] {
          q_wait();
          load_q_tile(s, maps, row0);
        };
        const int first_pages = min(kStages, n);
        const int q_at = late_q_wait ? min(kPagesBeforeQ, first_pages) : 0;
        for (int i = 0; i < first_pages; ++i) {
          if (i == q_at) load_q();
          const int32_t page = pages[i];
          load_content_half(i, 0, page);
          load_content_half(i, 1, page);
          load_rope_scale(i, page);
        }
        if (q_at == first_pages) load_q();
      }
      if (!kPv && tid < kRowsM) {
        q_wait();
        const int fr = tile * kRowsM + tid;
        s.q_scale[tid] = fr < rows_total ? p.q_scale[int64_t{b} * rows_total + fr] : 0.f;
      }
      named_barrier_unaligned(kBarAll, kCtaThreads);

      if constexpr (!kPv) {
        // ================= S warpgroup wg: QK, softmax, P8 and statistics of blocks wg, wg + 2 ...
        mbar_wait(&s.q_bar, q_phase);
        const uint32_t stsm_off = p8_lane_offset_rows(lane, 16 * warp);
        const SmemDesc q_desc = make_desc_base(s.q_content[0], Swizzle::k128B, kChunkBytes);
        const SmemDesc qr_desc = make_desc_base(s.q_rope, Swizzle::k128B, kChunkBytes);
        float z[32];  // S of the block in hand (one accumulator)
        // ---- QK of block i into z: 16 FP8 steps over the content and 4 BF16 steps over the RoPE
        // Issued unconditionally (a wgmma under a branch ptxas cannot prove uniform serializes
        // every wgmma of the kernel, C7518): past the last block (real false) it reads a stage
        // no load writes any more, and its result is never used.
        auto issue_qk = [&](int i, bool real, float (&acc)[32]) {
          SharedStorage::Stage& st = stage_of(i);
          SEESAW_TRACE(i, kTrQkIssue);
          if (real) mbar_wait(full_of(i), phase_of(i));
          SEESAW_TRACE(i, kTrQkReady);
          // The page block i + kStages loads, for both refills (published with P8 of block i;
          // the slot's last reader, a PV warpgroup after its PV of block i - 8, passed
          // Pfree(i - 8), which this warpgroup waited for at block i - 4)
          if (real && warp == 0 && i + kStages < n) {
            const int32_t page = page_of(i + kStages);
            if (lane == 0) s.refill_page[i % kRefillSlots] = page;
          }
          // The Q descriptors from an opaque copy each block: hoisted out of the loop, their 20
          // 64-bit values took 40 of the warpgroup's registers (ptxas spilled them).
          SmemDesc qd = q_desc, qrd = qr_desc;
          asm volatile("" : "+r"(qd.lo), "+r"(qrd.lo));
          const SmemDesc k_desc = make_desc_base(st.content[0], Swizzle::k128B, kChunkBytes);
          const SmemDesc kr_desc = make_desc_base(st.rope, Swizzle::k128B, kChunkBytes);
          wgmma_fence();
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int k = 0; k < kQkChunkSteps; ++k) {
              const uint64_t da = qd.at(c * kTileBytes + 32 * k);
              const uint64_t db = k_desc.at(c * kTileBytes + 32 * k);
              if (c == 0 && k == 0) {
                wgmma_m64n64k32_e4m3_ss_init(acc, da, db);
              } else {
                wgmma_m64n64k32_e4m3_ss(acc, da, db, 1);
              }
            }
          }
#pragma unroll
          for (int k = 0; k < kRopeSteps; ++k) {
            wgmma_m64n64k16_bf16_ss(acc, qrd.at(32 * k), kr_desc.at(32 * k), 1);
          }
          wgmma_commit();
        };
        // A block's (or pair's) row statistics for the PV warpgroups and the epilogue
        auto write_stats = [&](RowStats& ps, const float (&m)[2], const float (&sg)[2],
                               const float (&ll)[2], const float (&gm)[2]) {
          if (t == 0) {
#pragma unroll
            for (int ri = 0; ri < 2; ++ri) {
              ps.m[r0 + 8 * ri] = m[ri];
              ps.sig[r0 + 8 * ri] = sg[ri];
              ps.l[r0 + 8 * ri] = ll[ri];
              ps.gamma[r0 + 8 * ri] = gm[ri];
            }
          }
        };
        if constexpr (kSolo) {
          // ---- one S warpgroup, both pages of pair j (2 j into z, 2 j + 1 into zb)
          float zb[32];
          const int n_pairs = (n + 1) / 2;
          float m_run[2] = {-INFINITY, -INFINITY}, sig_run[2] = {1.f, 1.f}, l_run[2] = {0.f, 0.f};
          issue_qk(0, true, z);
          issue_qk(1, 1 < n, zb);
          for (int j = 0; j < n_pairs; ++j) {
            const int ia = 2 * j, ib = ia + 1;
            const bool real_b = ib < n;
            SharedStorage::Stage& st_a = stage_of(ia);
            SharedStorage::Stage& st_b = stage_of(ib);
            wgmma_wait<0>();
            fence_regs(z);
            fence_regs(zb);
            SEESAW_TRACE(ia, kTrQkDone);
            // QK(j) done, so this warpgroup is past its softmax of pair j - 1: the RoPE tiles and
            // scales of its stages take pair j + 1's pages
            if (warp == 0 && lane == 0 && j >= 1) {
              if (ia + 2 < n) load_rope_scale(ia + 2, s.refill_page[(ia - 2) % kRefillSlots]);
              if (ib + 2 < n) load_rope_scale(ib + 2, s.refill_page[(ib - 2) % kRefillSlots]);
            }
            const int tok_a = (seg.blk_lo + ia) * kBlockN, tok_b = tok_a + kBlockN;
            const bool full_a = tok_a + kBlockN <= min_limit;
            const bool full_b = real_b && tok_b + kBlockN <= min_limit;
            float row_factor[2] = {s.q_scale[r0] * p.scale_log2, s.q_scale[r0 + 8] * p.scale_log2};
            const int limit[2] = {visibility_limit(p, tile * kRowsM + r0, seqlen),
                                  visibility_limit(p, tile * kRowsM + r0 + 8, seqlen)};
            // (page b past the segment: nothing visible)
            const int limit_b[2] = {real_b ? limit[0] : tok_b, real_b ? limit[1] : tok_b};
            float mx[2] = {-INFINITY, -INFINITY};
            auto logits = [&](float (&acc)[32], const float* scale, int tok0, bool full,
                              const int (&lim)[2]) {
              if (full) {
                seesaw::scaled_logits<4, true>(
                    acc, [&](int e) { return acc[e]; }, scale, t, tok0, lim, mx);
              } else {
                seesaw::scaled_logits<4, false>(
                    acc, [&](int e) { return acc[e]; }, scale, t, tok0, lim, mx);
              }
            };
            logits(z, st_a.scale, tok_a, full_a, limit);
            logits(zb, st_b.scale, tok_b, full_b, limit_b);
            float m_new[2], bias[2];
#pragma unroll
            for (int ri = 0; ri < 2; ++ri) {
              mx[ri] = quad_max(mx[ri]) * row_factor[ri];
              m_new[ri] = fmaxf(m_run[ri], mx[ri]);
              bias[ri] = kExpShift - (m_new[ri] == -INFINITY ? 0.f : m_new[ri]);
            }
            float e_sum[2] = {0.f, 0.f}, p_max[2] = {0.f, 0.f};
            exp_scaled<4>(full_a, z, row_factor, bias, st_a.scale, t, e_sum, p_max);
            exp_scaled<4>(full_b, zb, row_factor, bias, st_b.scale, t, e_sum, p_max);
            SEESAW_TRACE(ia, kTrExp);
            float sig[2], inv_sig[2], gamma[2], l[2];
#pragma unroll
            for (int ri = 0; ri < 2; ++ri) {
              e_sum[ri] = quad_sum(e_sum[ri] * kExpUnshift);
              p_max[ri] = quad_max(p_max[ri]);
              const float m_use = m_new[ri] == -INFINITY ? 0.f : m_new[ri];
              sig[ri] = fmaxf(p_max[ri] * kInvFp8Max, kMinProbScale);
              inv_sig[ri] = rcp_approx_ftz(sig[ri]);
              gamma[ri] = ex2_ftz(m_run[ri] - m_use) * (sig_run[ri] * inv_sig[ri]);
              l[ri] = fmaf(l_run[ri], gamma[ri], e_sum[ri] * inv_sig[ri]);
              m_run[ri] = m_new[ri];
              sig_run[ri] = sig[ri];
              l_run[ri] = l[ri];
            }
            uint32_t wa[2][4], wb[2][4];
            p8_words<2>(z, inv_sig, wa);
            p8_words<2>(zb, inv_sig, wb);
            SEESAW_TRACE(ia, kTrP8);
            // The PVs of pair j - 2 are done with these P buffers and statistics
            if (j >= 2) named_barrier(kBarPfree + (j & 1), kPfreeThreads);
            SEESAW_TRACE(ia, kTrPfree);
            store_p8<2>(smem_u32(s.p8[ia % kPBuffers]) + stsm_off, wa);
            store_p8<2>(smem_u32(s.p8[ib % kPBuffers]) + stsm_off, wb);
            write_stats(s.stats[ia % kPBuffers], m_new, sig, l, gamma);
            fence_proxy_async();  // P8 (generic stores) is read next by wgmma (async proxy)
            named_barrier_arrive(kBarPready + (j & 1), kPreadyThreads);
            SEESAW_TRACE(ia, kTrPublished);
            issue_qk(ia + 2, ia + 2 < n, z);
            issue_qk(ib + 2, ib + 2 < n, zb);
          }
          wgmma_wait<0>();  // the QKs past the last pair
        } else {
          issue_qk(wg, wg < n, z);
          for (int i = wg; i < n; i += 2) {
            SharedStorage::Stage& st = stage_of(i);
            wgmma_wait<0>();
            fence_regs(z);
            SEESAW_TRACE(i, kTrQkDone);
            // QK(i) done: every warp of this warpgroup issued it, so every warp is past its softmax
            // of block i - 2, the last read of that stage's RoPE tile and scales: refill them.
            if (warp == 0 && lane == 0 && i >= 2 && i + 2 < n) {
              load_rope_scale(i + 2, s.refill_page[(i - 2) % kRefillSlots]);
            }
            // ---- softmax (kernel.cuh's softmax_publish, one-term, two rows a thread)
            const int tok0 = (seg.blk_lo + i) * kBlockN;
            const bool full = tok0 + kBlockN <= min_limit;
            float row_factor[2] = {s.q_scale[r0] * p.scale_log2, s.q_scale[r0 + 8] * p.scale_log2};
            float mx[2] = {-INFINITY, -INFINITY};
            auto scaled_logits = [&](auto full_tag) {
              constexpr bool kFull = decltype(full_tag)::value;
              int limit[2];
              if constexpr (!kFull) {
                limit[0] = visibility_limit(p, tile * kRowsM + r0, seqlen);
                limit[1] = visibility_limit(p, tile * kRowsM + r0 + 8, seqlen);
              }
              seesaw::scaled_logits<4, kFull>(
                  z, [&](int e) { return z[e]; }, st.scale, t, tok0, limit, mx);
            };
            if (full) {
              scaled_logits(std::true_type{});
            } else {
              scaled_logits(std::false_type{});
            }
#pragma unroll
            for (int ri = 0; ri < 2; ++ri) {
              mx[ri] = quad_max(mx[ri]) * row_factor[ri];
            }
            // e = exp(z - m), P' = e s_k; invisible tokens exactly 0 (kernel.cuh says why). Under
            // kLocalMax m is the block's own row maximum mx (the exponentials do not wait for the
            // other S warpgroup's statistics), and c = exp(mx - m_new) scales P' and its sum after.
            float e_sum[2] = {0.f, 0.f}, p_max[2] = {0.f, 0.f};
            auto p_prime = [&](const float (&bias)[2]) {
              exp_scaled<4>(full, z, row_factor, bias, st.scale, t, e_sum, p_max);
              SEESAW_TRACE(i, kTrExp);
#pragma unroll
              for (int ri = 0; ri < 2; ++ri) {
                e_sum[ri] = quad_sum(e_sum[ri] * kExpUnshift);
                p_max[ri] = quad_max(p_max[ri]);
              }
            };
            if constexpr (kLocalMax) {
              const float bias[2] = {kExpShift - (mx[0] == -INFINITY ? 0.f : mx[0]),
                                     kExpShift - (mx[1] == -INFINITY ? 0.f : mx[1])};
              p_prime(bias);
            }
            // The previous block's statistics (the other S warpgroup's)
            float m_prev[2] = {-INFINITY, -INFINITY}, sig_prev[2] = {1.f, 1.f},
                  l_prev[2] = {0.f, 0.f};
            if (i > 0) {
              named_barrier(kBarStats + (i - 1) % 2, kStatsThreads);
              SEESAW_TRACE(i, kTrStats);
              const RowStats& ps = s.stats[(i - 1) % kPBuffers];
#pragma unroll
              for (int ri = 0; ri < 2; ++ri) {
                m_prev[ri] = ps.m[r0 + 8 * ri];
                sig_prev[ri] = ps.sig[r0 + 8 * ri];
                l_prev[ri] = ps.l[r0 + 8 * ri];
              }
            }
            float m_new[2], m_use[2];
#pragma unroll
            for (int ri = 0; ri < 2; ++ri) {
              m_new[ri] = fmaxf(m_prev[ri], mx[ri]);
              m_use[ri] = m_new[ri] == -INFINITY ? 0.f : m_new[ri];
            }
            if constexpr (!kLocalMax) {
              const float bias[2] = {kExpShift - m_use[0], kExpShift - m_use[1]};
              p_prime(bias);
            }
            float sig[2], inv_sig[2], gamma[2], l[2];
#pragma unroll
            for (int ri = 0; ri < 2; ++ri) {
              // kLocalMax's c (zero where the block shows the row nothing); 1 otherwise
              const float c_loc = !kLocalMax            ? 1.f
                                  : mx[ri] == -INFINITY ? 0.f
                                                        : ex2_ftz(mx[ri] - m_use[ri]);
              e_sum[ri] *= c_loc;
              p_max[ri] *= c_loc;
              sig[ri] = fmaxf(p_max[ri] * kInvFp8Max, kMinProbScale);
              inv_sig[ri] = rcp_approx_ftz(sig[ri]);
              gamma[ri] = ex2_ftz(m_prev[ri] - m_use[ri]) * (sig_prev[ri] * inv_sig[ri]);
              l[ri] = fmaf(l_prev[ri], gamma[ri], e_sum[ri] * inv_sig[ri]);
              inv_sig[ri] *= c_loc;
            }
            uint32_t w[2][4];
            p8_words<2>(z, inv_sig, w);
            SEESAW_TRACE(i, kTrP8);
            // SNAPMLA_SEESAW_ROLES_QK_AHEAD: z is free, so the next owned block's QK runs under
            // this block's publication (else it is issued after it).
            if constexpr (kQkAhead) issue_qk(i + 2, i + 2 < n, z);
            // The PVs of block i - kPBuffers are done with this P buffer and statistics
            if (i >= kPBuffers) named_barrier(kBarPfree + i % kPBuffers, kPfreeThreads);
            SEESAW_TRACE(i, kTrPfree);
            store_p8<2>(smem_u32(s.p8[i % kPBuffers]) + stsm_off, w);
            write_stats(s.stats[i % kPBuffers], m_new, sig, l, gamma);
            fence_proxy_async();  // P8 (generic stores) is read next by wgmma (async proxy)
            named_barrier_arrive(kBarPready + i % kPBuffers, kPreadyThreads);
            named_barrier_arrive(kBarStats + i % 2, kStatsThreads);
            SEESAW_TRACE(i, kTrPublished);
            if constexpr (!kQkAhead) issue_qk(i + 2, i + 2 < n, z);
          }
          wgmma_wait<0>();  // the QK past the last block
          // The last block's statistics instance needs this warpgroup's sync too.
          if (((n - 1) & 1) != wg) named_barrier(kBarStats + (n - 1) % 2, kStatsThreads);
        }  // kPair
      } else {
        // ================= PV warpgroup: O^T of latent half `half`, every block, then the epilogue
        const uint32_t ldsm_off[2] = {vt_lane_offset(lane, warp), vt_lane_offset(lane, warp + 4)};
        float o[kMTiles][kNRegs];
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
          for (int e = 0; e < kNRegs; ++e) o[m][e] = 0.f;
        }
        // V^T A fragments of m-tile m of this half of block i
        auto v_fragments = [&](int i, int m, auto edge_tag, uint32_t (&a)[2][4]) {
          const uint32_t addr = smem_u32(stage_of(i).content[2 * half + m / 2]) + ldsm_off[m & 1];
          constexpr bool kEdge = decltype(edge_tag)::value;
          const int valid = kEdge ? min(max(seqlen - (seg.blk_lo + i) * kBlockN, 0), kBlockN) : 0;
          vt_fragments_masked<kEdge>(addr, t, valid, a);
        };
        // O^T = gamma O^T + P8 V^T of block i: an m-tile at a time into one whole-N temporary;
        // the next m-tile's fragments are read (into the registers the finished wgmmas read)
        // under the promotion.
        auto pv_block = [&](int i, auto edge_tag) {
          const RowStats& ps = s.stats[i % kPBuffers];
          const SmemDesc p_desc = make_desc_base(s.p8[i % kPBuffers], Swizzle::k64B, kPRowBytes);
          uint32_t a[2][4];
          v_fragments(i, 0, edge_tag, a);
          auto promote = [&](int m, int col0, auto& tmp) {
            seesaw::promote_cols(o[m], col0, tmp, ps.gamma, t);
          };
          if constexpr (kPvHalves) {
            // SNAPMLA_SEESAW_ROLES_PV_HALVES: an m-tile as two half-N groups (query rows 0-31,
            // 32-63) into two temporaries, the first promoted while the second runs.
            constexpr int kHalfRows = 32 * kPRowBytes;
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
              float th[2][kNRegs / 2];
              wgmma_fence();
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                wgmma_pv<kN / 2, true>(th[h], a[0], p_desc.at(h * kHalfRows));
                wgmma_pv<kN / 2, false>(th[h], a[1], p_desc.at(h * kHalfRows + 32));
                wgmma_commit();
              }
              wgmma_wait<1>();
              promote(m, 0, th[0]);
              wgmma_wait<0>();
              fence_regs(th[1]);
              if (m + 1 < kMTiles) v_fragments(i, m + 1, edge_tag, a);
              promote(m, kNTiles / 2, th[1]);
            }
          } else {
            float tmp[kNRegs];
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
              wgmma_fence();
              wgmma_pv<kN, true>(tmp, a[0], p_desc.at(0));
              wgmma_pv<kN, false>(tmp, a[1], p_desc.at(32));
              wgmma_commit();
              wgmma_wait<0>();
              fence_regs(tmp);
              if (m + 1 < kMTiles) v_fragments(i, m + 1, edge_tag, a);
              promote(m, 0, tmp);
            }
          }
        };
        if constexpr (kPair) {
          // O^T = gamma O^T + V^T P^T over both pages of pair j: an m-tile's four k-steps into
          // one temporary, one promotion. Page b = 2 j + 1 may be past the segment (real_b
          // false): its fragments are zero and its P8 is 0.
          // One k-step's V^T A fragment of m-tile m of page i; kEdge: masked as
          // vt_fragments_masked masks (steps.cuh)
          auto kstep_fragment = [&](int i, int m, int ks, int valid, auto edge_tag,
                                    uint32_t (&a)[4]) {
            const uint32_t addr = smem_u32(stage_of(i).content[2 * half + m / 2]) + ldsm_off[m & 1];
            vt_fragment(addr + 32 * kChunkBytes * ks, a);
            if constexpr (decltype(edge_tag)::value) {
              uint32_t vmask[2];
              vt_kstep_masks(ks, t, valid, vmask);
              mask_vt_fragment(a, vmask);
            }
          };
          // An m-tile's four k-steps (page a's two, then page b's) through two fragment slots:
          // each slot is reloaded once the wgmma that read it completed (wait<1>), so one wgmma
          // stays queued while the next fragment is read; 8 fragment registers, not 16.
          auto pv_pair = [&](int j, bool real_b, auto edge_tag) {
            const int ia = 2 * j, ib = ia + 1;
            constexpr bool kEdge = decltype(edge_tag)::value;
            const int valid_a =
                kEdge ? min(max(seqlen - (seg.blk_lo + ia) * kBlockN, 0), kBlockN) : 0;
            const int valid_b =
                kEdge && real_b ? min(max(seqlen - (seg.blk_lo + ib) * kBlockN, 0), kBlockN) : 0;
            const RowStats& ps = s.stats[ia % kPBuffers];
            const SmemDesc pa = make_desc_base(s.p8[ia % kPBuffers], Swizzle::k64B, kPRowBytes);
            const SmemDesc pb = make_desc_base(s.p8[ib % kPBuffers], Swizzle::k64B, kPRowBytes);
            uint32_t a[2][4];
            kstep_fragment(ia, 0, 0, valid_a, edge_tag, a[0]);
            kstep_fragment(ia, 0, 1, valid_a, edge_tag, a[1]);
            float tmp[kNRegs];
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
              wgmma_fence();
              wgmma_pv<kN, true>(tmp, a[0], pa.at(0));
              wgmma_commit();
              wgmma_pv<kN, false>(tmp, a[1], pa.at(32));
              wgmma_commit();
              wgmma_wait<1>();
              kstep_fragment(ib, m, 0, valid_b, edge_tag, a[0]);
              wgmma_fence();
              wgmma_pv<kN, false>(tmp, a[0], pb.at(0));
              wgmma_commit();
              wgmma_wait<1>();
              kstep_fragment(ib, m, 1, valid_b, edge_tag, a[1]);
              wgmma_fence();
              wgmma_pv<kN, false>(tmp, a[1], pb.at(32));
              wgmma_commit();
              wgmma_wait<1>();
              if (m + 1 < kMTiles) kstep_fragment(ia, m + 1, 0, valid_a, edge_tag, a[0]);
              wgmma_wait<0>();
              fence_regs(tmp);
              if (m + 1 < kMTiles) kstep_fragment(ia, m + 1, 1, valid_a, edge_tag, a[1]);
              seesaw::promote_cols(o[m], 0, tmp, ps.gamma, t);
            }
          };
          const int n_pairs = (n + 1) / 2;
          for (int j = 0; j < n_pairs; ++j) {
            const int ia = 2 * j, ib = ia + 1;
            const bool real_b = ib < n;
            named_barrier(kBarPready + (j & 1), kPreadyThreads);
            mbar_wait(full_of(ia), phase_of(ia));
            if (real_b) mbar_wait(full_of(ib), phase_of(ib));
            ROLES_PV_TRACE(j, kTrPvStart);
            if (!real_b || is_edge(ib)) {  // (page a is an edge page only where b is)
              pv_pair(j, real_b, std::true_type{});
            } else {
              pv_pair(j, real_b, std::false_type{});
            }
            ROLES_PV_TRACE(j, kTrPvEnd);
            // (read before the arrival: the S warpgroups rewrite them after)
            const int32_t page_a =
                wtid == 0 && ia + kStages < n ? s.refill_page[ia % kRefillSlots] : -1;
            const int32_t page_b =
                wtid == 0 && ib + kStages < n ? s.refill_page[ib % kRefillSlots] : -1;
            if (j + 2 < n_pairs) named_barrier_arrive(kBarPfree + (j & 1), kPfreeThreads);
            ROLES_PV_TRACE(j, kTrPfreeArrived);
            if (wtid == 0 && ia + kStages < n) load_content_half(ia + kStages, half, page_a);
            if (wtid == 0 && ib + kStages < n) load_content_half(ib + kStages, half, page_b);
          }
        } else {
          for (int i = 0; i < n; ++i) {
            named_barrier(kBarPready + i % kPBuffers, kPreadyThreads);
            mbar_wait(full_of(i), phase_of(i));
            ROLES_PV_TRACE(i, kTrPvStart);
            if (is_edge(i)) {
              pv_block(i, std::true_type{});
            } else {
              pv_block(i, std::false_type{});
            }
            ROLES_PV_TRACE(i, kTrPvEnd);
            // (read before the arrival: the owner of block i + kPBuffers rewrites it after)
            const int32_t page =
                wtid == 0 && i + kStages < n ? s.refill_page[i % kRefillSlots] : -1;
            if (i + kPBuffers < n) named_barrier_arrive(kBarPfree + i % kPBuffers, kPfreeThreads);
            ROLES_PV_TRACE(i, kTrPfreeArrived);
            // Every warp's fragments of this half were read (its wgmmas completed): refill it.
            if (wtid == 0 && i + kStages < n) load_content_half(i + kStages, half, page);
          }
        }  // kPair
        if constexpr (SNAPMLA_PDL >= 2 && SNAPMLA_SEESAW_EARLY_TRIGGER != 0) {
          if (b == requests.end) griddep_launch_dependents();
        }
        // ---- epilogue (kernel.cuh's): row wtid's 1/l into a statistics buffer no block uses any
        // more ((n + half) % kPBuffers; the other PV warpgroup may still read gamma of block n - 4
        // there, not l), lse by half 0
        // (pairs: the last pair's statistics at its even buffer; 1 and 3 hold no pair's)
        const int res_buffer = kPair ? 1 + 2 * half : (n + half) % kPBuffers;
        {
          const RowStats& fin = s.stats[(kPair ? 2 * ((n - 1) / 2) : n - 1) % kPBuffers];
          RowStats& res_of = s.stats[res_buffer];
          const int fr = tile * kRowsM + wtid;
          if (wtid < kN && fr < rows_total) {
            const RowResult res =
                row_result(fin.l[wtid], fin.m[wtid], fin.sig[wtid], s.bad_page != 0, seg.split);
            res_of.l[wtid] = res.inv_l;
            if (half == 0) store_lse(p, b, fr, seg, res.lse);
          }
          named_barrier(kBarPvWg + half, kWgThreads);
        }
        store_o_rows(p, o, s.stats[res_buffer].l, b, tile, rows_total,
                     kHalfDim * half + 16 * warp + 2 * g, t, seg);
      }
      it += n;
      q_phase ^= 1;
      // Q, the ring, P8 and the statistics are free for the next request; bad_page was read.
      named_barrier_unaligned(kBarAll, kCtaThreads);
      if (!kPv && tid == 0) s.bad_page = 0;  // thread 0 issues the next request's first loads
    }
  };
  if (wg < kSWgs) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kSRegs) : "memory");
    run_requests(std::false_type{});
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kPvRegs) : "memory");
    run_requests(std::true_type{});
  }
  if constexpr (SNAPMLA_PDL >= 2) griddep_launch_dependents();
}

cudaError_t run(const DecodeParams& p, const TensorMaps& maps, cudaStream_t stream) {
  const cudaError_t err = cudaFuncSetAttribute(
      roles_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int{kSmemBytes});
  if (err != cudaSuccess) return err;
  return launch_dependent(roles_decode_kernel, dim3(p.num_parts, p.row_tiles), dim3(kCtaThreads),
                          kSmemBytes, stream, p, maps);
}

}  // namespace roles
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
