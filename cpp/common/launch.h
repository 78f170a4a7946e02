// Small host-side helpers shared by the launchers.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Multiprocessor count of the current device (cached per device; graph-capture safe).
cudaError_t current_device_sm_count(int* sm_count);

// Blocks for a warp-per-item kernel over `items` items: enough for one warp each, at most
// blocks_per_sm resident blocks per multiprocessor (the warps loop over the rest).
inline cudaError_t warp_per_item_blocks(int64_t items, int warps_per_block, int blocks_per_sm,
                                        int* blocks) {
  int sms = 0;
  const cudaError_t err = current_device_sm_count(&sms);
  if (err != cudaSuccess) return err;
  const int64_t want = (items + warps_per_block - 1) / warps_per_block;
  const int64_t most = int64_t{sms} * blocks_per_sm;
  *blocks = static_cast<int>(want < most ? want : most);
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

// SNAPMLA_PDL (experimental, off; bench/NOTES.md): programmatic dependent launch along a decode
// call's kernels (Q-quant -> attention -> combine). The attention kernel and the combine are
// launched with programmatic stream serialization: each may start once every CTA of the kernel
// before it has started (each triggers at its start), runs its prologue (barriers, tensor-map
// prefetch) and waits (griddep_wait) before its first read of global memory, so the launch
// latency between the kernels overlaps the previous kernel instead of following it. The
// Q-quant kernel itself is launched as before (it must not start before the previous call's
// attention kernel has read the Q workspace it overwrites). (Where the seesaw kernel quantizes
// its own Q tile, decode.h's seesaw_fuses_q, the attention kernel is the call's first and reads
// the BF16 query through L2, as the two-term tile load does.) Without the attribute both device instructions are no-ops.
// SNAPMLA_PDL=2 (experimental, session 14): the same launches, but the seesaw kernel waits only
// where it first reads what the Q-quant kernel writes (the Q tile, its scales), so that its
// prologue (barriers, the plan, the block table, the first pages' TMA) overlaps the Q-quant
// kernel; and it lets the combine launch at each CTA's end, not at its start. Reading the plan,
// the block table, the lengths and the cache before the wait is sound because the Q-quant kernel
// is launched without the attribute: it starts after everything before it in the stream has
// completed, and the attention kernel starts after it. Where the seesaw kernel is the call's
// first kernel (the fused Q) it waits at entry, as under 1.
#ifndef SNAPMLA_PDL
#define SNAPMLA_PDL 0
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
