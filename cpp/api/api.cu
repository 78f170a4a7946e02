// The C ABI: argument checks, error capture and dispatch to the launchers.
// Every check runs before the first CUDA call, so a refused call has written nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <vector>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "append/append.h"
#include "copy_slots/copy_slots.h"
#include "common/launch.h"
#include "common/numerics.cuh"
#include "common/repeated_launch.h"
#include "decode/decode.h"
#include "decode/dispatch.h"
#include "fetch_dequant/fetch_dequant.h"
#include "quantize/quantize_q.h"
#include "snapmla/snapmla.h"

static_assert(SNAPMLA_PAGE_BYTES == snapmla::kPageBytes, "header and kernels agree on a page");
static_assert(SNAPMLA_PAGE_ROPE_OFFSET == snapmla::kPageRopeOffset, "rope plane offset");
static_assert(SNAPMLA_PAGE_SCALE_OFFSET == snapmla::kPageScaleOffset, "scale plane offset");
static_assert(SNAPMLA_CONTENT_DIM == snapmla::kContentDim && SNAPMLA_ROPE_DIM == snapmla::kRopeDim,
              "dimensions");

static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8, "a 64-bit platform");

// A live cache carries a magic word at each end (as NCCL's communicator does); destroy clears
// them before the object is freed. Handles are looked up in the registry below, never
// dereferenced as given, so the magic words guard against corruption of the object itself.
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

