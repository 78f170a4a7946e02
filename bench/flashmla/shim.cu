// C entry points over FlashMLA's sm90 decode kernels, for bench_decode.py (through ctypes): the
// BF16 dense decode and the FP8 sparse decode, each split-KV kernel then FlashMLA's
// combine. Built with FlashMLA's sources by build.sh into libflashmla_shim.so; measurement only.
//
// Every call takes raw device pointers and a stream. The caller owns all memory: out, lse and
// one workspace of fm_workspace_bytes() bytes holding the schedule (written by the *_metadata
// call, read by every decode after it) and the split-KV partials; the metadata and decode calls
// of one case take the num_sm_parts fm_num_sm_parts() gave. The decode calls allocate nothing
// and never synchronize the host, so they can be captured in a CUDA graph.
// Returns 0, or 1 (a bad argument), 2 (not an sm_90 device), 3 (a CUDA error) or 4 (FlashMLA's
// host code refused), with a message from fm_last_error() (per thread). Arguments are checked
// before anything is launched; the contents of device buffers (block tables, lengths, indices)
// are the caller's to get right.
//
// Layouts (contiguous, h_kv = 1):
//   q        [b, s_q, h_q, 576] BF16       out [b, s_q, h_q, 512] BF16   lse [b, s_q, h_q] fp32
//   dense:   kcache [num_pages, 64, 576] BF16 (512 content then 64 RoPE values a token),
//            block_table [b, >= ceil(seqlen / 64)] int32 (row stride given), seqlens [b] int32
//   sparse:  kv [num_pages, 64, 656] bytes: per token 512 E4M3 content, 4 fp32 scales (one per
//            128 content values), 64 BF16 RoPE values; indices [b, s_q, topk] int32 holding
//            page * 64 + row, -1 for none; topk a multiple of 64; h_q 64 or 128.

#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

#ifndef FM_FLASHMLA_COMMIT
#define FM_FLASHMLA_COMMIT "unknown"
#endif

#define FM_API extern "C" __attribute__((visibility("default")))

namespace {

enum : int {
  FM_OK = 0,
  FM_ERR_ARGUMENT = 1,  // a bad argument; nothing launched
  FM_ERR_DEVICE = 2,    // the current device is not sm_90
  FM_ERR_CUDA = 3,      // a CUDA runtime call failed
  FM_ERR_INTERNAL = 4,  // FlashMLA's host code refused (an exception)
};

constexpr int kAbiVersion = 1;
constexpr int kPage = 64;    // tokens a page (the only page size the kernels take)
constexpr int kDimQK = 576;  // 512 content + 64 RoPE
constexpr int kDimV = 512;
constexpr int kFp8TokenBytes = 656;  // 512 E4M3 + 4 fp32 scales + 64 BF16
constexpr int kTopkBlock = 64;       // the sparse kernel's tokens a step
constexpr int kMaxSmParts = 160;     // the combine kernel's largest split count
constexpr int kMaxBatch = 4096;      // keeps the schedule kernel's shared memory small
constexpr int kAlign = 256;          // workspace sub-buffer alignment

thread_local std::string g_error;

int fail(int code, const std::string& message) {
  g_error = message;
  return code;
}

#define FM_REQUIRE(cond, message)                       \
  do {                                                  \
    if (!(cond)) return fail(FM_ERR_ARGUMENT, message); \
  } while (0)

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// SM count of the current device, cached per device; FM_ERR_DEVICE unless it is sm_90.
std::atomic<int> g_sms[64];

int device_sms(int* sms) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess)
    return fail(FM_ERR_CUDA, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
  if (dev >= 0 && dev < 64) {
    int cached = g_sms[dev].load(std::memory_order_relaxed);
    if (cached > 0) {
      *sms = cached;
      return FM_OK;
    }
  }
  int major = 0, minor = 0, count = 0;
  if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
    return fail(FM_ERR_CUDA, std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(e));
  if (major != 9 || minor != 0)
    return fail(FM_ERR_DEVICE, "FlashMLA's sm90 kernels need an sm_90 GPU; device " +
                                   std::to_string(dev) + " is sm_" + std::to_string(major) +
                                   std::to_string(minor));
  if (dev >= 0 && dev < 64) g_sms[dev].store(count, std::memory_order_relaxed);
  *sms = count;
  return FM_OK;
}

