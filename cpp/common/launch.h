// Small host-side helpers shared by the launchers.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Multiprocessor count of the current device (cached per device; graph-capture safe).
cudaError_t current_device_sm_count(int* sm_count);

// Blocks for a warp-per-item kernel over `items` items on `sms` multiprocessors: enough for one
// warp each, at most blocks_per_sm resident blocks per multiprocessor (the warps loop over the
// rest).
constexpr int64_t warp_per_item_grid(int64_t items, int warps_per_block, int blocks_per_sm,
                                     int sms) {
  const int64_t want = (items + warps_per_block - 1) / warps_per_block;
  const int64_t most = int64_t{sms} * blocks_per_sm;
  return want < most ? want : most;
}

// The same on the current device.
inline cudaError_t warp_per_item_blocks(int64_t items, int warps_per_block, int blocks_per_sm,
                                        int* blocks) {
  int sms = 0;
  const cudaError_t err = current_device_sm_count(&sms);
  if (err != cudaSuccess) return err;
  *blocks = static_cast<int>(warp_per_item_grid(items, warps_per_block, blocks_per_sm, sms));
  return cudaSuccess;
}

// BF16 rows of the latent (512) and the RoPE key (64) that 16-byte vector accesses can take:
// 16-byte aligned bases and row strides that are multiples of 8 elements.
inline bool bf16_rows_vectorizable(const void* c_kv, int64_t c_kv_stride, const void* k_pe,
                                   int64_t k_pe_stride) {
  return reinterpret_cast<uintptr_t>(c_kv) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(k_pe) % 16 == 0 && c_kv_stride % 8 == 0 &&
         k_pe_stride % 8 == 0;
}

// SNAPMLA_PDL: programmatic dependent launch along a decode call's kernels (Q-quant ->
// attention -> combine). The attention kernel and the combine are launched with programmatic
// stream serialization; the Q-quant kernel is launched as before, so it starts only after
// everything before it in the stream has completed (it must not overwrite the Q workspace
// before the previous call's attention kernel has read it).
//   2 (the default since session 14): the Q-quant kernel lets the attention kernel launch at
//     its start. The seesaw kernel runs its prologue (barriers, the plan, the block table, the
//     first pages' TMA) without waiting, and waits (griddep_wait) only before its first read of
//     the Q-quant kernel's output (the Q tile, its scales): everything else it reads was written
//     before the Q-quant kernel started. It lets the combine launch at each CTA's end; the
//     combine waits before reading the partials. Where the seesaw kernel is the call's first
//     kernel (the fused Q: no Q-quant kernel before it) it waits at entry. (The reference
//     kernel is launched without the attribute.) Graph replays on the H200, a build with 0
//     against 2 in one call (bench/results/2026-12-02-s14/decode-cases-9231717-nopdl.json,
//     decode-auto-9231717.json): 1x1x128x4096 19.3 -> 17.3 us, 1x1x128x8192 23.4 -> 21.4,
//     1x1x16x8192 17.0 -> 16.0, 8x1x128x1024 22.0 -> 21.0.
//   1 (session 11, slower): every kernel waits at entry and triggers at its start (the combine's
//     CTAs then sat on SMs the attention kernel needed: 1x128x8192 kernel + combine 83 us).
//   0: plain launches; both device instructions are no-ops.
#ifndef SNAPMLA_PDL
#define SNAPMLA_PDL 2
#endif

#ifdef __CUDACC__
// Wait until the grids this one depends on programmatically have completed and their memory
// is visible (griddepcontrol.wait).
__device__ __forceinline__ void griddep_wait() {
#if SNAPMLA_PDL >= 1
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Let the dependent grid launch once every CTA of this one has started or exited.
__device__ __forceinline__ void griddep_launch_dependents() {
#if SNAPMLA_PDL >= 1
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// <<<grid, block, smem, stream>>>(args...), with programmatic stream serialization under
// SNAPMLA_PDL.
template <typename... Params, typename... Args>
inline cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, Args&&... args) {
#if SNAPMLA_PDL >= 1
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  const cudaError_t last = cudaGetLastError();  // clears a failed launch's error, as below
  return err != cudaSuccess ? err : last;
#else
  kernel<<<grid, block, smem, stream>>>(static_cast<Params>(args)...);
  return cudaGetLastError();
#endif
}
#endif  // __CUDACC__

}  // namespace snapmla
