// What the FP8 tensor cores' accumulation does to QK logits and to PV, measured on the GPU.
//
// One warpgroup computes D = A B^T for 64 rows of A and 64 rows of B of E4M3 codes over a
// reduction of `kdim` (a multiple of 256), with the seesaw kernel's own wgmma (m64n64k32,
// both operands K-major in shared memory with the 128-byte swizzle, descriptors moved by the
// same offsets), streaming 256 of the reduction at a time through shared memory, and chaining
// the k = 32 steps in different ways: one accumulator over `chain` steps, the chains added in
// fp32 (chain = kdim / 32: everything in one accumulator).
//
//   qk: kdim 512 (Q rows against K tokens), chains 16, 8 (the seesaw kernel's QK), 4, 2 and 1
//   pv: kdim 16384 tokens (V^T rows = latent channels against P rows = query rows, P in
//       (0, 1]), chains 512 (a PV accumulating into O^T across every block), 2 (the seesaw
//       kernel: one 64-token block into a temporary, promoted in fp32), 16 and 64
//
// and writes the codes and every D to a folder, for qgmma_probe.py to compare with exact float64
// products and with the emulation of qgmma_precision.py (which accumulator width, whether the
// chain length moves the error, and whether it is biased).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O2 -Icpp -Iinclude \
//        bench/probes/qgmma_probe.cu -o .carry/bin/qgmma_probe
//   ./qgmma_probe OUT_DIR [tiles] [seed]      # then: python3 bench/probes/qgmma_probe.py OUT_DIR
//
// Data per tile (even tiles N(0, 1), odd ones Student-t with 3 degrees of freedom): qk: Q rows
// and K tokens quantized as the contract does (scale = amax / 448, codes = e4m3(x / scale));
// pv: V tokens the same way, P = e4m3(exp(-|x|)) with x ~ 2 N(0, 1). The codes' values are
// what the tensor cores multiply.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "decode/sm90/ptx.cuh"
#include "decode/sm90/wgmma.cuh"

using namespace snapmla;

constexpr int kRows = 64, kStream = 256, kChunk = 128;  // 2 x 32 KB of shared memory

