// The seesaw kernel alone, on the GPU machine: time per launch and per 64-token block, and the
// timeline of one CTA (clock64 at each event of bench/NOTES.md's schedule, both warpgroups).
//
//   nvcc -DSNAPMLA_SEESAW_TRACE -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -Icpp \
//        -Iinclude bench/seesaw_trace.cu cpp/decode/plan.cu cpp/decode/combine.cu cpp/decode/seesaw/launch.cu \
//        cpp/decode/seesaw/instantiations/n*.cu cpp/quantize/quantize_q.cu -o seesaw_trace
//   ./seesaw_trace [batch] [heads] [seqlen] [q_len] [min_part_cost]
//   SNAPMLA_TRACE_TWO_TERM=1 ./seesaw_trace ...   # the two-term query (q_len x heads <= 32)
//   SNAPMLA_TRACE_PART_WAVES=2 ./seesaw_trace ... # twice the split count (two waves of CTAs)
//   SNAPMLA_TRACE_POOL_TABLE=1 ./seesaw_trace ... # every request's table over the same 64 pages
//                                                 # (L2-resident: the kernel without HBM reads)
//   SNAPMLA_TRACE_REPS=5000 ./seesaw_trace ...    # launches a figure (50)
//   SNAPMLA_TRACE_WITH_QQUANT=1 ./seesaw_timeline ... # the traced launch after its Q-quant
//                                                 # kernel (two-term: the two-term one), as in a
//                                                 # decode call (PDL), not alone
//
// Inputs are random bytes in range (no NaN codes, positive scales), the schedule is the
// library's default (plan.cu) unless min_part_cost is given; the time is the attention kernel's
// own, then with the split combine, then the whole decode call's launches (the Q-quant kernel
// on a BF16 query first; where decode.h's seesaw_fuses_q, none: the attention kernel quantizes).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/numerics.cuh"
#include "decode/decode.h"
#include "decode/seesaw/kernel.cuh"
#include "cuda_check.h"

using namespace snapmla;
using namespace snapmla::decode;

#define CHECK(x) SNAPMLA_BENCH_CHECK(x, 2)

template <class T>
static T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// The library's (cpp/api/api.cu) for the Q-quant launcher, uncached here.
cudaError_t snapmla::current_device_sm_count(int* sm_count) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device);
}

