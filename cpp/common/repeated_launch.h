// A call's launches, replayed as one CUDA graph when the same call repeats (a graph launch costs
// a fraction of the host time of several launches). A key seen again among a thread's last 128
// is captured on a private stream; later calls with it replay the graph into any stream of the
// current device, except while the caller's stream is capturing. A failed capture, or
// SNAPMLA_DECODE_GRAPHS=0 in the environment, launches directly. Graphs belong to the primary
// context: a thread must not use them across a device reset.
// The key holds every value the launches read on the host, byte for byte with no uninitialized
// padding: a replay reads device memory anew, but a changed pointer or size needs a new key.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

namespace snapmla {

// The launches of one call, on `stream`.
using LaunchFn = cudaError_t (*)(void* ctx, cudaStream_t stream);

constexpr size_t kMaxLaunchKeyBytes = 512;

// fn(ctx, stream), or its graph. A key over kMaxLaunchKeyBytes launches directly.
cudaError_t launch_repeated(const void* key, size_t key_bytes, LaunchFn fn, void* ctx,
                            cudaStream_t stream);

}  // namespace snapmla