// a8: [64][kdim] codes; b8: [64][kdim]; d: [64][64] fp32 (D = A B^T, `chain` steps an
// accumulator). 256 of the reduction at a time: A and B columns [c0, c0 + 256) as TMA's 128B
// swizzle lays a [64 rows][128 B] chunk: byte b of chunk c of row r at
// r * 128 + (((b / 16) ^ (r % 8)) * 16) + b % 16.
__global__ void __launch_bounds__(128, 1)
    probe_kernel(const uint8_t* a8, const uint8_t* b8, int kdim, int chain, float* d) {
  __shared__ __align__(1024) uint8_t as[kStream / kChunk][kRows * kChunk];
  __shared__ __align__(1024) uint8_t bs[kStream / kChunk][kRows * kChunk];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const sm90::SmemDesc a_desc = sm90::make_desc_base(as[0], sm90::Swizzle::k128B, kChunk);
  const sm90::SmemDesc b_desc = sm90::make_desc_base(bs[0], sm90::Swizzle::k128B, kChunk);
  auto step_offset = [](int step) { return (step / 4) * (kRows * kChunk) + 32 * (step % 4); };
  float total[32], acc[32];
  int step = 0;  // k = 32 steps so far
#pragma unroll 1
  for (int c0 = 0; c0 < kdim; c0 += kStream) {
    for (int i = tid; i < kRows * kStream; i += 128) {
      const int r = i / kStream, col = i % kStream, c = col / kChunk, b = col % kChunk;
      const int at = r * kChunk + ((((b >> 4) ^ r) & 7) << 4) + (b & 15);
      as[c][at] = a8[int64_t{r} * kdim + c0 + col];
      bs[c][at] = b8[int64_t{r} * kdim + c0 + col];
    }
    sm90::fence_proxy_async();
    __syncthreads();
#pragma unroll 1
    for (int k = 0; k < kStream / 32; ++k, ++step) {
      const uint64_t da = a_desc.at(step_offset(k)), db = b_desc.at(step_offset(k));
      sm90::wgmma_fence();
      if (step % chain == 0) {
        sm90::wgmma_m64n64k32_e4m3_ss_init(acc, da, db);
      } else {
        sm90::wgmma_m64n64k32_e4m3_ss(acc, da, db, 1);
      }
      sm90::wgmma_commit();
      if ((step + 1) % chain == 0) {  // the chain's end: into the fp32 total
        sm90::wgmma_wait<0>();
        sm90::fence_regs(acc);
#pragma unroll
        for (int e = 0; e < 32; ++e) total[e] = step + 1 == chain ? acc[e] : total[e] + acc[e];
      }
    }
    sm90::wgmma_wait<0>();  // every read of this chunk done before the next overwrites it
    sm90::fence_regs(acc);
    __syncthreads();
  }
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    const int row = 16 * warp + g + 8 * ((e % 4) / 2), col = 8 * (e / 4) + 2 * t + (e % 2);
    d[row * kRows + col] = total[e];
  }
}

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// n rows of kdim values as E4M3 codes: `prob`: codes of exp(-|2 x|); else quantized with scale
// amax / 448 per row, or per column with `per_column` (V^T: a scale per token).
static std::vector<uint8_t> codes(std::mt19937& rng, int n, int kdim, bool heavy, bool prob,
                                  bool per_column) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::student_t_distribution<float> student(3.f);
  std::vector<float> x(size_t{1} * n * kdim);
  for (auto& v : x) v = heavy ? student(rng) : normal(rng);
  std::vector<uint8_t> out(x.size());
  if (prob) {
    for (size_t i = 0; i < x.size(); ++i) {
      out[i] = static_cast<uint8_t>(
          __nv_cvt_float_to_fp8(std::exp(-std::fabs(2.f * x[i])), __NV_SATFINITE, __NV_E4M3));
    }
    return out;
  }
  // quantization groups: rows (per_column false) or columns
  const int groups = per_column ? kdim : n, len = per_column ? n : kdim;
  for (int gi = 0; gi < groups; ++gi) {
    auto at = [&](int j) {
      return per_column ? size_t{1} * j * kdim + gi : size_t{1} * gi * kdim + j;
    };
    float amax = 0.f;
    for (int j = 0; j < len; ++j) amax = std::fmax(amax, std::fabs(x[at(j)]));
    const float scale = amax / 448.f;
    for (int j = 0; j < len; ++j) {
      out[at(j)] = static_cast<uint8_t>(
          __nv_cvt_float_to_fp8(x[at(j)] / scale, __NV_SATFINITE, __NV_E4M3));
    }
  }
  return out;
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
  struct Mode {
    const char* name;
    int kdim;
    std::vector<int> chains;
  };
  const Mode modes[] = {{"qk", 512, {16, 8, 4, 2, 1}}, {"pv", 16384, {512, 64, 16, 2}}};
  FILE* manifest = std::fopen((out + "/manifest.txt").c_str(), "w");
  if (manifest == nullptr) {
    std::fprintf(stderr, "cannot write %s/manifest.txt\n", out.c_str());
    return 2;
  }
  for (const Mode& mode : modes) {
    const size_t bytes = size_t{1} * kRows * mode.kdim;
    uint8_t *da, *db;
    float* dd;
    check(cudaMalloc(&da, bytes), "malloc");
    check(cudaMalloc(&db, bytes), "malloc");
    check(cudaMalloc(&dd, sizeof(float) * kRows * kRows), "malloc");
    std::vector<float> d(kRows * kRows);
    const bool pv = mode.kdim != 512;
    for (int tile = 0; tile < tiles; ++tile) {
      const bool heavy = tile % 2 == 1;
      // qk: A = Q rows, B = K tokens (each row its own scale); pv: A = V^T (a scale per
      // token, so per column of V^T), B = P (probabilities)
      const std::vector<uint8_t> a = codes(rng, kRows, mode.kdim, heavy, false, pv);
      const std::vector<uint8_t> b = codes(rng, kRows, mode.kdim, heavy, pv, false);
      check(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice), "copy");
      check(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice), "copy");
      const std::string stem = out + "/" + mode.name + std::to_string(tile);
      write(stem + "_a8.bin", a.data(), bytes);
      write(stem + "_b8.bin", b.data(), bytes);
      for (int chain : mode.chains) {
        if (chain <= 0 || (mode.kdim / 32) % chain != 0 || mode.kdim % kStream != 0) {
          std::fprintf(stderr, "chain %d does not divide %d steps\n", chain, mode.kdim / 32);
          return 2;
        }
        check(cudaMemset(dd, 0xff, d.size() * sizeof(float)), "poison");  // unwritten: NaN
        probe_kernel<<<1, 128>>>(da, db, mode.kdim, chain, dd);
        check(cudaGetLastError(), "launch");
        check(cudaDeviceSynchronize(), "kernel");
        check(cudaMemcpy(d.data(), dd, d.size() * sizeof(float), cudaMemcpyDeviceToHost), "copy");
        write(stem + "_d" + std::to_string(chain) + ".bin", d.data(), d.size() * sizeof(float));
        std::fprintf(manifest, "%s %d %d %d %s\n", mode.name, tile, mode.kdim, chain,
                     heavy ? "t3" : "normal");
      }
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dd);
  }
  std::fclose(manifest);
  std::printf("wrote %d tiles of qk (kdim 512) and pv (kdim 16384) to %s\n", tiles, out.c_str());
  return 0;
}
