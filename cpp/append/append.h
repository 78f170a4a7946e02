// Fused K-append: quantize new tokens and write them into one layer of the paged cache.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

struct AppendParams {
  const uint16_t* c_kv;  // bf16 [n, 512], row stride c_kv_stride
  const uint16_t* k_pe;  // bf16 [n, 64],  row stride k_pe_stride
  int64_t c_kv_stride;   // elements
  int64_t k_pe_stride;   // elements
  const int64_t* slots;  // [n]; < 0 or >= capacity: skipped
  int64_t num_tokens;    // n
  uint8_t* layer_base;   // first page of the layer
  int64_t capacity;      // num_pages * 64 slots in the layer
  int64_t page_stride;   // bytes from a page to the next (kPageBytes: packed)
};

cudaError_t launch_append(const AppendParams& params, cudaStream_t stream);

}  // namespace snapmla
