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

// Programmatic dependent launch along a decode call's kernels (Q-quant -> attention ->
// combine). The attention kernel and the combine are launched with programmatic stream
// serialization; the Q-quant kernel is launched plainly, so it starts only after everything
// before it in the stream has completed (it must not overwrite the Q workspace before the
// previous call's attention kernel has read it). The Q-quant kernel lets the attention kernel
// launch at its start; the attention kernel runs its prologue (barriers, the plan, the block
// table, the first page) and waits (griddep_wait) only before its first read of the Q-quant
// kernel's output: everything else it reads was written before the Q-quant kernel started. The
// attention kernel lets the combine launch from its CTAs' last epilogue; the combine waits
// before reading the partials.
#ifdef __CUDACC__
// Wait until the grids this one depends on programmatically have completed and their memory
// is visible (griddepcontrol.wait).
__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Let the dependent grid launch once every CTA of this one has started or exited.
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// <<<grid, block, smem, stream>>>(args...), with programmatic stream serialization.
template <typename... Params, typename... Args>
inline cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, Args&&... args) {
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
}
#endif  // __CUDACC__

}  // namespace snapmla
