// Small host-side helpers shared by the launchers.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace snapmla {

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Multiprocessor count of the current device (cached per device; graph-capture safe).
cudaError_t current_device_sm_count(int* sm_count);

}  // namespace snapmla
