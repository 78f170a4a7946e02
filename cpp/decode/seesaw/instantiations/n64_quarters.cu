// The seesaw kernel with PV width 64 on four consumer warpgroups, each a quarter of the latent
// (kQuarters): experimental, built only under SNAPMLA_SEESAW_QUARTERS (config.h says what it is).
#include "decode/seesaw/kernel.cuh"

namespace snapmla {
namespace decode {
namespace seesaw {
#if SNAPMLA_SEESAW_QUARTERS
template cudaError_t run<64, false, false, true>(const DecodeParams&, const TensorMaps&,
                                                 cudaStream_t);
#endif
}  // namespace seesaw
}  // namespace decode
}  // namespace snapmla
