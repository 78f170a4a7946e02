// The power-limited floor: how long the work every MLA decode kernel must do takes on a board
// held at its power limit. A decode server runs the GPU continuously, where the H200 holds its
// 700 W limit by lowering the SM clock; this probe runs a decode's unavoidable work there, with
// nothing else:
//
//   tensor  the tile-blocks' tensor work as FP8 wgmmas in the most efficient form the hardware
//           has (m64n256k32, both operands in shared memory: no softmax, no promotion, no V
//           transpose, no register A operand); 1,152 tensor cycles a tile-block (content QK
//           512, PV 512, and the BF16 RoPE QK's 128 counted as FP8 work of the same cycles);
//           N = 64 (the decode kernel's QK shape) as a second form
//   hbm     the KV bytes read once from HBM: 41,216-byte pages by TMA bulk copies into a
//           four-slot ring that nothing reads
//   both    the two at once in every CTA, each at its own pace (perfect overlap)
//   all     both, and in the wgmma warpgroups between their wgmma groups (no dependence on
//           them) the CUDA-core work the contract asks of every tile-block at its least: per
//           logit a scale, the row maximum, the exponential's FFMA and MUFU.EX2, the sum, the
//           P' scale, its maximum, the 1 / sigma scale and half an E4M3 pair conversion (4,096
//           logits), and the promotion's FFMA into O (64 rows x 512 latent): per thread 16
//           logits and 128 FFMA a tile-block (N = 256 only)
//
// One CTA an SM (384 threads: two warpgroups issue wgmmas, one thread of the third the page
// copies), operands random E4M3 codes (no NaN), the pages random bytes in a 4 GiB buffer read
// at a moving offset (every launch reads fresh HBM lines). Per launch an SM does
// `tile_blocks` tile-blocks of tensor work and copies `pages` pages: a decode shape's share
// (32x1x128x16384: 124 and 62, two row tiles sharing each page; 64x1x64x32768: 248 and 248).
// Launches run back to back for `seconds`; the time per launch is printed for the first batch
// (a cold GPU) and as the median of the batches in the second half (held at the power limit
// when the work draws that much). Clock and power come from nvidia-smi, sampled by the caller.
// SNAPMLA_PROBE_DATA: the operands' and pages' bytes: `uniform` (the default: E4M3 codes drawn
// uniformly, never NaN, and random page bytes), `randn` (E4M3 codes of a standard normal times
// 112, so that 4 sigma reach 448, as a per-token-scaled cache holds them: operands and pages),
// `zero` (the least switching any data can cause: a bound below what real data costs).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -Icpp -Iinclude \
//        bench/probes/power_probe.cu -o .carry/bin/power_probe
//   ./power_probe all 124 62 3 [256|64]      # mode tile_blocks pages seconds [wgmma N]
// bench/sustained.sh runs it with nvidia-smi sampling the clock, power and throttle reasons, and
// `bench/gpu_session.sh power-floor` at the shares of the 128-head cases.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../cuda_check.h"
#include "common/numerics.cuh"
#include "decode/sm90/ptx.cuh"
#include "decode/sm90/wgmma.cuh"
#include "probe_common.cuh"
#include "wgmma_wide_ops.cuh"

using namespace snapmla;
using namespace snapmla::sm90;

#define CHECK(x) SNAPMLA_BENCH_CHECK(x, 1)

namespace {

// kPageBytes (common/numerics.cuh): one page of the cache, content, RoPE and scales
constexpr uint32_t kCopyBytes = kPageBytes / 4;  // a page in four bulk copies (multiples of 16)
static_assert(kCopyBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
constexpr int kSlots = 4;
constexpr int kThreads = 384;
constexpr int kTensorCyclesPerTileBlock = 1152;

enum Mode { kTensor = 1, kHbm = 2, kBoth = 3, kCuda = 4, kAll = 7 };

struct alignas(1024) Shared {
  uint8_t a[64 * 128];   // A: 64 rows x 128 bytes, 128B-swizzled (four k32 steps)
  uint8_t b[256 * 128];  // B: up to 256 rows x 128 bytes
  uint8_t ring[kSlots][kPageBytes];
  uint64_t full[kSlots];
};

__device__ __forceinline__ uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

// A random E4M3 code, never NaN (0x7f / 0xff): magnitude codes 0 .. 0x7e, either sign.
__device__ __forceinline__ uint8_t e4m3_code(uint32_t h) {
  return static_cast<uint8_t>((h % 0x7f) | (h & 0x80u));
}

enum Data { kUniform = 0, kRandn = 1, kZero = 2 };

// The E4M3 code of 112 x a standard normal value drawn from hash h (Box-Muller).
__device__ __forceinline__ uint8_t randn_code(uint32_t h) {
  const float u1 = ((h & 0xffffu) + 0.5f) * (1.f / 65536.f);
  const float u2 = (h >> 16) * (1.f / 65536.f);
  const float x = 112.f * sqrtf(-2.f * __logf(u1)) * __cosf(6.2831853f * u2);
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.f), "f"(x));
  return static_cast<uint8_t>(pair & 0xff);
}

