// One warp quantizes a row (key token or query head), whole-warp functions. Lane l owns content
// [8l, 8l + 8), [256 + 8l, 264 + 8l) and RoPE 2l, 2l + 1: coalesced, RoPE quotients spread evenly.
#pragma once

#include "common/numerics.cuh"

namespace snapmla {

static_assert(kContentDim == 2 * kWarpSize * 8, "two 8-wide chunks of content per lane");
static_assert(kRopeDim == 2 * kWarpSize, "two RoPE values per lane");

struct Bf16x8 {
  uint32_t w[4];  // 8 bf16, element 2i in the low half of w[i]
};

// kL2: through L2, not the read-only path, for data another grid may write during this grid's life.
template <bool kAligned, bool kL2 = false>
__device__ __forceinline__ Bf16x8 load_bf16x8(const uint16_t* p) {
  static_assert(kAligned || !kL2, "the L2 path is for 16-byte loads");
  Bf16x8 v;
  if constexpr (kL2) {
    const uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
    v.w[0] = u.x, v.w[1] = u.y, v.w[2] = u.z, v.w[3] = u.w;
  } else if constexpr (kAligned) {
    uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    v.w[0] = u.x, v.w[1] = u.y, v.w[2] = u.z, v.w[3] = u.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v.w[i] = static_cast<uint32_t>(__ldg(p + 2 * i)) |
               (static_cast<uint32_t>(__ldg(p + 2 * i + 1)) << 16);
    }
  }
  return v;
}

__device__ __forceinline__ float lo_f(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// x / s correctly rounded in a multiply and two FMAs (Markstein: the exact remainder corrects
// RN(x RN(1/s))). `ok` turns false where that may fail: a non-finite quotient; in checked(), for
// the RoPE kept in BF16, also a nonzero |x| < 2^-100 (the remainder underflows) or a subnormal
// quotient (content quotients that small change no E4M3 code).
struct FastDivider {
  float s, r;
  __device__ __forceinline__ float operator()(float x, bool& ok) const {
    const float q0 = x * r;
    const float q1 = fmaf(fmaf(-q0, s, x), r, q0);
    ok &= isfinite(q1);
    return copysignf(q1, q0);
  }
  __device__ __forceinline__ float checked(float x, bool& ok) const {
    const float q = (*this)(x, ok);
    // Bitwise, not ||: short-circuit operators make ptxas branch around each element.
    const bool tiny = (fabsf(x) < 0x1p-100f) | (fabsf(q) < 0x1p-126f);
    ok &= !tiny | (x == 0.f);
    return q;
  }
};
struct IeeeDivider {
  float s;
  __device__ __forceinline__ float operator()(float x, bool&) const { return __fdiv_rn(x, s); }
  __device__ __forceinline__ float checked(float x, bool& ok) const { return (*this)(x, ok); }
};

// The fast divider, or the IEEE division for the whole row where any lane's quotient failed.
template <class Result, class Quantize>
__device__ __forceinline__ Result quantize_by_row_divider(float s, const Quantize& quantize) {
  bool ok = isfinite(s);
  Result r = ok ? quantize(FastDivider{s, __frcp_rn(s)}, ok) : Result{};
  if (!__all_sync(0xffffffffu, ok)) r = quantize(IeeeDivider{s}, ok);
  return r;
}

struct QuantizedRow {
  uint2 content[2];  // 8 E4M3 each: elements [8l, 8l+8) and [256+8l, 256+8l+8)
  uint32_t rope;     // 2 bf16: elements 2l, 2l + 1
  float scale;       // the row's scale (every lane)
};

template <class Div>
__device__ __forceinline__ void chunk_quotients(const Div& div, const Bf16x8& c, bool& ok,
                                                float (&x)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = div(lo_f(c.w[i]), ok);
    x[2 * i + 1] = div(hi_f(c.w[i]), ok);
  }
}

__device__ __forceinline__ uint2 to_e4m3x8(const float (&v)[8]) {
  return make_uint2(to_e4m3x4(v[0], v[1], v[2], v[3]), to_e4m3x4(v[4], v[5], v[6], v[7]));
}

// x receives the content's quotients, for the low term.
template <class Div>
__device__ __forceinline__ QuantizedRow quantize_with(const Div& div, const Bf16x8& c0,
                                                      const Bf16x8& c1, uint32_t r, float s,
                                                      bool& ok, float (&x)[2][8]) {
  QuantizedRow q;
  q.scale = s;
  chunk_quotients(div, c0, ok, x[0]);
  chunk_quotients(div, c1, ok, x[1]);
  q.content[0] = to_e4m3x8(x[0]);
  q.content[1] = to_e4m3x8(x[1]);
  q.rope = pack_bf16x2(div.checked(lo_f(r), ok), div.checked(hi_f(r), ok));
  return q;
}

