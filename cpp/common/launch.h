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

}  // namespace snapmla
