/* snapmla from C: version and error handling, a cache on caller memory, and (with a CUDA
 * toolkit and a Hopper GPU, run with --gpu) append -> fetch-dequant -> decode; with --devices,
 * the same small decode on every visible device from one thread, the outputs compared byte for
 * byte, and (with two or more devices) a cache of device 0 refused for calls on device 1.
 * Prints "N passed, M failed" and exits non-zero on any failure. */
#include <math.h>
#include <snapmla/snapmla.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SNAPMLA_EXAMPLE_WITH_CUDA
#include <cuda_runtime.h>
#endif

static int g_passed = 0, g_failed = 0;

#define CHECK(cond, ...)                                            \
  do {                                                              \
    if (cond) {                                                     \
      ++g_passed;                                                   \
    } else {                                                        \
      ++g_failed;                                                   \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);          \
      fprintf(stderr, __VA_ARGS__);                                 \
      fprintf(stderr, " (last error: %s)\n", snapmla_last_error()); \
    }                                                               \
  } while (0)

static void host_checks(void) {
  size_t bytes = 0;
  snapmla_cache_config_t cfg = SNAPMLA_CACHE_CONFIG_INIT;
  snapmla_cache_t cache = NULL;
  snapmla_cache_info_t info = SNAPMLA_CACHE_INFO_INIT;
  snapmla_decode_config_t dc = SNAPMLA_DECODE_CONFIG_INIT;
  snapmla_decode_args_t args = SNAPMLA_DECODE_ARGS_INIT;
  size_t plan_bytes = 0, ws_bytes = 0;

  CHECK(snapmla_version() / 10000 == SNAPMLA_VERSION_MAJOR, "major version %d", snapmla_version());
  CHECK(strcmp(snapmla_status_string(SNAPMLA_ERROR_INVALID_ARGUMENT),
               "SNAPMLA_ERROR_INVALID_ARGUMENT") == 0,
        "status string");

  CHECK(snapmla_cache_bytes(2, 3, &bytes) == SNAPMLA_SUCCESS && bytes == 6u * SNAPMLA_PAGE_BYTES,
        "cache_bytes = %zu", bytes);
  CHECK(snapmla_cache_bytes(0, 3, &bytes) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
            strstr(snapmla_last_error(), "num_layers") != NULL,
        "num_layers = 0 is refused by name");

  CHECK(cfg.struct_size == sizeof(cfg) && cfg.device == -1 && cfg.memory == NULL &&
            info.struct_size == sizeof(info) && dc.struct_size == sizeof(dc) && dc.q_len == 1 &&
            args.struct_size == sizeof(args) && args.kernel == SNAPMLA_DECODE_KERNEL_AUTO &&
            args.lse == NULL,
        "the SNAPMLA_*_INIT macros set struct_size and the defaults");

  /* Caches over made-up addresses: in validation-only mode nothing asks the driver about them
   * (on a GPU machine it would refuse memory it never allocated). */
  snapmla_set_validate_only(1);
  cfg.num_layers = 2;
  cfg.num_pages = 3;
  cfg.device = 0;
  cfg.memory = (void*)(uintptr_t)0x7f0000000000ull;
  cfg.memory_bytes = 6u * SNAPMLA_PAGE_BYTES;
  CHECK(snapmla_cache_create(&cfg, &cache) == SNAPMLA_SUCCESS, "create on caller memory");
  CHECK(snapmla_cache_info(cache, &info) == SNAPMLA_SUCCESS && info.num_pages == 3 &&
            info.layer_bytes == 3u * SNAPMLA_PAGE_BYTES && info.rope_offset == 32768 &&
            info.scale_offset == 40960 && info.owns_memory == 0,
        "cache info");
  CHECK(snapmla_append(cache, 2, NULL, 512, NULL, 64, NULL, 1, NULL) ==
                SNAPMLA_ERROR_INVALID_ARGUMENT &&
            strstr(snapmla_last_error(), "layer") != NULL,
        "layer out of range is refused by name");
  CHECK(snapmla_cache_destroy(cache) == SNAPMLA_SUCCESS, "destroy");
  CHECK(snapmla_cache_info(cache, &info) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
            snapmla_cache_destroy(cache) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
            strstr(snapmla_last_error(), "'cache'") != NULL,
        "a destroyed handle is refused by name");
  CHECK(snapmla_cache_bytes(2133428917, 14684993, &bytes) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
            strstr(snapmla_last_error(), "num_layers") != NULL,
        "a cache size over 2^63 - 1 bytes is refused by name");

  cfg.memory_bytes = 10;
  CHECK(snapmla_cache_create(&cfg, &cache) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
            strstr(snapmla_last_error(), "memory_bytes") != NULL,
        "too small caller memory is refused by name");

  /* An engine's layout: each layer in its own allocation. */
  {
    void* layers[2] = {(void*)(uintptr_t)0x7f0000400000ull, (void*)(uintptr_t)0x7f0000000000ull};
    void* data = NULL;
    snapmla_cache_config_t lc = SNAPMLA_CACHE_CONFIG_INIT;
    snapmla_cache_info_t li = SNAPMLA_CACHE_INFO_INIT;
    lc.num_layers = 2;
    lc.num_pages = 3;
    lc.device = 0;
    lc.layer_memory = layers;
    CHECK(snapmla_cache_create(&lc, &cache) == SNAPMLA_SUCCESS, "create on per-layer memory");
    CHECK(snapmla_cache_layer_data(cache, 1, &data) == SNAPMLA_SUCCESS && data == layers[1] &&
              snapmla_cache_info(cache, &li) == SNAPMLA_SUCCESS && li.per_layer_memory == 1,
          "each layer at its own pointer");
    CHECK(snapmla_cache_destroy(cache) == SNAPMLA_SUCCESS, "destroy the per-layer cache");
    layers[0] = (void*)((uintptr_t)layers[1] + SNAPMLA_PAGE_BYTES); /* inside layer 1 */
    CHECK(snapmla_cache_create(&lc, &cache) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
              strstr(snapmla_last_error(), "overlaps") != NULL,
          "overlapping layers are refused");
  }

  /* Pages inside larger slots: 64 tokens x 656 bytes a page. */
  {
    snapmla_cache_config_t sc = SNAPMLA_CACHE_CONFIG_INIT;
    snapmla_cache_info_t si = SNAPMLA_CACHE_INFO_INIT;
    sc.num_layers = 2;
    sc.num_pages = 3;
    sc.device = 0;
    sc.page_stride = 64 * 656;
    sc.memory = (void*)(uintptr_t)0x7f0000000000ull;
    sc.memory_bytes = 2u * 3u * 64u * 656u;
    CHECK(snapmla_cache_create(&sc, &cache) == SNAPMLA_SUCCESS &&
              snapmla_cache_info(cache, &si) == SNAPMLA_SUCCESS &&
              si.layer_bytes == 3u * 64u * 656u && si.page_stride == 64u * 656u,
          "a cache with a page stride");
    CHECK(snapmla_cache_destroy(cache) == SNAPMLA_SUCCESS, "destroy the strided cache");
    sc.page_stride = SNAPMLA_PAGE_BYTES + 64;
    CHECK(snapmla_cache_create(&sc, &cache) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
              strstr(snapmla_last_error(), "page_stride") != NULL,
          "a page stride that is not a multiple of 128 is refused by name");
  }
  snapmla_set_validate_only(0);

  dc.batch_size = 4;
  dc.q_len = 2;
  dc.num_heads = 128;
  dc.max_pages = 16;
  dc.num_sm_parts = 8; /* explicit: no device query */
  CHECK(snapmla_decode_buffer_sizes(&dc, &plan_bytes, &ws_bytes) == SNAPMLA_SUCCESS &&
            plan_bytes > 0 && ws_bytes > 0,
        "decode buffer sizes");
  dc.q_len = 5;
  CHECK(
      snapmla_decode_buffer_sizes(&dc, &plan_bytes, &ws_bytes) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
          strstr(snapmla_last_error(), "q_len") != NULL,
      "q_len = 5 is refused by name");
}

