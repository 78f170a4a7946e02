// A call's launches, replayed as one CUDA graph when the same call repeats: a graph launch takes
// a fraction of the host time of a decode call's three launches. The second time a thread makes
// a call whose key is among its last 128 keys, the launches are captured on a private stream and
// replayed into the caller's stream; later calls with a key it holds (128 graphs a thread: a
// model step's layers) replay the graph, into any stream of the current device. Never while the
// caller's stream is capturing (that capture takes the launches as they are); a key whose capture
// failed launches directly from then on; SNAPMLA_DECODE_GRAPHS=0 in the environment launches
// directly always. The graphs belong to the device's primary context: a thread must not use them
// across a device reset.
// The key holds every value the launches read on the host (parameters, pointers, sizes, the
// kernel choice), byte for byte with no uninitialized padding: a replay reads device memory anew,
// but a changed pointer or size needs a changed key.
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
