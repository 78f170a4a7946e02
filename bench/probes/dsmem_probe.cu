// What one exchange between the two CTAs of a cluster costs on the chain: the latency a kernel
// whose two CTAs share a 64-row tile would pay per block (row maxima, P' maxima, P8 halves or
// partial S tiles handed to the other CTA through distributed shared memory).
//
// Every SM runs one CTA of 128 threads in clusters of two. The CTAs of a cluster play ping-pong:
// rank 0 writes `bytes` into rank 1's shared memory with st.async, which completes the bytes on
// rank 1's mbarrier; rank 1 waits for it, reads what arrived (a real dependence), and writes the
// same number of bytes back the same way; `rounds` round trips, clock64 on rank 0 around them.
// A one-way exchange is half a round trip. Sizes: 256 B (64 fp32 row statistics), 2 KB (P8 of
// 64 rows x 32 tokens), 4 KB (P8 of a 64 x 64 block), 16 KB (a 64 x 64 fp32 S tile).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -Icpp -Iinclude \
//        bench/probes/dsmem_probe.cu -o .carry/bin/dsmem_probe
//   ./dsmem_probe [rounds]
//
// Prints, per size, the median and maximum over clusters of the cycles per one-way exchange
// and the bytes a cycle that implies.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_common.cuh"

using namespace snapmla;

namespace {

constexpr int kThreads = 128;
constexpr int kMaxBytes = 16384;
constexpr int kMaxClusters = 128;  // ProbeHost's sink holds a value for each of 256 CTAs

struct alignas(128) Smem {
  uint4 buf[kMaxBytes / 16];
  uint64_t bar;
};

__device__ __forceinline__ uint32_t peer_addr(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}

__device__ __forceinline__ void st_async(uint32_t remote, uint4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(remote),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    ping_pong(int bytes, int rounds, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) uint8_t raw[];
  Smem& s = bench_probe::aligned_smem<Smem>(raw);
  const int tid = threadIdx.x;
  const uint32_t rank = cluster_rank(), peer = rank ^ 1u;
  if (tid == 0) {
    sm90::mbar_init(&s.bar, 1);
    sm90::mbar_fence_init();
  }
  for (int k = tid; k < kMaxBytes / 16; k += kThreads) s.buf[k] = make_uint4(tid, k, 0, 0);
  cluster_sync();  // both barriers initialized before any st.async reaches them

  const uint32_t remote_buf = peer_addr(sm90::smem_u32(s.buf), peer);
  const uint32_t remote_bar = peer_addr(sm90::smem_u32(&s.bar), peer);
  const int words = bytes / 16;  // 16-byte stores, spread over the threads
  uint32_t acc = 0, phase = 0;
  auto send = [&] {
    for (int k = tid; k < words; k += kThreads) {
      uint4 v = s.buf[k];
      v.x += acc;  // what is sent depends on what was received
      st_async(remote_buf + 16u * k, v, remote_bar);
    }
  };
  auto receive = [&] {
    if (tid == 0) sm90::mbar_arrive_expect_tx(&s.bar, bytes);
    sm90::mbar_wait(&s.bar, phase);
    phase ^= 1;
    for (int k = tid; k < words; k += kThreads) acc += s.buf[k].x;
  };

  long long t0 = clock64();
  for (int r = 0; r < rounds; ++r) {
    if (rank == 0) {
      send();
      receive();
    } else {
      receive();
      send();
    }
  }
  long long t1 = clock64();
  cluster_sync();  // no st.async in flight toward a CTA that has exited
  if (tid == 0 && rank == 0) cycles[blockIdx.x / 2] = t1 - t0;
  if (acc == 0xdeadbeefu) sink[blockIdx.x] = float(acc);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 2000;
  const bench_probe::ProbeHost host = bench_probe::ProbeHost::make(kMaxClusters);
  const int clusters = std::min(host.sms / 2, kMaxClusters), ctas = 2 * clusters;
  const int smem = int(sizeof(Smem)) + 1024;  // + slack to align it to 1024
  SNAPMLA_BENCH_CHECK(
      cudaFuncSetAttribute(ping_pong, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), 1);
  std::printf("dsmem_probe: %d CTAs in clusters of 2, 128 threads, %d round trips a size\n", ctas,
              rounds);
  std::printf("%8s %12s %12s %10s\n", "bytes", "median_cyc", "max_cyc", "B/cycle");
  for (int bytes : {256, 2048, 4096, 16384}) {
    for (int rep = 0; rep < 2; ++rep) {  // the first launch warms up
      ping_pong<<<ctas, kThreads, smem>>>(bytes, rounds, host.cycles, host.sink);
      SNAPMLA_BENCH_CHECK(cudaGetLastError(), 1);
      SNAPMLA_BENCH_CHECK(cudaDeviceSynchronize(), 1);
    }
    std::vector<long long> c(clusters);
    SNAPMLA_BENCH_CHECK(
        cudaMemcpy(c.data(), host.cycles, clusters * sizeof(long long), cudaMemcpyDeviceToHost), 1);
    std::sort(c.begin(), c.end());
    const double one_way_med = double(c[clusters / 2]) / (2.0 * rounds);
    const double one_way_max = double(c.back()) / (2.0 * rounds);
    std::printf("%8d %12.1f %12.1f %10.1f\n", bytes, one_way_med, one_way_max,
                bytes / one_way_med);
  }
  return 0;
}
