// How long a warpgroup is held while it issues wgmma.mma_async (session 37, bench/NOTES.md).
//
// The decode kernel's cycle budgets (../shared/KERNEL.md) count a block's QK (16 FP8 m64n64k32
// and 4 BF16 m64n64k16: ~640 tensor-pipe cycles) as time the issuing warpgroup can spend on
// other work. Session 37's phase-locked timeline says otherwise: two warpgroups issuing their
// QKs at once into an idle pipe took ~1,140 cycles to get past the last wgmma. This probe
// measures it alone: in one CTA, warpgroup w (of `issuing`) issues `n` wgmmas back to back into
// one accumulator, warp 0 of each reading clock64 before the first issue, after the last (the
// issue time) and after wgmma.wait_group 0 (issue + completion). Operands are zeros in shared
// memory (the 128-byte swizzle and the descriptor moves of the kernel's QK); only time counts.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -Icpp -Iinclude \
//        bench/wgmma_issue_probe.cu -o wgmma_issue_probe && ./wgmma_issue_probe
//
// Modes, for n = 1, 2, 4, 8, 16 and 20 wgmmas: `ss` FP8 m64n64k32 with both operands in shared
// memory (the QK's), `rs` FP8 m64n64k32 with A in registers (the PV's), each with one or two
// warpgroups issuing at once, and `behind`: warpgroup 1 issues 20 SS wgmmas, then warpgroup 0
// issues its n (the QK of one warpgroup behind the other's in the in-order pipe).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "decode/sm90.cuh"
#include "decode/wgmma_ops.cuh"

using namespace snapmla;

constexpr int kReps = 16;
constexpr int kChunk = 128, kRows = 64;
enum Mode { kSs = 0, kRs = 1, kBehind = 2 };

// out[(rep * 2 + wg) * 2 + {0, 1}] = issue cycles, issue + completion cycles (warp 0 of wg).
template <int kN>
__global__ void __launch_bounds__(256, 1) issue_kernel(int mode, int issuing, long long* out,
                                                       float* sink) {
  __shared__ __align__(1024) uint8_t a_tile[kRows * kChunk];
  __shared__ __align__(1024) uint8_t b_tile[kRows * kChunk];
  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  for (int i = tid; i < kRows * kChunk / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(a_tile)[i] = 0;
    reinterpret_cast<uint32_t*>(b_tile)[i] = 0;
  }
  sm90::fence_proxy_async();
  __syncthreads();
  const sm90::SmemDesc a_desc = sm90::make_desc_base(a_tile, sm90::Swizzle::k128B, kChunk);
  const sm90::SmemDesc b_desc = sm90::make_desc_base(b_tile, sm90::Swizzle::k128B, kChunk);
  const uint32_t a_regs[4] = {0, 0, 0, 0};
  float acc[32];
  float keep = 0.f;
  // Warpgroup w's n wgmmas (SS or RS), timed by its warp 0.
  auto timed_issue = [&](int rep, auto n_tag, auto rs_tag) {
    constexpr int kCount = decltype(n_tag)::value;
    constexpr bool kRsForm = decltype(rs_tag)::value;
    const long long t0 = clock64();
    sm90::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kCount; ++k) {
      const uint64_t db = b_desc.at(32 * (k % 4));
      if constexpr (kRsForm) {
        if (k == 0) {
          sm90::wgmma_m64n64k32_e4m3_rs_init(acc, a_regs, db);
        } else {
          sm90::wgmma_m64n64k32_e4m3_rs(acc, a_regs, db, 1);
        }
      } else {
        const uint64_t da = a_desc.at(32 * (k % 4));
        if (k == 0) {
          sm90::wgmma_m64n64k32_e4m3_ss_init(acc, da, db);
        } else {
          sm90::wgmma_m64n64k32_e4m3_ss(acc, da, db, 1);
        }
      }
    }
    const long long t1 = clock64();
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(acc);
    const long long t2 = clock64();
    if (tid % 128 == 0) {
      out[(rep * 2 + wg) * 2 + 0] = t1 - t0;
      out[(rep * 2 + wg) * 2 + 1] = t2 - t0;
    }
    keep += acc[0];
  };
  for (int rep = 0; rep < kReps; ++rep) {
    __syncthreads();
    if (mode == kBehind) {
      // Warpgroup 1 queues 20 SS wgmmas, then lets warpgroup 0 issue its n behind them.
      if (wg == 1) {
        sm90::wgmma_fence();
#pragma unroll
        for (int k = 0; k < 20; ++k) {
          sm90::wgmma_m64n64k32_e4m3_ss(acc, a_desc.at(32 * (k % 4)), b_desc.at(32 * (k % 4)),
                                        k > 0);
        }
        sm90::wgmma_commit();
        sm90::named_barrier_arrive(1, 256);
        sm90::wgmma_wait<0>();
        sm90::fence_regs(acc);
        keep += acc[1];
      } else {
        sm90::named_barrier(1, 256);
        timed_issue(rep, std::integral_constant<int, kN>{}, std::false_type{});
      }
    } else if (wg < issuing) {
      if (mode == kRs) {
        timed_issue(rep, std::integral_constant<int, kN>{}, std::true_type{});
      } else {
        timed_issue(rep, std::integral_constant<int, kN>{}, std::false_type{});
      }
    }
  }
  if (keep == 12345.f) sink[tid] = keep;  // (never: keeps the accumulators live)
}