int64_t round_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// The workspace: schedule (num_sm_parts entries), split offsets (b + 1), then the partial
// lse [b + parts, s_q, h_q] and output [b + parts, s_q, h_q, 512], both fp32.
struct Workspace {
  int64_t meta, splits, lse_accum, o_accum, total;
};

Workspace workspace_layout(int b, int s_q, int h_q, int parts) {
  Workspace w{};
  const int64_t rows = int64_t(b + parts) * s_q * h_q;
  w.meta = 0;
  w.splits = round_up(int64_t(parts) * sizeof(DecodingSchedMeta));
  w.lse_accum = w.splits + round_up(int64_t(b + 1) * sizeof(int));
  w.o_accum = w.lse_accum + round_up(rows * sizeof(float));
  w.total = w.o_accum + round_up(rows * kDimV * sizeof(float));
  return w;
}

template <typename T>
T* at(void* base, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

int check_shape(int b, int s_q, int h_q, int parts) {
  FM_REQUIRE(b >= 1 && b <= kMaxBatch, "b must be in 1.." + std::to_string(kMaxBatch));
  FM_REQUIRE(s_q >= 1 && s_q <= 1024, "s_q must be in 1..1024");
  FM_REQUIRE(h_q >= 1 && h_q <= 128, "h_q must be in 1..128");
  FM_REQUIRE(parts >= 1 && parts <= kMaxSmParts,
             "num_sm_parts must be in 1.." + std::to_string(kMaxSmParts));
  // the kernels index the partials [b + parts, s_q, h_q, 512] with int
  FM_REQUIRE(int64_t(b + parts) * s_q * h_q * kDimV <= INT32_MAX,
             "(b + num_sm_parts) * s_q * h_q * 512 must fit int32");
  return FM_OK;
}

int check_common(const void* q, const void* out, const float* lse, void* workspace,
                 float softmax_scale) {
  FM_REQUIRE(q && aligned(q, 16), "q must be a non-null, 16-byte aligned device pointer");
  FM_REQUIRE(out && aligned(out, 16), "out must be a non-null, 16-byte aligned device pointer");
  FM_REQUIRE(lse && aligned(lse, 4), "lse must be a non-null, 4-byte aligned device pointer");
  FM_REQUIRE(workspace && aligned(workspace, kAlign),
             "workspace must be a non-null, " + std::to_string(kAlign) + "-byte aligned pointer");
  FM_REQUIRE(std::isfinite(softmax_scale) && softmax_scale > 0.f,
             "softmax_scale must be finite and positive");
  return FM_OK;
}

// Runs fn (FlashMLA's host code, which throws on refusal) and turns failures into codes.
template <typename Fn>
int guarded(Fn&& fn) {
  cudaGetLastError();  // a stale error of an earlier call must not be blamed on this launch
  try {
    fn();
  } catch (const std::exception& e) {
    return fail(FM_ERR_INTERNAL, std::string("FlashMLA: ") + e.what());
  } catch (...) {
    return fail(FM_ERR_INTERNAL, "FlashMLA: unknown exception");
  }
  cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess) return fail(FM_ERR_CUDA, std::string("launch: ") + cudaGetErrorString(e));
  return FM_OK;
}

void launch_schedule(int b, int s_q, int topk, const int* seqlens, int parts, void* workspace,
                     cudaStream_t stream) {
  const Workspace w = workspace_layout(b, s_q, 1, parts);
  GetDecodeSchedMetaParams p{};
  p.b = b;
  p.s_q = s_q;
  p.block_size_n = kPage;           // dense: a page; sparse: the kernel's 64-index step
  p.fixed_overhead_num_blocks = 5;  // FlashMLA's per-split cost, in blocks, for both paths
  p.topk = topk;                    // -1: dense, lengths from seqlens
  p.extra_topk = topk < 0 ? -1 : 0;
  p.topk_length = nullptr;
  p.extra_topk_length = nullptr;
  p.seqlens_k_ptr = const_cast<int*>(seqlens);
  p.tile_scheduler_metadata_ptr = at<DecodingSchedMeta>(workspace, w.meta);
  p.num_splits_ptr = at<int>(workspace, w.splits);
  p.num_sm_parts = parts;
  p.stream = stream;
  smxx::decode::run_get_decoding_sched_meta_kernel(p);
}

