// Unit test of the decode kernel's fragment bindings on integer data (bit-exact).
//
// Runs the kernel's own helpers (decode/sm90/fragments.cuh): a content tile written to shared
// memory with the 128-byte swizzle TMA uses, P8 packed from S-accumulator fragments and stored
// with stmatrix, V^T built by ldmatrix.trans + byte permutes, and the PV wgmma O^T = V^T P^T for
// PV widths N = 16, 32, 64; and the one-row-per-thread P8 of the N = 16 and 32 kernels (kOneRow:
// thread (g, t) of warp w holds query row 8 w + g in fragment elements c = 0, 1 of each group of
// four, the two-term query's low logits in c = 2, 3, stored by p8_words<1> / store_p8<1> at rows
// 8 w ..). Values are small integers, so the result must equal P V on the host bit for bit.
// Exit status 0 on success.
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

#include "decode/sm90/fragments.cuh"
#include "decode/sm90/wgmma.cuh"

using namespace snapmla;
using namespace snapmla::decode::seesaw;

constexpr int kTokens = 64, kDim = 512, kRows = 64;

template <int N>
__device__ void pv_kstep(float (&acc)[N / 2], const uint32_t (&a)[4], uint64_t desc, bool init) {
  init ? sm90::wgmma_m64nNk32_e4m3_rs_init<N>(acc, a, desc)
       : sm90::wgmma_m64nNk32_e4m3_rs<N>(acc, a, desc, 1);
}

// v: e4m3 [64 tokens][512]; p: fp32 [64 rows][64 tokens] (exact E4M3 values);
// out: fp32 [64 rows][512] = p v for rows < N.
template <int N, bool kOneRow>
__global__ void __launch_bounds__(256, 1)
    fragments_kernel(const uint8_t* v, const float* p, float* out) {
  __shared__ __align__(1024) uint8_t content[4][kTokens * 128];
  __shared__ __align__(1024) uint8_t p8[kRows * 64];
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
    if constexpr (kOneRow) {
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
    uint32_t r[2][4], a[2][4];
    vt_words_at(chunk, r);
    vt_from_words(r[0], a[0]);
    vt_from_words(r[1], a[1]);
    float acc[N / 2];
    sm90::wgmma_fence();
    pv_kstep<N>(acc, a[0], desc[0], true);
    pv_kstep<N>(acc, a[1], desc[1], false);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(acc);
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

template <int N, bool kOneRow = false>
static int run(std::mt19937& rng) {
  std::uniform_int_distribution<int> vd(-3, 3), pd(0, 4);
  std::vector<float> vf(kTokens * kDim), pf(kRows * kTokens);
  std::vector<uint8_t> v8(kTokens * kDim);
  for (size_t i = 0; i < vf.size(); ++i) {
    vf[i] = static_cast<float>(vd(rng));
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
  fragments_kernel<N, kOneRow><<<1, 256>>>(dv, dp, dout);
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
          std::printf("N=%d%s row %d latent %d: got %g want %g\n", N, kOneRow ? " one-row" : "",
                      r, d, got, want);
        }
        ++bad;
      }
    }
  }
  std::printf("N=%d%s: %d of %d elements differ\n", N, kOneRow ? " one-row" : "", bad,
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
    bad += run<16, true>(rng) + run<32, true>(rng);  // one query row a thread (kOneRow)
  }
  std::printf(bad == 0 ? "PASS\n" : "FAIL\n");
  return bad == 0 ? 0 : 1;
}
