// snapmla_quantize_q and snapmla_quantize_q2: the query rows' quantization on its own.
#include "api/checks.h"
#include "quantize/quantize_q.h"

namespace snapmla::api {
namespace {

constexpr int kMaxQuantizeHeads = 1024;
constexpr size_t kAlignQContent = 8;  // quantize_q: 8-byte stores of 8 E4M3 codes
constexpr size_t kAlignQRope = 16;    // quantize_q: 16-byte stores of 8 bf16

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
    SNAPMLA_TRY(check_span(op, "q_lo", q_lo, 1, kContentDim, {{rows, kContentDim, "num_tokens"}}));
    SNAPMLA_TRY(check_span(op, "q_lo_scale", q_lo_scale, 4, 1, {{rows, 1, "num_tokens"}}));
  }
  // The outputs apart from q and each other (without the two-term query q_lo and q_lo_scale
  // are NULL: no bytes).
  const Extent q_ext = extent_of(
      "q", q, 2, kHeadDim, {{num_tokens, q_stride_token, ""}, {num_heads, q_stride_head, ""}});
  const Extent content = extent_of("q_content", q_content, 1, rows * kContentDim, {});
  const Extent rope = extent_of("q_rope", q_rope, 2, rows * kRopeDim, {});
  const Extent scale = extent_of("q_scale", q_scale, 4, rows, {});
  const Extent lo = extent_of("q_lo", q_lo, 1, rows * kContentDim, {});
  const Extent lo_scale = extent_of("q_lo_scale", q_lo_scale, 4, rows, {});
  SNAPMLA_TRY(check_apart(op, content, {q_ext, rope, scale, lo, lo_scale}));
  SNAPMLA_TRY(check_apart(op, rope, {q_ext, scale, lo, lo_scale}));
  SNAPMLA_TRY(check_apart(op, scale, {q_ext, lo, lo_scale}));
  SNAPMLA_TRY(check_apart(op, lo, {q_ext, lo_scale}));
  SNAPMLA_TRY(check_apart(op, lo_scale, {q_ext}));
  SNAPMLA_TRY(check_device(op, nullptr));
  QuantizeQParams p{};  // q as groups of one token: [n, 1, h, 576]
  p.q = static_cast<const uint16_t*>(q);
  p.stride_batch = p.stride_token = q_stride_token;
  p.stride_head = q_stride_head;
  p.num_tokens = num_tokens;
  p.q_len = 1;
  p.num_heads = num_heads;
  p.q_content = static_cast<uint8_t*>(q_content);
  p.q_rope = static_cast<uint16_t*>(q_rope);
  p.q_scale = q_scale;
  if (two_term) {
    p.q_lo = static_cast<uint8_t*>(q_lo);
    p.q_lo_scale = q_lo_scale;
  }
  SNAPMLA_CUDA(op, launch_quantize_q(p, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}

}  // namespace
}  // namespace snapmla::api

using namespace snapmla::api;

extern "C" SNAPMLA_API snapmla_status_t snapmla_quantize_q(
    const void* q, int64_t num_tokens, int32_t num_heads, int64_t q_stride_token,
    int64_t q_stride_head, void* q_content, void* q_rope, float* q_scale, snapmla_stream_t stream) {
  return quantize_q_impl("snapmla_quantize_q", q, num_tokens, num_heads, q_stride_token,
                         q_stride_head, q_content, q_rope, q_scale, false, nullptr, nullptr,
                         stream);
}

extern "C" SNAPMLA_API snapmla_status_t
snapmla_quantize_q2(const void* q, int64_t num_tokens, int32_t num_heads, int64_t q_stride_token,
                    int64_t q_stride_head, void* q_content, void* q_rope, float* q_scale,
                    void* q_lo, float* q_lo_scale, snapmla_stream_t stream) {
  return quantize_q_impl("snapmla_quantize_q2", q, num_tokens, num_heads, q_stride_token,
                         q_stride_head, q_content, q_rope, q_scale, true, q_lo, q_lo_scale, stream);
}