// The fields FlashMLA's sparse decode params and combine params share, by the same names:
// strides of the contiguous out [b, s_q, h_q, 512], lse [b, s_q, h_q] and partials
// [b + parts, s_q, h_q, (512)], and the workspace's schedule and partials.
template <typename Params>
void set_split_kv(Params& p, int b, int s_q, int h_q, int parts, void* workspace) {
  const Workspace w = workspace_layout(b, s_q, h_q, parts);
  p.stride_lse_b = p.stride_lse_accum_split = s_q * h_q;
  p.stride_lse_s_q = p.stride_lse_accum_s_q = h_q;
  p.stride_o_b = p.stride_o_accum_split = s_q * h_q * kDimV;
  p.stride_o_s_q = p.stride_o_accum_s_q = h_q * kDimV;
  p.stride_o_h_q = p.stride_o_accum_h_q = kDimV;
  p.lse_accum = at<float>(workspace, w.lse_accum);
  p.o_accum = at<float>(workspace, w.o_accum);
  p.tile_scheduler_metadata_ptr = at<DecodingSchedMeta>(workspace, w.meta);
  p.num_splits_ptr = at<int>(workspace, w.splits);
  p.num_sm_parts = parts;
}

// The combine over [b, s_q, h_q] rows (dense rows s_q * h_q of one KV head are the same rows).
void launch_combine(int b, int s_q, int h_q, void* out, float* lse, int parts, void* workspace,
                    cudaStream_t stream) {
  CombineParams c{};
  c.b = b;
  c.s_q = s_q;
  c.h_q = h_q;
  c.d_v = kDimV;
  c.lse = lse;
  c.out = out;
  set_split_kv(c, b, s_q, h_q, parts, workspace);
  c.attn_sink = nullptr;
  c.stream = stream;
  smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
}

}  // namespace

FM_API int fm_abi_version(void) { return kAbiVersion; }

FM_API const char* fm_flashmla_commit(void) { return FM_FLASHMLA_COMMIT; }

FM_API const char* fm_last_error(void) { return g_error.c_str(); }

// FlashMLA's split count for a shape on the current device: sparse = 0 for the dense decode,
// 1 for the FP8 sparse decode. The *_metadata and decode calls of one case take this value.
FM_API int fm_num_sm_parts(int sparse, int s_q, int h_q, int* num_sm_parts) {
  FM_REQUIRE(num_sm_parts, "num_sm_parts must not be null");
  FM_REQUIRE(s_q >= 1 && h_q >= 1, "s_q and h_q must be positive");
  FM_REQUIRE(!sparse || h_q == 64 || h_q == 128, "the FP8 sparse decode takes h_q 64 or 128");
  int sms = 0;
  if (int rc = device_sms(&sms)) return rc;
  // Dense: one CTA a 64-row tile of s_q * h_q rows; sparse: one a (64 heads, query token).
  const int per_part = sparse ? s_q * (h_q / 64) : (s_q * h_q + 63) / 64;
  int parts = sms / per_part;
  parts = parts < 1 ? 1 : (parts > kMaxSmParts ? kMaxSmParts : parts);
  *num_sm_parts = parts;
  return FM_OK;
}

FM_API int fm_workspace_bytes(int b, int s_q, int h_q, int num_sm_parts, int64_t* bytes) {
  FM_REQUIRE(bytes, "bytes must not be null");
  if (int rc = check_shape(b, s_q, h_q, num_sm_parts)) return rc;
  *bytes = workspace_layout(b, s_q, h_q, num_sm_parts).total;
  return FM_OK;
}

