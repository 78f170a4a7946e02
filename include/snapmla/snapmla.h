/*
 * snapmla: FP8 decode attention for DeepSeek-style Multi-head Latent Attention on NVIDIA Hopper.
 *
 * One C99 header, raw device pointers, a CUDA stream last on every call that touches the GPU.
 *
 * ---------------------------------------------------------------------------------------------
 * Versioning
 *   SNAPMLA_VERSION_MAJOR changes when the ABI changes (a struct loses or reorders a field, a
 *   function changes signature or meaning, a status code changes number). MINOR only adds:
 *   new functions, new fields at the END of a config struct, new status codes. A program built
 *   against MAJOR.x runs against any MAJOR.y with y >= x. Compare snapmla_version() at run time.
 *
 * Errors
 *   Every function returns a snapmla_status_t. On failure a human-readable message naming the
 *   offending argument ("snapmla_append: argument 'c_kv': ...") is kept per thread and returned
 *   by snapmla_last_error(). A refused call has written nothing: every argument is checked
 *   before the first CUDA call (device query, allocation or launch). Status numbers are
 *   assigned once and never reused.
 *
 * Config structs
 *   Every struct passed in or out starts with `size_t struct_size`, which the caller sets to
 *   sizeof(the struct as the caller knows it): initialize each struct with its SNAPMLA_*_INIT
 *   macro (`snapmla_decode_args_t a = SNAPMLA_DECODE_ARGS_INIT;`), which sets struct_size and
 *   every field's default. Structs only grow at the end, and a field added later has zero as
 *   its default. struct_size is checked against this library's sizeof, S:
 *     smaller than S (a caller built against an older header): the fields the size covers are
 *       read and the missing trailing fields read as zero; a size below the oldest layout, or
 *       one that ends inside a field, is refused.
 *     larger than S (a caller built against a newer header): accepted only if every byte past
 *       S is zero, i.e. the caller left the fields this library does not know at their
 *       defaults; a nonzero byte there is refused, naming the struct, so that a caller relying
 *       on a newer field is told so instead of being silently ignored. At most
 *       SNAPMLA_MAX_STRUCT_SIZE bytes; larger is refused without reading past S.
 *     *_info (written by the library): min(struct_size, S) bytes are written and the bytes
 *       from S up to struct_size (at most SNAPMLA_MAX_STRUCT_SIZE) are zeroed.
 *
 * Handles
 *   A snapmla_cache_t is an opaque value, never dereferenced as given: every function that
 *   takes one looks it up in the library's table of live caches (a shared lock and a hash
 *   lookup, tens of nanoseconds). NULL, a destroyed handle and any value that
 *   snapmla_cache_create did not return are refused with SNAPMLA_ERROR_INVALID_ARGUMENT naming
 *   'cache'. Handles are never reused, so a destroyed handle stays refused.
 *
 * Pointers, sizes and offsets
 *   Device pointers are checked on the host for NULL and for the alignment their argument's
 *   comment gives: what the kernels' loads and stores need (the element size at least; more
 *   where a kernel uses vector stores or TMA). The bytes an argument spans, from its pointer
 *   over its shape and strides, are computed in checked 64-bit arithmetic: a span over
 *   2^63 - 1 bytes, or one that runs past the end of the address space, is refused naming the
 *   stride or count that makes it so. What memory a pointer is, the CUDA driver knows:
 *   snapmla_cache_create asks it once for the cache's caller memory (device memory of
 *   config.device or managed memory, its bytes inside one allocation). The pointers of the
 *   per-call functions (decode, plan, append, ...) are not asked about: that is a driver
 *   query per pointer and call, under a lock the driver shares with every allocation of the
 *   process, added to calls made per layer and step whose own host time is a few
 *   microseconds, and calls replayed from a CUDA graph never return to the host to be checked
 *   at all. A host pointer or an unallocated span there faults on the GPU. Two
 *   arguments overlap when their spans,
 *   from the first byte to the last (the gaps between strided rows included), share a byte;
 *   each function's comment says which overlaps it refuses, and the message names the
 *   argument refused and the one it overlaps. "The cache" there is all of a cache made on one
 *   block of memory, or the layer's own memory in one made with config.layer_memory.
 *
 * Validation-only mode (tests, argument checks on machines without a GPU)
 *   snapmla_set_validate_only(1) makes the calling thread's calls check their arguments as
 *   usual and, where a call would make its first CUDA call, return SNAPMLA_VALIDATED instead,
 *   having called no CUDA function and written no argument. Off by default.
 *
 * Streams, graphs, threads
 *   snapmla_stream_t is ABI-identical to cudaStream_t and CUstream (NULL = legacy default
 *   stream). Calls marked [graph-safe] only enqueue kernels on `stream`: they never allocate,
 *   never synchronize the host (snapmla_decode's one-time graph, at its declaration, aside)
 *   and may be captured into a CUDA graph. Calls marked [host] may
 *   allocate or synchronize and must not be captured. All functions are thread-safe on
 *   distinct objects; concurrent writes into the same cache region are the caller's to order.
 *   GPU calls run on the current CUDA device, which must be the cache's device.
 *
 * ---------------------------------------------------------------------------------------------
 * Cache format (byte by byte; other servers may read and write it directly)
 *
 *   One allocation holds num_layers x num_pages pages. Page p of layer l starts at byte
 *       (l * num_pages + p) * SNAPMLA_PAGE_BYTES            (41216 bytes per page)
 *   (since 0.2: at (l * num_pages + p) * page_stride with config.page_stride, and at
 *   layer_memory[l] + p * page_stride with config.layer_memory; the page's bytes below are the
 *   same, and the rest of a page_stride slot is never read or written)
 *   A page holds SNAPMLA_PAGE_SIZE = 64 token slots in three planes, each 128-byte aligned:
 *       [0, 32768)      content: 64 rows x 512 FP8 E4M3 (OCP e4m3fn, bias 7, no inf,
 *                       0x7F/0xFF = NaN); row r at byte r * 512, element d at byte d.
 *       [32768, 40960)  RoPE: 64 rows x 64 BF16 (little-endian), pre-divided by the row's
 *                       scale; row r at byte 32768 + r * 128, element d at + 2 * d.
 *       [40960, 41216)  scales: 64 IEEE fp32 (little-endian), row r at byte 40960 + 4 * r.
 *   Token slot t lives in page t / 64, row t % 64. A request's pages are listed in a block
 *   table (int32 [batch, max_pages]); its token i is in page block_table[b][i / 64], row i % 64.
 *   644 bytes per token (BF16 MLA: 1152).
 *
 * ---------------------------------------------------------------------------------------------
 * Numerics contract v3 (every kernel and the numpy model in python/snapmla/reference.py compute
 * this function; the kernels differ in how they accumulate, in two tiers, at the end)
 *
 *   Constants: kFp8Max = 448, kMinScale = 2^-32, kMinProbScale = 2^-64.
 *   e4m3(x): round to nearest even, saturating to +-448; NaN stays NaN.
 *   amax(): maximum of |x|, NaN if any element is NaN.
 *
 *   Key/value token (c_kv [512], k_pe [64], BF16 in):
 *     s  = fp32(amax(c_kv) / 448); if s < kMinScale then s = kMinScale   (amax = 0 -> 2^-32;
 *          the floor keeps k_pe / s finite, and content that small is below FP8 resolution)
 *     content = e4m3(fp32(c_kv) / s)          (IEEE fp32 division)
 *     rope    = bf16(fp32(k_pe) / s)          (IEEE fp32 division, round to nearest even)
 *     Dequantization: c_kv' = bf16(fp32(content) * s), k_pe' = bf16(fp32(rope) * s).
 *   Query row (q_nope [512], q_pe [64] per token and head): the same, giving q8, qr, s_q.
 *
 *   Logit of query row i and visible token j (fp32 accumulation):
 *     z_ij = (q8_i . content_j + qr_i . rope_j) * s_q,i * s_j * softmax_scale
 *   Visibility: token j < seqlen; with causal and s_q > 1, query position t (0-based among the
 *   request's s_q new tokens, which are the LAST s_q tokens of the context) sees j only when
 *   j <= seqlen - s_q + t (bottom-right aligned). Invisible tokens contribute exactly nothing,
 *   whatever bytes their slots hold (NaN included).
 *   Per query row, P blocks k = 0, 1, ... of B tokens of the context in increasing order (B = 64
 *   or 128, the kernel's choice; every kernel of this version takes B = 64; the model takes B as
 *   its p_block), starting from m = -inf, sigma = 1, l = 0, O = 0:
 *     m_k    = max(m_{k-1}, max_j z_ij)
 *     e_j    = exp(z_ij - m_k)                      (0 for invisible j)
 *     P'_j   = e_j * s_j                            (V's per-token scale fused into P)
 *     sig_k  = max_j P'_j / 448; if sig_k < kMinProbScale then sig_k = kMinProbScale
 *     P8_j   = e4m3(P'_j / sig_k)
 *     g_k    = exp(m_{k-1} - m_k) * sig_{k-1} / sig_k
 *     l_k    = l_{k-1} * g_k + sum_j e_j / sig_k                          (paper eq. 12)
 *     O_k    = O_{k-1} * g_k + sum_j P8_j * content_j     (FP8 x FP8, fp32; paper eq. 13)
 *   out = bf16(O / l), lse = m + ln(sig * l) (natural log, fp32). (A caller may ask for out as
 *   fp32, args.out_dtype: the fp32 O / l that the kernel rounds to BF16.)
 *   The split-KV schedule may cut a row's blocks into segments processed independently and
 *   merged by log-sum-exp; P8 is invariant to the running max, so this changes rounding only.
 *   A row with no visible token (empty context) gets out = 0 and lse = +inf.
 *   Non-finite inputs are not hidden: a NaN or Inf in a visible token or a query row turns the
 *   rows that see it into NaN, and nothing else.
 *
 *   Accumulation, in two tiers. Hopper's FP8 wgmma does not
 *   accumulate in fp32 (per k = 32 step the products are aligned and cut to about 13-14 bits),
 *   and a fast kernel must use it; the logit differences flip some E4M3 roundings of P.
 *   - Reference tier (SNAPMLA_DECODE_KERNEL_REFERENCE): fp32 accumulation; out within 2e-3
 *     relative L2 of the model, lse within 1e-3 (measured ~1e-5; a split request's partial
 *     outputs are kept as FP16 with an exponent per 8 values, 2^-11 relative).
 *   - Tensor-core tier (SNAPMLA_DECODE_KERNEL_FAST, and AUTO, which runs it): (1) on inputs
 *     whose logits every accumulator holds exactly (small integer codes), within 1e-3 of the
 *     model at the kernel's B at every shape; (2) on random inputs within 2e-2 relative L2
 *     and 5e-3 on lse; (3) against exact float64 attention on the BF16 inputs, at most 1.15x
 *     the model's own error on every python -m snapmla.accuracy layer and context (geometric
 *     mean at most 1.05x) and at most 1.05x on randn inputs. Measured on an H200:
 *     (2) 2e-3 .. 7e-3 typical, (3) largest 1.040x, geometric mean 1.009x, randn 1.001x.
 *     The kernel may rescale internally by powers of two (e, P' and sigma carried 2^24 high:
 *     P8, l and gamma are unchanged, and the lse takes sigma scaled back exactly) and divide by
 *     sigma through its reciprocal (a last-ulp difference).
 * ---------------------------------------------------------------------------------------------
 */
