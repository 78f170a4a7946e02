// The operations on a cache layer's tokens: append, fetch-dequant, gather-dequant, copy slots.
#include "api/cache.h"
#include "api/checks.h"
#include "append/append.h"
#include "copy_slots/copy_slots.h"
#include "fetch_dequant/fetch_dequant.h"

namespace snapmla::api {
namespace {

// The bytes of BF16 c_kv [rows, 512] and k_pe [rows, 64], for the aliasing checks.
struct Bf16Rows {
  Extent c_kv, k_pe;
};

Bf16Rows bf16_rows(const void* c_kv, int64_t c_kv_stride, const void* k_pe, int64_t k_pe_stride,
                   int64_t rows) {
  return {extent_of("c_kv", c_kv, 2, kContentDim, {{rows, c_kv_stride, ""}}),
          extent_of("k_pe", k_pe, 2, kRopeDim, {{rows, k_pe_stride, ""}})};
}

// The outputs c_kv and k_pe apart from the inputs and from each other.
snapmla_status_t check_rows_apart(const char* op, const Bf16Rows& out,
                                  std::initializer_list<Extent> inputs) {
  SNAPMLA_TRY(check_apart(op, out.c_kv, inputs));
  SNAPMLA_TRY(check_apart(op, out.c_kv, {out.k_pe}));
  return check_apart(op, out.k_pe, inputs);
}

}  // namespace
}  // namespace snapmla::api

using namespace snapmla;
using namespace snapmla::api;