struct RowInputs {
  Bf16x8 c0, c1;
  uint32_t r;  // RoPE element 2l in the low half
};

template <bool kAligned, bool kL2 = false>
__device__ __forceinline__ RowInputs load_row(const uint16_t* content, const uint16_t* rope,
                                              int lane) {
  RowInputs in;
  in.c0 = load_bf16x8<kAligned, kL2>(content + 8 * lane);
  in.c1 = load_bf16x8<kAligned, kL2>(content + kContentDim / 2 + 8 * lane);
  const uint16_t* r = rope + 2 * lane;
  if constexpr (kL2) {
    in.r = __ldcg(reinterpret_cast<const unsigned int*>(r));
  } else if constexpr (kAligned) {
    in.r = __ldg(reinterpret_cast<const unsigned int*>(r));
  } else {
    in.r = static_cast<uint32_t>(__ldg(r)) | (static_cast<uint32_t>(__ldg(r + 1)) << 16);
  }
  return in;
}

__device__ __forceinline__ float loaded_row_scale(const RowInputs& in) {
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    amax = nan_max(amax, nan_max(fabsf(lo_f(in.c0.w[i])), fabsf(hi_f(in.c0.w[i]))));
    amax = nan_max(amax, nan_max(fabsf(lo_f(in.c1.w[i])), fabsf(hi_f(in.c1.w[i]))));
  }
  amax = warp_nan_max_nonneg(amax);  // (every lane's amax: fabsf's, or nan_max's NaN)
  return row_scale(amax);
}

__device__ __forceinline__ QuantizedRow quantize_loaded(const RowInputs& in) {
  const float s = loaded_row_scale(in);

  return quantize_by_row_divider<QuantizedRow>(s, [&](const auto& div, bool& ok) {
    float x[2][8];
    return quantize_with(div, in.c0, in.c1, in.r, s, ok, x);
  });
}

template <bool kAligned>
__device__ __forceinline__ QuantizedRow quantize_row(const uint16_t* content, const uint16_t* rope,
                                                     int lane) {
  return quantize_loaded(load_row<kAligned>(content, rope, lane));
}

// The two-term query (snapmla.reference.quantize_q2): q_lo = e4m3(16 (x - q_hi)), x the quotient
// q_hi rounds (exact difference and product: one rounding), s2 = s1 / 16.
struct QuantizedLo {
  uint2 content[2];
  float scale;
};
struct QuantizedRow2 {
  QuantizedRow hi;
  QuantizedLo lo;
};

__device__ __forceinline__ uint2 low_codes(const float (&x)[8], uint2 hi) {
  const uint32_t codes[2] = {hi.x, hi.y};
  float v[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // elements 2i, 2i + 1
    const float2 h = e4m3x2_to_float2(static_cast<uint16_t>(codes[i / 2] >> (16 * (i % 2))));
    v[2 * i] = 16.f * (x[2 * i] - h.x);
    v[2 * i + 1] = 16.f * (x[2 * i + 1] - h.y);
  }
  return to_e4m3x8(v);
}

__device__ __forceinline__ QuantizedRow2 quantize_loaded_two_term(const RowInputs& in) {
  const float s = loaded_row_scale(in);
  return quantize_by_row_divider<QuantizedRow2>(s, [&](const auto& div, bool& ok) {
    QuantizedRow2 q;
    float x[2][8];
    q.hi = quantize_with(div, in.c0, in.c1, in.r, s, ok, x);
    q.lo.scale = s * 0.0625f;  // exact
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      q.lo.content[half] = low_codes(x[half], q.hi.content[half]);
    }
    return q;
  });
}

// content_out 8-byte aligned, rope_out 4-byte aligned.
__device__ __forceinline__ void store_row(const QuantizedRow& q, uint8_t* content_out,
                                          uint16_t* rope_out, float* scale_out, int lane) {
  reinterpret_cast<uint2*>(content_out)[lane] = q.content[0];
  reinterpret_cast<uint2*>(content_out + kContentDim / 2)[lane] = q.content[1];
  reinterpret_cast<uint32_t*>(rope_out)[lane] = q.rope;
  if (lane == 0) *scale_out = q.scale;
}

__device__ __forceinline__ void store_low_term(const QuantizedLo& lo, uint8_t* content_out,
                                               float* scale_out, int lane) {
  reinterpret_cast<uint2*>(content_out)[lane] = lo.content[0];
  reinterpret_cast<uint2*>(content_out + kContentDim / 2)[lane] = lo.content[1];
  if (lane == 0) *scale_out = lo.scale;
}

}  // namespace snapmla