// The dense decode's schedule from the lengths, into the workspace (one small kernel).
FM_API int fm_dense_metadata(const int* seqlens, int b, int s_q, int h_q, int num_sm_parts,
                             void* workspace, cudaStream_t stream) {
  if (int rc = check_shape(b, s_q, h_q, num_sm_parts)) return rc;
  FM_REQUIRE(seqlens, "seqlens must not be null");
  FM_REQUIRE(workspace && aligned(workspace, kAlign), "workspace must be 256-byte aligned");
  int sms = 0;
  if (int rc = device_sms(&sms)) return rc;
  return guarded([&] { launch_schedule(b, s_q, -1, seqlens, num_sm_parts, workspace, stream); });
}

// BF16 dense decode (FlashMLA's flash_mla_with_kvcache on a [pages, 64, 1, 576] cache), causal
// over the s_q query tokens when causal != 0 and s_q > 1; after fm_dense_metadata on the same
// lengths, shape and workspace.
FM_API int fm_dense_decode(const void* q, const void* kcache, int num_pages, const int* block_table,
                           int64_t block_table_stride, const int* seqlens, void* out, float* lse,
                           int b, int s_q, int h_q, float softmax_scale, int causal,
                           int num_sm_parts, void* workspace, cudaStream_t stream) {
  if (int rc = check_shape(b, s_q, h_q, num_sm_parts)) return rc;
  if (int rc = check_common(q, out, lse, workspace, softmax_scale)) return rc;
  FM_REQUIRE(kcache && aligned(kcache, 16), "kcache must be a non-null, 16-byte aligned pointer");
  FM_REQUIRE(num_pages >= 1, "num_pages must be positive");
  FM_REQUIRE(block_table && seqlens, "block_table and seqlens must not be null");
  FM_REQUIRE(block_table_stride >= 1 && block_table_stride <= INT32_MAX,
             "block_table_stride must be in 1..2^31-1");
  int sms = 0;
  if (int rc = device_sms(&sms)) return rc;

  const Workspace w = workspace_layout(b, s_q, h_q, num_sm_parts);
  const int rows = s_q * h_q;  // one KV head: the query tokens' heads are the rows
  DenseAttnDecodeParams p{};
  p.b = b;
  p.s_q = s_q;
  p.q_seq_per_hk = rows;
  p.d = kDimQK;
  p.d_v = kDimV;
  p.h_q = h_q;
  p.h_k = 1;
  p.num_blocks = num_pages;
  p.q_head_per_hk = h_q;
  p.is_causal = causal != 0 && s_q > 1;
  p.scale_softmax = softmax_scale;
  p.scale_softmax_log2 = float(softmax_scale * M_LOG2E);
  p.q_ptr = const_cast<void*>(q);
  p.k_ptr = const_cast<void*>(kcache);
  p.o_ptr = out;
  p.softmax_lse_ptr = lse;
  // Strides in elements; the KV-head strides span a dimension of one.
  p.q_batch_stride = int64_t(rows) * kDimQK;
  p.q_row_stride = kDimQK;
  p.q_head_stride = kDimQK;
  p.k_batch_stride = int64_t(kPage) * kDimQK;
  p.k_row_stride = kDimQK;
  p.k_head_stride = kDimQK;
  p.o_batch_stride = int64_t(rows) * kDimV;
  p.o_row_stride = kDimV;
  p.o_head_stride = int64_t(rows) * kDimV;
  p.block_table = const_cast<int*>(block_table);
  p.block_table_batch_stride = block_table_stride;
  p.page_block_size = kPage;
  p.seqlens_k_ptr = const_cast<int*>(seqlens);
  p.tile_scheduler_metadata_ptr = at<DecodingSchedMeta>(workspace, w.meta);
  p.num_sm_parts = num_sm_parts;
  p.num_splits_ptr = at<int>(workspace, w.splits);
  p.total_num_splits = b + num_sm_parts;
  p.softmax_lseaccum_ptr = at<float>(workspace, w.lse_accum);
  p.oaccum_ptr = at<float>(workspace, w.o_accum);
  p.stream = stream;
  return guarded([&] {
    sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);
    launch_combine(b, s_q, h_q, out, lse, num_sm_parts, workspace, stream);
  });
}

