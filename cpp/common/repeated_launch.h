// A call's launches, replayed as one CUDA graph when the same call repeats (issue 10's host
// time: a decode's three launches take 9-12 us of host time on the H200 machine, a graph
// launch ~1.4 us). SNAPMLA_DECODE_GRAPHS: 1, the default since session 25 (the whole GPU suite
// and the sanitizers passed on it); 0 at build time, or SNAPMLA_DECODE_GRAPHS=0 in the
// environment at run time, launches directly. The second time a thread makes a call whose key
// it saw among its last 128 keys, the call's launches are captured into a graph on a private
// stream and replayed into the caller's stream; later calls with a key it holds (128 graphs a
// thread: a model step's layers) replay it, into any stream of the current device, the legacy
// default stream included; never while the caller's stream is capturing (its capture takes
// the launches as they are); a key whose capture failed launches directly from then on.
// The graphs belong to the device's primary context: a thread must not use them across a
// device reset.
//
// The key must hold every value the launches read on the host (parameters, pointers, sizes,
// the kernel choice), byte for byte with no uninitialized padding: the graph replays the
// launches exactly as captured and reads device memory anew, so inputs changed in place are
// read, but a changed pointer or size needs a changed key.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#ifndef SNAPMLA_DECODE_GRAPHS
#define SNAPMLA_DECODE_GRAPHS 1
#endif

namespace snapmla {

// The launches of one call, on `stream`.
using LaunchFn = cudaError_t (*)(void* ctx, cudaStream_t stream);

constexpr size_t kMaxLaunchKeyBytes = 512;

// fn(ctx, stream), or its graph (above). key: kMaxLaunchKeyBytes at most (a longer key
// launches directly).
cudaError_t launch_repeated(const void* key, size_t key_bytes, LaunchFn fn, void* ctx,
                            cudaStream_t stream);

}  // namespace snapmla
