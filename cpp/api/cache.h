// The object behind a snapmla_cache_t handle, and the lookups every operation on a cache makes.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "api/checks.h"
#include "snapmla/snapmla.h"

// A live cache carries a magic word at each end, cleared by destroy: handles are looked up, never
// dereferenced, so the words guard against corruption of the object itself.
struct snapmla_cache {
  uint64_t magic_begin;
  uint8_t* data;
  size_t bytes;  // num_layers * num_pages * page_stride, <= INT64_MAX (all layers' bytes)
  int32_t device;
  int32_t num_layers;
  int32_t num_pages;
  bool owns_memory;
  uint8_t* const* layers;  // per-layer bases (config.layer_memory, copied; owned), or nullptr
  int64_t page_stride;     // bytes from a page to the next (kPageBytes: packed)
  uint64_t magic_end;
};

namespace snapmla::api {

// The live cache behind `handle`, copied into *cache.
snapmla_status_t get_cache(const char* op, snapmla_cache_t handle, snapmla_cache* cache);

// The live cache behind `handle` (copied into *cache) and a layer index inside it.
snapmla_status_t check_cache_layer(const char* op, snapmla_cache_t handle, const char* layer_name,
                                   int32_t layer, snapmla_cache* cache);

// check_cache_layer for argument 'layer', then a count of rows or tokens >= 0.
snapmla_status_t check_layer_rows(const char* op, snapmla_cache_t handle, int32_t layer,
                                  const char* count_name, int64_t count, snapmla_cache* cache);

// layer < num_layers and the cache's bytes are <= INT64_MAX: the offset cannot overflow.
inline uint8_t* layer_base(const snapmla_cache& c, int32_t layer) {
  if (c.layers != nullptr) return c.layers[layer];
  return c.data + static_cast<int64_t>(layer) * c.num_pages * c.page_stride;
}

// The memory a call on `layer` must not alias: all of a one-block cache (its layers are one
// allocation), the layer's own memory in a cache made from config.layer_memory.
inline Extent layer_extent(const snapmla_cache& c, int32_t layer) {
  if (c.layers == nullptr) return extent_of("cache", c.data, 1, static_cast<int64_t>(c.bytes), {});
  return extent_of("cache", c.layers[layer], 1, int64_t{c.num_pages} * c.page_stride, {});
}

}  // namespace snapmla::api