namespace snapmla {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kMaxQuantizeHeads = 1024;
constexpr int kMaxBatch = 65536;
constexpr int kMaxSmParts = 65535;
constexpr int kMaxPages = ((int64_t{1} << 31) - 1) / kPageSize;  // num_pages * 64 fits int32
constexpr int64_t kMaxBytes = INT64_MAX;                         // every byte offset is an int64
constexpr size_t kMaxStructSize = SNAPMLA_MAX_STRUCT_SIZE;

// Alignment (bytes) of each device pointer: what the kernels' accesses need.
constexpr size_t kAlignBf16 = 2;         // bf16 inputs: element loads on the unaligned path
constexpr size_t kAlignInt32 = 4;        // block_table, cache_seqlens; fp32 lse, q_scale
constexpr size_t kAlignInt64 = 8;        // slots
constexpr size_t kAlignQContent = 8;     // quantize_q: 8-byte stores of 8 E4M3 codes
constexpr size_t kAlignQRope = 16;       // quantize_q: 16-byte stores of 8 bf16
constexpr size_t kAlignOut = 16;         // decode out: the combine's 16-byte stores
constexpr size_t kAlignPlan = 16;        // decode plan (int32 words)
constexpr size_t kAlignWorkspace = 256;  // WorkspaceLayout parts are 256-byte aligned (TMA)
constexpr size_t kAlignCache = 256;      // cudaMalloc's; planes 128-byte aligned, TMA 16
constexpr size_t kAlignLayer = 128;      // a layer of config.layer_memory: the planes' alignment
constexpr int64_t kMaxPageStride = int64_t{1} << 40;  // TMA: global strides below 2^40

constexpr uint64_t kCacheMagicBegin = 0x534e41504d4c4131ull;  // "SNAPMLA1", big-endian
constexpr uint64_t kCacheMagicEnd = 0x31414c4d50414e53ull;    // the same, byte-reversed

thread_local std::string t_last_error;
thread_local bool t_validate_only = false;

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

#define SNAPMLA_REQUIRE(cond, ...)                                         \
  do {                                                                     \
    if (!(cond)) return fail(SNAPMLA_ERROR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

#define SNAPMLA_TRY(expr)                   \
  do {                                      \
    const snapmla_status_t st_ = (expr);    \
    if (st_ != SNAPMLA_SUCCESS) return st_; \
  } while (0)

// Where an operation would make its first CUDA call: in validation-only mode it stops here.
snapmla_status_t validated(const char* op) {
  return fail(SNAPMLA_VALIDATED,
              "%s: validation-only mode: the arguments are valid, nothing was run", op);
}

// A field that an older caller's struct may lack (it then reads as zero).
struct OptionalField {
  const char* name;
  size_t offset;
  size_t size;
};

// Copy a caller's size-prefixed struct into a zeroed local one, as the header's "Config
// structs" rule says: a struct_size below `min_size` or ending inside one of `optional` is
// refused; fields beyond a smaller struct_size read as zero; a larger struct_size (at most
// kMaxStructSize) is accepted only if every byte past sizeof(T) is zero.
template <typename T>
snapmla_status_t read_sized(const char* op, const char* name, const T* in, T* out, size_t min_size,
                            std::initializer_list<OptionalField> optional = {}) {
  SNAPMLA_REQUIRE(in != nullptr, "%s: argument '%s' is NULL", op, name);
  const size_t size = in->struct_size;
  SNAPMLA_REQUIRE(size >= min_size && size <= kMaxStructSize,
                  "%s: argument '%s': expected struct_size %zu .. %zu (sizeof in this library "
                  "is %zu), got %zu",
                  op, name, min_size, kMaxStructSize, sizeof(T), size);
  for (const OptionalField& f : optional) {
    SNAPMLA_REQUIRE(size <= f.offset || size >= f.offset + f.size,
                    "%s: argument '%s': struct_size %zu ends inside field '%s.%s' (bytes %zu .. "
                    "%zu)",
                    op, name, size, name, f.name, f.offset, f.offset + f.size - 1);
  }
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(in);
  for (size_t i = sizeof(T); i < size; ++i) {
    SNAPMLA_REQUIRE(bytes[i] == 0,
                    "%s: argument '%s': struct_size %zu is larger than this library's sizeof "
                    "(%zu), and byte %zu, beyond the fields it knows, is %d, not 0: the caller "
                    "sets a field that this library (version %d) does not have",
                    op, name, size, sizeof(T), i, static_cast<int>(bytes[i]), SNAPMLA_VERSION);
  }
  std::memset(out, 0, sizeof(T));
  std::memcpy(out, in, size < sizeof(T) ? size : sizeof(T));
  return SNAPMLA_SUCCESS;
}

// A device pointer argument: not NULL and aligned to `alignment` bytes (`why` says what
// needs it).
snapmla_status_t check_pointer(const char* op, const char* name, const void* p, size_t alignment,
                               const char* why) {
  SNAPMLA_REQUIRE(p != nullptr, "%s: argument '%s' is NULL", op, name);
  SNAPMLA_REQUIRE(reinterpret_cast<uintptr_t>(p) % alignment == 0,
                  "%s: argument '%s': expected a %zu-byte aligned address (%s), got %p", op, name,
                  alignment, why, p);
  return SNAPMLA_SUCCESS;
}

// One strided dimension of an argument: `count` indices `stride` elements apart, the stride
// named `name` in messages. Dimensions of count <= 1 contribute nothing.
struct Dim {
  int64_t count;
  int64_t stride;
  const char* name;
};

// The bytes an argument at `p` spans: the elements at offsets sum((count - 1) * stride) +
// [0, inner) of `elem` bytes each, in checked int64 arithmetic. Refused naming the stride (or
// count) whose term overflows int64, or whose term is the largest when the span in bytes does;
// naming the argument when the span runs past the end of the address space. Strides of
// dimensions with count > 1 are non-negative here (checked before).
snapmla_status_t check_span(const char* op, const char* name, const void* p, int64_t elem,
                            int64_t inner, std::initializer_list<Dim> dims) {
  int64_t elems = inner, largest = -1;
  const char* blame = name;
  for (const Dim& d : dims) {
    if (d.count <= 1) continue;
    int64_t term = 0;
    SNAPMLA_REQUIRE(!__builtin_mul_overflow(d.count - 1, d.stride, &term) &&
                        !__builtin_add_overflow(elems, term, &elems),
                    "%s: argument '%s': %lld x %lld elements overflows the int64 offsets of "
                    "argument '%s'",
                    op, d.name, static_cast<long long>(d.count - 1),
                    static_cast<long long>(d.stride), name);
    if (term > largest) {
      largest = term;
      blame = d.name;
    }
  }
  int64_t bytes = 0;
  SNAPMLA_REQUIRE(!__builtin_mul_overflow(elems, elem, &bytes),
                  "%s: argument '%s': argument '%s' would span %lld elements of %lld bytes, over "
                  "2^63 - 1 bytes",
                  op, blame, name, static_cast<long long>(elems), static_cast<long long>(elem));
  uintptr_t end = 0;
  SNAPMLA_REQUIRE(!__builtin_add_overflow(reinterpret_cast<uintptr_t>(p),
                                          static_cast<uintptr_t>(bytes - 1), &end),
                  "%s: argument '%s': %p + %lld bytes runs past the end of the address space", op,
                  name, p, static_cast<long long>(bytes));
  return SNAPMLA_SUCCESS;
}

// Live caches by handle. A handle is an id, kHandleTag | serial number, never an address: a
// lookup dereferences nothing the caller gave, and serial numbers are never reused, so a
// destroyed handle stays refused after its object's memory is reused. Readers (every call on
// a cache) take the lock shared; create and destroy take it exclusively.
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

// The live cache behind `handle`, copied into *cache.
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

// The current device must be a Hopper (sm_90) and, if given, the cache's device. The first
// CUDA call of every operation that launches: validation-only mode stops here.
snapmla_status_t check_device(const char* op, const snapmla_cache* cache) {
  if (t_validate_only) return validated(op);
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

// layer < num_layers and the cache's bytes are <= INT64_MAX: the offset cannot overflow.
uint8_t* layer_base(const snapmla_cache& c, int32_t layer) {
  if (c.layers != nullptr) return c.layers[layer];
  return c.data + static_cast<int64_t>(layer) * c.num_pages * c.page_stride;
}

// BF16 rows of the latent and the RoPE key, `rows` of each: c_kv [rows, 512] and k_pe
// [rows, 64] with their row strides (append's inputs, fetch-dequant's and gather's outputs).
snapmla_status_t check_bf16_rows(const char* op, const void* c_kv, int64_t c_kv_stride,
                                 const void* k_pe, int64_t k_pe_stride, int64_t rows) {
  SNAPMLA_TRY(check_pointer(op, "c_kv", c_kv, kAlignBf16, "BF16 elements"));
  SNAPMLA_TRY(check_pointer(op, "k_pe", k_pe, kAlignBf16, "BF16 elements"));
  SNAPMLA_REQUIRE(c_kv_stride >= kContentDim || rows == 1,
                  "%s: argument 'c_kv_stride': expected >= %d elements, got %lld", op, kContentDim,
                  static_cast<long long>(c_kv_stride));
  SNAPMLA_REQUIRE(k_pe_stride >= kRopeDim || rows == 1,
                  "%s: argument 'k_pe_stride': expected >= %d elements, got %lld", op, kRopeDim,
                  static_cast<long long>(k_pe_stride));
  SNAPMLA_TRY(check_span(op, "c_kv", c_kv, 2, kContentDim, {{rows, c_kv_stride, "c_kv_stride"}}));
  return check_span(op, "k_pe", k_pe, 2, kRopeDim, {{rows, k_pe_stride, "k_pe_stride"}});
}

// The live cache behind `handle` (copied into *cache) and a layer index inside it.
snapmla_status_t check_cache_layer(const char* op, snapmla_cache_t handle, const char* layer_name,
                                   int32_t layer, snapmla_cache* cache) {
  SNAPMLA_TRY(get_cache(op, handle, cache));
  SNAPMLA_REQUIRE(layer >= 0 && layer < cache->num_layers,
                  "%s: argument '%s': expected 0 <= layer < %d, got %d", op, layer_name,
                  cache->num_layers, layer);
  return SNAPMLA_SUCCESS;
}

snapmla_status_t check_decode_config(const char* op, const snapmla_decode_config_t* in,
                                     snapmla_decode_config_t* c) {
  SNAPMLA_TRY(read_sized(
      op, "config", in, c, offsetof(snapmla_decode_config_t, num_sm_parts),
      {{"num_sm_parts", offsetof(snapmla_decode_config_t, num_sm_parts), sizeof(int32_t)},
       {"q_precision", offsetof(snapmla_decode_config_t, q_precision), sizeof(int32_t)}}));
  SNAPMLA_REQUIRE(c->batch_size >= 1 && c->batch_size <= kMaxBatch,
                  "%s: argument 'config.batch_size': expected 1 .. %d, got %d", op, kMaxBatch,
                  c->batch_size);
  SNAPMLA_REQUIRE(c->q_len >= 1 && c->q_len <= SNAPMLA_MAX_Q_LEN,
                  "%s: argument 'config.q_len': expected 1 .. %d, got %d", op, SNAPMLA_MAX_Q_LEN,
                  c->q_len);
  SNAPMLA_REQUIRE(c->num_heads >= 1 && c->num_heads <= SNAPMLA_MAX_HEADS,
                  "%s: argument 'config.num_heads': expected 1 .. %d, got %d", op,
                  SNAPMLA_MAX_HEADS, c->num_heads);
  SNAPMLA_REQUIRE(c->max_pages >= 1 && c->max_pages <= kMaxPages,
                  "%s: argument 'config.max_pages': expected 1 .. %d, got %d", op, kMaxPages,
                  c->max_pages);
  // The schedule's cost line is int32 (batch <= 2^16 and max_pages < 2^25: no int64 overflow).
  const int64_t worst = int64_t{c->batch_size} * (int64_t{c->max_pages} + decode::kFixedCost);
  SNAPMLA_REQUIRE(worst < (int64_t{1} << 31),
                  "%s: argument 'config.max_pages': expected batch_size * (max_pages + %d) < "
                  "2^31, got %d * (%d + %d) = %lld",
                  op, decode::kFixedCost, c->batch_size, c->max_pages, decode::kFixedCost,
                  static_cast<long long>(worst));
  SNAPMLA_REQUIRE(c->num_sm_parts >= 0 && c->num_sm_parts <= kMaxSmParts,
                  "%s: argument 'config.num_sm_parts': expected 0 .. %d, got %d", op, kMaxSmParts,
                  c->num_sm_parts);
  SNAPMLA_REQUIRE(c->q_precision == SNAPMLA_Q_PRECISION_FP8 ||
                      c->q_precision == SNAPMLA_Q_PRECISION_FP8X2,
                  "%s: argument 'config.q_precision': expected 0 (fp8) or 1 (fp8x2), got %d", op,
                  c->q_precision);
  return SNAPMLA_SUCCESS;
}

// Upper bounds of the plan's and the workspace's int64 size arithmetic over every valid
// config (decode::PlanLayout / WorkspaceLayout): far from overflow, so the sizes computed from
// a checked config are exact.
constexpr int64_t kWorstRows = int64_t{kMaxBatch} * SNAPMLA_MAX_Q_LEN * SNAPMLA_MAX_HEADS;
constexpr int64_t kWorstRowTiles =
    (int64_t{SNAPMLA_MAX_Q_LEN} * SNAPMLA_MAX_HEADS + decode::kTileRows - 1) / decode::kTileRows;
constexpr int64_t kWorstWorkspace =
    kWorstRows * (2 * kContentDim + 2 * kRopeDim + 2 * 4) +  // with the two-term query's low row
    int64_t{2} * kMaxSmParts * kWorstRowTiles * decode::kTileRows * (kContentDim * 4 + 4) + 8 * 256;
constexpr int64_t kWorstPlanWords =
    decode::PlanLayout::kHeaderWords + 4 * (int64_t{kMaxBatch} + 1) + 2 * int64_t{kMaxSmParts};
static_assert(kWorstWorkspace < (int64_t{1} << 40) && kWorstPlanWords < (int64_t{1} << 20),
              "decode buffer sizes stay far from int64 overflow");

// decode::select_kernel for a checked config and kernel option.
decode::Kernel select_kernel(const snapmla_decode_config_t& c, int32_t option,
                             int64_t chain_blocks) {
  return decode::select_kernel({static_cast<decode::KernelOption>(option),
                                int64_t{c.q_len} * c.num_heads,
                                c.q_precision == SNAPMLA_Q_PRECISION_FP8X2, chain_blocks});
}

// The option is one of snapmla_decode_kernel_t and can run the config (decode::select_kernel).
snapmla_status_t check_kernel_option(const char* op, const char* name,
                                     const snapmla_decode_config_t& c, int32_t option) {
  SNAPMLA_REQUIRE(option >= SNAPMLA_DECODE_KERNEL_AUTO && option <= SNAPMLA_DECODE_KERNEL_FAST,
                  "%s: argument '%s': expected 0 (auto), 1 (reference) or 2 (fast), got %d", op,
                  name, option);
  SNAPMLA_REQUIRE(select_kernel(c, option, 0) != decode::Kernel::kRefused,
                  "%s: argument '%s': expected 1 (reference) for config.q_precision 1 (fp8x2) "
                  "where q_len * num_heads > %d (the fast kernel takes it only up to %d; here %d), got %d",
                  op, name, decode::kTwoTermMaxRows, decode::kTwoTermMaxRows, c.q_len * c.num_heads,
                  option);
  return SNAPMLA_SUCCESS;
}

int row_tiles_of(const snapmla_decode_config_t& c) {
  return ceil_div(int64_t{c.q_len} * c.num_heads, decode::kTileRows);
}

// The parts whose attention CTAs find an SM free when the attention kernel launches
// (decode/plan.cu, SNAPMLA_PLAN_QQ_ROOM): with the default part count, where a request's rows
// are one row tile (the last parts are then the CTAs dispatched last) and a Q-quant kernel runs
// before the attention kernel, all but the last G, G the Q-quant kernel's CTAs (up to 8 warps
// each); else all of them.
int free_parts_of(const snapmla_decode_config_t& c, int parts, int sms) {
  const int64_t rows_per_request = int64_t{c.q_len} * c.num_heads;
  if (c.num_sm_parts > 0 || row_tiles_of(c) != 1) return parts;
  if (!decode::is_sm90(select_kernel(c, SNAPMLA_DECODE_KERNEL_AUTO, 0))) return parts;
  const int64_t held = warp_per_item_grid(int64_t{c.batch_size} * rows_per_request,
                                          kQuantizeQWarps, kQuantizeQBlocksPerSm, sms);
  return held < parts ? parts - static_cast<int>(held) : parts;
}

// The plan's part count (the config's, or the default from the SM count) and, where
// free_parts is given, the parts of them free_parts_of leaves work to.
snapmla_status_t num_parts_of(const char* op, const snapmla_decode_config_t& c, int* parts,
                              int* free_parts = nullptr) {
  if (c.num_sm_parts > 0) {
    *parts = c.num_sm_parts;
    if (free_parts != nullptr) *free_parts = *parts;
    return SNAPMLA_SUCCESS;
  }
  if (t_validate_only) return validated(op);
  int sms = 0;
  SNAPMLA_CUDA(op, current_device_sm_count(&sms));
  *parts = decode::default_num_parts(sms, row_tiles_of(c));
  if (free_parts != nullptr) *free_parts = free_parts_of(c, *parts, sms);
  return SNAPMLA_SUCCESS;
}

void decode_buffer_bytes(const snapmla_decode_config_t& c, int parts, size_t* plan_bytes,
                         size_t* workspace_bytes) {
  const decode::PlanLayout pl = decode::PlanLayout::make(c.batch_size, parts);
  *plan_bytes = static_cast<size_t>((pl.total_words * 4 + 255) / 256 * 256);
  *workspace_bytes = static_cast<size_t>(
      decode::WorkspaceLayout::make(c.batch_size, c.q_len, c.num_heads, parts,
                                    c.q_precision == SNAPMLA_Q_PRECISION_FP8X2)
          .total_bytes);
}

// The plan (and the workspace, if given) must not run past the end of the address space.
// Their sizes for `parts` go to *sizes_out (plan, then workspace bytes) when given.
snapmla_status_t check_decode_buffers(const char* op, const snapmla_decode_config_t& c, int parts,
                                      const void* plan, const void* workspace,
                                      size_t* sizes_out = nullptr) {
  size_t plan_bytes = 0, workspace_bytes = 0;
  decode_buffer_bytes(c, parts, &plan_bytes, &workspace_bytes);
  if (sizes_out != nullptr) {
    sizes_out[0] = plan_bytes;
    sizes_out[1] = workspace_bytes;
  }
  SNAPMLA_TRY(check_span(op, "plan", plan, 1, static_cast<int64_t>(plan_bytes), {}));
  if (workspace != nullptr) {
    SNAPMLA_TRY(
        check_span(op, "workspace", workspace, 1, static_cast<int64_t>(workspace_bytes), {}));
  }
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
    case SNAPMLA_VALIDATED:
      return "SNAPMLA_VALIDATED";
  }
  return "SNAPMLA_UNKNOWN_STATUS";
}

extern "C" SNAPMLA_API const char* snapmla_last_error(void) { return t_last_error.c_str(); }

extern "C" SNAPMLA_API int snapmla_set_validate_only(int enable) {
  const bool previous = t_validate_only;
  t_validate_only = enable != 0;
  return previous ? 1 : 0;
}

// ------------------------------------------------------------------------------- cache
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
  SNAPMLA_TRY(read_sized(op, "config", config_in, &c,
                         offsetof(snapmla_cache_config_t, memory_bytes) + sizeof(size_t),
                         {{"layer_memory", offsetof(snapmla_cache_config_t, layer_memory),
                           sizeof(void*)},
                          {"page_stride", offsetof(snapmla_cache_config_t, page_stride),
                           sizeof(size_t)}}));
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
    if (t_validate_only) return validated(op);
  }
  if (device < 0) SNAPMLA_CUDA(op, cudaGetDevice(&device));

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
  const bool owns = c.memory == nullptr && layer_copy == nullptr;
  snapmla_cache* cache = new (std::nothrow) snapmla_cache{
      kCacheMagicBegin, data, bytes, device, c.num_layers, c.num_pages, owns, layer_copy,
      page_stride, kCacheMagicEnd};
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
  if (cache->owns_memory) err = cudaFree(cache->data);
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

// ------------------------------------------------------------------------------ append
extern "C" SNAPMLA_API snapmla_status_t snapmla_append(snapmla_cache_t handle, int32_t layer,
                                                       const void* c_kv, int64_t c_kv_stride,
                                                       const void* k_pe, int64_t k_pe_stride,
                                                       const int64_t* slots, int64_t num_tokens,
                                                       snapmla_stream_t stream) {
  const char* op = "snapmla_append";
  snapmla_cache cache;
  SNAPMLA_TRY(check_cache_layer(op, handle, "layer", layer, &cache));
  SNAPMLA_REQUIRE(num_tokens >= 0, "%s: argument 'num_tokens': expected >= 0, got %lld", op,
                  static_cast<long long>(num_tokens));
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_TRY(check_bf16_rows(op, c_kv, c_kv_stride, k_pe, k_pe_stride, num_tokens));
  SNAPMLA_TRY(check_pointer(op, "slots", slots, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_span(op, "slots", slots, 8, 1, {{num_tokens, 1, "num_tokens"}}));
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

// ----------------------------------------------------------------------- fetch-dequant
extern "C" SNAPMLA_API snapmla_status_t snapmla_fetch_dequant(
    snapmla_cache_t handle, int32_t layer, const int64_t* slots, int64_t num_tokens, void* c_kv,
    int64_t c_kv_stride, void* k_pe, int64_t k_pe_stride, snapmla_stream_t stream) {
  const char* op = "snapmla_fetch_dequant";
  snapmla_cache cache;
  SNAPMLA_TRY(check_cache_layer(op, handle, "layer", layer, &cache));
  SNAPMLA_REQUIRE(num_tokens >= 0, "%s: argument 'num_tokens': expected >= 0, got %lld", op,
                  static_cast<long long>(num_tokens));
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_TRY(check_pointer(op, "slots", slots, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_span(op, "slots", slots, 8, 1, {{num_tokens, 1, "num_tokens"}}));
  SNAPMLA_TRY(check_bf16_rows(op, c_kv, c_kv_stride, k_pe, k_pe_stride, num_tokens));
  SNAPMLA_TRY(check_device(op, &cache));
  FetchDequantParams p{
      layer_base(cache, layer),     int64_t{cache.num_pages} * kPageSize, slots,       num_tokens,
      static_cast<uint16_t*>(c_kv), static_cast<uint16_t*>(k_pe),         c_kv_stride, k_pe_stride,
      cache.page_stride};
  SNAPMLA_CUDA(op, launch_fetch_dequant(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

// ---------------------------------------------------------------------- gather-dequant
extern "C" SNAPMLA_API snapmla_status_t snapmla_gather_dequant(
    snapmla_cache_t handle, int32_t layer, const int32_t* block_table, int64_t block_table_stride,
    int32_t batch, int32_t max_pages, const int32_t* seqlens, const int64_t* out_rows,
    int64_t num_rows, void* c_kv, int64_t c_kv_stride, void* k_pe, int64_t k_pe_stride,
    snapmla_stream_t stream) {
  const char* op = "snapmla_gather_dequant";
  snapmla_cache cache;
  SNAPMLA_TRY(check_cache_layer(op, handle, "layer", layer, &cache));
  SNAPMLA_REQUIRE(num_rows >= 0, "%s: argument 'num_rows': expected >= 0, got %lld", op,
                  static_cast<long long>(num_rows));
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
  SNAPMLA_TRY(check_device(op, &cache));
  GatherDequantParams p{};
  p.layer_base = layer_base(cache, layer);
  p.num_pages = cache.num_pages;
  p.page_stride = cache.page_stride;
  p.block_table = block_table;
  p.block_table_stride = block_table_stride;
  p.batch = batch;
  p.max_pages = max_pages;
  p.seqlens = seqlens;
  p.out_rows = out_rows;
  p.num_rows = num_rows;
  p.c_kv = static_cast<uint16_t*>(c_kv);
  p.k_pe = static_cast<uint16_t*>(k_pe);
  p.c_kv_stride = c_kv_stride;
  p.k_pe_stride = k_pe_stride;
  SNAPMLA_CUDA(op, launch_gather_dequant(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

// -------------------------------------------------------------------------- copy slots
extern "C" SNAPMLA_API snapmla_status_t snapmla_copy_slots(snapmla_cache_t handle, int32_t layer,
                                                           const int64_t* src_slots,
                                                           const int64_t* dst_slots,
                                                           int64_t num_tokens,
                                                           snapmla_stream_t stream) {
  const char* op = "snapmla_copy_slots";
  snapmla_cache cache;
  SNAPMLA_TRY(check_cache_layer(op, handle, "layer", layer, &cache));
  SNAPMLA_REQUIRE(num_tokens >= 0, "%s: argument 'num_tokens': expected >= 0, got %lld", op,
                  static_cast<long long>(num_tokens));
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  SNAPMLA_TRY(check_pointer(op, "src_slots", src_slots, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_pointer(op, "dst_slots", dst_slots, kAlignInt64, "int64 elements"));
  SNAPMLA_TRY(check_span(op, "src_slots", src_slots, 8, 1, {{num_tokens, 1, "num_tokens"}}));
  SNAPMLA_TRY(check_span(op, "dst_slots", dst_slots, 8, 1, {{num_tokens, 1, "num_tokens"}}));
  SNAPMLA_TRY(check_device(op, &cache));
  const CopySlotsParams p{layer_base(cache, layer), int64_t{cache.num_pages} * kPageSize,
                          cache.page_stride,        src_slots,
                          dst_slots,                num_tokens};
  SNAPMLA_CUDA(op, launch_copy_slots(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

// -------------------------------------------------------------------------- quantize q
namespace {
// The bytes [first, last] an argument spans (as check_span measures them, which must have
// passed: no overflow, non-negative strides, the last byte inside the address space); an absent
// or empty argument spans nothing.
struct Extent {
  const char* name;
  uintptr_t first, last;
  bool empty;
};
Extent extent_of(const char* name, const void* p, int64_t elem, int64_t inner,
                 std::initializer_list<Dim> dims) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr) return {name, first, first, true};  // (its strides are not read: unchecked)
  int64_t elems = inner;
  for (const Dim& d : dims) {
    if (d.count > 1) elems += (d.count - 1) * d.stride;
  }
  if (elems <= 0) return {name, first, first, true};
  return {name, first, first + static_cast<uintptr_t>(elems * elem - 1), false};
}

// An output's bytes must not overlap the call's inputs or its other outputs (another CTA, or a
// later kernel of the call, would read what one writes). Refused naming the output.
snapmla_status_t check_apart(const char* op, const Extent& out,
                             std::initializer_list<Extent> others) {
  for (const Extent& o : others) {
    SNAPMLA_REQUIRE(out.empty || o.empty || out.last < o.first || o.last < out.first,
                    "%s: argument '%s': bytes [%p, %p] overlap argument '%s' at [%p, %p] (an "
                    "output must not overlap the call's inputs or its other outputs)",
                    op, out.name, reinterpret_cast<void*>(out.first),
                    reinterpret_cast<void*>(out.last), o.name, reinterpret_cast<void*>(o.first),
                    reinterpret_cast<void*>(o.last));
  }
  return SNAPMLA_SUCCESS;
}

// q: BF16, `tokens` x `heads` rows of 576, strides named as given.
// `row`: the elements of one (token, head) row: 576 (q_nope | q_pe), 512 (q_nope), 64 (q_pe).
snapmla_status_t check_q(const char* op, const char* name, const void* q, Dim batch, Dim token,
                         Dim head, int row = kHeadDim) {
  SNAPMLA_TRY(check_pointer(op, name, q, kAlignBf16, "BF16 elements"));
  for (const Dim& d : {batch, token, head}) {
    SNAPMLA_REQUIRE(d.count <= 1 || d.stride >= row,
                    "%s: argument '%s': expected >= %d elements, got %lld", op, d.name, row,
                    static_cast<long long>(d.stride));
  }
  return check_span(op, name, q, 2, row, {batch, token, head});
}
}  // namespace

namespace {
// snapmla_quantize_q (two_term false: q_lo and q_lo_scale unused) and snapmla_quantize_q2.
snapmla_status_t quantize_q_impl(const char* op, const void* q, int64_t num_tokens,
                                 int32_t num_heads, int64_t q_stride_token, int64_t q_stride_head,
                                 void* q_content, void* q_rope, float* q_scale, bool two_term,
                                 void* q_lo, float* q_lo_scale, snapmla_stream_t stream) {
  SNAPMLA_REQUIRE(num_tokens >= 0, "%s: argument 'num_tokens': expected >= 0, got %lld", op,
                  static_cast<long long>(num_tokens));
  SNAPMLA_REQUIRE(num_heads >= 1 && num_heads <= kMaxQuantizeHeads,
                  "%s: argument 'num_heads': expected 1 .. %d, got %d", op, kMaxQuantizeHeads,
                  num_heads);
  if (num_tokens == 0) return SNAPMLA_SUCCESS;
  int64_t rows = 0;
  SNAPMLA_REQUIRE(!__builtin_mul_overflow(num_tokens, int64_t{num_heads}, &rows),
                  "%s: argument 'num_tokens': %lld tokens x %d heads overflows int64", op,
                  static_cast<long long>(num_tokens), num_heads);
  SNAPMLA_TRY(check_q(op, "q", q, {1, 0, "num_tokens"},
                      {num_tokens, q_stride_token, "q_stride_token"},
                      {num_heads, q_stride_head, "q_stride_head"}));
  SNAPMLA_TRY(
      check_pointer(op, "q_content", q_content, kAlignQContent, "8-byte stores of E4M3 codes"));
  SNAPMLA_TRY(check_pointer(op, "q_rope", q_rope, kAlignQRope, "16-byte stores of BF16"));
  SNAPMLA_TRY(check_pointer(op, "q_scale", q_scale, kAlignInt32, "fp32 elements"));
  SNAPMLA_TRY(
      check_span(op, "q_content", q_content, 1, kContentDim, {{rows, kContentDim, "num_tokens"}}));
  SNAPMLA_TRY(check_span(op, "q_rope", q_rope, 2, kRopeDim, {{rows, kRopeDim, "num_tokens"}}));
  SNAPMLA_TRY(check_span(op, "q_scale", q_scale, 4, 1, {{rows, 1, "num_tokens"}}));
  if (two_term) {
    SNAPMLA_TRY(check_pointer(op, "q_lo", q_lo, kAlignQContent, "8-byte stores of E4M3 codes"));
    SNAPMLA_TRY(check_pointer(op, "q_lo_scale", q_lo_scale, kAlignInt32, "fp32 elements"));
    SNAPMLA_TRY(
        check_span(op, "q_lo", q_lo, 1, kContentDim, {{rows, kContentDim, "num_tokens"}}));
    SNAPMLA_TRY(check_span(op, "q_lo_scale", q_lo_scale, 4, 1, {{rows, 1, "num_tokens"}}));
  }
  SNAPMLA_TRY(check_device(op, nullptr));
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
  if (two_term) {
    p.q_lo = static_cast<uint8_t*>(q_lo);
    p.q_lo_scale = q_lo_scale;
  }
  SNAPMLA_CUDA(op, launch_quantize_q(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}
}  // namespace

extern "C" SNAPMLA_API snapmla_status_t snapmla_quantize_q(
    const void* q, int64_t num_tokens, int32_t num_heads, int64_t q_stride_token,
    int64_t q_stride_head, void* q_content, void* q_rope, float* q_scale, snapmla_stream_t stream) {
  return quantize_q_impl("snapmla_quantize_q", q, num_tokens, num_heads, q_stride_token,
                         q_stride_head, q_content, q_rope, q_scale, false, nullptr, nullptr,
                         stream);
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_quantize_q2(
    const void* q, int64_t num_tokens, int32_t num_heads, int64_t q_stride_token,
    int64_t q_stride_head, void* q_content, void* q_rope, float* q_scale, void* q_lo,
    float* q_lo_scale, snapmla_stream_t stream) {
  return quantize_q_impl("snapmla_quantize_q2", q, num_tokens, num_heads, q_stride_token,
                         q_stride_head, q_content, q_rope, q_scale, true, q_lo, q_lo_scale,
                         stream);
}

// ------------------------------------------------------------------------------ decode
extern "C" SNAPMLA_API snapmla_status_t snapmla_decode_buffer_sizes(
    const snapmla_decode_config_t* config, size_t* plan_bytes, size_t* workspace_bytes) {
  const char* op = "snapmla_decode_buffer_sizes";
  snapmla_decode_config_t c;
  SNAPMLA_TRY(check_decode_config(op, config, &c));
  SNAPMLA_REQUIRE(plan_bytes != nullptr, "%s: argument 'plan_bytes' is NULL", op);
  SNAPMLA_REQUIRE(workspace_bytes != nullptr, "%s: argument 'workspace_bytes' is NULL", op);
  int parts = 0;
  SNAPMLA_TRY(num_parts_of(op, c, &parts));
  decode_buffer_bytes(c, parts, plan_bytes, workspace_bytes);
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_decode_plan(const snapmla_decode_config_t* config,
                                                            const int32_t* cache_seqlens,
                                                            void* plan, snapmla_stream_t stream) {
  const char* op = "snapmla_decode_plan";
  snapmla_decode_config_t c;
  SNAPMLA_TRY(check_decode_config(op, config, &c));
  SNAPMLA_TRY(check_pointer(op, "cache_seqlens", cache_seqlens, kAlignInt32, "int32 elements"));
  SNAPMLA_TRY(check_pointer(op, "plan", plan, kAlignPlan, "the plan's int32 words"));
  SNAPMLA_TRY(check_span(op, "cache_seqlens", cache_seqlens, 4, c.batch_size, {}));
  if (c.num_sm_parts > 0) SNAPMLA_TRY(check_decode_buffers(op, c, c.num_sm_parts, plan, nullptr));
  SNAPMLA_TRY(check_device(op, nullptr));
  int parts = 0, free_parts = 0;
  SNAPMLA_TRY(num_parts_of(op, c, &parts, &free_parts));
  if (c.num_sm_parts == 0) SNAPMLA_TRY(check_decode_buffers(op, c, parts, plan, nullptr));
  SNAPMLA_CUDA(op, decode::launch_plan(cache_seqlens, c.batch_size, c.q_len, c.num_heads,
                                       c.max_pages, parts, free_parts,
                                       c.num_sm_parts > 0 ? 1 : decode::kMinPartCost,
                                       static_cast<int32_t*>(plan),
                                       reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

// A decode call's launches in stream order: the Q-quant kernel, the attention kernel, the split
// combine. The first error stops the sequence.
static cudaError_t launch_decode_kernels(const decode::DecodeParams& p, const QuantizeQParams& qp,
                                         decode::Kernel kernel, cudaStream_t s) {
  cudaError_t err = launch_quantize_q(qp, s);
  if (err == cudaSuccess) {
    err = kernel == decode::Kernel::kReference ? decode::launch_reference_decode(p, s)
                                               : decode::launch_sm90_decode(kernel, p, s);
  }
  return err == cudaSuccess ? decode::launch_combine(p, s) : err;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_decode_select_kernel(
    const snapmla_decode_config_t* config, int32_t kernel, int32_t* selected) {
  const char* op = "snapmla_decode_select_kernel";
  snapmla_decode_config_t c;
  SNAPMLA_TRY(check_decode_config(op, config, &c));
  SNAPMLA_REQUIRE(selected != nullptr, "%s: argument 'selected' is NULL", op);
  SNAPMLA_TRY(check_kernel_option(op, "kernel", c, kernel));
  *selected = select_kernel(c, kernel, 0) == decode::Kernel::kReference
                  ? SNAPMLA_DECODE_KERNEL_REFERENCE
                  : SNAPMLA_DECODE_KERNEL_FAST;
  return SNAPMLA_SUCCESS;
}

extern "C" SNAPMLA_API snapmla_status_t snapmla_decode(snapmla_cache_t handle,
                                                       const snapmla_decode_config_t* config,
                                                       const snapmla_decode_args_t* args_in,
                                                       const void* plan, void* workspace,
                                                       snapmla_stream_t stream) {
  const char* op = "snapmla_decode";
  snapmla_decode_config_t c;
  SNAPMLA_TRY(check_decode_config(op, config, &c));
  snapmla_decode_args_t a;
  SNAPMLA_TRY(read_sized(
      op, "args", args_in, &a, offsetof(snapmla_decode_args_t, lse) + sizeof(float*),
      {{"q_pe", offsetof(snapmla_decode_args_t, q_pe), sizeof(void*)},
       {"q_pe_stride_batch", offsetof(snapmla_decode_args_t, q_pe_stride_batch), sizeof(int64_t)},
       {"q_pe_stride_token", offsetof(snapmla_decode_args_t, q_pe_stride_token), sizeof(int64_t)},
       {"q_pe_stride_head", offsetof(snapmla_decode_args_t, q_pe_stride_head), sizeof(int64_t)},
       {"out_dtype", offsetof(snapmla_decode_args_t, out_dtype), sizeof(int32_t)}}));
  snapmla_cache cache;
  SNAPMLA_TRY(check_cache_layer(op, handle, "args.layer", a.layer, &cache));
  SNAPMLA_REQUIRE(std::isfinite(a.softmax_scale) && a.softmax_scale > 0.f,
                  "%s: argument 'args.softmax_scale': expected a finite value > 0, got %g", op,
                  static_cast<double>(a.softmax_scale));
  SNAPMLA_TRY(check_kernel_option(op, "args.kernel", c, a.kernel));
  const bool two_term = c.q_precision == SNAPMLA_Q_PRECISION_FP8X2;
  SNAPMLA_REQUIRE(a.out_dtype == SNAPMLA_OUT_BF16 || a.out_dtype == SNAPMLA_OUT_FP32,
                  "%s: argument 'args.out_dtype': expected 0 (bf16) or 1 (fp32), got %d", op,
                  a.out_dtype);
  const bool fp32_out = a.out_dtype == SNAPMLA_OUT_FP32;
  const int64_t out_elem = fp32_out ? 4 : 2;  // bytes an element of out
  const int64_t b = c.batch_size, s_q = c.q_len, h = c.num_heads;
  const bool split_q = a.q_pe != nullptr;  // q holds q_nope only, q_pe the RoPE part
  SNAPMLA_TRY(check_q(op, "args.q", a.q, {b, a.q_stride_batch, "args.q_stride_batch"},
                      {s_q, a.q_stride_token, "args.q_stride_token"},
                      {h, a.q_stride_head, "args.q_stride_head"},
                      split_q ? kContentDim : kHeadDim));
  if (split_q) {
    SNAPMLA_TRY(check_q(op, "args.q_pe", a.q_pe, {b, a.q_pe_stride_batch, "args.q_pe_stride_batch"},
                        {s_q, a.q_pe_stride_token, "args.q_pe_stride_token"},
                        {h, a.q_pe_stride_head, "args.q_pe_stride_head"}, kRopeDim));
  }
  SNAPMLA_TRY(check_pointer(op, "args.block_table", a.block_table, kAlignInt32, "int32 elements"));
  SNAPMLA_REQUIRE(a.block_table_stride >= c.max_pages || c.batch_size == 1,
                  "%s: argument 'args.block_table_stride': expected >= max_pages = %d, got %lld",
                  op, c.max_pages, static_cast<long long>(a.block_table_stride));
  SNAPMLA_TRY(check_span(op, "args.block_table", a.block_table, 4, c.max_pages,
                         {{b, a.block_table_stride, "args.block_table_stride"}}));
  SNAPMLA_TRY(
      check_pointer(op, "args.cache_seqlens", a.cache_seqlens, kAlignInt32, "int32 elements"));
  SNAPMLA_TRY(check_span(op, "args.cache_seqlens", a.cache_seqlens, 4, b, {}));
  SNAPMLA_TRY(check_pointer(op, "args.out", a.out, kAlignOut, "the combine's 16-byte stores"));
  SNAPMLA_TRY(check_span(op, "args.out", a.out, out_elem, b * s_q * h * kContentDim, {}));
  if (a.lse != nullptr) {
    SNAPMLA_TRY(check_pointer(op, "args.lse", a.lse, kAlignInt32, "fp32 elements"));
    SNAPMLA_TRY(check_span(op, "args.lse", a.lse, 4, b * h * s_q, {}));
  }
  // the outputs apart from the inputs and each other (as snapmla.decode checks them)
  const Extent q_ext = extent_of("args.q", a.q, 2, split_q ? kContentDim : kHeadDim,
                                 {{b, a.q_stride_batch, ""}, {s_q, a.q_stride_token, ""},
                                  {h, a.q_stride_head, ""}});
  const Extent q_pe_ext = extent_of("args.q_pe", a.q_pe, 2, kRopeDim,
                                    {{b, a.q_pe_stride_batch, ""},
                                     {s_q, a.q_pe_stride_token, ""},
                                     {h, a.q_pe_stride_head, ""}});
  const Extent bt_ext = extent_of("args.block_table", a.block_table, 4, c.max_pages,
                                  {{b, a.block_table_stride, ""}});
  const Extent sl_ext = extent_of("args.cache_seqlens", a.cache_seqlens, 4, b, {});
  const Extent out_ext = extent_of("args.out", a.out, out_elem, b * s_q * h * kContentDim, {});
  const Extent lse_ext = extent_of("args.lse", a.lse, 4, b * h * s_q, {});
  // the cache: all of it when it is one block, the layer's own memory when each layer has one
  const Extent cache_ext =
      cache.layers == nullptr
          ? extent_of("cache", cache.data, 1, static_cast<int64_t>(cache.bytes), {})
          : extent_of("cache", cache.layers[a.layer], 1,
                      int64_t{cache.num_pages} * cache.page_stride, {});
  SNAPMLA_TRY(check_apart(op, out_ext, {cache_ext, q_ext, q_pe_ext, bt_ext, sl_ext, lse_ext}));
  SNAPMLA_TRY(check_apart(op, lse_ext, {cache_ext, q_ext, q_pe_ext, bt_ext, sl_ext}));
  SNAPMLA_TRY(check_pointer(op, "plan", plan, kAlignPlan, "the plan's int32 words"));
  SNAPMLA_TRY(check_pointer(op, "workspace", workspace, kAlignWorkspace,
                            "its parts are 256-byte aligned for TMA and vector loads"));
  // The workspace (written) apart from everything else, the plan (read) from the outputs:
  // the attention kernel may read q after another CTA wrote partials (the fused Q), and the
  // combine reads the plan while it writes out. Their sizes need the split count: before the
  // device is asked where the config gives it, after otherwise.
  auto buffers_apart = [&](int parts) -> snapmla_status_t {
    size_t sizes[2] = {0, 0};  // plan, workspace
    SNAPMLA_TRY(check_decode_buffers(op, c, parts, plan, workspace, sizes));
    const Extent plan_ext = extent_of("plan", plan, 1, static_cast<int64_t>(sizes[0]), {});
    const Extent ws_ext = extent_of("workspace", workspace, 1, static_cast<int64_t>(sizes[1]), {});
    SNAPMLA_TRY(check_apart(
        op, ws_ext, {cache_ext, q_ext, q_pe_ext, bt_ext, sl_ext, out_ext, lse_ext, plan_ext}));
    SNAPMLA_TRY(check_apart(op, out_ext, {plan_ext}));
    return check_apart(op, lse_ext, {plan_ext});
  };
  if (c.num_sm_parts > 0) SNAPMLA_TRY(buffers_apart(c.num_sm_parts));
  SNAPMLA_TRY(check_device(op, &cache));
  int parts = 0;
  SNAPMLA_TRY(num_parts_of(op, c, &parts));
  if (c.num_sm_parts == 0) SNAPMLA_TRY(buffers_apart(parts));

  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const decode::WorkspaceLayout w =
      decode::WorkspaceLayout::make(c.batch_size, c.q_len, c.num_heads, parts, two_term);
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
                     reinterpret_cast<float*>(ws + w.q_scale),
                     static_cast<const uint16_t*>(a.q_pe),
                     a.q_pe_stride_batch,
                     a.q_pe_stride_token,
                     a.q_pe_stride_head};
  if (two_term) {
    qp.q_lo = ws + w.q_lo;
    qp.q_lo_scale = reinterpret_cast<float*>(ws + w.q_lo_scale);
  }
  decode::DecodeParams p;
  std::memset(&p, 0, sizeof(p));  // its padding too: the launch key compares its bytes
  p.q_content = ws + w.q_content;
  p.q_rope = reinterpret_cast<const uint16_t*>(ws + w.q_rope);
  p.q_scale = reinterpret_cast<const float*>(ws + w.q_scale);
  p.layer_base = layer_base(cache, a.layer);
  p.num_pages = cache.num_pages;
  p.page_stride = cache.page_stride;
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
  if (fp32_out) {
    p.out_f32 = static_cast<float*>(a.out);
  } else {
    p.out = static_cast<uint16_t*>(a.out);
  }
  p.lse = a.lse;
  p.partial_o = reinterpret_cast<float*>(ws + w.partial_o);
  p.partial_lse = reinterpret_cast<float*>(ws + w.partial_lse);
  if (two_term) {
    p.q_lo = qp.q_lo;
    p.q_lo_scale = qp.q_lo_scale;
  }
  const decode::Kernel kernel =
      select_kernel(c, a.kernel, decode::typical_chain(p.batch, p.max_pages, p.num_parts));
  // The call's launches through launch_repeated (common/repeated_launch.h): the key is every
  // value they read on the host.
  struct Launches {
    decode::DecodeParams p;
    QuantizeQParams qp;
    decode::Kernel kernel;
    int32_t pad;
  };
  static_assert(std::has_unique_object_representations_v<QuantizeQParams>,
                "QuantizeQParams is compared byte for byte: no padding");
  static_assert(sizeof(Launches) <= kMaxLaunchKeyBytes, "the launch key");
  Launches key;
  std::memset(&key, 0, sizeof(key));
  std::memcpy(&key.p, &p, sizeof(p));
  std::memcpy(&key.qp, &qp, sizeof(qp));
  key.kernel = kernel;
  auto launch_all = [](void* ctx, cudaStream_t st) -> cudaError_t {
    const Launches& k = *static_cast<const Launches*>(ctx);
    return launch_decode_kernels(k.p, k.qp, k.kernel, st);
  };
  SNAPMLA_CUDA(op, launch_repeated(&key, sizeof(key), launch_all, &key, s));
  return SNAPMLA_SUCCESS;
}
