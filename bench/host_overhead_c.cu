// Host time of the C API's calls alone, without Python. Times each call with a steady clock
// around it (median and p90 of `iters` calls), draining the stream every 64 calls outside the
// timed region so that a full launch queue never blocks a timed call; an empty kernel's launch
// is the floor.
//
//   nvcc -std=c++17 -O2 -Iinclude -Icpp bench/host_overhead_c.cu -L<dir of libsnapmla.so> \
//        -lsnapmla -Xlinker -rpath,<that dir> -o host_overhead_c
//   ./host_overhead_c [batch=1] [heads=128] [iters=2000]
//   ./host_overhead_c graphs [heads=128]
//
// `graphs` weighs snapmla_decode's graph replay: it runs this program twice more, with
// SNAPMLA_DECODE_GRAPHS unset and =0 (the switch users have; the same binary and library), each
// child timing the same seeded call sequences of a 61-layer model, and prints both side by side
// with a verdict (graph_loops below).
#include <cuda_runtime.h>
#include <snapmla/snapmla.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/launch_cache.h"

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

static int graph_loops(int heads);
static int compare_graphs(const char* self, int heads);

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "graphs") {
    return compare_graphs(argv[0], argc > 2 ? std::atoi(argv[2]) : 128);
  }
  if (argc > 1 && std::string(argv[1]) == "graphs-child") {
    return graph_loops(argc > 2 ? std::atoi(argv[2]) : 128);
  }
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
  // What a decode call's launches cost as such, against one graph launch of them (the library
  // replays a repeated decode call as a graph): three empty kernels launched as a decode call
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

// ------------------------------------------------------------------------- graph replay loops

