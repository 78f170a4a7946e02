// The C ABI: argument checks, error capture and dispatch to the launchers.
// Every check runs before the first launch, so a refused call has written nothing.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "append/append.h"
#include "common/launch.h"
#include "common/numerics.cuh"
#include "decode/decode.h"
#include "fetch_dequant/fetch_dequant.h"
#include "quantize/quantize_q.h"
#include "snapmla/snapmla.h"

static_assert(SNAPMLA_PAGE_BYTES == snapmla::kPageBytes, "header and kernels agree on a page");
static_assert(SNAPMLA_PAGE_ROPE_OFFSET == snapmla::kPageRopeOffset, "rope plane offset");
static_assert(SNAPMLA_PAGE_SCALE_OFFSET == snapmla::kPageScaleOffset, "scale plane offset");
static_assert(SNAPMLA_CONTENT_DIM == snapmla::kContentDim && SNAPMLA_ROPE_DIM == snapmla::kRopeDim,
              "dimensions");

struct snapmla_cache {
  uint8_t* data;
  int32_t device;
  int32_t num_layers;
  int32_t num_pages;
  bool owns_memory;
};

namespace snapmla {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kMaxQuantizeHeads = 1024;
constexpr int kMaxBatch = 65536;

thread_local std::string t_last_error;

snapmla_status_t fail(snapmla_status_t status, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  t_last_error = buf;
  return status;
}

snapmla_status_t cuda_fail(const char* what, cudaError_t err) {
  return fail(SNAPMLA_ERROR_CUDA, "%s: CUDA error %d (%s): %s", what, static_cast<int>(err),
              cudaGetErrorName(err), cudaGetErrorString(err));
}

// Copy a caller's size-prefixed struct into a zeroed local one: fields beyond the caller's
// struct_size read as zero, and a caller built against a newer header is accepted.
template <typename T>
snapmla_status_t read_sized(const char* op, const char* name, const T* in, T* out,
                            size_t min_size) {
  if (in == nullptr) {
    return fail(SNAPMLA_ERROR_INVALID_ARGUMENT, "%s: argument '%s' is NULL", op, name);
  }
  if (in->struct_size < min_size) {
    return fail(SNAPMLA_ERROR_INVALID_ARGUMENT,
                "%s: argument '%s': struct_size must be at least %zu (sizeof in this header "
                "is %zu), got %zu",
                op, name, min_size, sizeof(T), in->struct_size);
  }
  std::memset(out, 0, sizeof(T));
  std::memcpy(out, in, in->struct_size < sizeof(T) ? in->struct_size : sizeof(T));
  return SNAPMLA_SUCCESS;
}

#define SNAPMLA_REQUIRE(cond, ...)                                         \
  do {                                                                     \
    if (!(cond)) return fail(SNAPMLA_ERROR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

#define SNAPMLA_CUDA(what, expr)                           \
  do {                                                     \
    const cudaError_t err_ = (expr);                       \
    if (err_ != cudaSuccess) return cuda_fail(what, err_); \
  } while (0)

// Per-device facts, read once (cudaDeviceGetAttribute is legal during graph capture).
struct DeviceFacts {
  std::atomic<int> sm_count{0};  // 0: not read yet
  std::atomic<int> cc{0};        // major * 10 + minor
};
DeviceFacts g_devices[kMaxDevices];

cudaError_t read_device_facts(int device, DeviceFacts** facts) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  DeviceFacts& f = g_devices[device];
  if (f.sm_count.load(std::memory_order_acquire) == 0) {
    int sms = 0, major = 0, minor = 0;
    cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (err != cudaSuccess) return err;
    f.cc.store(major * 10 + minor, std::memory_order_relaxed);
    f.sm_count.store(sms, std::memory_order_release);
  }
  *facts = &f;
  return cudaSuccess;
}

// The current device must be a Hopper (sm_90) and, if given, the cache's device.
snapmla_status_t check_device(const char* op, const snapmla_cache* cache) {
  int device = -1;
  SNAPMLA_CUDA(op, cudaGetDevice(&device));
  if (cache != nullptr && cache->device != device) {
    return fail(SNAPMLA_ERROR_INVALID_ARGUMENT,
                "%s: argument 'cache' lives on CUDA device %d but the current device is %d", op,
                cache->device, device);
  }
  DeviceFacts* facts = nullptr;
  SNAPMLA_CUDA(op, read_device_facts(device, &facts));
  const int cc = facts->cc.load(std::memory_order_relaxed);
  if (cc != 90) {
    return fail(SNAPMLA_ERROR_UNSUPPORTED,
                "%s: snapmla's kernels are built for sm_90a (Hopper); CUDA device %d is sm_%d", op,
                device, cc);
  }
  return SNAPMLA_SUCCESS;
}

uint8_t* layer_base(const snapmla_cache* c, int32_t layer) {
  return c->data + static_cast<int64_t>(layer) * c->num_pages * kPageBytes;
}

snapmla_status_t check_cache_layer(const char* op, const snapmla_cache* cache, int32_t layer) {
  SNAPMLA_REQUIRE(cache != nullptr, "%s: argument 'cache' is NULL", op);
  SNAPMLA_REQUIRE(layer >= 0 && layer < cache->num_layers,
                  "%s: argument 'layer': expected 0 <= layer < %d, got %d", op, cache->num_layers,
                  layer);
  return SNAPMLA_SUCCESS;
}

snapmla_status_t check_decode_config(const char* op, const snapmla_decode_config_t* in,
                                     snapmla_decode_config_t* c) {
  snapmla_status_t st =
      read_sized(op, "config", in, c, offsetof(snapmla_decode_config_t, num_sm_parts));
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(c->batch_size >= 1 && c->batch_size <= kMaxBatch,
                  "%s: argument 'config.batch_size': expected 1 .. %d, got %d", op, kMaxBatch,
                  c->batch_size);
  SNAPMLA_REQUIRE(c->q_len >= 1 && c->q_len <= SNAPMLA_MAX_Q_LEN,
                  "%s: argument 'config.q_len': expected 1 .. %d, got %d", op, SNAPMLA_MAX_Q_LEN,
                  c->q_len);
  SNAPMLA_REQUIRE(c->num_heads >= 1 && c->num_heads <= SNAPMLA_MAX_HEADS,
                  "%s: argument 'config.num_heads': expected 1 .. %d, got %d", op,
                  SNAPMLA_MAX_HEADS, c->num_heads);
  SNAPMLA_REQUIRE(c->max_pages >= 1, "%s: argument 'config.max_pages': expected >= 1, got %d", op,
                  c->max_pages);
  // The schedule's cost line is int32.
  const int64_t worst = int64_t{c->batch_size} * (int64_t{c->max_pages} + decode::kFixedCost);
  SNAPMLA_REQUIRE(worst < (int64_t{1} << 31) && int64_t{c->max_pages} * kPageSize < (1LL << 31),
                  "%s: argument 'config': batch_size * (max_pages + %d) = %lld exceeds 2^31", op,
                  decode::kFixedCost, static_cast<long long>(worst));
  SNAPMLA_REQUIRE(c->num_sm_parts >= 0 && c->num_sm_parts <= 65535,
                  "%s: argument 'config.num_sm_parts': expected 0 .. 65535, got %d", op,
                  c->num_sm_parts);
  return SNAPMLA_SUCCESS;
}

int row_tiles_of(const snapmla_decode_config_t& c) {
  return ceil_div(int64_t{c.q_len} * c.num_heads, decode::kTileRows);
}

snapmla_status_t num_parts_of(const char* op, const snapmla_decode_config_t& c, int* parts) {
  if (c.num_sm_parts > 0) {
    *parts = c.num_sm_parts;
    return SNAPMLA_SUCCESS;
  }
  int sms = 0;
  SNAPMLA_CUDA(op, current_device_sm_count(&sms));
  *parts = decode::default_num_parts(sms, row_tiles_of(c));
  return SNAPMLA_SUCCESS;
}

}  // namespace

cudaError_t current_device_sm_count(int* sm_count) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  DeviceFacts* facts = nullptr;
  err = read_device_facts(device, &facts);
  if (err != cudaSuccess) return err;
  *sm_count = facts->sm_count.load(std::memory_order_acquire);
  return cudaSuccess;
}

}  // namespace snapmla

