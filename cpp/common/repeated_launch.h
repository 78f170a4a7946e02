// A call's launches, replayed as one CUDA graph when the same call repeats (a graph launch costs
// a fraction of the host time of several launches). Per thread, a key seen often enough among
// the recently used ones (launch_cache.h: the policy and its constants) is captured on a
// private stream; later calls with it replay the graph into any stream of the same CUDA
// context, except while the caller's stream is capturing. A failed capture or graph launch
// launches directly (and retries later); SNAPMLA_DECODE_GRAPHS=0 in the environment launches
// directly always. A graph is used and destroyed only while its context is current: one made
// before a device reset is never replayed in the context that replaces it.
// The key holds every value the launches read on the host, byte for byte with no uninitialized
// padding: a replay reads device memory anew, but a changed pointer or size needs a new key.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#include "common/launch_cache.h"

namespace snapmla {

// The launches of one call, on `stream`.
using LaunchFn = cudaError_t (*)(void* ctx, cudaStream_t stream);

// fn(ctx, stream), or its graph. A key over kMaxLaunchKeyBytes launches directly.
cudaError_t launch_repeated(const void* key, size_t key_bytes, LaunchFn fn, void* ctx,
                            cudaStream_t stream);

// Destroys the calling thread's graphs of its current CUDA context and forgets their keys.
void release_thread_graphs();

}  // namespace snapmla