// One mode's numbers, as lines compare_graphs parses:
//   LOOP <name> <host us per decode call: mean> <p50> <wall us per step>
//   CAPTURE <first call us> <second call us> <third call us>   (medians over new keys)
// A step is a plan and one decode call per layer, then a stream synchronization (a serving
// engine reads its tokens back each step); the first kWarmSteps steps of a loop are not counted.
// Each loop starts from an empty graph table (snapmla_release_thread_resources: the one context
// this program uses). Contexts are short (kSeqlen tokens), so the host side dominates.
static int graph_loops(int heads) {
  constexpr int kLayers = 61, kMaxBatch = 64, kMaxPages = 4, kSeqlen = 200;
  constexpr int kSteps = 500, kWarmSteps = 100;
  // q, out and lse of a call sit at slot * kShift in their buffers: the buffers of each batch
  // size (and address variant) at their own address, as an allocator hands them out.
  constexpr size_t kShift = 256;
  constexpr int kSlots = 300, kCaptureSlot = 270, kCaptureKeys = 30;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  snapmla_cache_config_t cfg = SNAPMLA_CACHE_CONFIG_INIT;
  cfg.num_layers = kLayers;
  cfg.num_pages = kMaxBatch * kMaxPages;
  snapmla_cache_t cache;
  CHECK_SNAPMLA(snapmla_cache_create(&cfg, &cache));
  auto alloc = [](size_t bytes) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemset(p, 0, bytes));
    return static_cast<char*>(p);
  };
  const size_t rows = size_t(kMaxBatch) * heads;
  char* q = alloc(rows * 576 * 2 + kSlots * kShift);
  char* out = alloc(rows * 512 * 2 + kSlots * kShift);
  char* lse = alloc(rows * 4 + kSlots * kShift);
  std::vector<int32_t> table(size_t(kMaxBatch) * kMaxPages), lens(kMaxBatch, kSeqlen);
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  auto* block_table = reinterpret_cast<int32_t*>(alloc(table.size() * 4));
  auto* seqlens = reinterpret_cast<int32_t*>(alloc(lens.size() * 4));
  CHECK_CUDA(cudaMemcpy(block_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(seqlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  snapmla_decode_config_t dc = SNAPMLA_DECODE_CONFIG_INIT;
  dc.num_heads = heads;
  dc.max_pages = kMaxPages;
  size_t plan_bytes = 0, workspace_bytes = 0;
  for (int b = 1; b <= kMaxBatch; ++b) {  // one plan and one workspace for every batch size
    size_t p = 0, w = 0;
    dc.batch_size = b;
    CHECK_SNAPMLA(snapmla_decode_buffer_sizes(&dc, &p, &w));
    plan_bytes = std::max(plan_bytes, p);
    workspace_bytes = std::max(workspace_bytes, w);
  }
  void* plan = alloc(plan_bytes);
  void* workspace = alloc(workspace_bytes);
  snapmla_decode_args_t args = SNAPMLA_DECODE_ARGS_INIT;
  args.softmax_scale = 0.0721687836f;
  args.q_stride_batch = int64_t(heads) * 576;
  args.q_stride_token = int64_t(heads) * 576;
  args.q_stride_head = 576;
  args.block_table = block_table;
  args.block_table_stride = kMaxPages;
  args.cache_seqlens = seqlens;
  auto set_call = [&](int batch, int slot) {
    dc.batch_size = batch;
    args.q = q + slot * kShift;
    args.out = out + slot * kShift;
    args.lse = reinterpret_cast<float*>(lse + slot * kShift);
  };
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
  CHECK_CUDA(cudaDeviceSynchronize());

  // (c) A new key's first three calls: direct, captured (on its second sight while the table
  // is fresh), replayed; a synchronization before each.
  CHECK_SNAPMLA(snapmla_release_thread_resources());
  std::vector<double> first[3];
  set_call(32, kCaptureSlot);
  CHECK_SNAPMLA(snapmla_decode_plan(&dc, seqlens, plan, stream));
  for (int k = 0; k < kCaptureKeys; ++k) {
    set_call(32, kCaptureSlot + k);
    for (int n = 0; n < 3; ++n) {
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const auto t0 = now();
      CHECK_SNAPMLA(snapmla_decode(cache, &dc, &args, plan, workspace, stream));
      first[n].push_back(us(t0, now()));
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (auto& v : first) std::sort(v.begin(), v.end());
  std::printf("CAPTURE %.3f %.3f %.3f\n", first[0][kCaptureKeys / 2], first[1][kCaptureKeys / 2],
              first[2][kCaptureKeys / 2]);

  // (a), (b) The step loops: pick(step, &slot) gives the step's batch and buffers' slot.
  auto loop = [&](const char* name, const std::function<int(int, int*)>& pick) {
    CHECK_SNAPMLA(snapmla_release_thread_resources());
    std::vector<double> host;
    double wall = 0;
    for (int step = 0; step < kSteps; ++step) {
      int slot = 0;
      const int batch = pick(step, &slot);
      set_call(batch, slot);
      const auto t0 = now();
      CHECK_SNAPMLA(snapmla_decode_plan(&dc, seqlens, plan, stream));
      for (int layer = 0; layer < kLayers; ++layer) {
        args.layer = layer;
        const auto ta = now();
        CHECK_SNAPMLA(snapmla_decode(cache, &dc, &args, plan, workspace, stream));
        if (step >= kWarmSteps) host.push_back(us(ta, now()));
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (step >= kWarmSteps) wall += us(t0, now());
    }
    double sum = 0;
    for (double h : host) sum += h;
    std::sort(host.begin(), host.end());
    std::printf("LOOP %s %.3f %.3f %.3f\n", name, sum / host.size(), host[host.size() / 2],
                wall / (kSteps - kWarmSteps));
    std::fflush(stdout);
  };
  std::mt19937 rng(1);
  const int sizes[4] = {8, 16, 24, 32};
  loop("steady_b32", [](int, int* slot) { return *slot = 32; });
  loop("4_sizes", [&](int, int* slot) { return *slot = sizes[rng() % 4]; });
  loop("batch_1..64", [&](int, int* slot) { return *slot = 1 + int(rng() % 64); });
  int walk = 32;
  loop("walk_1..64", [&](int, int* slot) {
    walk = std::min(64, std::max(1, walk + int(rng() % 5) - 2));
    return *slot = walk;
  });
  // 61 layers x 10 batch sizes in turn: a cycle of 610 calls, more than the table holds.
  loop("cycle_610", [](int step, int* slot) { return *slot = 1 + step % 10; });
  // The 4 sizes, each at one of 4 addresses a step (an allocator's churn): 976 calls.
  loop("4_sizes_x4_addr", [&](int, int* slot) {
    const int b = sizes[rng() % 4];
    *slot = b * 4 + int(rng() % 4);
    return b;
  });
  CHECK_SNAPMLA(snapmla_cache_destroy(cache));
  return 0;
}

// Runs graph_loops in two children per mode, alternating (on, off, on, off), and prints the
// means of the two with the verdict: graph replay stays on by default only if no loop's host
// time per call or wall time per step is more than kSlower above the direct launches'.
static int compare_graphs(const char*, int heads) {
  constexpr double kSlower = 1.03;  // run-to-run noise of these means stays well below 3%
  struct Row {
    std::string name;
    double v[2][3] = {};  // [on, off][host mean, host p50, wall]
  };
  std::vector<Row> rows;
  double capture[3] = {};
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return 1;
  const char* env[2] = {"env -u SNAPMLA_DECODE_GRAPHS", "env SNAPMLA_DECODE_GRAPHS=0"};
  constexpr int kRounds = 2;
  for (int round = 0; round < kRounds; ++round) {
    for (int mode = 0; mode < 2; ++mode) {
      const std::string cmd = std::string(env[mode]) + " '" + self + "' graphs-child " +
                              std::to_string(heads);
      FILE* f = popen(cmd.c_str(), "r");
      if (f == nullptr) return 1;
      char line[512], name[128];
      double a, b, c;
      size_t row = 0;
      while (std::fgets(line, sizeof(line), f) != nullptr) {
        if (std::sscanf(line, "LOOP %127s %lf %lf %lf", name, &a, &b, &c) == 4) {
          if (row == rows.size()) rows.push_back(Row{name});
          rows[row].v[mode][0] += a / kRounds;
          rows[row].v[mode][1] += b / kRounds;
          rows[row].v[mode][2] += c / kRounds;
          ++row;
        } else if (std::sscanf(line, "CAPTURE %lf %lf %lf", &a, &b, &c) == 3) {
          if (mode == 0) {
            capture[0] += a / kRounds;
            capture[1] += b / kRounds;
            capture[2] += c / kRounds;
          }
        } else {
          std::fputs(line, stdout);
        }
      }
      if (pclose(f) != 0) {
        std::fprintf(stderr, "%s failed\n", cmd.c_str());
        return 1;
      }
    }
  }
  std::printf("snapmla_decode graph replay: 61 layers, heads %d, batch <= 64, %d rounds per mode\n",
              heads, kRounds);
  std::printf("%-18s %21s %21s %15s %13s\n", "loop", "host us/call on", "host us/call off",
              "wall us/step", "on/off");
  std::printf("%-18s %10s %10s %10s %10s %7s %7s %6s %6s\n", "", "mean", "p50", "mean", "p50",
              "on", "off", "host", "wall");
  double worst = 0;
  std::string worst_name;
  for (const Row& r : rows) {
    const double host = r.v[0][0] / r.v[1][0], wall = r.v[0][2] / r.v[1][2];
    std::printf("%-18s %10.2f %10.2f %10.2f %10.2f %7.0f %7.0f %6.3f %6.3f\n", r.name.c_str(),
                r.v[0][0], r.v[0][1], r.v[1][0], r.v[1][1], r.v[0][2], r.v[1][2], host, wall);
    if (std::max(host, wall) > worst) {
      worst = std::max(host, wall);
      worst_name = r.name;
    }
  }
  const double saving = capture[0] - capture[2], extra = capture[1] - capture[0];
  std::printf("a new key (graphs on, medians): first call %.2f us (direct), second %.2f us "
              "(capture + instantiate + launch), third %.2f us (replay): a capture costs %.1f us "
              "more than a direct call and pays off after %.1f replays (the policy counts a graph "
              "repaid at %u)\n",
              capture[0], capture[1], capture[2], extra, saving > 0 ? extra / saving : -1.0,
              snapmla::LaunchCache::kPayoffReplays);
  if (worst <= kSlower) {
    std::printf("VERDICT: keep graph replay on by default: no loop is slower with it (worst "
                "on/off ratio %.3f, %s; limit %.2f)\n",
                worst, worst_name.c_str(), kSlower);
  } else {
    std::printf("VERDICT: graph replay makes %s slower (on/off %.3f > %.2f): turn it off by "
                "default\n",
                worst_name.c_str(), worst, kSlower);
  }
  return 0;
}
