// Q-quant: per (token, head) scale, E4M3 content, RoPE pre-divided by the scale.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

struct QuantizeQParams {
  const uint16_t* q;       // bf16 [n, h, 576], strides stride_token / stride_head (elements)
  int64_t stride_token;
  int64_t stride_head;
  int64_t num_tokens;      // n
  int32_t num_heads;       // h
  uint8_t* q_content;      // e4m3 [n, h, 512] contiguous
  uint16_t* q_rope;        // bf16 [n, h, 64] contiguous
  float* q_scale;          // fp32 [n, h] contiguous
};

cudaError_t launch_quantize_q(const QuantizeQParams& params, cudaStream_t stream);

}  // namespace snapmla
