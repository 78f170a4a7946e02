// The seesaw kernel with PV width 16 and the two-term query, quantizing its own Q tile
// (SNAPMLA_SEESAW_FUSED_Q2, experimental: compiled only under it).
#include "decode/seesaw/kernel.cuh"

#if SNAPMLA_SEESAW_FUSED_Q2
namespace snapmla {
namespace decode {
namespace seesaw {
template cudaError_t run<16, true, false, false, true>(const DecodeParams&, const TensorMaps&,
                                                      cudaStream_t);
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
#endif