// The FP8 sparse decode's schedule: every request walks topk indices, so only b and topk count.
FM_API int fm_sparse_fp8_metadata(int b, int s_q, int h_q, int topk, int num_sm_parts,
                                  void* workspace, cudaStream_t stream) {
  if (int rc = check_shape(b, s_q, h_q, num_sm_parts)) return rc;
  FM_REQUIRE(topk >= kTopkBlock && topk % kTopkBlock == 0,
             "topk must be a positive multiple of 64");
  FM_REQUIRE(workspace && aligned(workspace, kAlign), "workspace must be 256-byte aligned");
  int sms = 0;
  if (int rc = device_sms(&sms)) return rc;
  return guarded([&] { launch_schedule(b, s_q, topk, nullptr, num_sm_parts, workspace, stream); });
}

// FP8 sparse decode (FlashMLA's V3.2 layout), not causal: each query token attends to the
// tokens its row of indices names; after fm_sparse_fp8_metadata on the same shape and topk.
FM_API int fm_sparse_fp8_decode(const void* q, const void* kv, int num_pages, const int* indices,
                                int topk, void* out, float* lse, int b, int s_q, int h_q,
                                float softmax_scale, int num_sm_parts, void* workspace,
                                cudaStream_t stream) {
  if (int rc = check_shape(b, s_q, h_q, num_sm_parts)) return rc;
  if (int rc = check_common(q, out, lse, workspace, softmax_scale)) return rc;
  FM_REQUIRE(h_q == 64 || h_q == 128, "h_q must be 64 or 128 for the FP8 sparse decode");
  FM_REQUIRE(kv && aligned(kv, 16), "kv must be a non-null, 16-byte aligned device pointer");
  FM_REQUIRE(num_pages >= 1 && int64_t(num_pages) * kPage <= INT32_MAX,
             "num_pages must be in 1..2^25-1 (token indices are int32)");
  FM_REQUIRE(indices && aligned(indices, 8), "indices must be a non-null, 8-byte aligned pointer");
  FM_REQUIRE(topk >= kTopkBlock && topk % kTopkBlock == 0,
             "topk must be a positive multiple of 64");
  FM_REQUIRE(int64_t(b) * s_q * topk <= INT32_MAX, "b * s_q * topk must fit int32");
  int sms = 0;
  if (int rc = device_sms(&sms)) return rc;

  SparseAttnDecodeParams p{};
  p.b = b;
  p.s_q = s_q;
  p.h_q = h_q;
  p.h_kv = 1;
  p.d_qk = kDimQK;
  p.d_v = kDimV;
  p.sm_scale = softmax_scale;
  p.sm_scale_div_log2 = softmax_scale * 1.44269504f;  // log2(e), as FlashMLA's sparse path
  p.num_blocks = num_pages;
  p.page_block_size = kPage;
  p.topk = topk;
  p.model_type = ModelType::V32;
  p.q = static_cast<cutlass::bfloat16_t*>(const_cast<void*>(q));
  p.kv = static_cast<cutlass::bfloat16_t*>(const_cast<void*>(kv));  // bytes; the kernel casts
  p.indices = const_cast<int*>(indices);
  p.lse = lse;
  p.out = static_cast<cutlass::bfloat16_t*>(out);
  // Strides in elements (kv: bytes).
  p.stride_q_b = s_q * h_q * kDimQK;
  p.stride_q_s_q = h_q * kDimQK;
  p.stride_q_h_q = kDimQK;
  p.stride_kv_block = kPage * kFp8TokenBytes;
  p.stride_kv_row = kFp8TokenBytes;
  p.stride_indices_b = s_q * topk;
  p.stride_indices_s_q = topk;
  p.stream = stream;
  set_split_kv(p, b, s_q, h_q, num_sm_parts, workspace);
  return guarded([&] {
    if (h_q == 64)
      sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 64>(p);
    else
      sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 128>(p);
    launch_combine(b, s_q, h_q, out, lse, num_sm_parts, workspace, stream);
  });
}