__device__ __forceinline__ uint8_t data_code(int data, uint32_t h) {
  return data == kZero ? 0 : data == kRandn ? randn_code(h) : e4m3_code(h);
}

__global__ void fill_kernel(uint32_t* buf, size_t words, uint32_t seed, int data) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t h = mix(static_cast<uint32_t>(i) * 2654435761u + seed);
    if (data != kRandn) {
      buf[i] = data == kZero ? 0u : h;
    } else {
      uint32_t w = 0;
      for (int b = 0; b < 4; ++b) w |= uint32_t{randn_code(mix(h + b))} << (8 * b);
      buf[i] = w;
    }
  }
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

template <int kN>
__global__ void __launch_bounds__(kThreads, 1)
    probe_kernel(int mode, int wgmmas_per_wg, int pages, const uint8_t* __restrict__ buf,
                 int64_t buf_pages, int64_t first_page, int data, float* sink) {
  extern __shared__ uint8_t smem_raw[];  // (1 KB over: the 128B swizzle's 1,024-byte atoms)
  Shared& s = bench_probe::aligned_smem<Shared>(smem_raw);
  const bench_probe::ProbeThread th = bench_probe::ProbeThread::here();
  const int tid = th.tid, wg = th.wg;
  for (int i = tid; i < int(sizeof(s.a)); i += kThreads) {
    s.a[i] = data_code(data, mix(i + 17 * blockIdx.x));
  }
  for (int i = tid; i < int(sizeof(s.b)); i += kThreads) {
    s.b[i] = data_code(data, mix(i + 0x9e3779b9u));
  }
  if (tid == 0) {
    for (int i = 0; i < kSlots; ++i) mbar_init(&s.full[i], 1);
    mbar_fence_init();
  }
  fence_proxy_async();  // the operands, written by the generic proxy, read by wgmma
  __syncthreads();

  if (wg < 2 && (mode & kTensor)) {
    const SmemDesc da = make_desc_base(s.a, Swizzle::k128B, 128);
    const SmemDesc db = make_desc_base(s.b + (kN == 64 ? 64 * 128 * wg : 0), Swizzle::k128B, 128);
    float d[kN / 2];
#pragma unroll
    for (int e = 0; e < kN / 2; ++e) d[e] = 0.f;
    // kAll's CUDA-core work: a group of four N = 256 wgmmas is 512 of a tile-block's 1,152
    // tensor cycles, so each group carries 4 / 9 of a thread's share: 7 logits, 57 FFMA.
    const bool cuda = (mode & kCuda) != 0 && kN == 256;
    const uint32_t h = mix(tid + 977 * blockIdx.x);
    float z[4], o[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) z[e] = -1.f - 0.001f * ((h >> (4 * e)) & 15);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = 0.001f * ((h >> (2 * j)) & 63);
    float mx = -1.f, esum = 0.f, pmax = 0.f;
    uint32_t codes = 0;
    const float ks = 0.93f + 1e-3f * (h & 7), rf = 1.4427f, inv = 401.f, sig = 1.25e-3f;
    wgmma_fence();
#pragma unroll 1
    for (int i = 0; i < wgmmas_per_wg; i += 4) {
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // the four k32 steps of the 128-byte rows
        if constexpr (kN == 256) {
          wgmma_m64n256k32_e4m3_ss(d, da.at(32 * k), db.at(32 * k), 1);
        } else {
          wgmma_m64n64k32_e4m3_ss(d, da.at(32 * k), db.at(32 * k), 1);
        }
      }
      wgmma_commit();
      if (cuda) {
        float q[8];
#pragma unroll
        for (int e = 0; e < 7; ++e) {  // 7 logits
          const float u = z[e % 4] * ks;
          mx = fmaxf(mx, u);
          float ex;
          asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(ex) : "f"(fmaf(u, rf, -mx)));
          esum += ex;
          const float pp = ex * ks;
          pmax = fmaxf(pmax, pp);
          q[e] = pp * inv;
        }
        q[7] = q[6];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {  // 3.5 E4M3 pairs (the eighth value a repeat)
          uint16_t pair;
          asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
                       : "=h"(pair)
                       : "f"(q[e + 1]), "f"(q[e]));
          codes ^= pair;
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) z[e] = fmaf(q[e], -0.002f, -0.2f);  // stays in [-1.2, -0.2]
#pragma unroll
        for (int j = 0; j < 57; ++j) o[j % 8] = fmaf(sig, q[j % 7], o[j % 8]);  // the promotion
      }
      wgmma_wait<1>();  // two groups of four in flight
    }
    wgmma_wait<0>();
    fence_regs(d);
    float acc = esum + pmax + static_cast<float>(codes);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += o[j];