#ifdef SNAPMLA_EXAMPLE_WITH_CUDA
static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}
static float float_of(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void gpu_checks(void) {
  enum { kTokens = 100, kHeads = 16 };
  snapmla_cache_config_t cfg = SNAPMLA_CACHE_CONFIG_INIT;
  snapmla_cache_t cache = NULL;
  uint16_t *h_ckv, *h_kpe, *h_q, *h_out;
  int64_t h_slots[kTokens];
  int32_t h_table[2] = {1, 0}, h_len = kTokens;
  void *d_ckv, *d_kpe, *d_q, *d_out, *d_fetch_c, *d_fetch_r, *plan, *ws;
  int64_t* d_slots;
  int32_t *d_table, *d_len;
  float h_lse[kHeads], *d_lse;
  size_t plan_bytes = 0, ws_bytes = 0;
  snapmla_decode_config_t dc = SNAPMLA_DECODE_CONFIG_INIT;
  snapmla_decode_args_t args = SNAPMLA_DECODE_ARGS_INIT;
  double max_rel = 0.0;
  int i, finite = 1;

  h_ckv = (uint16_t*)malloc(kTokens * 512 * 2);
  h_kpe = (uint16_t*)malloc(kTokens * 64 * 2);
  h_q = (uint16_t*)malloc(kHeads * 576 * 2);
  h_out = (uint16_t*)malloc(kHeads * 512 * 2);
  srand(7);
  for (i = 0; i < kTokens * 512; ++i) h_ckv[i] = bf16_of((float)rand() / RAND_MAX - 0.5f);
  for (i = 0; i < kTokens * 64; ++i) h_kpe[i] = bf16_of((float)rand() / RAND_MAX - 0.5f);
  for (i = 0; i < kHeads * 576; ++i) h_q[i] = bf16_of((float)rand() / RAND_MAX - 0.5f);
  /* token i of the request lives in page h_table[i / 64], row i % 64 */
  for (i = 0; i < kTokens; ++i) h_slots[i] = (int64_t)h_table[i / 64] * 64 + i % 64;

  cfg.num_layers = 1;
  cfg.num_pages = 2; /* the current device, memory allocated by the library */
  CHECK(snapmla_cache_create(&cfg, &cache) == SNAPMLA_SUCCESS, "create (library memory)");

  cudaMalloc(&d_ckv, kTokens * 512 * 2);
  cudaMalloc(&d_kpe, kTokens * 64 * 2);
  cudaMalloc((void**)&d_slots, sizeof(h_slots));
  cudaMalloc(&d_fetch_c, kTokens * 512 * 2);
  cudaMalloc(&d_fetch_r, kTokens * 64 * 2);
  cudaMemcpy(d_ckv, h_ckv, kTokens * 512 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(d_kpe, h_kpe, kTokens * 64 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(d_slots, h_slots, sizeof(h_slots), cudaMemcpyHostToDevice);
  CHECK(snapmla_append(cache, 0, d_ckv, 512, d_kpe, 64, d_slots, kTokens, NULL) == SNAPMLA_SUCCESS,
        "append");
  CHECK(snapmla_fetch_dequant(cache, 0, d_slots, kTokens, d_fetch_c, 512, d_fetch_r, 64, NULL) ==
            SNAPMLA_SUCCESS,
        "fetch-dequant");
  {
    uint16_t* back = (uint16_t*)malloc(kTokens * 512 * 2);
    cudaMemcpy(back, d_fetch_c, kTokens * 512 * 2, cudaMemcpyDeviceToHost);
    for (i = 0; i < kTokens * 512; ++i) {
      double a = float_of(h_ckv[i]), b = float_of(back[i]);
      double rel = fabs(a - b) / 0.5; /* |c_kv| <= 0.5: E4M3 keeps 3 mantissa bits */
      if (rel > max_rel) max_rel = rel;
    }
    free(back);
  }
  CHECK(max_rel < 0.07, "fetch-dequant reproduces c_kv within E4M3 precision (%.4f)", max_rel);

  dc.batch_size = 1;
  dc.num_heads = kHeads;
  dc.max_pages = 2;
  CHECK(snapmla_decode_buffer_sizes(&dc, &plan_bytes, &ws_bytes) == SNAPMLA_SUCCESS, "sizes");
  cudaMalloc(&plan, plan_bytes);
  cudaMalloc(&ws, ws_bytes);
  dc.plan_bytes = plan_bytes; /* the plan and decode calls refuse buffers too small */
  dc.workspace_bytes = ws_bytes;
  cudaMalloc(&d_q, kHeads * 576 * 2);
  cudaMalloc(&d_out, kHeads * 512 * 2);
  cudaMalloc((void**)&d_lse, sizeof(h_lse));
  cudaMalloc((void**)&d_table, sizeof(h_table));
  cudaMalloc((void**)&d_len, sizeof(h_len));
  cudaMemcpy(d_q, h_q, kHeads * 576 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(d_table, h_table, sizeof(h_table), cudaMemcpyHostToDevice);
  cudaMemcpy(d_len, &h_len, sizeof(h_len), cudaMemcpyHostToDevice);
  CHECK(snapmla_decode_plan(&dc, d_len, plan, NULL) == SNAPMLA_SUCCESS, "plan");
  args.softmax_scale = 1.0f / sqrtf(192.0f);
  args.q = d_q;
  args.q_stride_batch = kHeads * 576;
  args.q_stride_token = kHeads * 576;
  args.q_stride_head = 576;
  args.block_table = d_table;
  args.block_table_stride = 2;
  args.cache_seqlens = d_len;
  args.out = d_out;
  args.lse = d_lse;
  CHECK(snapmla_decode(cache, &dc, &args, plan, ws, NULL) == SNAPMLA_SUCCESS, "decode");
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "kernels ran");
  cudaMemcpy(h_out, d_out, kHeads * 512 * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(h_lse, d_lse, sizeof(h_lse), cudaMemcpyDeviceToHost);
  for (i = 0; i < kHeads * 512; ++i) finite &= isfinite(float_of(h_out[i])) ? 1 : 0;
  for (i = 0; i < kHeads; ++i) finite &= isfinite(h_lse[i]) ? 1 : 0;
  CHECK(finite, "decode output and lse are finite");
  /* softmax over 100 tokens: lse >= log(100) - |max logit| bound; and it is an average of V */
  CHECK(h_lse[0] > 0.0f, "lse[0] = %f", h_lse[0]);

  args.softmax_scale = -1.0f;
  CHECK(snapmla_decode(cache, &dc, &args, plan, ws, NULL) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
            strstr(snapmla_last_error(), "softmax_scale") != NULL,
        "negative softmax_scale refused by name");
  CHECK(snapmla_cache_destroy(cache) == SNAPMLA_SUCCESS, "destroy");
  cudaFree(d_ckv);
  cudaFree(d_kpe);
  cudaFree(d_slots);
  cudaFree(d_fetch_c);
  cudaFree(d_fetch_r);
  cudaFree(plan);
  cudaFree(ws);
  cudaFree(d_q);
  cudaFree(d_out);
  cudaFree(d_lse);
  cudaFree(d_table);
  cudaFree(d_len);
  free(h_ckv);
  free(h_kpe);
  free(h_q);
  free(h_out);
}
/* --devices: one decode per device, its stages interleaved across the devices. */
enum { kDevTokens = 100, kDevHeads = 16, kDevMaxDevices = 64 };

typedef struct device_run {
  snapmla_cache_t cache;
  void *ckv, *kpe, *q, *out, *plan, *ws;
  int64_t* slots;
  int32_t *table, *len;
  float* lse;
} device_run_t;

static snapmla_decode_args_t decode_args_of(const device_run_t* r) {
  snapmla_decode_args_t args = SNAPMLA_DECODE_ARGS_INIT;
  args.softmax_scale = 1.0f / sqrtf(192.0f);
  args.q = r->q;
  args.q_stride_batch = kDevHeads * 576;
  args.q_stride_token = kDevHeads * 576;
  args.q_stride_head = 576;
  args.block_table = r->table;
  args.block_table_stride = 2;
  args.cache_seqlens = r->len;
  args.out = r->out;
  args.lse = r->lse;
  return args;
}

static void devices_checks(void) {
  const size_t ckv_bytes = kDevTokens * 512 * 2, kpe_bytes = kDevTokens * 64 * 2;
  const size_t q_bytes = kDevHeads * 576 * 2, out_bytes = kDevHeads * 512 * 2;
  uint16_t *h_ckv, *h_kpe, *h_q, *h_out;
  float* h_lse;
  int64_t h_slots[kDevTokens];
  int32_t h_table[2] = {1, 0}, h_len = kDevTokens;
  device_run_t* runs;
  snapmla_decode_config_t dc = SNAPMLA_DECODE_CONFIG_INIT;
  snapmla_decode_args_t args;
  size_t plan_bytes = 0, ws_bytes = 0;
  int count = 0, d, i, same = 1, finite = 1;

  CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count >= 1, "CUDA devices: %d", count);
  if (count < 1) return;
  if (count > kDevMaxDevices) count = kDevMaxDevices;
  printf("devices: %d\n", count);
  runs = (device_run_t*)calloc((size_t)count, sizeof(device_run_t));
  h_ckv = (uint16_t*)malloc(ckv_bytes);
  h_kpe = (uint16_t*)malloc(kpe_bytes);
  h_q = (uint16_t*)malloc(q_bytes);
  h_out = (uint16_t*)malloc(out_bytes * (size_t)count);
  h_lse = (float*)malloc(sizeof(float) * kDevHeads * (size_t)count);
  srand(11);
  for (i = 0; i < kDevTokens * 512; ++i) h_ckv[i] = bf16_of((float)rand() / RAND_MAX - 0.5f);
  for (i = 0; i < kDevTokens * 64; ++i) h_kpe[i] = bf16_of((float)rand() / RAND_MAX - 0.5f);
  for (i = 0; i < kDevHeads * 576; ++i) h_q[i] = bf16_of((float)rand() / RAND_MAX - 0.5f);
  for (i = 0; i < kDevTokens; ++i) h_slots[i] = (int64_t)h_table[i / 64] * 64 + i % 64;

  dc.batch_size = 1;
  dc.num_heads = kDevHeads;
  dc.max_pages = 2;
  dc.num_sm_parts = 8; /* one split on every device, whatever its SM count: comparable bytes */
  CHECK(snapmla_decode_buffer_sizes(&dc, &plan_bytes, &ws_bytes) == SNAPMLA_SUCCESS, "sizes");
  dc.plan_bytes = plan_bytes;
  dc.workspace_bytes = ws_bytes;

  /* A cache and the inputs on every device (config.device names it; the library allocates). */
  for (d = 0; d < count; ++d) {
    device_run_t* r = &runs[d];
    snapmla_cache_config_t cfg = SNAPMLA_CACHE_CONFIG_INIT;
    snapmla_cache_info_t info = SNAPMLA_CACHE_INFO_INIT;
    cfg.num_layers = 1;
    cfg.num_pages = 2;
    cfg.device = d;
    CHECK(snapmla_cache_create(&cfg, &r->cache) == SNAPMLA_SUCCESS, "create on device %d", d);
    CHECK(snapmla_cache_info(r->cache, &info) == SNAPMLA_SUCCESS && info.device == d,
          "the cache of device %d says device %d", d, info.device);
    CHECK(cudaSetDevice(d) == cudaSuccess, "cudaSetDevice(%d)", d);
    cudaMalloc(&r->ckv, ckv_bytes);
    cudaMalloc(&r->kpe, kpe_bytes);
    cudaMalloc(&r->q, q_bytes);
    cudaMalloc(&r->out, out_bytes);
    cudaMalloc(&r->plan, plan_bytes);
    cudaMalloc(&r->ws, ws_bytes);
    cudaMalloc((void**)&r->slots, sizeof(h_slots));
    cudaMalloc((void**)&r->table, sizeof(h_table));
    cudaMalloc((void**)&r->len, sizeof(h_len));
    cudaMalloc((void**)&r->lse, sizeof(float) * kDevHeads);
    cudaMemcpy(r->ckv, h_ckv, ckv_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(r->kpe, h_kpe, kpe_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(r->q, h_q, q_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(r->slots, h_slots, sizeof(h_slots), cudaMemcpyHostToDevice);
    cudaMemcpy(r->table, h_table, sizeof(h_table), cudaMemcpyHostToDevice);
    cudaMemcpy(r->len, &h_len, sizeof(h_len), cudaMemcpyHostToDevice);
    CHECK(cudaGetLastError() == cudaSuccess, "buffers on device %d", d);
  }
  /* Each stage on every device before the next: the current device changes between calls. */
  for (d = 0; d < count; ++d) {
    device_run_t* r = &runs[d];
    cudaSetDevice(d);
    CHECK(snapmla_append(r->cache, 0, r->ckv, 512, r->kpe, 64, r->slots, kDevTokens, NULL) ==
              SNAPMLA_SUCCESS,
          "append on device %d", d);
  }
  for (d = 0; d < count; ++d) {
    cudaSetDevice(d);
    CHECK(snapmla_decode_plan(&dc, runs[d].len, runs[d].plan, NULL) == SNAPMLA_SUCCESS,
          "plan on device %d", d);
  }
  for (d = 0; d < count; ++d) {
    cudaSetDevice(d);
    args = decode_args_of(&runs[d]);
    CHECK(snapmla_decode(runs[d].cache, &dc, &args, runs[d].plan, runs[d].ws, NULL) ==
              SNAPMLA_SUCCESS,
          "decode on device %d", d);
  }
  for (d = 0; d < count; ++d) {
    cudaSetDevice(d);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "device %d ran its kernels", d);
    cudaMemcpy(h_out + (size_t)d * kDevHeads * 512, runs[d].out, out_bytes,
               cudaMemcpyDeviceToHost);
    cudaMemcpy(h_lse + (size_t)d * kDevHeads, runs[d].lse, sizeof(float) * kDevHeads,
               cudaMemcpyDeviceToHost);
    if (memcmp(h_out + (size_t)d * kDevHeads * 512, h_out, out_bytes) != 0 ||
        memcmp(h_lse + (size_t)d * kDevHeads, h_lse, sizeof(float) * kDevHeads) != 0) {
      same = 0;
      fprintf(stderr, "device %d: output differs from device 0's\n", d);
    }
  }
  for (i = 0; i < kDevHeads * 512; ++i) finite &= isfinite(float_of(h_out[i])) ? 1 : 0;
  CHECK(finite && h_lse[0] > 0.0f, "device 0's output is finite");
  CHECK(same, "the outputs of %d devices are identical byte for byte", count);
  printf("outputs of %d devices identical byte for byte: %s\n", count, same ? "yes" : "NO");

  if (count >= 2) {
    /* The cache of device 0 with the memory of device 1: refused naming 'cache', nothing run. */
    snapmla_cache_config_t cfg = SNAPMLA_CACHE_CONFIG_INIT;
    snapmla_cache_t other = NULL;
    uint16_t* again = (uint16_t*)malloc(out_bytes);
    cudaSetDevice(1);
    args = decode_args_of(&runs[1]);
    CHECK(snapmla_decode(runs[0].cache, &dc, &args, runs[1].plan, runs[1].ws, NULL) ==
                  SNAPMLA_ERROR_INVALID_ARGUMENT &&
              strstr(snapmla_last_error(), "argument 'cache'") != NULL &&
              strstr(snapmla_last_error(), "device 0") != NULL,
          "decode with device 0's cache while device 1 is current is refused");
    printf("device 0's cache with device 1's memory: %s\n", snapmla_last_error());
    CHECK(snapmla_append(runs[0].cache, 0, runs[1].ckv, 512, runs[1].kpe, 64, runs[1].slots,
                         kDevTokens, NULL) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
              strstr(snapmla_last_error(), "argument 'cache'") != NULL,
          "append into device 0's cache while device 1 is current is refused");
    cudaDeviceSynchronize();
    cudaMemcpy(again, runs[1].out, out_bytes, cudaMemcpyDeviceToHost);
    CHECK(memcmp(again, h_out + (size_t)kDevHeads * 512, out_bytes) == 0,
          "the refused calls wrote nothing");
    free(again);
    /* A cache for device 0 on memory cudaMalloc'ed on device 1: refused naming the memory. */
    cfg.num_layers = 1;
    cfg.num_pages = 1;
    cfg.device = 0;
    cfg.memory = runs[1].ckv; /* 102400 bytes of device 1, more than one page */
    cfg.memory_bytes = SNAPMLA_PAGE_BYTES;
    CHECK(snapmla_cache_create(&cfg, &other) == SNAPMLA_ERROR_INVALID_ARGUMENT &&
              strstr(snapmla_last_error(), "config.memory") != NULL,
          "a device 0 cache on device 1's memory is refused");
    printf("a device 0 cache on device 1's memory: %s\n", snapmla_last_error());
  } else {
    printf("one device: the refusals of a device 0 cache on device 1 need two\n");
  }

  for (d = 0; d < count; ++d) {
    device_run_t* r = &runs[d];
    cudaSetDevice(d);
    CHECK(snapmla_cache_destroy(r->cache) == SNAPMLA_SUCCESS, "destroy on device %d", d);
    cudaFree(r->ckv);
    cudaFree(r->kpe);
    cudaFree(r->q);
    cudaFree(r->out);
    cudaFree(r->plan);
    cudaFree(r->ws);
    cudaFree(r->slots);
    cudaFree(r->table);
    cudaFree(r->len);
    cudaFree(r->lse);
  }
  cudaSetDevice(0);
  free(runs);
  free(h_ckv);
  free(h_kpe);
  free(h_q);
  free(h_out);
  free(h_lse);
}
#endif

int main(int argc, char** argv) {
  int gpu = 0, devices = 0, i;
  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--gpu") == 0) {
      gpu = 1;
    } else if (strcmp(argv[i], "--devices") == 0) {
      devices = 1;
    } else {
      fprintf(stderr, "usage: %s [--gpu] [--devices]\n", argv[0]);
      return 2;
    }
  }
  host_checks();
  if (gpu || devices) {
#ifdef SNAPMLA_EXAMPLE_WITH_CUDA
    if (gpu) gpu_checks();
    if (devices) devices_checks();
#else
    fprintf(stderr, "FAIL: --gpu and --devices need the example built with a CUDA toolkit\n");
    ++g_failed;
#endif
  }
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
