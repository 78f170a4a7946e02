// Error capture, validation-only mode, the checks of checks.h and the per-device facts; the
// entry points that report the version and errors.
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <string>

#include "api/cache.h"
#include "api/checks.h"
#include "common/launch.h"

static_assert(SNAPMLA_PAGE_BYTES == snapmla::kPageBytes, "header and kernels agree on a page");
static_assert(SNAPMLA_PAGE_ROPE_OFFSET == snapmla::kPageRopeOffset, "rope plane offset");
static_assert(SNAPMLA_PAGE_SCALE_OFFSET == snapmla::kPageScaleOffset, "scale plane offset");
static_assert(SNAPMLA_CONTENT_DIM == snapmla::kContentDim && SNAPMLA_ROPE_DIM == snapmla::kRopeDim,
              "dimensions");

static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8, "a 64-bit platform");

namespace snapmla::api {
namespace {

thread_local std::string t_last_error;
thread_local bool t_validate_only = false;

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

}  // namespace

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

bool validate_only() { return t_validate_only; }

snapmla_status_t validated(const char* op) {
  return fail(SNAPMLA_VALIDATED,
              "%s: validation-only mode: the arguments are valid, nothing was run", op);
}

snapmla_status_t check_pointer(const char* op, const char* name, const void* p, size_t alignment,
                               const char* why) {
  SNAPMLA_REQUIRE(p != nullptr, "%s: argument '%s' is NULL", op, name);
  SNAPMLA_REQUIRE(reinterpret_cast<uintptr_t>(p) % alignment == 0,
                  "%s: argument '%s': expected a %zu-byte aligned address (%s), got %p", op, name,
                  alignment, why, p);
  return SNAPMLA_SUCCESS;
}

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

snapmla_status_t check_apart(const char* op, const Extent& arg,
                             std::initializer_list<Extent> others) {
  for (const Extent& o : others) {
    SNAPMLA_REQUIRE(arg.empty || o.empty || arg.last < o.first || o.last < arg.first,
                    "%s: argument '%s': bytes [%p, %p] overlap argument '%s' at [%p, %p] (what "
                    "a call writes must not overlap what it reads or its other outputs)",
                    op, arg.name, reinterpret_cast<void*>(arg.first),
                    reinterpret_cast<void*>(arg.last), o.name, reinterpret_cast<void*>(o.first),
                    reinterpret_cast<void*>(o.last));
  }
  return SNAPMLA_SUCCESS;
}

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

snapmla_status_t check_q(const char* op, const char* name, const void* q, Dim batch, Dim token,
                         Dim head, int row) {
  SNAPMLA_TRY(check_pointer(op, name, q, kAlignBf16, "BF16 elements"));
  for (const Dim& d : {batch, token, head}) {
    SNAPMLA_REQUIRE(d.count <= 1 || d.stride >= row,
                    "%s: argument '%s': expected >= %d elements, got %lld", op, d.name, row,
                    static_cast<long long>(d.stride));
  }
  return check_span(op, name, q, 2, row, {batch, token, head});
}

}  // namespace snapmla::api

namespace snapmla {

cudaError_t current_device_sm_count(int* sm_count) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  api::DeviceFacts* facts = nullptr;
  err = api::read_device_facts(device, &facts);
  if (err != cudaSuccess) return err;
  *sm_count = facts->sm_count.load(std::memory_order_acquire);
  return cudaSuccess;
}

}  // namespace snapmla

using namespace snapmla::api;

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
