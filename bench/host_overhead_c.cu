// Host time of the C API's calls alone, without Python. Times each call with a steady clock
// around it (median and p90 of `iters` calls), draining the stream every 64 calls outside the
// timed region so that a full launch queue never blocks a timed call; an empty kernel's launch
// is the floor.
//
//   nvcc -std=c++17 -O2 -Iinclude bench/host_overhead_c.cu -L<dir of libsnapmla.so> -lsnapmla \
//        -Xlinker -rpath,<that dir> -o host_overhead_c
//   ./host_overhead_c [batch=1] [heads=128] [iters=2000]
#include <cuda_runtime.h>
#include <snapmla/snapmla.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "cuda_check.h"

#define CHECK_CUDA(x) SNAPMLA_BENCH_CHECK(x, 1)
#define CHECK_SNAPMLA(x)                                                                 \
  do {                                                                                   \
    snapmla_status_t s_ = (x);                                                           \
    if (s_ != SNAPMLA_SUCCESS) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, snapmla_last_error()); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

__global__ void empty_kernel() {}

static void report(const char* name, const std::function<void()>& call, int iters,
                   cudaStream_t stream) {
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < 200; ++i) call();  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (int i = 0; i < iters; ++i) {
    if (i % 64 == 0) CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    call();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::sort(us.begin(), us.end());
  std::printf("%-26s median %7.2f us  p90 %7.2f us  min %7.2f us\n", name, us[us.size() / 2],
              us[us.size() * 9 / 10], us.front());
}

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 1;
  const int heads = argc > 2 ? std::atoi(argv[2]) : 128;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 2000;
  const int max_pages = 64, num_pages = batch * max_pages, seqlen = 100;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  snapmla_cache_config_t cfg = SNAPMLA_CACHE_CONFIG_INIT;
  cfg.num_layers = 2;
  cfg.num_pages = num_pages;
  snapmla_cache_t cache;
  CHECK_SNAPMLA(snapmla_cache_create(&cfg, &cache));

  auto alloc = [](size_t bytes) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes < 256 ? 256 : bytes));
    CHECK_CUDA(cudaMemset(p, 0, bytes < 256 ? 256 : bytes));
    return p;
  };
  void* q = alloc(size_t(batch) * heads * 576 * 2);
  std::vector<int32_t> table(size_t(batch) * max_pages), lens(batch, seqlen);
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  auto* block_table = static_cast<int32_t*>(alloc(table.size() * 4));
  auto* seqlens = static_cast<int32_t*>(alloc(size_t(batch) * 4));
  CHECK_CUDA(cudaMemcpy(block_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(seqlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  void* out = alloc(size_t(batch) * heads * 512 * 2);
  auto* lse = static_cast<float*>(alloc(size_t(batch) * heads * 4));

  snapmla_decode_config_t dc = SNAPMLA_DECODE_CONFIG_INIT;
  dc.batch_size = batch;
  dc.num_heads = heads;
  dc.max_pages = max_pages;
  size_t plan_bytes = 0, workspace_bytes = 0;
  CHECK_SNAPMLA(snapmla_decode_buffer_sizes(&dc, &plan_bytes, &workspace_bytes));
  void* plan = alloc(plan_bytes);
  void* workspace = alloc(workspace_bytes);
  CHECK_SNAPMLA(snapmla_decode_plan(&dc, seqlens, plan, stream));

  snapmla_decode_args_t args = SNAPMLA_DECODE_ARGS_INIT;
  args.softmax_scale = 0.0721687836f;
  args.q = q;
  args.q_stride_batch = int64_t(heads) * 576;
  args.q_stride_token = int64_t(heads) * 576;
  args.q_stride_head = 576;
  args.block_table = block_table;
  args.block_table_stride = max_pages;
  args.cache_seqlens = seqlens;
  args.out = out;
  args.lse = lse;

  const int n = batch;
  void* c_kv = alloc(size_t(n) * 512 * 2);
  void* k_pe = alloc(size_t(n) * 64 * 2);
  std::vector<int64_t> slot_host(n);
  for (int i = 0; i < n; ++i) slot_host[i] = i;
  auto* slots = static_cast<int64_t*>(alloc(size_t(n) * 8));
  CHECK_CUDA(cudaMemcpy(slots, slot_host.data(), size_t(n) * 8, cudaMemcpyHostToDevice));
  void* q8 = alloc(size_t(n) * heads * 512);
  void* qr = alloc(size_t(n) * heads * 64 * 2);
  auto* qs = static_cast<float*>(alloc(size_t(n) * heads * 4));
  CHECK_CUDA(cudaDeviceSynchronize());

  std::printf("snapmla C API host time per call: batch %d, heads %d, %d calls each\n", batch,
              heads, iters);
  report("empty kernel launch", [&] { empty_kernel<<<1, 32, 0, stream>>>(); }, iters, stream);
  // What a decode call's launches cost as such, against one graph launch of them (what a
  // caller that captures its step pays): three empty kernels launched as a decode call
  // launches its three (the second and third with the programmatic-serialization attribute,
  // common/launch.h's launch_dependent), then the same three captured once into a graph and
  // replayed by cudaGraphLaunch, and a captured snapmla_decode call likewise.
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t dep{};
  dep.gridDim = dim3(1);
  dep.blockDim = dim3(32);
  dep.stream = stream;
  dep.attrs = &pdl;
  dep.numAttrs = 1;
  auto three_launches = [&] {
    empty_kernel<<<1, 32, 0, stream>>>();
    CHECK_CUDA(cudaLaunchKernelEx(&dep, empty_kernel));
    CHECK_CUDA(cudaLaunchKernelEx(&dep, empty_kernel));
  };
  report("three empty launches", three_launches, iters, stream);
  auto captured = [&](const std::function<void()>& launches) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    launches();
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphDestroy(graph));
    return exec;
  };
  cudaGraphExec_t three_exec = captured(three_launches);
  report("graph of the three", [&] { CHECK_CUDA(cudaGraphLaunch(three_exec, stream)); }, iters,
         stream);
  args.kernel = SNAPMLA_DECODE_KERNEL_AUTO;
  cudaGraphExec_t decode_exec = captured(
      [&] { CHECK_SNAPMLA(snapmla_decode(cache, &dc, &args, plan, workspace, stream)); });
  report("graph of snapmla_decode", [&] { CHECK_CUDA(cudaGraphLaunch(decode_exec, stream)); },
         iters, stream);
  CHECK_CUDA(cudaGraphExecDestroy(three_exec));
  CHECK_CUDA(cudaGraphExecDestroy(decode_exec));
  for (int kernel : {SNAPMLA_DECODE_KERNEL_AUTO, SNAPMLA_DECODE_KERNEL_REFERENCE}) {
    args.kernel = kernel;
    report(kernel == SNAPMLA_DECODE_KERNEL_AUTO ? "snapmla_decode (auto)" : "snapmla_decode (reference)",
           [&] { CHECK_SNAPMLA(snapmla_decode(cache, &dc, &args, plan, workspace, stream)); }, iters,
           stream);
  }
  report("snapmla_decode_plan", [&] { CHECK_SNAPMLA(snapmla_decode_plan(&dc, seqlens, plan, stream)); },
         iters, stream);
  report("snapmla_append",
         [&] { CHECK_SNAPMLA(snapmla_append(cache, 0, c_kv, 512, k_pe, 64, slots, n, stream)); }, iters,
         stream);
  report("snapmla_fetch_dequant",
         [&] { CHECK_SNAPMLA(snapmla_fetch_dequant(cache, 0, slots, n, c_kv, 512, k_pe, 64, stream)); },
         iters, stream);
  report("snapmla_quantize_q",
         [&] { CHECK_SNAPMLA(snapmla_quantize_q(q, n, heads, int64_t(heads) * 576, 576, q8, qr, qs, stream)); },
         iters, stream);
  report("snapmla_decode_buffer_sizes",
         [&] { CHECK_SNAPMLA(snapmla_decode_buffer_sizes(&dc, &plan_bytes, &workspace_bytes)); }, iters,
         stream);
  CHECK_SNAPMLA(snapmla_cache_destroy(cache));
  return 0;
}
