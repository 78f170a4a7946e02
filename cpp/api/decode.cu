// Decode: the buffer sizes, the plan, the kernel choice and the attention call.
#include <cmath>
#include <cstring>

#include "api/cache.h"
#include "api/checks.h"
#include "common/launch.h"
#include "decode/decode.h"
#include "decode/dispatch.h"
#include "quantize/quantize_q.h"

namespace snapmla::api {
namespace {

constexpr int kMaxSmParts = 65535;
constexpr size_t kAlignOut = 16;         // decode out: the combine's 16-byte stores
constexpr size_t kAlignPlan = 16;        // decode plan (int32 words)
constexpr size_t kAlignWorkspace = 256;  // WorkspaceLayout parts are 256-byte aligned (TMA)

snapmla_status_t check_decode_config(const char* op, const snapmla_decode_config_t* in,
                                     snapmla_decode_config_t* c) {
  SNAPMLA_TRY(read_sized(
      op, "config", in, c, offsetof(snapmla_decode_config_t, num_sm_parts),
      {{"num_sm_parts", offsetof(snapmla_decode_config_t, num_sm_parts), sizeof(int32_t)},
       {"q_precision", offsetof(snapmla_decode_config_t, q_precision), sizeof(int32_t)},
       {"plan_bytes", offsetof(snapmla_decode_config_t, plan_bytes), sizeof(size_t)},
       {"workspace_bytes", offsetof(snapmla_decode_config_t, workspace_bytes), sizeof(size_t)}}));
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
  SNAPMLA_REQUIRE(
      c->q_precision == SNAPMLA_Q_PRECISION_FP8 || c->q_precision == SNAPMLA_Q_PRECISION_FP8X2,
      "%s: argument 'config.q_precision': expected 0 (fp8) or 1 (fp8x2), got %d", op,
      c->q_precision);
  return SNAPMLA_SUCCESS;
}

// Bounds of the plan's and the workspace's size arithmetic over every valid config: far from
// int64 overflow, so the sizes of a checked config are exact.
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
                  "where q_len * num_heads > %d (the fast kernel takes it only up to %d; here "
                  "%d), got %d",
                  op, name, decode::kTwoTermMaxRows, decode::kTwoTermMaxRows, c.q_len * c.num_heads,
                  option);
  return SNAPMLA_SUCCESS;
}

int row_tiles_of(const snapmla_decode_config_t& c) {
  return ceil_div(int64_t{c.q_len} * c.num_heads, decode::kTileRows);
}

// The parts whose attention CTAs find an SM free at launch (decode/plan.cu): with the default
// part count, one row tile a request and a Q-quant kernel before the attention kernel, all but
// the last G, G the Q-quant kernel's CTAs; else all of them.
int free_parts_of(const snapmla_decode_config_t& c, int parts, int sms) {
  const int64_t rows_per_request = int64_t{c.q_len} * c.num_heads;
  if (c.num_sm_parts > 0 || row_tiles_of(c) != 1) return parts;
  if (!decode::is_sm90(select_kernel(c, SNAPMLA_DECODE_KERNEL_AUTO, 0))) return parts;
  const int64_t held = warp_per_item_grid(int64_t{c.batch_size} * rows_per_request, kQuantizeQWarps,
                                          kQuantizeQBlocksPerSm, sms);
  return held < parts ? parts - static_cast<int>(held) : parts;
}

// The plan's part count (the config's, or the default for the SM count) and its free parts.
snapmla_status_t num_parts_of(const char* op, const snapmla_decode_config_t& c, int* parts,
                              int* free_parts = nullptr) {
  if (c.num_sm_parts > 0) {
    *parts = c.num_sm_parts;
    if (free_parts != nullptr) *free_parts = *parts;
    return SNAPMLA_SUCCESS;
  }
  if (validate_only()) return validated(op);
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
  *workspace_bytes =
      static_cast<size_t>(decode::WorkspaceLayout::make(c.batch_size, c.q_len, c.num_heads, parts,
                                                        c.q_precision == SNAPMLA_Q_PRECISION_FP8X2)
                              .total_bytes);
}

// A buffer the caller sized (config.plan_bytes or config.workspace_bytes; 0: not said) holds
// the `need` bytes of this config and part count.
snapmla_status_t check_buffer_size(const char* op, const char* name, size_t given, size_t need) {
  SNAPMLA_REQUIRE(given == 0 || given >= need,
                  "%s: argument '%s': config.%s_bytes is %zu, smaller than the %zu bytes this "
                  "config needs (snapmla_decode_buffer_sizes; sized for another config, or with "
                  "num_sm_parts 0 on a GPU with fewer SMs)",
                  op, name, name, given, need);
  return SNAPMLA_SUCCESS;
}