using namespace snapmla;

// ------------------------------------------------------------------------ version, errors
extern "C" SNAPMLA_API int snapmla_version(void) { return SNAPMLA_VERSION; }

extern "C" SNAPMLA_API const char* snapmla_status_string(snapmla_status_t status) {
  switch (status) {
    case SNAPMLA_SUCCESS:
      return "SNAPMLA_SUCCESS";
    case SNAPMLA_ERROR_INVALID_ARGUMENT:
      return "SNAPMLA_ERROR_INVALID_ARGUMENT";
    case SNAPMLA_ERROR_UNSUPPORTED:
      return "SNAPMLA_ERROR_UNSUPPORTED";
    case SNAPMLA_ERROR_CUDA:
      return "SNAPMLA_ERROR_CUDA";
    case SNAPMLA_ERROR_OUT_OF_MEMORY:
      return "SNAPMLA_ERROR_OUT_OF_MEMORY";
    case SNAPMLA_ERROR_INTERNAL:
      return "SNAPMLA_ERROR_INTERNAL";
  }
  return "SNAPMLA_UNKNOWN_STATUS";
}

extern "C" SNAPMLA_API const char* snapmla_last_error(void) { return t_last_error.c_str(); }

// ------------------------------------------------------------------------------- cache
extern "C" SNAPMLA_API snapmla_status_t snapmla_cache_bytes(int32_t num_layers, int32_t num_pages,
                                                            size_t* bytes) {
  const char* op = "snapmla_cache_bytes";
  SNAPMLA_REQUIRE(bytes != nullptr, "%s: argument 'bytes' is NULL", op);
  SNAPMLA_REQUIRE(num_layers >= 1, "%s: argument 'num_layers': expected >= 1, got %d", op,
                  num_layers);
  SNAPMLA_REQUIRE(num_pages >= 1 && int64_t{num_pages} * kPageSize < (int64_t{1} << 31),
                  "%s: argument 'num_pages': expected 1 .. %d, got %d", op,
                  static_cast<int>(((int64_t{1} << 31) - 1) / kPageSize), num_pages);
  *bytes = static_cast<size_t>(num_layers) * static_cast<size_t>(num_pages) * kPageBytes;
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t
snapmla_cache_create(const snapmla_cache_config_t* config_in, snapmla_cache_t* cache_out) {
  const char* op = "snapmla_cache_create";
  SNAPMLA_REQUIRE(cache_out != nullptr, "%s: argument 'cache' is NULL", op);
  snapmla_cache_config_t c;
  snapmla_status_t st = read_sized(op, "config", config_in, &c,
                                   offsetof(snapmla_cache_config_t, memory_bytes) + sizeof(size_t));
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(c.page_size == 0 || c.page_size == SNAPMLA_PAGE_SIZE,
                  "%s: argument 'config.page_size': expected 0 or %d, got %d", op,
                  SNAPMLA_PAGE_SIZE, c.page_size);
  size_t bytes = 0;
  st = snapmla_cache_bytes(c.num_layers, c.num_pages, &bytes);
  if (st != SNAPMLA_SUCCESS) {
    return fail(st, "%s: argument 'config': %s", op, t_last_error.c_str());
  }
  SNAPMLA_REQUIRE(c.device >= -1 && c.device < kMaxDevices,
                  "%s: argument 'config.device': expected -1 .. %d, got %d", op, kMaxDevices - 1,
                  c.device);
  if (c.memory != nullptr) {
    SNAPMLA_REQUIRE(reinterpret_cast<uintptr_t>(c.memory) % 256 == 0,
                    "%s: argument 'config.memory': expected a 256-byte aligned pointer, got %p", op,
                    c.memory);
    SNAPMLA_REQUIRE(c.memory_bytes >= bytes,
                    "%s: argument 'config.memory_bytes': expected >= %zu for %d layers x %d "
                    "pages, got %zu",
                    op, bytes, c.num_layers, c.num_pages, c.memory_bytes);
  }
  int device = c.device;
  if (device < 0) SNAPMLA_CUDA(op, cudaGetDevice(&device));

  uint8_t* data = static_cast<uint8_t*>(c.memory);
  if (data == nullptr) {
    int previous = 0;
    SNAPMLA_CUDA(op, cudaGetDevice(&previous));
    if (previous != device) SNAPMLA_CUDA(op, cudaSetDevice(device));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (previous != device) cudaSetDevice(previous);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return fail(SNAPMLA_ERROR_OUT_OF_MEMORY, "%s: cudaMalloc of %zu bytes on device %d failed",
                  op, bytes, device);
    }
    if (err != cudaSuccess) return cuda_fail(op, err);
    data = static_cast<uint8_t*>(p);
  }
  snapmla_cache* cache = new (std::nothrow)
      snapmla_cache{data, device, c.num_layers, c.num_pages, c.memory == nullptr};
  if (cache == nullptr) {
    if (c.memory == nullptr) cudaFree(data);
    return fail(SNAPMLA_ERROR_OUT_OF_MEMORY, "%s: out of host memory", op);
  }
  *cache_out = cache;
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_cache_destroy(snapmla_cache_t cache) {
  if (cache == nullptr) return SNAPMLA_SUCCESS;
  cudaError_t err = cudaSuccess;
  if (cache->owns_memory) err = cudaFree(cache->data);
  delete cache;
  if (err != cudaSuccess) return cuda_fail("snapmla_cache_destroy", err);
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_cache_info(snapmla_cache_t cache,
                                                           snapmla_cache_info_t* info) {
  const char* op = "snapmla_cache_info";
  SNAPMLA_REQUIRE(cache != nullptr, "%s: argument 'cache' is NULL", op);
  SNAPMLA_REQUIRE(info != nullptr, "%s: argument 'info' is NULL", op);
  SNAPMLA_REQUIRE(info->struct_size >= sizeof(size_t) + sizeof(void*),
                  "%s: argument 'info': struct_size must be set (got %zu)", op, info->struct_size);
  snapmla_cache_info_t full;
  std::memset(&full, 0, sizeof(full));
  full.struct_size = sizeof(full);
  full.data = cache->data;
  full.device = cache->device;
  full.num_layers = cache->num_layers;
  full.num_pages = cache->num_pages;
  full.page_size = SNAPMLA_PAGE_SIZE;
  full.content_dim = SNAPMLA_CONTENT_DIM;
  full.rope_dim = SNAPMLA_ROPE_DIM;
  full.page_bytes = SNAPMLA_PAGE_BYTES;
  full.content_offset = SNAPMLA_PAGE_CONTENT_OFFSET;
  full.rope_offset = SNAPMLA_PAGE_ROPE_OFFSET;
  full.scale_offset = SNAPMLA_PAGE_SCALE_OFFSET;
  full.layer_bytes = static_cast<size_t>(cache->num_pages) * SNAPMLA_PAGE_BYTES;
  full.total_bytes = full.layer_bytes * static_cast<size_t>(cache->num_layers);
  full.owns_memory = cache->owns_memory ? 1 : 0;
  const size_t n = info->struct_size < sizeof(full) ? info->struct_size : sizeof(full);
  const size_t caller_size = info->struct_size;
  std::memcpy(info, &full, n);
  info->struct_size = caller_size;
  return SNAPMLA_SUCCESS;
}

// ------------------------------------------------------------------------------ append
extern "C" SNAPMLA_API snapmla_status_t snapmla_append(snapmla_cache_t cache, int32_t layer,
                                                       const void* c_kv, int64_t c_kv_stride,
                                                       const void* k_pe, int64_t k_pe_stride,
                                                       const int64_t* slots, int64_t num_tokens,
                                                       snapmla_stream_t stream) {
  const char* op = "snapmla_append";
  snapmla_status_t st = check_cache_layer(op, cache, layer);
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(num_tokens >= 0, "%s: argument 'num_tokens': expected >= 0, got %lld", op,
                  static_cast<long long>(num_tokens));
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_REQUIRE(c_kv != nullptr, "%s: argument 'c_kv' is NULL", op);
  SNAPMLA_REQUIRE(k_pe != nullptr, "%s: argument 'k_pe' is NULL", op);
  SNAPMLA_REQUIRE(slots != nullptr, "%s: argument 'slots' is NULL", op);
  SNAPMLA_REQUIRE(c_kv_stride >= kContentDim || num_tokens == 1,
                  "%s: argument 'c_kv_stride': expected >= %d elements, got %lld", op, kContentDim,
                  static_cast<long long>(c_kv_stride));
  SNAPMLA_REQUIRE(k_pe_stride >= kRopeDim || num_tokens == 1,
                  "%s: argument 'k_pe_stride': expected >= %d elements, got %lld", op, kRopeDim,
                  static_cast<long long>(k_pe_stride));
  st = check_device(op, cache);
  if (st != SNAPMLA_SUCCESS) return st;
  AppendParams p{static_cast<const uint16_t*>(c_kv),
                 static_cast<const uint16_t*>(k_pe),
                 c_kv_stride,
                 k_pe_stride,
                 slots,
                 num_tokens,
                 layer_base(cache, layer),
                 int64_t{cache->num_pages} * kPageSize};
  SNAPMLA_CUDA(op, launch_append(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

// ----------------------------------------------------------------------- fetch-dequant
extern "C" SNAPMLA_API snapmla_status_t snapmla_fetch_dequant(
    snapmla_cache_t cache, int32_t layer, const int64_t* slots, int64_t num_tokens, void* c_kv,
    int64_t c_kv_stride, void* k_pe, int64_t k_pe_stride, snapmla_stream_t stream) {
  const char* op = "snapmla_fetch_dequant";
  snapmla_status_t st = check_cache_layer(op, cache, layer);
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(num_tokens >= 0, "%s: argument 'num_tokens': expected >= 0, got %lld", op,
                  static_cast<long long>(num_tokens));
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_REQUIRE(slots != nullptr, "%s: argument 'slots' is NULL", op);
  SNAPMLA_REQUIRE(c_kv != nullptr, "%s: argument 'c_kv' is NULL", op);
  SNAPMLA_REQUIRE(k_pe != nullptr, "%s: argument 'k_pe' is NULL", op);
  SNAPMLA_REQUIRE(c_kv_stride >= kContentDim || num_tokens == 1,
                  "%s: argument 'c_kv_stride': expected >= %d elements, got %lld", op, kContentDim,
                  static_cast<long long>(c_kv_stride));
  SNAPMLA_REQUIRE(k_pe_stride >= kRopeDim || num_tokens == 1,
                  "%s: argument 'k_pe_stride': expected >= %d elements, got %lld", op, kRopeDim,
                  static_cast<long long>(k_pe_stride));
  st = check_device(op, cache);
  if (st != SNAPMLA_SUCCESS) return st;
  FetchDequantParams p{layer_base(cache, layer),
                       int64_t{cache->num_pages} * kPageSize,
                       slots,
                       num_tokens,
                       static_cast<uint16_t*>(c_kv),
                       static_cast<uint16_t*>(k_pe),
                       c_kv_stride,
                       k_pe_stride};
  SNAPMLA_CUDA(op, launch_fetch_dequant(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

// -------------------------------------------------------------------------- quantize q
namespace {
snapmla_status_t check_q(const char* op, const void* q, int64_t n, int32_t h, int64_t stride_token,
                         int64_t stride_head) {
  SNAPMLA_REQUIRE(q != nullptr, "%s: argument 'q' is NULL", op);
  SNAPMLA_REQUIRE(h == 1 || stride_head >= kHeadDim,
                  "%s: argument 'q_stride_head': expected >= %d elements, got %lld", op, kHeadDim,
                  static_cast<long long>(stride_head));
  SNAPMLA_REQUIRE(n == 1 || stride_token >= kHeadDim,
                  "%s: argument 'q_stride_token': expected >= %d elements, got %lld", op, kHeadDim,
                  static_cast<long long>(stride_token));
  return SNAPMLA_SUCCESS;
}
}  // namespace

extern "C" SNAPMLA_API snapmla_status_t snapmla_quantize_q(
    const void* q, int64_t num_tokens, int32_t num_heads, int64_t q_stride_token,
    int64_t q_stride_head, void* q_content, void* q_rope, float* q_scale, snapmla_stream_t stream) {
  const char* op = "snapmla_quantize_q";
  SNAPMLA_REQUIRE(num_tokens >= 0, "%s: argument 'num_tokens': expected >= 0, got %lld", op,
                  static_cast<long long>(num_tokens));
  SNAPMLA_REQUIRE(num_heads >= 1 && num_heads <= kMaxQuantizeHeads,
                  "%s: argument 'num_heads': expected 1 .. %d, got %d", op, kMaxQuantizeHeads,
                  num_heads);
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  snapmla_status_t st = check_q(op, q, num_tokens, num_heads, q_stride_token, q_stride_head);
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(q_content != nullptr, "%s: argument 'q_content' is NULL", op);
  SNAPMLA_REQUIRE(q_rope != nullptr, "%s: argument 'q_rope' is NULL", op);
  SNAPMLA_REQUIRE(q_scale != nullptr, "%s: argument 'q_scale' is NULL", op);
  SNAPMLA_REQUIRE(reinterpret_cast<uintptr_t>(q_content) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(q_rope) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(q_scale) % 4 == 0,
                  "%s: arguments 'q_content' and 'q_rope' must be 16-byte aligned", op);
  st = check_device(op, nullptr);
  if (st != SNAPMLA_SUCCESS) return st;
  QuantizeQParams p{static_cast<const uint16_t*>(q),
                    q_stride_token,
                    q_stride_token,
                    q_stride_head,
                    num_tokens,
                    1,
                    num_heads,
                    static_cast<uint8_t*>(q_content),
                    static_cast<uint16_t*>(q_rope),
                    q_scale};
  SNAPMLA_CUDA(op, launch_quantize_q(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

// ------------------------------------------------------------------------------ decode
extern "C" SNAPMLA_API snapmla_status_t snapmla_decode_buffer_sizes(
    const snapmla_decode_config_t* config, size_t* plan_bytes, size_t* workspace_bytes) {
  const char* op = "snapmla_decode_buffer_sizes";
  snapmla_decode_config_t c;
  snapmla_status_t st = check_decode_config(op, config, &c);
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(plan_bytes != nullptr, "%s: argument 'plan_bytes' is NULL", op);
  SNAPMLA_REQUIRE(workspace_bytes != nullptr, "%s: argument 'workspace_bytes' is NULL", op);
  int parts = 0;
  st = num_parts_of(op, c, &parts);
  if (st != SNAPMLA_SUCCESS) return st;
  const decode::PlanLayout pl = decode::PlanLayout::make(c.batch_size, parts);
  *plan_bytes = static_cast<size_t>((pl.total_words * 4 + 255) / 256 * 256);
  *workspace_bytes = static_cast<size_t>(
      decode::WorkspaceLayout::make(c.batch_size, c.q_len, c.num_heads, parts).total_bytes);
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_decode_plan(const snapmla_decode_config_t* config,
                                                            const int32_t* cache_seqlens,
                                                            void* plan, snapmla_stream_t stream) {
  const char* op = "snapmla_decode_plan";
  snapmla_decode_config_t c;
  snapmla_status_t st = check_decode_config(op, config, &c);
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(cache_seqlens != nullptr, "%s: argument 'cache_seqlens' is NULL", op);
  SNAPMLA_REQUIRE(plan != nullptr, "%s: argument 'plan' is NULL", op);
  SNAPMLA_REQUIRE(reinterpret_cast<uintptr_t>(plan) % 16 == 0,
                  "%s: argument 'plan': expected a 16-byte aligned pointer", op);
  st = check_device(op, nullptr);
  if (st != SNAPMLA_SUCCESS) return st;
  int parts = 0;
  st = num_parts_of(op, c, &parts);
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_CUDA(
      op, decode::launch_plan(cache_seqlens, c.batch_size, c.q_len, c.num_heads, c.max_pages, parts,
                              c.num_sm_parts > 0 ? 1 : decode::kMinPartCost,
                              static_cast<int32_t*>(plan), reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_decode(snapmla_cache_t cache,
                                                       const snapmla_decode_config_t* config,
                                                       const snapmla_decode_args_t* args_in,
                                                       const void* plan, void* workspace,
                                                       snapmla_stream_t stream) {
  const char* op = "snapmla_decode";
  snapmla_decode_config_t c;
  snapmla_status_t st = check_decode_config(op, config, &c);
  if (st != SNAPMLA_SUCCESS) return st;
  snapmla_decode_args_t a;
  st = read_sized(op, "args", args_in, &a, offsetof(snapmla_decode_args_t, lse) + sizeof(float*));
  if (st != SNAPMLA_SUCCESS) return st;
  st = check_cache_layer(op, cache, a.layer);
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(std::isfinite(a.softmax_scale) && a.softmax_scale > 0.f,
                  "%s: argument 'args.softmax_scale': expected a finite value > 0, got %g", op,
                  static_cast<double>(a.softmax_scale));
  SNAPMLA_REQUIRE(a.kernel >= SNAPMLA_DECODE_KERNEL_AUTO && a.kernel <= SNAPMLA_DECODE_KERNEL_FAST,
                  "%s: argument 'args.kernel': expected 0 (auto), 1 (reference) or 2 (fast), "
                  "got %d",
                  op, a.kernel);
  st = check_q(op, a.q, int64_t{c.batch_size} * c.q_len, c.num_heads,
               c.q_len == 1 ? a.q_stride_batch : a.q_stride_token, a.q_stride_head);
  if (st != SNAPMLA_SUCCESS) return st;
  SNAPMLA_REQUIRE(c.batch_size == 1 || a.q_stride_batch >= kHeadDim,
                  "%s: argument 'args.q_stride_batch': expected >= %d elements, got %lld", op,
                  kHeadDim, static_cast<long long>(a.q_stride_batch));
  SNAPMLA_REQUIRE(a.block_table != nullptr, "%s: argument 'args.block_table' is NULL", op);
  SNAPMLA_REQUIRE(a.block_table_stride >= c.max_pages || c.batch_size == 1,
                  "%s: argument 'args.block_table_stride': expected >= max_pages = %d, got %lld",
                  op, c.max_pages, static_cast<long long>(a.block_table_stride));
  SNAPMLA_REQUIRE(a.cache_seqlens != nullptr, "%s: argument 'args.cache_seqlens' is NULL", op);
  SNAPMLA_REQUIRE(a.out != nullptr, "%s: argument 'args.out' is NULL", op);
  SNAPMLA_REQUIRE(reinterpret_cast<uintptr_t>(a.out) % 16 == 0,
                  "%s: argument 'args.out': expected a 16-byte aligned pointer", op);
  SNAPMLA_REQUIRE(plan != nullptr, "%s: argument 'plan' is NULL", op);
  SNAPMLA_REQUIRE(workspace != nullptr, "%s: argument 'workspace' is NULL", op);
  SNAPMLA_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
                  "%s: argument 'workspace': expected a 256-byte aligned pointer", op);
  st = check_device(op, cache);
  if (st != SNAPMLA_SUCCESS) return st;
  int parts = 0;
  st = num_parts_of(op, c, &parts);
  if (st != SNAPMLA_SUCCESS) return st;

  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const decode::WorkspaceLayout w =
      decode::WorkspaceLayout::make(c.batch_size, c.q_len, c.num_heads, parts);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  QuantizeQParams qp{static_cast<const uint16_t*>(a.q),
                     a.q_stride_batch,
                     a.q_stride_token,
                     a.q_stride_head,
                     int64_t{c.batch_size} * c.q_len,
                     c.q_len,
                     c.num_heads,
                     ws + w.q_content,
                     reinterpret_cast<uint16_t*>(ws + w.q_rope),
                     reinterpret_cast<float*>(ws + w.q_scale)};
  SNAPMLA_CUDA(op, launch_quantize_q(qp, s));

  decode::DecodeParams p{};
  p.q_content = ws + w.q_content;
  p.q_rope = reinterpret_cast<const uint16_t*>(ws + w.q_rope);
  p.q_scale = reinterpret_cast<const float*>(ws + w.q_scale);
  p.layer_base = layer_base(cache, a.layer);
  p.num_pages = cache->num_pages;
  p.block_table = a.block_table;
  p.block_table_stride = a.block_table_stride;
  p.seqlens = a.cache_seqlens;
  p.plan = static_cast<const int32_t*>(plan);
  p.batch = c.batch_size;
  p.q_len = c.q_len;
  p.num_heads = c.num_heads;
  p.max_pages = c.max_pages;
  p.num_parts = parts;
  p.row_tiles = row_tiles_of(c);
  p.causal = a.causal != 0;
  p.scale_log2 = a.softmax_scale * kLog2e;
  p.out = static_cast<uint16_t*>(a.out);
  p.lse = a.lse;
  p.partial_o = reinterpret_cast<float*>(ws + w.partial_o);
  p.partial_lse = reinterpret_cast<float*>(ws + w.partial_lse);
  // AUTO runs the kernel that meets the contract's agreement bound (the mma.sync one); the
  // wgmma kernel is opt-in until its QGMMA logits match the model as closely.
  if (a.kernel == SNAPMLA_DECODE_KERNEL_FAST) {
    SNAPMLA_CUDA(op, decode::launch_seesaw_decode(p, s));
  } else {
    SNAPMLA_CUDA(op, decode::launch_reference_decode(p, s));
  }
  SNAPMLA_CUDA(op, decode::launch_combine(p, s));
  return SNAPMLA_SUCCESS;
}
