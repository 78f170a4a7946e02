// A cache handle's life (create, destroy) and its queries (info, layer data, bytes of a shape).
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "api/cache.h"
#include "api/checks.h"
#include "common/driver.h"

namespace snapmla::api {
namespace {

constexpr int64_t kMaxBytes = INT64_MAX;  // every byte offset is an int64
constexpr size_t kAlignCache = 256;       // cudaMalloc's; planes 128-byte aligned, TMA 16
constexpr size_t kAlignLayer = 128;       // a layer of config.layer_memory: the planes' alignment
constexpr int64_t kMaxPageStride = int64_t{1} << 40;  // TMA: global strides below 2^40

constexpr uint64_t kCacheMagicBegin = 0x534e41504d4c4131ull;  // "SNAPMLA1", big-endian
constexpr uint64_t kCacheMagicEnd = 0x31414c4d50414e53ull;    // the same, byte-reversed

// `device` current for the scope's life, the caller's device back after it.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    status_ = cudaGetDevice(&previous_);
    if (status_ == cudaSuccess && previous_ != device) {
      status_ = cudaSetDevice(device);
      switched_ = status_ == cudaSuccess;
    }
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  cudaError_t status_ = cudaSuccess;
};

// Live caches by handle. A handle is kHandleTag | a serial number, never an address: a lookup
// dereferences nothing the caller gave, and a destroyed handle stays refused. Calls on a cache
// take the lock shared; create and destroy take it exclusively.
enum class Lookup { kLive, kUnknown, kCorrupt };

class CacheRegistry {
 public:
  static constexpr uintptr_t kHandleTag = uintptr_t{0x5ca7} << 48;

  // Registers `cache`; 0 when out of host memory.
  uintptr_t add(snapmla_cache* cache) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    const uintptr_t handle = kHandleTag | ++serial_;
    try {
      live_.emplace(handle, cache);
    } catch (...) {
      return 0;
    }
    return handle;
  }

  // Copies the live cache of `handle` into *out.
  Lookup get(uintptr_t handle, snapmla_cache* out) const {
    std::shared_lock<std::shared_mutex> lock(mu_);
    const auto it = live_.find(handle);
    if (it == live_.end()) return Lookup::kUnknown;
    if (it->second->magic_begin != kCacheMagicBegin || it->second->magic_end != kCacheMagicEnd) {
      return Lookup::kCorrupt;
    }
    *out = *it->second;
    return Lookup::kLive;
  }

  // Unregisters `handle` and clears its magic words; *out is its object (nullptr if unknown).
  Lookup remove(uintptr_t handle, snapmla_cache** out) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    *out = nullptr;
    const auto it = live_.find(handle);
    if (it == live_.end()) return Lookup::kUnknown;
    snapmla_cache* cache = it->second;
    live_.erase(it);
    const bool intact =
        cache->magic_begin == kCacheMagicBegin && cache->magic_end == kCacheMagicEnd;
    cache->magic_begin = cache->magic_end = 0;
    *out = cache;
    return intact ? Lookup::kLive : Lookup::kCorrupt;
  }

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<uintptr_t, snapmla_cache*> live_;
  uint64_t serial_ = 0;
};

// Never destroyed: a handle may be destroyed during static destruction (a Python finalizer).
CacheRegistry& registry() {
  static CacheRegistry* r = new CacheRegistry;
  return *r;
}

// num_layers * num_pages * kPageBytes in checked arithmetic, the arguments named as given.
snapmla_status_t cache_bytes_of(const char* op, const char* layers_name, const char* pages_name,
                                int32_t num_layers, int32_t num_pages, size_t* bytes) {
  SNAPMLA_REQUIRE(num_layers >= 1, "%s: argument '%s': expected >= 1, got %d", op, layers_name,
                  num_layers);
  SNAPMLA_REQUIRE(num_pages >= 1 && num_pages <= kMaxPages,
                  "%s: argument '%s': expected 1 .. %d, got %d", op, pages_name, kMaxPages,
                  num_pages);
  const int64_t layer_bytes = int64_t{num_pages} * kPageBytes;  // < 2^31 * 41216 / 64
  int64_t total = 0;
  SNAPMLA_REQUIRE(!__builtin_mul_overflow(int64_t{num_layers}, layer_bytes, &total),
                  "%s: argument '%s': expected <= %lld for %s = %d (the cache's %d x %d x %lld "
                  "bytes must be at most 2^63 - 1), got %d",
                  op, layers_name, static_cast<long long>(kMaxBytes / layer_bytes), pages_name,
                  num_pages, num_layers, num_pages, static_cast<long long>(kPageBytes), num_layers);
  *bytes = static_cast<size_t>(total);
  return SNAPMLA_SUCCESS;
}

