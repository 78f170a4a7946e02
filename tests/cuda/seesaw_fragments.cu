// Unit test of the seesaw kernel's fragment bindings on integer data (bit-exact).
//
// Runs the kernel's own helpers (decode/seesaw/fragments.cuh): a content tile written to shared
// memory with the 128-byte swizzle TMA uses, P8 packed from S-accumulator fragments and stored
// with stmatrix, V^T built by ldmatrix.trans + byte permutes, and the PV wgmma O^T = V^T P^T for
// PV widths N = 16, 32, 64; and the two-term query's one-row-per-thread P8 (kOneRow: thread
// (g, t) of warp w holds query row 8 w + g in fragment elements c = 0, 1 of each group of four,
// its low logits in c = 2, 3, stored by p8_words<1> / store_p8<1> at rows 8 w ..), N = 16, 32;
// and the FP16 PV's bindings (kF16, N = 64: P8 widened to f16 by p16_words and stored with
// store_p16 in the 128B-swizzled f16 tile, V^T widened by vt_f16_fragments, four m64n64k16 f16
// wgmmas a k32 step), there on V drawn from every E4M3 value of magnitude 2^-9 .. 8 as well;
// and V^T in shared memory (kSs, N = 64: the fragments stored by stmatrix at
// vt_smem_lane_offset, then m64n64k32 with both operands in shared memory).
// Values are small integers (or few-bit E4M3 values times small integers on the FP16 path, whose
// fp32 accumulation holds their sums exactly), so the result must equal P V on the host bit for
// bit. Exit status 0 on success.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -Icpp -Iinclude \
//        tests/cuda/seesaw_fragments.cu -o seesaw_fragments && ./seesaw_fragments
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "decode/seesaw/fragments.cuh"
#include "decode/wgmma_ops.cuh"

using namespace snapmla;
using namespace snapmla::decode::seesaw;

constexpr int kTokens = 64, kDim = 512, kRows = 64;

template <int N>
__device__ void pv_kstep(float (&acc)[N / 2], const uint32_t (&a)[4], uint64_t desc, bool init) {
  if constexpr (N == 64) {
    init ? sm90::wgmma_m64n64k32_e4m3_rs_init(acc, a, desc)
         : sm90::wgmma_m64n64k32_e4m3_rs(acc, a, desc, 1);
  } else if constexpr (N == 32) {
    init ? sm90::wgmma_m64n32k32_e4m3_rs_init(acc, a, desc)
         : sm90::wgmma_m64n32k32_e4m3_rs(acc, a, desc, 1);
  } else {
    init ? sm90::wgmma_m64n16k32_e4m3_rs_init(acc, a, desc)
         : sm90::wgmma_m64n16k32_e4m3_rs(acc, a, desc, 1);
  }
}

