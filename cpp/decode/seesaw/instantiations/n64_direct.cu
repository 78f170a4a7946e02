// The seesaw kernel with PV width 64 and the PV accumulating into O^T itself (kPvDirect):
// experimental, built only under SNAPMLA_SEESAW_PV_DIRECT (config.h says why).
#include "decode/seesaw/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
#if SNAPMLA_SEESAW_PV_DIRECT
template cudaError_t run<64, false, true>(const DecodeParams&, const TensorMaps&, cudaStream_t);
#endif
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
