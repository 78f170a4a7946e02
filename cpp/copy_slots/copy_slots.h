// Byte-exact token moves between slots of one layer of the paged cache (engines that compact
// or reorder their caches).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

struct CopySlotsParams {
  uint8_t* layer_base;       // first page of the layer
  int64_t capacity;          // num_pages * 64 slots in the layer
  int64_t page_stride;       // bytes from a page to the next
  const int64_t* src_slots;  // [n]; < 0 or >= capacity: skipped
  const int64_t* dst_slots;  // [n]; < 0 or >= capacity: skipped
  int64_t num_tokens;        // n
};

cudaError_t launch_copy_slots(const CopySlotsParams& params, cudaStream_t stream);

}  // namespace snapmla
