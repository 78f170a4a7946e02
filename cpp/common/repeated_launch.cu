// launch_repeated and release_thread_graphs (repeated_launch.h).
#include <cudaTypedefs.h>
#include <stdint.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "common/repeated_launch.h"

namespace snapmla {
namespace {

// The driver calls that name a stream's context (the runtime has none), resolved once.
struct DriverCalls {
  PFN_cuCtxGetCurrent_v4000 current = nullptr;
  PFN_cuStreamGetCtx_v9020 stream_ctx = nullptr;
  PFN_cuCtxGetId_v12000 ctx_id = nullptr;
};

// Null where the driver lacks one of them (graphs off).
const DriverCalls* driver_calls() {
  static const DriverCalls calls = [] {
    auto get = [](const char* name, unsigned version) -> void* {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q;
      if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q) !=
              cudaSuccess ||
          q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return nullptr;
      }
      return p;
    };
    DriverCalls c;
    c.current = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get("cuCtxGetCurrent", 4000));
    c.stream_ctx = reinterpret_cast<PFN_cuStreamGetCtx_v9020>(get("cuStreamGetCtx", 9020));
    c.ctx_id = reinterpret_cast<PFN_cuCtxGetId_v12000>(get("cuCtxGetId", 12000));
    return c;
  }();
  return calls.current && calls.stream_ctx && calls.ctx_id ? &calls : nullptr;
}

// The unique id (never reused in the process) of the context current to this thread; with a
// stream, only if the stream belongs to that context.
bool current_context(const DriverCalls& d, cudaStream_t stream, bool check_stream, uint64_t* id) {
  CUcontext cur = nullptr, of_stream = nullptr;
  unsigned long long v = 0;
  if (d.current(&cur) != CUDA_SUCCESS || cur == nullptr) return false;
  if (check_stream &&
      (d.stream_ctx(reinterpret_cast<CUstream>(stream), &of_stream) != CUDA_SUCCESS ||
       of_stream != cur)) {
    return false;
  }
  if (d.ctx_id(cur, &v) != CUDA_SUCCESS) return false;
  *id = v;
  return true;
}

void destroy(void* graph) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph)); }

// The thread's table, allocated at its first graph-eligible call. At thread exit the graphs of
// the current context are destroyed; those of another context are left to it (it may be gone).
struct ThreadGraphs {
  std::unique_ptr<LaunchCache> cache;
  ~ThreadGraphs() {
    if (cache == nullptr) return;
    const DriverCalls* d = driver_calls();
    uint64_t ctx = 0;
    if (d != nullptr && current_context(*d, nullptr, false, &ctx)) cache->release(ctx, destroy);
  }
};

thread_local ThreadGraphs t_graphs;

// SNAPMLA_DECODE_GRAPHS=0 in the environment (read once per process): launch directly.
bool graphs_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SNAPMLA_DECODE_GRAPHS");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// fn's launches captured into an executable graph, on a stream made for it in the current
// context; null on any failure (the caller launches directly, reporting errors as without
// graphs). Runs in relaxed capture mode, so a global-mode capture on another thread is left
// undisturbed.
cudaGraphExec_t capture(LaunchFn fn, void* ctx) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaStream_t s = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess) s = nullptr;
  if (err == cudaSuccess) err = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (err == cudaSuccess) {
    err = fn(ctx, s);
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (err == cudaSuccess) err = end;
  }
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (s != nullptr) cudaStreamDestroy(s);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (err != cudaSuccess) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    cudaGetLastError();
    return nullptr;
  }
  return exec;
}

}  // namespace

cudaError_t launch_repeated(const void* key, size_t key_bytes, LaunchFn fn, void* ctx,
                            cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const DriverCalls* d = nullptr;
  uint64_t context = 0;
  // The capture status first: under a caller's capture in global mode, other queries may be
  // refused and invalidate that capture. The legacy default stream is taken too: a graph launch
  // there is ordered with the blocking streams as the launches are.
  if (!graphs_enabled() || key_bytes > kMaxLaunchKeyBytes ||
      cudaStreamIsCapturing(stream, &status) != cudaSuccess ||
      status != cudaStreamCaptureStatusNone || (d = driver_calls()) == nullptr ||
      !current_context(*d, stream, true, &context)) {
    cudaGetLastError();
    return fn(ctx, stream);
  }
  std::unique_ptr<LaunchCache>& cache = t_graphs.cache;
  if (cache == nullptr) {
    cache.reset(new (std::nothrow) LaunchCache());
    if (cache == nullptr) return fn(ctx, stream);
  }
  LaunchCache::Dropped dropped;
  const LaunchCache::Decision decision = cache->on_call(context, key, key_bytes, &dropped);
  // An evicted graph of another context is left to it: that context may be gone.
  if (dropped.graph != nullptr && dropped.ctx == context) destroy(dropped.graph);
  void* graph = decision.graph;
  if (decision.action == LaunchCache::Action::kCapture) {
    graph = capture(fn, ctx);
    if (graph == nullptr) {
      cache->capture_failed(decision.entry);
      return fn(ctx, stream);
    }
    cache->captured(decision.entry, graph);
  } else if (decision.action != LaunchCache::Action::kReplay) {
    return fn(ctx, stream);
  }
  if (cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream) == cudaSuccess) {
    return cudaSuccess;
  }
  // A failed graph launch enqueued nothing: the graph is dropped, the call launched directly.
  cudaGetLastError();
  destroy(cache->replay_failed(decision.entry));
  return fn(ctx, stream);
}

void release_thread_graphs() {
  std::unique_ptr<LaunchCache>& cache = t_graphs.cache;
  if (cache == nullptr) return;
  const DriverCalls* d = driver_calls();
  uint64_t ctx = 0;
  if (d == nullptr || !current_context(*d, nullptr, false, &ctx)) return;
  cache->release(ctx, destroy);
  if (cache->size() == 0) cache.reset();
}

}  // namespace snapmla
