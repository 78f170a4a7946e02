// launch_repeated (repeated_launch.h).
#include <stdint.h>

#include <cstdlib>
#include <cstring>

#include "common/repeated_launch.h"

namespace snapmla {
namespace {

// A model step decodes each layer with its own key: kGraphs graphs hold a step of that many.
constexpr int kGraphs = 128;
constexpr int kSeen = 128;
constexpr int kMaxGraphDevices = 64;

struct Key {
  uint64_t hash = 0;  // of device and bytes; 0: an empty slot
  int device = -1;
  size_t bytes = 0;
  unsigned char data[kMaxLaunchKeyBytes];
  bool equals(uint64_t h, int d, const void* k, size_t n) const {
    return hash == h && device == d && bytes == n && std::memcmp(data, k, n) == 0;
  }
  void set(uint64_t h, int d, const void* k, size_t n) {
    hash = h;
    device = d;
    bytes = n;
    std::memcpy(data, k, n);
  }
};

struct Graph {
  Key key;
  cudaGraphExec_t exec = nullptr;
};

struct Seen {
  Key key;
  bool capture_failed = false;  // a key whose capture failed launches directly from then on
};

struct ThreadGraphs {
  Graph graphs[kGraphs];
  int next_graph = 0;
  Seen seen[kSeen];
  int next_seen = 0;
  cudaStream_t capture_stream[kMaxGraphDevices] = {};
  ~ThreadGraphs() {
    // An executable graph still running is freed when it completes. (After a device reset or
    // at process exit these handles are stale.)
    for (Graph& g : graphs) {
      if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    }
    for (cudaStream_t s : capture_stream) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
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

// FNV-1a over the device and the key's 8-byte words (and its tail), never 0.
uint64_t key_hash(int device, const void* key, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(key);
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(device);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

// fn's launches captured into an executable graph for `slot` (its previous graph destroyed);
// null on any failure (the caller launches directly, reporting errors as without graphs). Runs
// in relaxed capture mode, so a global-mode capture on another thread is left undisturbed.
cudaGraphExec_t capture(int device, LaunchFn fn, void* ctx, Graph& slot) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaStream_t& s = t_graphs.capture_stream[device];
  cudaError_t err = cudaSuccess;
  if (s == nullptr) {
    err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err != cudaSuccess) s = nullptr;
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) err = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (err == cudaSuccess) {
    err = fn(ctx, s);
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (err == cudaSuccess) err = end;
  }
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (err == cudaSuccess && slot.exec != nullptr) {
    cudaGraphExecDestroy(slot.exec);  // (freed when done, if still running)
    slot.exec = nullptr;
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return exec;
}

}  // namespace

cudaError_t launch_repeated(const void* key, size_t key_bytes, LaunchFn fn, void* ctx,
                            cudaStream_t stream) {
  int device = -1, stream_device = -1;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  // The capture status first: under a caller's capture in global mode, a query such as
  // cudaStreamGetDevice is refused and invalidates that capture. The legacy default stream is
  // taken too: a graph launch there is ordered with the blocking streams as the launches are.
  if (!graphs_enabled() || key_bytes > kMaxLaunchKeyBytes ||
      cudaStreamIsCapturing(stream, &status) != cudaSuccess ||
      status != cudaStreamCaptureStatusNone || cudaGetDevice(&device) != cudaSuccess ||
      device < 0 || device >= kMaxGraphDevices ||
      cudaStreamGetDevice(stream, &stream_device) != cudaSuccess || stream_device != device) {
    cudaGetLastError();
    return fn(ctx, stream);
  }
  ThreadGraphs& t = t_graphs;
  const uint64_t h = key_hash(device, key, key_bytes);
  for (Graph& g : t.graphs) {
    if (g.exec != nullptr && g.key.equals(h, device, key, key_bytes)) {
      return cudaGraphLaunch(g.exec, stream);
    }
  }
  Seen* seen = nullptr;
  for (Seen& s : t.seen) {
    if (s.key.equals(h, device, key, key_bytes)) {
      seen = &s;  // (a key is remembered once: only when no entry holds it)
      break;
    }
  }
  if (seen == nullptr) {  // the first time: remember the key, launch directly
    Seen& s = t.seen[t.next_seen];
    t.next_seen = (t.next_seen + 1) % kSeen;
    s.key.set(h, device, key, key_bytes);
    s.capture_failed = false;
    return fn(ctx, stream);
  }
  if (seen->capture_failed) return fn(ctx, stream);
  Graph& slot = t.graphs[t.next_graph];
  const cudaGraphExec_t exec = capture(device, fn, ctx, slot);
  if (exec == nullptr) {
    seen->capture_failed = true;
    return fn(ctx, stream);
  }
  t.next_graph = (t.next_graph + 1) % kGraphs;
  slot.exec = exec;
  slot.key.set(h, device, key, key_bytes);
  return cudaGraphLaunch(exec, stream);
}

}  // namespace snapmla