#pragma unroll
    for (int e = 0; e < kN / 2; ++e) acc += d[e];
    if (acc == 1.2345f) sink[blockIdx.x] = acc;  // (never: keeps the products live)
  } else if (wg == 2 && tid == 256 && (mode & kHbm)) {
    for (int p = 0; p < pages; ++p) {
      const int slot = p % kSlots;
      if (p >= kSlots) mbar_wait(&s.full[slot], ((p / kSlots) - 1) & 1);
      const int64_t page = (first_page + int64_t{blockIdx.x} * pages + p) % buf_pages;
      const uint8_t* src = buf + page * kPageBytes;
      mbar_arrive_expect_tx(&s.full[slot], kPageBytes);
      for (int c = 0; c < 4; ++c) {
        bulk_copy(s.ring[slot] + c * kCopyBytes, src + c * kCopyBytes, kCopyBytes, &s.full[slot]);
      }
    }
    for (int p = pages > kSlots ? pages - kSlots : 0; p < pages; ++p) {
      mbar_wait(&s.full[p % kSlots], (p / kSlots) & 1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s tensor|hbm|both|all tile_blocks pages seconds [256|64]\n",
                 argv[0]);
    return 2;
  }
  const int mode = std::strcmp(argv[1], "tensor") == 0 ? kTensor
                   : std::strcmp(argv[1], "hbm") == 0  ? kHbm
                   : std::strcmp(argv[1], "both") == 0 ? kBoth
                   : std::strcmp(argv[1], "all") == 0  ? kAll
                                                       : 0;
  if (mode == 0) {
    std::fprintf(stderr, "mode: tensor, hbm, both or all\n");
    return 2;
  }
  const int tile_blocks = std::atoi(argv[2]), pages = std::atoi(argv[3]);
  const double seconds = std::atof(argv[4]);
  const int n = argc > 5 ? std::atoi(argv[5]) : 256;
  if (n != 256 && n != 64) {
    std::fprintf(stderr, "wgmma N: 256 or 64\n");
    return 2;
  }
  const bench_probe::ProbeHost host = bench_probe::ProbeHost::make(1);
  const int sms = host.sms;
  // wgmmas a tile-block (both warpgroups): its tensor cycles over one wgmma's (N / 2 cycles:
  // 64 x N x 32 x 2 FLOP at 8,192 FLOP a cycle), split between the two warpgroups in fours.
  const int per_tile_block = kTensorCyclesPerTileBlock / (n / 2);
  const int wgmmas_per_wg = (tile_blocks * per_tile_block / 2 + 3) / 4 * 4;
  const double flop = 2.0 * sms * wgmmas_per_wg * 2 * 64.0 * n * 32;  // per launch
  const double bytes = double(sms) * pages * kPageBytes;

  const size_t buf_bytes = size_t{4} << 30;
  const int64_t buf_pages = int64_t(buf_bytes / kPageBytes);
  uint8_t* buf = nullptr;
  CHECK(cudaMalloc(&buf, buf_bytes));
  const char* data_env = std::getenv("SNAPMLA_PROBE_DATA");
  const char* data_name = data_env != nullptr ? data_env : "uniform";
  const int data = std::strcmp(data_name, "zero") == 0    ? kZero
                   : std::strcmp(data_name, "randn") == 0 ? kRandn
                   : std::strcmp(data_name, "uniform") == 0 ? kUniform
                                                            : -1;
  if (data < 0) {
    std::fprintf(stderr, "SNAPMLA_PROBE_DATA: uniform, randn or zero\n");
    return 2;
  }
  fill_kernel<<<4 * sms, 256>>>(reinterpret_cast<uint32_t*>(buf), buf_bytes / 4, 12345u, data);
  CHECK(cudaGetLastError());
  float* sink = host.sink;  // (256 floats: one an SM)

  auto kernel = n == 256 ? probe_kernel<256> : probe_kernel<64>;
  const int smem = sizeof(Shared) + 1024;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int64_t first_page = 0;
  auto launch = [&] {
    kernel<<<sms, kThreads, smem>>>(mode, wgmmas_per_wg, pages, buf, buf_pages, first_page, data,
                                    sink);
    first_page = (first_page + int64_t{sms} * pages) % buf_pages;
  };
  launch();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  // Batches of back-to-back launches, each timed by events, until `seconds` have passed.
  constexpr int kBatch = 20;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> us;
  double elapsed = 0;
  while (elapsed < seconds) {
    CHECK(cudaEventRecord(e0));
    for (int i = 0; i < kBatch; ++i) launch();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(1e3 * ms / kBatch);
    elapsed += 1e-3 * ms;
  }
  CHECK(cudaGetLastError());
  std::vector<double> late(us.begin() + us.size() / 2, us.end());
  std::sort(late.begin(), late.end());
  const double sustained = late[late.size() / 2];
  std::printf(
      "%s N=%d %s data, %d tile-blocks and %d pages an SM: first batch %.1f us a launch, sustained "
      "%.1f us (median of %zu batches of %d over %.1f s); %.0f TFLOPS, %.2f TB/s sustained\n",
      argv[1], n, data_name, tile_blocks, pages, us.front(), sustained, late.size(),
      kBatch, elapsed,
      (mode & kTensor) ? flop / sustained * 1e-6 : 0.0,
      (mode & kHbm) ? bytes / sustained * 1e-6 : 0.0);
  return 0;
}