// The driver's cuPointerGetAttribute; nullptr where the driver does not give it.
PFN_cuPointerGetAttribute_v4000 pointer_attribute_fn() {
  static const auto fn =
      reinterpret_cast<PFN_cuPointerGetAttribute_v4000>(driver_function("cuPointerGetAttribute"));
  return fn;
}

// The memory type at `p`, as a refusal names it.
const char* memory_kind(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeHost:
      return "host memory (pinned or registered)";
    case cudaMemoryTypeUnregistered:
      return "memory CUDA does not know (pageable host memory, or no allocation)";
    default:
      return "not device memory";
  }
}

// One byte of caller memory: device memory of `device`, or managed memory (migrated to the
// device that touches it, wherever it was allocated).
snapmla_status_t check_memory_at(const char* op, const char* name, const void* p, int device) {
  cudaPointerAttributes attr;
  SNAPMLA_CUDA(op, cudaPointerGetAttributes(&attr, p));
  SNAPMLA_REQUIRE(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
                  "%s: argument '%s': CUDA reports %p as %s; expected device memory of device %d "
                  "(cudaMalloc, a memory pool, a VMM mapping) or managed memory",
                  op, name, p, memory_kind(attr.type), device);
  SNAPMLA_REQUIRE(attr.type == cudaMemoryTypeManaged || attr.device == device,
                  "%s: argument '%s': CUDA reports %p as memory of device %d; expected device %d "
                  "(config.device)",
                  op, name, p, attr.device, device);
  return SNAPMLA_SUCCESS;
}

// Caller memory [p, p + bytes) of a cache on `device`: device memory of that device or managed
// memory, from its first byte to its last inside one allocation (the driver's range of the
// first byte, which for a VMM mapping is its reserved address range; without the driver's
// query, the last byte's own type and device). Two to four driver queries: once per cache.
snapmla_status_t check_caller_memory(const char* op, const char* name, const char* bytes_name,
                                     const void* p, size_t bytes, int device) {
  SNAPMLA_TRY(check_memory_at(op, name, p, device));
  const uintptr_t first = reinterpret_cast<uintptr_t>(p);
  const PFN_cuPointerGetAttribute_v4000 get = pointer_attribute_fn();
  CUdeviceptr start = 0;
  size_t size = 0;
  if (get == nullptr ||
      get(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, static_cast<CUdeviceptr>(first)) !=
          CUDA_SUCCESS ||
      get(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, static_cast<CUdeviceptr>(first)) !=
          CUDA_SUCCESS) {
    return check_memory_at(op, bytes_name, reinterpret_cast<const void*>(first + bytes - 1),
                           device);
  }
  SNAPMLA_REQUIRE(first - start <= size && bytes <= size - (first - start),
                  "%s: argument '%s': [%p, %p + %zu bytes) runs past the end of its allocation, "
                  "which CUDA reports as [%p, %p + %zu bytes)",
                  op, bytes_name, p, p, bytes, reinterpret_cast<void*>(start),
                  reinterpret_cast<void*>(start), size);
  return SNAPMLA_SUCCESS;
}

// No usable CUDA driver or device in this process: no memory to check caller pointers against,
// and no call could run on the cache.
bool no_gpu(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
         err == cudaErrorStubLibrary;
}

