#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Multiprocessor count of the current device (cached per device; graph-capture safe).
cudaError_t current_device_sm_count(int* sm_count);

// One warp an item, at most blocks_per_sm blocks an SM (the warps loop over the rest).
constexpr int64_t warp_per_item_grid(int64_t items, int warps_per_block, int blocks_per_sm,
                                     int sms) {
  const int64_t want = (items + warps_per_block - 1) / warps_per_block;
  const int64_t most = int64_t{sms} * blocks_per_sm;
  return want < most ? want : most;
}

inline cudaError_t warp_per_item_blocks(int64_t items, int warps_per_block, int blocks_per_sm,
                                        int* blocks) {
  int sms = 0;
  const cudaError_t err = current_device_sm_count(&sms);
  if (err != cudaSuccess) return err;
  *blocks = static_cast<int>(warp_per_item_grid(items, warps_per_block, blocks_per_sm, sms));
  return cudaSuccess;
}

inline bool bf16_rows_vectorizable(const void* c_kv, int64_t c_kv_stride, const void* k_pe,
                                   int64_t k_pe_stride) {
  return reinterpret_cast<uintptr_t>(c_kv) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(k_pe) % 16 == 0 && c_kv_stride % 8 == 0 &&
         k_pe_stride % 8 == 0;
}

// Programmatic dependent launch (docs/design.md, "A decode call"). The Q-quant kernel is launched
// plainly, so it cannot overwrite Q before the previous call's attention kernel has read it, and
// the kernels after it wait (griddep_wait) only before reading their predecessor's output.
#ifdef __CUDACC__
__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Let the dependent grid launch once every CTA of this one has started or exited.
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

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
