// The seesaw kernel's host side: tensor maps over the layer and the quantized queries, and the
// choice of PV width from the query rows per request.
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "decode/decode.h"
#include "decode/seesaw/config.h"

namespace snapmla {
namespace decode {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
  });
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
  cudaError_t err = encode<3>(&maps->k_content, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                              p.layer_base + kPageContentOffset, {kContentDim, kBlockN, pages},
                              {kContentDim, page_stride}, {seesaw::kChunkBytes, kBlockN, 1},
                              CU_TENSOR_MAP_SWIZZLE_128B);
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

// The tensor maps of recent calls, per thread (issue 10: five encodings were a measurable part
// of a decode call's host time). A map is a function of the addresses, sizes and strides in the
// key alone (its data type, box and swizzle are constants), so a hit is the map the encoding
// would give: reused memory at the same address is covered. A model step decodes every layer
// with one workspace, so 64 entries hold a step's maps for up to 64 layers.
// SNAPMLA_TENSOR_MAP_CACHE (on; 0 encodes every call): the C decode call's host time on the
// H200 (bench/host_overhead_c.cu, batch 1, 2026-12-01) 10.6 us with the cache.
#ifndef SNAPMLA_TENSOR_MAP_CACHE
#define SNAPMLA_TENSOR_MAP_CACHE 1
#endif
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

#if SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN >= 0 || SNAPMLA_SEESAW_PV_DIRECT
// The balanced part cost T = max(ceil(total / num_parts), min part cost) of plan.cu from the
// launch's shape alone (no host synchronization), with total = batch x (max_pages + kFixedCost),
// its bound (every request max_pages blocks long).
int64_t part_cost_bound(const DecodeParams& p) {
  const int64_t total = int64_t{p.batch} * (int64_t{p.max_pages} + kFixedCost);
  const int64_t per_part = (total + p.num_parts - 1) / p.num_parts;
  return std::max<int64_t>(per_part, kMinPartCost);
}
#endif

#if SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN >= 0
// About how many blocks a part of the plan runs: T, as if every request had max_pages blocks
// (lengths shorter than the block table's width make the real chains shorter).
int64_t typical_chain(const DecodeParams& p) {
  return std::min<int64_t>(part_cost_bound(p), p.max_pages);
}

// The scaled PV (config.h): chains of SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN blocks or more.
bool use_scaled_pv(const DecodeParams& p) {
  return typical_chain(p) >= SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN;
}
#endif

#if SNAPMLA_SEESAW_PV_DIRECT
// The longest chain of blocks a CTA's O^T takes under kPvDirect at SNAPMLA_SEESAW_PV_DIRECT=1
// (config.h). On randn data the decode's error against exact attention rose over the
// per-block kernel's by 1.007x at chains of about 125 blocks, 1.015-1.018x at about 250 and
// 1.053-1.056x at about 500; on the workload layers (snapmla.accuracy --heads 128
// --num-sm-parts 1) it is 8.6x at chains of 64-256 blocks: the bound is for experiments, it does
// not make the direct PV safe (bench/NOTES.md, session 13).
constexpr int64_t kPvDirectMaxBlocks = 256;

// The longest run of one request's blocks that one part of the plan can hold: a part covers at
// most T of cost (part_cost_bound), or at most 9/8 of that on an aligned line
// (SNAPMLA_PLAN_ALIGN), and a request has at most max_pages blocks. A plan that does not match
// the launch gives NaN rows, not a longer chain (plan_matches).
int64_t longest_chain(const DecodeParams& p) {
  return std::min<int64_t>(part_cost_bound(p) * 9 / 8 + 1, p.max_pages);
}

bool use_pv_direct(const DecodeParams& p) {
  return SNAPMLA_SEESAW_PV_DIRECT >= 2 || longest_chain(p) <= kPvDirectMaxBlocks;
}
#endif

}  // namespace

cudaError_t launch_seesaw_decode(const DecodeParams& p, cudaStream_t stream) {
  const int rows = p.q_len * p.num_heads;
  // The two-term query: s_q x heads <= 32, one tile a request (the API refuses the rest); the
  // kernel loads its query tile itself (the Q maps go unused).
  const bool two_term = p.q_lo != nullptr;
  if (two_term && (rows > 32 || p.row_tiles != 1)) return cudaErrorInvalidValue;
  seesaw::TensorMaps maps;
  const cudaError_t err = SNAPMLA_TENSOR_MAP_CACHE ? cached_maps(p, &maps) : make_maps(p, &maps);
  if (err != cudaSuccess) return err;
  if (two_term) {
    return rows <= 16 ? seesaw::run<16, true>(p, maps, stream)
                      : seesaw::run<32, true>(p, maps, stream);
  }
  // PV computes only the rows a tile holds: N = 16 or 32 for s_q x heads <= 16 or 32.
#if SNAPMLA_SEESAW_SPREAD16
  // (decode.h) as SPREAD32 below, at N = 16
  if (rows <= 16) return seesaw::run<16, true>(p, maps, stream);
#else
  if (rows <= 16) return seesaw::run<16>(p, maps, stream);
#endif
#if SNAPMLA_SEESAW_SPREAD32
  // (decode.h) the two-term kernel, whose q_lo == nullptr zeroes its low rows (one tile a
  // request: rows <= 32)
  if (rows <= 32) return seesaw::run<32, true>(p, maps, stream);
#else
  if (rows <= 32) return seesaw::run<32>(p, maps, stream);
#endif
#if SNAPMLA_SEESAW_PV_DIRECT
  if (use_pv_direct(p)) return seesaw::run<64, false, true>(p, maps, stream);
#endif
#if SNAPMLA_SEESAW_ROLES
  return seesaw::roles::run(p, maps, stream);
#else
#if SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN >= 0
  if (use_scaled_pv(p)) return seesaw::run<64, false, false, true>(p, maps, stream);
#endif
  return seesaw::run<64>(p, maps, stream);
#endif
}

}  // namespace decode
}  // namespace snapmla
