// The C ABI's shared machinery: error capture, validation-only mode and the argument checks.
// Every check runs before an operation's first CUDA call, so a refused call has written nothing;
// a message names the operation and the argument ("<op>: argument '<name>': ...").
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <cstring>
#include <initializer_list>

#include "common/numerics.cuh"
#include "snapmla/snapmla.h"

namespace snapmla::api {

constexpr int kMaxDevices = 64;
constexpr int kMaxBatch = 65536;
constexpr int kMaxPages = ((int64_t{1} << 31) - 1) / kPageSize;  // num_pages * 64 fits int32
constexpr size_t kMaxStructSize = SNAPMLA_MAX_STRUCT_SIZE;

// Alignment (bytes) of device pointers: what the kernels' accesses need.
constexpr size_t kAlignBf16 = 2;   // bf16 inputs: element loads on the unaligned path
constexpr size_t kAlignInt32 = 4;  // block_table, cache_seqlens; fp32 lse, q_scale
constexpr size_t kAlignInt64 = 8;  // slots

// Records the message as the calling thread's last error; returns `status`.
snapmla_status_t fail(snapmla_status_t status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
snapmla_status_t cuda_fail(const char* what, cudaError_t err);

// The calling thread's validation-only mode (snapmla_set_validate_only).
bool validate_only();
// Where an operation would make its first CUDA call: in validation-only mode it stops here.
snapmla_status_t validated(const char* op);

#define SNAPMLA_REQUIRE(cond, ...)                                         \
  do {                                                                     \
    if (!(cond)) return fail(SNAPMLA_ERROR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

#define SNAPMLA_TRY(expr)                   \
  do {                                      \
    const snapmla_status_t st_ = (expr);    \
    if (st_ != SNAPMLA_SUCCESS) return st_; \
  } while (0)

#define SNAPMLA_CUDA(what, expr)                           \
  do {                                                     \
    const cudaError_t err_ = (expr);                       \
    if (err_ != cudaSuccess) return cuda_fail(what, err_); \
  } while (0)

// A field that an older caller's struct may lack (it then reads as zero).
struct OptionalField {
  const char* name;
  size_t offset;
  size_t size;
};

// A caller's size-prefixed struct into a zeroed *out by the header's "Config structs" rule: a
// struct_size below min_size or ending inside an `optional` field is refused, missing fields
// read as zero, and bytes past sizeof(T) must be zero.
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

// A device pointer: not NULL, aligned to `alignment` bytes (`why` says what needs it).
snapmla_status_t check_pointer(const char* op, const char* name, const void* p, size_t alignment,
                               const char* why);

// One strided dimension of an argument: `count` indices `stride` elements apart, the stride
// named `name` in messages. Dimensions of count <= 1 contribute nothing.
struct Dim {
  int64_t count;
  int64_t stride;
  const char* name;
};

// The bytes an argument spans, sum((count - 1) * stride) + inner elements of `elem` bytes, in
// checked int64 arithmetic (strides already checked non-negative). An overflow is refused naming
// the stride whose term overflows or is the largest; an end past the address space, the argument.
snapmla_status_t check_span(const char* op, const char* name, const void* p, int64_t elem,
                            int64_t inner, std::initializer_list<Dim> dims);

// The bytes [first, last] of an argument that passed check_span; empty for NULL or no elements.
struct Extent {
  const char* name;
  uintptr_t first, last;
  bool empty;
};
Extent extent_of(const char* name, const void* p, int64_t elem, int64_t inner,
                 std::initializer_list<Dim> dims);

// An argument's bytes must not overlap `others`: an output apart from the call's inputs and its
// other outputs, an input apart from the cache the call writes (another CTA, or a later kernel
// of the call, would read what one writes). Refused naming `arg`.
snapmla_status_t check_apart(const char* op, const Extent& arg,
                             std::initializer_list<Extent> others);

// The current device must be a Hopper (sm_90) and, if given, the cache's device. The first
// CUDA call of every operation that launches: validation-only mode stops here.
snapmla_status_t check_device(const char* op, const snapmla_cache* cache);

// BF16 c_kv [rows, 512] and k_pe [rows, 64] with their row strides.
snapmla_status_t check_bf16_rows(const char* op, const void* c_kv, int64_t c_kv_stride,
                                 const void* k_pe, int64_t k_pe_stride, int64_t rows);

// BF16 query rows of `row` elements: 576 (q_nope | q_pe), 512 (q_nope) or 64 (q_pe).
snapmla_status_t check_q(const char* op, const char* name, const void* q, Dim batch, Dim token,
                         Dim head, int row = kHeadDim);

}  // namespace snapmla::api
