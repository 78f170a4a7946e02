// The sm90 decode kernel's host side: tensor maps and the launch of the chosen variant.
#include <cudaTypedefs.h>

#include <cstring>

#include "common/driver.h"
#include "decode/decode.h"
#include "decode/dispatch.h"
#include "decode/sm90/traits.h"

namespace snapmla {
namespace decode {
namespace seesaw {
// instantiations/: one translation unit a variant.
template <class T>
cudaError_t run(const DecodeParams& p, const TensorMaps& maps, cudaStream_t stream);
}  // namespace seesaw

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const auto fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(
      driver_function("cuTensorMapEncodeTiled"));
  return fn;
}

template <int kRank>
cudaError_t encode(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                   const uint64_t (&dims)[kRank], const uint64_t (&strides_bytes)[kRank - 1],
                   const uint32_t (&box)[kRank], CUtensorMapSwizzle swizzle) {
  auto fn = encode_fn();
  if (fn == nullptr) return cudaErrorNotSupported;
  uint32_t ones[kRank];  // element strides: dense
  for (int i = 0; i < kRank; ++i) ones[i] = 1;
  const CUresult r = fn(map, type, kRank, const_cast<void*>(base), dims, strides_bytes, box, ones,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t make_maps(const DecodeParams& p, seesaw::TensorMaps* maps) {
  const uint64_t pages = static_cast<uint64_t>(p.num_pages);
  const uint64_t page_stride = static_cast<uint64_t>(p.page_stride);  // TMA: a multiple of 16
  const uint64_t rows = static_cast<uint64_t>(p.batch) * p.q_len * p.num_heads;
  cudaError_t err =
      encode<3>(&maps->k_content, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.layer_base + kPageContentOffset,
                {kContentDim, kBlockN, pages}, {kContentDim, page_stride},
                {seesaw::kChunkBytes, kBlockN, 1}, CU_TENSOR_MAP_SWIZZLE_128B);
  if (err != cudaSuccess) return err;
  err = encode<3>(&maps->k_rope, CU_TENSOR_MAP_DATA_TYPE_UINT16, p.layer_base + kPageRopeOffset,
                  {kRopeDim, kBlockN, pages}, {kRopeDim * 2, page_stride}, {kRopeDim, kBlockN, 1},
                  CU_TENSOR_MAP_SWIZZLE_128B);
  if (err != cudaSuccess) return err;
  err = encode<2>(&maps->k_scale, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.layer_base + kPageScaleOffset,
                  {kBlockN, pages}, {page_stride}, {kBlockN, 1}, CU_TENSOR_MAP_SWIZZLE_NONE);
  if (err != cudaSuccess) return err;
  err = encode<2>(&maps->q_content, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.q_content, {kContentDim, rows},
                  {kContentDim}, {seesaw::kChunkBytes, seesaw::kRowsM}, CU_TENSOR_MAP_SWIZZLE_128B);
  if (err != cudaSuccess) return err;
  err = encode<2>(&maps->q_rope, CU_TENSOR_MAP_DATA_TYPE_UINT16, p.q_rope, {kRopeDim, rows},
                  {kRopeDim * 2}, {kRopeDim, seesaw::kRowsM}, CU_TENSOR_MAP_SWIZZLE_128B);
  return err;
}

// Recent calls' maps, per thread: five encodings are a measurable part of a call's host time. A
// map depends on the key alone, so a hit is exact; 64 entries hold a step's maps for 64 layers.
struct MapKey {
  const uint8_t* layer_base;
  int64_t page_stride;
  const uint8_t* q_content;
  const uint16_t* q_rope;
  int64_t rows;
  int32_t num_pages;
  int32_t pad;
};
struct MapCache {
  static constexpr int kEntries = 64;
  MapKey keys[kEntries];
  seesaw::TensorMaps maps[kEntries];
  bool used[kEntries] = {};
  int next = 0;
};

cudaError_t cached_maps(const DecodeParams& p, seesaw::TensorMaps* maps) {
  thread_local MapCache cache;
  MapKey key;
  std::memset(&key, 0, sizeof(key));
  key.layer_base = p.layer_base;
  key.page_stride = p.page_stride;
  key.q_content = p.q_content;
  key.q_rope = p.q_rope;
  key.rows = int64_t{p.batch} * p.q_len * p.num_heads;
  key.num_pages = p.num_pages;
  for (int i = 0; i < MapCache::kEntries; ++i) {
    if (cache.used[i] && std::memcmp(&cache.keys[i], &key, sizeof(key)) == 0) {
      *maps = cache.maps[i];
      return cudaSuccess;
    }
  }
  const cudaError_t err = make_maps(p, maps);
  if (err != cudaSuccess) return err;
  const int slot = cache.next;
  cache.next = (slot + 1) % MapCache::kEntries;
  cache.keys[slot] = key;
  cache.maps[slot] = *maps;
  cache.used[slot] = true;
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_sm90_decode(Kernel kernel, const DecodeParams& p, cudaStream_t stream) {
  // The N = 16 and 32 kernels load their one query tile themselves: the Q maps go unused there.
  if (int64_t{p.q_len} * p.num_heads > max_rows(kernel)) return cudaErrorInvalidValue;
  seesaw::TensorMaps maps;
  const cudaError_t err = cached_maps(p, &maps);
  if (err != cudaSuccess) return err;
  switch (kernel) {
    case Kernel::kSm90N16:
      return seesaw::run<seesaw::KernelTraits<16>>(p, maps, stream);
    case Kernel::kSm90N32:
      return seesaw::run<seesaw::KernelTraits<32>>(p, maps, stream);
    case Kernel::kSm90N64:
      return seesaw::run<seesaw::KernelTraits<64>>(p, maps, stream);
    case Kernel::kSm90N64Scaled:
      return seesaw::run<seesaw::KernelTraits<64, true>>(p, maps, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace decode
}  // namespace snapmla
