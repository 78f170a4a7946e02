// What the FP8 tensor cores' accumulation does to a QK logit, measured (issue 9's probe).
//
// One warpgroup computes S = Q K^T for a 64-row Q tile and a 64-token K tile of E4M3 codes
// (512 channels, 16 k = 32 steps) with the seesaw kernel's own wgmma (m64n64k32, both operands
// K-major in shared memory with the 128-byte swizzle, descriptors moved by the same offsets),
// chaining the steps in different ways:
//
//   chain16  one accumulator over all 16 steps
//   chain8   two accumulators of 8 steps (channels 0-255, 256-511), added in fp32: the
//            seesaw kernel's QK today
//   chain4   four of 4 steps (SNAPMLA_SEESAW_TWO_TERM_QK_ACCS=4)
//   chain2   eight of 2 steps
//   chain1   every step from a zeroed accumulator, the 16 results added in fp32
//
// and writes the codes and every S to a folder, for bench/qgmma_probe.py to compare with exact
// float64 dot products and with the emulation of bench/qgmma_precision.py (which bits, and
// whether the chain length moves the error at all: the two-term query's kernel error did not
// move with four accumulators in session 12).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O2 -Icpp -Iinclude \
//        bench/qgmma_probe.cu -o qgmma_probe
//   ./qgmma_probe OUT_DIR [tiles] [seed]      # then: python3 bench/qgmma_probe.py OUT_DIR
//
// Data per tile: rows and tokens of N(0, 1) values (half the tiles: Student-t with 3 degrees
// of freedom, heavy tails), each row and token quantized as the contract does (scale =
// amax / 448, codes = e4m3(x / scale)); the codes' values are what the tensor cores multiply.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "decode/sm90.cuh"
#include "decode/wgmma_ops.cuh"

using namespace snapmla;

constexpr int kRows = 64, kTokens = 64, kDim = 512, kChunk = 128, kSteps = kDim / 32;
constexpr int kSchemes = 5;  // steps per accumulator: 16 >> scheme = 16, 8, 4, 2, 1

// q8: [rows][512] codes; k8: [tokens][512]; s: [scheme][rows][tokens] fp32.
__global__ void __launch_bounds__(128, 1)
    probe_kernel(const uint8_t* q8, const uint8_t* k8, float* s) {
  __shared__ __align__(1024) uint8_t qs[kDim / kChunk][kRows * kChunk];
  __shared__ __align__(1024) uint8_t ks[kDim / kChunk][kTokens * kChunk];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  // Each operand as TMA's 128B swizzle lays it: byte b of chunk c of row r at
  // r * 128 + (((b / 16) ^ (r % 8)) * 16) + b % 16.
  for (int i = tid; i < kRows * kDim; i += 128) {
    const int r = i / kDim, d = i % kDim, c = d / kChunk, b = d % kChunk;
    const int at = r * kChunk + ((((b >> 4) ^ r) & 7) << 4) + (b & 15);
    qs[c][at] = q8[i];
    ks[c][at] = k8[i];
  }
  sm90::fence_proxy_async();
  __syncthreads();
  const sm90::SmemDesc q_desc = sm90::make_desc_base(qs[0], sm90::Swizzle::k128B, kChunk);
  const sm90::SmemDesc k_desc = sm90::make_desc_base(ks[0], sm90::Swizzle::k128B, kChunk);
  auto step_offset = [](int step) { return (step / 4) * (kTokens * kChunk) + 32 * (step % 4); };
#pragma unroll 1
  for (int scheme = 0; scheme < kSchemes; ++scheme) {
    const int chain = kSteps >> scheme;
    float total[32], acc[32];
#pragma unroll 1
    for (int first = 0; first < kSteps; first += chain) {
      sm90::wgmma_fence();
#pragma unroll 1
      for (int step = first; step < first + chain; ++step) {
        const uint64_t da = q_desc.at(step_offset(step)), db = k_desc.at(step_offset(step));
        if (step == first) {
          sm90::wgmma_m64n64k32_e4m3_ss_init(acc, da, db);
        } else {
          sm90::wgmma_m64n64k32_e4m3_ss(acc, da, db, 1);
        }
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(acc);
#pragma unroll
      for (int e = 0; e < 32; ++e) total[e] = first == 0 ? acc[e] : total[e] + acc[e];
    }
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int row = 16 * warp + g + 8 * ((e % 4) / 2), tok = 8 * (e / 4) + 2 * t + (e % 2);
      s[(scheme * kRows + row) * kTokens + tok] = total[e];
    }
  }
}

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// n rows of kDim values, each row quantized to E4M3 codes with scale amax / 448.
static std::vector<uint8_t> quantized_rows(std::mt19937& rng, int n, bool heavy) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::student_t_distribution<float> student(3.f);
  std::vector<uint8_t> codes(size_t{1} * n * kDim);
  std::vector<float> row(kDim);
  for (int r = 0; r < n; ++r) {
    float amax = 0.f;
    for (auto& x : row) {
      x = heavy ? student(rng) : normal(rng);
      amax = std::fmax(amax, std::fabs(x));
    }
    const float scale = amax / 448.f;
    for (int d = 0; d < kDim; ++d) {
      codes[size_t{1} * r * kDim + d] = static_cast<uint8_t>(
          __nv_cvt_float_to_fp8(row[d] / scale, __NV_SATFINITE, __NV_E4M3));
    }
  }
  return codes;
}

static void write(const std::string& path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, bytes, f) != bytes) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::fclose(f);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [tiles] [seed]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int tiles = argc > 2 ? std::atoi(argv[2]) : 8;
  std::mt19937 rng(argc > 3 ? std::atoi(argv[3]) : 20261201);
  uint8_t *dq, *dk;
  float* ds;
  check(cudaMalloc(&dq, kRows * kDim), "malloc");
  check(cudaMalloc(&dk, kTokens * kDim), "malloc");
  check(cudaMalloc(&ds, sizeof(float) * kSchemes * kRows * kTokens), "malloc");
  std::vector<float> s(size_t{1} * kSchemes * kRows * kTokens);
  for (int tile = 0; tile < tiles; ++tile) {
    const bool heavy = tile % 2 == 1;
    const std::vector<uint8_t> q8 = quantized_rows(rng, kRows, heavy);
    const std::vector<uint8_t> k8 = quantized_rows(rng, kTokens, heavy);
    check(cudaMemcpy(dq, q8.data(), q8.size(), cudaMemcpyHostToDevice), "copy");
    check(cudaMemcpy(dk, k8.data(), k8.size(), cudaMemcpyHostToDevice), "copy");
    check(cudaMemset(ds, 0xff, s.size() * sizeof(float)), "poison");  // unwritten: NaN
    probe_kernel<<<1, 128>>>(dq, dk, ds);
    check(cudaGetLastError(), "launch");
    check(cudaDeviceSynchronize(), "kernel");
    check(cudaMemcpy(s.data(), ds, s.size() * sizeof(float), cudaMemcpyDeviceToHost), "copy back");
    const std::string stem = out + "/tile" + std::to_string(tile);
    write(stem + "_q8.bin", q8.data(), q8.size());
    write(stem + "_k8.bin", k8.data(), k8.size());
    write(stem + "_s.bin", s.data(), s.size() * sizeof(float));
  }
  std::printf("wrote %d tiles (%s) to %s; chains:", tiles, "even: normal, odd: Student-t 3",
              out.c_str());
  for (int scheme = 0; scheme < kSchemes; ++scheme) std::printf(" %d", kSteps >> scheme);
  std::printf("\n");
  return 0;
}