#ifndef SNAPMLA_SNAPMLA_H_
#define SNAPMLA_SNAPMLA_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SNAPMLA_API __declspec(dllexport)
#else
#define SNAPMLA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- version and constants */

#define SNAPMLA_VERSION_MAJOR 0
#define SNAPMLA_VERSION_MINOR 4
#define SNAPMLA_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define SNAPMLA_VERSION \
  (SNAPMLA_VERSION_MAJOR * 10000 + SNAPMLA_VERSION_MINOR * 100 + SNAPMLA_VERSION_PATCH)

#define SNAPMLA_PAGE_SIZE 64     /* token slots per page */
#define SNAPMLA_CONTENT_DIM 512  /* latent c_kv width (also V width) */
#define SNAPMLA_ROPE_DIM 64      /* decoupled RoPE key width */
#define SNAPMLA_HEAD_DIM 576     /* query / key width: content + RoPE */
#define SNAPMLA_PAGE_BYTES 41216 /* bytes per page */
#define SNAPMLA_PAGE_CONTENT_OFFSET 0
#define SNAPMLA_PAGE_ROPE_OFFSET 32768
#define SNAPMLA_PAGE_SCALE_OFFSET 40960
#define SNAPMLA_MAX_HEADS 128 /* query heads per decode call: 1 .. 128 */
#define SNAPMLA_MAX_Q_LEN 4   /* new tokens per request (MTP): 1 .. 4 */

