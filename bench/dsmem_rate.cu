// What merging a request's split partials inside a thread-block cluster would cost (issue 7,
// session 20): at 8x1x128x4096 a CTA's epilogue stores 128 KB of fp32 partials (O / l of 64 rows
// x 512 columns) in ~3,450 cycles and the combine kernel reads them back ~7 us after the grid;
// a cluster of the request's C parts could instead leave each partial in its CTA's shared memory
// and merge it there. This measures the data movement alone, one CTA an SM (200 KB of shared
// memory, 256 threads), each CTA holding a [64 rows][512] fp32 tile:
//
//   0 dsmem-pull   cluster sync; CTA rank j reads rows [64 j / C, 64 (j + 1) / C) of every
//                  CTA's tile (its own included) through distributed shared memory, float4
//                  loads, all of a thread's loads in flight; sums them; cluster sync
//   1 l2-pull      each CTA stores its tile to global memory, cluster sync, then reads the same
//                  row slices of every CTA's tile there (an in-kernel combine through L2)
//
// Cycles (clock64, median over the grid's CTAs): the tile's write, the first cluster sync, the
// reads, the second sync; and the kernel's time by events (back-to-back launches).
//
// On the H200 (session 20, bench/results/2026-12-02-s20/dsmem-rate-12d1026.txt): the reads took
// 3,575 / 6,428 / 10,923 cycles at C = 2 / 4 / 8 (36 -> 12 bytes a cycle and SM: distributed
// shared memory slows as the cluster grows), against 2,300-3,650 through L2 after a 5,800-cycle
// store; and with 200 KB of shared memory a CTA only 120 SMs take clusters of 4 or 8 (15 x 8,
// 30 x 4), 132 of 2. The cluster merge built on this (SNAPMLA_CLUSTER_MERGE, session 20) was
// correct but 1.0-2.0x slower: removed (bench/NOTES.md).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 bench/dsmem_rate.cu -o dsmem_rate
//   ./dsmem_rate [reps]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

namespace cg = cooperative_groups;

#define CHECK(x) SNAPMLA_BENCH_CHECK(x, 1)

constexpr int kThreads = 256;
constexpr int kRows = 64, kCols = 512;
constexpr int kTileFloats = kRows * kCols;  // 128 KB
constexpr int kSmemBytes = 200 * 1024;       // one CTA an SM, as the seesaw kernel
constexpr int kStamps = 5;

template <int kC, int kVariant>
__global__ void __launch_bounds__(kThreads, 1)
    merge_kernel(float* __restrict__ scratch, float* __restrict__ sink, long long* stamps) {
  extern __shared__ __align__(1024) float tile[];
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const unsigned rank = cluster.block_rank();
  const long long t0 = clock64();
  // The CTA's partial: [64 rows][512] fp32 (a value per CTA and column, so sums are checkable).
  float* mine = scratch + int64_t{blockIdx.x} * kTileFloats;
  for (int i = tid * 4; i < kTileFloats; i += kThreads * 4) {
    const float4 v = make_float4(blockIdx.x + 1e-3f * i, 1.f, 2.f, 3.f);
    if (kVariant == 0) {
      *reinterpret_cast<float4*>(tile + i) = v;
    } else {
      *reinterpret_cast<float4*>(mine + i) = v;
    }
  }
  const long long t1 = clock64();
  cluster.sync();
  const long long t2 = clock64();
  // Rows [rank R, rank R + R) of every CTA of the cluster: R x 128 float4 a CTA, R / 2 a thread.
  constexpr int kR = kRows / kC, kPerThread = kR * (kCols / 4) / kThreads;
  static_assert(kPerThread >= 1, "at least one float4 a thread and CTA");
  float4 acc[kPerThread];
  for (int k = 0; k < kPerThread; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int cluster_base = blockIdx.x - rank;
  float4 v[kC][kPerThread];
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const float* src;
    if (kVariant == 0) {
      src = cluster.map_shared_rank(tile, c);
    } else {
      src = scratch + int64_t{cluster_base + c} * kTileFloats;
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int idx = rank * kR * kCols + (k * kThreads + tid) * 4;
      v[c][k] = *reinterpret_cast<const float4*>(src + idx);
    }
  }
#pragma unroll
  for (int c = 0; c < kC; ++c) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      acc[k].x += v[c][k].x;
      acc[k].y += v[c][k].y;
      acc[k].z += v[c][k].z;
      acc[k].w += v[c][k].w;
    }
  }
  const long long t3 = clock64();
  cluster.sync();  // no CTA leaves while a peer still reads its shared memory
  const long long t4 = clock64();
  for (int k = 0; k < kPerThread; ++k) {
    reinterpret_cast<float4*>(sink)[int64_t{blockIdx.x} * kPerThread * kThreads + k * kThreads +
                                    tid] = acc[k];
  }
  if (tid == 0) {
    long long* st = stamps + int64_t{blockIdx.x} * kStamps;
    st[0] = t1 - t0;
    st[1] = t2 - t1;
    st[2] = t3 - t2;
    st[3] = t4 - t3;
    st[4] = t4 - t0;
  }
}

