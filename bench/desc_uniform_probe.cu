// Compile-only probe (no GPU): does ptxas keep the QK's shared-memory descriptors in uniform
// registers? In this kernel it does: per wgmma two UIADD3.64 and no R2UR, also with the
// descriptor code of the seesaw kernels (SmemDesc::at, a stage index from global memory,
// setmaxnreg roles, an mbarrier wait in the loop). In the seesaw kernels it does not: the
// shared base is copied into a regular register before the loop, and every wgmma costs a LEA or
// VIADD, an IMAD.MOV of the constant high half and four R2UR (~8 instructions, ~190 a block:
// bench/NOTES.md, session 27). Found in session 28 by shrinking a copy of the N = 64 kernel: a
// q_scale store under `tid < kRowsM`, compiled into the producer warpgroup's copy of the request
// loop where it never runs; without it the consumers' descriptors are uniform (74a7c2c). The
// role-split kernel (roles.cuh) has the same symptom from five such divergent shared-memory
// uses in its S warpgroups' own copy (first loads, refills, q_scale, bad_page, refill_page);
// adding divergent stores and mbarrier arrives to this probe did not reproduce it.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -Icpp -Iinclude \
//        -c bench/desc_uniform_probe.cu -o /tmp/p.o && cuobjdump -sass /tmp/p.o | awk \
//     '/Function :/ {f=$3} /R2UR/ {r[f]++} /GMMA/ {g[f]++} END {for (x in g) print x, g[x], r[x]+0}'
//
// kVariant bits: 1 the setmaxnreg role split, 2 an mbarrier wait per block, 4 exponentials on
// the accumulator between blocks.
#include <cstdint>
#include "decode/wgmma_ops.cuh"
#include "decode/sm90.cuh"
using snapmla::sm90::SmemDesc;
struct St { uint8_t q[4][8192]; struct alignas(1024) Stage { uint8_t c[4][8192]; } stage[4]; uint64_t bar[4]; };
template <int kVariant>
__global__ void __launch_bounds__(384, 1) k(float* out, const int* plan, int n0) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  St& s = *reinterpret_cast<St*>(smem_raw + ((1024u - (snapmla::sm90::smem_u32(smem_raw) & 1023u)) & 1023u));
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  auto consumer = [&] {
    float acc[32];
    int n = plan[blockIdx.x];
    int it0 = plan[blockIdx.x + 1];
    const SmemDesc qd = snapmla::sm90::make_desc_base(s.q[0], snapmla::sm90::Swizzle::k128B, 128);
    for (int it = wg; it < n; it += 2) {
      if (kVariant & 2) snapmla::sm90::mbar_wait(&s.bar[(it0 + it) % 4], ((it0 + it) / 4) & 1);
      const SmemDesc kd = snapmla::sm90::make_desc_base(s.stage[(it0 + it) % 4].c[0], snapmla::sm90::Swizzle::k128B, 128);
      asm volatile("wgmma.fence.sync.aligned;\n");
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const uint64_t a = qd.at(32 * (k % 4) + (k / 4) * 8192), b = kd.at(32 * (k % 4) + (k / 4) * 8192);
        if (k == 0) snapmla::sm90::wgmma_m64n64k32_e4m3_ss_init(acc, a, b);
        else snapmla::sm90::wgmma_m64n64k32_e4m3_ss(acc, a, b, 1);
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      if (kVariant & 4) { for (int i = 0; i < 32; ++i) acc[i] = __expf(acc[i]); }
    }
    for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] = acc[i];
  };
  if (kVariant & 1) {
    if (wg == 2) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
      if (threadIdx.x == 256) out[0] = 1.f;
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
      consumer();
    }
  } else {
    consumer();
  }
}
template __global__ void k<0>(float*, const int*, int);
template __global__ void k<1>(float*, const int*, int);
template __global__ void k<2>(float*, const int*, int);
template __global__ void k<3>(float*, const int*, int);
template __global__ void k<7>(float*, const int*, int);