/* CUDA stream, ABI-identical to cudaStream_t / CUstream. */
typedef struct CUstream_st* snapmla_stream_t;

/* The library's version, SNAPMLA_VERSION of the build that is loaded. [host, any thread] */
SNAPMLA_API int snapmla_version(void);

/* ----------------------------------------------------------------------------- errors */

/* Numbered once; never renumbered. */
typedef enum snapmla_status {
  SNAPMLA_SUCCESS = 0,
  SNAPMLA_ERROR_INVALID_ARGUMENT = 1, /* a pointer, shape, stride or value is out of range */
  SNAPMLA_ERROR_UNSUPPORTED = 2,      /* valid, but not supported by this build or device */
  SNAPMLA_ERROR_CUDA = 3,             /* the CUDA runtime reported an error */
  SNAPMLA_ERROR_OUT_OF_MEMORY = 4,    /* a [host] allocation failed */
  SNAPMLA_ERROR_INTERNAL = 5,         /* a bug in snapmla: please report it */
  SNAPMLA_VALIDATED = 6               /* validation-only mode: the arguments are valid and
                                         nothing was run (snapmla_set_validate_only) */
} snapmla_status_t;

/* Static name of a status ("SNAPMLA_ERROR_INVALID_ARGUMENT"). [host, any thread] */
SNAPMLA_API const char* snapmla_status_string(snapmla_status_t status);

/* Message of the latest failure on the calling thread ("" if none yet). The pointer stays
 * valid until the next snapmla call on this thread. [host, thread-local] */
SNAPMLA_API const char* snapmla_last_error(void);

/* Validation-only mode for the calling thread (see the top of this file): nonzero turns it on,
 * 0 off. Returns the previous setting. Every function stops before its first CUDA call and
 * returns SNAPMLA_VALIDATED once its arguments are checked; snapmla_cache_create on caller
 * memory with device >= 0 makes no CUDA call and still creates the handle;
 * snapmla_cache_destroy is not affected. [host, thread-local] */
SNAPMLA_API int snapmla_set_validate_only(int enable);

/* The largest struct_size accepted in any struct (see Config structs). */
#define SNAPMLA_MAX_STRUCT_SIZE 4096

/* ------------------------------------------------------------------------------ cache */

typedef struct snapmla_cache* snapmla_cache_t; /* opaque */