// The plan (and the workspace, if given) as large as the config needs where it says their sizes,
// and inside the address space; their sizes into sizes_out.
snapmla_status_t check_decode_buffers(const char* op, const snapmla_decode_config_t& c, int parts,
                                      const void* plan, const void* workspace,
                                      size_t* sizes_out = nullptr) {
  size_t plan_bytes = 0, workspace_bytes = 0;
  decode_buffer_bytes(c, parts, &plan_bytes, &workspace_bytes);
  if (sizes_out != nullptr) {
    sizes_out[0] = plan_bytes;
    sizes_out[1] = workspace_bytes;
  }
  SNAPMLA_TRY(check_buffer_size(op, "plan", c.plan_bytes, plan_bytes));
  SNAPMLA_TRY(check_span(op, "plan", plan, 1, static_cast<int64_t>(plan_bytes), {}));
  if (workspace != nullptr) {
    SNAPMLA_TRY(check_buffer_size(op, "workspace", c.workspace_bytes, workspace_bytes));
    SNAPMLA_TRY(
        check_span(op, "workspace", workspace, 1, static_cast<int64_t>(workspace_bytes), {}));
  }
  return SNAPMLA_SUCCESS;
}

// What a plan of this config and part count holds in its header's first words.
decode::PlanShape plan_shape_of(const snapmla_decode_config_t& c, int parts) {
  return decode::PlanShape::make(c.batch_size, parts, c.q_len, c.num_heads, c.max_pages,
                                 c.q_precision == SNAPMLA_Q_PRECISION_FP8X2);
}

// The bytes of a decode call's arguments, for the aliasing checks.
struct DecodeExtents {
  Extent cache, q, q_pe, block_table, seqlens, out, lse;
};

DecodeExtents decode_extents(const snapmla_decode_config_t& c, const snapmla_decode_args_t& a,
                             const snapmla_cache& cache) {
  const int64_t b = c.batch_size, s_q = c.q_len, h = c.num_heads;
  const int64_t out_elem = a.out_dtype == SNAPMLA_OUT_FP32 ? 4 : 2;
  DecodeExtents e;
  e.cache = layer_extent(cache, a.layer);
  e.q =
      extent_of("args.q", a.q, 2, a.q_pe != nullptr ? kContentDim : kHeadDim,
                {{b, a.q_stride_batch, ""}, {s_q, a.q_stride_token, ""}, {h, a.q_stride_head, ""}});
  e.q_pe = extent_of(
      "args.q_pe", a.q_pe, 2, kRopeDim,
      {{b, a.q_pe_stride_batch, ""}, {s_q, a.q_pe_stride_token, ""}, {h, a.q_pe_stride_head, ""}});
  e.block_table =
      extent_of("args.block_table", a.block_table, 4, c.max_pages, {{b, a.block_table_stride, ""}});
  e.seqlens = extent_of("args.cache_seqlens", a.cache_seqlens, 4, b, {});
  e.out = extent_of("args.out", a.out, out_elem, b * s_q * h * kContentDim, {});
  e.lse = extent_of("args.lse", a.lse, 4, b * h * s_q, {});
  return e;
}

// The workspace (written) apart from everything else, the plan (read) from the outputs: the
// attention kernel may read q after another CTA wrote partials (the fused Q), and the combine
// reads the plan while it writes out.
snapmla_status_t check_buffers_apart(const char* op, const snapmla_decode_config_t& c, int parts,
                                     const void* plan, void* workspace, const DecodeExtents& e) {
  size_t sizes[2] = {0, 0};  // plan, workspace
  SNAPMLA_TRY(check_decode_buffers(op, c, parts, plan, workspace, sizes));
  const Extent plan_ext = extent_of("plan", plan, 1, static_cast<int64_t>(sizes[0]), {});
  const Extent ws_ext = extent_of("workspace", workspace, 1, static_cast<int64_t>(sizes[1]), {});
  SNAPMLA_TRY(check_apart(
      op, ws_ext, {e.cache, e.q, e.q_pe, e.block_table, e.seqlens, e.out, e.lse, plan_ext}));
  SNAPMLA_TRY(check_apart(op, e.out, {plan_ext}));
  return check_apart(op, e.lse, {plan_ext});
}

// A decode call's launches.
struct Launches {
  decode::DecodeParams p;
  QuantizeQParams qp;
  decode::Kernel kernel;
};
static_assert(sizeof(decode::PlanShape) == sizeof(QuantizeQParams::plan_shape),
              "the Q-quant kernel compares the plan's shape words");