static uint16_t bf16_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// An environment switch: on where it is set to "1".
static bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 32;
  const int heads = argc > 2 ? std::atoi(argv[2]) : 128;
  const int seqlen = argc > 3 ? std::atoi(argv[3]) : 16384;
  const int q_len = argc > 4 ? std::atoi(argv[4]) : 1;
  const int min_part_cost = argc > 5 ? std::atoi(argv[5]) : kMinPartCost;
  const int rows = q_len * heads, row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int pages_per_req = (seqlen + kBlockN - 1) / kBlockN;
  const int num_pages = batch * pages_per_req;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // SNAPMLA_TRACE_PART_WAVES=k: k times the default split count, k waves of CTAs (shorter
  // chains of blocks per CTA: the question whether PV into O^T pays at long contexts that way)
  const char* waves_env = std::getenv("SNAPMLA_TRACE_PART_WAVES");
  const int waves = waves_env != nullptr ? std::max(1, std::atoi(waves_env)) : 1;
  const int parts = waves * default_num_parts(sms, row_tiles);
  std::printf("batch %d heads %d seqlen %d q_len %d: %d pages, %d parts x %d row tiles\n", batch,
              heads, seqlen, q_len, num_pages, parts, row_tiles);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> code(0x20, 0x48);  // E4M3 magnitudes 2^-4 .. 4
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  // 64 random pages, repeated: generating every page of a 32768-page cache took ~14 s of the
  // GPU machine's time per run; the kernel's timing does not depend on the values.
  constexpr int kPool = 64;
  // SNAPMLA_TRACE_POOL_TABLE=1: the cache holds only the pool, and block table entry i is page
  // i % 64, so every page a CTA reads is in L2 after the first launch: what the kernel's chain
  // takes when HBM is not what it waits for (session 40's question: how fast the N = 32 and
  // N = 64 chains run per tile-block).
  const bool pool_table = env_on("SNAPMLA_TRACE_POOL_TABLE");
  const int cache_pages = pool_table ? std::min(num_pages, kPool) : num_pages;
  if (pool_table) std::printf("pool table: every request reads the same %d pages\n", cache_pages);
  std::vector<uint8_t> cache(static_cast<size_t>(cache_pages) * kPageBytes);
  for (int pg = 0; pg < std::min(num_pages, kPool); ++pg) {
    uint8_t* page = cache.data() + static_cast<size_t>(pg) * kPageBytes;
    for (int i = 0; i < kBlockN * kContentDim; ++i) page[i] = code(rng) | (rng() & 0x80);
    uint16_t* rope = reinterpret_cast<uint16_t*>(page + kPageRopeOffset);
    for (int i = 0; i < kBlockN * kRopeDim; ++i) rope[i] = bf16_of(uni(rng));
    float* scale = reinterpret_cast<float*>(page + kPageScaleOffset);
    for (int i = 0; i < kBlockN; ++i) scale[i] = 0.01f * (1.5f + uni(rng));
  }
  for (int pg = kPool; pg < cache_pages; ++pg) {
    std::memcpy(cache.data() + static_cast<size_t>(pg) * kPageBytes,
                cache.data() + static_cast<size_t>(pg % kPool) * kPageBytes, kPageBytes);
  }
  std::vector<int32_t> table(static_cast<size_t>(batch) * pages_per_req);
  for (size_t i = 0; i < table.size(); ++i)
    table[i] = static_cast<int32_t>(pool_table ? i % kPool : i);
  std::vector<int32_t> lens(batch, seqlen);
  std::vector<uint8_t> qc(static_cast<size_t>(batch) * rows * kContentDim);
  for (auto& x : qc) x = code(rng) | (rng() & 0x80);
  std::vector<uint16_t> qr(static_cast<size_t>(batch) * rows * kRopeDim);
  for (auto& x : qr) x = bf16_of(uni(rng));
  std::vector<float> qs(static_cast<size_t>(batch) * rows, 0.01f);
  // The two-term query (issue 9): a low row of the same codes at 1/16 of the scale.
  const bool two_term = env_on("SNAPMLA_TRACE_TWO_TERM");
  if (two_term) std::printf("two-term query (q_lo, rho = 1/16)\n");
  std::vector<float> qs_lo(static_cast<size_t>(batch) * rows, 0.01f / 16);
  // The BF16 query of the decode call's Q quantization ([b, s_q, h, 576], contiguous).
  std::vector<uint16_t> q_bf16(static_cast<size_t>(batch) * rows * (kContentDim + kRopeDim));
  for (auto& x : q_bf16) x = bf16_of(uni(rng));

  const WorkspaceLayout w = WorkspaceLayout::make(batch, q_len, heads, parts);
  uint8_t* ws = nullptr;
  CHECK(cudaMalloc(&ws, w.total_bytes));
  const PlanLayout pl = PlanLayout::make(batch, parts);
  int32_t* plan = nullptr;
  CHECK(cudaMalloc(&plan, pl.total_words * 4));
  uint16_t* out = nullptr;
  float* lse = nullptr;
  CHECK(cudaMalloc(&out, static_cast<size_t>(batch) * rows * kContentDim * 2));
  CHECK(cudaMalloc(&lse, static_cast<size_t>(batch) * rows * 4));
  unsigned long long* trace = nullptr;
  const size_t trace_words = 2 * seesaw::kTraceBlocks * seesaw::kTrEvents;
  CHECK(cudaMalloc(&trace, trace_words * 8));

  DecodeParams p{};
  p.q_content = upload(qc);
  p.q_rope = upload(qr);
  p.q_scale = upload(qs);
  p.layer_base = upload(cache);
  p.num_pages = cache_pages;
  p.page_stride = kPageBytes;  // packed pages (the TMA maps take it)
  p.block_table = upload(table);
  p.block_table_stride = pages_per_req;
  p.seqlens = upload(lens);
  p.plan = plan;
  p.batch = batch;
  p.q_len = q_len;
  p.num_heads = heads;
  p.max_pages = pages_per_req;
  p.num_parts = parts;
  p.row_tiles = row_tiles;
  p.causal = 1;
  p.scale_log2 = 0.0722f * kLog2e;
  p.out = out;
  p.lse = lse;
  p.partial_o = reinterpret_cast<float*>(ws + w.partial_o);
  p.partial_lse = reinterpret_cast<float*>(ws + w.partial_lse);
  if (two_term) {
    p.q_lo = upload(qc);
    p.q_lo_scale = upload(qs_lo);
  }
  const int ctas = parts * row_tiles;
  unsigned long long* cta_trace = nullptr;
  CHECK(cudaMalloc(&cta_trace, size_t{3} * ctas * 8));