typedef struct snapmla_cache_config {
  size_t struct_size;  /* sizeof(snapmla_cache_config_t) */
  int32_t num_layers;  /* >= 1; see snapmla_cache_bytes for the bound on the total */
  int32_t num_pages;   /* pages per layer, 1 .. 33554431 (num_pages * 64 fits in int32) */
  int32_t page_size;   /* 0 or SNAPMLA_PAGE_SIZE */
  int32_t device;      /* CUDA device ordinal 0 .. 63; -1 = the current device */
  void* memory;        /* caller-owned device memory, 256-byte aligned as cudaMalloc's (the
                          kernels' 16-byte vector accesses and TMA need 16, the planes'
                          128-byte alignment above needs 128); NULL: the library allocates
                          (cudaMalloc) and frees it in snapmla_cache_destroy */
  size_t memory_bytes; /* with `memory`: its size, >= snapmla_cache_bytes() (with a
                          page_stride: >= num_layers * num_pages * page_stride), and memory +
                          memory_bytes must not pass the end of the address space; else
                          ignored */
  void* const* layer_memory; /* since 0.2. Or: one caller-owned device pointer per layer (a
                          host array of num_layers entries, copied), for engines that hold a
                          tensor per layer. Each layer is num_pages * SNAPMLA_PAGE_BYTES bytes
                          from its pointer (256-byte aligned, not passing the end of the address
                          space), the layers must not overlap, and `memory` must be NULL.
                          NULL (the default; what an older caller's struct_size reads): the
                          layers lie one after another in `memory` or in memory the library
                          allocates */
  size_t page_stride;  /* since 0.2. Bytes from one page to the next within a layer: 0 (the
                          default) = SNAPMLA_PAGE_BYTES, the pages packed; else a multiple of 128,
                          >= SNAPMLA_PAGE_BYTES, so that the pages can sit inside an engine's
                          larger slots (vLLM's fp8_ds_mla reserves 656 bytes a token: 64 x 656 =
                          41984). A layer is then num_pages * page_stride bytes and the cache
                          num_layers times that (memory_bytes and layer_memory accordingly). */
} snapmla_cache_config_t;

/* Defaults: num_layers and num_pages must be set; page_size 0 (= 64), the current device,
 * library-allocated memory. */
#define SNAPMLA_CACHE_CONFIG_INIT {sizeof(snapmla_cache_config_t), 0, 0, 0, -1, NULL, 0, NULL, 0}

typedef struct snapmla_cache_info {
  size_t struct_size; /* set by the caller: sizeof(snapmla_cache_info_t) */
  void* data;         /* device pointer of the first page (of layer 0) */
  int32_t device;     /* CUDA device ordinal */
  int32_t num_layers;
  int32_t num_pages;     /* per layer */
  int32_t page_size;     /* SNAPMLA_PAGE_SIZE */
  int32_t content_dim;   /* 512 */
  int32_t rope_dim;      /* 64 */
  size_t page_bytes;     /* 41216 */
  size_t content_offset; /* plane offsets inside a page */
  size_t rope_offset;
  size_t scale_offset;
  size_t layer_bytes;  /* num_pages * page_stride (page_bytes when packed) */
  size_t total_bytes;  /* num_layers * layer_bytes (with per_layer_memory: the layers' bytes
                          in all, not one range from `data`) */
  int32_t owns_memory; /* 1 if the library allocated `data` */
  int32_t per_layer_memory; /* since 0.2: 1 if made from config.layer_memory (each layer at its
                               own pointer; snapmla_cache_layer_data gives them) */
  size_t page_stride;       /* since 0.2: bytes from a page to the next (page_bytes: packed) */
} snapmla_cache_info_t;