// v: e4m3 [64 tokens][512]; p: fp32 [64 rows][64 tokens] (exact E4M3 values);
// out: fp32 [64 rows][512] = p v for rows < N.
template <int N, bool kOneRow, bool kF16, bool kSs = false>
__global__ void __launch_bounds__(256, 1)
    fragments_kernel(const uint8_t* v, const float* p, float* out) {
  static_assert(!kF16 || (N == 64 && !kOneRow), "the FP16 PV: N = 64, one-term");
  static_assert(!kSs || (N == 64 && !kOneRow && !kF16), "the SS PV: N = 64, one-term, FP8");
  __shared__ __align__(1024) uint8_t content[4][kTokens * 128];
  __shared__ __align__(1024) uint8_t p8[kRows * 64];
  __shared__ __align__(1024) uint8_t p16[kRows * 128];
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
  const int g = lane / 4, t = lane % 4;
  // Content as TMA's 128B swizzle lays it: byte b of chunk c, token k at k*128 + swizzled unit.
  for (int i = tid; i < kTokens * kDim; i += 256) {
    const int k = i / kDim, d = i % kDim, c = d / 128, b = d % 128;
    content[c][k * 128 + ((((b >> 4) ^ k) & 7) << 4) + (b & 15)] = v[i];
  }
  // P8 from S fragments, as the owner warpgroup's softmax holds them (warpgroup 0).
  if (wg == 0) {
    float z[32];
    for (int e = 0; e < 32; ++e) {
      const int tok = 8 * (e / 4) + 2 * t + (e % 2);
      if constexpr (kOneRow) {  // elements c = 2, 3 (the low logits) must not reach P8
        z[e] = (e % 4) < 2 ? p[(8 * warp + g) * kTokens + tok] : 7.f;
      } else {
        z[e] = p[(16 * warp + g + 8 * ((e % 4) / 2)) * kTokens + tok];
      }
    }
    const float inv[2] = {1.f, 1.f};
    uint32_t w[2][4];
    if constexpr (kF16) {
      uint32_t w16[2][8];
      p16_words(z, inv, w16);
      store_p16(sm90::smem_u32(p16), p16_lane_offset(lane, warp), w16);
    } else if constexpr (kOneRow) {
      p8_words<1>(z, inv, w);
      store_p8<1>(sm90::smem_u32(p8) + p8_lane_offset_rows(lane, 8 * warp), w);
    } else {
      p8_words(z, inv, w);
      store_p8(sm90::smem_u32(p8) + p8_lane_offset(lane, warp), w);
    }
  }
  sm90::fence_proxy_async();
  __syncthreads();
  const uint64_t desc[2] = {sm90::make_desc(p8, sm90::Swizzle::k64B, 64),
                            sm90::make_desc(p8 + 32, sm90::Swizzle::k64B, 64)};
  for (int m = 0; m < 4; ++m) {
    const uint32_t chunk =
        sm90::smem_u32(content[2 * wg + m / 2]) + vt_lane_offset(lane, 4 * (m % 2) + warp);
    uint32_t a[2][4];
    vt_fragment(chunk, a[0]);
    vt_fragment(chunk + 4096, a[1]);
    float acc[N / 2];
    if constexpr (kSs) {  // V^T through shared memory (its own buffer here; in place in the kernel)
      __shared__ __align__(1024) uint8_t vts[2][64 * 64];  // [warpgroup][64 latent][64 tokens]
      const uint32_t off = vt_smem_lane_offset(lane, warp);
      sm90::stsm_x4(sm90::smem_u32(vts[wg]) + off, a[0][0], a[0][1], a[0][2], a[0][3]);
      sm90::stsm_x4(sm90::smem_u32(vts[wg]) + (off ^ 32), a[1][0], a[1][1], a[1][2], a[1][3]);
      sm90::fence_proxy_async();
      asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg));
      const sm90::SmemDesc dv = sm90::make_desc_base(vts[wg], sm90::Swizzle::k64B, 64);
      sm90::wgmma_fence();
      sm90::wgmma_m64n64k32_e4m3_ss_init(acc, dv.at(0), desc[0]);
      sm90::wgmma_m64n64k32_e4m3_ss(acc, dv.at(32), desc[1], 1);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(acc);
      asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg));  // vts reused by the next m-tile
    } else if constexpr (kF16) {  // into a zeroed accumulator, as the kernel's O^T starts
      uint32_t a16[4][4];
      vt_f16_fragments(a[0], a16[0], a16[1]);
      vt_f16_fragments(a[1], a16[2], a16[3]);
      for (int e = 0; e < N / 2; ++e) acc[e] = 0.f;
      const sm90::SmemDesc d16 = sm90::make_desc_base(p16, sm90::Swizzle::k128B, 128);
      sm90::wgmma_fence();
      for (int k = 0; k < 4; ++k) sm90::wgmma_m64n64k16_f16_rs(acc, a16[k], d16.at(32 * k), 1);
    } else {
      sm90::wgmma_fence();
      pv_kstep<N>(acc, a[0], desc[0], true);
      pv_kstep<N>(acc, a[1], desc[1], false);
    }
    if constexpr (!kSs) {
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(acc);
    }
    for (int e = 0; e < N / 2; ++e) {
      const int d = 256 * wg + 64 * m + 16 * warp + 2 * g + (e % 4) / 2;
      const int row = 8 * (e / 4) + 2 * t + (e % 2);
      out[row * kDim + d] = acc[e];
    }
  }
}

