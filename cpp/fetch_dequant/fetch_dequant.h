// Fused fetch-dequant: gather tokens from the paged FP8 cache back to BF16.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

struct FetchDequantParams {
  const uint8_t* layer_base;  // first page of the layer
  int64_t capacity;           // num_pages * 64
  const int64_t* slots;       // [n]; < 0: zeros; >= capacity: NaN
  int64_t num_tokens;         // n
  uint16_t* c_kv;             // bf16 [n, 512] out, row stride c_kv_stride
  uint16_t* k_pe;             // bf16 [n, 64] out, row stride k_pe_stride
  int64_t c_kv_stride;        // elements
  int64_t k_pe_stride;        // elements
  int64_t page_stride;        // bytes from a page to the next (kPageBytes: packed)
};

cudaError_t launch_fetch_dequant(const FetchDequantParams& params, cudaStream_t stream);

// Tokens by block table: token i < seqlens[r] of request r -> output row out_rows[r] + i.
struct GatherDequantParams {
  const uint8_t* layer_base;  // first page of the layer
  int32_t num_pages;          // pages in the layer (page ids outside: NaN rows)
  int64_t page_stride;        // bytes from a page to the next
  const int32_t* block_table; // [batch, max_pages], row stride block_table_stride
  int64_t block_table_stride;
  int32_t batch;
  int32_t max_pages;          // tokens past max_pages * 64 are skipped
  const int32_t* seqlens;     // [batch]; < 0 reads as 0
  const int64_t* out_rows;    // [batch]
  int64_t num_rows;           // rows outside [0, num_rows) are skipped
  uint16_t* c_kv;             // bf16 [num_rows, 512] out, row stride c_kv_stride
  uint16_t* k_pe;             // bf16 [num_rows, 64] out, row stride k_pe_stride
  int64_t c_kv_stride;
  int64_t k_pe_stride;
};

cudaError_t launch_gather_dequant(const GatherDequantParams& params, cudaStream_t stream);

}  // namespace snapmla