// The caller's memory of a checked config (config.memory or config.layer_memory) on `device`,
// checked with `device` current (its primary context is the one the cache's calls use).
snapmla_status_t check_cache_memory(const char* op, const snapmla_cache_config_t& c,
                                    const std::vector<uint8_t*>& layers, size_t layer_bytes,
                                    int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (no_gpu(err)) {
    cudaGetLastError();
    return SNAPMLA_SUCCESS;
  }
  SNAPMLA_CUDA(op, err);
  SNAPMLA_REQUIRE(device < count,
                  "%s: argument 'config.device': CUDA reports %d devices, expected 0 .. %d, got %d",
                  op, count, count - 1, device);
  const DeviceScope scope(device);
  SNAPMLA_CUDA(op, scope.status());
  snapmla_status_t st = SNAPMLA_SUCCESS;
  if (layers.empty()) {
    st = check_caller_memory(op, "config.memory", "config.memory_bytes", c.memory, c.memory_bytes,
                             device);
  }
  for (size_t l = 0; l < layers.size() && st == SNAPMLA_SUCCESS; ++l) {
    char name[48];
    std::snprintf(name, sizeof(name), "config.layer_memory[%zu]", l);
    st = check_caller_memory(op, name, name, layers[l], layer_bytes, device);
  }
  return st;
}

// The registered cache of a checked config, its memory allocated on `device` if not given.
snapmla_status_t make_cache(const char* op, const snapmla_cache_config_t& c, size_t bytes,
                            int64_t page_stride, int device, const std::vector<uint8_t*>& layers,
                            snapmla_cache_t* cache_out) {
  uint8_t* data = layers.empty() ? static_cast<uint8_t*>(c.memory) : layers[0];
  uint8_t** layer_copy = nullptr;
  if (!layers.empty()) {
    layer_copy = new (std::nothrow) uint8_t*[layers.size()];
    if (layer_copy == nullptr) {
      return fail(SNAPMLA_ERROR_OUT_OF_MEMORY, "%s: out of host memory", op);
    }
    std::copy(layers.begin(), layers.end(), layer_copy);
  }
  if (data == nullptr) {
    void* p = nullptr;
    cudaError_t err = cudaSuccess;
    {
      const DeviceScope scope(device);
      SNAPMLA_CUDA(op, scope.status());
      err = cudaMalloc(&p, bytes);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return fail(SNAPMLA_ERROR_OUT_OF_MEMORY, "%s: cudaMalloc of %zu bytes on device %d failed",
                  op, bytes, device);
    }
    if (err != cudaSuccess) return cuda_fail(op, err);
    data = static_cast<uint8_t*>(p);
  }
  const bool owns = c.memory == nullptr && layer_copy == nullptr;
  snapmla_cache* cache = new (std::nothrow)
      snapmla_cache{kCacheMagicBegin, data, bytes,      device,      c.num_layers,
                    c.num_pages,      owns, layer_copy, page_stride, kCacheMagicEnd};
  const uintptr_t handle = cache != nullptr ? registry().add(cache) : 0;
  if (handle == 0) {
    delete cache;
    delete[] layer_copy;
    if (owns) cudaFree(data);
    return fail(SNAPMLA_ERROR_OUT_OF_MEMORY, "%s: out of host memory", op);
  }
  *cache_out = reinterpret_cast<snapmla_cache_t>(handle);
  return SNAPMLA_SUCCESS;
}

}  // namespace

snapmla_status_t get_cache(const char* op, snapmla_cache_t handle, snapmla_cache* cache) {
  SNAPMLA_REQUIRE(handle != nullptr, "%s: argument 'cache' is NULL", op);
  switch (registry().get(reinterpret_cast<uintptr_t>(handle), cache)) {
    case Lookup::kLive:
      return SNAPMLA_SUCCESS;
    case Lookup::kUnknown:
      break;
    case Lookup::kCorrupt:
      return fail(SNAPMLA_ERROR_INTERNAL,
                  "%s: argument 'cache': the object of handle %p has been overwritten (its magic "
                  "words are gone)",
                  op, static_cast<void*>(handle));
  }
  return fail(SNAPMLA_ERROR_INVALID_ARGUMENT,
              "%s: argument 'cache': %p is not a live cache handle (destroyed, or not returned "
              "by snapmla_cache_create)",
              op, static_cast<void*>(handle));
}

