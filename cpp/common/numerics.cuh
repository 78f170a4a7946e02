// The constants and rounding steps of the numerics contract (include/snapmla/snapmla.h), shared
// by every kernel; host code sees the same constants.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace snapmla {

constexpr float kFp8Max = 448.0f;                        // largest finite E4M3 value
constexpr float kMinScale = 2.3283064365386963e-10f;     // 2^-32: floor of token / query scales
constexpr float kMinProbScale = 5.421010862427522e-20f;  // 2^-64: floor of the P-block scale
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

constexpr int kWarpSize = 32;

constexpr int kPageSize = 64;
constexpr int kContentDim = 512;
constexpr int kRopeDim = 64;
constexpr int kHeadDim = kContentDim + kRopeDim;
constexpr int64_t kPageBytes = 41216;
constexpr int64_t kPageContentOffset = 0;
constexpr int64_t kPageRopeOffset = 32768;
constexpr int64_t kPageScaleOffset = 40960;
static_assert(kPageRopeOffset == kPageSize * kContentDim, "content plane is 64 x 512 bytes");
static_assert(kPageScaleOffset == kPageRopeOffset + kPageSize * kRopeDim * 2, "rope plane");
static_assert(kPageBytes == kPageScaleOffset + kPageSize * 4, "scale plane");
static_assert(kPageRopeOffset % 128 == 0 && kPageScaleOffset % 128 == 0 && kPageBytes % 128 == 0,
              "every plane is 128-byte aligned");

// max(|a|, |b|) that propagates NaN (fmaxf would drop it and hide a NaN token).
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}

__device__ __forceinline__ float row_scale(float amax) {
  float s = __fdiv_rn(amax, kFp8Max);
  return (s < kMinScale) ? kMinScale : s;
}

__device__ __forceinline__ uint8_t to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// Element 0 in the low byte.
__device__ __forceinline__ uint32_t to_e4m3x4(float a, float b, float c, float d) {
  uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return (lo & 0xffffu) | (hi << 16);
}

// Exact: every E4M3 value is a half value.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t v) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  __nv_bfloat16 b = __float2bfloat16_rn(x);
  return *reinterpret_cast<uint16_t*>(&b);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16_bits(lo)) |
         (static_cast<uint32_t>(float_to_bf16_bits(hi)) << 16);
}

// The warp's nan_max for values with a clear sign bit or nan_max's NaN (0x7fffffff): those order
// as their bits, so one integer maximum (REDUX) equals a shuffle tree of nan_max (-0 would not).
__device__ __forceinline__ float warp_nan_max_nonneg(float v) {
  return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(v)));
}

}  // namespace snapmla