extern "C" SNAPMLA_API snapmla_status_t snapmla_append(snapmla_cache_t handle, int32_t layer,
                                                       const void* c_kv, int64_t c_kv_stride,
                                                       const void* k_pe, int64_t k_pe_stride,
                                                       const int64_t* slots, int64_t num_tokens,
                                                       snapmla_stream_t stream) {
  const char* op = "snapmla_append";
  snapmla_cache cache;
  SNAPMLA_TRY(check_layer_rows(op, handle, layer, "num_tokens", num_tokens, &cache));
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_TRY(check_bf16_rows(op, c_kv, c_kv_stride, k_pe, k_pe_stride, num_tokens));
  SNAPMLA_TRY(check_pointer(op, "slots", slots, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_span(op, "slots", slots, 8, 1, {{num_tokens, 1, "num_tokens"}}));
  // The inputs apart from the cache the call writes.
  const Extent cache_ext = layer_extent(cache, layer);
  const Bf16Rows rows = bf16_rows(c_kv, c_kv_stride, k_pe, k_pe_stride, num_tokens);
  for (const Extent& in : {rows.c_kv, rows.k_pe, extent_of("slots", slots, 8, num_tokens, {})}) {
    SNAPMLA_TRY(check_apart(op, in, {cache_ext}));
  }
  SNAPMLA_TRY(check_device(op, &cache));
  AppendParams p{static_cast<const uint16_t*>(c_kv),
                 static_cast<const uint16_t*>(k_pe),
                 c_kv_stride,
                 k_pe_stride,
                 slots,
                 num_tokens,
                 layer_base(cache, layer),
                 int64_t{cache.num_pages} * kPageSize,
                 cache.page_stride};
  SNAPMLA_CUDA(op, launch_append(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_fetch_dequant(
    snapmla_cache_t handle, int32_t layer, const int64_t* slots, int64_t num_tokens, void* c_kv,
    int64_t c_kv_stride, void* k_pe, int64_t k_pe_stride, snapmla_stream_t stream) {
  const char* op = "snapmla_fetch_dequant";
  snapmla_cache cache;
  SNAPMLA_TRY(check_layer_rows(op, handle, layer, "num_tokens", num_tokens, &cache));
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_TRY(check_pointer(op, "slots", slots, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_span(op, "slots", slots, 8, 1, {{num_tokens, 1, "num_tokens"}}));
  SNAPMLA_TRY(check_bf16_rows(op, c_kv, c_kv_stride, k_pe, k_pe_stride, num_tokens));
  SNAPMLA_TRY(
      check_rows_apart(op, bf16_rows(c_kv, c_kv_stride, k_pe, k_pe_stride, num_tokens),
                       {layer_extent(cache, layer), extent_of("slots", slots, 8, num_tokens, {})}));
  SNAPMLA_TRY(check_device(op, &cache));
  FetchDequantParams p{layer_base(cache, layer),
                       int64_t{cache.num_pages} * kPageSize,
                       slots,
                       num_tokens,
                       static_cast<uint16_t*>(c_kv),
                       static_cast<uint16_t*>(k_pe),
                       c_kv_stride,
                       k_pe_stride,
                       cache.page_stride};
  SNAPMLA_CUDA(op, launch_fetch_dequant(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_gather_dequant(
    snapmla_cache_t handle, int32_t layer, const int32_t* block_table, int64_t block_table_stride,
    int32_t batch, int32_t max_pages, const int32_t* seqlens, const int64_t* out_rows,
    int64_t num_rows, void* c_kv, int64_t c_kv_stride, void* k_pe, int64_t k_pe_stride,
    snapmla_stream_t stream) {
  const char* op = "snapmla_gather_dequant";
  snapmla_cache cache;
  SNAPMLA_TRY(check_layer_rows(op, handle, layer, "num_rows", num_rows, &cache));
  if (num_rows == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_REQUIRE(batch >= 1 && batch <= kMaxBatch,
                  "%s: argument 'batch': expected 1 .. %d, got %d", op, kMaxBatch, batch);
  SNAPMLA_REQUIRE(max_pages >= 1 && max_pages <= kMaxPages,
                  "%s: argument 'max_pages': expected 1 .. %d, got %d", op, kMaxPages, max_pages);
  SNAPMLA_TRY(check_pointer(op, "block_table", block_table, kAlignInt32, "int32 elements"));
  SNAPMLA_REQUIRE(block_table_stride >= max_pages || batch == 1,
                  "%s: argument 'block_table_stride': expected >= max_pages = %d, got %lld", op,
                  max_pages, static_cast<long long>(block_table_stride));
  SNAPMLA_TRY(check_span(op, "block_table", block_table, 4, max_pages,
                         {{batch, block_table_stride, "block_table_stride"}}));
  SNAPMLA_TRY(check_pointer(op, "seqlens", seqlens, kAlignInt32, "int32 elements"));
  SNAPMLA_TRY(check_span(op, "seqlens", seqlens, 4, batch, {}));
  SNAPMLA_TRY(check_pointer(op, "out_rows", out_rows, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_span(op, "out_rows", out_rows, 8, batch, {}));
  SNAPMLA_TRY(check_bf16_rows(op, c_kv, c_kv_stride, k_pe, k_pe_stride, num_rows));
  SNAPMLA_TRY(check_rows_apart(
      op, bf16_rows(c_kv, c_kv_stride, k_pe, k_pe_stride, num_rows),
      {layer_extent(cache, layer),
       extent_of("block_table", block_table, 4, max_pages, {{batch, block_table_stride, ""}}),
       extent_of("seqlens", seqlens, 4, batch, {}),
       extent_of("out_rows", out_rows, 8, batch, {})}));
  SNAPMLA_TRY(check_device(op, &cache));
  const GatherDequantParams p{layer_base(cache, layer),
                              cache.num_pages,
                              cache.page_stride,
                              block_table,
                              block_table_stride,
                              batch,
                              max_pages,
                              seqlens,
                              out_rows,
                              num_rows,
                              static_cast<uint16_t*>(c_kv),
                              static_cast<uint16_t*>(k_pe),
                              c_kv_stride,
                              k_pe_stride};
  SNAPMLA_CUDA(op, launch_gather_dequant(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_copy_slots(snapmla_cache_t handle, int32_t layer,
                                                           const int64_t* src_slots,
                                                           const int64_t* dst_slots,
                                                           int64_t num_tokens,
                                                           snapmla_stream_t stream) {
  const char* op = "snapmla_copy_slots";
  snapmla_cache cache;
  SNAPMLA_TRY(check_layer_rows(op, handle, layer, "num_tokens", num_tokens, &cache));
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_TRY(check_pointer(op, "src_slots", src_slots, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_pointer(op, "dst_slots", dst_slots, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_span(op, "src_slots", src_slots, 8, 1, {{num_tokens, 1, "num_tokens"}}));
  SNAPMLA_TRY(check_span(op, "dst_slots", dst_slots, 8, 1, {{num_tokens, 1, "num_tokens"}}));
  // The slot arrays apart from the cache the call writes.
  const Extent cache_ext = layer_extent(cache, layer);
  SNAPMLA_TRY(check_apart(op, extent_of("src_slots", src_slots, 8, num_tokens, {}), {cache_ext}));
  SNAPMLA_TRY(check_apart(op, extent_of("dst_slots", dst_slots, 8, num_tokens, {}), {cache_ext}));
  SNAPMLA_TRY(check_device(op, &cache));
  const CopySlotsParams p{layer_base(cache, layer),
                          int64_t{cache.num_pages} * kPageSize,
                          cache.page_stride,
                          src_slots,
                          dst_slots,
                          num_tokens};
  SNAPMLA_CUDA(op, launch_copy_slots(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}
