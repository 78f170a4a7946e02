// The seesaw kernel with PV width 64 and the scaled promotion (kScaledPv: O^T *= gamma once a
// block, then O^T += T an m-tile), which launch.cu picks for long chains (config.h,
// SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN; not built at -1).
#include "decode/seesaw/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
#if SNAPMLA_SEESAW_SCALED_PV_MIN_CHAIN >= 0
template cudaError_t run<64, false, false, true>(const DecodeParams&, const TensorMaps&,
                                                 cudaStream_t);
#endif
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