snapmla_status_t check_cache_layer(const char* op, snapmla_cache_t handle, const char* layer_name,
                                   int32_t layer, snapmla_cache* cache) {
  SNAPMLA_TRY(get_cache(op, handle, cache));
  SNAPMLA_REQUIRE(layer >= 0 && layer < cache->num_layers,
                  "%s: argument '%s': expected 0 <= layer < %d, got %d", op, layer_name,
                  cache->num_layers, layer);
  return SNAPMLA_SUCCESS;
}

snapmla_status_t check_layer_rows(const char* op, snapmla_cache_t handle, int32_t layer,
                                  const char* count_name, int64_t count, snapmla_cache* cache) {
  SNAPMLA_TRY(check_cache_layer(op, handle, "layer", layer, cache));
  SNAPMLA_REQUIRE(count >= 0, "%s: argument '%s': expected >= 0, got %lld", op, count_name,
                  static_cast<long long>(count));
  return SNAPMLA_SUCCESS;
}

}  // namespace snapmla::api

using namespace snapmla;
using namespace snapmla::api;

extern "C" SNAPMLA_API snapmla_status_t snapmla_cache_bytes(int32_t num_layers, int32_t num_pages,
                                                            size_t* bytes) {
  const char* op = "snapmla_cache_bytes";
  SNAPMLA_REQUIRE(bytes != nullptr, "%s: argument 'bytes' is NULL", op);
  return cache_bytes_of(op, "num_layers", "num_pages", num_layers, num_pages, bytes);
}