static int check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
  return 0;
}

// Every finite E4M3 value v with 2^-9 <= |v| <= 8 (subnormals included), and zero.
static std::vector<float> e4m3_values() {
  std::vector<float> vals;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    __nv_fp8_e4m3 x;
    x.__x = static_cast<__nv_fp8_storage_t>(code);
    const float f = static_cast<float>(x);
    if (f == 0.f || (std::fabs(f) >= 0.001953125f && std::fabs(f) <= 8.f)) vals.push_back(f);
  }
  return vals;
}

template <int N, bool kOneRow = false, bool kF16 = false, bool kSs = false>
static int run(std::mt19937& rng, bool wide = false) {
  std::uniform_int_distribution<int> vd(-3, 3), pd(0, 4);
  static const std::vector<float> wide_values = e4m3_values();
  std::uniform_int_distribution<size_t> wd(0, wide_values.size() - 1);
  std::vector<float> vf(kTokens * kDim), pf(kRows * kTokens);
  std::vector<uint8_t> v8(kTokens * kDim);
  for (size_t i = 0; i < vf.size(); ++i) {
    vf[i] = wide ? wide_values[wd(rng)] : static_cast<float>(vd(rng));
    v8[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(vf[i], __NV_SATFINITE, __NV_E4M3));
  }
  for (auto& x : pf) x = static_cast<float>(pd(rng));
  uint8_t* dv;
  float *dp, *dout;
  check(cudaMalloc(&dv, v8.size()), "malloc");
  check(cudaMalloc(&dp, pf.size() * 4), "malloc");
  check(cudaMalloc(&dout, kRows * kDim * 4), "malloc");
  check(cudaMemcpy(dv, v8.data(), v8.size(), cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(dp, pf.data(), pf.size() * 4, cudaMemcpyHostToDevice), "copy");
  check(cudaMemset(dout, 0xff, kRows * kDim * 4), "poison");  // NaN: unwritten stays NaN
  fragments_kernel<N, kOneRow, kF16, kSs><<<1, 256>>>(dv, dp, dout);
  check(cudaGetLastError(), "launch");
  check(cudaDeviceSynchronize(), "kernel");
  std::vector<float> out(kRows * kDim);
  check(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost), "copy back");
  int bad = 0;
  for (int r = 0; r < N; ++r) {
    for (int d = 0; d < kDim; ++d) {
      double want = 0;
      for (int k = 0; k < kTokens; ++k) want += double(pf[r * kTokens + k]) * vf[k * kDim + d];
      const float got = out[r * kDim + d];
      if (!(got == static_cast<float>(want))) {
        if (bad < 8) {
          std::printf("N=%d%s row %d latent %d: got %g want %g\n", N,
                      kSs ? " ss" : kF16 ? " f16" : kOneRow ? " one-row" : "", r, d, got, want);
        }
        ++bad;
      }
    }
  }
  std::printf("N=%d%s%s: %d of %d elements differ\n", N,
              kSs ? " ss" : kF16 ? " f16" : kOneRow ? " one-row" : "", wide ? " (wide E4M3 V)" : "", bad,
              N * kDim);
  cudaFree(dv);
  cudaFree(dp);
  cudaFree(dout);
  return bad;
}

int main() {
  std::mt19937 rng(20261130);
  int bad = 0;
  for (int trial = 0; trial < 3; ++trial) {
    bad += run<16>(rng) + run<32>(rng) + run<64>(rng);
    bad += run<16, true>(rng) + run<32, true>(rng);  // the two-term query's P8 (kOneRow)
    bad += run<64, false, true>(rng) + run<64, false, true>(rng, true);  // the FP16 PV
    bad += run<64, false, false, true>(rng);                             // V^T from shared memory
  }
  std::printf(bad == 0 ? "PASS\n" : "FAIL\n");
  return bad == 0 ? 0 : 1;
}