template <int kN>
void run(int mode, int issuing, long long* d_out, float* d_sink) {
  std::vector<long long> h(kReps * 4, -1);
  cudaMemset(d_out, 0xff, sizeof(long long) * kReps * 4);
  issue_kernel<kN><<<1, 256>>>(mode, issuing, d_out, d_sink);
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("error: %s\n", cudaGetErrorString(err));
    std::exit(1);
  }
  cudaMemcpy(h.data(), d_out, sizeof(long long) * h.size(), cudaMemcpyDeviceToHost);
  const char* names[] = {"ss", "rs", "behind"};
  for (int wg = 0; wg < 2; ++wg) {
    std::vector<long long> issue, total;
    for (int rep = 2; rep < kReps; ++rep) {  // (the first two warm the instruction cache)
      if (h[(rep * 2 + wg) * 2] < 0) continue;
      issue.push_back(h[(rep * 2 + wg) * 2]);
      total.push_back(h[(rep * 2 + wg) * 2 + 1]);
    }
    if (issue.empty()) continue;
    std::sort(issue.begin(), issue.end());
    std::sort(total.begin(), total.end());
    std::printf("%-7s wgs %d  n %2d  wg %d: issue %6lld cycles (min %6lld), issue + done %6lld"
                " (min %6lld); %5.1f cycles a wgmma issued\n",
                names[mode], mode == kBehind ? 2 : issuing, kN, wg, issue[issue.size() / 2],
                issue[0], total[total.size() / 2], total[0],
                double(issue[issue.size() / 2]) / kN);
  }
}

template <int kN>
void run_all(long long* d_out, float* d_sink) {
  run<kN>(kSs, 1, d_out, d_sink);
  run<kN>(kSs, 2, d_out, d_sink);
  run<kN>(kRs, 1, d_out, d_sink);
  run<kN>(kRs, 2, d_out, d_sink);
  run<kN>(kBehind, 2, d_out, d_sink);
}

int main() {
  long long* d_out;
  float* d_sink;
  cudaMalloc(&d_out, sizeof(long long) * kReps * 4);
  cudaMalloc(&d_sink, sizeof(float) * 256);
  std::printf("wgmma issue probe: one CTA, FP8 m64n64k32 (64 x 64 x 32: ~32 tensor cycles at"
              " the dense FP8 rate), medians of %d repetitions in one launch\n", kReps - 2);
  run_all<1>(d_out, d_sink);
  run_all<2>(d_out, d_sink);
  run_all<4>(d_out, d_sink);
  run_all<8>(d_out, d_sink);
  run_all<16>(d_out, d_sink);
  run_all<20>(d_out, d_sink);
  return 0;
}