extern "C" SNAPMLA_API snapmla_status_t
snapmla_cache_create(const snapmla_cache_config_t* config_in, snapmla_cache_t* cache_out) {
  const char* op = "snapmla_cache_create";
  SNAPMLA_REQUIRE(cache_out != nullptr, "%s: argument 'cache' is NULL", op);
  snapmla_cache_config_t c;
  SNAPMLA_TRY(read_sized(
      op, "config", config_in, &c, offsetof(snapmla_cache_config_t, memory_bytes) + sizeof(size_t),
      {{"layer_memory", offsetof(snapmla_cache_config_t, layer_memory), sizeof(void*)},
       {"page_stride", offsetof(snapmla_cache_config_t, page_stride), sizeof(size_t)}}));
  SNAPMLA_REQUIRE(c.page_size == 0 || c.page_size == SNAPMLA_PAGE_SIZE,
                  "%s: argument 'config.page_size': expected 0 or %d, got %d", op,
                  SNAPMLA_PAGE_SIZE, c.page_size);
  size_t bytes = 0;
  SNAPMLA_TRY(cache_bytes_of(op, "config.num_layers", "config.num_pages", c.num_layers, c.num_pages,
                             &bytes));
  int64_t page_stride = kPageBytes;
  if (c.page_stride != 0) {
    SNAPMLA_REQUIRE(c.page_stride >= static_cast<size_t>(kPageBytes) && c.page_stride % 128 == 0 &&
                        c.page_stride < static_cast<size_t>(kMaxPageStride),
                    "%s: argument 'config.page_stride': expected 0 (packed) or a multiple of 128 "
                    ">= %lld (a page's bytes) and < 2^40 (TMA), got %zu",
                    op, static_cast<long long>(kPageBytes), c.page_stride);
    page_stride = static_cast<int64_t>(c.page_stride);
    int64_t layer_span = 0, total = 0;
    SNAPMLA_REQUIRE(!__builtin_mul_overflow(int64_t{c.num_pages}, page_stride, &layer_span) &&
                        !__builtin_mul_overflow(int64_t{c.num_layers}, layer_span, &total),
                    "%s: argument 'config.page_stride': %d layers x %d pages x %zu bytes is "
                    "more than 2^63 - 1 bytes",
                    op, c.num_layers, c.num_pages, c.page_stride);
    bytes = static_cast<size_t>(total);
  }
  SNAPMLA_REQUIRE(c.device >= -1 && c.device < kMaxDevices,
                  "%s: argument 'config.device': expected -1 .. %d, got %d", op, kMaxDevices - 1,
                  c.device);
  std::vector<uint8_t*> layers;  // config.layer_memory, checked
  std::vector<int32_t> order;    // layer indices by address
  if (c.layer_memory != nullptr) {
    try {
      layers.resize(static_cast<size_t>(c.num_layers));
      order.resize(static_cast<size_t>(c.num_layers));
    } catch (const std::bad_alloc&) {
      return fail(SNAPMLA_ERROR_OUT_OF_MEMORY, "%s: out of host memory", op);
    }
    SNAPMLA_REQUIRE(c.memory == nullptr,
                    "%s: argument 'config.layer_memory': expected NULL when config.memory is "
                    "set (one or the other), got %p",
                    op, static_cast<const void*>(c.layer_memory));
    const size_t layer_bytes = static_cast<size_t>(c.num_pages) * static_cast<size_t>(page_stride);
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const void* p = c.layer_memory[l];
      char name[48];
      std::snprintf(name, sizeof(name), "config.layer_memory[%d]", l);
      SNAPMLA_TRY(check_pointer(op, name, p, kAlignLayer, "a layer's base: its planes' alignment"));
      uintptr_t last = 0;
      SNAPMLA_REQUIRE(
          !__builtin_add_overflow(reinterpret_cast<uintptr_t>(p), layer_bytes - 1, &last),
          "%s: argument 'config.layer_memory[%d]': %p + %zu bytes (a layer) runs past the end "
          "of the address space",
          op, l, p, layer_bytes);
      layers[static_cast<size_t>(l)] = static_cast<uint8_t*>(const_cast<void*>(p));
    }
    // No two layers share a byte: sorted by address, each ends before the next begins.
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return layers[a] < layers[b]; });
    for (size_t i = 1; i < order.size(); ++i) {
      const uintptr_t prev = reinterpret_cast<uintptr_t>(layers[order[i - 1]]);
      const uintptr_t next = reinterpret_cast<uintptr_t>(layers[order[i]]);
      SNAPMLA_REQUIRE(next - prev >= layer_bytes,
                      "%s: argument 'config.layer_memory[%d]': %p overlaps layer %d at %p (a "
                      "layer is %zu bytes)",
                      op, order[i], static_cast<void*>(layers[order[i]]), order[i - 1],
                      static_cast<void*>(layers[order[i - 1]]), layer_bytes);
    }
  }
  if (c.memory != nullptr) {
    SNAPMLA_TRY(check_pointer(op, "config.memory", c.memory, kAlignCache,
                              "the cache's base, as cudaMalloc aligns it"));
    SNAPMLA_REQUIRE(c.memory_bytes >= bytes,
                    "%s: argument 'config.memory_bytes': expected >= %zu for %d layers x %d "
                    "pages, got %zu",
                    op, bytes, c.num_layers, c.num_pages, c.memory_bytes);
    uintptr_t last = 0;
    SNAPMLA_REQUIRE(
        !__builtin_add_overflow(reinterpret_cast<uintptr_t>(c.memory), c.memory_bytes - 1, &last),
        "%s: argument 'config.memory_bytes': %p + %zu bytes runs past the end of the "
        "address space",
        op, c.memory, c.memory_bytes);
  }
  int device = c.device;
  if (device < 0 || (c.memory == nullptr && layers.empty())) {
    if (validate_only()) return validated(op);
  }
  if (device < 0) SNAPMLA_CUDA(op, cudaGetDevice(&device));
  if ((c.memory != nullptr || !layers.empty()) && !validate_only()) {
    const size_t layer_bytes = static_cast<size_t>(c.num_pages) * static_cast<size_t>(page_stride);
    SNAPMLA_TRY(check_cache_memory(op, c, layers, layer_bytes, device));
  }
  return make_cache(op, c, bytes, page_stride, device, layers, cache_out);
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_cache_destroy(snapmla_cache_t handle) {
  const char* op = "snapmla_cache_destroy";
  if (handle == nullptr) return SNAPMLA_SUCCESS;
  snapmla_cache* cache = nullptr;
  const Lookup found = registry().remove(reinterpret_cast<uintptr_t>(handle), &cache);
  if (found == Lookup::kUnknown) {
    return fail(SNAPMLA_ERROR_INVALID_ARGUMENT,
                "%s: argument 'cache': %p is not a live cache handle (already destroyed, or not "
                "returned by snapmla_cache_create)",
                op, static_cast<void*>(handle));
  }
  if (found == Lookup::kCorrupt) {
    // Unregistered, but its fields cannot be trusted: leak the object and its memory.
    return fail(SNAPMLA_ERROR_INTERNAL,
                "%s: argument 'cache': the object of handle %p has been overwritten (its magic "
                "words are gone); it was unregistered and not freed",
                op, static_cast<void*>(handle));
  }
  cudaError_t err = cudaSuccess;
  if (cache->owns_memory) {  // on its own device, whichever one the caller has current
    const DeviceScope scope(cache->device);
    err = scope.status() == cudaSuccess ? cudaFree(cache->data) : scope.status();
  }
  delete[] cache->layers;
  delete cache;
  if (err != cudaSuccess) return cuda_fail(op, err);
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_cache_info(snapmla_cache_t handle,
                                                           snapmla_cache_info_t* info) {
  const char* op = "snapmla_cache_info";
  snapmla_cache cache;
  SNAPMLA_TRY(get_cache(op, handle, &cache));
  SNAPMLA_REQUIRE(info != nullptr, "%s: argument 'info' is NULL", op);
  const size_t caller_size = info->struct_size;
  constexpr size_t kMinInfo = offsetof(snapmla_cache_info_t, data) + sizeof(void*);
  SNAPMLA_REQUIRE(caller_size >= kMinInfo && caller_size <= kMaxStructSize,
                  "%s: argument 'info': expected struct_size %zu .. %zu (sizeof in this library "
                  "is %zu), got %zu",
                  op, kMinInfo, kMaxStructSize, sizeof(snapmla_cache_info_t), caller_size);
  snapmla_cache_info_t full;
  std::memset(&full, 0, sizeof(full));
  full.struct_size = sizeof(full);
  full.data = cache.data;
  full.device = cache.device;
  full.num_layers = cache.num_layers;
  full.num_pages = cache.num_pages;
  full.page_size = SNAPMLA_PAGE_SIZE;
  full.content_dim = SNAPMLA_CONTENT_DIM;
  full.rope_dim = SNAPMLA_ROPE_DIM;
  full.page_bytes = SNAPMLA_PAGE_BYTES;
  full.content_offset = SNAPMLA_PAGE_CONTENT_OFFSET;
  full.rope_offset = SNAPMLA_PAGE_ROPE_OFFSET;
  full.scale_offset = SNAPMLA_PAGE_SCALE_OFFSET;
  full.layer_bytes = static_cast<size_t>(cache.num_pages) * static_cast<size_t>(cache.page_stride);
  full.total_bytes = cache.bytes;
  full.owns_memory = cache.owns_memory ? 1 : 0;
  full.per_layer_memory = cache.layers != nullptr ? 1 : 0;
  full.page_stride = static_cast<size_t>(cache.page_stride);
  const size_t n = caller_size < sizeof(full) ? caller_size : sizeof(full);
  std::memcpy(info, &full, n);
  if (caller_size > sizeof(full)) {
    std::memset(reinterpret_cast<unsigned char*>(info) + sizeof(full), 0,
                caller_size - sizeof(full));
  }
  info->struct_size = caller_size;
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_cache_layer_data(snapmla_cache_t handle,
                                                                 int32_t layer, void** data) {
  const char* op = "snapmla_cache_layer_data";
  snapmla_cache cache;
  SNAPMLA_TRY(check_cache_layer(op, handle, "layer", layer, &cache));
  SNAPMLA_REQUIRE(data != nullptr, "%s: argument 'data' is NULL", op);
  *data = layer_base(cache, layer);
  return SNAPMLA_SUCCESS;
}
