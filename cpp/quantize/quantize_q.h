// Q-quant: per (token, head) scale, E4M3 content, RoPE pre-divided by the scale.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

constexpr int kPlanShapeWords = 8;  // decode::PlanShape::kWords

struct QuantizeQParams {
  const uint16_t* q;     // bf16 [n / q_len, q_len, h, 576], strides in elements
  int64_t stride_batch;  // between groups of q_len tokens
  int64_t stride_token;  // between tokens of a group
  int64_t stride_head;
  int64_t num_tokens;  // n (a multiple of q_len)
  int32_t q_len;       // tokens per group (1 for a flat [n, h, 576])
  int32_t num_heads;   // h
  uint8_t* q_content;  // e4m3 [n, h, 512] contiguous
  uint16_t* q_rope;    // bf16 [n, h, 64] contiguous
  float* q_scale;      // fp32 [n, h] contiguous
  // Optional: the RoPE part in its own tensor, bf16 [n / q_len, q_len, h, 64] with these
  // strides; q then holds only the 512 content elements of each row. nullptr: q's [512, 576).
  const uint16_t* q_pe;
  int64_t pe_stride_batch;
  int64_t pe_stride_token;
  int64_t pe_stride_head;
  // Optional: the two-term query's low part (snapmla.reference.quantize_q2), e4m3 [n, h, 512]
  // and its fp32 row scale [n, h], both contiguous. nullptr: the one-term contract only.
  uint8_t* q_lo;
  float* q_lo_scale;
  // Optional (snapmla_decode, whose outputs above are parts of its workspace): the call's plan
  // and the words its header must start with (decode::PlanShape) for the workspace to be laid
  // out as these pointers assume. Where they differ the kernel writes nothing, and the attention
  // kernel, comparing the same words, writes NaN rows. nullptr: no check.
  const int32_t* plan;
  int32_t plan_shape[kPlanShapeWords];
};

cudaError_t launch_quantize_q(const QuantizeQParams& params, cudaStream_t stream);

// The Q-quant kernel's geometry (one warp a row), which the decode plan also reads: it leaves
// the SMs the Q-quant CTAs hold to them.
constexpr int kQuantizeQWarps = 8;
constexpr int kQuantizeQBlocksPerSm = 8;

// Every row's content and RoPE can be read with 16-byte loads (16-byte aligned bases, strides
// in whole 8-element units): the Q-quant kernel's aligned path, and the seesaw kernel's own.
inline bool quantize_q_vectorizable(const QuantizeQParams& p) {
  auto ok = [](const void* ptr, int64_t s0, int64_t s1, int64_t s2) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s0 % 8 == 0 && s1 % 8 == 0 &&
           s2 % 8 == 0;
  };
  return ok(p.q, p.stride_batch, p.stride_token, p.stride_head) &&
         (p.q_pe == nullptr ||
          ok(p.q_pe, p.pe_stride_batch, p.pe_stride_token, p.pe_stride_head));
}

}  // namespace snapmla