template <int kC, int kVariant>
void run(int sms, int reps) {
  auto kernel = merge_kernel<kC, kVariant>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const int ctas = sms / kC * kC;
  float *scratch, *sink;
  long long* stamps;
  CHECK(cudaMalloc(&scratch, size_t{ctas} * kTileFloats * 4));
  CHECK(cudaMalloc(&sink, size_t{ctas} * kTileFloats * 4));
  CHECK(cudaMalloc(&stamps, size_t{ctas} * kStamps * 8));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kC;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int max_clusters = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &cfg));
  for (int i = 0; i < 3; ++i) CHECK(cudaLaunchKernelEx(&cfg, kernel, scratch, sink, stamps));
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) CHECK(cudaLaunchKernelEx(&cfg, kernel, scratch, sink, stamps));
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  std::vector<long long> st(size_t{ctas} * kStamps);
  CHECK(cudaMemcpy(st.data(), stamps, st.size() * 8, cudaMemcpyDeviceToHost));
  // Check one CTA's sums: column 0 of its first row slice sums (cta + 1e-3 idx) over the cluster.
  std::vector<float> out(size_t{ctas} * kTileFloats);
  CHECK(cudaMemcpy(out.data(), sink, out.size() * 4, cudaMemcpyDeviceToHost));
  const int cta = ctas > kC ? kC + 1 : 0, rank = cta % kC, base = cta - rank;
  constexpr int kR = kRows / kC;
  double want = 0.0;
  for (int c = 0; c < kC; ++c) want += (base + c) + 1e-3 * (rank * kR * kCols);
  const double got = out[size_t{cta} * (kR * kCols)];
  const bool ok = std::abs(got - want) <= 1e-3 * std::abs(want) + 1e-3;
  double med[kStamps];
  for (int k = 0; k < kStamps; ++k) {
    std::vector<long long> col(ctas);
    for (int c = 0; c < ctas; ++c) col[c] = st[size_t{c} * kStamps + k];
    std::nth_element(col.begin(), col.begin() + ctas / 2, col.end());
    med[k] = double(col[ctas / 2]);
  }
  std::printf("%-10s C=%d ctas=%3d clusters/wave=%3d  write %6.0f  sync %6.0f  reads %6.0f  "
              "sync %6.0f  total %6.0f cycles  kernel %6.2f us  %s\n",
              kVariant == 0 ? "dsmem-pull" : "l2-pull", kC, ctas, max_clusters, med[0], med[1],
              med[2], med[3], med[4], 1e3 * ms / reps, ok ? "sums ok" : "SUMS WRONG");
  CHECK(cudaFree(scratch));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(stamps));
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 200;
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  run<2, 0>(sms, reps);
  run<4, 0>(sms, reps);
  run<8, 0>(sms, reps);
  run<2, 1>(sms, reps);
  run<4, 1>(sms, reps);
  run<8, 1>(sms, reps);
  return 0;
}