// The launches of a checked call into *k.
void make_launches(const snapmla_decode_config_t& c, const snapmla_decode_args_t& a,
                   const snapmla_cache& cache, const void* plan, void* workspace, int parts,
                   Launches* k) {
  const bool two_term = c.q_precision == SNAPMLA_Q_PRECISION_FP8X2;
  const decode::WorkspaceLayout w =
      decode::WorkspaceLayout::make(c.batch_size, c.q_len, c.num_heads, parts, two_term);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  k->qp = QuantizeQParams{static_cast<const uint16_t*>(a.q),
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
    k->qp.q_lo = ws + w.q_lo;
    k->qp.q_lo_scale = reinterpret_cast<float*>(ws + w.q_lo_scale);
  }
  // The Q-quant kernel writes the workspace only under a plan built for this layout.
  k->qp.plan = static_cast<const int32_t*>(plan);
  const decode::PlanShape shape = plan_shape_of(c, parts);
  std::memcpy(k->qp.plan_shape, &shape, sizeof(shape));
  decode::DecodeParams& p = k->p;
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
  if (a.out_dtype == SNAPMLA_OUT_FP32) {
    p.out_f32 = static_cast<float*>(a.out);
  } else {
    p.out = static_cast<uint16_t*>(a.out);
  }
  p.lse = a.lse;
  p.partial_o = reinterpret_cast<float*>(ws + w.partial_o);
  p.partial_lse = reinterpret_cast<float*>(ws + w.partial_lse);
  if (two_term) {
    p.q_lo = k->qp.q_lo;
    p.q_lo_scale = k->qp.q_lo_scale;
  }
  k->kernel = select_kernel(c, a.kernel, decode::typical_chain(p.batch, p.max_pages, p.num_parts));
}

// Q-quant, attention, split combine, in stream order; the first error stops the sequence.
cudaError_t launch_decode(const Launches& k, cudaStream_t s) {
  cudaError_t err = launch_quantize_q(k.qp, s);
  if (err == cudaSuccess) {
    err = k.kernel == decode::Kernel::kReference ? decode::launch_reference_decode(k.p, s)
                                                 : decode::launch_sm90_decode(k.kernel, k.p, s);
  }
  return err == cudaSuccess ? decode::launch_combine(k.p, s) : err;
}

}  // namespace
}  // namespace snapmla::api

using namespace snapmla;
using namespace snapmla::api;

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
  SNAPMLA_CUDA(op, decode::launch_plan(cache_seqlens, plan_shape_of(c, parts), free_parts,
                                       c.num_sm_parts > 0 ? 1 : decode::kMinPartCost,
                                       static_cast<int32_t*>(plan),
                                       reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
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
  SNAPMLA_REQUIRE(a.out_dtype == SNAPMLA_OUT_BF16 || a.out_dtype == SNAPMLA_OUT_FP32,
                  "%s: argument 'args.out_dtype': expected 0 (bf16) or 1 (fp32), got %d", op,
                  a.out_dtype);
  const int64_t out_elem = a.out_dtype == SNAPMLA_OUT_FP32 ? 4 : 2;  // bytes an element of out
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
  // The outputs apart from the inputs and each other (as snapmla.decode checks them).
  const DecodeExtents e = decode_extents(c, a, cache);
  SNAPMLA_TRY(check_apart(op, e.out, {e.cache, e.q, e.q_pe, e.block_table, e.seqlens, e.lse}));
  SNAPMLA_TRY(check_apart(op, e.lse, {e.cache, e.q, e.q_pe, e.block_table, e.seqlens}));
  SNAPMLA_TRY(check_pointer(op, "plan", plan, kAlignPlan, "the plan's int32 words"));
  SNAPMLA_TRY(check_pointer(op, "workspace", workspace, kAlignWorkspace,
                            "its parts are 256-byte aligned for TMA and vector loads"));
  // The buffers' sizes need the part count: from the config before the device check, else after.
  if (c.num_sm_parts > 0) {
    SNAPMLA_TRY(check_buffers_apart(op, c, c.num_sm_parts, plan, workspace, e));
  }
  SNAPMLA_TRY(check_device(op, &cache));
  int parts = 0;
  SNAPMLA_TRY(num_parts_of(op, c, &parts));
  if (c.num_sm_parts == 0) SNAPMLA_TRY(check_buffers_apart(op, c, parts, plan, workspace, e));
  Launches launches{};
  make_launches(c, a, cache, plan, workspace, parts, &launches);
  SNAPMLA_CUDA(op, launch_decode(launches, reinterpret_cast<cudaStream_t>(stream)));
  return SNAPMLA_SUCCESS;
}