/* All zero: the library fills it in. */
#define SNAPMLA_CACHE_INFO_INIT \
  {sizeof(snapmla_cache_info_t), NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/* Bytes a cache of this shape needs: num_layers * num_pages * SNAPMLA_PAGE_BYTES, computed in
 * checked 64-bit arithmetic. num_layers >= 1, num_pages 1 .. 33554431, and the total must be at
 * most 2^63 - 1 bytes (every byte offset into the cache is an int64): a larger total is
 * refused naming num_layers, with the largest num_layers for that num_pages. [host, any
 * thread] */
SNAPMLA_API snapmla_status_t snapmla_cache_bytes(int32_t num_layers, int32_t num_pages,
                                                 size_t* bytes);

/* Create a cache handle, on caller memory or on memory it allocates. The contents start
 * undefined: slots are meaningful once appended. Caller memory (config.memory, or each
 * config.layer_memory[l]) is checked with the CUDA driver, with config.device current: device
 * memory of that device or managed memory (pinned host memory, pageable host memory and
 * another device's memory are refused, naming the pointer), and its bytes, from the pointer
 * over memory_bytes (or the layer's bytes), inside the allocation the driver reports for it
 * (naming config.memory_bytes or the layer; a VMM mapping's allocation is its reserved address
 * range); config.device must be a device of the machine. Not in validation-only mode, and not
 * in a process without a usable CUDA driver or device (no call could run on the cache there):
 * the handle is then created unchecked. [host: may allocate; not graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_cache_create(const snapmla_cache_config_t* config,
                                                  snapmla_cache_t* cache);

/* Destroy the handle, freeing memory the library allocated (after synchronizing the device
 * if it did). NULL is accepted; a handle already destroyed is refused. Calls on the cache in
 * other threads must have returned: the handle lookup is thread-safe, but memory freed here
 * (the device memory, and the copy of config.layer_memory) may still be in use by them.
 * [host: not graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_cache_destroy(snapmla_cache_t cache);

/* Sizes and plane offsets of a cache. [host, any thread] */
SNAPMLA_API snapmla_status_t snapmla_cache_info(snapmla_cache_t cache, snapmla_cache_info_t* info);

/* Since 0.2. The device pointer of `layer`'s first page (layer_bytes of that layer follow it).
 * [host, any thread] */
SNAPMLA_API snapmla_status_t snapmla_cache_layer_data(snapmla_cache_t cache, int32_t layer,
                                                      void** data);

/* ----------------------------------------------------------------------------- append */

/* Quantize n new tokens and write them into `layer` of the cache, one launch (fused K-append:
 * per-token scale, FP8 content, pre-scaled BF16 RoPE, paged write).
 *   c_kv      BF16 [n, 512], 2-byte aligned, row stride c_kv_stride elements (>= 512 when
 *             n > 1; any when n = 1), unit inner stride
 *   k_pe      BF16 [n, 64], 2-byte aligned, row stride k_pe_stride elements (>= 64 when n > 1)
 *   slots     int64 [n], device, 8-byte aligned: token i goes to slot slots[i]; a negative
 *             slot skips the token (padding). A slot >= num_pages * 64 is also skipped (it
 *             cannot be checked on the host without a synchronization); nothing outside the
 *             layer is written.
 *   (Rows 16-byte aligned with strides that are multiples of 8 take 16-byte vector loads;
 *   other layouts are read element by element.) c_kv, k_pe or slots overlapping the cache is
 *   refused, naming that input. Two tokens with the same slot race. n = 0 is a no-op that
 *   checks only cache, layer and n. [graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_append(snapmla_cache_t cache, int32_t layer, const void* c_kv,
                                            int64_t c_kv_stride, const void* k_pe,
                                            int64_t k_pe_stride, const int64_t* slots,
                                            int64_t num_tokens, snapmla_stream_t stream);

/* ------------------------------------------------------------------------ fetch-dequant */

/* Gather tokens from `layer` of the cache and dequantize them to BF16, one launch (for chunked
 * prefill and prefix reuse).
 *   slots     int64 [n], device, 8-byte aligned. A negative slot yields a row of zeros; a
 *             slot >= num_pages * 64 yields a row of NaN (never an out-of-bounds read).
 *   c_kv      BF16 [n, 512] out, 2-byte aligned, row stride c_kv_stride elements (>= 512
 *             when n > 1)
 *   k_pe      BF16 [n, 64] out, 2-byte aligned, row stride k_pe_stride elements (>= 64 when
 *             n > 1)
 *   (16-byte aligned rows with strides that are multiples of 8 take 16-byte vector stores.)
 *   An output (c_kv, then k_pe) overlapping the cache, slots or the other output is refused,
 *   naming it. n = 0 is a no-op. [graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_fetch_dequant(snapmla_cache_t cache, int32_t layer,
                                                   const int64_t* slots, int64_t num_tokens,
                                                   void* c_kv, int64_t c_kv_stride, void* k_pe,
                                                   int64_t k_pe_stride, snapmla_stream_t stream);

/* Since 0.2. Gather requests' tokens by their block tables and dequantize them to BF16, one
 * launch (chunked-prefill context reads that go by page, as engines hold them): token
 * i < seqlens[r] of request r, in page block_table[r][i / 64] row i % 64, goes to output row
 * out_rows[r] + i.
 *   block_table  int32 [batch, max_pages], device, 4-byte aligned, row stride
 *                block_table_stride (>= max_pages when batch > 1); batch 1 .. 65536
 *   seqlens      int32 [batch], device: tokens to read; < 0 reads as 0, tokens past
 *                max_pages * 64 are skipped
 *   out_rows     int64 [batch], device, 8-byte aligned: each request's first output row
 *   num_rows     rows of the outputs; a token whose row falls outside [0, num_rows) is skipped
 *   c_kv, k_pe   BF16 [num_rows, 512] / [num_rows, 64] out, strides as fetch_dequant's
 *   An output (c_kv, then k_pe) overlapping the cache, block_table, seqlens, out_rows or the
 *   other output is refused, naming it.
 *   A page id outside the layer gives a NaN row. Rows no token maps to keep their contents;
 *   two tokens mapped to one row race. num_rows = 0 is a no-op that checks only cache and
 *   layer. [graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_gather_dequant(
    snapmla_cache_t cache, int32_t layer, const int32_t* block_table, int64_t block_table_stride,
    int32_t batch, int32_t max_pages, const int32_t* seqlens, const int64_t* out_rows,
    int64_t num_rows, void* c_kv, int64_t c_kv_stride, void* k_pe, int64_t k_pe_stride,
    snapmla_stream_t stream);

/* ------------------------------------------------------------------------- copy slots */

/* Since 0.2. Copy tokens byte for byte between slots of `layer` (engines that compact, reorder
 * or defragment their caches), one launch: token src_slots[i] -> dst_slots[i], its FP8 content,
 * RoPE and scale.
 *   src_slots, dst_slots  int64 [n], device, 8-byte aligned. A negative slot (in either) skips
 *             the token; so does a slot >= num_pages * 64 (it cannot be checked on the host
 *             without a synchronization); nothing outside the layer is read or written.
 *   A slot written by one token and read or written by another races: keep the destinations
 *   distinct and apart from the sources. src_slots or dst_slots overlapping the cache is
 *   refused, naming it. n = 0 is a no-op that checks only cache, layer and n. [graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_copy_slots(snapmla_cache_t cache, int32_t layer,
                                                const int64_t* src_slots, const int64_t* dst_slots,
                                                int64_t num_tokens, snapmla_stream_t stream);

/* --------------------------------------------------------------------------- quantize q */

/* Quantize query rows as the contract says (one scale per token and head), one launch.
 *   q         BF16 [n, h, 576], 2-byte aligned, strides q_stride_token (>= 576 when n > 1),
 *             q_stride_head (>= 576 when h > 1) in elements, unit inner stride
 *   q_content FP8 E4M3 [n, h, 512] out, contiguous, 8-byte aligned (8-byte stores)
 *   q_rope    BF16 [n, h, 64] out, contiguous, 16-byte aligned (16-byte stores), pre-divided
 *             by the row's scale
 *   q_scale   fp32 [n, h] out, contiguous, 4-byte aligned
 *   h in 1 .. 1024. An output overlapping q or a later output (in argument order) is refused,
 *   naming it. n = 0 is a no-op. [graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_quantize_q(const void* q, int64_t num_tokens,
                                                int32_t num_heads, int64_t q_stride_token,
                                                int64_t q_stride_head, void* q_content,
                                                void* q_rope, float* q_scale,
                                                snapmla_stream_t stream);

/* The two-term query (optional, precision beyond the contract's one FP8 row): as
 * snapmla_quantize_q, bit for bit in q_content, q_rope and q_scale, plus the row's residual
 * in a second FP8 row at scale q_scale / 16, so that q_nope ~ q_scale * q_content + q_lo_scale *
 * q_lo to about 2^-8 relative. Per element, in fp32: x = q_nope / s1 (the IEEE quotient that
 * q_content rounds; s1 = q_scale), q_lo = E4M3(16 * (x - q_content)) (exact difference and
 * product, one rounding to nearest even), and per row s2 = q_lo_scale = s1 / 16 exactly. A
 * NaN in the row makes s1, s2 and every code of both rows NaN (an inf: s1 and s2 inf, codes
 * zero or NaN). snapmla.reference.quantize_q2 models it bit for bit.
 *   q_lo       FP8 E4M3 [n, h, 512] out, contiguous, 8-byte aligned
 *   q_lo_scale fp32 [n, h] out, contiguous, 4-byte aligned
 *   The rest as snapmla_quantize_q, with q_lo and q_lo_scale its last outputs in the overlap
 *   rule. snapmla_decode quantizes the two terms itself for a plan made with
 *   config.q_precision FP8X2. Since 0.2.
 *   [graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_quantize_q2(const void* q, int64_t num_tokens,
                                                 int32_t num_heads, int64_t q_stride_token,
                                                 int64_t q_stride_head, void* q_content,
                                                 void* q_rope, float* q_scale, void* q_lo,
                                                 float* q_lo_scale, snapmla_stream_t stream);

/* ------------------------------------------------------------------------------ decode */

/* How the query enters QK (config.q_precision). */
typedef enum snapmla_q_precision {
  SNAPMLA_Q_PRECISION_FP8 = 0,  /* the contract: one FP8 row per (token, head), one scale */
  SNAPMLA_Q_PRECISION_FP8X2 = 1 /* the two-term query (see snapmla_quantize_q2): a second FP8
                                   row on the first's residual, a second content QK pass,
                                   z's content part acc_hi + rho * acc_lo (one FMA, rho =
                                   fp32(s2 / s1)); snapmla.reference models it (q_terms=2).
                                   Since 0.2. REFERENCE takes it at every shape; AUTO and
                                   FAST where q_len * num_heads <= 32 (the low rows
                                   interleave in the seesaw kernel's QK tile: on an H200,
                                   0.99-1.05x the one-term time at <= 16 rows, 0.99-1.01x
                                   at 32); past 32 only REFERENCE (AUTO refuses rather
                                   than run a kernel several times slower unasked) */
} snapmla_q_precision_t;

/* The shape of one decode step. A plan made for a config serves every layer of that step. */
typedef struct snapmla_decode_config {
  size_t struct_size;   /* sizeof(snapmla_decode_config_t) */
  int32_t batch_size;   /* requests, 1 .. 65536 */
  int32_t q_len;        /* s_q: new tokens per request, 1 .. SNAPMLA_MAX_Q_LEN */
  int32_t num_heads;    /* h: query heads, 1 .. SNAPMLA_MAX_HEADS */
  int32_t max_pages;    /* columns of the block table; contexts are at most max_pages * 64 */
  int32_t num_sm_parts; /* split-KV parallelism, 0 .. 65535; 0 = derive from the device's SM
                           count. Optional: a struct_size that ends before it reads 0 */
  int32_t q_precision;  /* since 0.2, optional: snapmla_q_precision_t, 0 (FP8; what an older
                           caller's struct_size reads). FP8X2 sizes the workspace for the
                           two-term query's low row (516 bytes more per query row) and has
                           snapmla_decode run it */
  size_t plan_bytes;    /* since 0.4, optional: the size of the caller's plan buffer, 0 = not
                           checked (what an older caller's struct_size reads). Nonzero:
                           snapmla_decode_plan and snapmla_decode refuse a plan smaller than
                           this config needs (naming 'plan'): buffers sized for another config,
                           or with num_sm_parts 0 while a GPU with fewer SMs was current.
                           Unchecked, such a plan's schedule is not used (its header does not
                           match: NaN rows), but the kernels load its words with the header,
                           and a buffer smaller than the call's config needs may be read past
                           its end. snapmla_decode_buffer_sizes and
                           snapmla_decode_select_kernel ignore it */
  size_t workspace_bytes; /* since 0.4, optional: the same for the workspace, 0 = not checked;
                             snapmla_decode refuses a smaller one (naming 'workspace') */
} snapmla_decode_config_t;

/* Defaults: batch_size, num_heads and max_pages must be set; q_len 1, num_sm_parts 0, FP8, the
 * buffers' sizes not checked. */
#define SNAPMLA_DECODE_CONFIG_INIT {sizeof(snapmla_decode_config_t), 0, 1, 0, 0, 0, 0, 0, 0}

/* Which kernel runs the attention. */
typedef enum snapmla_decode_kernel {
  SNAPMLA_DECODE_KERNEL_AUTO = 0,      /* FAST: it meets the contract's tensor-core tier and
                                          is faster than REFERENCE at every measured shape
                                          (H200: 2.5-5.8x at the README's 23 cases) */
  SNAPMLA_DECODE_KERNEL_REFERENCE = 1, /* the contract's reference tier: mma.sync tensor cores
                                          with fp32 accumulation, within 2e-3 of the model
                                          (measured ~1e-5); the statement of the contract */
  SNAPMLA_DECODE_KERNEL_FAST = 2       /* the seesaw kernel: TMA ring, FP8 wgmma for QK and
                                          the transposed PV, BF16 wgmma for the RoPE; the
                                          contract's tensor-core tier (see the contract) */
} snapmla_decode_kernel_t;

/* The element type of snapmla_decode's `out` (args.out_dtype). */
typedef enum snapmla_out_dtype {
  SNAPMLA_OUT_BF16 = 0, /* the contract's out = bf16(O / l), round to nearest even */
  SNAPMLA_OUT_FP32 = 1  /* the fp32 values the kernels round to BF16 (O / l, or the combine's
                           merge of split partials), unrounded: rounded to nearest even, they
                           are bit for bit the BF16 out that the same call writes with
                           SNAPMLA_OUT_BF16 (NaN rows NaN). For callers who keep the two-term
                           query's precision, which the BF16 rounding (about 1.7e-3 relative)
                           would mostly hide. Since 0.2 */
} snapmla_out_dtype_t;

typedef struct snapmla_decode_args {
  size_t struct_size;         /* sizeof(snapmla_decode_args_t) */
  int32_t layer;              /* cache layer to read */
  int32_t causal;             /* nonzero: causal among the s_q new tokens */
  float softmax_scale;        /* > 0 and finite, e.g. 192^-0.5 */
  int32_t kernel;             /* snapmla_decode_kernel_t */
  const void* q;              /* BF16 [b, s_q, h, 576]: q_nope (absorbed) | q_pe; 2-byte aligned */
  int64_t q_stride_batch;     /* elements, >= 576 when b > 1; the last dimension is contiguous */
  int64_t q_stride_token;     /* >= 576 when s_q > 1 (unused when s_q = 1) */
  int64_t q_stride_head;      /* >= 576 when h > 1 */
  const int32_t* block_table; /* int32 [b, max_pages], 4-byte aligned, row stride
                                 block_table_stride */
  int64_t block_table_stride; /* elements, >= max_pages when b > 1 */
  const int32_t* cache_seqlens; /* int32 [b], 4-byte aligned: context length per request
                                   INCLUDING the s_q new tokens (already appended); 0 = empty */
  void* out;                    /* BF16 [b, s_q, h, 512] out, contiguous, 16-byte aligned
                                   (the combine's 16-byte stores); fp32 [b, s_q, h, 512]
                                   (4 bytes an element, same alignment) where out_dtype is
                                   FP32 */
  float* lse;                   /* fp32 [b, h, s_q] out, contiguous, 4-byte aligned; may be
                                   NULL */
  const void* q_pe;             /* since 0.2, optional: the RoPE part of the queries in its own
                                   tensor, BF16 [b, s_q, h, 64], 2-byte aligned, with the three
                                   strides below (elements; >= 64 where the dimension is > 1).
                                   `q` then holds q_nope (absorbed) only: BF16 [b, s_q, h, 512],
                                   its strides >= 512. Engines keep the two apart, and a concat
                                   per layer and step is bandwidth spent for nothing. NULL (the
                                   default; what an older caller's struct_size reads): q holds
                                   both, 576 per row. */
  int64_t q_pe_stride_batch;
  int64_t q_pe_stride_token;
  int64_t q_pe_stride_head;
  int32_t out_dtype; /* since 0.2, optional: snapmla_out_dtype_t, 0 (BF16; what an older caller's
                        struct_size reads) or 1 (FP32: `out` holds the fp32 values the BF16 out
                        rounds, from every kernel and path: split or not, empty and NaN rows);
                        any other value is refused */
} snapmla_decode_args_t;

/* Defaults: q, block_table, cache_seqlens, out, the strides and softmax_scale must be set;
 * layer 0, causal, kernel AUTO, no lse, BF16 out. */
/* clang-format off */
#define SNAPMLA_DECODE_ARGS_INIT \
  {sizeof(snapmla_decode_args_t), 0, 1, 0.0f, SNAPMLA_DECODE_KERNEL_AUTO, NULL, 0, 0, 0, NULL, 0, \
   NULL, NULL, NULL, NULL, 0, 0, 0, SNAPMLA_OUT_BF16}
/* clang-format on */

/* Since 0.3: the kernel snapmla_decode runs for `config` and the option `kernel`
 * (snapmla_decode_kernel_t), into *selected: SNAPMLA_DECODE_KERNEL_REFERENCE or
 * SNAPMLA_DECODE_KERNEL_FAST (AUTO resolved). An option the call would refuse (FP8X2 past
 * q_len * num_heads = 32 without REFERENCE) is refused here with the same message.
 * [host, any thread; touches no device] */
SNAPMLA_API snapmla_status_t snapmla_decode_select_kernel(const snapmla_decode_config_t* config,
                                                          int32_t kernel, int32_t* selected);

/* Device bytes for the plan and the workspace of a decode config. The caller allocates both
 * (cudaMalloc's 256-byte alignment suits both: the plan needs 16, the workspace 256). [host,
 * any thread; reads the current device's SM count when num_sm_parts = 0] */
SNAPMLA_API snapmla_status_t snapmla_decode_buffer_sizes(const snapmla_decode_config_t* config,
                                                         size_t* plan_bytes,
                                                         size_t* workspace_bytes);

/* Build the split-KV schedule on the device from cache_seqlens (int32 [b], device, 4-byte
 * aligned), into `plan` (device, plan_bytes, 16-byte aligned). One small launch; no host
 * synchronization. With config.plan_bytes set, a smaller plan is refused (naming 'plan'),
 * nothing enqueued. The plan records the config it was built for (batch, q_len, heads,
 * max_pages, part count, q_precision) and each request's block count, ceil(seqlen / 64). It
 * stays valid for as long as cache_seqlens does not change (typically: all layers of one step);
 * snapmla_decode gives NaN rows to a request whose seqlen now has another block count (see
 * there). [graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_decode_plan(const snapmla_decode_config_t* config,
                                                 const int32_t* cache_seqlens, void* plan,
                                                 snapmla_stream_t stream);

/* Attention of one layer for one decode step: Q-quant, the split-KV attention and the
 * combine, enqueued on `stream`. `plan` (16-byte aligned) must come from snapmla_decode_plan
 * with the same config and seqlens; `workspace` (workspace_bytes, 256-byte aligned: its parts
 * are 256-byte aligned for TMA and vector loads) is scratch, reusable by the next call on
 * the same stream. With config.plan_bytes or config.workspace_bytes set, a smaller buffer is
 * refused, naming it, nothing enqueued. Block-table entries and seqlens are device data: a
 * request whose seqlen is negative or exceeds max_pages * 64, or that names a page outside the
 * layer, gets NaN rows instead of an out-of-bounds read. The plan is device data too: one whose
 * header does not match this call (built for another config, q_precision included, or on a GPU
 * with another SM count when num_sm_parts is 0, or never built) makes every row NaN, its words
 * unused, and the workspace unwritten (the Q-quant kernel checks the header before its stores:
 * a workspace laid out for the plan's config is never written as another's). A plan built for
 * other seqlens gives NaN rows to each request whose seqlen now has another block count than
 * the plan recorded, ceil(seqlen / 64) (a plan reused after a context grew past a multiple of
 * 64 would leave the new tokens out), and correct rows to the others; a seqlen that changed
 * within its block count is attended as it is now (the plan's blocks hold it; the seqlen masks).
 * out and lse must not alias any input: an out or lse whose bytes overlap the cache
 * (all of it; a per-layer cache: the layer's memory), q, q_pe, block_table, cache_seqlens,
 * the plan or each other is refused, as snapmla.decode refuses it, and so is a workspace
 * overlapping any of them (the attention kernel may read q after another CTA wrote the
 * workspace, and the combine reads the plan while it writes out).
 * Host time: three launches (Q-quant, attention, combine) and the checks, about 10 us; a
 * step captured in a CUDA graph replays its launches without it. [graph-safe] */
SNAPMLA_API snapmla_status_t snapmla_decode(snapmla_cache_t cache,
                                            const snapmla_decode_config_t* config,
                                            const snapmla_decode_args_t* args, const void* plan,
                                            void* workspace, snapmla_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SNAPMLA_SNAPMLA_H_ */