#ifdef SNAPMLA_SEESAW_TRACE
  p.trace = trace;
  p.cta_trace = cta_trace;
#endif
  QuantizeQParams qp{};
  qp.q = upload(q_bf16);
  qp.stride_head = kContentDim + kRopeDim;
  qp.stride_token = int64_t{heads} * qp.stride_head;
  qp.stride_batch = q_len * qp.stride_token;
  qp.num_tokens = int64_t{batch} * q_len;
  qp.q_len = q_len;
  qp.num_heads = heads;
  // Its outputs apart from the random Q the attention kernel reads (same sizes, same traffic),
  // so that every line times the same attention inputs.
  CHECK(cudaMalloc(&qp.q_content, qc.size()));
  CHECK(cudaMalloc(&qp.q_rope, qr.size() * 2));
  CHECK(cudaMalloc(&qp.q_scale, qs.size() * 4));
  const bool fused_q =
      !two_term && seesaw_fuses_q(seesaw_pv_width(int64_t{q_len} * heads));
  if (fused_q) p.q_in = qp;
  CHECK(launch_plan(p.seqlens, batch, q_len, heads, pages_per_req, parts, min_part_cost, plan, 0));
  for (int i = 0; i < 3; ++i) CHECK(launch_seesaw_decode(p, 0));
  CHECK(cudaDeviceSynchronize());

  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  // SNAPMLA_TRACE_REPS: launches a figure (50; thousands keep the GPU under load for seconds,
  // for sampling its clock and power from outside)
  const char* reps_env = std::getenv("SNAPMLA_TRACE_REPS");
  const int reps = reps_env != nullptr ? std::max(1, std::atoi(reps_env)) : 50;
  // Microseconds per repetition of `launches` (back to back, reps times, timed by events).
  auto us_per_rep = [&](auto launches) {
    CHECK(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) launches();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return 1e3 * ms / reps;
  };
  const double us = us_per_rep([&] { CHECK(launch_seesaw_decode(p, 0)); });
  const double tile_blocks = double(batch) * pages_per_req * row_tiles;
  std::printf("kernel %.1f us; %.0f tile-blocks per SM; %.0f ns per tile-block per SM (%.0f cycles "
              "at 1.78 GHz)\n",
              us, tile_blocks / sms, 1e3 * us / (tile_blocks / sms),
              1.78e3 * us / (tile_blocks / sms));

  std::printf("kernel + combine %.1f us (min part cost %d)\n", us_per_rep([&] {
                CHECK(launch_seesaw_decode(p, 0));
                CHECK(launch_combine(p, 0));
              }),
              min_part_cost);

  // The combine alone, back to back over the partials the last launch left (its L2 state
  // then is not the one after an attention launch: a floor, not the cost in the call).
  std::printf("combine alone %.1f us\n", us_per_rep([&] { CHECK(launch_combine(p, 0)); }));

  // A decode call's launches: Q-quant (unless fused), attention, combine. (Two-term: its Q-quant
  // is not the one timed here; the line is left out.)
  if (!two_term) {
    std::printf("decode call %.1f us (%s)\n", us_per_rep([&] {
                  if (!fused_q) CHECK(launch_quantize_q(qp, 0));
                  CHECK(launch_seesaw_decode(p, 0));
                  CHECK(launch_combine(p, 0));
                }),
                fused_q ? "fused Q: attention + combine" : "Q-quant + attention + combine");
  }

  // The two-term call against the one-term call (issue 9's cost), alternating five times so
  // that the clocks drift alike for both: each with its own Q-quant kernel (unless the one-term
  // kernel fuses it), attention and combine; and the attention kernel alone. At N = 16 and 32
  // both run the same kernel (SNAPMLA_SEESAW_SPREAD16, SPREAD32), the one-term call with zero
  // low rows.
  QuantizeQParams qp2 = qp;  // the two-term query's Q-quant (also before the traced launch)
  if (two_term) {
    CHECK(cudaMalloc(&qp2.q_lo, qc.size()));
    CHECK(cudaMalloc(&qp2.q_lo_scale, qs.size() * 4));
    DecodeParams p1 = p;
    p1.q_lo = nullptr;
    p1.q_lo_scale = nullptr;
    auto median_of = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    // One call's launches: the Q-quant kernel of q (none where q is null), the attention, the
    // combine of d.
    auto call_us = [&](const QuantizeQParams* q, const DecodeParams& d) {
      return us_per_rep([&] {
        if (q != nullptr) CHECK(launch_quantize_q(*q, 0));
        CHECK(launch_seesaw_decode(d, 0));
        CHECK(launch_combine(d, 0));
      });
    };
    std::vector<double> call1, call2, kern1, kern2, mixed_q2, mixed_a2;
    for (int k = 0; k < 5; ++k) {
      call1.push_back(call_us(fused_q ? nullptr : &qp, p1));
      call2.push_back(call_us(&qp2, p));
      // the two-term Q-quant kernel before the one-term attention, and the reverse: which of
      // the two carries the call's difference
      mixed_q2.push_back(call_us(&qp2, p1));
      mixed_a2.push_back(call_us(&qp, p));
      kern1.push_back(us_per_rep([&] { CHECK(launch_seesaw_decode(p1, 0)); }));
      kern2.push_back(us_per_rep([&] { CHECK(launch_seesaw_decode(p, 0)); }));
    }
    std::printf("two-term against one-term, medians of 5 alternating: decode call %.1f -> %.1f us "
                "(%.3fx), attention alone %.1f -> %.1f us (%.3fx)\n",
                median_of(call1), median_of(call2), median_of(call2) / median_of(call1),
                median_of(kern1), median_of(kern2), median_of(kern2) / median_of(kern1));
    std::printf("two-term mixed calls: two-term Q-quant + one-term attention %.1f us, one-term "
                "Q-quant + two-term attention %.1f us\n",
                median_of(mixed_q2), median_of(mixed_a2));
    std::printf("two-term Q-quant alone %.2f us, one-term %.2f us\n",
                us_per_rep([&] { CHECK(launch_quantize_q(qp2, 0)); }),
                us_per_rep([&] { CHECK(launch_quantize_q(qp, 0)); }));
  }

  CHECK(cudaMemset(trace, 0, trace_words * 8));
  CHECK(cudaMemset(cta_trace, 0, size_t{3} * ctas * 8));
  // SNAPMLA_TRACE_WITH_QQUANT=1: the traced launch as in a decode call, after its Q-quant kernel
  // (under SNAPMLA_PDL the attention kernel starts while that kernel runs and waits for it before
  // reading the query); the events then time both (the Q-quant kernel's end is in q_waited).
  const bool with_qquant = env_on("SNAPMLA_TRACE_WITH_QQUANT");
  CHECK(cudaEventRecord(e0));
  if (with_qquant && !fused_q) CHECK(launch_quantize_q(two_term ? qp2 : qp, 0));
  CHECK(launch_seesaw_decode(p, 0));
  CHECK(cudaEventRecord(e1));
  CHECK(cudaDeviceSynchronize());
  {
    float one_ms = 0;
    CHECK(cudaEventElapsedTime(&one_ms, e0, e1));
    std::vector<unsigned long long> ct(size_t{3} * ctas);
    CHECK(cudaMemcpy(ct.data(), cta_trace, ct.size() * 8, cudaMemcpyDeviceToHost));
    // Trace builds stamp every CTA's entry and end (globaltimer ns); other builds leave zeros.
    if (ct[0] != 0) {
      std::vector<double> entry, end, life;
      unsigned long long t_first = ~0ull, t_last = 0;
      for (int c = 0; c < ctas; ++c) t_first = std::min(t_first, ct[3 * c]);
      for (int c = 0; c < ctas; ++c) {
        entry.push_back(1e-3 * double(ct[3 * c] - t_first));
        end.push_back(1e-3 * double(ct[3 * c + 1] - t_first));
        life.push_back(1e-3 * double(ct[3 * c + 1] - ct[3 * c]));
        t_last = std::max(t_last, ct[3 * c + 1]);
      }
      auto pct = [](std::vector<double> v, double q) {
        std::sort(v.begin(), v.end());
        return v[std::min(v.size() - 1, size_t(q * (v.size() - 1) + 0.5))];
      };
      auto row = [&](const char* what, const std::vector<double>& v) {
        std::printf("  %-24s min %6.2f  p10 %6.2f  p50 %6.2f  p90 %6.2f  max %6.2f us\n", what,
                    pct(v, 0), pct(v, 0.1), pct(v, 0.5), pct(v, 0.9), pct(v, 1));
      };
      std::printf("one launch: %.2f us by events; first CTA entry to last CTA end %.2f us (%d CTAs)\n",
                  1e3 * one_ms, 1e-3 * double(t_last - t_first), ctas);
      row("CTA entry after first", entry);
      row("CTA end after first", end);
      row("CTA lifetime", life);
    }
  }
  std::vector<unsigned long long> tr(trace_words);
  CHECK(cudaMemcpy(tr.data(), trace, trace_words * 8, cudaMemcpyDeviceToHost));
  unsigned long long t0 = ~0ull;
  for (auto v : tr)
    if (v && v < t0) t0 = v;
  const char* names[] = {"qk_issue", "qk_ready", "qk_done", "stats", "exp", "p8", "pfree",
                         "published", "wg_synced", "early_done", "pfree_arrived", "refill", "pv_start", "pv_end",
                         "entry", "q_arrived", "epilogue_start", "epilogue_done",
                         "plan_checked", "segment", "loads_issued", "page_read", "q_waited",
                         "q_issued", "load_issue", "load_done"};
  static_assert(sizeof(names) / sizeof(names[0]) == seesaw::kTrEvents, "a name per event");
  std::printf("CTA (0,0) timeline, cycles from its first event (wg: block: event=cycle ...)\n");
  for (int b = 0; b < 24 && b < seesaw::kTraceBlocks; ++b) {
    for (int wg = 0; wg < 2; ++wg) {
      std::printf("wg%d blk%2d:", wg, b);
      for (int e = 0; e < seesaw::kTrEvents; ++e) {
        const unsigned long long v = tr[(wg * seesaw::kTraceBlocks + b) * seesaw::kTrEvents + e];
        if (v) std::printf(" %s=%llu", names[e], v - t0);
      }
      std::printf("\n");
    }
  }
  return 0;
}
